"""The grader's own measurements taken R times: how far each measured check's reference moves.

For each selected lab, the grader's context is built as grading builds it (``grader.context.live``:
smoke mode on a CPU, the device's size tier on a GPU) and the lab's ``reference.measure`` is called
for every check that names ``measures`` (``grader/labs/<lab>/judges.py``), in the order of
``CHECKS``, with one cache shared by the checks of a run and a fresh cache for each of the R runs,
as a grading's first try does (``grader/judging.py``). What a reference takes lazily (lab 02's
launches, lab 03's groups, lab 04's load runs) is asked for the way its judge asks. Lab 04's
workload is the notebook's (``SIZES`` lengths, Poisson arrivals) with every SLO at 4x the engine's
own E2E latency p50 one request at a time, at ``utils.capacity.operating_point.HEADROOM`` times that
synchronous rate: the capacity a sweep falls back to when no step qualifies.

For each quantity of each need: the median, min and max of the R values, the relative spread
(max/min - 1), the band :func:`grader.expect.band` sets from the R values' spread (for lab 02's
efficiencies and shares, absolute: ``Reference.fraction_band``), and the median of the bands the
grader set itself in each run (its spread across its own repeats and within each). Counts and labels
that do not move say how many distinct values the runs gave. A need that cannot be measured here
(an engine that does not start, a measurement only a learner's harness takes) is skipped with a
one-line reason. ``--budget-s`` bounds the whole run: each lab gets an even share of what is left
and stops repeating when one more run would pass its share (after at least 2 runs) or the whole
budget (after 1); a lab reached with no time left is skipped. The JSON is written after every lab.
A failed run of a need is one line in the output (``GRADER_REPEATABILITY_TRACEBACK=1`` prints its traceback).

    python benchmarks/grader_repeatability.py [--labs 00_foundations,05_hardware_and_cost] [--repeats 5]
        [--budget-s 220] [--json-out OUT.json]

Writes one JSON (machine fingerprint, tier, smoke, command, load averages, per lab: wall time, runs,
per need: its checks, quantities and skips) and prints a markdown table per lab.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from grader import expect, labs
from grader.measuring import Measured
from utils.course.env import device_tier, smoke_mode
from utils.device.hardware import fingerprint
from utils.measure.record import utils_hash

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu-grader-repeatability" / "grader_repeatability.json"
MIN_RUNS = 2  # a spread needs two runs: a lab stops early for --budget-s only after this many


class Skip(Exception):
    """A need this machine cannot measure: the message is the one-line reason."""


class Q(NamedTuple):
    """One quantity of one run: its value (a number, or a label/count compared for equality), the band
    the grader set in that run (None: no band of its own), and how a band is drawn from several runs."""

    value: Any
    grader_band: float | None = None
    band_of: Callable[[list[float]], float] | None = None
    absolute: bool = False  # the band is an absolute width (a fraction's), not relative


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _measured(ref, keys) -> dict[str, Q]:
    return {k: Q(m.value, m.rel) for k in keys if isinstance(m := ref.measured.get(k), Measured)}


# -- what each lab's judges read from a reference, per need -------------------------------------------

def probe_foundations(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    keys = {"matmul": ("matmul",), "memory": ("copy", "ew_gbs", "ew_tflops"), "thin": ("thin",), "tiny": ("tiny",),
            "train": ("tokens_per_s", "batch_scaling")}
    if need == "sweep":
        return _measured(ref, [k for k in ref.measured if k.startswith("sweep:")])
    if need == "step_bytes":
        return {"step_bytes (counted once per process)": Q(ref.step_bytes)}
    return _measured(ref, keys[need])


def probe_single_gpu(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    from grader.labs.single_gpu import reference as R

    if need == "naive":
        return _measured(ref, ("naive",))
    if need == "profile":
        p = ref.profile
        return {"step_time_ms": Q(p.step_time_ms), "diagnosis": Q(p.diagnosis)}
    if need == "course_drop":
        return {"course_drop": Q(ref.course_drop)}
    recipes = {"lean": R.lean_recipe()} if need == "finetune" else {
        "lean": R.lean_recipe(), "trap": R.trap_recipe(), **{c: R.single_recipe(c) for c in R.SINGLE_CHANGES}}
    return {f"peak_gib:{name}": Q(ref.peak(fields)["peak_gib"], R.MEMORY_BAND) for name, fields in recipes.items()}


def probe_multi_gpu(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    from grader.labs.multi_gpu import judges as J
    from grader.labs.multi_gpu import reference as R
    from utils.parallel.scaling_breaks import SCENARIOS

    plan, gloo = ref.plan, ref.plan.backend == "gloo"

    def fraction(values: list[float]) -> float:
        return ref.fraction_band([max(values) - min(values)])

    if need == "allreduce":
        bws = [J._allreduce_rows(r, "the grader's all-reduce", plan.nproc, plan.backend)[-1]["busbw_gbs"]
               for r in ref.allreduce()]
        floor = R.ALLREDUCE_FLOOR[ref.kind]
        return {"busbw_gbs (median of its runs)": Q(statistics.median(bws), expect.band(
            [expect.spread(bws)], gloo, ref.slowdown, floor=floor), lambda v: expect.band(
            [expect.spread(v)], gloo, floor=floor))}
    if need == "train":
        eff, share, w_eff, w_share = J._grader_scaling(ref)
        return {"scaling_efficiency": Q(eff, w_eff, fraction, True), "comm_share": Q(share, w_share, fraction, True)}
    if need == "breaks":
        out = {}
        for name in SCENARIOS:
            if name == "p2p_disabled" and plan.backend != "nccl":
                continue  # the judge refuses it over gloo
            theirs = ref.scenario(name)
            share = theirs["exposed_comm_share"]
            out[f"exposed_comm_share:{name}"] = Q(share, ref.fraction_band([2 * (1 - share) * J._rank_spread(theirs)]),
                                                  fraction, True)
        return out
    raise Skip("the grader times the learner's own versions in a harness for this need; reference.measure takes "
               "nothing to repeat (the expected gradients are computed, not measured)")


def probe_inference_serving(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    from utils.model import quantize

    first = {"decode": "copy", "growth": "growth", "gain": "gain",
             "quant": f"quant:weights:{quantize.reference_mode(ctx.device)}"}[need]
    ref.value(first)  # measures the need's group, as the judge's first comparison does
    heads = {"decode": ("tpot:", "copy", "speedup"), "growth": ("growth",), "quant": ("quant:",), "gain": ("gain",)}[need]
    out = {}
    for k, v in ref.measured.items():
        if k.startswith(heads):
            out[k] = Q(v.value, v.rel) if isinstance(v, Measured) else Q(v)
    return out


def probe_benchmarking_production(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    from utils.capacity import operating_point
    from utils.serving import loadgen

    if ref.server is None:
        raise Skip("no engine")
    s = ctx.sizes
    if "desc" not in state:
        w = loadgen.Workload(**ref.server.workload_fields(), num_requests=s.num_requests, input_len=s.input_len,
                             output_len=s.output_len, arrival="poisson", burstiness=1.0, max_duration_s=s.max_duration_s,
                             slo_ms={"ttft": 1e9, "tpot": 1e9, "e2el": 1e9})
        desc = dataclasses.asdict(w)
        p50 = expect.usable(ref.engine_e2el_ms(desc), "E2E latency p50 one request at a time", "ms")
        slo = 4 * max(p50, operating_point.SLO_FLOOR_MS)
        state["desc"] = {**desc, "slo_ms": {"ttft": slo, "tpot": slo, "e2el": slo}}
        state["rate"] = operating_point.HEADROOM * 1e3 / p50
    desc, rate = state["desc"], state["rate"]
    out = {"engine": Q(ref.engine_label), "e2el_p50_ms one at a time": Q(ref.engine_e2el_ms(desc))}
    op = ref.operating(desc, rate)
    for name, xs in (("goodput_req_s", op.goodput), ("p95_e2el_ms", op.p95)):
        ok = all(math.isfinite(x) and x > 0 for x in xs)
        out[f"{name} (median of its runs)"] = Q(statistics.median(xs) if ok else math.nan,
                                               expect.band([expect.spread(xs)], ctx.smoke, ref.slowdown) if ok else None)
    return out


def probe_hardware_and_cost(need: str, ref, ctx, state: dict) -> dict[str, Q]:
    if need == "resume":
        digests = next(iter(ref.resume.values()))
        return {"digests (kept per process)": Q(repr(sorted(digests.items()) if isinstance(digests, dict) else digests))}
    heads = {"points": ("matmul", "copy"), "train": ("samples_per_s",), "decode": ("tpot:",), "checkpoint": ("ckpt:",),
             "xla": ("xla:",)}[need]
    out = _measured(ref, [k for k in ref.measured if k.startswith(heads)])
    if need == "xla":
        out["compiles (unpadded, bucketed)"] = Q(repr(ref.compiles))
    return out


PROBES = {"00_foundations": probe_foundations, "01_single_gpu": probe_single_gpu, "02_multi_gpu": probe_multi_gpu,
          "03_inference_serving": probe_inference_serving,
          "04_benchmarking_production": probe_benchmarking_production,
          "05_hardware_and_cost": probe_hardware_and_cost}


def _close(assignment: str) -> None:
    """Stop what a lab's reference keeps running between measurements (lab 04's engine)."""
    if assignment == "04_benchmarking_production":
        from grader.labs.benchmarking_production import reference

        reference.close()


# -- one lab ---------------------------------------------------------------------------------------

def _summary(runs: list[Q], smoke: bool) -> dict:
    values = [q.value for q in runs]
    nums = [float(v) for v in values if type(v) in (int, float) or hasattr(v, "__float__") and not isinstance(v, str)]
    out: dict[str, Any] = {"runs": len(values)}
    if len(nums) != len(values) or not nums:
        out.update(kind="label", values=[str(v) for v in values], distinct=len({str(v) for v in values}))
        return out
    finite = [x for x in nums if math.isfinite(x)]
    out.update(kind="absolute" if runs[0].absolute else "relative", values=nums)
    if len(finite) != len(nums) or not finite:
        out["problem"] = f"{len(nums) - len(finite)} of {len(nums)} runs not finite"
    if len(finite) == 1:
        out.setdefault("problem", "one run: no spread")
        out["median"] = finite[0]
    if len(finite) >= 2:
        lo, hi = min(finite), max(finite)
        out.update(median=statistics.median(finite), min=lo, max=hi,
                   spread=(hi / lo - 1) if lo > 0 else (0.0 if hi == lo else math.inf), abs_spread=hi - lo)
        band_of = runs[-1].band_of or (lambda v: expect.band([expect.spread(v)], smoke))
        out["band_from_runs"] = band_of(finite)
    bands = [q.grader_band for q in runs if q.grader_band is not None and math.isfinite(q.grader_band)]
    if bands:
        out["grader_band_median"] = statistics.median(bands)
    return out


def measure_lab(assignment: str, repeats: int, deadline: float | None, log=print, end: float | None = None) -> dict:
    """The lab's needs measured ``repeats`` times (fewer, at least :data:`MIN_RUNS`, if ``deadline``
    (time.monotonic) would pass; fewer still, at least one, if ``end``, the whole run's, would); the
    JSON of one lab."""
    from grader import context

    t_lab = time.monotonic()
    lab = labs.load(assignment)
    ctx = context.live(assignment)
    reference, checks = lab.part("reference"), [c for c in lab.judges.CHECKS if c.measures]
    probe = PROBES[assignment]
    first_check = {}
    for c in checks:
        for n in c.measures:
            first_check.setdefault(n, c.cell)
    needs = {n: {"checks": [c.cell for c in checks if n in c.measures], "values": {}, "errors": []} for n in first_check}
    state: dict = {}
    run_walls: list[float] = []
    check_walls: dict[str, list[float]] = {c.cell: [] for c in checks}
    try:
        for r in range(repeats):
            late = [t for t, least in ((deadline, MIN_RUNS), (end, 1)) if t is not None and r >= least and run_walls
                    and time.monotonic() + run_walls[-1] > t]
            if late:
                log(f"  {assignment}: stopping after {r} runs (--budget-s)")
                break
            t_run, cache, done = time.monotonic(), {}, set()
            for c in checks:
                t_check = time.monotonic()
                todo = [n for n in c.measures if n not in done]
                done.update(todo)
                try:
                    ref = reference.measure(ctx, frozenset(c.measures), 1.0, cache)
                except Exception as exc:  # noqa: BLE001 - an engine or launch that fails: a one-line reason
                    for n in todo:
                        needs[n]["errors"].append(f"run {r + 1}: measure: {_one_line(exc)}")
                    check_walls[c.cell].append(time.monotonic() - t_check)
                    continue
                for n in todo:
                    try:
                        qs = probe(n, ref, ctx, state)
                    except Skip as exc:
                        needs[n]["skip"] = str(exc)
                        continue
                    except Exception as exc:  # noqa: BLE001
                        needs[n]["errors"].append(f"run {r + 1}: {_one_line(exc)}")
                        if os.environ.get("GRADER_REPEATABILITY_TRACEBACK") == "1":
                            traceback.print_exc()
                        continue
                    for k, q in qs.items():
                        needs[n]["values"].setdefault(k, []).append(q)
                check_walls[c.cell].append(time.monotonic() - t_check)
            run_walls.append(time.monotonic() - t_run)
            log(f"  {assignment}: run {r + 1} took {run_walls[-1]:.1f} s")
    finally:
        _close(assignment)
    out_needs = {}
    for n, d in needs.items():
        entry: dict[str, Any] = {"first_check": first_check[n], "checks": d["checks"]}
        if d["errors"]:
            entry["errors"] = d["errors"]
        if "skip" in d and not d["values"]:
            entry["skipped"] = d["skip"]
        elif not d["values"]:
            entry["skipped"] = d["errors"][0] if d["errors"] else "nothing measured"
        entry["quantities"] = {k: _summary(v, ctx.smoke) for k, v in d["values"].items()}
        out_needs[n] = entry
    return {"assignment": assignment, "tier": ctx.tier, "smoke": ctx.smoke, "device": ctx.device_name,
            "dtype": ctx.dtype, "runs": len(run_walls), "run_wall_s": [round(x, 2) for x in run_walls],
            "check_wall_s": {k: [round(x, 2) for x in v] for k, v in check_walls.items()},
            "wall_s": round(time.monotonic() - t_lab, 1), "needs": out_needs}


# -- output ----------------------------------------------------------------------------------------

def _fmt(x: Any) -> str:
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def _pct(x: Any, absolute: bool = False, width: bool = False) -> str:
    if not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-" if x is None else str(x)
    if absolute:
        return f"{x:.3g} (max - min)" if width else f"+-{x:.3g}"
    return f"{100 * x:.1f}%"


def table(res: dict) -> list[str]:
    """A markdown table of one lab: need (its first check), quantity, median, spread, bands."""
    lines = [f"### {res['assignment']} ({res['runs']} runs, {res['wall_s']:.0f} s, tier {res['tier']})", "",
             "| check (need) | quantity | median | min to max | spread (max/min - 1) | band from the runs | grader's band (median) |",
             "|---|---|---|---|---|---|---|"]
    for need, d in res["needs"].items():
        head = f"{d['first_check']} ({need})"
        if "skipped" in d:
            lines.append(f"| {head} | skipped: {d['skipped']} | | | | | |")
            continue
        for k, s in d["quantities"].items():
            if s["kind"] == "label":
                lines.append(f"| {head} | {k} | {s['values'][0][:40]} | {s['distinct']} distinct of {s['runs']} | | | |")
                continue
            ab = s["kind"] == "absolute"
            spread = _pct(s.get("abs_spread"), True, width=True) if ab else _pct(s.get("spread"))
            span = f"{_fmt(s['min'])} to {_fmt(s['max'])}" if "min" in s else s.get("problem", "-")
            lines.append(f"| {head} | {k} | {_fmt(s.get('median'))} | {span} | "
                         f"{spread} | {_pct(s.get('band_from_runs'), ab)} | {_pct(s.get('grader_band_median'), ab)} |")
        for e in d.get("errors", [])[:3]:
            lines.append(f"| {head} | error: {e} | | | | | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labs", default=",".join(labs.assignments()), help="comma-separated assignment ids (default: all)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each lab's measurements (default 5)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="seconds for all labs together; each stops repeating (after 2 runs) past its share (0: no limit)")
    p.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    chosen = [x.strip() for x in a.labs.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in labs.REGISTRY]
    if unknown or not chosen:
        print(f"error: no lab {', '.join(map(repr, unknown)) or '(none given)'}; the labs are "
              f"{', '.join(labs.assignments())}", file=sys.stderr)
        return 2
    if a.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    end = t0 + a.budget_s if a.budget_s > 0 else None
    load_before = os.getloadavg()
    results = []
    for i, assignment in enumerate(chosen):
        if end is not None and time.monotonic() >= end:
            results.append({"assignment": assignment, "skipped": "no time left in --budget-s"})
            print(f"{assignment}: skipped, no time left in --budget-s")
            continue
        deadline = None if end is None else time.monotonic() + (end - time.monotonic()) / (len(chosen) - i)
        print(f"{assignment}: measuring, up to {a.repeats} runs", flush=True)
        try:
            res = measure_lab(assignment, a.repeats, deadline, log=lambda m: print(m, flush=True), end=end)
        except Exception as exc:  # noqa: BLE001 - a lab whose context cannot be built here: one line, go on
            res = {"assignment": assignment, "skipped": _one_line(exc)}
        results.append(res)
        if "skipped" in res:
            print(f"{assignment}: skipped, {res['skipped']}")
        else:
            print("\n".join(["", *table(res), ""]), flush=True)
        _write(a, argv, t0, load_before, results)  # after every lab: a run cut short keeps what it measured
    _write(a, argv, t0, load_before, results)
    print("wall time per lab: " + ", ".join(f"{r['assignment']} {r.get('wall_s', '-')} s" for r in results))
    print(f"wrote {a.json_out}")
    return 0


def _write(a: argparse.Namespace, argv: list[str] | None, t0: float, load_before: tuple, results: list) -> None:
    out = {"benchmark": "grader_repeatability", "date": datetime.date.today().isoformat(),
           "command": " ".join(["benchmarks/grader_repeatability.py", *(argv if argv is not None else sys.argv[1:])]),
           "repeats": a.repeats, "budget_s": a.budget_s, "smoke": smoke_mode(), "tier": device_tier(),
           "fingerprint": fingerprint(), "utils_sha256": utils_hash(), "cpu_count": os.cpu_count(),
           "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
           "wall_s": round(time.monotonic() - t0, 1), "labs": results}
    a.json_out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.json_out.with_suffix(a.json_out.suffix + ".tmp")
    tmp.write_text(json.dumps(out, indent=1, default=str))
    tmp.replace(a.json_out)


if __name__ == "__main__":
    sys.exit(main())
