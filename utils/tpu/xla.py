"""JAX under XLA: jit, static shapes, and what a recompilation costs.

XLA compiles a whole function for one set of input shapes and dtypes (the abstract
signature); ``jax.jit`` caches one executable per signature. A new shape means a new trace
and a new XLA compile, so a loop fed sequences of varying length compiles once per length.
Padding to a few bucket lengths bounds the compiles at the number of buckets and wastes the
padded FLOPs instead. TPUs make this sharper, not different: everything on a TPU runs as
compiled XLA programs.

How compiles are counted: JAX records the monitoring event
``/jax/core/compile/backend_compile_duration`` once per XLA backend compile, with the
jitted function's name (``jax._src.dispatch.BACKEND_COMPILE_EVENT``; checked with JAX
0.10.2, and the same name is used by projects on later versions);
:class:`CompileLog` listens to it through the public ``jax.monitoring`` API. A jitted
function's ``_cache_size()`` (private, in jaxlib) is reported beside it when present.

``jax.jit(f)`` twice on the same ``f`` shares one cache, so a second measurement would
count nothing; :func:`fresh_jit` compiles a copy of ``f`` with its own cache and a unique
name, which makes every count start from zero.

Importing this module sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (unless set): by default
JAX takes 75% of a GPU's memory at its first use, which would starve PyTorch in the same
notebook (JAX docs, "GPU memory allocation"). It also asks XLA's host platform for
``utils.tpu.tpu_pod.HOST_DEVICES`` CPU devices (``XLA_FLAGS``, unless a count is set or JAX has
started): lab 05 shards over them as over a pod's chips, and the flag is read only when JAX
starts, which this module's import comes before. JAX's default device stays the first one.
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import os
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from utils.tpu.tpu_pod import request_host_devices

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
request_host_devices()

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
INSTALL_HINT = "pip install jax  (CPU; for a CUDA GPU: pip install 'jax[cuda12]' or 'jax[cuda13]'; Colab TPU has it)"
_counter = itertools.count()


def available() -> bool:
    return importlib.util.find_spec("jax") is not None


def _jax():
    if not available():
        raise ImportError(f"JAX is not installed: {INSTALL_HINT}")
    import jax

    return jax


def backend() -> dict:
    """JAX's version, default backend (``cpu``, ``gpu``, ``tpu``) and devices."""
    jax = _jax()
    devs = jax.devices()
    return {"jax": jax.__version__, "backend": jax.default_backend(), "device_kind": devs[0].device_kind,
            "devices": [str(d) for d in devs]}


class CompileLog:
    """Every XLA backend compile inside a ``with`` block: ``(fun_name, seconds)`` in ``events``.

    >>> with CompileLog() as log:          # doctest: +SKIP
    ...     f(x)
    >>> log.count("jit(f)"), log.seconds("jit(f)")   # doctest: +SKIP
    """

    def __init__(self):
        self.events: list[tuple[str, float]] = []
        self._active = False

    def _listener(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if self._active and event == COMPILE_EVENT:
            self.events.append((str(kwargs.get("fun_name", "")), float(duration_secs)))

    def __enter__(self) -> CompileLog:
        self._active = True
        _jax().monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._active = False  # a JAX without unregister keeps calling the listener: it records nothing now
        remove = getattr(_jax().monitoring, "unregister_event_duration_listener", None)
        if remove is not None:
            remove(self._listener)
        return False

    def count(self, fun_name: str | None = None) -> int:
        return sum(1 for n, _ in self.events if fun_name is None or n == fun_name)

    def seconds(self, fun_name: str | None = None) -> float:
        return sum(s for n, s in self.events if fun_name is None or n == fun_name)


def _fresh(fn: Callable, **jit_kwargs: Any) -> tuple[Any, str]:
    """``(jitted copy, the fun_name its compile events carry)``."""
    jax = _jax()
    name = f"{getattr(fn, '__name__', 'fn')}_{next(_counter)}"
    if isinstance(fn, types.FunctionType):
        copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__ = fn.__kwdefaults__
    else:
        def copy(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    copy.__name__ = copy.__qualname__ = name
    return jax.jit(copy, **jit_kwargs), f"jit({name})"


def fresh_jit(fn: Callable, **jit_kwargs: Any):
    """``jax.jit`` of a copy of ``fn`` (same code, globals, defaults and closure) under a
    unique name ``<name>_<n>``: its own compile cache, and compile events that name only it."""
    return _fresh(fn, **jit_kwargs)[0]


def _block(out: Any) -> Any:
    return _jax().block_until_ready(out)


@dataclass
class CompileCount:
    """What :func:`count_compiles` saw."""

    compiles: int  # XLA backend compiles of the function (monitoring events)
    calls: int
    distinct_shapes: int  # distinct argument shape/dtype signatures among the calls
    compile_s: float  # summed backend compile seconds
    cache_size: int | None  # the jitted function's _cache_size(), where JAX has it
    first_call_ms: list[float] = field(default_factory=list)  # host time of each call, compile included
    fun_name: str = ""


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", type(a).__name__))) for a in args)


def count_compiles(fn: Callable, calls: Sequence[Sequence[Any]], **jit_kwargs: Any) -> CompileCount:
    """Call a fresh jit of ``fn`` once per argument tuple in ``calls`` and count XLA compiles.

    Build the inputs before calling: creating arrays compiles small JAX programs of its own,
    which are not counted (only events named after this function are)."""
    jitted, name = _fresh(fn, **jit_kwargs)
    times = []
    with CompileLog() as log:
        for args in calls:
            t0 = time.perf_counter()
            _block(jitted(*args))
            times.append((time.perf_counter() - t0) * 1e3)
    size = jitted._cache_size() if hasattr(jitted, "_cache_size") else None
    return CompileCount(log.count(name), len(calls), len({_signature(a) for a in calls}), log.seconds(name), size,
                        times, name)


def compile_vs_run(fn: Callable, *args: Any, budget_s: float = 2.0, max_runs: int = 50) -> dict:
    """Compile time and steady-state run time of ``jax.jit(fn)`` on ``args``.

    ``compile_ms``: XLA backend compile (monitoring event) of a fresh jit; ``first_call_ms``:
    the first call, trace + compile + run; ``run``: a ``utils.measure.timing`` TimingResult of later
    calls, each blocked until the result is ready (host ``perf_counter``: JAX's work is not
    on PyTorch's CUDA stream, so CUDA events would not see it); ``eager``: the same without
    ``jit`` (op by op, each op its own small cached program)."""
    from utils.measure.timing import benchmark

    jitted, name = _fresh(fn)
    with CompileLog() as log:
        t0 = time.perf_counter()
        _block(jitted(*args))
        first_ms = (time.perf_counter() - t0) * 1e3
    run = benchmark(lambda: _block(jitted(*args)), device="cpu", warmup=2, budget_s=budget_s, max_runs=max_runs)
    eager = benchmark(lambda: _block(fn(*args)), device="cpu", warmup=2, budget_s=budget_s, max_runs=max_runs)
    return {"compile_ms": log.seconds(name) * 1e3, "compiles": log.count(name), "first_call_ms": first_ms,
            "run": run, "eager": eager}


# -- bucketing ------------------------------------------------------------------------------

def pow2_buckets(max_len: int, min_len: int = 16) -> tuple[int, ...]:
    """Powers of two from ``min_len`` up to the first at or above ``max_len``."""
    if max_len < 1 or min_len < 1:
        raise ValueError(f"lengths must be positive, got max_len={max_len}, min_len={min_len}")
    b, out = 1 << max(0, math.ceil(math.log2(min_len))), []
    while True:
        out.append(b)
        if b >= max_len:
            return tuple(out)
        b *= 2


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n``; ValueError if none does."""
    fits = [b for b in buckets if b >= n]
    if n < 0 or not fits:
        raise ValueError(f"no bucket holds length {n}; buckets: {sorted(buckets)}")
    return min(fits)


def pad_to(x: Any, length: int, axis: int = 0, value: float = 0) -> Any:
    """``x`` (numpy or JAX array) padded with ``value`` along ``axis`` to ``length``."""
    import numpy as np

    n = x.shape[axis]
    if n > length:
        raise ValueError(f"cannot pad length {n} down to {length}")
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - n)
    mod = np if isinstance(x, np.ndarray) else _jax().numpy
    return mod.pad(x, widths, constant_values=value)


def padded_fraction(lengths: Sequence[int], buckets: Sequence[int]) -> float:
    """Share of the processed positions that are padding when each length is bucketed."""
    total = sum(bucket_length(n, buckets) for n in lengths)
    return 1 - sum(lengths) / total if total else 0.0


def break_even_calls(compile_ms: float, saved_ms_per_call: float) -> float:
    """Calls after which compiling has paid for itself: ``compile / saved per call``
    (infinite when the compiled version saves nothing)."""
    if compile_ms < 0:
        raise ValueError(f"compile_ms must be >= 0, got {compile_ms}")
    return compile_ms / saved_ms_per_call if saved_ms_per_call > 0 else math.inf
