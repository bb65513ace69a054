"""Load-test metrics from request records: pure functions, numbers in and numbers out.

Definitions are vLLM's ``benchmarks/serve.py`` (docs/reference.md, "LLM load metrics"), and
every summary carries them in ``definitions`` so a number never travels without its
meaning. Percentiles are numpy's default (linear interpolation), as vLLM's.

The load a run actually held is judged here too. GuideLLM 0.8.1 on a 2-core machine
labelled a run "concurrency 64" while about 31 requests were in flight; a
summary therefore reports the time-weighted mean of requests in flight and the dispatch
delay, and ``load_held`` is False with a warning when they fall short of the named load.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from utils.serving.loadgen.client import CANCELLED, RequestRecord

DEFINITIONS = {
    "source": "vLLM benchmarks/serve.py definitions (docs/reference.md, 'LLM load metrics')",
    "ttft_ms": "time to first token: request handed to the HTTP client -> first chunk carrying generated text "
               "(content, reasoning or a tool call; not a role-only chunk)",
    "tpot_ms": "time per output token, excluding the first: (e2el - ttft) / (output_tokens - 1), per request "
               "with >= 2 tokens, then averaged over requests; output_tokens from the server's usage when sent, "
               "else the count of text chunks (output_tokens_source)",
    "itl_ms": "inter-token latency: every gap between consecutive text chunks, pooled over all requests",
    "e2el_ms": "end-to-end latency: request sent -> last data event of the response ([DONE] excluded)",
    "request_throughput": "completed requests / duration_s (req/s)",
    "output_throughput": "output tokens of completed requests / duration_s (tok/s)",
    "goodput": "completed requests meeting every SLO (ttft, tpot, e2el, in ms) / duration_s (req/s)",
    "duration_s": "run start -> last request finished (or the run stopped at max_duration_s)",
    "in_flight": "requests sent and not yet finished, time-weighted over the window from the first send "
                 "to the last send (while requests remained); in_flight_mean_overall covers the whole run",
    "dispatch_delay_ms": "actual send time - time the schedule allowed it (its arrival time, or the moment a "
                         "concurrency slot freed if later)",
}
UNITS = {"ttft_ms": "ms", "tpot_ms": "ms", "itl_ms": "ms", "e2el_ms": "ms", "request_throughput": "req/s",
         "output_throughput": "tok/s", "total_token_throughput": "tok/s", "duration_s": "s",
         "request_goodput": "req/s", "client_cpu_ms_per_request": "ms"}
PERCENTILES = (50, 90, 95, 99)


def stats_ms(values_s: Sequence[float]) -> dict:
    """mean, median, std, p50/p90/p95/p99, min, max in milliseconds of values in seconds;
    ``None`` for each when there are no values (JSON has no NaN)."""
    keys = ["mean", "median", "std", *[f"p{p}" for p in PERCENTILES], "min", "max"]
    if len(values_s) == 0:
        return {**dict.fromkeys(keys), "n": 0}
    a = np.asarray(values_s, dtype=float) * 1e3
    pct = np.percentile(a, PERCENTILES)
    out = {"mean": a.mean(), "median": np.median(a), "std": a.std(), **{f"p{p}": v for p, v in zip(PERCENTILES, pct, strict=True)},
           "min": a.min(), "max": a.max()}
    return {**{k: round(float(v), 4) for k, v in out.items()}, "n": int(a.size)}


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50", "e2el:2000"]`` (vLLM's --goodput form, in ms) -> ``{"ttft": 500.0, ...}``."""
    slo: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput takes KEY:MS with KEY one of ttft, tpot, e2el; got {item!r}")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
        if not slo[key] > 0:
            raise ValueError(f"--goodput {item!r}: the SLO must be positive")
    return slo


def meets_slo(rec: RequestRecord, slo: dict[str, float]) -> bool:
    """True when a completed request meets every SLO; TPOT counts as 0 below two tokens (as vLLM)."""
    if not rec.ok:
        return False
    if "ttft" in slo and (rec.ttft_s is None or rec.ttft_s * 1e3 > slo["ttft"]):
        return False
    if "tpot" in slo and (rec.tpot_s or 0.0) * 1e3 > slo["tpot"]:
        return False
    return not ("e2el" in slo and rec.e2el_s * 1e3 > slo["e2el"])


def in_flight(intervals: Sequence[tuple[float, float]], t0: float, t1: float) -> tuple[float | None, int]:
    """Time-weighted mean of open intervals over [t0, t1], and the maximum open at any instant
    of the whole run. ``None`` for the mean when the window has no length."""
    if not intervals:
        return None, 0
    area = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return (area / (t1 - t0) if t1 > t0 else None), peak


def assess_load(*, concurrency: int | None, request_rate: float, num_requests: int, in_flight_mean: float | None,
                in_flight_max: int, dispatch_delay_p99_ms: float | None, sent_rate: float | None,
                schedule_rate: float | None, min_in_flight_fraction: float = 0.9,
                max_dispatch_delay_ms: float = 10.0) -> tuple[bool, str | None]:
    """Did the run hold the load it names? Returns ``(load_held, warning)``.

    - concurrency C (no rate): the mean in flight while requests remained must reach
      ``min_in_flight_fraction`` of min(C, num_requests);
    - rate R: dispatch delay p99 at most ``max_dispatch_delay_ms``, and the achieved send
      rate at least ``min_in_flight_fraction`` of the schedule's own rate (which catches a
      concurrency cap or a slow client); not checked for R = inf (all at once)."""
    problems = []
    if concurrency and math.isinf(request_rate):
        want = min(concurrency, num_requests)
        have = in_flight_mean if in_flight_mean is not None else float(in_flight_max)
        if have < min_in_flight_fraction * want:
            problems.append(f"named concurrency {concurrency} but only {have:.1f} requests in flight on average "
                            f"while requests remained (< {min_in_flight_fraction:.0%} of {want})")
    if not math.isinf(request_rate):
        if dispatch_delay_p99_ms is not None and dispatch_delay_p99_ms > max_dispatch_delay_ms:
            problems.append(f"dispatch delay p99 {dispatch_delay_p99_ms:.1f} ms > {max_dispatch_delay_ms:g} ms: "
                            f"requests left late, the client did not keep the schedule")
        if sent_rate is not None and schedule_rate and sent_rate < min_in_flight_fraction * schedule_rate:
            problems.append(f"sent {sent_rate:.2f} req/s of the {schedule_rate:.2f} req/s the schedule asked "
                            f"(< {min_in_flight_fraction:.0%})")
    return (not problems), ("; ".join(problems) or None)


def summarize(records: Sequence[RequestRecord], *, duration_s: float, slo: dict[str, float] | None = None,
              concurrency: int | None = None, request_rate: float = math.inf,
              schedule_offsets_s: Sequence[float] | None = None, min_in_flight_fraction: float = 0.9,
              max_dispatch_delay_ms: float = 10.0) -> dict:
    """Every metric of one run from its request records (pure: the notebook's graded trace uses it).

    ``duration_s`` is run start -> end; ``schedule_offsets_s`` the arrival times asked for."""
    ok = [r for r in records if r.ok]
    sent = [r for r in records if r.sent_s is not None]
    cancelled = [r for r in sent if r.reason == CANCELLED]
    failed = [r for r in sent if not r.ok and r.reason != CANCELLED]
    dur = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_known = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    n_usage = sum(r.tokens_from_usage for r in ok)
    source = "usage" if ok and n_usage == len(ok) else "chunks" if n_usage == 0 else "mixed"

    summary = {
        "completed": len(ok), "failed": len(failed), "cancelled": len(cancelled),
        "not_sent": len(records) - len(sent), "duration_s": round(duration_s, 6),
        "request_throughput": round(len(ok) / dur, 4),
        "output_throughput": round(out_tokens / dur, 4),
        "total_token_throughput": round((out_tokens + sum(prompt_known)) / dur, 4) if len(prompt_known) == len(ok) else None,
        "total_output_tokens": out_tokens,
        "output_tokens_mean": round(out_tokens / len(ok), 3) if ok else None,
        "output_tokens_source": source,
        "prompt_tokens_mean": round(sum(prompt_known) / len(prompt_known), 3) if prompt_known else None,
        "ttft_ms": stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": stats_ms([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_ms": stats_ms([g for r in ok for g in r.itl_s]),
        "e2el_ms": stats_ms([r.e2el_s for r in ok]),
        "failures": dict(Counter(r.reason for r in failed)),
        "failure_examples": {},
    }
    for r in failed:
        summary["failure_examples"].setdefault(r.reason, r.detail)
    if slo:
        good = sum(meets_slo(r, slo) for r in ok)
        summary["goodput"] = {"slo_ms": dict(slo), "good_requests": good, "request_goodput": round(good / dur, 4),
                              "fraction_of_completed": round(good / len(ok), 4) if ok else None}

    # The load actually held.
    spans = [(r.sent_s, r.done_s if r.done_s is not None else duration_s) for r in sent]
    first_send = min((a for a, _ in spans), default=0.0)
    last_send = max((a for a, _ in spans), default=0.0)
    mean_window, peak = in_flight(spans, first_send, last_send)
    mean_all, _ = in_flight(spans, 0.0, duration_s)
    delays = [r.sent_s - r.scheduled_s for r in sent if r.scheduled_s is not None]
    delay = stats_ms(delays)
    sent_rate = (len(sent) - 1) / (last_send - first_send) if len(sent) > 1 and last_send > first_send else None
    sched_rate = None
    if schedule_offsets_s is not None and len(sent) > 1:
        asked = list(schedule_offsets_s)[: len(sent)]
        if asked[-1] > asked[0]:
            sched_rate = (len(asked) - 1) / (asked[-1] - asked[0])
    held, warning = assess_load(
        concurrency=concurrency, request_rate=request_rate, num_requests=len(records), in_flight_mean=mean_window,
        in_flight_max=peak, dispatch_delay_p99_ms=delay["p99"], sent_rate=sent_rate, schedule_rate=sched_rate,
        min_in_flight_fraction=min_in_flight_fraction, max_dispatch_delay_ms=max_dispatch_delay_ms)
    summary["load"] = {
        "in_flight_mean": None if mean_window is None else round(mean_window, 3),
        "in_flight_mean_overall": None if mean_all is None else round(mean_all, 3),
        "in_flight_max": peak,
        "dispatch_delay_ms": {k: delay[k] for k in ("mean", "p50", "p99", "max", "n")},
        "sent_request_rate": None if sent_rate is None else round(sent_rate, 4),
        "schedule_request_rate": None if sched_rate is None else round(sched_rate, 4),
    }
    summary["load_held"] = held
    summary["load_warning"] = warning
    return summary
