"""Tile and wave quantization of a matmul, and the shapes lab 00 sweeps to see them.

A GPU computes ``C = A @ B`` (``A`` is ``m x k``, ``B`` is ``k x n``) by cutting ``C`` into
tiles; each tile is one thread block, run on one streaming multiprocessor (SM), and the SMs
work through the tiles in *waves*. NVIDIA's "Matrix Multiplication Background User's Guide"
(DU-09799-001, docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication)
names the two losses this module counts:

- **tile quantization** (its section 3.1): a dimension that is not a multiple of the tile
  still launches a whole last tile, partly empty;
- **wave quantization** (its section 3.2): a tile count just past a multiple of the SM count
  starts a last wave that leaves most SMs idle.

Its section 2.2 adds the alignment rule: Tensor Cores are used most efficiently when each
dimension is a multiple of 16 bytes (8 elements in fp16 or bf16).

The model's tile is 128 x 128 (:data:`TILE`), one of the tiles cuBLAS picks among (the
guide's section 2.3 lists 256x128, 128x128, 128x64, 64x64 and others); a real kernel may pick
another tile or split ``k``, so the model predicts where to look, not the measured time. The
functions are pure (numbers in, numbers out), checked on a CPU by ``tests/utils/test_matmul_sweep.py``;
only :func:`sm_count` asks the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from utils.validate import positive, positive_int

TILE = 128  # the model's tile side, in elements of C (guide section 2.3: one of cuBLAS's tiles)
ALIGN_BYTES = 16  # a dimension is aligned for Tensor Cores when it spans a multiple of 16 bytes (guide section 2.2)
SLOW_BELOW = 0.8  # a shape is predicted slow when its waves do less than 80% useful work (the course's threshold)
CPU_STAND_IN_SMS = 40  # a CPU has no SMs: smoke mode does the arithmetic for a T4's 40 SMs (T4 datasheet)
# SMs of each card of utils.device.hardware.SPECS: the datasheet's CUDA cores over the cores per SM (64 on
# the P100, V100, T4 and A100; 128 on the L4, A10, L40S, H100 and H200, from NVIDIA's architecture
# whitepapers); a recorded SM count must be its card's
SM_COUNTS = {"T4": 40, "P100": 56, "V100": 80, "L4": 58, "A10": 72, "A100-40GB": 108, "A100-80GB-PCIe": 108,
             "A100-80GB": 108, "L40S": 142, "H100-PCIe": 114, "H100-SXM": 132, "H200": 132}


def output_tiles(m: int, n: int, tile_m: int = TILE, tile_n: int = TILE) -> int:
    """Thread-block tiles covering the ``m x n`` output: ``ceil(m / tile_m) * ceil(n / tile_n)``."""
    for name, v in (("m", m), ("n", n), ("tile_m", tile_m), ("tile_n", tile_n)):
        positive_int(name, v)
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def waves(tiles: int, sm_count: int) -> int:
    """Waves of ``tiles`` over ``sm_count`` SMs, one tile per SM at a time: ``ceil(tiles / sm_count)``."""
    positive_int("tiles", tiles)
    positive_int("sm_count", sm_count)
    return math.ceil(tiles / sm_count)


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """The share of the waves' SM slots that hold a tile: ``tiles / (waves * sm_count)``."""
    return tiles / (waves(tiles, sm_count) * sm_count)


def tile_efficiency(dim: int, tile: int = TILE) -> float:
    """The share of the tiles along one dimension that is real work: ``dim / (ceil(dim / tile) * tile)``."""
    positive_int("dim", dim)
    positive_int("tile", tile)
    return dim / (math.ceil(dim / tile) * tile)


def aligned(dim: int, dtype_bytes: int) -> bool:
    """Whether ``dim`` elements of ``dtype_bytes`` bytes span a multiple of :data:`ALIGN_BYTES`."""
    positive_int("dim", dim)
    positive_int("dtype_bytes", dtype_bytes)
    return dim * dtype_bytes % ALIGN_BYTES == 0


def useful_fraction(m: int, n: int, sm_count: int, tile_m: int = TILE, tile_n: int = TILE) -> float:
    """The share of the launched work that computes ``C``: the output's area over the area of
    every SM slot of every wave, ``m n / (waves * sm_count * tile_m * tile_n)``. It is the product
    of the tile efficiencies of ``m`` and ``n`` and the wave efficiency."""
    tiles = output_tiles(m, n, tile_m, tile_n)
    return m * n / (waves(tiles, sm_count) * sm_count * tile_m * tile_n)


@dataclass(frozen=True)
class Quantization:
    """What the model says about one ``m x n x k`` matmul on ``sm_count`` SMs."""

    tiles: int
    waves: int
    tile_efficiency: float  # of m times of n
    wave_efficiency: float
    useful_fraction: float  # tile_efficiency * wave_efficiency
    aligned: bool  # m, n and k all aligned for Tensor Cores

    @property
    def slow(self) -> bool:
        return not self.aligned or self.useful_fraction < SLOW_BELOW


def quantization(m: int, n: int, k: int, sm_count: int, dtype_bytes: int, tile: int = TILE) -> Quantization:
    """Tiles, waves, the three efficiencies and the alignment of an ``m x n x k`` matmul."""
    positive_int("k", k)
    tiles = output_tiles(m, n, tile, tile)
    return Quantization(tiles=tiles, waves=waves(tiles, sm_count),
                        tile_efficiency=tile_efficiency(m, tile) * tile_efficiency(n, tile),
                        wave_efficiency=wave_efficiency(tiles, sm_count),
                        useful_fraction=useful_fraction(m, n, sm_count, tile, tile),
                        aligned=all(aligned(d, dtype_bytes) for d in (m, n, k)))


def predicted_slow(m: int, n: int, k: int, sm_count: int, dtype_bytes: int, tile: int = TILE) -> bool:
    """The course's rule: a shape is predicted slow when a dimension is not aligned for Tensor
    Cores, or when less than :data:`SLOW_BELOW` of its launched work is useful."""
    return quantization(m, n, k, sm_count, dtype_bytes, tile).slow


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an ``m x k`` by ``k x n`` matmul: a multiply and an add per term, ``2 m n k``."""
    for name, v in (("m", m), ("n", n), ("k", k)):
        positive_int(name, v)
    return 2 * m * n * k


# -- the sweep's shapes -------------------------------------------------------------------------

# (square side, inner dimension of the wave shapes) by size tier (utils/course/env.py's tiers). The
# squares are the size of the lab's big matmul; the wave shapes are one tile wide and long in k,
# so that each tile is a long piece of work and an idle SM shows.
_SIDES = {"cpu": (256, 64), "t4": (4096, 16384), "a100": (8192, 32768), "h100": (8192, 32768)}


def sweep_shapes(sm_count: int, tier: str, tile: int = TILE) -> dict[str, tuple[int, int, int]]:
    """The shapes lab 00 sweeps, by label: squares that are multiples of 128, of 64 only, and odd;
    and an output of exactly one wave of tiles against one tile more."""
    positive_int("sm_count", sm_count)
    if tier not in _SIDES:
        raise ValueError(f"no sweep for tier {tier!r}; known: {', '.join(_SIDES)}")
    s, k = _SIDES[tier]
    return {
        "half square": (s // 2, s // 2, s // 2),
        "square, multiple of 128": (s, s, s),
        "square, multiple of 64": (s + 64, s + 64, s + 64),
        "square, odd": (s + 1, s + 1, s + 1),
        "one full wave": (tile * sm_count, tile, k),
        "one tile past a wave": (tile * (sm_count + 1), tile, k),
    }


def sm_count(device_index: int = 0) -> int:
    """The SMs of CUDA device ``device_index`` (``torch.cuda.get_device_properties(i).multi_processor_count``);
    :data:`CPU_STAND_IN_SMS` without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return CPU_STAND_IN_SMS
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def best(tflops_by_label: dict[str, float]) -> tuple[str, float]:
    """The label and rate of the fastest shape of a sweep: the most this device reached."""
    if not isinstance(tflops_by_label, dict) or not tflops_by_label:
        raise ValueError("a sweep is a non-empty dict of label -> TFLOP/s")
    for label, v in tflops_by_label.items():
        positive(f"TFLOP/s of {label!r}", v)
    label = max(tflops_by_label, key=tflops_by_label.__getitem__)
    return label, float(tflops_by_label[label])
