"""Correct timing of GPU work: warm-up, CUDA events, synchronisation, L2 flush, repeats.

Why a host timer without a sync lies: a CUDA kernel launch returns as soon as the kernel
is queued, often in a few microseconds, while the GPU runs it later. ``perf_counter``
around ``y = a @ b`` measures the queueing, and the real cost lands on whatever later
call waits for the GPU (``loss.item()``, ``print(y)``, ``torch.cuda.synchronize()``).
So: synchronise before reading a host clock, or time on the GPU's own timeline with CUDA
events (docs/reference.md, "Timing").

The recipe here follows ``triton.testing.do_bench`` and GPU MODE's evaluator (docs/reference.md,
"Timing"): run a few warm-up calls (lazy initialisation, cuBLAS heuristics, compilation),
zero a 256 MB buffer before each timed run so no input sits in L2 from the previous run,
time each run with a pair of CUDA events, and repeat (3 to 100 runs) until the relative
standard error of the mean is below 0.1% or a time budget is spent. Report the median and
the 20th/80th percentiles. On a CPU, ``time.perf_counter`` times each run and there is
no L2 flush.

The clocks are looked up at call time (``time.perf_counter``, ``torch.cuda.Event``), never
bound at import, so a grader can check that neither was patched.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

FLUSH_BYTES = 256 * 10**6  # the L2-flush buffer of triton.testing.do_bench: 256 MB (H200 L2: 50 MB)
BATCH_MS = 20.0  # GPU work queued between host syncs once the first min_runs are timed


# -- devices ------------------------------------------------------------------------------

def _device_type(device: Any) -> str:
    """``"cuda"``, ``"cpu"``, ``"mps"`` ... from a str, int, torch.device or None."""
    if device is None:
        return ""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"
    kind = getattr(device, "type", None) or str(device)
    return kind.split(":")[0].lower()


def device_sync(device: Any = None) -> None:
    """Wait until the device has finished all queued work; a no-op on the CPU.

    ``device=None`` means the current CUDA device, and only if torch has already
    initialised CUDA: with no context there is no queued work, and creating one here
    would cost a learner 300+ MB of GPU memory and a second of start-up."""
    torch = sys.modules.get("torch")  # torch never imported: no GPU work can be queued
    if torch is None:
        return
    kind = _device_type(device)
    if kind in ("", "cuda"):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize(device if kind == "cuda" else None)
    elif kind == "mps":
        torch.mps.synchronize()
    elif kind == "xpu":
        torch.xpu.synchronize(device)


def _find_device(device: Any, values: tuple) -> str:
    """The device to time on: ``device`` if given, else that of the first tensor among
    ``values`` (one level into lists, tuples and dicts), else CUDA when available."""
    if device is not None:
        if isinstance(device, int) and not isinstance(device, bool):
            return f"cuda:{device}"
        return str(device)
    flat: list = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        elif isinstance(v, dict):
            flat.extend(v.values())
        else:
            flat.append(v)
    for v in flat:
        dev = getattr(v, "device", None)
        if dev is not None and getattr(dev, "type", None) is not None:
            return str(dev)
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


# -- results ------------------------------------------------------------------------------

def _quantile(sorted_ms: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's and torch.quantile's default)."""
    if len(sorted_ms) == 1:
        return sorted_ms[0]
    pos = q * (len(sorted_ms) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def relative_standard_error(times_ms: list[float]) -> float:
    """Standard error of the mean over the mean: stdev / sqrt(n) / mean (inf below 2 runs)."""
    n = len(times_ms)
    if n < 2:
        return math.inf
    mean = statistics.fmean(times_ms)
    std = statistics.stdev(times_ms)
    if mean <= 0:
        return 0.0 if std == 0 else math.inf
    return std / math.sqrt(n) / mean


@dataclass(frozen=True)
class TimingResult:
    """Times of repeated runs, in milliseconds, and how they were taken."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    mean_ms: float
    std_ms: float  # sample standard deviation of one run
    runs: int
    rse: float  # relative standard error of the mean (0.001 = 0.1%)
    method: str  # "cuda_events", "perf_counter" or "perf_counter+sync"
    times_ms: list[float] = field(repr=False)
    warmup_runs: int = 0
    stopped: str = ""  # "rse" (target met), "budget", "max_runs", or "" (not a benchmark)
    l2_flushed: bool = False
    device: str = "cpu"

    @classmethod
    def from_times(cls, times_ms: list[float], method: str, **extra: Any) -> TimingResult:
        if not times_ms:
            raise ValueError("no timed runs to summarise")
        s = sorted(times_ms)
        return cls(
            median_ms=_quantile(s, 0.5), p20_ms=_quantile(s, 0.2), p80_ms=_quantile(s, 0.8),
            mean_ms=statistics.fmean(s), std_ms=statistics.stdev(s) if len(s) > 1 else 0.0,
            runs=len(s), rse=relative_standard_error(list(times_ms)), method=method,
            times_ms=list(times_ms), **extra)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        def ms(v: float) -> str:
            return f"{v:.4g} ms" if v >= 0.01 else f"{v * 1e3:.4g} us"

        rse = "n/a" if math.isinf(self.rse) else f"{100 * self.rse:.2f}%"
        extra = [self.method, f"{self.warmup_runs} warm-up"] if self.stopped else [self.method]
        if self.l2_flushed:
            extra.append("L2 flushed")
        if self.stopped:
            extra.append(f"stopped on {self.stopped}")
        return (f"{ms(self.median_ms)} median (p20 {ms(self.p20_ms)}, p80 {ms(self.p80_ms)}); "
                f"mean {ms(self.mean_ms)} +- {ms(self.std_ms)}, {self.runs} runs, rse {rse} ({', '.join(extra)})")


# -- benchmark ----------------------------------------------------------------------------

def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def benchmark(fn: Callable, *args: Any, warmup: int = 3, min_runs: int = 3, max_runs: int = 100,
              target_rse: float = 0.001, budget_s: float = 10.0, flush_l2: bool = True,
              device: Any = None, setup: Callable | None = None, kwargs: dict | None = None) -> TimingResult:
    """Time ``fn(*args, **kwargs)``: ``warmup`` untimed calls, then timed runs until the
    relative standard error of the mean is below ``target_rse`` (after at least
    ``min_runs``), ``budget_s`` seconds of timed runs have passed, or ``max_runs`` is
    reached, as GPU MODE's evaluator does (docs/reference.md, "Timing").

    On CUDA each run is bracketed by two CUDA events and, with ``flush_l2``, preceded by
    zeroing a 256 MB buffer as ``triton.testing.do_bench`` does, so small inputs are read
    from memory, not from the previous run's L2. The zeroing kernel also keeps the GPU busy
    while ``fn``'s launches are queued, so a run measures the GPU's work, not the launch
    latency of an idle queue. Runs are queued back to back in batches of about 20 ms and
    the host syncs once per batch (the stopping rule needs the times): with a sync after
    every run, medians came out up to 4% below ``do_bench``'s on one H200
    (benchmarks/RESULTS.md). The buffer is freed at the end but stays in PyTorch's cache.

    ``setup``, if given, is called untimed before every run (fresh inputs, as in GPU MODE's
    leaderboard mode); if it returns something other than None, that is the argument
    tuple for this run (a non-tuple is passed as the single argument).

    ``device`` defaults to the device of the first tensor argument, else CUDA when
    available; on a CPU the runs are timed with ``time.perf_counter`` and not flushed.
    """
    if not callable(fn):
        raise TypeError(f"benchmark needs a function to call, got {type(fn).__name__}: pass fn, not fn()")
    _check_count("warmup", warmup, 0)
    _check_count("min_runs", min_runs, 1)
    _check_count("max_runs", max_runs, min_runs)
    if not isinstance(target_rse, (int, float)) or target_rse < 0:
        raise ValueError(f"target_rse must be a fraction >= 0 (0.001 = 0.1%), got {target_rse!r}")
    if not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    kw = dict(kwargs or {})
    dev = _find_device(device, args + tuple(kw.values()))
    kind = _device_type(dev)

    def run_args() -> tuple:
        if setup is None:
            return args
        got = setup()
        if got is None:
            return args
        return got if isinstance(got, tuple) else (got,)

    for _ in range(warmup):
        fn(*run_args(), **kw)
    device_sync(dev)

    torch = None
    cache = None
    if kind == "cuda":
        import torch

        cache = _flush_buffer(torch, dev) if flush_l2 else None
    times_ms: list[float] = []
    # events are recorded on the current stream of the current device: make that ``dev``
    ctx = torch.cuda.device(dev) if torch is not None else contextlib.nullcontext()
    with ctx:
        stopped = _timed_runs(fn, kw, run_args, torch, cache, dev, times_ms, min_runs, max_runs, target_rse, budget_s)
    flushed = cache is not None
    del cache
    method = "cuda_events" if torch is not None else ("perf_counter" if kind == "cpu" else "perf_counter+sync")
    return TimingResult.from_times(times_ms, method, warmup_runs=warmup, stopped=stopped,
                                   l2_flushed=flushed, device=dev)


def _flush_buffer(torch: Any, dev: str) -> Any:
    """The 256 MB buffer zeroed before each run, or None if the card cannot spare it."""
    try:
        return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    except RuntimeError:  # torch.OutOfMemoryError on a small card: time without the flush
        return None


def _timed_runs(fn: Callable, kw: dict, run_args: Callable[[], tuple], torch: Any, cache: Any, dev: str,
                times_ms: list[float], min_runs: int, max_runs: int, target_rse: float, budget_s: float) -> str:
    """The measurement loop of :func:`benchmark`; appends to ``times_ms``, returns why it stopped.

    On CUDA the runs are queued in batches without a host sync between them, as
    ``triton.testing.do_bench`` queues all of its runs: the GPU goes from one run to the
    next as it would in a real loop, instead of idling while the host reads each time.
    The first batch is ``min_runs`` runs; later batches hold about :data:`BATCH_MS` of
    work, so the stopping rule is checked every few tens of milliseconds.
    """
    start_s = time.perf_counter()
    while len(times_ms) < max_runs:
        if torch is not None:
            done = len(times_ms)
            if done < min_runs:
                n = min_runs - done
            else:
                per_run_ms = max(statistics.median(times_ms), 1e-3)
                n = max(1, min(round(BATCH_MS / per_run_ms), max_runs - done))
            pairs = []
            for _ in range(n):
                call_args = run_args()
                if cache is not None:
                    cache.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*call_args, **kw)
                end.record()
                pairs.append((start, end))
            pairs[-1][1].synchronize()
            times_ms.extend(a.elapsed_time(b) for a, b in pairs)
        else:
            call_args = run_args()
            device_sync(dev)
            t0 = time.perf_counter()
            fn(*call_args, **kw)
            device_sync(dev)
            times_ms.append((time.perf_counter() - t0) * 1e3)
        if len(times_ms) >= min_runs:
            if relative_standard_error(times_ms) < target_rse:
                return "rse"
            if time.perf_counter() - start_s >= budget_s:
                return "budget"
    return "max_runs"


# -- stopwatch for training loops ----------------------------------------------------------

class Stopwatch:
    """Time the steps of a training loop without slowing it down.

    >>> sw = Stopwatch(warmup_steps=2, tokens_per_step=16 * 1024)
    >>> for batch in loader:                 # doctest: +SKIP
    ...     with sw.step():
    ...         train_step(batch)
    >>> sw.summary()["tokens_per_s"]         # doctest: +SKIP

    On CUDA each step is bracketed by two CUDA events and nothing synchronises until
    :meth:`summary`: a ``torch.cuda.synchronize()`` per step would stop the CPU from
    queueing step n+1 while the GPU runs step n, the very overlap a fast loop depends on.
    A step's time runs from the moment the GPU reaches the start event (when it has
    finished the previous step, or when the host got there if the GPU was idle) to when
    it finishes the step's last kernel, so host stalls inside the block count, and the sum
    over steps is the loop's wall time when the blocks are back to back. Work done outside
    the block (a data loader called before ``with``) is not counted: put it inside.

    With ``sync=True`` the steps are timed with ``time.perf_counter`` and a device sync at
    both ends (method ``perf_counter+sync``), to show what such a sync costs. On a CPU the
    steps are timed with ``time.perf_counter`` (method ``perf_counter``).

    The first ``warmup_steps`` steps (compilation, allocator growth, cuDNN autotune) are
    recorded but left out of the statistics. Tokens per second is the measured steps'
    tokens over their summed time.
    """

    def __init__(self, warmup_steps: int = 1, tokens_per_step: int | None = None, *,
                 device: Any = None, sync: bool = False):
        _check_count("warmup_steps", warmup_steps, 0)
        if tokens_per_step is not None:
            _check_count("tokens_per_step", tokens_per_step, 1)
        self.warmup_steps = warmup_steps
        self.tokens_per_step = tokens_per_step
        self.sync = sync
        self.device = device
        self._steps: list[tuple[str, Any, Any, int | None]] = []
        self._kind: str | None = None

    def _resolve(self) -> str:
        if self._kind is None:
            dev = _find_device(self.device, ())
            self.device = dev
            kind = _device_type(dev)
            self._kind = "events" if kind == "cuda" and not self.sync else ("sync" if kind != "cpu" else "host")
        return self._kind

    @contextlib.contextmanager
    def step(self, tokens: int | None = None) -> Iterator[None]:
        """Time the block as one step (``tokens`` overrides ``tokens_per_step``). A block
        that raises is not recorded."""
        kind = self._resolve()
        n_tokens = tokens if tokens is not None else self.tokens_per_step
        if kind == "events":
            import torch

            start = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._steps.append(("events", start, end, n_tokens))
        else:
            if kind == "sync":
                device_sync(self.device)
            t0 = time.perf_counter()
            yield
            if kind == "sync":
                device_sync(self.device)
            self._steps.append(("host", t0, time.perf_counter(), n_tokens))

    @property
    def method(self) -> str:
        return {"events": "cuda_events", "sync": "perf_counter+sync", "host": "perf_counter"}[self._resolve()]

    @property
    def times_ms(self) -> list[float]:
        """Every step's time in ms, warm-up included (waits for the GPU once)."""
        out = []
        for kind, a, b, _ in self._steps:
            if kind == "events":
                b.synchronize()
                out.append(a.elapsed_time(b))
            else:
                out.append((b - a) * 1e3)
        return out

    @property
    def last_ms(self) -> float | None:
        """The last step's time (waits for that step to finish on the GPU)."""
        if not self._steps:
            return None
        kind, a, b, _ = self._steps[-1]
        if kind == "events":
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3

    def result(self) -> TimingResult:
        """Statistics of the steps after warm-up, as a :class:`TimingResult`."""
        measured = self.times_ms[self.warmup_steps:]
        if not measured:
            raise ValueError(f"no steps measured yet: {len(self._steps)} step(s) recorded and "
                             f"{self.warmup_steps} are warm-up; run more steps or lower warmup_steps")
        return TimingResult.from_times(measured, self.method, warmup_runs=self.warmup_steps,
                                       device=str(self.device))

    def summary(self) -> dict:
        """Step-time statistics in ms, ``total_s`` of the measured steps, ``tokens_per_s``
        (None without token counts) and every measured ``step_times_ms``."""
        r = self.result()
        tokens = [t for *_, t in self._steps[self.warmup_steps:]]
        total_s = sum(r.times_ms) / 1e3
        tps = sum(tokens) / total_s if tokens and all(t is not None for t in tokens) and total_s > 0 else None
        return {"method": r.method, "steps": r.runs, "warmup_steps": self.warmup_steps,
                "median_ms": r.median_ms, "p20_ms": r.p20_ms, "p80_ms": r.p80_ms, "mean_ms": r.mean_ms,
                "std_ms": r.std_ms, "total_s": total_s, "tokens_per_s": tps, "step_times_ms": r.times_ms}

    def __len__(self) -> int:
        return len(self._steps)
