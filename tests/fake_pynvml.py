"""A module-like fake of pynvml for the exporter tests (tests/utils/test_nvml_collector.py,
tests/utils/test_exporter.py, tests/integration/test_deploy.py): the calls utils.production.nvml_collector makes, beyond
what tests/fakes.py fakes (PCI info, minor numbers, XID events and GPM). :class:`RealErrors`
raises nvidia-ml-py's own exceptions (``pynvml.NVMLError(code)`` becomes
``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``, ...), so the error names are the real ones."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pynvml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from utils.device import nvml
from utils.production import dcgm_metrics as dm
from utils.production import nvml_collector as nc

MIB = 2**20


class NVMLError(Exception):
    def __init__(self, msg: str, value: int = 999):
        super().__init__(msg)
        self.value = value


class NVMLError_Timeout(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self) -> None:
        super().__init__("Timeout", 10)


class _GpmMetrics:
    """Stands for pynvml.c_nvmlGpmMetricsGet_t."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)]


class FakePynvml:
    """A module-like fake of the pynvml calls utils.production.nvml_collector makes.

    ``broken``: set of function names that raise (flip it mid-run to break NVML);
    ``gpm``: whether GPM is supported (Hopper) and what ANY_TENSOR_UTIL % it reports;
    ``xid_events``: queued (gpu index, xid) events."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_ERROR_TIMEOUT = 10
    nvmlEventTypeXidCriticalError = 0x8
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout
    c_nvmlGpmMetricsGet_t = _GpmMetrics

    def __init__(self, n_gpus: int = 2, *, gpm: bool = True, tensor_pct: float = 37.5,
                 energy_step_mj: int = 50_000, init_error: str | None = None):
        self.n, self.gpm, self.tensor_pct = n_gpus, gpm, tensor_pct
        self.energy_mj = [1_000_000 * (i + 1) for i in range(n_gpus)]
        self.energy_step_mj = energy_step_mj
        self.init_error = init_error
        self.broken: set[str] = set()
        self.xid_events: list[tuple[int, int]] = []
        self.registered: list[int] = []
        self.gpm_samples_taken = 0

    def __getattribute__(self, name: str):
        if name.startswith("nvml") and name in object.__getattribute__(self, "broken"):
            raise NVMLError("Unknown Error")
        return object.__getattribute__(self, name)

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlSystemGetDriverVersion(self):
        return "580.65.06"

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.n:
            raise NVMLError("Invalid Argument")
        return SimpleNamespace(index=i)

    def nvmlDeviceGetIndex(self, h):
        return h.index

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-0000000{h.index}-fake"

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"  # old pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{h.index + 0x18:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h):
        return h.index

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=90 + h.index, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        total = 143_771 * MIB
        used = 40_000 * MIB + 123  # a part MiB: floored, as DCGM's integer MiB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h):
        return 456_789  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy_mj[h.index] += self.energy_step_mj
        return self.energy_mj[h.index]

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 55

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 3201}[clock]

    def nvmlEventSetCreate(self):
        return SimpleNamespace(kind="event-set")

    def nvmlDeviceRegisterEvents(self, h, types, es):
        assert types & self.nvmlEventTypeXidCriticalError
        self.registered.append(h.index)

    def nvmlEventSetWait(self, es, timeout_ms):
        assert timeout_ms == 0  # polling: never block the refresh
        if not self.xid_events:
            raise NVMLError_Timeout()
        i, xid = self.xid_events.pop(0)
        return SimpleNamespace(device=SimpleNamespace(index=i), eventType=0x8, eventData=xid)

    def nvmlEventSetFree(self, es):
        pass

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(taken=0)

    def nvmlGpmSampleFree(self, s):
        pass

    def nvmlGpmSampleGet(self, h, s):
        self.gpm_samples_taken += 1
        s.taken = self.gpm_samples_taken
        return s

    def nvmlGpmMetricsGet(self, mg):
        assert mg.version == 1 and mg.numMetrics == 1
        assert mg.metrics[0].metricId == self.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        assert mg.sample1 is not mg.sample2 and mg.sample2.taken > mg.sample1.taken  # older first
        mg.metrics[0].value = self.tensor_pct
        return mg


@contextlib.contextmanager
def fake_nvml(fake):
    nvml.set_library(fake)
    try:
        yield fake
    finally:
        nvml.set_library(None)


def make(fake=None, **kw):
    """A fresh registry and exporter (no thread), with messages captured."""
    reg = CollectorRegistry()
    logs: list[str] = []
    kw.setdefault("hostname", "node-a")
    kw.setdefault("k8s_labels", {})
    exp = nc.NvmlExporter(registry=reg, log=logs.append, **kw)
    return reg, exp, logs


def families(reg) -> dict:
    """Parsed exposition text, exactly as served."""
    text = dm.render(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def samples(fams, name):
    return {s.labels.get("gpu", ""): s for s in fams[name].samples}



class RealErrors(FakePynvml):
    """FakePynvml failing with pynvml's exceptions: ``fail[call] = (NVML_ERROR_x, gpus)``
    (``gpus`` None: every GPU). ``nvmlInit`` may fail too; ``inits`` counts the attempts."""

    NVMLError = pynvml.NVMLError
    NVMLError_Timeout = pynvml.NVMLError_Timeout

    def __init__(self, *args, fail=None, **kw):
        super().__init__(*args, **kw)
        self.fail = dict(fail or {})
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        if "nvmlInit" in self.fail:
            raise pynvml.NVMLError(self.fail["nvmlInit"][0])

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if not name.startswith("nvml") or name == "nvmlInit":
            return attr
        rule = object.__getattribute__(self, "fail").get(name)
        if rule is None:
            return attr
        code, gpus = rule

        def failing(*args):
            first = args[0] if args else None
            index = first if isinstance(first, int) else getattr(first, "index", None)
            if gpus is None or index in gpus:
                raise pynvml.NVMLError(code)
            return attr(*args)

        return failing


def errors_by(fams) -> dict:
    return {(s.labels["call"], s.labels["error"]): s.value for s in fams["gpulab_exporter_nvml_errors"].samples}


def gpus_with(fams, name) -> set:
    return set(samples(fams, name))
