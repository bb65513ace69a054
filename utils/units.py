"""Rates and sizes: the one place the course turns bytes, FLOPs and milliseconds into
GB/s, TFLOP/s and GiB.

Conventions (the phase 0 notebook, ``grader/source/00_foundations/00_foundations.ipynb``,
section 2): GB/s is decimal, 1e9 bytes per second, as datasheets and nccl-tests print it;
TFLOP/s is 1e12 floating-point operations per second; times are in milliseconds. Memory
sizes are binary, GiB = 2**30 bytes, as ``torch.cuda.memory_allocated``, ``nvidia-smi``
and vLLM's ``Available KV cache memory: X GiB`` line count them.
"""
from __future__ import annotations

import math

GB = 1e9  # bytes in a decimal gigabyte (bandwidths: GB/s)
TFLOP = 1e12  # FLOPs in a teraFLOP (throughputs: TFLOP/s)
GIB = 2**30  # bytes in a gibibyte (memory sizes)
MS_PER_S = 1e3


def gb_per_s(nbytes: float, time_ms: float) -> float:
    """Bandwidth in GB/s of moving ``nbytes`` bytes in ``time_ms`` milliseconds."""
    return nbytes / (time_ms * 1e-3) / GB


def tflop_per_s(flops: float, time_ms: float) -> float:
    """Throughput in TFLOP/s of doing ``flops`` FLOPs in ``time_ms`` milliseconds."""
    return flops / (time_ms * 1e-3) / TFLOP


def transfer_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """Milliseconds to move ``nbytes`` bytes at ``bandwidth_gbs`` GB/s (the inverse of :func:`gb_per_s`)."""
    return nbytes / (bandwidth_gbs * GB) * MS_PER_S


def gib_print_range(gib: float, decimals: int = 2) -> tuple[int, int]:
    """Bytes ``[lo, hi]`` whose ``%.{decimals}f`` GiB print equals ``gib`` (half a unit in
    the last place either side, inclusive, so float ties cannot fall outside). A log that
    prints ``61.53 GiB`` fixes the bytes only to this range."""
    half = 0.5 * 10.0**-decimals
    return math.floor((gib - half) * GIB), math.ceil((gib + half) * GIB)
