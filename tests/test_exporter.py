"""utils.exporter against a fake pynvml: dcgm-exporter's names, types, units and labels;
NVML failing mid-run; NVML absent; the HTTP server and the CLI's one-line errors.

The fake lives here (not tests/fakes.py) because the exporter needs calls that file does not
fake: PCI info, minor numbers, XID events and GPM. Samples are taken with
``exporter.refresh()`` so no test depends on thread timing; the staleness test moves an
injected clock instead of sleeping."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from utils import exporter as ex
from utils import nvml

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
    """A module-like fake of the pynvml calls utils.exporter makes.

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
    exp = ex.NvmlExporter(registry=reg, log=logs.append, **kw)
    return reg, exp, logs


def families(reg) -> dict:
    """Parsed exposition text, exactly as served."""
    text = ex.render(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def samples(fams, name):
    return {s.labels.get("gpu", ""): s for s in fams[name].samples}


# -- names, types, units, labels -------------------------------------------------------------

def test_dcgm_names_types_units_and_labels():
    with fake_nvml(FakePynvml(n_gpus=2)):
        reg, exp, logs = make()
        exp.refresh()
        exp.refresh()  # GPM needs two samples
        fams, text = families(reg)
    # Types exactly as dcgm-exporter's default-counters.csv / dcp-metrics-included.csv
    for spec in ex.DCGM_METRICS:
        assert f"# TYPE {spec.name} {spec.kind}\n" in text, spec.name
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert fams["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"
    # dcgm-exporter's bare counter name, not prometheus_client's <name>_total
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text and "CONSUMPTION_total" not in text
    g0 = {name: samples(fams, name)["0"].value for name in (s.name for s in ex.DCGM_METRICS)}
    assert g0["DCGM_FI_DEV_GPU_UTIL"] == 90 and g0["DCGM_FI_DEV_MEM_COPY_UTIL"] == 40
    assert g0["DCGM_FI_DEV_FB_USED"] == 40_000  # MiB, floored
    assert g0["DCGM_FI_DEV_FB_FREE"] == 143_771 - 40_000 - 1
    assert g0["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(456.789)  # W from mW
    assert g0["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 1_000_000 + 2 * 50_000  # mJ, as read
    assert g0["DCGM_FI_DEV_GPU_TEMP"] == 55
    assert g0["DCGM_FI_DEV_SM_CLOCK"] == 1980 and g0["DCGM_FI_DEV_MEM_CLOCK"] == 3201
    assert g0["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert g0["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(0.375)  # ratio, not %
    assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["1"].value == 91
    labels = samples(fams, "DCGM_FI_DEV_GPU_UTIL")["1"].labels
    assert labels == {"gpu": "1", "UUID": "GPU-00000001-fake", "pci_bus_id": "00000000:19:00.0",
                      "device": "nvidia1", "modelName": "NVIDIA H200", "Hostname": "node-a"}
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1
    assert samples(fams, "gpulab_exporter_gpus")[""].value == 2
    assert fams["gpulab_exporter_nvml_errors"].samples == [] and logs == []


def test_kubernetes_labels_from_env():
    assert ex.kubernetes_labels({}) == {}
    env = {"POD_NAME": "vllm-0", "POD_NAMESPACE": "llm"}
    assert ex.kubernetes_labels(env) == {"container": "", "namespace": "llm", "pod": "vllm-0"}
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make(k8s_labels=ex.kubernetes_labels({**env, "CONTAINER_NAME": "vllm"}))
        exp.refresh()
        fams, _ = families(reg)
    lab = samples(fams, "DCGM_FI_DEV_POWER_USAGE")["0"].labels
    assert (lab["pod"], lab["namespace"], lab["container"]) == ("vllm-0", "llm", "vllm")
    assert samples(fams, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")["0"].labels == lab


def test_tensor_active_absent_without_gpm_and_on_first_sample():
    with fake_nvml(FakePynvml(n_gpus=1, gpm=False)):
        reg, exp, logs = make()
        exp.refresh()
        exp.refresh()
        fams, _ = families(reg)
    assert fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples == []  # pre-Hopper: absent
    assert fams["gpulab_exporter_nvml_errors"].samples == [] and logs == []  # and not an error
    with fake_nvml(FakePynvml(n_gpus=1, gpm=True)):
        reg, exp, _ = make()
        exp.refresh()
        fams, _ = families(reg)
    assert fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].samples == []  # one sample is no interval


def test_xid_events_set_the_last_xid_per_gpu():
    fake = FakePynvml(n_gpus=2)
    with fake_nvml(fake):
        reg, exp, _ = make()
        exp.refresh()
        assert sorted(fake.registered) == [0, 1]
        fake.xid_events += [(1, 13), (1, 79)]
        exp.refresh()
        fams, _ = families(reg)
    xid = samples(fams, "DCGM_FI_DEV_XID_ERRORS")
    assert xid["0"].value == 0 and xid["1"].value == 79


def test_devices_selects_nvml_indices():
    with fake_nvml(FakePynvml(n_gpus=3)):
        reg, exp, _ = make(devices=[2])
        exp.refresh()
        fams, _ = families(reg)
    assert set(samples(fams, "DCGM_FI_DEV_GPU_UTIL")) == {"2"}


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        ex.NvmlExporter(registry=None, interval_s=0)


# -- failures ---------------------------------------------------------------------------------

def test_nvml_failing_mid_run_keeps_serving_and_counts():
    fake = FakePynvml(n_gpus=2)
    with fake_nvml(fake):
        reg, exp, logs = make()
        exp.refresh()
        fake.broken = {"nvmlDeviceGetPowerUsage"}  # one field breaks
        exp.refresh()
        exp.refresh()
        fams, _ = families(reg)
        assert "DCGM_FI_DEV_POWER_USAGE" in fams and fams["DCGM_FI_DEV_POWER_USAGE"].samples == []
        assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["0"].value == 90  # the rest still served
        errors = {s.labels["call"]: s.value for s in fams["gpulab_exporter_nvml_errors"].samples}
        assert errors == {"nvmlDeviceGetPowerUsage": 4.0}  # 2 refreshes x 2 GPUs
        assert len(logs) == 1 and "nvmlDeviceGetPowerUsage failed (NVMLError: Unknown Error)" in logs[0]
        assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1

        fake.broken = {"nvmlDeviceGetCount"}  # NVML stops answering at all
        exp.refresh()
        fams, _ = families(reg)
        assert fams["DCGM_FI_DEV_GPU_UTIL"].samples == []
        assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
        errors = {s.labels["call"]: s.value for s in fams["gpulab_exporter_nvml_errors"].samples}
        assert errors["nvmlDeviceGetCount"] == 1

        fake.broken = set()  # and recovers
        exp.refresh()
        fams, _ = families(reg)
        assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1
        assert samples(fams, "DCGM_FI_DEV_POWER_USAGE")["1"].value == pytest.approx(456.789)


def test_stale_sample_is_dropped_not_served_as_current():
    now = [100.0]
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make(interval_s=1.0, stale_after_s=5.0, clock=lambda: now[0])
        exp.refresh()
        now[0] += 4.0
        fams, _ = families(reg)
        assert samples(fams, "gpulab_exporter_sample_age_seconds")[""].value == pytest.approx(4.0)
        assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["0"].value == 90
        now[0] += 2.0  # a hung NVML call: no refresh for 6 s
        fams, _ = families(reg)
    assert fams["DCGM_FI_DEV_GPU_UTIL"].samples == []
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0


def test_nvml_absent_serves_error_metrics_and_says_so_once():
    with fake_nvml(FakePynvml(init_error="Driver Not Loaded")):
        reg, exp, logs = make()
        for _ in range(3):
            exp.refresh()
        fams, text = families(reg)
    assert len(logs) == 1 and "NVML unavailable" in logs[0] and "Driver Not Loaded" in logs[0]
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
    assert {s.labels["call"]: s.value for s in fams["gpulab_exporter_nvml_errors"].samples} == {"nvmlInit": 1.0}
    assert all(not fams[s.name].samples for s in ex.DCGM_METRICS)
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text  # the families are still described


# -- HTTP server and CLI ------------------------------------------------------------------------

def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers["Content-Type"], r.read().decode()


def test_server_serves_metrics_and_health():
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make()
        exp.refresh()
        server = ex.MetricsServer("127.0.0.1", 0, reg)
        try:
            status, ctype, body = _get(server.url)
            assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
            assert "DCGM_FI_DEV_GPU_UTIL{" in body
            assert _get(server.url.replace("/metrics", "/health"))[0] == 200
            with pytest.raises(urllib.error.HTTPError):
                _get(server.url.replace("/metrics", "/nope"))
        finally:
            server.close()


def test_thread_refreshes_without_explicit_calls():
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make(interval_s=0.05)
        exp.start()
        try:
            for _ in range(200):  # bounded wait for the first refresh (no timing asserted)
                fams, _ = families(reg)
                if fams["DCGM_FI_DEV_GPU_UTIL"].samples:
                    break
                exp._stop.wait(0.05)
        finally:
            exp.stop()
    assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["0"].value == 90


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "utils.exporter", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, needle", [
    (["--port", "70000"], "--port must be 0..65535"),
    (["--port", "abc"], "invalid int value"),
    (["--interval-s", "0.01"], "--interval-s must be >= 0.1"),
    (["--host", "no.such.host.invalid", "--port", "0"], "cannot resolve --host"),
])
def test_cli_bad_input_is_one_line(args, needle):
    r = _cli(*args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_snapshot_takes_two_readings_for_gpm():
    with fake_nvml(FakePynvml(n_gpus=1, tensor_pct=80.0)):
        snap = ex.snapshot(interval_s=0.01)
    m = snap["metrics"]
    assert m["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][0]["value"] == pytest.approx(0.8)
    assert m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["labels"]["UUID"] == "GPU-00000000-fake"
    assert m["gpulab_exporter_nvml_errors"] == [] and snap["nvml"]["available"] is True


def test_cli_dump_json_to_a_bad_path_is_one_line(tmp_path):
    r = _cli("--dump-json", str(tmp_path / "missing" / "out.json"))
    assert r.returncode == 2
    assert "cannot write --dump-json" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = _cli("--port", str(s.getsockname()[1]))
    assert r.returncode == 2
    assert "already in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
