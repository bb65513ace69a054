"""Measurement records (``gpulab.record/2``) built in code for the portfolio's tests, without
running a notebook: a value of every answer a lab declares (``grader/labs/<lab>/answers.py``),
made from its spec, put into a namespace the way a notebook defines it, and written by the
notebook's own ``grader.answers.save_record`` with this machine's fingerprint replaced by the one
the test names (an H200's, or a CPU's in smoke mode)."""
from __future__ import annotations

import ast
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from grader import answers as record_answers
from grader import labs
from grader.schema import AnswerError, Count, DictOf, Fields, Flag, Label, ListOf, Nullable, Number, Text, TupleOf

H200 = {"kind": "gpu", "name": "NVIDIA H200", "compute_capability": "9.0", "cpu_threads": 16, "cuda": "13.0",
        "cudnn": 91900, "device_count": 1, "device_index": 0, "driver": "580.159.04", "mem_clock_max_mhz": 3201,
        "mem_clock_mhz": 3201, "memory_gib": 139.8, "mig_mode": 0, "nvml": True, "power_limit_w": 700.0,
        "python": "3.12.3", "sm_clock_max_mhz": 1980, "sm_clock_mhz": 1980, "sm_count": 132, "throttle_reasons": [],
        "torch": "2.11.0+cu130", "uuid": "GPU-d7b061ee-9d0e-a0c0-6f60-dfc34eb69605",
        "platform": "Linux-6.18.44-x86_64-with-glibc2.39"}
LAPTOP = {"kind": "cpu", "name": "Intel(R) Core(TM) i7-1185G7", "platform": "Linux-6.8-x86_64", "python": "3.11.7",
          "torch": "2.13.0+cpu", "cuda": None, "cpu_threads": 8}


def sample(spec: Any, rng: random.Random, name: str = "") -> Any:
    """A value of ``spec``, as a notebook could hold it."""
    if isinstance(spec, Nullable):
        return sample(spec.inner, rng, name)
    if isinstance(spec, Number):
        lo = spec.at_least if spec.at_least is not None else 0.0
        hi = spec.at_most if spec.at_most is not None else lo + 1000.0
        return round(lo + (hi - lo) * rng.uniform(0.05, 0.95), 6) or 0.5
    if isinstance(spec, Count):
        return spec.at_least + rng.randint(1, 64)
    if isinstance(spec, Label):
        return spec.choices[0]
    if isinstance(spec, Text):
        return f"{name or 'text'} as the notebook wrote it"
    if isinstance(spec, Flag):
        return True
    if isinstance(spec, ListOf):
        return [sample(spec.item, rng, name) for _ in range(max(spec.min_len, min(3, spec.max_len)))]
    if isinstance(spec, TupleOf):
        return tuple(sample(s, rng, name) for s in spec.items)
    if isinstance(spec, DictOf):
        keys = spec.keys or ([*spec.key.choices[:2]] if isinstance(spec.key, Label) else
                             [1, 2] if isinstance(spec.key, Count) else ["first", "second"])
        return {k: sample(spec.value, rng, str(k)) for k in keys}
    if isinstance(spec, Fields):
        return {f: sample(s, rng, f) for f, s in spec.fields.items()}
    for v in (2.5, 3, "text", True, ["text"], [True, ["data", None]]):  # a lab's own spec (a rate, a number or infinity)
        try:
            spec.decode(v, name)
            return v
        except (AnswerError, TypeError, ValueError):
            continue
    raise TypeError(f"no sample for {spec!r}")


def _place(ns: dict, expr: str, value: Any) -> bool:
    """Define what ``expr`` reads in ``ns`` so that it evaluates to ``value``: a name, ``a.b``,
    ``a.b()`` or ``dict(a.b)``; False for an expression of another form (left undefined: missing)."""
    node = ast.parse(expr, mode="eval").body
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dict", "list") and node.args:
        node = node.args[0]
    call = isinstance(node, ast.Call) and not node.args
    if call:
        node = node.func
    if isinstance(node, ast.Name):
        ns[node.id] = value
        return True
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        obj = ns.setdefault(node.value.id, SimpleNamespace())
        setattr(obj, node.attr, (lambda v=value: v) if call else value)
        return True
    return False


def namespace(lab: str, seed: int = 0, **values: Any) -> dict:
    """A notebook's globals holding a value of every answer ``lab`` declares (``values`` by name
    replace the sampled ones)."""
    rng, ns = random.Random(seed), {}
    for cell in labs.load(lab).answers.values():
        for name, ans in cell.items():
            v = values.get(name, sample(ans.spec, rng, name))
            if not _place(ns, ans.expr, v) and type(ans.spec).__name__ == "SpecEntries":
                ns[name] = __import__("jax.sharding", fromlist=["PartitionSpec"]).PartitionSpec("data", None)
    return ns


def write(lab: str, path: Path, ns: dict, fingerprint: dict, monkeypatch, *, smoke: bool | None = None,
          tier: str | None = None, dtype: str = "bfloat16") -> Path:
    """``save_record(lab, ns, path)`` as the notebook's last cell runs it, on the machine
    ``fingerprint`` describes."""
    import utils.course.env
    import utils.device.hardware
    import utils.measure.record

    gpu = fingerprint.get("kind") == "gpu"
    smoke = (not gpu) if smoke is None else smoke
    monkeypatch.setattr(utils.device.hardware, "fingerprint", lambda *a, **k: dict(fingerprint))
    monkeypatch.setattr(utils.course.env, "smoke_mode", lambda: smoke)
    monkeypatch.setattr(utils.course.env, "device_tier", lambda *a, **k: tier or ("h100" if gpu else "cpu"))
    monkeypatch.setattr(utils.course.env, "matmul_dtype", lambda *a, **k: dtype if gpu else "float32")
    monkeypatch.setattr(utils.measure.record, "utils_hash", lambda *a, **k: "0" * 64)
    return record_answers.save_record(lab, ns, path).path
