"""Results out: JSON (everything), CSV (one row per run), a text table, a latency-throughput plot.

A sweep is a dict with ``runs``; a single run is one summary; every writer takes either.
"""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from utils.serving.loadgen.client import LoadgenError

STATS = ("mean", "p50", "p90", "p95", "p99")
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def runs_of(result: dict) -> list[dict]:
    return list(result["runs"]) if result.get("sweep") else [result]


def _open_for_write(path: str | os.PathLike, what: str):
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        return p.open("w", encoding="utf-8", newline="")
    except OSError as e:
        raise LoadgenError(f"cannot write {what} {path}: {e.strerror or e}") from None


def _finite(x):
    """JSON has no inf or NaN: write them as strings ("inf"), as the workload's request_rate."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_json(result: dict, path: str | os.PathLike) -> None:
    with _open_for_write(path, "--json-out") as f:
        json.dump(_finite(result), f, indent=1, allow_nan=False)
        f.write("\n")


def csv_row(summary: dict) -> dict:
    """One flat row: the workload, the counts, throughputs, load held and every latency statistic."""
    w = summary["workload"]
    row = {"label": summary["label"], "kind": w["kind"], "endpoint": w["endpoint"], "model": w["model"],
           "concurrency": w["concurrency"], "request_rate": w["request_rate"], "arrival": w["arrival"],
           "burstiness": w["burstiness"], "num_requests": w["num_requests"], "input_len": w["input_len"],
           "output_len": w["output_len"], "completed": summary["completed"], "failed": summary["failed"],
           "cancelled": summary["cancelled"], "duration_s": summary["duration_s"],
           "request_throughput": summary["request_throughput"], "output_throughput": summary["output_throughput"],
           "request_goodput": (summary.get("goodput") or {}).get("request_goodput"),
           "output_tokens_mean": summary["output_tokens_mean"], "output_tokens_source": summary["output_tokens_source"],
           "in_flight_mean": summary["load"]["in_flight_mean"], "in_flight_max": summary["load"]["in_flight_max"],
           "dispatch_delay_ms_p99": summary["load"]["dispatch_delay_ms"]["p99"], "load_held": summary["load_held"],
           "client_cpu_ms_per_request": summary["client"]["cpu_ms_per_request"]}
    for metric in LATENCIES:
        for stat in STATS:
            row[f"{metric}_{stat}"] = summary[metric][stat]
    row["failures"] = ";".join(f"{k}={v}" for k, v in summary["failures"].items())
    return row


def write_csv(result: dict, path: str | os.PathLike) -> None:
    rows = [csv_row(s) for s in runs_of(result)]
    with _open_for_write(path, "--csv-out") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_latency_throughput(result: dict, path: str | os.PathLike | None = None):
    """TTFT, TPOT and E2E latency (p50 and p95) against achieved request throughput, one point
    per run. Built on ``matplotlib.figure.Figure`` (no pyplot: no global backend change);
    returns the figure and saves it when ``path`` is given."""
    from matplotlib.figure import Figure

    runs = sorted(runs_of(result), key=lambda s: s["request_throughput"])
    x = [s["request_throughput"] for s in runs]
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, metric, title in zip(axes, ("ttft_ms", "tpot_ms", "e2el_ms"), ("TTFT", "TPOT", "E2E latency"), strict=True):
        for stat, style in (("p50", "o-"), ("p95", "s--")):
            ys = [s[metric][stat] for s in runs]
            ax.plot([a for a, b in zip(x, ys, strict=True) if b is not None], [b for b in ys if b is not None], style, label=stat)
        ax.set_xlabel("achieved request throughput (req/s)")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    w = runs[0]["workload"]
    fig.suptitle(f"{w['model']} · {w['endpoint']} · in {w['input_len']} / out {w['output_len']} tokens "
                 f"(vLLM definitions)", fontsize=10)
    if path is not None:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=120)
        except (OSError, ValueError) as e:
            raise LoadgenError(f"cannot write --plot-out {path}: {e}") from None
    return fig


def _fmt(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def format_summary(result: dict) -> str:
    """A text table for a person; the JSON holds the rest."""
    lines = []
    for s in runs_of(result):
        w, load = s["workload"], s["load"]
        lines += [f"== {s['label']} ==",
                  f"workload: {w['kind']}; {w['endpoint']} endpoint, model {w['model']}; {w['num_requests']} requests, "
                  f"input {w['input_len']} tokens ({w['prompt_source'].split(',')[0]}), output {w['output_len']} tokens",
                  f"completed {s['completed']}, failed {s['failed']}"
                  + (f" {s['failures']}" if s["failures"] else "") + (f", cancelled {s['cancelled']}" if s["cancelled"] else "")
                  + f"; duration {s['duration_s']:.2f} s",
                  f"throughput {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s "
                  f"(output tokens from {s['output_tokens_source']}, mean {_fmt(s['output_tokens_mean'], 1)})"]
        if "goodput" in s:
            g = s["goodput"]
            lines.append(f"goodput {g['request_goodput']:.2f} req/s ({g['good_requests']} requests meet {g['slo_ms']} ms)")
        lines.append(f"{'(ms)':<6}" + "".join(f"{k:>10}" for k in STATS))
        for metric in LATENCIES:
            lines.append(f"{metric[:-3].upper():<6}" + "".join(f"{_fmt(s[metric][k]):>10}" for k in STATS))
        lines.append(f"load held: {s['load_held']}; in flight mean {_fmt(load['in_flight_mean'])} (max "
                     f"{load['in_flight_max']}); dispatch delay p50/p99 {_fmt(load['dispatch_delay_ms']['p50'])}/"
                     f"{_fmt(load['dispatch_delay_ms']['p99'])} ms; client CPU {_fmt(s['client']['cpu_ms_per_request'])} "
                     f"ms/request")
        lines += [f"WARNING: {m}" for m in s["warnings"]]
    lines.append("definitions: vLLM benchmarks/serve.py; TPOT = (E2EL - TTFT)/(output tokens - 1); ITL = every gap "
                 "between text chunks, pooled (see 'definitions' in the JSON)")
    return "\n".join(lines)
