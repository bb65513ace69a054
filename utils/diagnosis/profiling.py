"""Running the PyTorch profiler on a training loop: where does a training step's time go?

``profile_steps(step_fn)`` runs a step function under ``torch.profiler.profile`` with a
schedule (skip ``wait`` steps, profile ``warmup`` steps and throw them away, then record
``steps`` steps) and returns a :class:`utils.diagnosis.profile_diagnosis.ProfileSummary`, which says
in plain language what bounds the step. The rest is pure functions of the trace it writes:
reading it (``utils/diagnosis/trace_events.py``), the measures (``utils/diagnosis/trace_metrics.py``), the
summary and its diagnosis (``utils/diagnosis/profile_diagnosis.py``, whose ``summarize`` also reads a
saved trace).

Note: torch 2.13's Kineto prints ``USDT: ... profiler_start``/``profiler_stop`` lines on
stderr. In an nbgrader test cell any stderr costs the points: profile in an ordinary cell, or
set ``KINETO_LOG_LEVEL=6`` before the first profile (it also hides Kineto's errors).
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from utils.diagnosis.profile_diagnosis import ProfileSummary, summarize


def make_profiler(*, wait: int = 1, warmup: int = 2, active: int = 5, cuda: bool | None = None,
                  record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                  on_trace_ready: Callable | None = None):
    """A ``torch.profiler.profile`` with a one-cycle schedule: ``wait`` steps off, ``warmup``
    steps traced and discarded (lazy init, cuBLAS heuristics, allocator growth), ``active``
    steps recorded. CPU activity always, CUDA when a GPU is present (or ``cuda=True``).
    Shapes, memory and stacks are off by default: each adds per-op overhead that would
    inflate exactly the host-side numbers ``utils/diagnosis/trace_metrics.py`` measures. Call ``prof.step()`` at the
    end of every training step."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    for name, v, lo in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                   record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                   on_trace_ready=on_trace_ready)


def profile_steps(step_fn: Callable[[], Any], steps: int = 5, warmup: int = 2, wait: int = 1, *,
                  cuda: bool | None = None, record_shapes: bool = False, trace_path: str | os.PathLike | None = None,
                  top: int = 5) -> ProfileSummary:
    """Call ``step_fn()`` ``wait + warmup + steps`` times under :func:`make_profiler` and
    summarise the ``steps`` recorded ones. ``step_fn`` runs one whole training step, fetching
    its batch itself (``it = iter(loader); step_fn = lambda: train_step(next(it))``) so the
    DataLoader wait lands inside the step. The profiler synchronises the GPU when it stops,
    after the last step's annotation has closed, so that sync is not counted. With
    ``trace_path`` the Chrome trace is kept there (open it in Perfetto or chrome://tracing)."""
    if not callable(step_fn):
        raise ValueError(f"step_fn must be a callable that runs one training step, got {type(step_fn).__name__}")
    prof = make_profiler(wait=wait, warmup=warmup, active=steps, cuda=cuda, record_shapes=record_shapes)
    with prof:
        for _ in range(wait + warmup + steps):
            step_fn()
            prof.step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(trace_path) if trace_path else Path(tmp) / "trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        summary = summarize(path, top=top)  # one ProfilerStep annotation per recorded step
    summary.trace_path = str(path) if trace_path else None
    return summary
