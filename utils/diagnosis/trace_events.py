"""Reading a PyTorch profiler trace: Chrome-trace files, dicts or ``prof.events()`` as :class:`Event` s.

The events are the Chrome-trace dicts that ``prof.export_chrome_trace`` writes (Kineto's
format: ``ph``, ``cat``, ``name``, ``ts`` and ``dur`` in microseconds, ``pid``, ``tid``,
``args``); every measure in ``utils/diagnosis/trace_metrics.py`` is a pure function of a list of them,
so tests feed synthetic events and check every number exactly.

Trace files as users have them (``load_events``; the fixtures in ``tests/data/traces`` follow
each one, with sources in its README):

- torch 1.8-1.9 Kineto wrote the categories ``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``,
  ``Memset`` (kineto ``tb_plugin/test/gpu_metrics_input.json``); they are read as the current
  names (listed in ``utils/diagnosis/trace_metrics.py``), as TensorBoard's plugin does (``tb_plugin/.../trace.py``, ``EventTypeMap``).
- torch without Kineto (``torch.autograd.profiler``, pytorch/pytorch#33961, #95460) wrote no
  ``cat``: ``pid`` ``"CPU functions"`` events are read as ``cpu_op``, ``"CUDA functions"`` as
  ``kernel`` (per-op GPU time there, not per kernel; ``tid`` is the device).
- Only complete events (``ph`` ``X``) and ``B``/``E`` pairs (paired per thread, as the Trace
  Event Format nests them) carry durations; metadata (``M``), flows (``s``/``f``: ``ac2g``,
  ``fwdbwd``), counters (``C``) and instants (``i``/``I``, e.g. ``Record Window End``) are
  skipped. ``ts``/``dur`` are microseconds even with ``"displayTimeUnit": "ns"`` (a viewer
  setting; catapult ``tracing/test_data/nanoseconds.json``); numeric strings are accepted,
  fractional (ns-resolution) values kept. ``pid``/``tid`` may be strings (``"Spans"``,
  ``"stream 7"``); Kineto's own ``Trace`` span (``pid`` ``"Spans"``) is not work: a trace without
  steps leaves it out of its analysis window.
- Files are plain or gzipped JSON (detected by content, not name: ``*.pt.trace.json.gz`` from
  ``tensorboard_trace_handler``), an object with ``traceEvents`` or a bare list. Raw control
  characters in strings are accepted (TensorBoard's plugin reads Kineto files with
  ``strict=False``), and so are the unescaped Windows backslashes of kineto#336.
- JAX/TensorBoard (XLA) traces and other Chrome traces carry none of these categories:
  ``summarize`` (``utils/diagnosis/profile_diagnosis.py``) says so in one line instead of guessing.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import re
import tempfile
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "cuda_event"})
# Categories a PyTorch profiler trace carries (libkineto ActivityType names); a trace with none
# of them is not one this module can read.
KINETO_CATS = GPU_CATS | {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function",
                          "cpu_instant_event", "cuda_profiler_range", "overhead"}
# torch 1.8-1.9 names (lower-cased) -> current ones; "Kernel" lower-cases to "kernel" itself
_LEGACY_CATS = {"operator": "cpu_op", "runtime": "cuda_runtime", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
_LEGACY_PIDS = {"CPU functions": "cpu_op", "CUDA functions": "kernel"}  # torch.autograd.profiler without Kineto

@dataclass(slots=True)
class Event:
    """One complete ("X") trace event, times in microseconds."""
    name: str
    cat: str
    ts: float
    dur: float
    pid: Any = 0
    tid: Any = 0
    args: dict = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def on_cpu(self) -> bool:
        return self.cat not in GPU_CATS


def _from_function_event(fe: Any) -> Event:
    """A ``prof.events()`` FunctionEvent as an Event (categories guessed on torch < 2.13)."""
    name = getattr(fe, "trace_name", None) or fe.name
    device = "CPU" if str(getattr(fe, "device_type", "CPU")).endswith("CPU") else "GPU"
    cat = getattr(fe, "activity_type", None)
    if not isinstance(cat, str) or not cat:
        if device == "GPU":
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"
        elif getattr(fe, "is_user_annotation", False):
            cat = "user_annotation"
        elif name.startswith(("cuda", "cu")) and "::" not in name:
            cat = "cuda_runtime"
        else:
            cat = "cpu_op"
    args: dict = {}
    # the raw JSON fragment: an attribute before torch 2.13, ``_metadata_json`` behind a
    # deprecated property (it warns on stderr) from 2.13
    meta = vars(fe).get("metadata_json") or vars(fe).get("_metadata_json") or ""
    if isinstance(meta, str) and meta:
        try:
            args = json.loads("{" + meta.strip().rstrip(",") + "}")
        except ValueError:
            args = {}
    if device == "GPU":
        args.setdefault("device", getattr(fe, "device_index", 0))
        args.setdefault("stream", getattr(fe, "device_resource_id", 0))
    start, end = fe.time_range.start, fe.time_range.end
    pid = getattr(fe, "device_index", 0) if device == "GPU" else "host"
    tid = getattr(fe, "device_resource_id", 0) if device == "GPU" else getattr(fe, "thread", 0)
    return Event(name, cat, float(start), float(end - start), pid, tid, args)


def _us(d: dict, key: str, default: float | None = None) -> float:
    """``d[key]`` in microseconds: a number or a numeric string, finite; else a one-line error."""
    v = d.get(key)
    if v is None and default is not None:
        return default
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or isinstance(v, bool):
        raise ValueError(f"trace event {str(d.get('name', '?'))[:60]!r} has {key}={v!r:.30}: "
                         "expected a number of microseconds")
    return x


def _hashable(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str)) else str(v)


def _dict(v: Any) -> dict:
    return dict(v) if isinstance(v, dict) else {}


def _category(d: dict) -> str:
    """The event's category under its current Kineto name (module docstring: older spellings)."""
    cat = d.get("cat")
    if cat is None:
        return _LEGACY_PIDS.get(d.get("pid"), "") if isinstance(d.get("pid"), str) else ""
    low = str(cat).lower()
    return _LEGACY_CATS.get(low, low if low in KINETO_CATS else str(cat))


def _from_dict(d: dict) -> Event | None:
    """A complete ("X") event dict as an Event; None for every other phase or a nameless one."""
    if d.get("ph", "X") != "X" or "ts" not in d or "name" not in d:
        return None
    args = _dict(d.get("args"))
    if "External id" not in args and "external id" in args:  # torch 1.8 spelled it in lower case
        args["External id"] = args["external id"]
    cat = _category(d)
    if d.get("cat") is None and cat == "kernel":  # legacy CUDA functions: tid is the device
        args.setdefault("device", _hashable(d.get("tid", 0)))
    return Event(str(d["name"]), cat, _us(d, "ts"), max(0.0, _us(d, "dur", 0.0)),
                 _hashable(d.get("pid", 0)), _hashable(d.get("tid", 0)), args)


def _paired(begins_ends: list[dict]) -> list[Event]:
    """Complete events from "B"/"E" pairs: per (pid, tid), in time order, an "E" closes the
    latest open "B" (the Trace Event Format requires them nested per thread); the "E" may omit
    name and category, its args are merged in. A "B" never closed is dropped."""
    open_: dict[Any, list[dict]] = defaultdict(list)
    out = []
    for d in sorted(begins_ends, key=lambda d: _us(d, "ts")):
        key = (_hashable(d.get("pid", 0)), _hashable(d.get("tid", 0)))
        if d["ph"] == "B":
            open_[key].append(d)
        elif open_[key]:
            b = open_[key].pop()
            args = {**_dict(b.get("args")), **_dict(d.get("args"))}
            merged = {**b, "ph": "X", "dur": _us(d, "ts") - _us(b, "ts"), "args": args}
            ev = _from_dict(merged)
            if ev is not None:
                out.append(ev)
    return out


def _read_trace_file(path: Path) -> Any:
    """The JSON in ``path``, gunzipped when it starts with the gzip magic bytes."""
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a directory: pass one trace file from it "
                                "(tensorboard_trace_handler writes one *.pt.trace.json[.gz] per worker and step)")
    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path}: pass the file prof.export_chrome_trace(...) wrote")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
        try:
            return json.loads(text, strict=False)
        except json.JSONDecodeError as first:
            # kineto#336: older Kineto wrote Windows paths (with_stack) with raw backslashes
            fixed = re.sub(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})?', lambda m: m[0] if m[1] else "\\\\", text)
            if fixed == text:
                raise
            try:
                return json.loads(fixed, strict=False)
            except json.JSONDecodeError:
                raise first from None
    except (ValueError, OSError, EOFError, zlib.error) as exc:  # bad JSON or UTF-8, bad or truncated gzip
        raise ValueError(f"{path} is not a Chrome-trace JSON file ({exc.__class__.__name__}: {exc})") from None


def load_events(source: Any) -> list[Event]:
    """Trace events from a path (JSON, gzipped or not), a trace dict, a list of event dicts,
    ``prof.events()``, or a ``torch.profiler.profile`` (exported to a temp file). Only events
    with a duration are kept (see the module docstring for the formats read)."""
    if hasattr(source, "export_chrome_trace"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            source.export_chrome_trace(str(path))
            return load_events(path)
    if isinstance(source, (str, os.PathLike)):
        source = _read_trace_file(Path(source))
    if isinstance(source, dict):
        if "traceEvents" not in source:
            raise ValueError("a trace dict needs a 'traceEvents' list (the format prof.export_chrome_trace writes)")
        source = source["traceEvents"]
        if not isinstance(source, list):
            raise ValueError(f"'traceEvents' must be a list of event dicts, got {type(source).__name__}")
    if not isinstance(source, (list, tuple)):
        raise ValueError(f"cannot read trace events from a {type(source).__name__}: pass a path, a trace dict, "
                         "a list of event dicts, prof.events() or the profiler")
    events, begins_ends = [], []
    for item in source:
        if isinstance(item, Event):
            events.append(item)
        elif isinstance(item, dict):
            if item.get("ph") in ("B", "E") and "ts" in item:
                begins_ends.append(item)
                continue
            ev = _from_dict(item)
            if ev is not None:
                events.append(ev)
        elif hasattr(item, "time_range"):
            events.append(_from_function_event(item))
        else:
            raise ValueError(f"not a trace event: {item!r:.80}")
    return events + _paired(begins_ends)
