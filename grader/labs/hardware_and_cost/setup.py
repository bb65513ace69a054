"""Lab 05's install needs: what its setup cell (``utils.course.bootstrap.setup("05_hardware_and_cost", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

from utils.course.bootstrap import Extra, LabNeeds

NEEDS = LabNeeds({}, (
    Extra("jax", "jax", "the XLA cells say JAX is missing (pip's jax is the CPU build; Colab and Kaggle ship it)"),),
    env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})  # JAX must not take 75% of the GPU from PyTorch
