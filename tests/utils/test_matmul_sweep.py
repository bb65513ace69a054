"""utils/measure/matmul_sweep.py: tile and wave quantization, worked by hand from the definitions of
NVIDIA's Matrix Multiplication Background User's Guide (sections 2.2, 3.1, 3.2)."""
from __future__ import annotations

import math

import pytest

from utils.measure import matmul_sweep as ms


def test_tiles_cover_the_output_with_ceilings():
    assert ms.output_tiles(128, 128) == 1
    assert ms.output_tiles(129, 128) == 2  # one row past a tile starts a second tile
    assert ms.output_tiles(8192, 8192) == 64 * 64
    assert ms.output_tiles(8193, 8192) == 65 * 64
    assert ms.output_tiles(300, 100, tile_m=256, tile_n=64) == 2 * 2


@pytest.mark.parametrize("tiles, sms, want_waves, want_eff", [
    (108, 108, 1, 1.0),  # an A100's 108 SMs, one full wave
    (109, 108, 2, 109 / 216),  # one tile past it: a second wave with one busy SM
    (132 * 3, 132, 3, 1.0),
    (1, 40, 1, 1 / 40),
])
def test_waves_and_their_efficiency(tiles, sms, want_waves, want_eff):
    assert ms.waves(tiles, sms) == want_waves
    assert math.isclose(ms.wave_efficiency(tiles, sms), want_eff)


def test_tile_efficiency_of_one_dimension():
    assert ms.tile_efficiency(256) == 1.0
    assert math.isclose(ms.tile_efficiency(257), 257 / 384)
    assert math.isclose(ms.tile_efficiency(320), 320 / 384)  # a multiple of 64, not of 128
    assert math.isclose(ms.tile_efficiency(100, tile=64), 100 / 128)


def test_useful_fraction_is_the_product_of_tile_and_wave_efficiency():
    for m, n, sms in ((8193, 8192, 132), (320, 320, 40), (128 * 41, 128, 40), (1000, 3000, 108)):
        q = ms.quantization(m, n, 64, sms, 2)
        assert math.isclose(q.useful_fraction, q.tile_efficiency * q.wave_efficiency)
        assert math.isclose(q.useful_fraction, m * n / (q.waves * sms * ms.TILE**2))


def test_alignment_is_in_bytes():
    assert ms.aligned(8, 2) and not ms.aligned(4, 2)  # 8 bf16 elements are 16 bytes
    assert ms.aligned(4, 4) and not ms.aligned(6, 4)  # 4 fp32 elements are 16 bytes
    assert not ms.aligned(8193, 2) and ms.aligned(8256, 2)


@pytest.mark.parametrize("shape, sms, slow", [
    ((8192, 8192, 8192), 132, False),  # 4096 tiles over 132 SMs: 32 waves, 97% useful
    ((8193, 8193, 8193), 132, True),  # odd: not aligned
    ((8256, 8256, 8256), 132, False),  # a multiple of 64: 65 x 65 tiles, 95% useful
    ((128 * 132, 128, 32768), 132, False),  # exactly one wave
    ((128 * 133, 128, 32768), 132, True),  # one tile past: two waves, 50% useful
    ((256, 256, 256), 40, True),  # 4 tiles on 40 SMs: most SMs idle
    ((4096, 4096, 4095), 40, True),  # k misaligned alone is enough
])
def test_predicted_slow(shape, sms, slow):
    assert ms.predicted_slow(*shape, sms, 2) is slow


def test_sweep_shapes_straddle_a_wave_and_the_tile():
    shapes = ms.sweep_shapes(132, "h100")
    full, past = shapes["one full wave"], shapes["one tile past a wave"]
    assert ms.output_tiles(full[0], full[1]) == 132 and ms.output_tiles(past[0], past[1]) == 133
    assert shapes["square, multiple of 128"][0] % 128 == 0 and shapes["square, multiple of 64"][0] % 128 == 64
    assert shapes["square, odd"][0] % 2 == 1
    slow = {label for label, s in shapes.items() if ms.predicted_slow(*s, 132, 2)}
    assert slow == {"square, odd", "one tile past a wave"}, slow
    for tier in ("cpu", "t4", "a100", "h100"):
        assert len(ms.sweep_shapes(40, tier)) == 6


def test_best_and_flops():
    assert ms.best({"a": 1.0, "b": 3.0, "c": 2.0}) == ("b", 3.0)
    assert ms.matmul_flops(2, 3, 4) == 48


@pytest.mark.parametrize("call, match", [
    (lambda: ms.output_tiles(0, 128), "m must be a positive integer"),
    (lambda: ms.waves(10, 0), "sm_count must be a positive integer"),
    (lambda: ms.aligned(8, 2.0), "dtype_bytes must be a positive integer"),
    (lambda: ms.sweep_shapes(132, "b200"), "no sweep for tier 'b200'"),
    (lambda: ms.best({}), "non-empty dict"),
    (lambda: ms.best({"a": -1.0}), "must be a positive number"),
])
def test_bad_input_is_a_one_line_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sm_count_without_a_gpu_is_the_stand_in():
    import torch

    if torch.cuda.is_available():
        assert ms.sm_count() == torch.cuda.get_device_properties(0).multi_processor_count
    else:
        assert ms.sm_count() == ms.CPU_STAND_IN_SMS


def test_every_sm_count_is_a_card_of_the_spec_table():
    from utils.device.hardware import SPECS

    assert set(ms.SM_COUNTS) == set(SPECS)
    assert ms.SM_COUNTS["H100-SXM"] == 132 and ms.SM_COUNTS["A100-80GB"] == 108 and ms.SM_COUNTS["T4"] == 40
