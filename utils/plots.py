"""Figures for the course: utilization timeline, roofline, latency-throughput, scaling,
memory breakdown, before/after. Each takes plain numbers (lists, dicts) and returns a
``matplotlib.figure.Figure``; none calls ``show()``, so they work headless (Agg) and in
tests. The figure is closed in pyplot's registry before it is returned, so a notebook
shows it once, as the cell's value, and a loop that makes many leaks none.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

_UTIL_KEYS = (("util_gpu_pct", "SM busy"), ("util_mem_pct", "memory busy"), ("util_cpu_pct", "CPU"))
_MEM_KEYS = (("mem_used_gib", "used"), ("rss_gib", "process RSS"))


def _new_figure(nrows: int = 1, ncols: int = 1, *, width: float = 8.0, height: float = 4.5, **kw: Any):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)
    plt.close(fig)
    return fig, [ax for row in axes for ax in row]


def _rows(samples: Sequence[Mapping] | Mapping[str, Sequence]) -> list[dict]:
    """Samples as rows, from rows or from columns (``GpuMonitor.columns()``)."""
    if isinstance(samples, Mapping):
        keys = list(samples)
        n = len(samples[keys[0]]) if keys else 0
        return [{k: samples[k][i] for k in keys} for i in range(n)]
    return [dict(r) for r in samples]


def _value(v: Any) -> float:
    return math.nan if v is None else float(v)


def utilization_timeline(samples: Sequence[Mapping] | Mapping[str, Sequence], *,
                         marks: Sequence[tuple[float, str]] = (), title: str | None = None) -> Figure:
    """Utilization (%), memory (GiB) and power (W) over time, one line per device and metric.

    ``samples``: ``GpuMonitor.samples`` (or ``.columns()``): dicts with ``t_s``, ``device``
    and metric keys. Missing values break the line. A panel with no data at all (power on a
    CPU) is left out. ``marks``: ``(t_s, label)`` events drawn on every panel and labelled
    on the top one. GPU utilization is the fraction of time a kernel ran, not how well it
    used the chip (docs/reference.md, "What utilization means")."""
    rows = _rows(samples)
    devices = list(dict.fromkeys(r.get("device", "gpu") for r in rows))
    panels = []
    for keys, ylabel in ((_UTIL_KEYS, "utilization (%)"), (_MEM_KEYS, "memory (GiB)"),
                         ((("power_w", "power"),), "power (W)")):
        present = [(k, name) for k, name in keys if any(r.get(k) is not None for r in rows)]
        if present:
            panels.append((present, ylabel))
    if not panels:
        raise ValueError("no samples with utilization, memory or power to plot (did the monitor run?)")
    fig, axes = _new_figure(len(panels), 1, width=9.0, height=2.4 * len(panels) + 0.8, sharex=True)
    for ax, (present, ylabel) in zip(axes, panels, strict=True):
        for dev in devices:
            drows = [r for r in rows if r.get("device", "gpu") == dev]
            t = [_value(r.get("t_s")) for r in drows]
            for key, name in present:
                if any(r.get(key) is not None for r in drows):
                    ax.plot(t, [_value(r.get(key)) for r in drows], label=f"{dev} {name}")
        ax.set_ylabel(ylabel)
        if ylabel.startswith("utilization"):
            ax.set_ylim(0, 105)
        else:
            ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        for t_s, _label in marks:
            ax.axvline(t_s, color="grey", linestyle=":", linewidth=1)
    for t_s, label in marks:
        axes[0].text(t_s, 1.0, label, transform=axes[0].get_xaxis_transform(), rotation=90,
                     va="top", ha="right", fontsize="small")
    axes[-1].set_xlabel("time (s)")
    axes[0].set_title(title or "GPU utilization timeline")
    fig.tight_layout()
    return fig


def roofline(peak_tflops: float, bandwidth_gbs: float, points: Sequence[tuple[str, float, float]] = (), *,
             title: str | None = None, dtype: str = "") -> Figure:
    """A log-log roofline: attainable TFLOP/s = min(peak, intensity x bandwidth), with the
    ridge point (peak / bandwidth, FLOP/byte) marked (docs/reference.md, "FLOPs, MFU,
    roofline"). ``points``: ``(label, intensity_flop_per_byte, achieved_tflops)``; each is
    labelled with its fraction of the roof at its intensity."""
    for name, v in (("peak_tflops", peak_tflops), ("bandwidth_gbs", bandwidth_gbs)):
        if not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r} (utils.device.hardware has the datasheet values)")
    for label, intensity, achieved in points:
        if not (isinstance(intensity, (int, float)) and intensity > 0 and isinstance(achieved, (int, float)) and achieved > 0):
            raise ValueError(f"point {label!r}: intensity (FLOP/byte) and achieved TFLOP/s must be positive on a "
                             f"log-log roofline, got {intensity!r} and {achieved!r}")
    ridge = peak_tflops * 1e3 / bandwidth_gbs  # (TFLOP/s * 1e12) / (GB/s * 1e9)

    def roof(i: float) -> float:
        return min(peak_tflops, i * bandwidth_gbs / 1e3)

    xs = [p[1] for p in points] + [ridge]
    lo, hi = min(xs) / 10, max(xs) * 10
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    fig, (ax,) = _new_figure()
    ax.plot(grid, [roof(i) for i in grid], color="black", linewidth=2, label="roof")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak_tflops), textcoords="offset points", xytext=(5, -15),
                fontsize="small")
    for label, intensity, achieved in points:
        frac = achieved / roof(intensity)
        ax.scatter([intensity], [achieved], zorder=3)
        ax.annotate(f"{label} ({100 * frac:.0f}% of roof)", (intensity, achieved), textcoords="offset points",
                    xytext=(5, 5), fontsize="small")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"{dtype + ' ' if dtype else ''}TFLOP/s")
    ax.set_title(title or f"Roofline: {peak_tflops:g} TFLOP/s peak, {bandwidth_gbs:g} GB/s")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def latency_throughput(series: Mapping[str, Sequence[Sequence]], *, slo_ms: float | None = None,
                       x_label: str = "throughput (tokens/s)", y_label: str = "latency (ms)",
                       title: str | None = None) -> Figure:
    """Latency against throughput, one line per series (a server, a config). ``series``:
    ``{name: [(throughput, latency_ms), ...]}`` or triples with a point label (the
    concurrency or request rate). ``slo_ms`` draws the latency target. Say which latency
    (TTFT, TPOT, p95 E2EL) in ``y_label``: docs/reference.md, "LLM load metrics"."""
    fig, (ax,) = _new_figure()
    for name, pts in series.items():
        pts = sorted(pts, key=lambda p: p[0])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        for p in pts:
            if len(p) > 2:
                ax.annotate(str(p[2]), (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize="small")
    if slo_ms is not None:
        ax.axhline(slo_ms, color="red", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title or "Latency vs throughput")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def scaling(n_devices: Sequence[int], throughput: Sequence[float] | Mapping[str, Sequence[float]], *,
            unit: str = "tokens/s", title: str | None = None) -> Figure:
    """Throughput against device count, with the ideal (linear from the smallest count)
    dashed, and each point labelled with its scaling efficiency: throughput_N /
    (N/N0 x throughput_N0) (docs/reference.md, "FLOPs, MFU, roofline")."""
    series = dict(throughput) if isinstance(throughput, Mapping) else {"measured": list(throughput)}
    fig, (ax,) = _new_figure()
    for name, ys in series.items():
        if len(ys) != len(n_devices):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(n_devices)} device counts")
        pts = sorted(zip(n_devices, ys, strict=True))
        n0, y0 = pts[0]
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.plot([p[0] for p in pts], [y0 * p[0] / n0 for p in pts], linestyle="--", color=line.get_color(),
                alpha=0.6, label=f"{name} ideal")
        for n, y in pts:
            ax.annotate(f"{100 * y / (y0 * n / n0):.0f}%", (n, y), textcoords="offset points", xytext=(4, -12),
                        fontsize="small")
    ax.set_xticks(sorted(set(n_devices)))
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title(title or "Scaling (labels: efficiency)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def per_device_scaling(series: Mapping[str, Mapping[int, float]],
                       allreduce: Mapping[str, Sequence[tuple[int, float]]] | None = None, *,
                       unit: str = "tokens/s", title: str | None = None) -> Figure:
    """Per-device throughput by GPU count, one line per ``{label: {gpus: value}}`` (linear
    scaling is a flat line; points labelled with efficiency against the line's smallest
    count), and, when given, all-reduce bus bandwidth by message size per
    ``{label: [(bytes, GB/s), ...]}`` in a second panel."""
    fig, axes = _new_figure(1, 2 if allreduce else 1, width=13.0 if allreduce else 7.0, height=4.2)
    ax = axes[0]
    for name, by_n in series.items():
        pts = sorted(by_n.items())
        if not pts:
            continue
        line, = ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=name)
        for n, v in pts[1:]:
            ax.annotate(f"{100 * v / pts[0][1]:.0f}%", (n, v), textcoords="offset points", xytext=(4, -12),
                        fontsize="small", color=line.get_color())
    counts = sorted({n for by_n in series.values() for n in by_n})
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs")
    ax.set_ylabel(f"{unit} per GPU (flat = linear)")
    ax.set_title(title or "Per-GPU throughput (labels: scaling efficiency)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    if allreduce:
        ax2 = axes[1]
        for name, rows in allreduce.items():
            ax2.plot([b for b, _ in rows], [g for _, g in rows], marker="o", label=name)
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("message (bytes)")
        ax2.set_ylabel("bus bandwidth (GB/s)")
        ax2.set_title("All-reduce bus bandwidth (nccl-tests' definition)")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def memory_breakdown(breakdown: Mapping[str, float] | Mapping[str, Mapping[str, float]], *,
                     capacity_gib: float | None = None, title: str | None = None) -> Figure:
    """Stacked bars of memory by component (GiB). ``breakdown``: one dict such as
    ``utils.measure.memory.training_memory_estimate(...)`` (its ``*_gib`` keys except
    ``total_gib``), or ``{config_name: that dict}`` for one bar per configuration.
    ``capacity_gib`` draws the card's memory."""
    if breakdown and all(isinstance(v, Mapping) for v in breakdown.values()):
        bars = {name: dict(v) for name, v in breakdown.items()}
    else:
        bars = {"estimate": dict(breakdown)}

    def parts(d: Mapping[str, float]) -> dict[str, float]:
        """The components: the ``*_gib`` keys when there are any, else every number."""
        gib = any(k.endswith("_gib") for k in d)
        return {k.removesuffix("_gib"): float(v) for k, v in d.items()
                if k not in ("total_gib", "total") and (k.endswith("_gib") or not gib) and isinstance(v, (int, float))}

    comps = list(dict.fromkeys(c for d in bars.values() for c in parts(d)))
    fig, (ax,) = _new_figure(width=max(5.0, 1.6 * len(bars) + 3))
    names = list(bars)
    bottoms = [0.0] * len(names)
    for comp in comps:
        vals = [parts(bars[n]).get(comp, 0.0) for n in names]
        ax.bar(names, vals, bottom=bottoms, label=comp)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    for i, total in enumerate(bottoms):
        ax.annotate(f"{total:.1f}", (i, total), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize="small")
    if capacity_gib is not None:
        ax.axhline(capacity_gib, color="red", linestyle="--", linewidth=1, label=f"capacity {capacity_gib:g} GiB")
    ax.set_ylabel("memory (GiB)")
    ax.set_title(title or "Memory breakdown")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def before_after(metrics: Mapping[str, Sequence[float]], *, labels: Sequence[str] = ("before", "after"),
                 title: str | None = None) -> Figure:
    """One small bar chart per metric, before against after, titled with the ratio.
    ``metrics``: ``{"throughput (tokens/s)": (42.8e3, 381e3), "peak memory (GiB)": (12.1, 7.4)}``;
    put the unit in the name."""
    if not metrics:
        raise ValueError("no metrics to plot: pass {'name (unit)': (before, after)}")
    fig, axes = _new_figure(1, len(metrics), width=3.2 * len(metrics) + 0.5, height=3.8)
    for ax, (name, pair) in zip(axes, metrics.items(), strict=True):
        if len(pair) != 2:
            raise ValueError(f"metric {name!r} needs (before, after), got {pair!r}")
        before, after = (float(v) for v in pair)
        ax.bar(list(labels), [before, after], color=["tab:grey", "tab:green"])
        ratio = f"x{after / before:.2f}" if before else "n/a"
        ax.set_title(f"{name}\n{ratio}", fontsize="medium")
        ax.set_ylabel(name)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
