"""A smaller GPU's limits on a bigger one: ``GPULAB_TIER=t4`` on an A100 or H100 runs a lab as a
T4 learner runs it, not only at the T4 tier's sizes.

Forcing a tier (``utils.course.env.TIER_VAR``) on a GPU with more memory than that tier's smallest card
caps this process's CUDA allocator at the card's memory
(``torch.cuda.set_per_process_memory_fraction``: an allocation past the cap raises the same
out-of-memory error the small card would), makes the labs choose the card's dtype (fp16 where
it has no bf16) and scales the memory share a serving engine is told to take to the card's memory. Nothing else is
emulated: clocks, bandwidth and tensor-core rates stay the big card's, so times are not a T4's.

The cards' memory is ``nvidia-smi``'s total for the smallest card of each tier (T4: 15360 MiB,
L4: 23034 MiB, H100 80GB: 81559 MiB), as these cards commonly report it; an estimate of what a
learner's runtime shows, not a reading on this course's machines. Compute capabilities are
NVIDIA's (https://developer.nvidia.com/cuda-gpus).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

TIER_VAR = "GPULAB_TIER"  # force a tier, e.g. GPULAB_TIER=t4 on a big GPU to rehearse (utils.course.env reads it too)


@dataclass(frozen=True)
class TierCard:
    """The smallest card a tier is sized for."""

    name: str
    memory_gib: float
    capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        return self.capability[0] >= 8  # bf16 tensor cores from Ampere (sm80)


TIER_CARDS = {
    "t4": TierCard("T4", 15360 / 1024, (7, 5)),
    "a100": TierCard("L4", 23034 / 1024, (8, 9)),
    "h100": TierCard("H100 80GB", 81559 / 1024, (9, 0)),
}


def _forced_tier() -> str | None:
    return os.environ.get(TIER_VAR, "").strip().lower() or None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@cache
def _device_gib(index: int) -> float:
    import torch

    return torch.cuda.get_device_properties(index).total_memory / 2**30


def card(index: int = 0) -> TierCard | None:
    """The card being rehearsed on CUDA device ``index``: the forced tier's card when this GPU has
    more memory than it, else None (no tier forced, no GPU, or a GPU no bigger than the card)."""
    tier = _forced_tier()
    if tier not in TIER_CARDS or not _cuda_available():
        return None
    c = TIER_CARDS[tier]
    return c if _device_gib(index) > c.memory_gib else None


def capability(index: int = 0) -> tuple[int, int]:
    """CUDA compute capability as the labs should see it: the rehearsed card's, else the GPU's."""
    c = card(index)
    if c is not None:
        return c.capability
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def half_dtype(index: int = 0) -> str:
    """``bf16`` from Ampere (compute capability 8), ``fp16`` before it (T4, V100, P100)."""
    return "bf16" if capability(index)[0] >= 8 else "fp16"


def half_torch_dtype(index: int = 0):
    """:func:`half_dtype` as a torch dtype: ``torch.bfloat16`` or ``torch.float16``."""
    import torch

    return torch.bfloat16 if half_dtype(index) == "bf16" else torch.float16


def engine_memory_fraction(requested: float, index: int = 0) -> float:
    """The share of this GPU an engine in its own process may take: ``requested`` of the rehearsed
    card's memory, as on the card itself (``requested`` unchanged when nothing is rehearsed).

    A share of the card, not of this GPU and not capped at the whole card: lab 04 keeps its engine
    up while a comparison engine starts beside it, and on a 15 GiB T4 two engines at 0.4 each fit
    where two engines holding a whole T4's memory each do not."""
    c = card(index)
    return requested if c is None else requested * c.memory_gib / _device_gib(index)


_applied: dict[int, float] = {}


def apply() -> str | None:
    """Cap this process's allocator on every visible GPU at the rehearsed card's memory (once per
    device); returns the line to print, or None when nothing is rehearsed."""
    c = card(0)
    if c is None:
        return None
    import torch

    for i in range(torch.cuda.device_count()):
        if i not in _applied:
            fraction = c.memory_gib / _device_gib(i)
            torch.cuda.set_per_process_memory_fraction(fraction, i)
            _applied[i] = fraction
    return (f"rehearsing a {c.name} on {torch.cuda.get_device_name(0)}: {c.memory_gib:.1f} GiB of "
            f"{_device_gib(0):.1f} GiB, {half_dtype()} (compute capability {c.capability[0]}.{c.capability[1]}); "
            "times are this GPU's, not a " + c.name + "'s")
