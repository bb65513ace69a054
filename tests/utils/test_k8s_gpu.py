"""utils/production/k8s_gpu.py: the course's own manifests pass; each way a GPU pod or a time-slicing config
goes wrong is refused with a message that names it; the schema layer is kubernetes-validate's
(strict), and without the package the GPU rules still run after one line saying so.
utils/device/gpu_memory.py's card total, which lab 04 divides by the engine's memory, is here too."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

from tests.fakes import FakeGpu, FakeNvml, installed
from utils.device import gpu_memory
from utils.production import dockerfile
from utils.production import k8s_gpu as K

ROOT = Path(__file__).resolve().parents[2]
DOCS = [d for f in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
IMAGE, MODEL = "gpulab-vllm:0.33.0", "Qwen/Qwen2.5-1.5B-Instruct"


def find(kind: str, name: str) -> dict:
    return copy.deepcopy(next(d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name))


def pod(gpus=1, port=8000, **container) -> dict:
    args = [MODEL, f"--port={port}"] + ([f"--tensor-parallel-size={gpus}"] if gpus > 1 else [])
    c = {"name": "vllm", "image": IMAGE, "args": args, "ports": [{"name": "http", "containerPort": port}],
         "resources": {"limits": {K.GPU: gpus}}, **container}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "v"}, "spec": {"containers": [c]}}


def sliced(replicas=4, plugin=None) -> dict:
    plugin = plugin or {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": K.GPU, "replicas": replicas}]}}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ts", "namespace": "gpu-operator"},
            "data": {"any": yaml.safe_dump(plugin)}}


@pytest.fixture()
def no_validator(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)  # import raises ImportError


# -- the course's own files --------------------------------------------------------------------

def test_the_course_manifests_pass():
    notes = K.validate_vllm_pod(find("Deployment", "vllm"), image=IMAGE, model=MODEL, gpus=1, port=8000)
    assert notes[-1].startswith("runs vllm serve") and any("GPUs: 1" in n for n in notes)
    K.validate_gpu_workload(find("Job", "gpulab-grade"), 1)
    assert K.validate_time_slicing(find("ConfigMap", "time-slicing-config"))[-1].endswith(f"as 4 {K.GPU}")
    assert K.time_slicing_replicas(find("ConfigMap", "time-slicing-config")) == {K.GPU: 4}


def test_serve_entrypoint_is_the_dockerfiles():
    serve = dockerfile.stages(dockerfile.parse((ROOT / "deploy" / "Dockerfile").read_text()))["serve"]
    (entry,) = [i for i in serve if i.keyword == "ENTRYPOINT"]
    assert tuple(dockerfile.exec_form(entry.value)) == K.SERVE_ENTRYPOINT


def test_the_version_is_the_newest_the_deploy_tests_use():
    text = (ROOT / "tests" / "integration" / "test_deploy.py").read_text()
    assert f'"{K.K8S_VERSION}"]' in text


# -- the GPU request -----------------------------------------------------------------------------

@pytest.mark.parametrize("resources, match", [
    ({"requests": {K.GPU: 1}}, "requests only"),
    ({"limits": {K.GPU: "1"}}, r"is '1' \(str\)"),
    ({"limits": {K.GPU: 1.0}}, r"\(float\)"),
    ({"limits": {K.GPU: True}}, r"\(bool\)"),
    ({"limits": {K.GPU: 0}}, "0 GPUs"),
    ({"limits": {K.GPU: 1}, "requests": {K.GPU: 2}}, "must equal its limit"),
    ({"limits": {"cpu": "2"}}, "no container asks"),
])
def test_gpu_request_rules(resources, match, no_validator):
    doc = pod()
    doc["spec"]["containers"][0]["resources"] = resources
    with pytest.raises(K.ManifestError, match=match):
        K.validate_gpu_workload(doc)


def test_requests_equal_to_limits_pass_and_the_count_must_match():
    doc = pod()
    doc["spec"]["containers"][0]["resources"]["requests"] = {K.GPU: 1, "cpu": "4"}
    assert K.validate_gpu_workload(doc, 1)
    with pytest.raises(K.ManifestError, match=r"asks for 1 GPU\(s\) in all, expected 2"):
        K.validate_gpu_workload(doc, 2)
    doc["spec"]["initContainers"] = [{"name": "prep", "image": "x", "resources": {"requests": {K.GPU: 1}}}]
    with pytest.raises(K.ManifestError, match="container prep"):
        K.validate_gpu_workload(doc)


# -- the vLLM server ----------------------------------------------------------------------------

def test_other_forms_of_the_same_server_pass():
    doc = pod(2, 8080)
    c = doc["spec"]["containers"][0]
    c["command"] = ["vllm", "serve"]
    c["args"] = ["--model", MODEL, "--port", "8080", "-tp", "2"]
    c["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}}
    assert K.validate_vllm_pod(doc, image=IMAGE, model=MODEL, gpus=2, port=8080)
    dep = find("Deployment", "vllm")  # a Deployment is a workload too
    assert K.validate_vllm_pod(dep, image=IMAGE, model=MODEL, gpus=1, port=8000)


@pytest.mark.parametrize("change, match", [
    ({"args": [MODEL, "--port=8000"]}, "tensor-parallel-size is unset"),  # 2 GPUs, vLLM told nothing
    ({"args": ["other/model", "--port=8000", "--tensor-parallel-size=2"]}, "model is 'other/model'"),
    ({"args": [MODEL, "--tensor-parallel-size=2"]}, "--port is None"),
    ({"args": None}, "the image's CMD runs"),
    ({"command": ["python", "-m", "server"]}, "not `vllm serve`"),
    ({"image": "other:1"}, "one container with image"),
    ({"ports": []}, "containerPort 8000"),
    ({"livenessProbe": {"httpGet": {"path": "/health", "port": 9999}}}, "livenessProbe asks port 9999"),
])
def test_server_mistakes_are_named(change, match, no_validator):
    doc = pod(2)
    doc["spec"]["containers"][0].update(change)
    if change.get("args") is None and "args" in change:
        del doc["spec"]["containers"][0]["args"]
    with pytest.raises(K.ManifestError, match=match):
        K.validate_vllm_pod(doc, image=IMAGE, model=MODEL, gpus=2, port=8000)


def test_flag_reads_both_forms_and_the_last_wins():
    assert K.flag(["--port", "1", "--port=2"], "--port") == "2"
    assert K.flag(["-tp", "4"], "--tensor-parallel-size", "-tp") == "4"
    assert K.flag(["--port"], "--port") is None


# -- the schema layer ----------------------------------------------------------------------------

def test_schema_errors_name_the_field():
    pytest.importorskip("kubernetes_validate")
    doc = pod()
    doc["spec"]["containers"][0]["resource"] = doc["spec"]["containers"][0].pop("resources")  # a typo
    with pytest.raises(K.ManifestError, match=r"fails Kubernetes 1\.37's schema at spec\.containers\[0\]: .*'resource'"):
        K.schema_check(doc)
    with pytest.raises(K.ManifestError, match="no kind 'Pod' in apiVersion 'v2'"):
        K.schema_check({**pod(), "apiVersion": "v2"})
    bad = sliced()
    bad["data"]["any"] = {"version": "v1"}  # the config as a dict: the schema wants text
    with pytest.raises(K.ManifestError, match=r"at data\.any"):
        K.schema_check(bad)
    assert K.schema_check(pod(), "1.99.0").startswith("schema: Kubernetes 1.")  # newer than it knows: its newest


def test_without_kubernetes_validate_one_line_and_the_rules_still_run(no_validator):
    assert K.schema_check(pod()) == K.NO_VALIDATOR and "\n" not in K.NO_VALIDATOR
    assert K.validate_gpu_workload(pod())[0] == K.NO_VALIDATOR
    doc = pod()
    doc["spec"]["containers"][0]["resources"] = {"limits": {K.GPU: "1"}}
    with pytest.raises(K.ManifestError, match="as an int"):
        K.validate_gpu_workload(doc)
    with pytest.raises(K.ManifestError, match="needs apiVersion"):
        K.schema_check({"kind": "Pod"})


# -- time-slicing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("plugin, match", [
    ({"version": "v1", "timeSlicing": {"resources": [{"name": K.GPU, "replicas": 4}]}}, r"no 'sharing'.*timeSlicing"),
    ({"version": "v1", "sharing": {"resources": [{"name": K.GPU, "replicas": 4}]}}, r"no 'timeSlicing'.*resources"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": {"name": K.GPU, "replicas": 4}}}}, "is a list"),
    ({"sharing": {"timeSlicing": {"resources": [{"name": K.GPU, "replicas": 4}]}}}, "version: v1"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": K.GPU, "replicas": 1}]}}}, "at least 2"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": K.GPU, "replicas": "4"}]}}}, "an int"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}}, "resource name"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": K.GPU, "count": 4}]}}}, "each resource is"),
    ({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": "no",
                                                   "resources": [{"name": K.GPU, "replicas": 4}]}}}, "true or false"),
])
def test_time_slicing_mistakes_are_named(plugin, match, no_validator):
    with pytest.raises(K.ManifestError, match=match):
        K.validate_time_slicing(sliced(plugin=plugin))


def test_time_slicing_replicas_and_the_configmap_itself(no_validator):
    assert K.validate_time_slicing(sliced(3), 3)
    with pytest.raises(K.ManifestError, match="advertised 3 times per GPU, expected 5"):
        K.validate_time_slicing(sliced(3), 5)
    bad = sliced()
    bad["data"]["any"] = {"version": "v1"}
    with pytest.raises(K.ManifestError, match="YAML text"):
        K.validate_time_slicing(bad)
    with pytest.raises(K.ManifestError, match="ConfigMap manifest"):
        K.validate_time_slicing({**sliced(), "kind": "Secret"})
    mig = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}}}
    with pytest.raises(K.ManifestError, match="no time-slicing entry for nvidia.com/gpu"):
        K.validate_time_slicing(sliced(plugin=mig))


def test_replicas_that_fit():
    assert K.replicas_that_fit(140.4, 64.0) == 2
    assert K.replicas_that_fit(140.4, 3.1) == 45
    assert K.replicas_that_fit(15.0, 20.0) == 0
    for bad in ((0, 1), (1, 0), (float("nan"), 1), (1, float("inf"))):
        with pytest.raises(ValueError):
            K.replicas_that_fit(*bad)


# -- the card's memory (utils/device/gpu_memory.py) -------------------------------------------------------

def test_gpu_total_gib_reads_the_visible_card(monkeypatch):
    import utils.course.env

    monkeypatch.setattr(utils.course.env, "smoke_mode", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with installed(FakeNvml([FakeGpu(mem_total_bytes=80 * 2**30), FakeGpu(mem_total_bytes=141 * 10**9)])):
        assert gpu_memory.gpu_total_gib() == pytest.approx(141e9 / 2**30)
    with installed(FakeNvml(init_error="Driver Not Loaded")):
        assert gpu_memory.gpu_total_gib() is None
    monkeypatch.setattr(utils.course.env, "smoke_mode", lambda: True)
    with installed(FakeNvml([FakeGpu()])):
        assert gpu_memory.gpu_total_gib() is None
