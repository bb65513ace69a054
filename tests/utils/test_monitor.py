"""GpuMonitor (utils/device/monitor.py) against a fake NVML (tests/fakes.py): absent, failing mid-run, normal.

Samples are taken with ``mon.sample()`` under a long interval, so counts are exact and no
test depends on how fast this machine is."""
from __future__ import annotations

import math
import threading
import time

import pynvml
import pytest

from tests.fakes import FakeGpu, FakeNvml, installed, nvml_not_installed
from tests.utils.test_nvml import RealErrorsNvml
from utils.device import nvml
from utils.device.monitor import GpuMonitor
from utils.units import GIB

LONG = 3600.0  # an interval the background thread never reaches during a test


def run(mon: GpuMonitor, extra_samples: int) -> GpuMonitor:
    """Enter, take ``extra_samples`` explicit samples, exit: 2 + extra samples per device."""
    with mon:
        for _ in range(extra_samples):
            mon.sample()
    return mon


# -- normal -------------------------------------------------------------------------------

def test_values_reach_summary_with_units():
    gpu = FakeGpu(mem_used_bytes=40 * GIB, mem_total_bytes=80 * GIB, power_mw=450_000,
                  energy_step_mj=45_000, throttle_mask=0x4 | 0x1)
    with installed(FakeNvml([gpu])):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=3)
    assert mon.source == "nvml" and mon.reason == ""
    s = mon.summary()["gpu0"]
    assert s["samples"] == 5 and s["gaps"] == 0
    assert s["name"] == "NVIDIA H200"
    assert s["util_gpu_pct"] == {"mean": 87.0, "max": 87.0}
    assert s["util_mem_pct"]["mean"] == 41.0
    assert s["mem_used_gib"]["max"] == pytest.approx(40.0)
    assert s["mem_total_gib"] == pytest.approx(80.0)
    assert s["power_w"]["mean"] == pytest.approx(450.0)
    assert s["temp_c"]["max"] == 61.0
    assert s["sm_clock_mhz"]["mean"] == 1980.0 and s["mem_clock_mhz"]["mean"] == 3201.0
    # 5 counter reads, 45 J apart: the window holds 4 steps
    assert s["energy_j"] == pytest.approx(4 * 45.0) and s["energy_method"] == "counter"
    assert s["throttle_reasons_pct"] == {"gpu_idle": 100.0, "sw_power_cap": 100.0}
    assert s["duration_s"] >= 0


def test_samples_as_rows_and_columns():
    with installed(FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-80GB")])):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=1)
    rows = mon.samples
    assert len(rows) == 6 and {r["device"] for r in rows} == {"gpu0", "gpu1"}
    assert rows[0]["power_w"] == 450.0 and rows[0]["throttle_reasons"] == ["sw_power_cap"]
    cols = mon.columns("gpu1")
    assert len(cols["t_s"]) == 3 and cols["device"] == ["gpu1"] * 3
    assert cols["t_s"] == sorted(cols["t_s"])
    assert mon.summary()["gpu1"]["name"] == "NVIDIA A100-SXM4-80GB"


def test_marks_on_the_timeline():
    with installed(FakeNvml()):
        with GpuMonitor(interval_s=LONG) as mon:
            mon.mark("epoch 1")
            mon.mark("epoch 2")
    assert [label for _, label in mon.marks] == ["epoch 1", "epoch 2"]
    assert mon.marks[0][0] <= mon.marks[1][0] <= mon.duration_s


def test_energy_from_power_when_the_counter_is_unsupported():
    # Pascal has no energy counter: integrate power over time instead, and say so
    with installed(FakeNvml([FakeGpu(energy_supported=False, power_mw=200_000)])):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=2)
    s = mon.summary()["gpu0"]
    t = mon.columns()["t_s"]
    assert s["energy_method"] == "power_integral"
    assert s["energy_j"] == pytest.approx(200.0 * (t[-1] - t[0]))
    assert s["gaps"] == 0  # a metric the device never supports is not a gap


def test_background_thread_samples_and_stops():
    with installed(FakeNvml()):
        with GpuMonitor(interval_s=0.01) as mon:
            deadline = time.monotonic() + 10
            while len(mon.samples) < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            thread = mon._thread
            assert thread is not None and thread.daemon
        assert len(mon.samples) >= 5  # the thread sampled on its own
        assert not thread.is_alive() and not mon.running
        n = len(mon.samples)
        time.sleep(0.05)
        assert len(mon.samples) == n  # and nothing after stop
    assert mon.overhead["ticks"] == n


def test_stops_cleanly_when_the_body_raises():
    with installed(FakeNvml()):
        mon = GpuMonitor(interval_s=0.01)
        with pytest.raises(ZeroDivisionError, match="the block failed"):
            with mon:
                thread = mon._thread
                raise ZeroDivisionError("the block failed")
    assert not mon.running and not thread.is_alive()
    assert not any(t is thread for t in threading.enumerate())
    assert mon.summary()["gpu0"]["samples"] == 2  # entry and exit samples were still taken


def test_stop_twice_and_restart():
    with installed(FakeNvml()):
        mon = GpuMonitor(interval_s=LONG)
        mon.start()
        mon.stop()
        mon.stop()
        run(mon, extra_samples=0)
    assert mon.summary()["gpu0"]["samples"] == 2  # a restart begins a fresh timeline


# -- failing mid-run ----------------------------------------------------------------------

def test_nvml_errors_mid_run_become_gaps():
    with installed(FakeNvml(fail_after=3)):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=5)  # 7 samples, 3 good
    s = mon.summary()["gpu0"]
    assert s["samples"] == 7 and s["gaps"] == 4
    assert s["power_w"]["mean"] == pytest.approx(450.0)  # from the good samples only
    assert s["energy_j"] == pytest.approx(2 * 45.0)  # first to last good counter read
    bad = mon.samples[-1]
    assert bad["power_w"] is None and bad["util_gpu_pct"] is None
    assert math.isnan(mon.columns()["power_w"][-1])


def test_a_vanished_gpu_does_not_disturb_the_others():
    with installed(FakeNvml([FakeGpu(), FakeGpu()], vanish={1: 2})):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=4)  # 6 samples each
    s = mon.summary()
    assert s["gpu0"]["gaps"] == 0 and s["gpu0"]["samples"] == 6
    assert s["gpu1"]["gaps"] == 4 and s["gpu1"]["samples"] == 6
    assert s["gpu1"]["energy_j"] == pytest.approx(45.0)


def test_an_exception_inside_the_sampler_is_a_gap_not_a_crash():
    class Broken(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, h):
            return object()  # no .gpu: reading it must not crash anything

    with installed(Broken()):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=1)
    s = mon.summary()["gpu0"]
    assert s["util_gpu_pct"]["mean"] is None and s["power_w"]["mean"] == 450.0


def test_sampler_bug_is_counted(monkeypatch):
    with installed(FakeNvml()):
        mon = GpuMonitor(interval_s=LONG)
        monkeypatch.setattr(mon, "_read_gpu", lambda dev: 1 / 0)
        run(mon, extra_samples=1)
    assert mon.errors == 3 and "ZeroDivisionError" in mon.last_error
    assert mon.summary()["gpu0"]["gaps"] == 3


# -- absent -------------------------------------------------------------------------------

def test_without_nvidia_ml_py_it_samples_the_cpu(monkeypatch):
    with nvml_not_installed(monkeypatch):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=1)
        assert nvml.status().available is False
    assert mon.source == "cpu" and "nvidia-ml-py is not installed" in mon.reason
    s = mon.summary()
    assert list(s) == ["cpu"]
    c = s["cpu"]
    assert c["samples"] == 3 and c["gaps"] == 0
    assert c["rss_gib"]["max"] > 0 and 0 <= c["util_cpu_pct"]["max"] <= 100
    assert c["mem_total_gib"] > 0
    assert "CPU sampling" in mon.report()


def test_nvml_init_failure_falls_back_to_cpu():
    with installed(FakeNvml(init_error="Driver Not Loaded")):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=0)
    assert mon.source == "cpu" and "Driver Not Loaded" in mon.reason
    assert "cpu" in mon.summary()


def test_no_visible_gpu_falls_back_to_cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with installed(FakeNvml()):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=0)
    assert mon.source == "cpu" and "CUDA_VISIBLE_DEVICES" in mon.reason


def test_cpu_source_on_request():
    with installed(FakeNvml()):
        mon = run(GpuMonitor(interval_s=LONG, source="cpu"), extra_samples=0)
    assert mon.source == "cpu" and mon.devices == ["cpu"]


# -- device selection and bad input -------------------------------------------------------

def test_explicit_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with installed(FakeNvml([FakeGpu(), FakeGpu()])):
        mon = run(GpuMonitor(interval_s=LONG, devices=[1]), extra_samples=0)
    assert mon.devices == ["gpu1"]


@pytest.mark.parametrize("kwargs", [{"interval_s": 0}, {"interval_s": -1}, {"interval_s": "fast"},
                                    {"source": "dcgm"}, {"devices": "0"}, {"devices": [-1]}])
def test_bad_arguments_say_what_is_wrong(kwargs):
    with pytest.raises(ValueError, match="must be"):
        GpuMonitor(**kwargs)


def test_plot_delegates_to_plots():
    with installed(FakeNvml()):
        with GpuMonitor(interval_s=LONG) as mon:
            mon.sample()
            mon.mark("half")
    fig = mon.plot()
    assert len(fig.axes) == 3  # utilization, memory, power
    assert any(t.get_text() == "half" for t in fig.axes[0].texts)


# -- NVML's real error codes (nvidia-ml-py's own exception classes) -------------------------

def test_monitor_keeps_the_other_fields_and_says_why_one_is_missing():
    with installed(RealErrorsNvml([FakeGpu(), FakeGpu()], lost=1, lost_after=2)):
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=3)  # 5 samples; GPU 1 lost after 2
    s = mon.summary()
    g0, g1 = s["gpu0"], s["gpu1"]
    assert g0["nvml_errors"] == {"nvmlDeviceGetPowerUsage": "NVML_ERROR_NOT_SUPPORTED"}
    assert g0["power_w"]["mean"] is None and g0["gaps"] == 0  # never supported: not a gap
    assert g0["util_gpu_pct"]["mean"] == 87.0 and g0["energy_method"] == "counter"  # the rest still sampled
    assert g1["nvml_errors"]["nvmlDeviceGetUtilizationRates"] == "NVML_ERROR_GPU_IS_LOST"
    assert g1["samples"] == 5 and g1["gaps"] == 3
    lines = mon.report().splitlines()
    assert len(lines) == 2
    assert "nvmlDeviceGetPowerUsage NVML_ERROR_NOT_SUPPORTED" in lines[0]
    assert "NVML_ERROR_GPU_IS_LOST" in lines[1]


def test_monitor_with_a_gpu_lost_before_it_started():
    class LostHandle(RealErrorsNvml):
        def nvmlDeviceGetHandleByIndex(self, index):
            if index == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return super().nvmlDeviceGetHandleByIndex(index)

    with installed(LostHandle([FakeGpu(), FakeGpu()])):
        mon = run(GpuMonitor(interval_s=LONG, devices=[0, 1]), extra_samples=1)
    s = mon.summary()
    assert s["gpu0"]["util_gpu_pct"]["mean"] == 87.0
    assert s["gpu1"]["nvml_errors"] == {"nvmlDeviceGetHandleByIndex": "NVML_ERROR_GPU_IS_LOST"}
    assert s["gpu1"]["samples"] == 3 and s["gpu1"]["gaps"] == 3 and mon.errors == 0


@pytest.mark.parametrize("code, hint", [
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "/dev/nvidia"),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
])
def test_init_failures_fall_back_to_cpu_with_a_hint(code, hint):
    with installed(RealErrorsNvml([FakeGpu()], init_code=code)):
        st = nvml.status()
        mon = run(GpuMonitor(interval_s=LONG), extra_samples=0)
    assert not st.available and hint in st.reason and len(st.reason.splitlines()) == 1
    assert st.error.startswith("NVML_ERROR_")
    assert mon.source == "cpu" and hint in mon.reason


def test_stop_skips_the_exit_sample_when_the_sampler_hangs_in_nvml():
    class Hanging(FakeNvml):
        def __init__(self):
            super().__init__()
            self.armed = False
            self.entered, self.release = threading.Event(), threading.Event()

        def nvmlDeviceGetPowerUsage(self, h):
            if self.armed:
                self.entered.set()
                self.release.wait(30)
            return super().nvmlDeviceGetPowerUsage(h)

    fake = Hanging()
    with installed(fake):
        mon = GpuMonitor(interval_s=0.01)
        try:
            with mon:
                thread = mon._thread
                fake.armed = True
                assert fake.entered.wait(10), "the sampler never reached the hanging call"
                n = len(mon.samples)
            # the block exited although the sampler is stuck; the exit sample, which would
            # have hung here on the same driver, was skipped and the reason kept
            assert len(mon.samples) == n and not mon.running
            assert "stuck in an NVML call" in mon.last_error
        finally:
            fake.release.set()
            thread.join(10)
