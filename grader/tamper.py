"""Tamper detection: whether the clocks, CUDA timing and ``utils`` code a grade rests on are
the originals, and whether the grading environment is the one the kernel started with.

Each function's code object is compared with a fresh compile of the file it should come from
(nothing is executed), so a function rebound in a notebook cell, or a module attribute
swapped for a fake, shows up. Patching ``torch.cuda.Event.elapsed_time`` is a known way to
fake a kernel's time (docs/reference.md, "Timing"). How a cell is graded follows
from :data:`GRADING_VARS`, which a notebook may not change (read from ``/proc/self/environ``,
which assignments to ``os.environ`` leave alone).

Used through :func:`grader.checks.assert_untampered`; ``grader.phase(n)`` loads a fresh copy
of this file for the fresh ``checks`` it hands the hidden tests (``grader/__init__.py``).
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import types
from functools import cache
from pathlib import Path
from typing import Any

TIMERS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time")
UTILS_MODULES = ("utils.timing", "utils.flops", "utils.nvml", "utils.monitor", "utils.hardware", "utils.record", "utils.env",
                 "utils.memory", "utils.models", "utils.plots", "utils.profiling", "utils.training",
                 "utils.distributed", "utils.validate", "utils.units", "utils.trace_events", "utils.trace_metrics",
                 "utils.profile_diagnosis", "utils.inference", "utils.decode", "utils.quantize")
# What decides how a notebook is graded: smoke or GPU mode, the record graded without a GPU, the
# utils checksum, which GPUs, the size tier (utils.env), real or random weights and which
# checkpoints (utils.weights), which interpreter serves vLLM or SGLang (utils.engines), and where the
# snapshot cells hand their values to the clean process (grader/clean_values.py).
GRADING_VARS = ("GPULAB_SMOKE", "GPULAB_SUBMITTED_RECORD", "GPULAB_UTILS_SHA256", "CUDA_VISIBLE_DEVICES",
                "GPULAB_TIER", "GPULAB_WEIGHTS", "GPULAB_HUB_IDS", "GPULAB_VLLM_PYTHON", "GPULAB_SGLANG_PYTHON",
                "GPULAB_CLEAN_VALUES")


@cache
def _fresh_code(path: str) -> dict[str, list[types.CodeType]]:
    """Every function code object of the file at ``path``, by qualified name, compiled now."""
    src = Path(path).read_text(encoding="utf-8")
    top = compile(src, path, "exec", dont_inherit=True)
    out: dict[str, list[types.CodeType]] = {}

    def walk(code: types.CodeType, prefix: str) -> None:
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                if c.co_name.startswith("<") and c.co_name != "<lambda>":
                    continue
                qual = f"{prefix}{c.co_name}"
                out.setdefault(qual, []).append(c)
                walk(c, f"{qual}.")

    walk(top, "")
    return out


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    if a.co_code != b.co_code or a.co_names != b.co_names or a.co_varnames != b.co_varnames:
        return False
    ca = [c for c in a.co_consts if not isinstance(c, types.CodeType)]
    cb = [c for c in b.co_consts if not isinstance(c, types.CodeType)]
    if ca != cb:
        return False
    na = [c for c in a.co_consts if isinstance(c, types.CodeType)]
    nb = [c for c in b.co_consts if isinstance(c, types.CodeType)]
    return len(na) == len(nb) and all(same_code(x, y) for x, y in zip(na, nb, strict=True))


def _function_of(obj: Any) -> types.FunctionType | None:
    for attr in ("__func__", "fget"):
        if getattr(obj, attr, None) is not None:
            obj = getattr(obj, attr)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    return obj if isinstance(obj, types.FunctionType) else None


def function_is_original(obj: Any, path: str, qualname: str) -> bool:
    """Whether ``obj`` (function, method, property, wrapped function) runs the code that
    ``qualname`` has in the file ``path``."""
    fn = _function_of(obj)
    if fn is None or os.path.realpath(fn.__code__.co_filename) != os.path.realpath(path):
        return False
    return any(same_code(fn.__code__, c) for c in _fresh_code(path).get(qualname, []))


def patched_timers() -> list[str]:
    """Names of the standard clocks and CUDA timing calls that are not the originals."""
    bad = []
    for name in TIMERS:
        f = getattr(time, name, None)
        if not (isinstance(f, types.BuiltinFunctionType) and f.__name__ == name
                and getattr(f.__self__, "__name__", None) == "time"):
            bad.append(f"time.{name}")
    torch = sys.modules.get("torch")
    if torch is not None:
        streams = sys.modules.get("torch.cuda.streams")
        if streams is None or torch.cuda.Event is not getattr(streams, "Event", None):
            bad.append("torch.cuda.Event")
        else:
            for meth in ("elapsed_time", "record", "synchronize", "query", "wait"):
                if not function_is_original(torch.cuda.Event.__dict__.get(meth), streams.__file__, f"Event.{meth}"):
                    bad.append(f"torch.cuda.Event.{meth}")
        cuda_init = sys.modules.get("torch.cuda")
        if not function_is_original(torch.cuda.synchronize, cuda_init.__file__, "synchronize"):
            bad.append("torch.cuda.synchronize")
    return bad


def patched_module(module: types.ModuleType) -> list[str]:
    """Functions, methods and imported modules of ``module`` that differ from its file."""
    path = getattr(module, "__file__", None)
    if not path or not os.path.isfile(path):
        return [f"{module.__name__} (no source file)"]
    classes = _class_names(path)
    live = vars(module)
    bad = []
    for qual in _fresh_code(path):
        parts = qual.split(".")
        if "<lambda>" in parts or len(parts) > 2 or (len(parts) == 2 and parts[0] not in classes):
            continue  # nested code is compared as part of its parent
        if len(parts) == 1 and parts[0] not in classes:
            obj = live.get(parts[0])
            if obj is None:
                bad.append(f"{module.__name__}.{qual} (deleted)")
            elif not function_is_original(obj, path, qual):
                bad.append(f"{module.__name__}.{qual}")
            continue
        cls = live.get(parts[0])
        if not isinstance(cls, type):
            bad.append(f"{module.__name__}.{parts[0]} (class replaced)")
            continue
        if len(parts) == 2:
            attr = cls.__dict__.get(parts[1])
            fns = [getattr(attr, k, None) for k in ("fget", "fset", "fdel")] if isinstance(attr, property) else [attr]
            if not any(f is not None and function_is_original(f, path, qual) for f in fns):
                bad.append(f"{module.__name__}.{qual}")
    for name, value in live.items():
        if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is not value:
            bad.append(f"{module.__name__}.{name} (a module swapped for a fake)")
    for name, modname in _imported_modules(path).items():
        real = sys.modules.get(modname)
        if real is not None and name in live and live[name] is not real:
            bad.append(f"{module.__name__}.{name} (a module swapped for a fake)")
    return sorted(set(bad))


@cache
def _imported_modules(path: str) -> dict[str, str]:
    """Names the file binds to modules at module level: ``import time`` -> {"time": "time"},
    ``import a.b as c`` -> {"c": "a.b"}, ``from utils import nvml`` -> {"nvml": "utils.nvml"}
    (the last only counts if ``utils.nvml`` turns out to be a module)."""
    import ast

    out = {}
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


@cache
def _class_names(path: str) -> frozenset:
    """Names of the classes defined at module level (inside if/try blocks too)."""
    import ast

    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    names = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []) or [])
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return frozenset(names)


def patched_constants(module: types.ModuleType) -> list[str]:
    """Module-level ``NAME = <literal>`` assignments of ``module``'s file (upper-case names)
    whose live value differs from the literal: a grading threshold a notebook rebound."""
    import ast

    path = getattr(module, "__file__", None)
    if not path or not os.path.isfile(path):
        return [f"{module.__name__} (no source file)"]
    bad = []
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if not name.isupper():
                continue
            try:
                want = ast.literal_eval(node.value)
            except ValueError:  # not a literal: nothing to compare with
                continue
            if getattr(module, name, None) != want:
                bad.append(f"{module.__name__}.{name} (changed)")
    return bad


def tamper_report(modules: tuple[str, ...] = UTILS_MODULES, own: tuple[str, ...] = ()) -> list[str]:
    """Everything patched: clocks, CUDA timing, the functions of ``modules`` (imported when
    not yet), and of each of ``own`` that is imported already (the grader's own modules:
    a fresh copy, registered nowhere, has nothing to compare)."""
    bad = patched_timers()
    for name in modules + tuple(own):
        mod = sys.modules.get(name)
        if mod is None:
            if name in own:
                continue
            try:
                mod = importlib.import_module(name)
            except Exception as exc:  # a module that cannot import is not ours to grade
                bad.append(f"{name} (cannot import: {type(exc).__name__})")
                continue
        bad.extend(patched_module(mod))
    return bad


def _start_environ() -> dict[str, str] | None:
    """The environment this process started with (Linux ``/proc/self/environ``); None elsewhere."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0"))
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, sep, v in pairs if sep}


def assert_environment_unchanged() -> None:
    """AssertionError if the notebook changed one of :data:`GRADING_VARS` since its kernel
    started under the grader (``GPULAB_GRADING=1`` then); nothing outside the grader."""
    start = _start_environ()
    if not start or start.get("GPULAB_GRADING") != "1":
        return
    changed = [v for v in GRADING_VARS if os.environ.get(v) != start.get(v)]
    if changed:
        raise AssertionError(f"the notebook changed {', '.join(changed)} while it was graded, and that decides how "
                             "it is graded: remove the cell that sets it")
