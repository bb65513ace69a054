"""Lab 01's install needs: what its setup cell (``utils.course.bootstrap.setup("01_single_gpu", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

from utils.course.bootstrap import Extra, LabNeeds

NEEDS = LabNeeds({"peft": "peft"}, (
    Extra("bitsandbytes", "bitsandbytes", "the QLoRA cell falls back to LoRA and says so", gpu_only=True),))
