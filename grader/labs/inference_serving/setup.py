"""Lab 03's install needs: what its setup cell (``utils.course.bootstrap.setup("03_inference_serving", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

from utils.course.bootstrap import Extra, LabNeeds

NEEDS = LabNeeds({"accelerate": "accelerate"}, (
    Extra("bitsandbytes", "bitsandbytes", "the quantization cell measures the 16-bit model only and says why",
          gpu_only=True),),
    env={"HF_HUB_OFFLINE": "1"}, serving=True)  # every model of lab 03 is built from a shipped config
