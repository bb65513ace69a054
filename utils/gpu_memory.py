"""GPU memory in use, for a notebook that wants to know what a server process took.

NVML (``utils.nvml``) sees every process's allocations on the card, which ``torch.cuda``
does not: an inference engine runs in a process of its own.
"""
from __future__ import annotations


def gpu_used_gib() -> float | None:
    """Memory in use on the first GPU this process sees (NVML, every process; CUDA_VISIBLE_DEVICES
    respected); None in smoke mode (the engine runs on the CPU there, whatever NVML sees) or without NVML."""
    from utils import nvml
    from utils.env import smoke_mode

    return None if smoke_mode() else nvml.used_gib(0)
