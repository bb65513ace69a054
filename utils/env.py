"""Where the notebook runs (Colab, Kaggle, local), smoke mode, and sizes by device.

Smoke mode runs every notebook end to end in minutes on tiny sizes: it is on when no CUDA
GPU is visible or when ``GPULAB_SMOKE=1``. The code path is the same as on a GPU; only
the sizes (and the grading thresholds) change (DESIGN.md, "Smoke mode").

Sizes come in tiers chosen from the device: ``cpu`` (smoke), ``t4`` (16 GB class, no bf16
tensor cores: T4, P100, V100), ``a100`` (Ampere/Ada: A100, A10, L4, L40S) and ``h100``
(Hopper and newer). A phase asks :func:`phase_sizes` for its numbers; the tier names say
what they were sized for, not what they were measured on.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

SMOKE_VAR = "GPULAB_SMOKE"
TIER_VAR = "GPULAB_TIER"  # force a tier, e.g. GPULAB_TIER=t4 on a big GPU to rehearse
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
    mem_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if major >= 9:
        return "h100"
    if major >= 8 and mem_gib > 20:
        return "a100"
    return "t4"


def repo_root() -> Path:
    """The repository root (the folder holding ``utils/``)."""
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Phase0Sizes:
    matmul_n: int  # square matmul side
    elementwise_numel: int  # elements in the elementwise (memory-bound) op
    tiny_ops: int  # launches in the loop of tiny ops (overhead-bound)
    train_steps: int
    batch_size: int
    seq_len: int
    model: str  # config name in utils/models.py


_PHASE0 = {
    "cpu": Phase0Sizes(256, 1 << 20, 200, 8, 2, 64, "gpt2-tiny"),
    "t4": Phase0Sizes(4096, 1 << 26, 2000, 60, 8, 256, "gpt2-small"),
    "a100": Phase0Sizes(8192, 1 << 27, 2000, 80, 16, 512, "gpt2-small"),
    "h100": Phase0Sizes(8192, 1 << 28, 2000, 100, 16, 1024, "gpt2-small"),
}

_PHASES = {"00_foundations": _PHASE0}


def phase_sizes(phase: str, tier: str | None = None):
    """The sizes of ``phase`` (e.g. ``"00_foundations"``) for ``tier`` (default: this device)."""
    if phase not in _PHASES:
        raise KeyError(f"no sizes for phase {phase!r}; known: {', '.join(_PHASES)}")
    return _PHASES[phase][tier or device_tier()]


def describe() -> dict:
    """The environment part of the device report."""
    return {
        "platform": platform_name(),
        "smoke": smoke_mode(),
        "tier": device_tier(),
        "python": sys.version.split()[0],
        "repo_root": str(repo_root()),
    }
