"""Where the notebook runs (Colab, Kaggle, local), smoke mode, and the size tier of the device.

Smoke mode runs every notebook end to end in minutes on tiny sizes: it is on when no CUDA
GPU is visible or when ``GPULAB_SMOKE=1``. The code path is the same as on a GPU; only
the sizes (and the grading thresholds) change (docs/architecture.md, "Smoke mode").

Sizes come in tiers chosen from the device: ``cpu`` (smoke), ``t4`` (16 GB class, no bf16
tensor cores: T4, P100, V100), ``a100`` (Ampere/Ada: A100, A10, L4, L40S) and ``h100``
(Hopper and newer): :func:`device_tier`. Each lab's sizes per tier live in its own folder
(``grader/labs/<lab>/sizes.py``, picked by ``grader.labs.sizes``); this module knows no lab.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from utils.course.tier_plan import gpu_tier
from utils.device import rehearsal
from utils.device.rehearsal import TIER_VAR  # force a tier, e.g. GPULAB_TIER=t4 on a big GPU to rehearse

SMOKE_VAR = "GPULAB_SMOKE"
TIERS = ("cpu", "t4", "a100", "h100")


def platform_name() -> str:
    """``colab``, ``kaggle`` or ``local``, from the variables each runtime sets."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG") or os.environ.get("COLAB_GPU"):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE"):
        return "kaggle"
    return "local"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def smoke_mode() -> bool:
    """True with no CUDA GPU, or when ``GPULAB_SMOKE`` is set to 1/true/yes."""
    flag = os.environ.get(SMOKE_VAR, "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off") and cuda_available():
        return False
    return not cuda_available()


def matmul_dtype():
    """The dtype the labs time matmuls in: fp32 in smoke mode (a CPU has no tensor cores), else the
    card's tensor-core dtype: bf16 from Ampere, fp16 before it (a T4), the rehearsed card's under
    ``GPULAB_TIER`` (:func:`utils.device.rehearsal.half_torch_dtype`)."""
    import torch

    return torch.float32 if smoke_mode() else rehearsal.half_torch_dtype()


def device_tier() -> str:
    """The size tier for this runtime (see the module docstring)."""
    forced = os.environ.get(TIER_VAR, "").strip().lower()
    if forced:
        if forced not in TIERS:
            raise ValueError(f"{TIER_VAR}={forced!r} is not one of {', '.join(TIERS)}")
        return forced
    if smoke_mode():
        return "cpu"
    import torch

    major, _ = torch.cuda.get_device_capability(0)
    return gpu_tier(major, torch.cuda.get_device_properties(0).total_memory / 2**30)


def repo_root() -> Path:
    """The repository root (the folder holding ``utils/``)."""
    return Path(__file__).resolve().parents[2]


def describe() -> dict:
    """The environment part of the device report."""
    return {
        "platform": platform_name(),
        "smoke": smoke_mode(),
        "tier": device_tier(),
        "python": sys.version.split()[0],
        "repo_root": str(repo_root()),
    }
