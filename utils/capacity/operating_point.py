"""Lab 04's capacity-planning conventions: where to operate an engine, and how to pick one.

A load sweep's capacity is the highest offered rate at which enough requests meet every
SLO (:data:`MIN_GOOD_FRACTION`); the engine then operates at :data:`HEADROOM` of it, room for
the bursts of a Poisson arrival process. Candidates within :data:`CHOICE_TIE` of the best
goodput at that rate tie. These are course conventions, not measured figures; the notebook
states them and the grader applies the same ones (``grader/labs/benchmarking_production/judges.py``).
"""
from __future__ import annotations

import math

HEADROOM = 0.7  # operate at 70% of the measured capacity: room for bursts of a Poisson arrival process
MIN_GOOD_FRACTION = 0.9  # a load step "meets the SLO" when 90% of its requests meet every SLO
CHOICE_TIE = 0.1  # goodputs within 10% of the best count as a tie, broken by p95 E2E latency
# A synchronous p50 under 1 ms counts as 1 ms: an engine that falls behind its stream sends a
# request's tokens in one chunk, and the client's TPOT then reads 0, from which no positive
# SLO could be a bounded multiple.
SLO_FLOOR_MS = 1.0


def step_rate(run: dict) -> float:
    """The offered rate of a sweep step: its request rate, or for the synchronous and
    throughput steps (rate inf) the rate they achieved."""
    r = run["workload"]["request_rate"]
    if r in ("inf", None) or (isinstance(r, float) and math.isinf(r)):
        return float(run["request_throughput"])
    return float(r)

def candidate_row(run: dict) -> dict:
    """What the choice rule reads from a candidate's result."""
    g = run.get("goodput") or {}
    return {"goodput_rps": float(g.get("request_goodput") or 0.0), "p95_e2el_ms": run["e2el_ms"]["p95"],
            "p95_ttft_ms": run["ttft_ms"]["p95"], "fraction_good": g.get("fraction_of_completed"),
            "completed": run["completed"], "num_requests": run["workload"]["num_requests"]}
