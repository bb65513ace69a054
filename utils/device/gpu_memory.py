"""GPU memory in use, for a notebook that wants to know what a server process took, and the
card's total, for how many such processes fit on it.

NVML (``utils.device.nvml``) sees every process's allocations on the card, which ``torch.cuda``
does not: an inference engine runs in a process of its own.
"""
from __future__ import annotations

from utils.device import nvml


def gpu_used_gib() -> float | None:
    """Memory in use on the first GPU this process sees (NVML, every process; CUDA_VISIBLE_DEVICES
    respected); None in smoke mode (the engine runs on the CPU there, whatever NVML sees) or without NVML."""
    from utils.course.env import smoke_mode

    return None if smoke_mode() else nvml.used_gib(0)


def gpu_total_gib() -> float | None:
    """Total memory of the first GPU this process sees (NVML, CUDA_VISIBLE_DEVICES respected);
    None in smoke mode or without NVML."""
    from utils.course.env import smoke_mode

    visible = [] if smoke_mode() else nvml.visible_indices()
    total = getattr(nvml.query("nvmlDeviceGetMemoryInfo", nvml.handle(visible[0])), "total", None) if visible else None
    return None if total is None else total / 2**30
