"""Kubernetes manifests that use NVIDIA GPUs, checked: a pod that asks for GPUs the way
Kubernetes and NVIDIA's device plugin expect, and the device plugin's time-slicing config.

Two layers. The schema: kubernetes-validate (the validator ``tests/integration/test_deploy.py``
runs on ``deploy/k8s/``) checks a manifest against Kubernetes' own OpenAPI schema for
:data:`K8S_VERSION`, strictly, so an unknown field (``resource`` for ``resources``) fails.
Without the package :func:`schema_check` says so in one line and the rules below still run.
The rules no schema holds (the schema takes ``nvidia.com/gpu: 1.5`` or ``"1"``):

- A GPU is an extended resource: it goes in ``resources.limits``; a request, if given, must
  equal the limit; a request without a limit is refused
  (https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/). Kubernetes takes extended
  resources in whole units only
  (https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#extended-resources);
  the course asks for a Python ``int``, so that a count compares as a number.
- A container's ``command`` replaces its image's ENTRYPOINT and ``args`` its CMD
  (https://kubernetes.io/docs/tasks/inject-data-application/define-command-argument-container/):
  on the course's serve image (``deploy/Dockerfile``, ENTRYPOINT ``vllm serve``) the args must
  name the model and the port again. More than one GPU is used by vLLM only with
  ``--tensor-parallel-size`` (``-tp``) set to that number.
- The device plugin's time-slicing config: ``version: v1``, and under ``sharing.timeSlicing.resources``
  a list of ``{name, replicas}``: each GPU of that resource is advertised ``replicas`` times
  (NVIDIA/k8s-device-plugin, docs/customizing.md, "Shared Access to GPUs with CUDA
  Time-Slicing"). The GPU Operator reads it from a ConfigMap whose ``data`` values are that
  YAML as text (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/gpu-sharing.html).
"""
from __future__ import annotations

import math
from typing import Any

K8S_VERSION = "1.37.0"  # the newest version tests/integration/test_deploy.py validates deploy/k8s/ against
GPU = "nvidia.com/gpu"
SERVE_ENTRYPOINT = ("vllm", "serve")  # deploy/Dockerfile, stage serve (tests/utils/test_k8s_gpu.py reads it)
MIN_REPLICAS = 2  # one replica is the GPU unshared
POD_SPEC = {"Pod": ("spec",), "Deployment": ("spec", "template", "spec"), "StatefulSet": ("spec", "template", "spec"),
            "DaemonSet": ("spec", "template", "spec"), "ReplicaSet": ("spec", "template", "spec"),
            "Job": ("spec", "template", "spec"), "CronJob": ("spec", "jobTemplate", "spec", "template", "spec")}
NO_VALIDATOR = ("kubernetes-validate is not installed, so the Kubernetes schema was not checked "
                "(pip install kubernetes-validate); the GPU rules were")
RESOURCE_KEYS = {"name", "replicas", "rename", "devices"}  # a time-slicing resource entry's fields


class ManifestError(ValueError):
    """A manifest Kubernetes or the device plugin would refuse or misread; the message says where."""


def _where(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f"[{p!r}]" if "." in str(p) or "/" in str(p) else f".{p}")
    return out.lstrip(".") or "the top level"


def schema_check(doc: Any, version: str = K8S_VERSION) -> str:
    """Validate ``doc`` strictly against Kubernetes' schema; returns one line saying what was
    checked (or that kubernetes-validate is absent). ManifestError naming the field otherwise."""
    if not isinstance(doc, dict):
        raise ManifestError(f"a manifest is a dict, not {type(doc).__name__}")
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str):
            raise ManifestError(f"the manifest needs {key} (a string), e.g. apiVersion 'v1' and kind 'Pod'")
    try:
        import kubernetes_validate as kv
        from kubernetes_validate import utils as kv_utils
    except ImportError:
        return NO_VALIDATOR
    try:
        try:
            checked = kv.validate(doc, version, strict=True)
        except kv_utils.VersionNotSupportedError:  # an older kubernetes-validate: its newest schema
            checked = kv.validate(doc, kv.latest_version(), strict=True)
    except kv.ValidationError as exc:
        raise ManifestError(f"{doc['kind']} fails Kubernetes {exc.version}'s schema at {_where(exc.absolute_path)}: "
                            f"{exc.message}") from None
    except kv_utils.SchemaNotFoundError:
        raise ManifestError(f"Kubernetes has no kind {doc['kind']!r} in apiVersion {doc['apiVersion']!r} "
                            "(a Pod is apiVersion 'v1', a Deployment 'apps/v1')") from None
    return f"schema: Kubernetes {checked}, strict (kubernetes-validate {kv.__version__})"


def pod_spec(doc: dict) -> dict:
    """The pod spec of a workload manifest (``spec`` of a Pod, ``spec.template.spec`` of a Deployment...)."""
    path = POD_SPEC.get(doc.get("kind"))
    if path is None:
        raise ManifestError(f"a {doc.get('kind')!r} runs no containers; use one of {', '.join(POD_SPEC)}")
    spec: Any = doc
    for key in path:
        spec = spec.get(key) if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise ManifestError(f"a {doc['kind']} needs {'.'.join(path)}.containers, a list of containers")
    return spec


def gpu_count(container: dict, resource: str = GPU) -> int:
    """The GPUs ``container`` asks for (0 for none), after the rules of an extended resource."""
    name = container.get("name", "?")
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    if resource in requests and resource not in limits:
        raise ManifestError(f"container {name}: {resource} is in resources.requests only; a GPU goes in "
                            "resources.limits (Kubernetes then takes the limit as the request)")
    if resource not in limits:
        return 0
    n = limits[resource]
    if isinstance(n, bool) or not isinstance(n, int):
        raise ManifestError(f"container {name}: resources.limits[{resource!r}] is {n!r} ({type(n).__name__}); "
                            "give the number of GPUs as an int")
    if n < 1:
        raise ManifestError(f"container {name}: {n} GPUs; leave {resource} out for none")
    if resource in requests and requests[resource] != n:
        raise ManifestError(f"container {name}: resources.requests[{resource!r}] is {requests[resource]!r} but the "
                            f"limit is {n!r}; a GPU's request must equal its limit (or be left out)")
    return n


def validate_gpu_workload(doc: Any, gpus: int | None = None, version: str = K8S_VERSION) -> list[str]:
    """Schema, then every container's GPU rules (init containers too); the app containers'
    GPUs together must be ``gpus`` when given. Returns what was checked, a line each."""
    notes = [schema_check(doc, version)]
    spec = pod_spec(doc)
    for c in spec.get("initContainers") or []:
        gpu_count(c)
    total = sum(gpu_count(c) for c in spec["containers"])
    if total == 0:
        raise ManifestError(f"no container asks for {GPU} in resources.limits")
    if gpus is not None and total != gpus:
        raise ManifestError(f"the pod asks for {total} GPU(s) in all, expected {gpus}")
    notes.append(f"GPUs: {total} {GPU} in limits, requests equal or absent")
    return notes


def flag(argv: list[str], *names: str) -> str | None:
    """The value of the last ``--name value`` or ``--name=value`` in ``argv`` (None if absent)."""
    found = None
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif word.startswith(name + "="):
                found = word.split("=", 1)[1]
    return found


def container_argv(container: dict, entrypoint: tuple[str, ...] = SERVE_ENTRYPOINT) -> list[str]:
    """What the container runs: its ``command`` (else the image's ENTRYPOINT) and its ``args``."""
    command, args = container.get("command"), container.get("args")
    if args is None and command is None:
        raise ManifestError(f"container {container.get('name', '?')}: no args, so the image's CMD runs with its own "
                            "model and port; give args")
    argv = list(entrypoint if command is None else command) + list(args or [])
    if not all(isinstance(a, str) for a in argv):
        raise ManifestError(f"command and args are lists of strings: {argv!r}")
    return argv


def validate_vllm_pod(doc: Any, *, image: str, model: str, gpus: int, port: int,
                      version: str = K8S_VERSION) -> list[str]:
    """A workload that runs ``vllm serve model`` from ``image`` on ``port`` with ``gpus`` GPUs
    (tensor parallel over all of them), its GPU request by the rules above."""
    notes = validate_gpu_workload(doc, gpus, version)
    containers = pod_spec(doc)["containers"]
    mine = [c for c in containers if c.get("image") == image]
    if len(mine) != 1:
        raise ManifestError(f"expected one container with image {image!r}; the images are "
                            f"{[c.get('image') for c in containers]}")
    c = mine[0]
    argv = container_argv(c)
    if tuple(argv[:2]) != SERVE_ENTRYPOINT:
        raise ManifestError(f"the container runs {' '.join(argv[:3])!r}, not `vllm serve` (the image's ENTRYPOINT)")
    rest = argv[2:]
    served = flag(rest, "--model") or (rest[0] if rest and not rest[0].startswith("-") else None)
    if served != model:
        raise ManifestError(f"the server's model is {served!r}, expected {model!r} (the first argument after `vllm serve`)")
    if flag(rest, "--port") != str(port):
        raise ManifestError(f"the server's --port is {flag(rest, '--port')!r}, expected {port}")
    tp = flag(rest, "--tensor-parallel-size", "-tp")
    if (tp or "1") != str(gpus):
        raise ManifestError(f"{gpus} GPU(s) in limits but --tensor-parallel-size is {tp or 'unset (1)'}: vLLM "
                            "shards the model over exactly that many GPUs, so it must equal the count")
    ports = [p for p in c.get("ports") or [] if isinstance(p, dict)]
    if not any(p.get("containerPort") == port for p in ports):
        raise ManifestError(f"no ports entry with containerPort {port}: a Service needs it to reach the server")
    names = {p.get("name") for p in ports if p.get("containerPort") == port} - {None}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        target = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
        if target is not None and target != port and target not in names:
            raise ManifestError(f"{probe} asks port {target!r}; the server listens on {port}")
    notes.append(f"runs vllm serve {model} on port {port}, tensor parallel over {gpus}")
    return notes


def time_slicing_replicas(doc: Any) -> dict[str, int]:
    """``{resource: replicas}`` of a device-plugin ConfigMap, every config in its ``data`` read
    (ManifestError on a structure the plugin would not read)."""
    import yaml

    if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap":
        raise ManifestError("the time-slicing config is a ConfigMap manifest (kind 'ConfigMap')")
    data = doc.get("data")
    if not isinstance(data, dict) or not data:
        raise ManifestError("the ConfigMap's data is empty: put the plugin's config under a key of data")
    out: dict[str, int] = {}
    for key, text in data.items():
        if not isinstance(text, str):
            raise ManifestError(f"data[{key!r}] is a {type(text).__name__}; the plugin reads YAML text (yaml.safe_dump it)")
        cfg = yaml.safe_load(text)
        if not isinstance(cfg, dict) or cfg.get("version") != "v1":
            raise ManifestError(f"data[{key!r}] must be a config with version: v1 at its top")
        node = cfg
        for step in ("sharing", "timeSlicing", "resources"):
            nxt = node.get(step) if isinstance(node, dict) else None
            if nxt is None:
                have = sorted(node) if isinstance(node, dict) else type(node).__name__
                raise ManifestError(f"data[{key!r}]: the plugin reads sharing.timeSlicing.resources; no {step!r} "
                                    f"where it should be (found {have})")
            node = nxt
        if not isinstance(node, list) or not node:
            raise ManifestError(f"data[{key!r}]: sharing.timeSlicing.resources is a list of {{name, replicas}}")
        for flag_name in ("renameByDefault", "failRequestsGreaterThanOne"):
            value = cfg["sharing"]["timeSlicing"].get(flag_name)
            if value is not None and not isinstance(value, bool):
                raise ManifestError(f"data[{key!r}]: {flag_name} is true or false, not {value!r}")
        for entry in node:
            if not isinstance(entry, dict) or set(entry) - RESOURCE_KEYS or "name" not in entry:
                raise ManifestError(f"data[{key!r}]: each resource is {{name, replicas}}, got {entry!r}")
            name, n = entry["name"], entry.get("replicas")
            if not isinstance(name, str) or not name.startswith("nvidia.com/"):
                raise ManifestError(f"data[{key!r}]: resource name {name!r}; the plugin shares nvidia.com/gpu "
                                    "(and, with MIG strategy mixed, nvidia.com/mig-<profile>)")
            if isinstance(n, bool) or not isinstance(n, int) or n < MIN_REPLICAS:
                raise ManifestError(f"data[{key!r}]: {name} replicas {n!r}; an int of at least {MIN_REPLICAS} "
                                    "(1 shares nothing)")
            out[name] = n
    return out


def validate_time_slicing(doc: Any, replicas: int | None = None, version: str = K8S_VERSION) -> list[str]:
    """Schema, then the device plugin's structure; every GPU advertised ``replicas`` times when given."""
    notes = [schema_check(doc, version)]
    got = time_slicing_replicas(doc)
    if GPU not in got:
        raise ManifestError(f"no time-slicing entry for {GPU}: {sorted(got)}")
    if replicas is not None and got[GPU] != replicas:
        raise ManifestError(f"{GPU} is advertised {got[GPU]} times per GPU, expected {replicas}")
    notes.append(f"device plugin: each GPU advertised as {got[GPU]} {GPU}")
    return notes


def replicas_that_fit(card_gib: float, engine_gib: float) -> int:
    """How many engines of ``engine_gib`` fit in a card of ``card_gib``: time-slicing isolates no
    memory, so more replicas than this would run out of it."""
    if not (card_gib > 0 and engine_gib > 0 and math.isfinite(card_gib) and math.isfinite(engine_gib)):
        raise ValueError(f"card and engine memory must be positive, got {card_gib!r} and {engine_gib!r}")
    return math.floor(card_gib / engine_gib)
