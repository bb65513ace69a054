"""Profiles of loops with a known bottleneck, for grading a diagnosis someone else wrote.

Phase 1's learner writes ``diagnose(summary)``, the rules of :func:`utils.diagnosis.profile_diagnosis.diagnose`
in their own code; the grader runs it on summaries of loops the learner has not seen. Two kinds,
each a :class:`~utils.diagnosis.profile_diagnosis.ProfileSummary` without its verdict
(:meth:`~utils.diagnosis.profile_diagnosis.ProfileSummary.evidence`), whose right answer is the course's
rule on its numbers:

- :func:`synthetic`: numbers drawn afresh for one verdict, each kept only if every quantity a
  rule reads is far from that rule's threshold (:func:`clear_of_thresholds`), so any reading of
  the rules gives the same verdict;
- :func:`variants`: a real profile with one cause made unmistakable (a long DataLoader wait,
  long copies), so that a verdict that ignores the numbers cannot match them all;
- :func:`profiled`: real profiles (``utils.diagnosis.profiling.profile_steps``) of small loops built to be
  input-bound, copy-bound, sync-bound, launch-bound, compute-bound or memory-bound on a GPU; on a
  CPU, where a trace has no GPU timeline, input-bound and plain CPU work.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from utils.device import rehearsal
from utils.diagnosis import profile_diagnosis as D
from utils.diagnosis.profiling import profile_steps
from utils.diagnosis.trace_metrics import OpStat

SYNTHETIC = D.BOTTLENECKS  # every verdict has synthetic cases
LOADER_MARGIN = 0.10  # a drawn loader-wait or copy share stays 0.10 away from its 0.20 threshold
IDLE_MARGIN = 0.10  # GPU idle 0.10 away from 0.30
MATMUL_MARGIN = 0.15  # matmul share 0.15 away from 0.50
RATIO_BAND = (0.7, 1.4)  # CPU work / GPU busy time is kept outside this band around 1
_MATMUL_KERNEL, _OTHER_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "void at::native::vectorized_elementwise_kernel<4>"


# -- synthetic summaries --------------------------------------------------------------------------

def clear_of_thresholds(s: D.ProfileSummary) -> bool:
    """Whether every number a rule of ``diagnose`` reads is well clear of its threshold."""
    step = s.step_time_ms or 1e-9
    if abs(s.loader_wait_fraction - D.LOADER_WAIT_FRACTION) < LOADER_MARGIN:
        return False
    if abs(s.h2d_ms_per_step / step - D.H2D_TIME_FRACTION) < LOADER_MARGIN:
        return False
    if s.gpu_idle_fraction is None:
        return True
    ratio = s.cpu_work_ms_per_step / max(s.gpu_busy_ms_per_step, 1e-9)
    return (abs(s.gpu_idle_fraction - D.GPU_IDLE_FRACTION) >= IDLE_MARGIN
            and abs((s.matmul_share or 0.0) - D.MATMUL_SHARE) >= MATMUL_MARGIN
            and not RATIO_BAND[0] < ratio < RATIO_BAND[1] and not 0.5 < s.host_syncs_per_step < 1)


def _draw(label: str, r: random.Random) -> D.ProfileSummary:
    """One summary whose numbers lean towards ``label`` (checked by the caller)."""
    u = r.uniform
    gpu = label != "cpu-bound (no GPU in the trace)" and not (label == "data-loading-bound" and r.random() < 0.3)
    step, steps = u(4.0, 120.0), r.choice((3, 5, 10))
    loader = u(0.35, 0.8) if label == "data-loading-bound" else u(0.0, 0.08)
    h2d = (u(0.35, 0.7) if label == "copy-bound" else u(0.0, 0.08)) if gpu else 0.0  # a CPU trace has no copies
    idle = {"compute-bound": u(0.0, 0.15), "memory-bound": u(0.0, 0.15), "overhead-bound (launch/Python)": u(0.6, 0.9)
            }.get(label, u(0.4, 0.7))
    ratio = u(1.8, 2.4) if label == "overhead-bound (launch/Python)" else u(0.15, 0.6)
    syncs = {"host-sync-bound": r.choice((1, 2, 4)), "copy-bound": r.choice((1, 2)),
             "idle GPU, cause not named": r.choice((0, 0.5))}.get(label, r.choice((0, 1, 3)))
    mm = {"compute-bound": u(0.7, 0.97), "memory-bound": u(0.03, 0.3)}.get(label, u(0.05, 0.95))
    busy = (1 - idle) * step
    cpu_work = min(ratio * busy, (0.95 - loader) * step) if gpu else u(0.5, 0.9) * (1 - loader) * step
    sync_wait = min(u(0.5, 0.95) * busy, max(0.0, (0.97 - loader) * step - cpu_work)) if gpu and syncs else 0.0
    launches = r.randint(200, 3000) if label == "overhead-bound (launch/Python)" else r.randint(20, 600)
    kernels = [OpStat(_MATMUL_KERNEL, launches // 4 * steps, round(mm * busy * steps, 3), round(mm, 3)),
               OpStat(_OTHER_KERNEL, launches // 2 * steps, round((1 - mm) * busy * steps, 3), round(1 - mm, 3))]
    top = (sorted(kernels, key=lambda o: -o.share) if gpu else
           [OpStat("aten::addmm", 3 * steps, round(0.6 * cpu_work * steps, 3), 0.6),
            OpStat("aten::mm", 2 * steps, round(0.3 * cpu_work * steps, 3), 0.3)])
    copies = r.choice((1, 2, 4)) if h2d > 0.2 else r.choice((0, 1)) if gpu else 0
    return D.ProfileSummary(
        device="cuda" if gpu else "cpu", steps=steps, step_time_ms=step,
        cpu_step_ms=loader * step + cpu_work + sync_wait, gpu_idle_fraction=idle if gpu else None,
        gpu_busy_ms_per_step=busy if gpu else None, mean_kernel_us=(busy * 1e3 / launches) if gpu else None,
        matmul_share=mm if gpu else None, loader_wait_ms_per_step=loader * step, loader_wait_fraction=loader,
        h2d_copies_per_step=copies, h2d_bytes_per_step=copies * r.choice((1 << 20, 16 << 20, 64 << 20)),
        h2d_ms_per_step=h2d * step, h2d_copies_by_source={"Pageable": copies * steps} if copies else {},
        launches_per_step=launches if gpu else 0, host_syncs_per_step=syncs, sync_wait_ms_per_step=sync_wait,
        cpu_work_ms_per_step=cpu_work,
        top_label="GPU kernels by total device time" if gpu else "CPU ops by self time (no GPU kernels in the trace)",
        top=top)


def synthetic(label: str, rng: random.Random | int | None = None) -> D.ProfileSummary:
    """A summary without its verdict, whose numbers give ``label`` by the course's rules with
    every quantity clear of its threshold. ``rng``: a ``random.Random`` or a seed (None: fresh)."""
    if label not in SYNTHETIC:
        raise ValueError(f"no synthetic case for {label!r}; one of: {', '.join(SYNTHETIC)}")
    r = rng if isinstance(rng, random.Random) else random.Random(rng)
    for _ in range(1000):
        s = _draw(label, r)
        if D.diagnose(s)[0] == label and clear_of_thresholds(s):
            return s.evidence()
    raise RuntimeError(f"no clear-cut {label!r} summary in 1000 draws: the draw ranges no longer fit the rules")


def synthetic_cases(seed: int | None = None, per_label: int = 2) -> list[tuple[str, D.ProfileSummary]]:
    """``per_label`` synthetic cases of every verdict, shuffled, named ``"drawn case i"`` (a name
    that does not give the verdict away)."""
    r = random.Random(seed)
    cases = [synthetic(label, r) for label in SYNTHETIC for _ in range(per_label)]
    r.shuffle(cases)
    return [(f"drawn case {i + 1}", s) for i, s in enumerate(cases)]


def variants(s: D.ProfileSummary) -> list[tuple[str, D.ProfileSummary]]:
    """``s`` with one cause made unmistakable, without its verdict: its DataLoader wait raised
    to 60% of the step, and its copies raised to 50% with no loader wait. A diagnosis that reads
    the numbers moves with them; one that returns the same answer whatever it is given cannot."""
    step = s.step_time_ms
    return [("with its DataLoader wait at 60% of the step",
             replace(s.evidence(), loader_wait_fraction=0.6, loader_wait_ms_per_step=0.6 * step)),
            ("with its host-to-device copies at 50% of the step and no DataLoader wait",
             replace(s.evidence(), loader_wait_fraction=0.0, loader_wait_ms_per_step=0.0, h2d_ms_per_step=0.5 * step))]


# -- small loops, each made to be one kind of bound -------------------------------------------------

def _mlp(device: Any, width: int = 64):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def input_bound(device: Any, sleep_s: float = 0.003, batch: int = 4) -> Callable[[], None]:
    """A DataLoader in the main process whose samples take ``sleep_s`` each to make (a slow
    decoder): the step waits ``batch x sleep_s`` for data and computes a tiny MLP."""
    import torch

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 1 << 20

        def __getitem__(self, i):
            time.sleep(sleep_s)
            return torch.full((64,), float(i % 7)), torch.ones(1)

    model, opt = _mlp(device)
    it = iter(torch.utils.data.DataLoader(Slow(), batch_size=batch))

    def step():
        x, y = (t.to(device) for t in next(it))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def cpu_work(device: Any = "cpu", batch: int = 64) -> Callable[[], None]:
    """A small MLP trained on batches already in memory: no loader, no copies (CPU-bound on a CPU)."""
    import torch

    model, opt = _mlp(device, 256)
    x, y = torch.randn(batch, 256, device=device), torch.randn(batch, 1, device=device)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _matmuls(device: Any, n: int = 4096, gpu_ms: float = 10.0):
    """``reps`` half-precision ``n x n`` matmuls, ``reps`` chosen to take about ``gpu_ms`` here."""
    import torch

    dtype = rehearsal.half_torch_dtype(torch.device(device).index or 0)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):  # the last of three: clocks up, cuBLAS warmed
        start.record()
        a @ b
        end.record()
        end.synchronize()
    reps = max(1, round(gpu_ms / max(start.elapsed_time(end), 1e-3)))

    def work():
        for _ in range(reps):
            c = a @ b
        return c
    return work


def sync_bound(device: Any, host_share: float = 0.65) -> Callable[[], None]:
    """About 10 ms of matmuls, a ``.item()`` after them, and before the next launch CPU work
    lasting ``host_share`` of the GPU time the last step measured (CUDA events): each sync
    drains the GPU's queue, and the GPU waits while the CPU prepares the next step."""
    import torch

    work = _matmuls(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    last = {"gpu_s": 0.0}

    def step():
        t_end = time.perf_counter() + host_share * last["gpu_s"]
        while time.perf_counter() < t_end:  # preparing the next step on the host: nothing is queued
            pass
        start.record()
        c = work()
        end.record()
        c[0, 0].item()
        last["gpu_s"] = start.elapsed_time(end) / 1e3
    return step


def launch_bound(device: Any, ops: int = 400) -> Callable[[], None]:
    """``ops`` adds on a one-element tensor: each a kernel launch doing almost nothing."""
    import torch

    t = torch.zeros(1, device=device)

    def step():
        x = t
        for _ in range(ops):
            x = x + 1
    return step


def compute_bound(device: Any) -> Callable[[], None]:
    """Half-precision ``4096^2`` matmuls, about 5 ms of them, queued back to back with no sync."""
    work = _matmuls(device, gpu_ms=5.0)

    def step():
        work()
    return step


def memory_bound(device: Any, numel: int = 1 << 26, ops: int = 8) -> Callable[[], None]:
    """``ops`` in-place multiplies over ``numel`` fp32 elements queued back to back, no sync."""
    import torch

    x = torch.ones(numel, device=device)

    def step():
        for _ in range(ops):
            x.mul_(1.0)
    return step


def copy_bound(device: Any, nbytes: int = 64 << 20) -> Callable[[], None]:
    """A pageable host tensor of ``nbytes`` copied to the GPU each step, then one small kernel."""
    import torch

    host = torch.ones(nbytes // 4)

    def step():
        (host.to(device) + 1).sum()
    return step


# named by what each loop does, not by the verdict it was built for
LOOPS_GPU = {"slow-dataset loop": input_bound, "pageable-copy loop": copy_bound, "item()-per-step loop": sync_bound,
             "tiny-adds loop": launch_bound, "matmul loop": compute_bound, "elementwise loop": memory_bound}
LOOPS_CPU = {"slow-dataset loop": input_bound, "in-memory MLP loop": cpu_work}


def profiled(device: Any = None, steps: int = 3) -> list[tuple[str, D.ProfileSummary, str]]:
    """``(name, summary without its verdict, the course's verdict)`` for each loop of this
    device (:data:`LOOPS_GPU` with a GPU, :data:`LOOPS_CPU` without), profiled here and now."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loops = LOOPS_GPU if str(device).startswith("cuda") else LOOPS_CPU
    out = []
    for name, build in loops.items():
        s = profile_steps(build(device), steps=steps, warmup=1, wait=1)
        out.append((name, s.evidence(), s.diagnosis))
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
    return out
