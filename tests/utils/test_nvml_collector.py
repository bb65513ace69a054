"""utils.production.nvml_collector (with utils.production.dcgm_metrics' names) against a fake pynvml (tests/fake_pynvml.py):
dcgm-exporter's names, types, units and labels; NVML failing mid-run, absent, or failing with
nvidia-ml-py's real error codes. Samples are taken with ``exporter.refresh()`` so no test
depends on thread timing; the staleness test moves an injected clock instead of sleeping."""
from __future__ import annotations

import math

import pynvml
import pytest

from tests.fake_pynvml import FakePynvml, RealErrors, errors_by, fake_nvml, families, gpus_with, make, samples
from utils.production import dcgm_metrics as dm
from utils.production import nvml_collector as nc

MIB = 2**20


# -- names, types, units, labels -------------------------------------------------------------

def test_dcgm_names_types_units_and_labels():
    with fake_nvml(FakePynvml(n_gpus=2)):
        reg, exp, logs = make()
        exp.refresh()
        exp.refresh()  # GPM needs two samples
        fams, text = families(reg)
    # Types exactly as dcgm-exporter's default-counters.csv / dcp-metrics-included.csv
    for spec in dm.DCGM_METRICS:
        assert f"# TYPE {spec.name} {spec.kind}\n" in text, spec.name
    assert fams["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert fams["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"
    # dcgm-exporter's bare counter name, not prometheus_client's <name>_total
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text and "CONSUMPTION_total" not in text
    g0 = {name: samples(fams, name)["0"].value for name in (s.name for s in dm.DCGM_METRICS)}
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
    assert dm.kubernetes_labels({}) == {}
    env = {"POD_NAME": "vllm-0", "POD_NAMESPACE": "llm"}
    assert dm.kubernetes_labels(env) == {"container": "", "namespace": "llm", "pod": "vllm-0"}
    with fake_nvml(FakePynvml(n_gpus=1)):
        reg, exp, _ = make(k8s_labels=dm.kubernetes_labels({**env, "CONTAINER_NAME": "vllm"}))
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
        nc.NvmlExporter(registry=None, interval_s=0)


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
    assert all(not fams[s.name].samples for s in dm.DCGM_METRICS)
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text  # the families are still described


# -- NVML's real failure modes ------------------------------------------------------------------

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
    for spec in dm.DCGM_METRICS:
        want = {"0", "1"} if spec is dm.XID else {"0"}
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
        now[0] += nc.INIT_RETRY_S
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
    assert all(not fams[s.name].samples for s in dm.DCGM_METRICS)


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
    assert dm.kubernetes_labels({"CONTAINER_NAME": "cheap-art-xkknrn"}) == {}
    assert dm.kubernetes_labels({"POD_NAMESPACE": "llm"}) == {"container": "", "namespace": "llm", "pod": ""}
