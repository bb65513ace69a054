"""Lab 04's install needs: what its setup cell (``utils.course.bootstrap.setup("04_benchmarking_production", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

from utils.course.bootstrap import Extra, LabNeeds

NEEDS = LabNeeds(
    {"aiohttp": "aiohttp", "prometheus_client": "prometheus_client", "yaml": "pyyaml"},
    (Extra("bitsandbytes", "bitsandbytes", "the 4-bit model is skipped and the lab says so", gpu_only=True),
     Extra("kubernetes_validate", "kubernetes-validate",
           "the Kubernetes cells check the GPU rules without Kubernetes' schema and say so")),
    serving=True)
