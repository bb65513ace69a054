"""A profiled loop's per-step numbers and a plain-language diagnosis of where its time goes.

``summarize(trace)`` reads a trace (anything ``utils/diagnosis/trace_events.py``'s ``load_events``
reads), turns the measures of ``utils/diagnosis/trace_metrics.py`` into per-step numbers
(:class:`ProfileSummary`) and names the bottleneck with :func:`diagnose`'s rules, one of
:data:`BOTTLENECKS`. :meth:`ProfileSummary.evidence` is the summary without its verdict, the
numbers alone, as phase 1 hands them to the diagnosis a learner writes.

Why hand-written: Holistic Trace Analysis (``pip install HolisticTraceAnalysis``) computes a
similar temporal breakdown (idle / compute / non-compute) but needs pandas and a trace
directory, and gives no data-loader, sync or launch counts per step and no diagnosis; a few
hundred lines on plain dicts are easier for a learner to read and for tests to pin down.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from utils.diagnosis.trace_events import KINETO_CATS, load_events
from utils.diagnosis.trace_metrics import (
    OpStat,
    analysis_window,
    count_launches,
    gpu_busy_us,
    gpu_idle_fraction,
    h2d_copies,
    host_syncs,
    loader_wait_us,
    matmul_share,
    step_windows,
    top_cpu_ops,
    top_kernels,
)

# Thresholds of the diagnosis. They are rules of thumb chosen for teaching, not measured
# constants; each is a fraction of the step where fixing that one thing alone is worth it.
LOADER_WAIT_FRACTION = 0.20  # >= 1/5 of a step waiting on data: removing it is >= 1.25x (Amdahl)
H2D_TIME_FRACTION = 0.20  # the same bar for host-to-device copy time
GPU_IDLE_FRACTION = 0.30  # GPU idle >= 30%: >= 1.43x is on the host side; below, the kernels dominate
MATMUL_SHARE = 0.50  # busy GPU, matmul-class kernels >= half of kernel time: compute-bound
# The verdicts of diagnose, in the order its rules are tried.
BOTTLENECKS = ("data-loading-bound", "copy-bound", "host-sync-bound", "overhead-bound (launch/Python)",
               "idle GPU, cause not named", "compute-bound", "memory-bound", "cpu-bound (no GPU in the trace)")
VERDICT_FIELDS = ("diagnosis", "explanation", "suggestion", "findings")

_SUGGEST = {
    "data-loading-bound": "Feed the GPU in parallel: DataLoader(num_workers=4 or more, pin_memory=True, "
                          "persistent_workers=True), move heavy per-sample work out of __getitem__ (or onto "
                          "the GPU, batched), then profile again.",
    "copy-bound": "Pin the host batch (DataLoader pin_memory=True) and copy with .to(device, non_blocking=True) so "
                  "copies overlap compute; copy fewer, larger tensors; keep a dataset that fits on the GPU there.",
    "host-sync-bound": "Take .item(), .cpu(), print(loss) and Python if-tests on GPU values out of the step: "
                       "accumulate the loss on the GPU and read it every N steps.",
    "overhead-bound (launch/Python)": "Give each launch more work: a larger batch, torch.compile to fuse kernels, "
                                      "CUDA graphs (torch.compile(mode='reduce-overhead')), a fused optimizer "
                                      "(AdamW(fused=True)).",
    "memory-bound": "Move fewer bytes per FLOP: mixed precision (bf16 autocast; fp16 with a GradScaler on a T4), "
                    "torch.compile to fuse elementwise ops, larger matmuls; place the kernels on the roofline "
                    "with utils.measure.flops.",
    "compute-bound": "The GPU is doing math most of the time. Next: bf16 autocast (tensor cores), TF32 for fp32 "
                     "matmuls, and compare achieved FLOP/s with the peak (MFU, utils.measure.flops).",
    "idle GPU, cause not named": "Open the trace (trace_path) in Perfetto and look at what the CPU does in the gaps "
                                 "between kernels: allocator calls (cudaMalloc/cudaFree), blocking cudaMemcpy calls, "
                                 "or several smaller waits adding up.",
    "cpu-bound (no GPU in the trace)": "Nothing ran on a GPU: the top CPU ops are where the host time goes. "
                                       "Profile on a GPU to see the GPU-side picture.",
}


@dataclass
class ProfileSummary:
    """Per-step numbers of a profiled loop and a plain-language diagnosis (see module docs)."""
    device: str  # "cuda" when the trace has GPU kernels, else "cpu"
    steps: int
    step_time_ms: float  # wall span of the steps (analysis_window) / steps
    cpu_step_ms: float  # mean CPU duration of one ProfilerStep
    gpu_idle_fraction: float | None
    gpu_busy_ms_per_step: float | None
    mean_kernel_us: float | None
    matmul_share: float | None
    loader_wait_ms_per_step: float
    loader_wait_fraction: float
    h2d_copies_per_step: float
    h2d_bytes_per_step: float
    h2d_ms_per_step: float
    h2d_copies_by_source: dict
    launches_per_step: float
    host_syncs_per_step: float
    sync_wait_ms_per_step: float
    cpu_work_ms_per_step: float  # cpu_step_ms minus loader wait and sync wait
    top_label: str
    top: list[OpStat]
    diagnosis: str = ""
    explanation: str = ""
    suggestion: str = ""
    findings: list[str] = field(default_factory=list)
    trace_path: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ProfileSummary:
        """The summary :meth:`to_dict` wrote (a record's, a saved JSON's); a one-line ValueError
        for a dict that is not one."""
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or not names - set(VERDICT_FIELDS) - {"trace_path"} <= set(d):
            got = sorted(d)[:6] if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"not a ProfileSummary dict (to_dict()): it lacks some of its numbers, got {got}")
        try:
            top = [OpStat(**t) if isinstance(t, dict) else t for t in d["top"]]
        except TypeError as exc:
            raise ValueError(f"ProfileSummary dict: 'top' must be a list of OpStat dicts ({exc})") from None
        return cls(**{**{k: v for k, v in d.items() if k in names}, "top": top})

    def evidence(self) -> ProfileSummary:
        """A copy with the verdict left out (diagnosis, explanation, suggestion and findings
        empty, no trace path): the numbers a diagnosis is made from, and nothing to copy."""
        return replace(self, diagnosis="", explanation="", suggestion="", findings=[], trace_path=None,
                       top=list(self.top), h2d_copies_by_source=dict(self.h2d_copies_by_source))

    def __str__(self) -> str:
        lines = [f"Profile of {self.steps} steps on {self.device}: {self.step_time_ms:.2f} ms/step",
                 f"  diagnosis: {self.diagnosis}", f"  {self.explanation}", f"  fix: {self.suggestion}"]
        if len(self.findings) > 1:
            lines.append("  also over threshold: " + ", ".join(self.findings[1:]))
        gpu = (f"GPU idle {self.gpu_idle_fraction:.0%}, busy {self.gpu_busy_ms_per_step:.2f} ms/step | "
               if self.gpu_idle_fraction is not None else "")
        src = ", ".join(f"{k.lower()} {v / self.steps:g}" for k, v in self.h2d_copies_by_source.items())
        lines.append(f"  {gpu}loader wait {self.loader_wait_ms_per_step:.2f} ms/step ({self.loader_wait_fraction:.0%})"
                     f" | host syncs {self.host_syncs_per_step:g}/step ({self.sync_wait_ms_per_step:.2f} ms)"
                     f" | launches {self.launches_per_step:g}/step")
        lines.append(f"  host-to-device copies {self.h2d_copies_per_step:g}/step, {self.h2d_bytes_per_step / 1e6:.3g} MB, "
                     f"{self.h2d_ms_per_step:.3f} ms" + (f" ({src})" if src else ""))
        lines.append(f"  top {self.top_label}:")
        lines += [f"    {s.share:6.1%} {s.total_ms:9.3f} ms x{s.calls:<5d} {s.name[:90]}" for s in self.top]
        return "\n".join(lines)


def diagnose(s: ProfileSummary) -> tuple[str, str, str, list[str]]:
    """(diagnosis, explanation, suggestion, findings) from a summary's numbers.

    Every rule over its threshold is a finding; the diagnosis is the first in this order:
    data-loading, copies, host syncs, overhead, then (GPU busy) compute vs memory. Data supply
    comes first because no kernel fix helps a GPU that has no input; a sync is a one-line fix;
    overhead needs restructuring. With the GPU idle >= GPU_IDLE_FRACTION, the CPU's own work per
    step (step minus loader and sync waits) decides: if it is at least the GPU's busy time the
    host cannot keep the GPU fed even without syncs (overhead-bound); if it is less and there is
    a sync per step, the syncs drain the queue and the GPU waits each time the CPU restarts
    (host-sync-bound). Compute- vs memory-bound is a kernel-name heuristic (MATMUL_SHARE),
    not a hardware counter: confirm with the roofline in ``utils.measure.flops``."""
    step = s.step_time_ms or 1e-9
    h2d_frac = s.h2d_ms_per_step / step
    found: list[str] = []
    if s.loader_wait_fraction >= LOADER_WAIT_FRACTION:
        found.append("data-loading-bound")
    if h2d_frac >= H2D_TIME_FRACTION:
        found.append("copy-bound")
    gpu = s.gpu_idle_fraction is not None
    if gpu and s.gpu_idle_fraction >= GPU_IDLE_FRACTION:
        if s.host_syncs_per_step >= 1 and s.cpu_work_ms_per_step < s.gpu_busy_ms_per_step:
            found.append("host-sync-bound")
        elif s.cpu_work_ms_per_step >= s.gpu_busy_ms_per_step:
            found.append("overhead-bound (launch/Python)")
        elif not found:
            found.append("idle GPU, cause not named")
    elif gpu:
        found.append("compute-bound" if (s.matmul_share or 0) >= MATMUL_SHARE else "memory-bound")
    elif not found:
        found.append("cpu-bound (no GPU in the trace)")
    d = found[0]
    idle = (f" The GPU sat idle {s.gpu_idle_fraction:.0%} of the time." if gpu
            else " (CPU-only trace: on a GPU this wait would leave it idle.)")
    if d == "data-loading-bound":
        why = (f"Each {step:.2f} ms step waited {s.loader_wait_ms_per_step:.2f} ms for its next batch "
               f"({s.loader_wait_fraction:.0%}, threshold {LOADER_WAIT_FRACTION:.0%}) in the DataLoader's __next__."
               f"{idle} No compute is issued while the loop waits for data.")
    elif d == "copy-bound":
        why = (f"Host-to-device copies took {s.h2d_ms_per_step:.2f} ms of each {step:.2f} ms step ({h2d_frac:.0%}, "
               f"threshold {H2D_TIME_FRACTION:.0%}), {s.h2d_copies_per_step:g} copies of "
               f"{s.h2d_bytes_per_step / 1e6:.3g} MB.{idle} Pageable memory is staged by the driver and cannot "
               "overlap compute.")
    elif d == "host-sync-bound":
        why = (f"The GPU sat idle {s.gpu_idle_fraction:.0%} of the time (threshold {GPU_IDLE_FRACTION:.0%}) although "
               f"the CPU's own work, {s.cpu_work_ms_per_step:.2f} ms/step, is less than the GPU's "
               f"{s.gpu_busy_ms_per_step:.2f} ms/step: the {s.host_syncs_per_step:g} host syncs per step "
               f"(waiting {s.sync_wait_ms_per_step:.2f} ms) empty the GPU's queue, and it waits while the CPU "
               "launches the next step.")
    elif d.startswith("overhead"):
        mk = f" averaging {s.mean_kernel_us:.1f} us" if s.mean_kernel_us is not None else ""
        why = (f"The GPU sat idle {s.gpu_idle_fraction:.0%} of the time (threshold {GPU_IDLE_FRACTION:.0%}): the "
               f"CPU spends {s.cpu_work_ms_per_step:.2f} ms per step issuing {s.launches_per_step:g} launches of "
               f"kernels{mk}, which keep the GPU busy only {s.gpu_busy_ms_per_step:.2f} ms. Python and launch "
               "overhead, not the kernels, set the pace.")
    elif d == "idle GPU, cause not named":
        why = (f"The GPU sat idle {s.gpu_idle_fraction:.0%} of the time (threshold {GPU_IDLE_FRACTION:.0%}), yet the "
               f"CPU's own work ({s.cpu_work_ms_per_step:.2f} ms/step) is below the GPU's busy time "
               f"({s.gpu_busy_ms_per_step:.2f} ms/step), there is no sync per step, and the loader wait "
               f"({s.loader_wait_fraction:.0%}) and copies ({h2d_frac:.0%}) are under their thresholds.")
    elif d in ("compute-bound", "memory-bound"):
        kind = "matmul/convolution/attention" if d == "compute-bound" else "elementwise, reduction and copy-like"
        share = s.matmul_share or 0.0
        why = (f"The GPU was busy {1 - s.gpu_idle_fraction:.0%} of the time (idle under {GPU_IDLE_FRACTION:.0%}), "
               f"so the host keeps up; {share:.0%} of kernel time is in matmul-class kernels (threshold "
               f"{MATMUL_SHARE:.0%}), so most time goes to {kind} kernels.")
    else:
        why = (f"No GPU kernels in the trace; each step took {s.cpu_step_ms:.2f} ms of CPU time, "
               f"{s.loader_wait_fraction:.0%} of it waiting for data.")
        if s.host_syncs_per_step:
            why += f" {s.host_syncs_per_step:g} .item() calls per step would each be a host sync on a GPU."
    return d, why, _SUGGEST[d], found


def summarize(source: Any, steps: int | None = None, top: int = 5) -> ProfileSummary:
    """Summarise a trace (anything :func:`load_events` reads) as per-step numbers.

    ``steps`` defaults to the number of ``ProfilerStep#N`` annotations; a trace without them
    (a profile with no schedule) needs ``steps`` to turn totals into per-step numbers."""
    events = load_events(source)
    if not events:
        raise ValueError("the trace holds no events with a duration (only metadata, flows or instants?): "
                         "export it with prof.export_chrome_trace(path) after the profiled steps")
    if not any(e.cat in KINETO_CATS for e in events):
        cats = sorted({e.cat for e in events})[:5]
        raise ValueError(f"not a PyTorch profiler trace: none of its {len(events)} events has a torch.profiler "
                         f"category (cpu_op, kernel, user_annotation...; found {cats}); JAX/TensorBoard and other "
                         "Chrome traces are not supported")
    windows = step_windows(events)
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if windows and steps is not None and steps != len(windows):
        raise ValueError(f"steps={steps} but the trace holds {len(windows)} ProfilerStep annotations; "
                         "leave steps out to use the annotations")
    if not windows and steps is None:
        raise ValueError("the trace has no ProfilerStep#N annotations (no schedule / prof.step()); "
                         "pass steps=N, the number of training steps it covers")
    n = len(windows) or steps
    window = analysis_window(events, windows)
    span_ms = (window[1] - window[0]) / 1e3
    cpu_step_ms = (sum(e - s for s, e in windows) / 1e3 / n) if windows else span_ms / n
    busy = gpu_busy_us(events, window)
    kernels = [e for e in events if e.cat == "kernel" and e.end > window[0] and e.ts < window[1]]
    gpu = bool(busy)
    loader_ms = loader_wait_us(events, windows) / 1e3 / n
    n_sync, sync_us = host_syncs(events, windows)
    h2d = h2d_copies(events, window)
    s = ProfileSummary(
        device="cuda" if gpu else "cpu", steps=n, step_time_ms=span_ms / n, cpu_step_ms=cpu_step_ms,
        gpu_idle_fraction=gpu_idle_fraction(events, window),
        gpu_busy_ms_per_step=(sum(busy.values()) / len(busy) / 1e3 / n) if gpu else None,
        mean_kernel_us=(sum(e.dur for e in kernels) / len(kernels)) if kernels else None,
        matmul_share=matmul_share(events, window),
        loader_wait_ms_per_step=loader_ms, loader_wait_fraction=loader_ms / (span_ms / n) if span_ms else 0.0,
        h2d_copies_per_step=h2d["count"] / n, h2d_bytes_per_step=h2d["bytes"] / n,
        h2d_ms_per_step=h2d["time_us"] / 1e3 / n, h2d_copies_by_source=h2d["by_source"],
        launches_per_step=count_launches(events, windows) / n,
        host_syncs_per_step=n_sync / n, sync_wait_ms_per_step=sync_us / 1e3 / n,
        cpu_work_ms_per_step=max(0.0, cpu_step_ms - loader_ms - sync_us / 1e3 / n),
        top_label="GPU kernels by total device time" if gpu else "CPU ops by self time (no GPU kernels in the trace)",
        top=top_kernels(events, window, top) if gpu else top_cpu_ops(events, windows, top),
    )
    s.diagnosis, s.explanation, s.suggestion, s.findings = diagnose(s)
    return s
