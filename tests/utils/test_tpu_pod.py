"""utils/tpu/tpu_pod.py: the systolic-array arithmetic against the datasheet peaks it explains, the
XLA_FLAGS request, and JAX's own bytes per device."""
from __future__ import annotations

import math

import pytest

from utils.capacity.accelerators import ACCELERATORS
from utils.tpu import tpu_pod


def test_systolic_peak_is_macs_times_two_times_clock():
    # one 128 x 128 array at 1 GHz: 16,384 MACs x 2 FLOPs x 1e9 = 32.768 TFLOP/s
    assert tpu_pod.systolic_peak_tflops(1, 128, 128, 1.0) == pytest.approx(32.768, rel=1e-12)
    assert tpu_pod.systolic_peak_tflops(8, 128, 128, 1.05) == pytest.approx(8 * 32.768 * 1.05, rel=1e-12)
    for bad in ((0, 128, 128, 1.0), (1, 128, 128, 0.0), (1.5, 128, 128, 1.0), (1, 128, 128, math.inf), (True, 1, 1, 1.0)):
        with pytest.raises(ValueError, match="must be a positive"):
            tpu_pod.systolic_peak_tflops(*bad)


def test_the_implied_clock_gives_back_the_datasheet_peak_and_is_a_plausible_clock():
    for chip in tpu_pod.TPU_CHIPS.values():
        ghz = tpu_pod.implied_clock_ghz(chip)
        assert tpu_pod.systolic_peak_tflops(chip.mxus, chip.mxu_rows, chip.mxu_cols, ghz) == pytest.approx(chip.bf16_tflops)
        assert 0.7 < ghz < 2.5, f"{chip.name}: {ghz:.2f} GHz does not look like a clock: MXU count or peak mistyped"
    v4 = tpu_pod.TPU_CHIPS["TPU v4"]
    assert v4.mxus == 8 and v4.macs_per_cycle == 131_072 and tpu_pod.implied_clock_ghz(v4) == pytest.approx(1.049, abs=1e-3)


def test_the_table_reuses_the_accelerator_rows_and_names_its_sources():
    assert tpu_pod.TPU_CHIPS["TPU v5e"].bf16_tflops == ACCELERATORS["tpu-v5e"].bf16_tflops
    for chip in tpu_pod.TPU_CHIPS.values():
        assert "cloud.google.com/tpu/docs" in chip.source and chip.pod_chips > 0 and "torus" in chip.topology


def test_request_host_devices_respects_a_count_already_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert tpu_pod.request_host_devices(8) is False
    assert tpu_pod.request_host_devices(2) is True
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.setattr(tpu_pod, "_backend_started", lambda: False)
    assert tpu_pod.request_host_devices(4) is True
    import os

    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"
    monkeypatch.setattr(tpu_pod, "_backend_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert tpu_pod.request_host_devices(4) is False and os.environ["XLA_FLAGS"] == ""


def test_jax_reports_the_bytes_a_layout_puts_on_each_device():
    jax = pytest.importorskip("jax")
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from utils.tpu import xla  # noqa: F401  (asks for the CPU devices before JAX starts)

    assert len(tpu_pod.host_devices(8)) == 8  # raises, in one line, when JAX started with fewer
    # 16 x 12 int8 = 192 bytes; rows over 'b' (4), columns over 'a' (2): 24 bytes on each of 8 devices
    assert tpu_pod.jax_shard_bytes((16, 12), "int8", {"a": 2, "b": 4}, ("b", "a")) == [24] * 8
    # split over 'a' only: copied over 'b'
    assert tpu_pod.jax_shard_bytes((16, 12), "float32", {"a": 2, "b": 4}, ("a",)) == [384] * 8
    # a tuple entry splits over the product of its axes
    assert tpu_pod.jax_shard_bytes((16, 12), "float32", {"a": 2, "b": 4}, (("a", "b"), None)) == [96] * 8
    # replicated: the whole array on each device of a 4-device mesh
    assert tpu_pod.jax_shard_bytes((16, 12), "bfloat16", {"data": 4}, ()) == [384] * 4
    placed = jax.device_put(np.zeros((8, 4), "float32"), NamedSharding(tpu_pod.mesh({"data": 4}), PartitionSpec("data")))
    rows = tpu_pod.layout(placed)
    assert [r["index"] for r in rows] == [((0, 2), (0, 4)), ((2, 4), (0, 4)), ((4, 6), (0, 4)), ((6, 8), (0, 4))]
    assert [r["device"] for r in rows] == [0, 1, 2, 3] and {r["bytes"] for r in rows} == {32}


def test_too_few_devices_is_one_line(monkeypatch):
    jax = pytest.importorskip("jax")
    monkeypatch.setattr(jax, "devices", lambda *a: [object()])
    with pytest.raises(RuntimeError, match=r"JAX has 1 CPU device\(s\), the lab needs 8: .* restart the kernel"):
        tpu_pod.host_devices(8)


def test_command_line_refuses_other_arguments(capsys):
    assert tpu_pod.main(["--what"]) == 2
    assert "usage: python -m utils.tpu.tpu_pod --shard-bytes" in capsys.readouterr().err
