"""Lab 04's Kubernetes cells, ``test_gpu_pod`` and ``test_time_slicing``, through the grader's own
code: the reference answers pass the visible and the hidden part as nbgrader runs them; the
release's unanswered cells fail both; and the wrong answers learners give fail the hidden part
with a message that names the mistake (GPUs in requests only, a string count, a request that
differs from the limit, vLLM not told about the GPUs, a time-slicing config nested wrong), the
ones written to pass the visible test included: a manifest hard-coded for the notebook's own
arguments. Nothing is measured; a few seconds on two cores."""
from __future__ import annotations

import copy
import json
import re
import types
from pathlib import Path

import pytest
import yaml

from tests.nbcells import cell, points, src

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "04_benchmarking_production"
SOURCE = ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS\n?", re.S)
CONTEXT = ("k8s_docs", "pod_context", "replicas")  # the locked cells the answers and tests read
NEW_POINTS = {"test_gpu_pod": 2, "test_time_slicing": 1}


def namespace(nb: dict, answers: tuple[str, ...]) -> dict:
    """The notebook's context cells and ``answers`` run in order, as in the kernel (smoke mode:
    no engine memory measured, so REPLICAS comes from deploy/k8s/time-slicing.yaml)."""
    from grader import checks
    from utils import env, gpu_memory, k8s_gpu

    ns = {"checks": checks, "env": env, "yaml": yaml, "k8s_gpu": k8s_gpu, "gpu_memory": gpu_memory,
          "mem_engine": None, "server": types.SimpleNamespace(label="engine")}
    for c in nb["cells"]:
        gid = c["metadata"]["nbgrader"]["grade_id"]
        if gid in CONTEXT + answers:
            try:
                exec(compile(src(c), gid, "exec"), ns)  # noqa: S102 (the course's own cells)
            except NotImplementedError:
                assert gid in answers  # the release's answer cell: its function is defined, its print raises
    return ns


def run(grade_id: str, part: str, ns: dict) -> None:
    """The visible or hidden part of a test cell of the source notebook, in ``ns``."""
    text = src(cell(json.loads(SOURCE.read_text()), grade_id))
    hidden = HIDDEN.search(text)
    assert hidden, grade_id
    exec(compile(HIDDEN.sub("", text) if part == "visible" else hidden.group(1), f"{grade_id} ({part})", "exec"),  # noqa: S102
         dict(ns))


@pytest.fixture(scope="module")
def ref() -> dict:
    return namespace(json.loads(SOURCE.read_text()), ("gpu_pod_answer", "time_slicing_answer"))


@pytest.fixture(scope="module")
def p4():
    import grader

    return grader.phase(4)


def test_the_cells_are_released_with_their_points():
    assert {k: v for k, v in points(json.loads(RELEASE.read_text())).items() if k in NEW_POINTS} == NEW_POINTS


@pytest.mark.parametrize("grade_id", sorted(NEW_POINTS))
def test_reference_answers_pass_both_parts(phase, ref, grade_id, capsys):
    phase(4)  # the grading environment of a hidden test: no submitted record
    for part in ("visible", "hidden"):
        run(grade_id, part, ref)
    out = capsys.readouterr().out
    assert "schema: Kubernetes 1." in out or "kubernetes-validate is not installed" in out


@pytest.mark.parametrize("grade_id, name", [("test_gpu_pod", "gpu_pod"), ("test_time_slicing", "time_slicing_config")])
def test_the_release_fails_both_parts(phase, grade_id, name):
    phase(4)
    rel = namespace(json.loads(RELEASE.read_text()), ("gpu_pod_answer", "time_slicing_answer"))
    with pytest.raises(NotImplementedError):
        run(grade_id, "visible", rel)
    with pytest.raises(AssertionError, match=rf"{name}\(.*\) raised NotImplementedError"):
        run(grade_id, "hidden", rel)


# -- wrong pods ----------------------------------------------------------------------------------

def _container(doc: dict) -> dict:
    return doc["spec"]["containers"][0]


def requests_only(gpu_pod, ns=None):
    def wrong(image, model, gpus, port):
        doc = gpu_pod(image, model, gpus, port)
        res = _container(doc)["resources"]
        res["requests"] = res.pop("limits")
        return doc
    return wrong


def string_count(gpu_pod, ns=None):
    def wrong(image, model, gpus, port):
        doc = gpu_pod(image, model, gpus, port)
        _container(doc)["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
        return doc
    return wrong


def request_of_one(gpu_pod, ns=None):  # right for one GPU, so the visible test passes
    def wrong(image, model, gpus, port):
        doc = gpu_pod(image, model, gpus, port)
        _container(doc)["resources"]["requests"] = {"nvidia.com/gpu": 1}
        return doc
    return wrong


def no_tensor_parallel(gpu_pod, ns=None):
    def wrong(image, model, gpus, port):
        doc = gpu_pod(image, model, gpus, port)
        c = _container(doc)
        c["args"] = [a for a in c["args"] if not a.startswith("--tensor-parallel-size")]
        return doc
    return wrong


def hard_coded(gpu_pod, ns):
    fixed = gpu_pod(ns["SERVE_IMAGE"], ns["SERVE_MODEL"], 1, ns["SERVE_PORT"])  # the notebook's own arguments

    def wrong(image, model, gpus, port):
        return copy.deepcopy(fixed)
    return wrong


def own_image_model_and_port(gpu_pod, ns):  # only the GPU count follows the arguments
    def wrong(image, model, gpus, port):
        return gpu_pod(ns["SERVE_IMAGE"], ns["SERVE_MODEL"], gpus, ns["SERVE_PORT"])
    return wrong


@pytest.mark.parametrize("make, passes_visible, match", [
    (requests_only, False, r"nvidia.com/gpu is in resources.requests only"),
    (string_count, False, r"resources.limits\['nvidia.com/gpu'\] is '1' \(str\)"),
    (request_of_one, True, r"gpu_pod\('registry.example.com/team/gpulab-vllm:0.33.0', .*, 2, 8080\): .*requests\['nvidia"
                           r".com/gpu'\] is 1 but the limit is 2"),
    (no_tensor_parallel, True, r"2 GPU\(s\) in limits but --tensor-parallel-size is unset"),
    (hard_coded, True, r"gpu_pod\('registry.example.com/team/gpulab-vllm:0.33.0'.*: the pod asks for 1 GPU\(s\) in all, "
                       r"expected 2"),
    (own_image_model_and_port, True, r"expected one container with image 'registry.example.com/team/gpulab-vllm:0.33.0'"),
])
def test_wrong_pods_fail_the_hidden_test(ref, p4, make, passes_visible, match):
    wrong = make(ref["gpu_pod"], ref)
    ns = {**ref, "gpu_pod": wrong}
    if passes_visible:
        run("test_gpu_pod", "visible", ns)
    else:
        with pytest.raises(Exception):  # noqa: B017 (ManifestError, which the cell shows as it is)
            run("test_gpu_pod", "visible", ns)
    with pytest.raises(AssertionError, match=match):
        p4.containers.check_gpu_pod(wrong)


def test_a_hard_coded_pod_fails_the_hidden_part_as_nbgrader_runs_it(phase, ref):
    phase(4)
    with pytest.raises(AssertionError, match=r"2, 8080\): the pod asks for 1 GPU\(s\) in all, expected 2"):
        run("test_gpu_pod", "hidden", {**ref, "gpu_pod": hard_coded(ref["gpu_pod"], ref)})


# -- wrong time-slicing configs -------------------------------------------------------------------

def _configmap(plugin: dict | str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ts", "namespace": "gpu-operator"},
            "data": {"any": plugin if isinstance(plugin, str) else yaml.safe_dump(plugin)}}


def flat_nesting(replicas):  # timeSlicing at the top, as if sharing were implied
    return _configmap({"version": "v1", "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}})


def resources_under_sharing(replicas):
    return _configmap({"version": "v1", "sharing": {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}})


def replicas_as_text(replicas):
    return _configmap({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": str(replicas)}]}}})


def config_as_a_dict(replicas):
    doc = _configmap("")
    doc["data"]["any"] = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}
    return doc


def always_four(replicas):  # deploy/k8s/time-slicing.yaml's number, which smoke mode's REPLICAS is
    return _configmap({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}})


@pytest.mark.parametrize("wrong, passes_visible, match", [
    (flat_nesting, False, r"time_slicing_config\(2\): .*no 'sharing' where it should be \(found \['timeSlicing', 'version'\]\)"),
    (resources_under_sharing, False, r"no 'timeSlicing' where it should be \(found \['resources'\]\)"),
    (replicas_as_text, False, r"replicas '2'; an int"),
    (config_as_a_dict, False, r"time_slicing_config\(2\): .*(not of type 'string'|YAML text)"),
    (always_four, True, r"time_slicing_config\(2\): nvidia.com/gpu is advertised 4 times per GPU, expected 2"),
])
def test_wrong_time_slicing_configs_fail_the_hidden_test(ref, p4, wrong, passes_visible, match):
    assert ref["REPLICAS"] == 4  # smoke mode: the replicas of deploy/k8s/time-slicing.yaml
    ns = {**ref, "time_slicing_config": wrong}
    if passes_visible:
        run("test_time_slicing", "visible", ns)
    else:
        with pytest.raises(Exception):  # noqa: B017
            run("test_time_slicing", "visible", ns)
    with pytest.raises(AssertionError, match=match):
        p4.containers.check_time_slicing(wrong)


def test_a_patched_validator_is_caught(ref, p4, monkeypatch):
    from utils import k8s_gpu

    monkeypatch.setattr(k8s_gpu, "validate_vllm_pod", lambda *a, **k: ["fine"])
    with pytest.raises(AssertionError, match="validate_vllm_pod"):
        p4.containers.check_gpu_pod(requests_only(ref["gpu_pod"]))
