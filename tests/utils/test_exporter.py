"""utils.production.exporter: the HTTP server, the CLI's one-line errors, the served page as valid text
format and OpenMetrics (utils.production.dcgm_metrics.render), and a hung NVML call that blocks neither
scrapes nor stop. The fake pynvml is tests/fake_pynvml.py."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from tests.fake_pynvml import FakePynvml, fake_nvml, families, make, samples
from utils.production import dcgm_metrics as dm
from utils.production import exporter as ex

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
    return subprocess.run([sys.executable, "-m", "utils.production.exporter", *args], capture_output=True, text=True,
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


# -- exposition formats ----------------------------------------------------------------------

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
    dcgm = {label_names[spec.name].pop() for spec in dm.DCGM_METRICS}
    assert dcgm == {frozenset(dm.LABELS)}  # one label set for every GPU metric
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
        text = dm.render(reg).decode()
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    lint = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert lint, "promtool should flag the DCGM names"
    for line in lint:  # camelCase labels (modelName, UUID, Hostname) and the bare energy counter, nothing else
        assert line.startswith("DCGM_FI_"), line
        assert "camelCase" in line or ("TOTAL_ENERGY_CONSUMPTION" in line and '"_total" suffix' in line), line


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
            assert all(not fams[s.name].samples for s in dm.DCGM_METRICS)
            assert samples(fams, "gpulab_exporter_nvml_up")[""].value == 0
            assert samples(fams, "gpulab_exporter_sample_age_seconds")[""].value >= 6.0
            exp.stop(timeout_s=0.1)  # returns, and makes no NVML call of its own on the hung driver
            assert fake.freed == 0 and any("stuck" in line for line in logs)
        finally:
            fake.release.set()
            thread.join(10)
