"""Which of the course's figures (``utils/plots.py``) a measurement record has the data for.

Each finder reads only the record: it returns a :class:`Plot` that draws from the record's
numbers, or one that says why it is not drawn (the data it needs is not in the record), so
the portfolio never draws made-up data. The roofline's ceilings are the card's datasheet row
in ``utils/hardware.py`` when the card is known there, else the record's own best matmul
TFLOP/s and copy GB/s (docs/reference.md, "FLOPs, MFU, roofline").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from utils import plots
from utils.portfolio_format import get, is_number, num
from utils.record import Record

KINDS = {
    "utilization_timeline": "utilization timeline",
    "roofline": "roofline",
    "latency_throughput": "latency against throughput",
    "scaling": "scaling",
    "memory_breakdown": "memory breakdown",
    "before_after": "before / after",
}
COMPONENT_SKIP = ("peak", "mem_", "total", "max")  # *_gib keys that are totals, not components


@dataclass
class Plot:
    kind: str  # a key of KINDS
    caption: str = ""
    draw: Callable[[], Any] | None = None  # returns a matplotlib Figure
    why_not: str = ""

    @property
    def file(self) -> str:
        return f"{self.kind}.png"


def _pos(v: Any) -> bool:
    return is_number(v) and v > 0


def utilization_timeline(rec: Record) -> Plot:
    """Monitor samples (dicts with ``t_s``) anywhere in the record's extras."""
    stack: list[Any] = [m.extra for m in rec.measurements.values()]
    while stack:
        d = stack.pop()
        if isinstance(d, list) and d and all(isinstance(r, dict) and "t_s" in r for r in d):
            return Plot("utilization_timeline", "utilization, memory and power over the run (GpuMonitor samples)",
                        lambda d=d: plots.utilization_timeline(d))
        if isinstance(d, dict):
            stack.extend(v for v in d.values() if isinstance(v, (dict, list)))
        elif isinstance(d, list):
            stack.extend(v for v in d if isinstance(v, (dict, list)))
    return Plot("utilization_timeline", why_not="the record holds no monitor samples over time (at most a "
                "summary such as the run's peak utilization), so there is no timeline to draw")


def roofline_points(rec: Record) -> list[tuple[str, float, float]]:
    """``(kernel, FLOP/byte, TFLOP/s)`` of every measurement that records its FLOPs and bytes."""
    out = []
    for name, m in rec.measurements.items():
        flops, nbytes = m.extra.get("flops"), m.extra.get("bytes")
        achieved = m.value if m.unit == "TFLOP/s" else m.extra.get("tflops")
        if _pos(flops) and _pos(nbytes) and _pos(achieved):
            out.append((name.removesuffix("_tflops").removesuffix("_gbs"), flops / nbytes, float(achieved)))
    return out


def roofline(rec: Record) -> Plot:
    points = roofline_points(rec)
    if not points:
        return Plot("roofline", why_not="no measurement in the record holds both its FLOPs and its bytes "
                    "moved, so no kernel has an arithmetic intensity to place")
    from utils.hardware import spec_for_name

    fp = rec.fingerprint
    dtype = next((m.extra["dtype"] for m in rec.measurements.values() if isinstance(m.extra.get("dtype"), str)), "")
    spec = spec_for_name(str(fp.get("name", ""))) if fp.get("kind") == "gpu" else None
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    peak = spec.peak_tflops(short) if spec and short in ("bf16", "fp16", "tf32", "fp32") else None
    if peak and spec.bandwidth_gbs:
        bw, how = spec.bandwidth_gbs, f"the {spec.name} datasheet row of utils/hardware.py"
    else:
        copy = rec.measurements.get("copy_gbs")
        peak = max(p[2] for p in points)
        bw = copy.value if copy and _pos(copy.value) else None
        how = "this record's own best TFLOP/s and copy GB/s (no datasheet row for this device)"
        if bw is None:
            return Plot("roofline", why_not="the device has no datasheet row and the record has no copy_gbs "
                        "to draw a measured memory roof")
    return Plot("roofline", f"each kernel on the roofline; roofs from {how}",
                lambda: plots.roofline(peak, bw, points, dtype=short))


def latency_throughput(rec: Record) -> Plot:
    """A load sweep's steps (lab 04), or decode measured at several batches (TPOT per batch)."""
    steps = get(rec.measurements.get("capacity_rps"), "extra", "steps") if "capacity_rps" in rec.measurements else None
    if isinstance(steps, list):
        pts = []
        for s in steps:
            thr, lat = get(s, "output_throughput"), get(s, "e2el_ms", "p95")
            if _pos(thr) and is_number(lat):
                pts.append((thr, lat, num(get(s, "workload", "request_rate", default=""))))
        if pts:
            return Plot("latency_throughput", "p95 end-to-end latency against output tokens/s, one point per "
                        "offered request rate of the sweep",
                        lambda: plots.latency_throughput({"sweep": pts}, x_label="output throughput (tokens/s)",
                                                         y_label="p95 E2E latency (ms)"))
    decode = [(m.extra.get("batch"), m.value, m.extra.get("tpot_ms")) for m in rec.measurements.values()
              if m.unit == "tokens/s" and _pos(m.value) and _pos(m.extra.get("tpot_ms")) and is_number(m.extra.get("batch"))]
    if len({b for b, _, _ in decode}) >= 2:
        pts = [(thr, tpot, f"b{b:g}") for b, thr, tpot in decode]
        return Plot("latency_throughput", "time per output token against decode tokens/s, one point per batch",
                    lambda: plots.latency_throughput({"decode": pts}, x_label="decode throughput (tokens/s)",
                                                     y_label="TPOT (ms)"))
    return Plot("latency_throughput", why_not="the record holds no latency measured at several loads (a load "
                "sweep's steps, or decode at two batches or more)")


def scaling(rec: Record) -> Plot:
    for m in rec.measurements.values():
        one, many = m.extra.get("one"), m.extra.get("many")
        ns = [get(one, "world_size"), get(many, "world_size")]
        ys = [get(one, "total_tokens_per_s"), get(many, "total_tokens_per_s")]
        if all(_pos(n) for n in ns) and all(_pos(y) for y in ys) and ns[0] != ns[1]:
            return Plot("scaling", "total tokens/s on one GPU and on all of them, against linear scaling",
                        lambda ns=ns, ys=ys: plots.scaling([int(n) for n in ns], ys, unit="tokens/s"))
    return Plot("scaling", why_not="the record holds no run on one device and on several (extras 'one' and 'many')")


def _components(extra: dict) -> dict[str, float]:
    return {k: float(v) for k, v in extra.items() if k.endswith("_gib") and is_number(v)
            and not k.startswith(COMPONENT_SKIP)}


def memory_breakdown(rec: Record) -> Plot:
    bars = {name.removesuffix("_peak_gib").removesuffix("_gib"): c for name, m in rec.measurements.items()
            if len(c := _components(m.extra)) >= 2}
    if not bars:
        return Plot("memory_breakdown", why_not="no measurement in the record splits its memory into parts "
                    "(weights, optimizer, activations in GiB)")
    cap = rec.fingerprint.get("memory_gib") if rec.fingerprint.get("kind") == "gpu" else None
    biggest = max(sum(c.values()) for c in bars.values())
    cap = cap if _pos(cap) and biggest > cap / 4 else None  # a far-off capacity line would flatten the bars
    return Plot("memory_breakdown", f"memory by part for {', '.join(bars)} (GiB, as recorded)",
                lambda: plots.memory_breakdown(bars, capacity_gib=cap))


# (before measurement, after measurement, what the bars mean, labels) or, for a pair inside one
# measurement's extra, (measurement, (before path), (after path), ...)
PAIRS = (
    ("baseline_tokens_per_s", "optimized_tokens_per_s", "throughput (tokens/s)", ("naive loop", "optimized")),
    ("decode_eager", "decode_fast", "decode at batch one (tokens/s)", ("eager generate", "fast path")),
    ("checkpoint_sync_save_ms", ("sync_save", "median_ms"), ("async_blocking", "median_ms"),
     "checkpoint: training blocked (ms)", ("sync save", "async save")),
)


def before_after(rec: Record) -> Plot:
    ms = rec.measurements
    for pair in PAIRS:
        if len(pair) == 4 and pair[0] in ms and pair[1] in ms:
            b, a, what, labels = ms[pair[0]].value, ms[pair[1]].value, pair[2], pair[3]
        elif len(pair) == 5 and pair[0] in ms:
            b, a = get(ms[pair[0]].extra, *pair[1]), get(ms[pair[0]].extra, *pair[2])
            what, labels = pair[3], pair[4]
        else:
            continue
        if is_number(b) and is_number(a):
            return Plot("before_after", f"{what}: {labels[0]} against {labels[1]}",
                        lambda b=b, a=a, what=what, labels=labels: plots.before_after({what: (b, a)}, labels=labels))
    return Plot("before_after", why_not="this lab's record holds no before/after pair of one workload "
                "(a baseline and its optimized run, eager and fast decode, a sync and an async checkpoint)")


FINDERS = (utilization_timeline, roofline, latency_throughput, scaling, memory_breakdown, before_after)


def find_plots(rec: Record) -> list[Plot]:
    """One :class:`Plot` per figure kind, drawable or with its reason, in :data:`KINDS` order."""
    return [f(rec) for f in FINDERS]
