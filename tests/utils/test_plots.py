"""utils.plots: each figure holds what its data says (lines, points, labels, scales)."""
from __future__ import annotations

import math

import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from utils import plots
from utils.measure.memory import training_memory_estimate


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def gpu_rows(device: str, n: int, power: bool = True) -> list[dict]:
    return [{"t_s": 0.1 * i, "device": device, "util_gpu_pct": 50.0 + i, "util_mem_pct": 20.0,
             "mem_used_gib": 10.0, "power_w": 300.0 if power else None} for i in range(n)]


def test_utilization_timeline_panels_lines_and_marks():
    rows = gpu_rows("gpu0", 5) + gpu_rows("gpu1", 5)
    rows[3]["util_gpu_pct"] = None  # a gap
    fig = plots.utilization_timeline(rows, marks=[(0.2, "epoch 2")])
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    util, mem, power = fig.axes
    assert [ax.get_ylabel() for ax in fig.axes] == ["utilization (%)", "memory (GiB)", "power (W)"]
    assert power.get_xlabel() == "time (s)"
    data_lines = [ln for ln in util.lines if ln.get_label().startswith("gpu")]
    assert sorted(ln.get_label() for ln in data_lines) == ["gpu0 SM busy", "gpu0 memory busy",
                                                           "gpu1 SM busy", "gpu1 memory busy"]
    y = next(ln for ln in data_lines if ln.get_label() == "gpu0 SM busy").get_ydata()
    assert math.isnan(y[3]) and y[4] == 54.0  # the gap breaks the line
    assert len([ln for ln in mem.lines if ln.get_label().startswith("gpu")]) == 2
    assert "epoch 2" in texts(util)
    # the mark is a vertical line on every panel
    assert all(any(list(ln.get_xdata()) == [0.2, 0.2] for ln in ax.lines) for ax in fig.axes)


def test_utilization_timeline_from_columns_without_power():
    cols = {"t_s": [0.0, 0.1, 0.2], "device": ["cpu"] * 3, "util_cpu_pct": [5.0, 50.0, 9.0],
            "rss_gib": [0.5, 0.6, 0.6]}
    fig = plots.utilization_timeline(cols)
    assert len(fig.axes) == 2  # no power panel for a CPU
    assert [ln.get_label() for ln in fig.axes[0].lines] == ["cpu CPU"]
    assert list(fig.axes[1].lines[0].get_ydata()) == [0.5, 0.6, 0.6]


def test_utilization_timeline_without_data_explains():
    with pytest.raises(ValueError, match="no samples"):
        plots.utilization_timeline([])


def test_roofline():
    pts = [("matmul", 2730.0, 793.0), ("gelu", 0.5, 2.1)]
    fig = plots.roofline(989, 4800, pts, dtype="bf16")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)" and ax.get_ylabel() == "bf16 TFLOP/s"
    roof = next(ln for ln in ax.lines if ln.get_label() == "roof")
    assert max(roof.get_ydata()) == pytest.approx(989)
    x, y = roof.get_xdata(), roof.get_ydata()
    assert y[0] == pytest.approx(x[0] * 4800 / 1e3)  # bandwidth slope left of the ridge
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(scatters) == 2
    labels = texts(ax)
    assert "ridge 206 FLOP/B" in labels  # 989e12 / 4800e9
    assert "matmul (80% of roof)" in labels and "gelu (88% of roof)" in labels  # 2.1 / (0.5 * 4.8)


def test_roofline_rejects_non_positive_points():
    with pytest.raises(ValueError, match="point 'copy'"):
        plots.roofline(989, 4800, [("copy", 0.0, 1.0)])
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        plots.roofline(989, None)


def test_latency_throughput():
    fig = plots.latency_throughput({"a": [(800, 35, 8), (100, 20, 1)], "b": [(50, 10), (90, 40)]}, slo_ms=30,
                                   y_label="p95 TTFT (ms)")
    ax = fig.axes[0]
    a = next(ln for ln in ax.lines if ln.get_label() == "a")
    assert list(a.get_xdata()) == [100, 800] and list(a.get_ydata()) == [20, 35]  # sorted by throughput
    assert {ln.get_label() for ln in ax.lines} == {"a", "b", "SLO 30 ms"}
    assert ax.get_ylabel() == "p95 TTFT (ms)"
    assert set(texts(ax)) == {"1", "8"}


def test_scaling_efficiency_labels():
    fig = plots.scaling([1, 2, 4], [100.0, 190.0, 360.0], unit="tokens/s")
    ax = fig.axes[0]
    assert {ln.get_label() for ln in ax.lines} == {"measured", "measured ideal"}
    ideal = next(ln for ln in ax.lines if ln.get_label() == "measured ideal")
    assert list(ideal.get_ydata()) == [100.0, 200.0, 400.0]
    assert texts(ax) == ["100%", "95%", "90%"]
    assert ax.get_xlabel() == "GPUs" and ax.get_ylabel() == "throughput (tokens/s)"
    with pytest.raises(ValueError, match="3 device counts"):
        plots.scaling([1, 2, 4], {"x": [1.0, 2.0]})


def test_memory_breakdown_stacks_components():
    fp32 = training_memory_estimate(10**9)
    mixed = training_memory_estimate(10**9, param_dtype="bf16", master_weights=True, activation_bytes=2**31)
    fig = plots.memory_breakdown({"fp32": fp32, "mixed": mixed}, capacity_gib=80)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 4  # two bars x (weights, gradients, optimizer, activations)
    assert ax.get_ylabel() == "memory (GiB)"
    heights = {}
    for p in ax.patches:
        heights[p.get_x()] = heights.get(p.get_x(), 0) + p.get_height()
    assert sorted(heights.values()) == pytest.approx(sorted([fp32["total_gib"], mixed["total_gib"]]))
    assert any(ln.get_label() == "capacity 80 GiB" for ln in ax.lines)
    one = plots.memory_breakdown({"weights": 2.0, "kv cache": 5.0})
    assert len(one.axes[0].patches) == 2


def test_before_after():
    fig = plots.before_after({"throughput (tokens/s)": (42.8e3, 381e3), "peak memory (GiB)": (12.0, 6.0)})
    assert len(fig.axes) == 2
    tput, mem = fig.axes
    assert [p.get_height() for p in tput.patches] == [42.8e3, 381e3]
    assert tput.get_title() == "throughput (tokens/s)\nx8.90"
    assert mem.get_title().endswith("x0.50")
    with pytest.raises(ValueError, match="needs \\(before, after\\)"):
        plots.before_after({"x": (1.0,)})


def test_per_device_scaling_lines_labels_and_bandwidth_panel():
    fig = plots.per_device_scaling({"DDP": {1: 100.0, 2: 95.0, 4: 90.0}, "FSDP": {1: 100.0, 2: 50.0}},
                                   {"2 ranks, nccl": [(2**20, 12.0), (2**30, 327.0)]})
    ax, ax2 = fig.axes
    assert [list(line.get_xdata()) for line in ax.lines] == [[1, 2, 4], [1, 2]]
    assert texts(ax) == ["95%", "90%", "50%"]  # efficiency against each line's 1-GPU point
    assert list(ax2.lines[0].get_ydata()) == [12.0, 327.0] and ax2.get_xscale() == "log"
    assert len(plots.per_device_scaling({"DDP": {1: 1.0, 2: 1.0}}).axes) == 1  # no all-reduce rows: one panel


def test_lab_cells_show_the_figures_utils_plots_returns():
    """utils.plots closes its figures (no double display), so a lab cell that assigns one must end
    with it, or the learner sees nothing (02's scaling chart and 05's roofline once did)."""
    import ast
    import json

    from grader import SOURCE_DIR

    missing = []
    for path in sorted(SOURCE_DIR.glob("*/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            try:
                body = ast.parse("\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))).body
            except SyntaxError:
                continue  # solution stubs of released cells; sources parse
            assigned = {t.id for node in body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                        and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name)
                        and node.value.func.value.id == "plots" for t in node.targets if isinstance(t, ast.Name)}
            last = body[-1] if body else None
            shown = isinstance(last, ast.Expr) and isinstance(last.value, ast.Name) and last.value.id in assigned
            if assigned and not shown:
                missing.append(f"{path.name}:{cell.get('id')}")
    assert not missing, f"cells that build a utils.plots figure but do not show it: {missing}"
