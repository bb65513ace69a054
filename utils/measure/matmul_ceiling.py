"""The matmul throughput this device reaches, measured now: the ceiling a training loop's MFU is
also read against.

MFU (``utils.measure.flops.mfu``) divides a loop's achieved FLOP/s by the datasheet's peak for its dtype
(``utils.device.hardware.SPECS``), a figure no real kernel reaches: on one H200, square bf16 matmuls with
L2 flushed ran at 612 to 743 TFLOP/s against the 989 TFLOP/s datasheet peak, 62% to 75% of it
(benchmarks/RESULTS.md, "Timing agreement with triton's do_bench"). So a loop at 40% MFU is closer to what the card can
do than 40% suggests. :func:`measure` times square matmuls of a few sizes in the loop's dtype with
``utils.measure.timing.benchmark`` (warm-up, CUDA events, L2 flushed) and keeps the fastest, the same
measurement as lab 00's matmul cell; :func:`fraction` is a loop's FLOP/s over it. On a CPU it is
the CPU's own fp32 matmul ceiling, so the fraction means something where no datasheet peak exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from utils.measure.flops import matmul_flops
from utils.units import tflop_per_s

GPU_SIDES = (2048, 4096)  # square sides timed on a GPU
BIG_SIDE, BIG_SIDE_MIN_GIB = 8192, 40.0  # and 8192 (384 MiB of 16-bit operands) on a card above 40 GiB, where
# lab 01's loops leave room for it (on a T4 they leave about 1 GiB: grader/labs/single_gpu/plan.py)
CPU_SIDES = (256, 512)  # and on a CPU, where a larger side only takes longer
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Ceiling:
    """The fastest of the timed matmuls: its TFLOP/s, side and dtype, and every side's TFLOP/s."""

    tflops: float
    side: int
    dtype: str
    by_side: dict

    def __str__(self) -> str:
        sides = ", ".join(f"{n}: {t:,.4g}" for n, t in self.by_side.items())
        return f"{self.tflops:,.4g} TFLOP/s ({self.dtype} matmul, side {self.side}; by side, TFLOP/s: {sides})"


def measure(precision: str = "bf16", device: Any = None, sides: tuple[int, ...] | None = None,
            budget_s: float = 2.0) -> Ceiling:
    """Time ``C = A @ B`` for square ``A``, ``B`` of each side in ``precision`` (``"bf16"``,
    ``"fp16"`` or ``"fp32"``; fp32 on a CPU whatever is asked, as the loops run there) on ``device``
    (default: the GPU if there is one) and return the fastest as a :class:`Ceiling`."""
    import torch

    from utils.measure.timing import benchmark

    if precision not in DTYPES:
        raise ValueError(f"precision must be one of {', '.join(DTYPES)}, got {precision!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        precision = "fp32"
    dtype = getattr(torch, DTYPES[precision])
    if sides is None:
        sides = CPU_SIDES
        if dev.type == "cuda":
            big = torch.cuda.get_device_properties(dev).total_memory / 2**30 > BIG_SIDE_MIN_GIB
            sides = GPU_SIDES + ((BIG_SIDE,) if big else ())
    by_side = {}
    for n in sides:
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        t = benchmark(torch.matmul, a, b, warmup=2, max_runs=20, budget_s=budget_s, device=dev)
        by_side[n] = tflop_per_s(matmul_flops(n, n, n), t.median_ms)
        del a, b
    side = max(by_side, key=by_side.get)
    return Ceiling(by_side[side], side, precision, by_side)


def fraction(achieved_tflops: float | None, ceiling: Ceiling | float | None) -> float | None:
    """``achieved_tflops`` over the measured ceiling (a :class:`Ceiling` or its TFLOP/s); None where
    either is unknown."""
    top = ceiling.tflops if isinstance(ceiling, Ceiling) else ceiling
    if achieved_tflops is None or not top:
        return None
    return achieved_tflops / top
