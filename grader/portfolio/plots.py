"""Which of the course's figures (``utils/plots.py``) a record's answers have the data for.

Each finder reads only the record's answers (by the names the labs give them in
``grader/labs/<lab>/answers.py``) and returns a :class:`Plot` that draws from them, so the
portfolio never draws made-up data. A finder names the answers it reads (``needs``): a lab that
hands in none of them does not make that figure, and one whose record lacks them yet is told
which exercise to finish (``grader/portfolio/__init__.py``). Titles print numbers to three significant
figures, and labels that would overlap are moved apart (:func:`declutter`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from grader.portfolio.format import get, is_number, num, sig
from utils import plots

KINDS = {
    "roofline": "roofline",
    "latency_throughput": "latency against throughput",
    "scaling": "scaling",
    "memory_breakdown": "memory breakdown",
    "before_after": "before and after",
}


@dataclass
class Plot:
    kind: str  # a key of KINDS
    needs: tuple[str, ...]  # the answers it reads
    caption: str = ""
    draw: Callable[[], Any] | None = None  # returns a matplotlib Figure
    why_not: str = ""  # in the learner's words, when there is data but it cannot be drawn

    @property
    def file(self) -> str:
        return f"{self.kind}.png"


def _pos(v: Any) -> bool:
    return is_number(v) and v > 0


def roofline(ans: Mapping, fp: Mapping) -> Plot:
    """Lab 00: the kernels you placed (``kernels``: intensity, TFLOP/s) under your ceilings
    (``CEILINGS``: peak TFLOP/s, GB/s per roof), on the measured roof where you have one."""
    p = Plot("roofline", ("kernels", "CEILINGS"))
    kernels, ceilings = ans.get("kernels"), ans.get("CEILINGS")
    if not isinstance(kernels, Mapping) or not isinstance(ceilings, Mapping) or not ceilings:
        return p
    roof = "measured" if "measured" in ceilings else next(iter(ceilings))
    peak, bw = get(ceilings, roof, 0), get(ceilings, roof, 1)
    points = [(k, float(v[0]), float(v[1])) for k, v in kernels.items()
              if isinstance(v, (list, tuple)) and len(v) == 2 and _pos(v[0]) and _pos(v[1])]
    if not (_pos(peak) and _pos(bw)) or not points:
        p.why_not = "its ceilings or kernels hold a zero or a negative number, which a log-log roofline cannot show"
        return p
    title = f"Roofline ({roof} ceilings): {sig(peak)} TFLOP/s peak, {sig(bw)} GB/s"
    p.caption = (f"the kernels you measured on the roofline of your {roof} ceilings ({sig(peak)} TFLOP/s, "
                 f"{sig(bw)} GB/s); each label is its share of the roof at its intensity")
    p.draw = lambda: plots.roofline(float(peak), float(bw), points, title=title)
    return p


# (before, after, what is compared with its unit, (before label, after label)); a path's first
# step is an answer's name
PAIRS = (
    (("baseline_tps",), ("optimized_tps",), "training tokens/s", ("naive", "optimized")),
    (("decode", "eager", "tokens_per_s"), ("decode", "fast", "tokens_per_s"), "decode tokens/s", ("eager", "fast path")),
    (("static_run", "tokens_per_s"), ("cont_run", "tokens_per_s"), "batched decode tokens/s", ("static", "continuous")),
    (("lora_peak_gib",), ("qlora_peak_gib",), "fine-tuning peak GiB", ("LoRA", "QLoRA")),
    (("sync_overhead_pct",), ("async_overhead_pct",), "checkpoint overhead %", ("sync", "async")),
)
BEFORE_AFTER_NEEDS = tuple(dict.fromkeys(p[0] for pair in PAIRS for p in pair[:2]))


def before_after(ans: Mapping, fp: Mapping) -> Plot:
    """Every before/after pair of one workload the answers hold, one panel each."""
    p = Plot("before_after", BEFORE_AFTER_NEEDS)
    metrics, ticks, names = {}, [], []
    for before, after, what, labels in PAIRS:
        b, a = get(ans, *before), get(ans, *after)
        if is_number(b) and is_number(a):
            metrics[what] = (float(b), float(a))
            ticks.append(labels)
            names.append(f"{what} ({labels[0]} against {labels[1]})")
    if not metrics:
        return p

    def draw():
        fig = plots.before_after(metrics)
        for ax, labels in zip(fig.axes, ticks, strict=False):
            ax.set_xticks([0, 1], list(labels))
        return fig

    p.caption, p.draw = "before and after: " + "; ".join(names), draw
    return p


def memory_breakdown(ans: Mapping, fp: Mapping) -> Plot:
    """The fine-tuning recipes' memory by part (``lora``, ``qlora``: weights, optimizer, gradients,
    activations in GiB)."""
    p = Plot("memory_breakdown", ("lora", "qlora"))
    bars = {}
    for name in p.needs:
        d = ans.get(name)
        if isinstance(d, Mapping):
            parts = {k: float(v) for k, v in d.items() if k.endswith("_gib") and is_number(v)
                     and not k.startswith(("peak", "total"))}
            if len(parts) >= 2:
                bars[name] = parts
    if not bars:
        return p
    cap = fp.get("memory_gib") if fp.get("kind") == "gpu" else None
    biggest = max(sum(c.values()) for c in bars.values())
    cap = float(cap) if _pos(cap) and biggest > cap / 4 else None  # a far-off capacity line would flatten the bars
    p.caption = f"memory by part for {' and '.join(bars)} (GiB, as measured)"
    p.draw = lambda: plots.memory_breakdown(bars, capacity_gib=cap, title="Memory by part (GiB)")
    return p


def scaling(ans: Mapping, fp: Mapping) -> Plot:
    """Total tokens/s on one GPU (``one``) and on all of them (``many``)."""
    p = Plot("scaling", ("one", "many"))
    ns = [get(ans, "one", "world_size"), get(ans, "many", "world_size")]
    ys = [get(ans, "one", "total_tokens_per_s"), get(ans, "many", "total_tokens_per_s")]
    if not all(_pos(v) for v in ns + ys):
        return p
    if ns[0] == ns[1]:
        p.why_not = f"both runs used {sig(ns[0])} GPU{'s' if ns[0] != 1 else ''}, so there is no scaling to show"
        return p
    p.caption = "total tokens/s on one GPU and on all of them, against linear scaling"
    p.draw = lambda: plots.scaling([int(n) for n in ns], [float(y) for y in ys], unit="tokens/s",
                                   title="Scaling (labels: efficiency)")
    return p


def _rate(r: Any) -> str:
    return "all at once" if r == "inf" or (isinstance(r, Mapping) and r) else f"{num(r)} req/s"


def latency_throughput(ans: Mapping, fp: Mapping) -> Plot:
    """The load sweep (``sweep_result``): p95 end-to-end latency against requests/s, one point per
    offered rate."""
    p = Plot("latency_throughput", ("sweep_result",))
    runs = get(ans, "sweep_result", "runs")
    if not isinstance(runs, list):
        return p
    pts = []
    for r in runs:
        thr, lat = get(r, "request_throughput"), get(r, "e2el_ms", "p95")
        if _pos(thr) and is_number(lat):
            pts.append((float(thr), float(lat), _rate(get(r, "workload", "request_rate"))))
    if len(pts) < 2:
        p.why_not = "fewer than two steps of the sweep completed requests"
        return p
    p.caption = "p95 end-to-end latency against completed requests/s, one point per offered rate of your sweep"
    p.draw = lambda: plots.latency_throughput({"sweep": pts}, x_label="completed requests/s",
                                              y_label="p95 end-to-end latency (ms)", title="Latency against throughput")
    return p


FINDERS = (roofline, latency_throughput, scaling, memory_breakdown, before_after)


def find_plots(ans: Mapping, fp: Mapping) -> list[Plot]:
    """One :class:`Plot` per figure kind, in :data:`KINDS` order."""
    return [f(ans, fp) for f in FINDERS]


def declutter(fig: Any, tries: int = 12) -> None:
    """Move apart the text labels of each of ``fig``'s axes that overlap one another: a label
    that overlaps one placed before it steps down by its own height, up to ``tries`` times."""
    if not hasattr(fig.canvas, "get_renderer"):  # utils.plots makes a Figure without pyplot
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        placed = []
        for t in ax.texts:
            box = t.get_window_extent(renderer)
            for _ in range(tries):
                if not any(box.overlaps(b) for b in placed) or not hasattr(t, "xyann"):
                    break
                dx, dy = t.xyann
                t.xyann = (dx, dy - (box.height + 2) * 72 / fig.dpi)
                box = t.get_window_extent(renderer)
            placed.append(box)
