"""Which GPU each grading job measures on: one job per GPU unless sharing is asked for.

Two kernels timing kernels on one GPU slow each other down, and both submissions are then
graded against disturbed numbers. So measured grading runs at most one job per visible GPU,
each worker pinned to its own (``CUDA_VISIBLE_DEVICES`` set to that one device, as Slurm and
Kubernetes' device plugin do for a job given one GPU). ``--share-gpus`` allows more jobs than
GPUs; each result then records that its GPU was shared. Without a GPU (smoke mode) jobs are
free: the grader's CPU bands are wide and kernels get one thread each (``grader/batch.py``).
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


class GpuPlanError(Exception):
    """More jobs than GPUs without ``--share-gpus``; one line."""


def visible_devices() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: that
    variable's own entries when it is set, else ``0 .. n-1`` for the n GPUs torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        n = 0
    if n == 0:
        return []
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()][:n]
    return [str(i) for i in range(n)]


_PROBE = ("import json; from grader.gpus import visible_devices; from utils.course.env import smoke_mode; "
          "print(json.dumps({'smoke': smoke_mode(), 'devices': visible_devices()}))")


class Probe:
    """Smoke mode and :func:`visible_devices`, learned by the same functions in a child process.

    Both import torch (1.8 s of ``python -m grader check``'s own process on the 2-core CI machine,
    cProfile of lab 04's check), and a grading needs them only once the course is released; in a
    process of its own, torch's import runs on the other core meanwhile. Started by
    :func:`grader.batch.grade_batch`, read with :meth:`result`; where the child fails, the answer is
    worked out in this process instead."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env, text=True)

    def result(self, timeout_s: float = 120.0) -> tuple[bool, list[str]]:
        """``(smoke, devices)``."""
        try:
            out, _ = self._proc.communicate(timeout=timeout_s)
            got = json.loads(out.strip().splitlines()[-1]) if self._proc.returncode == 0 and out.strip() else None
        except (subprocess.TimeoutExpired, ValueError):
            self._proc.kill()
            self._proc.wait()
            got = None
        if not (isinstance(got, dict) and isinstance(got.get("smoke"), bool) and isinstance(got.get("devices"), list)):
            from utils.course.env import smoke_mode

            return smoke_mode(), visible_devices()
        return got["smoke"], [str(d) for d in got["devices"]]

    def close(self) -> None:
        """Stop the child if it is still running (a grading that failed before it asked)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@dataclass
class GpuPlan:
    jobs: int
    devices: list[str]  # empty: no GPU, nothing pinned
    shared: bool = False
    _pool: queue.Queue = field(default_factory=queue.Queue, repr=False)

    def __post_init__(self) -> None:
        slots = -(-self.jobs // len(self.devices)) if self.devices else 0
        for _ in range(slots):
            for d in self.devices:
                self._pool.put(d)

    @contextmanager
    def device(self):
        """A device for one worker, held while it runs (None without a GPU)."""
        if not self.devices:
            yield None
            return
        d = self._pool.get()
        try:
            yield d
        finally:
            self._pool.put(d)

    def note(self) -> str | None:
        if self.shared:
            return (f"graded on a GPU shared with other submissions' grading ({self.jobs} jobs on "
                    f"{len(self.devices)} GPU{'s' if len(self.devices) > 1 else ''}): measured numbers may be low")
        return None


def plan(jobs: int | None, share: bool = False, devices: list[str] | None = None) -> GpuPlan:
    """The jobs and devices for a batch: ``jobs`` None means one per GPU (1 without a GPU)."""
    devices = visible_devices() if devices is None else devices
    if not devices:
        return GpuPlan(jobs or 1, [])
    n = len(devices)
    jobs = jobs or n
    if jobs > n and not share:
        raise GpuPlanError(f"--jobs {jobs} on {n} GPU{'s' if n > 1 else ''} would grade two submissions on one GPU at "
                           "once and disturb both measurements: use --jobs "
                           f"{n} (the default), or --share-gpus to allow it")
    return GpuPlan(jobs, devices, shared=jobs > n)
