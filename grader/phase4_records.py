"""Phase 4's result checks, reference answers and measurement record.

The checks of a load-test result live here because the live checks (this run's results) and
the record checks (a GPU run's record, graded on a machine without a GPU) apply the same
ones: a result is the workload it claims (every field that defines the load), its summary
follows from its own per-request trace (recomputed with ``utils.loadgen.summarize``), and its
latencies are physically possible (no token faster than reading the weights once at the
datasheet bandwidth). An invented but consistent, plausible record passes: the record proves
the arithmetic, not the run (docs/grading.md).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from grader import checks  # grader.phase(4) rebinds it to a fresh copy
from utils.loadgen.trace import records_from_trace
from utils.operating_point import (  # checked unchanged by grader/phase4.py
    CHOICE_TIE,
    HEADROOM,  # noqa: F401  (the grader's rule for OPERATING_RATE, read as records.HEADROOM)
    MIN_GOOD_FRACTION,
    SLO_FLOOR_MS,
    candidate_row,
    step_rate,
)
from utils.units import transfer_ms

PHASE = "04_benchmarking_production"
SLO_KEYS = ("ttft", "tpot", "e2el")
SLO_MAX_FACTOR = 20.0  # an SLO above 20x the unloaded p50 says nothing about the engine (floor: SLO_FLOOR_MS)
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
STATS = ("mean", "p50", "p90", "p95", "p99")
ROUNDING_MS = 1e-4  # utils.loadgen rounds milliseconds to 4 decimals
TRACE_TOL_MS = 2e-3  # a summary against its own trace: the trace keeps microseconds
# Fields that define the load. The sweep changes request_rate and concurrency per step,
# and drops the warm-up probe after its first step.
MATCH_KEYS = ("base_url", "model", "endpoint", "num_requests", "input_len", "output_len", "arrival", "burstiness",
              "stream", "dataset", "tokenizer", "seed", "slo_ms", "fixed_output", "max_duration_s")


# -- traces and metrics ------------------------------------------------------------------------

def reference_metrics(trace: list[dict]) -> dict:
    """TTFT, TPOT, ITL and E2EL statistics of a trace, by ``utils.loadgen.summarize``."""
    from utils.loadgen import summarize

    s = summarize(records_from_trace(trace), duration_s=max((t["end_s"] for t in trace), default=0.0))
    return {m: {k: s[m][k] for k in STATS} for m in METRICS}


def _recompute(run: dict) -> dict:
    """A run's summary recomputed from its own per-request records."""
    from utils.loadgen import RequestRecord, summarize

    w = run["workload"]
    rate = math.inf if w["request_rate"] in ("inf", None) else float(w["request_rate"])
    slo = (run.get("goodput") or {}).get("slo_ms")
    return summarize([RequestRecord.from_dict(r) for r in run["requests"]], duration_s=run["duration_s"],
                     slo=slo or None, concurrency=w.get("concurrency"), request_rate=rate)


def consistent(run: dict, what: str) -> None:
    """Every number of ``run`` that the checks use follows from its per-request trace."""
    if not isinstance(run, dict) or not isinstance(run.get("requests"), list) or "workload" not in run:
        raise AssertionError(f"{what} must be a result of utils.loadgen.run (a dict with 'workload' and 'requests')")
    try:
        again = _recompute(run)
    except (KeyError, TypeError, ValueError) as exc:
        raise AssertionError(f"{what}: its per-request records cannot be read ({type(exc).__name__}: {exc})") from None
    for key in ("completed", "failed", "cancelled", "not_sent"):
        if again[key] != run.get(key):
            raise AssertionError(f"{what}['{key}'] = {run.get(key)} but its requests say {again[key]}: edited results")
    checks.assert_close(run["request_throughput"], again["request_throughput"], f"{what} request_throughput", rel=1e-3)
    for m in METRICS:
        for k in STATS:
            a, b = run[m][k], again[m][k]
            if (a is None) != (b is None) or (a is not None and not math.isclose(a, b, rel_tol=1e-6, abs_tol=TRACE_TOL_MS)):
                raise AssertionError(f"{what}['{m}']['{k}'] = {a} but its requests give {b}: edited results")
    g1, g2 = run.get("goodput"), again.get("goodput")
    if (g1 is None) != (g2 is None) or (g1 and g1["good_requests"] != g2["good_requests"]):
        raise AssertionError(f"{what}: its goodput does not follow from its requests and SLOs: edited results")
    if g1:
        checks.assert_close(g1["request_goodput"], g2["request_goodput"], f"{what} request_goodput", rel=1e-3)


def run_stat(run: dict, slo_key: str, stat: str) -> float | None:
    return run[f"{slo_key}_ms"][stat]


# -- the workload ---------------------------------------------------------------------------

def workload_desc(workload: Any) -> dict:
    """``Workload.describe()`` as stored: JSON-safe, ``extra_body`` reduced to its keys."""
    if isinstance(workload, dict):
        return workload
    if not hasattr(workload, "describe"):
        raise AssertionError("WORKLOAD must be a utils.loadgen.Workload")
    d = workload.describe()
    d["extra_body"] = sorted(d.get("extra_body") or {})
    return d


def workload_valid(desc: dict, sizes: dict) -> None:
    """The rules of the notebook's workload exercise (one line per broken rule)."""
    slo = desc.get("slo_ms") or {}
    rules = [
        (desc.get("endpoint") == "completions" and desc.get("stream") is True,
         "endpoint must be 'completions' with stream=True (TTFT and TPOT need streaming)"),
        (desc.get("num_requests") == sizes["num_requests"], f"num_requests must be SIZES.num_requests ({sizes['num_requests']})"),
        (isinstance(desc.get("output_len"), int) and desc["output_len"] >= 8, "output_len must be at least 8 tokens"),
        (isinstance(desc.get("input_len"), int) and desc["input_len"] >= 1
         and desc["input_len"] + desc.get("output_len", 0) <= sizes["max_len"],
         f"input_len + output_len must be at most SIZES.max_len ({sizes['max_len']})"),
        (desc.get("concurrency") is None, "leave concurrency unset: the sweep sets it per step"),
        (desc.get("arrival") in ("poisson", "constant") and (desc.get("burstiness") or 0) > 0,
         "arrival must be 'poisson' or 'constant' with a positive burstiness"),
        (desc.get("dataset") is None, "use synthetic prompts (dataset=None): the grader re-creates them from the seed"),
        (desc.get("max_duration_s") is not None and 0 < desc["max_duration_s"] <= sizes["max_duration_s"],
         f"max_duration_s must be set, at most SIZES.max_duration_s ({sizes['max_duration_s']:g} s)"),
        (isinstance(slo, dict) and set(slo) == set(SLO_KEYS)
         and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in slo.values()),
         "slo_ms must set all three SLOs, {'ttft': ms, 'tpot': ms, 'e2el': ms}, each a positive number"),
    ]
    for ok, message in rules:
        if not ok:
            raise AssertionError(f"WORKLOAD: {message}")


def _same_load(w: dict, desc: dict, what: str, keys: tuple = MATCH_KEYS) -> None:
    for k in keys:
        if k == "seed" and desc.get(k) is None and isinstance(w.get(k), int):
            continue  # no seed set: each run draws its own and records it (utils/loadgen/workloads.py)
        if w.get(k) != desc.get(k):
            raise AssertionError(f"{what} ran {k}={w.get(k)!r}, but WORKLOAD has {desc.get(k)!r}: not the workload "
                                 "you defined (re-run it after changing WORKLOAD)")


def sweep_ran(sweep: Any, desc: dict, points: int, first: Any = None) -> None:
    """``sweep`` is ``utils.loadgen.sweep(WORKLOAD, points=points)``, unedited, and the SLOs
    are attainable without load and meaningful under it.

    The unloaded latency is the sweep's synchronous step and, when given, ``first``: the
    notebook's own synchronous run, which the learner sets the SLOs from. On a shared machine
    the two can differ several-fold (on two cores, beside a second engine, a TTFT p50 of 10 ms
    in one and 54 ms in the other), so an SLO passes if it is at least the lower p50 and at most
    :data:`SLO_MAX_FACTOR` times the higher: the learner is judged on a run they saw."""
    if not isinstance(sweep, dict) or not sweep.get("sweep") or not isinstance(sweep.get("runs"), list):
        raise AssertionError("sweep_result must be what utils.loadgen.sweep returns")
    runs = sweep["runs"]
    if len(runs) != points + 2:
        raise AssertionError(f"the sweep has {len(runs)} steps; utils.loadgen.sweep(WORKLOAD, points={points}) has "
                             f"{points + 2} (synchronous, throughput, {points} rates)")
    _same_load(sweep["workload"], desc, "the sweep")
    for i, run in enumerate(runs):
        what = f"sweep step {i} ({run.get('label')})"
        _same_load(run["workload"], desc, what)
        conc, rate = run["workload"].get("concurrency"), run["workload"].get("request_rate")
        want = (1, "inf") if i == 0 else (None, "inf") if i == 1 else (None, "finite")
        got = (conc, "inf" if rate in ("inf", None) else "finite")
        if got != want:
            raise AssertionError(f"{what}: concurrency {conc}, rate {rate}: not the step utils.loadgen.sweep runs there")
        consistent(run, what)
    unloaded = [runs[0]]
    if first is not None:
        consistent(first, "first")
        _same_load(first["workload"], desc, "first", ("base_url", "model", "input_len", "output_len"))
        if first["workload"].get("concurrency") != 1:
            raise AssertionError("first must be the synchronous run (concurrency=1) the notebook makes")
        unloaded.append(first)
    for key in SLO_KEYS:
        p50s = [p for p in (run_stat(r, key, "p50") for r in unloaded) if p is not None]
        if not p50s:
            raise AssertionError(f"the synchronous step has no {key} measurement; did its requests fail?")
        slo, where = desc["slo_ms"][key], " and ".join(f"{p:.4g}" for p in p50s)
        if slo < min(p50s):
            raise AssertionError(f"the {key} SLO ({slo:.4g} ms) is below the synchronous p50 ({where} ms): even "
                                 "an idle engine misses it; base it on the unloaded latency")
        if slo > slo_bounds(max(p50s))[1]:
            raise AssertionError(f"the {key} SLO ({slo:.4g} ms) is over {SLO_MAX_FACTOR:g}x the synchronous p50 "
                                 f"({where} ms, counted as at least {SLO_FLOOR_MS:g} ms): every load meets it, "
                                 "so it measures nothing")


def slo_bounds(p50_ms: float) -> tuple[float, float]:
    """The SLOs a synchronous p50 allows: at least the p50, at most :data:`SLO_MAX_FACTOR` times
    it, with a p50 under :data:`SLO_FLOOR_MS` counted as that floor."""
    return p50_ms, SLO_MAX_FACTOR * max(p50_ms, SLO_FLOOR_MS)


# -- capacity, operating point, choice --------------------------------------------------------


def reference_capacity(sweep: dict, min_good_fraction: float = MIN_GOOD_FRACTION) -> float:
    """The highest offered rate among the steps that completed every request with at least
    ``min_good_fraction`` of them within every SLO; the synchronous step's achieved rate if
    none did (one request at a time is the floor)."""
    runs = sweep["runs"]
    ok = [step_rate(r) for r in runs
          if r["completed"] == r["workload"]["num_requests"]
          and (r.get("goodput") or {}).get("fraction_of_completed") is not None
          and r["goodput"]["fraction_of_completed"] >= min_good_fraction]
    return max(ok) if ok else float(runs[0]["request_throughput"])


def operating_run_ok(run: Any, desc: dict, rate: float, what: str = "operating", same_server: bool = True) -> None:
    """``run`` is WORKLOAD at ``rate`` (against another server when ``same_server`` is False),
    unedited, with the goodput of WORKLOAD's SLOs."""
    consistent(run, what)
    keys = MATCH_KEYS if same_server else tuple(k for k in MATCH_KEYS if k not in ("base_url", "model", "tokenizer"))
    _same_load(run["workload"], desc, what, keys)
    got = run["workload"].get("request_rate")
    if got in ("inf", None) or not math.isclose(float(got), float(rate), rel_tol=1e-9):
        raise AssertionError(f"{what} ran at request_rate {got}, not OPERATING_RATE ({rate:.6g} req/s)")
    if run["workload"].get("concurrency") is not None:
        raise AssertionError(f"{what} capped concurrency; run WORKLOAD at OPERATING_RATE as it is")


def reference_choice(rows: dict) -> str:
    """The notebook's rule: the highest goodput at the operating rate; candidates within
    :data:`CHOICE_TIE` of it tie, and the lowest p95 E2E latency wins the tie."""
    best = max(r["goodput_rps"] for r in rows.values())
    close = [n for n, r in rows.items() if r["goodput_rps"] >= (1 - CHOICE_TIE) * best]
    return min(close, key=lambda n: (rows[n]["p95_e2el_ms"] if rows[n]["p95_e2el_ms"] is not None else math.inf, n))


def choice_ok(choice: Any, rows: dict) -> None:
    if not isinstance(choice, dict) or not {"config", "goodput_rps", "p95_e2el_ms", "why"} <= set(choice):
        raise AssertionError("CHOICE must be a dict with config, goodput_rps, p95_e2el_ms and why")
    if choice["config"] not in rows:
        raise AssertionError(f"CHOICE['config'] = {choice['config']!r} is not one of the measured candidates "
                             f"({', '.join(map(repr, rows))})")
    want = reference_choice(rows)
    if choice["config"] != want:
        r, w = rows[choice["config"]], rows[want]
        raise AssertionError(f"CHOICE picks {choice['config']!r} ({r['goodput_rps']:.4g} req/s good, p95 E2E "
                             f"{r['p95_e2el_ms']} ms), but the rule picks {want!r} ({w['goodput_rps']:.4g} req/s, "
                             f"p95 {w['p95_e2el_ms']} ms)")
    row = rows[want]
    checks.assert_close(choice["goodput_rps"], row["goodput_rps"], "CHOICE['goodput_rps'] (the measured goodput)", rel=1e-9)
    checks.assert_close(choice["p95_e2el_ms"], row["p95_e2el_ms"], "CHOICE['p95_e2el_ms'] (the measured p95)", rel=1e-9)
    if not isinstance(choice["why"], str) or len(choice["why"].split()) < 5:
        raise AssertionError("CHOICE['why'] must say in a sentence why (what the numbers show)")


# -- the record ------------------------------------------------------------------------------

_NEEDED = ("SIZES", "server", "WORKLOAD", "sweep_result", "CAPACITY", "OPERATING_RATE", "operating", "goodput_rps",
           "p95_e2el_ms", "candidates", "CHOICE")


def compact(run: dict) -> dict:
    """What the record keeps of a loadgen result: everything the checks recompute from."""
    keep = ("label", "completed", "failed", "cancelled", "not_sent", "duration_s", "request_throughput",
            "output_throughput", "goodput", *METRICS)
    out = {k: run.get(k) for k in keep}
    out["workload"] = workload_desc(dict(run["workload"], extra_body=sorted(run["workload"].get("extra_body") or {})))
    out["requests"] = run["requests"]
    return out


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (its ``globals()``)."""
    from utils.env import smoke_mode
    from utils.record import Record

    missing = [k for k in _NEEDED if k not in ns]  # inline: save_record runs before phase 4 sets ``checks``
    if missing:
        raise NameError(f"run every cell above first: {', '.join(missing)} not defined")
    g = ns
    server, marker = g["server"], g["server"].marker
    desc = workload_desc(g["WORKLOAD"])
    model = {"preset": marker.get("preset"), "dtype": marker.get("dtype"), "weight_bytes": marker.get("weight_bytes"),
             "engine": server.label}
    rec = Record.new()
    rec.add("capacity_rps", g["CAPACITY"], "req/s", "utils.loadgen.sweep, capacity_rate", None, workload=desc,
            sizes=dataclasses.asdict(g["SIZES"]), steps=[compact(r) for r in g["sweep_result"]["runs"]], **model)
    rec.add("goodput_rps", g["goodput_rps"], "req/s", "utils.loadgen.run at OPERATING_RATE", None,
            rate=g["OPERATING_RATE"], p95_e2el_ms=g["p95_e2el_ms"], operating=compact(g["operating"]), **model)
    rec.add("choice_goodput_rps", g["CHOICE"]["goodput_rps"], "req/s", "utils.loadgen.run per candidate", None,
            choice=dict(g["CHOICE"]), rate=g["OPERATING_RATE"],
            candidates={n: compact(r) for n, r in g["candidates"].items()})
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


# -- grading from the record ------------------------------------------------------------------

def _tpot_plausible(run: dict, weight_bytes: Any, spec, what: str) -> None:
    """Every decode step reads all the weights: no request's TPOT beats weight bytes over the
    datasheet bandwidth (batched requests share a step, they do not shorten it)."""
    wb = checks.assert_positive(weight_bytes, "record weight_bytes")
    floor_ms = transfer_ms(wb, spec.bandwidth_gbs)
    fastest = run["tpot_ms"]["min"] if run["tpot_ms"].get("min") is not None else run["tpot_ms"]["p50"]
    if fastest is not None and fastest * checks.DATASHEET_SLACK < floor_ms:
        raise AssertionError(f"{what}: a TPOT of {fastest:.4g} ms reads {wb / 1e9:.3g} GB of weights at "
                             f"{wb / fastest / 1e6:.4g} GB/s, above the {spec.name} datasheet bandwidth "
                             f"({spec.bandwidth_gbs:g} GB/s): not physically possible")


def _sizes_ok(sizes: dict) -> None:
    from utils.env import phase_sizes

    if not any(dataclasses.asdict(phase_sizes(PHASE, t)) == sizes for t in ("t4", "a100", "h100")):
        raise AssertionError(f"the record's sizes {sizes} are not the course's sizes for any GPU tier")


def workload_from_record() -> None:
    rec, spec = checks.open_record()
    cap, desc, sizes, steps, wb = checks.recorded(rec, "capacity_rps", "workload", "sizes", "steps", "weight_bytes")
    _sizes_ok(sizes)
    workload_valid(desc, sizes)
    sweep = {"sweep": True, "workload": desc, "runs": steps}
    sweep_ran(sweep, desc, sizes["sweep_points"])
    checks.assert_close(cap, reference_capacity(sweep), "recorded capacity_rps (the rule on the recorded sweep)", rel=1e-9)
    _tpot_plausible(steps[0], wb, spec, "the recorded synchronous step")
    checks.record_ok(f"sweep of {len(steps)} steps, capacity {cap:.4g} req/s")


def goodput_from_record() -> None:
    rec, spec = checks.open_record()
    g, rate, p95, op, wb = checks.recorded(rec, "goodput_rps", "rate", "p95_e2el_ms", "operating", "weight_bytes")
    cap, desc = checks.recorded(rec, "capacity_rps", "workload")
    checks.assert_close(rate, HEADROOM * cap, f"recorded OPERATING_RATE ({HEADROOM} x capacity)", rel=1e-9)
    operating_run_ok(op, desc, rate, "the recorded operating run")
    checks.assert_close(g, op["goodput"]["request_goodput"], "recorded goodput_rps", rel=1e-9)
    checks.assert_close(p95, op["e2el_ms"]["p95"], "recorded p95_e2el_ms", rel=1e-9)
    _tpot_plausible(op, wb, spec, "the recorded operating run")
    checks.record_ok(f"goodput {g:.4g} req/s, p95 E2E latency {p95:.4g} ms at {rate:.4g} req/s")


def choice_from_record() -> None:
    rec, _ = checks.open_record()
    _, choice, rate, cands = checks.recorded(rec, "choice_goodput_rps", "choice", "rate", "candidates")
    _, desc = checks.recorded(rec, "capacity_rps", "workload")
    if not isinstance(cands, dict) or not cands:
        raise AssertionError("the record has no candidates")
    for name, run in cands.items():
        operating_run_ok(run, desc, rate, f"recorded candidate {name!r}", same_server=False)
    choice_ok(choice, {n: candidate_row(r) for n, r in cands.items()})
    checks.record_ok(f"choice {choice['config']!r} among {len(cands)} candidates")
