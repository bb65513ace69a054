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


# -- audit: exposition formats, naming, and NVML's real failure modes --------------------------
# The fakes below raise nvidia-ml-py's own exceptions (pynvml.NVMLError(code) becomes
# NVMLError_NotSupported, NVMLError_GpuIsLost, ...), so the error names are the real ones.

import math  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402

import pynvml  # noqa: E402
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest  # noqa: E402
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics  # noqa: E402


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


def test_exposition_is_valid_text_and_openmetrics_with_stable_labels():
    with fake_nvml(FakePynvml(n_gpus=2)):
        reg, exp, _ = make()
        exp.refresh()
        exp.refresh()
        first, text = families(reg)
        exp.refresh()
        second, _ = families(reg)
        om = openmetrics_latest(reg).decode()
    # OpenMetrics (what prometheus_client's own server negotiates): the whole page parses,
    # the energy counter's samples carry _total there, and only there
    om_fams = {f.name: f for f in parse_openmetrics(om)}
    energy = om_fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    assert energy.type == "counter"
    assert {s.name for s in energy.samples} == {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"}
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text  # dcgm-exporter's bare name on /metrics
    for fam in first.values():
        assert fam.documentation.strip(), f"{fam.name} has no HELP"
    label_names = {name: {frozenset(s.labels) for s in fam.samples} for name, fam in first.items()}
    assert label_names == {name: {frozenset(s.labels) for s in fam.samples} for name, fam in second.items()}
    dcgm = {label_names[spec.name].pop() for spec in ex.DCGM_METRICS}
    assert dcgm == {frozenset(ex.LABELS)}  # one label set for every GPU metric
    for name, fam in first.items():  # our own names follow the conventions: snake_case, _total on counters only
        if name.startswith("gpulab_"):
            assert name == name.lower() and not name.endswith("_total")
            assert all(s.name.endswith("_total") == (fam.type == "counter") for s in fam.samples)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_flags_only_dcgm_exporters_own_choices():
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make()
        exp.refresh()
        exp.refresh()
        exp._count("nvmlDeviceGetPowerUsage", "test", "NVML_ERROR_NOT_SUPPORTED")
        text = ex.render(reg).decode()
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    lint = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert lint, "promtool should flag the DCGM names"
    for line in lint:  # camelCase labels (modelName, UUID, Hostname) and the bare energy counter, nothing else
        assert line.startswith("DCGM_FI_"), line
        assert "camelCase" in line or ("TOTAL_ENERGY_CONSUMPTION" in line and '"_total" suffix' in line), line


@pytest.mark.parametrize("call, code, gpus, metrics", [
    ("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, {0}, ["DCGM_FI_DEV_POWER_USAGE"]),  # GeForce, some T4s
    ("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_NOT_SUPPORTED, None,  # a MIG-enabled GPU
     ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"]),
    ("nvmlDeviceGetTotalEnergyConsumption", pynvml.NVML_ERROR_NOT_SUPPORTED, None,  # before Volta
     ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]),
    ("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_TIMEOUT, {1}, ["DCGM_FI_DEV_GPU_TEMP"]),
    ("nvmlDeviceGetClockInfo", pynvml.NVML_ERROR_NO_PERMISSION, None,
     ["DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"]),
    ("nvmlGpmSampleGet", pynvml.NVML_ERROR_NO_PERMISSION, None, ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]),
    ("nvmlEventSetCreate", pynvml.NVML_ERROR_NO_PERMISSION, None, ["DCGM_FI_DEV_XID_ERRORS"]),  # events need root
])
def test_an_nvml_error_leaves_its_metric_out_and_names_the_error(call, code, gpus, metrics):
    error = pynvml.NVMLError(code)
    name = next(k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and v == code)
    with fake_nvml(RealErrors(n_gpus=2, fail={call: (code, gpus)})):
        reg, exp, logs = make()
        for _ in range(3):
            exp.refresh()
        fams, _ = families(reg)
    hit = {"0", "1"} if gpus is None else {str(g) for g in gpus}
    for metric in metrics:  # absent on the GPUs that failed (not 0, not NaN), present on the others
        assert gpus_with(fams, metric) == {"0", "1"} - hit, metric
    assert gpus_with(fams, "DCGM_FI_DEV_FB_USED") == {"0", "1"}  # the other fields still read
    assert not any(math.isnan(s.value) for f in fams.values() for s in f.samples)
    errors = errors_by(fams)
    assert errors.get((call, name), 0) >= 1 and all(e == name for _, e in errors), errors
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1
    assert len(logs) == 1 and len(logs[0].splitlines()) == 1, logs
    assert f"{call} failed ({type(error).__name__}: {error})" in logs[0] and name in logs[0]


def test_a_gpu_that_fell_off_the_bus():
    lost = ["nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo",
            "nvmlGpmSampleGet", "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetMinorNumber"]
    fake = RealErrors(n_gpus=2)
    with fake_nvml(fake):
        reg, exp, logs = make()
        exp.refresh()
        fake.xid_events.append((1, 79))  # Xid 79: GPU has fallen off the bus
        fake.fail = {c: (pynvml.NVML_ERROR_GPU_IS_LOST, {1}) for c in lost}
        exp.refresh()
        exp.refresh()
        fams, _ = families(reg)
    for spec in ex.DCGM_METRICS:
        want = {"0", "1"} if spec is ex.XID else {"0"}
        assert gpus_with(fams, spec.name) == want, spec.name
    assert samples(fams, "DCGM_FI_DEV_XID_ERRORS")["1"].value == 79  # the last XID says why
    assert samples(fams, "gpulab_exporter_gpus")[""].value == 1  # one GPU answers, not two
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1  # NVML itself still answers
    assert ("nvmlDeviceGetPowerUsage", "NVML_ERROR_GPU_IS_LOST") in errors_by(fams)
    assert logs and all(len(line.splitlines()) == 1 and "GPU 1" in line for line in logs)


def test_a_lost_handle_and_an_index_that_disappears_between_scrapes():
    fake = RealErrors(n_gpus=3)
    with fake_nvml(fake):
        reg, exp, logs = make()
        exp.refresh()
        fake.fail = {"nvmlDeviceGetHandleByIndex": (pynvml.NVML_ERROR_GPU_IS_LOST, {1})}
        fake.n = 2  # GPU 2 is gone from the count
        exp.refresh()
        fams, _ = families(reg)
        assert gpus_with(fams, "DCGM_FI_DEV_GPU_UTIL") == {"0"}
        assert samples(fams, "gpulab_exporter_gpus")[""].value == 1
        assert errors_by(fams) == {("nvmlDeviceGetHandleByIndex", "NVML_ERROR_GPU_IS_LOST"): 1.0}
        assert "(first on GPU 1)" in logs[0]
        fake.fail, fake.n = {}, 3
        exp.refresh()
        fams, _ = families(reg)
    assert gpus_with(fams, "DCGM_FI_DEV_GPU_UTIL") == {"0", "1", "2"}


def test_a_driver_that_loads_after_the_exporter_started():
    now = [1000.0]
    fake = RealErrors(n_gpus=1, fail={"nvmlInit": (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, None)})
    with fake_nvml(fake):
        reg, exp, logs = make(clock=lambda: now[0])
        exp.refresh()
        fams, _ = families(reg)
        assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
        assert errors_by(fams) == {("nvmlInit", "NVML_ERROR_DRIVER_NOT_LOADED"): 1.0}
        assert len(logs) == 1 and "not loaded" in logs[0] and len(logs[0].splitlines()) == 1
        del fake.fail["nvmlInit"]  # the driver is up now
        now[0] += 1.0
        exp.refresh()  # too soon to try again: nvmlInit is not hammered every second
        assert fake.inits == 1
        now[0] += ex.INIT_RETRY_S
        exp.refresh()
        fams, _ = families(reg)
    assert fake.inits == 2
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1
    assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["0"].value == 90


@pytest.mark.parametrize("code, hint", [
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "/dev/nvidia"),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "--gpus all"),
])
def test_nvml_init_failures_say_what_to_do(code, hint):
    with fake_nvml(RealErrors(n_gpus=1, fail={"nvmlInit": (code, None)})):
        reg, exp, logs = make()
        exp.refresh()
        fams, _ = families(reg)
    assert len(logs) == 1 and hint in logs[0] and len(logs[0].splitlines()) == 1
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
    assert all(not fams[s.name].samples for s in ex.DCGM_METRICS)


def test_uninitialized_mid_run_reinitialises():
    fake = RealErrors(n_gpus=1)
    with fake_nvml(fake):
        reg, exp, _ = make()
        exp.refresh()
        fake.fail = {"nvmlDeviceGetCount": (pynvml.NVML_ERROR_UNINITIALIZED, None)}  # someone called nvmlShutdown
        exp.refresh()
        fams, _ = families(reg)
        assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
        assert errors_by(fams) == {("nvmlDeviceGetCount", "NVML_ERROR_UNINITIALIZED"): 1.0}
        fake.fail = {}
        exp.refresh()
        fams, _ = families(reg)
    assert fake.inits == 2  # nvmlInit ran again
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 1
    assert gpus_with(fams, "DCGM_FI_DEV_POWER_USAGE") == {"0"}


def test_nvidia_ml_py_missing_serves_only_the_exporters_metrics(monkeypatch):
    from tests.fakes import nvml_not_installed

    with nvml_not_installed(monkeypatch):
        reg, exp, logs = make()
        exp.refresh()
        fams, _ = families(reg)
    assert len(logs) == 1 and "nvidia-ml-py is not installed" in logs[0]
    assert [k[0] for k in errors_by(fams)] == ["nvmlInit"]
    assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0


def test_a_label_call_the_board_lacks_is_asked_once():
    # nvmlDeviceGetMinorNumber is Linux-only: the device label stays empty, and is not asked again
    with fake_nvml(RealErrors(n_gpus=2, fail={"nvmlDeviceGetMinorNumber": (pynvml.NVML_ERROR_NOT_SUPPORTED, None)})):
        reg, exp, _ = make()
        for _ in range(4):
            exp.refresh()
        fams, _ = families(reg)
    assert errors_by(fams) == {("nvmlDeviceGetMinorNumber", "NVML_ERROR_NOT_SUPPORTED"): 2.0}  # once per GPU
    assert samples(fams, "DCGM_FI_DEV_GPU_UTIL")["1"].labels["device"] == ""


def test_container_name_alone_adds_no_kubernetes_labels():
    # a host outside Kubernetes may set CONTAINER_NAME (seen in benchmarks/results/.../exporter.json)
    assert ex.kubernetes_labels({"CONTAINER_NAME": "cheap-art-xkknrn"}) == {}
    assert ex.kubernetes_labels({"POD_NAMESPACE": "llm"}) == {"container": "", "namespace": "llm", "pod": ""}


class Hanging(FakePynvml):
    """nvmlDeviceGetPowerUsage blocks once ``armed`` (a hung driver), until ``release``."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.armed = False
        self.entered, self.release = threading.Event(), threading.Event()
        self.freed = 0

    def nvmlDeviceGetPowerUsage(self, h):
        if self.armed:
            self.entered.set()
            self.release.wait(30)
        return super().nvmlDeviceGetPowerUsage(h)

    def nvmlGpmSampleFree(self, s):
        self.freed += 1

    def nvmlEventSetFree(self, es):
        self.freed += 1


def test_a_hung_nvml_call_blocks_neither_scrapes_nor_stop():
    now = [100.0]
    fake = Hanging(n_gpus=1)
    with fake_nvml(fake):
        reg, exp, logs = make(interval_s=0.05, stale_after_s=5.0, clock=lambda: now[0])
        exp.refresh()
        exp.refresh()
        fake.armed = True
        exp.start()
        thread = exp._thread
        try:
            assert fake.entered.wait(10), "the refresh thread never reached the hanging call"
            server = ex.MetricsServer("127.0.0.1", 0, reg)
            try:  # an HTTP scrape is answered from the snapshot while the thread is stuck
                status, _, body = _get(server.url)
            finally:
                server.close()
            assert status == 200 and 'DCGM_FI_DEV_GPU_UTIL{' in body
            now[0] += 6.0
            fams, _ = families(reg)
            assert all(not fams[s.name].samples for s in ex.DCGM_METRICS)
            assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
            assert samples(fams, "gpulab_exporter_sample_age_seconds")[""].value >= 6.0
            exp.stop(timeout_s=0.1)  # returns, and makes no NVML call of its own on the hung driver
            assert fake.freed == 0 and any("stuck" in line for line in logs)
        finally:
            fake.release.set()
            thread.join(10)
