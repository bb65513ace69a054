"""A fake ``pynvml`` for tests, installed at the one seam: ``utils.device.nvml.set_library``.

>>> fake = FakeNvml([FakeGpu(power_mw=300_000)])
>>> with installed(fake):   # restores the real library afterwards
...     ...

It answers the calls ``utils`` makes, with fixed values per device, and can fail the ways
real NVML fails: ``nvmlInit`` raising (no driver), every call raising after N samples
(``fail_after``: NVML broke mid-run), or one device raising after N samples
(``vanish``: "GPU has fallen off the bus"). A sample is counted by
``nvmlDeviceGetUtilizationRates``, the first call ``GpuMonitor`` makes per device.
The energy counter advances by ``energy_step_mj`` on every read, so the energy of a
window of n samples is (n - 1) x step.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from utils.device import nvml


class NVMLError(Exception):
    """Stands for ``pynvml.NVMLError`` (and its subclasses)."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-fake"
    util_gpu_pct: int = 87
    util_mem_pct: int = 41
    mem_used_bytes: int = 40 * 2**30
    mem_total_bytes: int = 141 * 10**9
    power_mw: int = 450_000
    energy_start_mj: int = 1_000_000
    energy_step_mj: int = 45_000
    temp_c: int = 61
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 3201
    throttle_mask: int = 0x4  # sw_power_cap
    energy_supported: bool = True
    processes: dict = field(default_factory=dict)  # pid -> bytes, as nvmlDeviceGetComputeRunningProcesses lists them
    # state
    samples: int = field(default=0, init=False)
    energy_mj: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.energy_mj = self.energy_start_mj


class FakeNvml:
    """A module-like object with the NVML functions and constants ``utils`` uses."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: str | None = None,
                 fail_after: int | None = None, vanish: dict[int, int] | None = None,
                 driver: str = "570.124.06"):
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.fail_after = fail_after  # total utilization reads (all devices) before every call fails
        self.vanish = dict(vanish or {})  # device index -> samples it answers before it is gone
        self.driver = driver
        self.calls = 0
        self.inits = 0

    # -- helpers ------------------------------------------------------------------------
    def _dev(self, handle: SimpleNamespace) -> FakeGpu:
        """The device behind ``handle``, or NVMLError once its samples are used up. Every
        call inside a sample sees the number of samples begun before it."""
        self.calls += 1
        i = handle.index
        if self.fail_after is not None and sum(g.samples for g in self.gpus) - 1 >= self.fail_after:
            raise NVMLError("Unknown Error")
        if i in self.vanish and self.gpus[i].samples - 1 >= self.vanish[i]:
            raise NVMLError("GPU is lost")
        return self.gpus[i]

    # -- the NVML API -------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, h: SimpleNamespace) -> str:
        return self._dev(h).name

    def nvmlDeviceGetUUID(self, h: SimpleNamespace) -> str:
        return self._dev(h).uuid

    def nvmlDeviceGetUtilizationRates(self, h: SimpleNamespace) -> SimpleNamespace:
        self.gpus[h.index].samples += 1  # a sample begins, answered or not
        g = self._dev(h)
        return SimpleNamespace(gpu=g.util_gpu_pct, memory=g.util_mem_pct)

    def nvmlDeviceGetMemoryInfo(self, h: SimpleNamespace) -> SimpleNamespace:
        g = self._dev(h)
        return SimpleNamespace(used=g.mem_used_bytes, total=g.mem_total_bytes,
                               free=g.mem_total_bytes - g.mem_used_bytes)

    def nvmlDeviceGetComputeRunningProcesses(self, h: SimpleNamespace) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._dev(h).processes.items()]

    def nvmlDeviceGetPowerUsage(self, h: SimpleNamespace) -> int:
        return self._dev(h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: SimpleNamespace) -> int:
        g = self._dev(h)
        if not g.energy_supported:
            raise NVMLError("Not Supported")
        value = g.energy_mj
        g.energy_mj += g.energy_step_mj
        return value

    def nvmlDeviceGetTemperature(self, h: SimpleNamespace, sensor: int) -> int:
        return self._dev(h).temp_c

    def nvmlDeviceGetClockInfo(self, h: SimpleNamespace, clock: int) -> int:
        g = self._dev(h)
        return g.sm_clock_mhz if clock == self.NVML_CLOCK_SM else g.mem_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: SimpleNamespace, clock: int) -> int:
        return self.nvmlDeviceGetClockInfo(h, clock)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimpleNamespace) -> int:
        return self._dev(h).throttle_mask

    def nvmlDeviceGetEnforcedPowerLimit(self, h: SimpleNamespace) -> int:
        self._dev(h)
        return 700_000

    def nvmlDeviceGetMigMode(self, h: SimpleNamespace) -> list[int]:
        self._dev(h)
        return [0, 0]


@contextlib.contextmanager
def installed(fake: object) -> Iterator[object]:
    """Use ``fake`` as the NVML library inside the block, then restore the real one."""
    nvml.set_library(fake)
    try:
        yield fake
    finally:
        nvml.set_library(None)


@contextlib.contextmanager
def nvml_not_installed(monkeypatch) -> Iterator[None]:
    """Make ``import pynvml`` fail (nvidia-ml-py missing) inside the block."""
    import sys

    with monkeypatch.context() as m:
        m.setitem(sys.modules, "pynvml", None)  # a None entry makes the import raise ImportError
        nvml.set_library(None)
        try:
            yield
        finally:
            nvml.set_library(None)
