"""utils/measure/matmul_ceiling.py: the measured matmul ceiling, on the CPU through the same function a GPU runs."""
from __future__ import annotations

import pytest
import torch

from utils.measure import matmul_ceiling as M
from utils.measure.flops import matmul_flops
from utils.units import tflop_per_s


def test_the_ceiling_is_the_fastest_side_timed_on_this_device():
    c = M.measure("bf16", device="cpu", sides=(64, 128), budget_s=0.2)
    assert c.dtype == "fp32"  # the loops run fp32 on a CPU, so the ceiling is measured in fp32 there
    assert set(c.by_side) == {64, 128} and c.tflops == max(c.by_side.values()) == c.by_side[c.side] > 0
    assert "side" in str(c) and "fp32" in str(c)


def test_a_fraction_is_the_loops_flops_over_the_ceiling():
    c = M.Ceiling(tflops=2.0, side=128, dtype="fp32", by_side={128: 2.0})
    assert M.fraction(0.5, c) == pytest.approx(0.25) == M.fraction(0.5, 2.0)
    assert M.fraction(None, c) is None and M.fraction(0.5, None) is None


def test_the_rate_is_the_matmuls_flops_over_its_median_time(monkeypatch):
    from utils.measure import timing

    class Fixed:
        median_ms = 4.0

    monkeypatch.setattr(timing, "benchmark", lambda *a, **k: Fixed())
    c = M.measure("fp32", device="cpu", sides=(100,))
    assert c.tflops == pytest.approx(tflop_per_s(matmul_flops(100, 100, 100), 4.0)) == pytest.approx(2e6 / 4e-3 / 1e12)


def test_an_unknown_precision_is_one_line():
    with pytest.raises(ValueError, match="precision must be one of bf16, fp16, fp32"):
        M.measure("int4", device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_on_a_gpu_the_ceiling_is_below_the_datasheet_peak():
    from utils.device.hardware import current_spec

    c = M.measure("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    peak = current_spec().peak_tflops(c.dtype)
    assert 0 < c.tflops <= peak * 1.02, (c, peak)
