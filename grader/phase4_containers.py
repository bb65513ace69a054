"""Phase 4's checks on the Kubernetes exercises of section 7: the learner's ``gpu_pod`` and
``time_slicing_config`` called with arguments the notebook does not show, each result checked
by :mod:`utils.k8s_gpu` (Kubernetes' schema through kubernetes-validate, then the GPU rules a
schema cannot hold), so a manifest written for the notebook's own arguments fails.

Pure and exact: nothing is measured. ``utils.k8s_gpu`` is checked untampered first (a notebook
that rebound its validators would grade itself). :func:`grader.phase` loads this module afresh
beside phase 4's with its fresh ``checks`` (``EXTRA_MODULES`` in ``grader/__init__.py``), so the
hidden tests call it as ``grader.phase(4).containers.check_gpu_pod``.
"""
from __future__ import annotations

import json
from typing import Any

from grader import checks  # grader.phase(4) rebinds it to its fresh copy: use it at call time only

VALIDATOR = ("utils.k8s_gpu",)
# (image, model, GPUs, port): registries, models, GPU counts and ports the notebook does not use
POD_CASES = (
    ("gpulab-vllm:0.33.0", "Qwen/Qwen2.5-1.5B-Instruct", 1, 8000),
    ("registry.example.com/team/gpulab-vllm:0.33.0", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", 2, 8080),
    ("gpulab-vllm:0.33.0", "meta-llama/Llama-3.1-8B-Instruct", 4, 9000),
)
REPLICA_CASES = (2, 3, 7, 10)


def _manifest(got: Any, call: str) -> dict:
    """``got`` as the API server would receive it (JSON), or AssertionError naming ``call``."""
    try:
        return json.loads(json.dumps(got))
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"{call} returned something that is not a manifest (plain dicts, lists, str, int, "
                             f"bool): {exc}") from None


def _validated(call: str, fn, *args, **kwargs) -> list[str]:
    from utils import k8s_gpu

    try:
        return fn(*args, **kwargs)
    except k8s_gpu.ManifestError as exc:
        raise AssertionError(f"{call}: {exc}") from None


def check_gpu_pod(gpu_pod) -> None:
    """``gpu_pod(image, model, gpus, port)`` on :data:`POD_CASES`: each manifest valid, its GPUs in
    limits as an int, requests equal or absent, ``vllm serve model --port port`` tensor parallel
    over the GPUs, and a containerPort for it."""
    from utils import k8s_gpu

    checks.assert_untampered(VALIDATOR)
    notes: list[str] = []
    for image, model, gpus, port in POD_CASES:
        call = f"gpu_pod({image!r}, {model!r}, {gpus}, {port})"
        doc = _manifest(checks.call(gpu_pod, image, model, gpus, port, name="gpu_pod"), call)
        notes = _validated(call, k8s_gpu.validate_vllm_pod, doc, image=image, model=model, gpus=gpus, port=port)
    checks.say(f"gpu_pod: {len(POD_CASES)} manifests (1 to 4 GPUs, other images, models and ports) pass; "
               + "; ".join(notes[:1]))


def check_time_slicing(time_slicing_config) -> None:
    """``time_slicing_config(replicas)`` on :data:`REPLICA_CASES`: a valid ConfigMap whose config
    the device plugin reads as each GPU advertised ``replicas`` times."""
    from utils import k8s_gpu

    checks.assert_untampered(VALIDATOR)
    notes: list[str] = []
    for n in REPLICA_CASES:
        call = f"time_slicing_config({n})"
        doc = _manifest(checks.call(time_slicing_config, n, name="time_slicing_config"), call)
        notes = _validated(call, k8s_gpu.validate_time_slicing, doc, n)
    checks.say(f"time_slicing_config: replicas {', '.join(map(str, REPLICA_CASES))} each read back; "
               + "; ".join(notes[:1]))
