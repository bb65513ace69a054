"""Measures of a profiled training step, each a pure function of trace events (``utils/diagnosis/trace_events.py``).

Step windows, GPU busy and idle time, launches, host syncs, data-loader waits, host-to-device
copies, top kernels and ops, the matmul share of kernel time, and how much collective
communication overlapped compute. Times are microseconds, as in the trace.

Event names and categories, as Kineto writes them (``libkineto/src/ActivityType.cpp``,
``CuptiActivity.cpp``; checked on a torch 2.13 CPU trace; torch 2.11 uses the same):

- ``ProfilerStep#N`` (``user_annotation``): one training step on the CPU, from one
  ``prof.step()`` to the next. A copy on the GPU timeline (``gpu_user_annotation``) is ignored.
- ``kernel``: a GPU kernel, ``args`` carry ``device`` and ``stream``.
- ``gpu_memcpy``: ``Memcpy HtoD (Pageable -> Device)`` or ``(Pinned -> Device)``, ``args.bytes``.
- ``cuda_runtime`` / ``cuda_driver``: host-side API calls (``cudaLaunchKernel``,
  ``cuLaunchKernel`` for Triton, ``cudaGraphLaunch``, ``cudaStreamSynchronize``...).
- ``cpu_op``: ATen operators (``aten::item`` -> ``aten::_local_scalar_dense``).
- ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` (or
  ``_MultiProcessingDataLoaderIter``): the time the loop waited for its next batch.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from utils.diagnosis.trace_events import Event

STEP_PREFIX = "ProfilerStep#"
LOADER_PREFIX = "enumerate(DataLoader)#"
LOADER_SUFFIX = "DataLoaderIter.__next__"
# ROCm builds of torch trace the HIP names (hipLaunchKernel, hipExtModuleLaunchKernel, ...:
# kineto's RoctracerActivityApi list) under the same categories.
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                   "cuLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch",
                   "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                   "hipGraphLaunch")
SYNC_API_PREFIXES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                     "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                     "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize")
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense")
COMM_KERNEL_MARKERS = ("nccl",)  # NCCL kernels: ncclKernel_* in older releases, ncclDevKernel_* in recent ones
# Kernel-name fragments of matmul / convolution / attention kernels: cuBLAS (sm90_xmma_gemm_*,
# nvjet_* on Hopper, ampere_sgemm_*), CUTLASS, cuDNN (implicit_convolve_sgemm, *_fprop/dgrad/wgrad),
# flash/fmha attention, Inductor's triton_tem_ matmul templates. Not "conv": it matches "convert".
MATMUL_HINTS = ("gemm", "xmma", "cutlass", "cublas", "nvjet", "wgmma", "convolve", "conv2d", "conv3d",
                "fprop", "dgrad", "wgrad", "flash", "fmha", "attention", "attn", "matmul", "triton_tem")
_EPS_US = 1.0  # tolerance for "event A encloses event B" (CUPTI and torch clocks differ by ~us)

def step_windows(events: list[Event]) -> list[tuple[float, float]]:
    """The (start, end) of each ``ProfilerStep#N`` on the CPU, in time order."""
    return sorted((e.ts, e.end) for e in events if e.name.startswith(STEP_PREFIX) and e.on_cpu)


def _merged(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping cover of ``intervals``."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_us(intervals) -> float:
    """Length of the union of (start, end) intervals: overlapping kernels count once."""
    return sum(e - s for s, e in _merged(intervals))


def intersection_us(a, b) -> float:
    """Length of the time covered by both interval sets (each merged first)."""
    a, b = _merged(a), _merged(b)
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_overlap(events: list[Event], window: tuple[float, float] | None = None) -> dict | None:
    """How much of the GPU's collective-communication time ran alongside compute, per step.

    Communication kernels are those whose name holds one of :data:`COMM_KERNEL_MARKERS`
    (NCCL's ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` and the like); every other kernel is
    compute. Per device, over the window (:func:`analysis_window`): ``comm`` is the union of
    communication-kernel intervals, ``overlapped`` the part of it during which some compute
    kernel also ran, ``exposed = comm - overlapped`` the part the step waited on alone
    (what DDP's bucketing tries to drive to zero, PyTorch's DDP design note). Averaged over
    devices, divided by the number of ``ProfilerStep`` windows (1 without them); None when
    the trace has no communication kernel (one process, or gloo on a CPU).

    A kernel that overlaps still shares the SMs and memory with the compute next to it, so an
    all-reduce hidden here can still slow the backward: compare ``compute_ms_per_step`` with a
    run without the all-reduce to see that cost."""
    window = window or analysis_window(events)
    t0, t1 = window

    def is_comm(e: Event) -> bool:
        return any(m in e.name.lower() for m in COMM_KERNEL_MARKERS)

    comm = _kernel_intervals(events, window, is_comm)
    compute = _kernel_intervals(events, window, lambda e: not is_comm(e))
    if not comm:
        return None
    steps = len(step_windows(events)) or 1
    n = len(comm)
    tot = {"comm": 0.0, "overlapped": 0.0, "compute": 0.0}
    for dev, iv in comm.items():
        tot["comm"] += union_us(iv)
        tot["overlapped"] += intersection_us(iv, compute.get(dev, []))
        tot["compute"] += union_us(compute.get(dev, []))
    per = {k: v / n / steps / 1e3 for k, v in tot.items()}
    return {"steps": steps, "devices": n, "comm_ms_per_step": per["comm"],
            "overlapped_ms_per_step": per["overlapped"], "exposed_ms_per_step": per["comm"] - per["overlapped"],
            "compute_ms_per_step": per["compute"],
            "overlap_fraction": per["overlapped"] / per["comm"] if per["comm"] > 0 else None,
            "window_ms_per_step": (t1 - t0) / steps / 1e3}


def analysis_window(events: list[Event], windows: list[tuple[float, float]] | None = None) -> tuple[float, float]:
    """The wall span the per-step numbers cover: from the first step's start to the later of
    the last step's end and the last kernel's end (the GPU may still be working on the last
    step's kernels when the CPU finishes it). Without step annotations: all events but
    Kineto's ``Trace`` span (the profiler's own start-to-stop bookkeeping)."""
    windows = step_windows(events) if windows is None else windows
    kernel_ends = [e.end for e in events if e.cat == "kernel"]
    if windows:
        return windows[0][0], max([windows[-1][1], *kernel_ends])
    xs = [e for e in events if not e.name.startswith(STEP_PREFIX) and e.cat != "Trace"]
    if not xs:
        raise ValueError("the trace has no complete ('X') events to summarise")
    return min(e.ts for e in xs), max(e.end for e in xs)


def _kernel_intervals(events: list[Event], window: tuple[float, float], keep=lambda e: True) -> dict[Any, list]:
    """Per device, the (start, end) of each kernel ``keep`` accepts, clipped to ``window``."""
    t0, t1 = window
    by_device: dict[Any, list] = defaultdict(list)
    for e in events:
        if e.cat == "kernel" and e.end > t0 and e.ts < t1 and keep(e):
            by_device[e.args.get("device", e.pid)].append((max(e.ts, t0), min(e.end, t1)))
    return by_device


def gpu_busy_us(events: list[Event], window: tuple[float, float]) -> dict[Any, float]:
    """Per device, the union of kernel intervals clipped to ``window`` (all streams together)."""
    return {d: union_us(iv) for d, iv in _kernel_intervals(events, window).items()}


def gpu_idle_fraction(events: list[Event], window: tuple[float, float] | None = None) -> float | None:
    """1 - (union of kernel intervals) / (wall span of the active steps); None without kernels.

    Method: take every ``kernel`` event on every stream of a device, clip it to the window
    (:func:`analysis_window`), merge overlapping intervals (two streams running at once count
    once), and divide the merged length by the window. With several devices in one trace the
    mean over devices. Copies and memsets do not count as busy: they use the copy engines, not
    the SMs. It is the same question NVML's ``utilization.gpu`` asks ("was any kernel
    running?"), answered exactly from the trace instead of sampled: a busy GPU by this measure
    can still be a slow one (see ``utils.measure.flops`` for MFU)."""
    window = window or analysis_window(events)
    busy = gpu_busy_us(events, window)
    span = window[1] - window[0]
    if not busy or span <= 0:
        return None
    return sum(1.0 - b / span for b in busy.values()) / len(busy)


def _cpu_in_steps(events: list[Event], windows: list[tuple[float, float]], pred) -> list[Event]:
    """Host-side events matching ``pred`` that start inside a step (any thread); all without steps."""
    starts = [w[0] for w in windows]

    def inside(ts: float) -> bool:
        i = bisect.bisect_right(starts, ts) - 1
        return i >= 0 and ts <= windows[i][1]
    return [e for e in events if e.on_cpu and pred(e) and (not windows or inside(e.ts))]


def _top_level(events: list[Event]) -> list[Event]:
    """Drop events enclosed by another event of the same list on the same thread
    (``aten::item`` encloses ``aten::_local_scalar_dense``; ``cudaLaunchKernel`` may enclose
    ``cuLaunchKernel``): one user-visible call counts once."""
    out = []
    by_thread: dict[Any, list[Event]] = defaultdict(list)
    for e in events:
        by_thread[(e.pid, e.tid)].append(e)
    for evs in by_thread.values():
        top_end = None
        for e in sorted(evs, key=lambda e: (e.ts, -e.dur)):
            if top_end is not None and e.ts < top_end and e.end <= top_end + _EPS_US:
                continue
            out.append(e)
            top_end = e.end
    return out


def count_launches(events: list[Event], windows: list[tuple[float, float]]) -> int:
    """Kernel and graph launches issued by the host inside the steps (nested driver calls once)."""
    return len(_top_level(_cpu_in_steps(events, windows, lambda e: e.name.startswith(LAUNCH_PREFIXES))))


def host_syncs(events: list[Event], windows: list[tuple[float, float]]) -> tuple[int, float]:
    """(count, wait in us) of host syncs inside the steps: ``cuda*Synchronize`` calls and
    ``aten::item``/``aten::_local_scalar_dense``, nested ones counted once. In a trace with
    GPU activity an ``aten::item`` counts only when it encloses a synchronize call (or shares
    its External id): ``.item()`` on a CPU tensor (Adam's step counter) waits for nothing. In
    a CPU-only trace every ``.item()`` counts: it is where a GPU run would wait."""
    apis = _cpu_in_steps(events, windows, lambda e: e.name.startswith(SYNC_API_PREFIXES))
    ops = _cpu_in_steps(events, windows, lambda e: e.name in SYNC_OPS)
    has_gpu = any(e.cat in ("kernel", "gpu_memcpy", "cuda_runtime") for e in events)
    if has_gpu:
        api_ids = {e.args.get("External id") for e in apis} - {None}
        starts = defaultdict(list)
        for a in apis:
            starts[(a.pid, a.tid)].append(a.ts)
        for v in starts.values():
            v.sort()

        def encloses_sync(op: Event) -> bool:
            if op.args.get("External id") in api_ids:
                return True
            ts = starts.get((op.pid, op.tid), [])
            i = bisect.bisect_left(ts, op.ts - _EPS_US)
            return i < len(ts) and ts[i] <= op.end + _EPS_US
        ops = [o for o in ops if encloses_sync(o)]
    top = _top_level(apis + ops)
    return len(top), sum(e.dur for e in top)


def loader_wait_us(events: list[Event], windows: list[tuple[float, float]]) -> float:
    """Total time inside ``enumerate(DataLoader)#...DataLoaderIter.__next__`` within the steps."""
    evs = _cpu_in_steps(events, windows, lambda e: e.name.startswith(LOADER_PREFIX) and e.name.endswith(LOADER_SUFFIX))
    return sum(e.dur for e in _top_level(evs))


def h2d_copies(events: list[Event], window: tuple[float, float]) -> dict:
    """Host-to-device copies starting inside ``window``: count, bytes, time (us) and counts
    by source memory (``Pageable``/``Pinned``, from the event name ``Memcpy HtoD (X -> Device)``)."""
    out = {"count": 0, "bytes": 0, "time_us": 0.0, "by_source": {}}
    for e in events:
        if e.cat == "gpu_memcpy" and "HtoD" in e.name and window[0] <= e.ts <= window[1]:
            out["count"] += 1
            out["bytes"] += int(e.args.get("bytes", 0) or 0)
            out["time_us"] += e.dur
            src = e.name.split("(", 1)[1].split("->")[0].strip() if "(" in e.name and "->" in e.name else "unknown"
            out["by_source"][src] = out["by_source"].get(src, 0) + 1
    return out


@dataclass
class OpStat:
    name: str
    calls: int
    total_ms: float
    share: float  # of all kernel time (GPU) or all op self time (CPU)


def top_kernels(events: list[Event], window: tuple[float, float], k: int = 5) -> list[OpStat]:
    """GPU kernels by total device time (sum of durations, so concurrent kernels both count)."""
    tot: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.cat == "kernel" and e.end > window[0] and e.ts < window[1]:
            tot[e.name][0] += 1
            tot[e.name][1] += e.dur
    return _rank(tot, k)


def top_cpu_ops(events: list[Event], windows: list[tuple[float, float]], k: int = 5) -> list[OpStat]:
    """CPU operators by self time (own duration minus enclosed operators on the same thread)."""
    ops = _cpu_in_steps(events, windows, lambda e: e.cat == "cpu_op" and not e.name.startswith(STEP_PREFIX))
    tot: dict[str, list] = defaultdict(lambda: [0, 0.0])
    by_thread: dict[Any, list[Event]] = defaultdict(list)
    for e in ops:
        by_thread[(e.pid, e.tid)].append(e)
    for evs in by_thread.values():
        stack: list[list] = []  # [event, self_us]
        for e in sorted(evs, key=lambda e: (e.ts, -e.dur)):
            while stack and stack[-1][0].end <= e.ts:
                done = stack.pop()
                tot[done[0].name][1] += done[1]
            if stack and e.end <= stack[-1][0].end + _EPS_US:
                stack[-1][1] -= e.dur
            stack.append([e, e.dur])
            tot[e.name][0] += 1
        for done in stack:
            tot[done[0].name][1] += done[1]
    return _rank(tot, k)


def _rank(tot: dict[str, list], k: int) -> list[OpStat]:
    total = sum(v[1] for v in tot.values()) or 1.0
    ranked = sorted(tot.items(), key=lambda kv: -kv[1][1])[:k]
    return [OpStat(n, c, t / 1e3, t / total) for n, (c, t) in ranked]


def matmul_share(events: list[Event], window: tuple[float, float]) -> float | None:
    """Fraction of kernel time in matmul/conv/attention kernels (by name; see MATMUL_HINTS)."""
    mm = total = 0.0
    for e in events:
        if e.cat == "kernel" and e.end > window[0] and e.ts < window[1]:
            total += e.dur
            if any(h in e.name.lower() for h in MATMUL_HINTS):
                mm += e.dur
    return mm / total if total else None
