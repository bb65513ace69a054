"""Lab 04's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``). A load test crosses as the
plain data ``utils.serving.loadgen`` returns (its summary and every request's record, so the judges
recompute each summary from its requests); the workload as the fields of ``loadgen.Workload``.
The cells whose functions are judged on hidden cases (``test_percentile``, ``test_metrics``,
``test_scrape``, ``test_gpu_limits``, ``test_gpu_pod``, ``test_time_slicing``) read nothing here:
the grader runs those functions in a sandbox on inputs of its own (``judges.py``). ``test_capacity``
reads its numbers and runs ``capacity_rate`` on hidden sweeps too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from grader.labs import answers
from grader.schema import NONFINITE, Count, DictOf, Fields, Flag, ListOf, Nullable, Number, Spec, Text

METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclasses.dataclass(frozen=True)
class Rate(Spec):
    """A request rate in req/s: a positive finite number, or infinity (everything at once), which
    ``Workload.describe()`` writes as ``"inf"`` and the export as its non-finite marker; returned
    as a ``float`` (``math.inf`` for infinity)."""

    what = "a positive number of requests per second, or inf (all at once)"

    def decode(self, value: Any, name: str) -> float:
        if value == "inf" or (type(value) is dict and value == {NONFINITE: "inf"}):
            return math.inf
        if type(value) not in (int, float) or not math.isfinite(value) or not value > 0:
            raise self.fail(value, name)
        return float(value)


STATS = Fields({k: Nullable(Number("ms")) for k in ("mean", "p50", "p90", "p95", "p99", "min", "max")},
               label="a latency summary of utils.serving.loadgen (mean, p50 ... p99, min, max in ms)")
# loadgen.Workload's fields (the dataclass, or a result's ``workload``: Workload.describe()); the
# fields that say nothing about the load (api_key, extra_body, the client's own thresholds) are dropped
WORKLOAD = Fields({"base_url": Text(), "model": Text(), "num_requests": Count(1), "input_len": Count(1),
                   "output_len": Count(1), "endpoint": Text(), "concurrency": Nullable(Count(1)), "request_rate": Rate(),
                   "arrival": Text(), "burstiness": Number(positive=True), "stream": Flag(), "dataset": Nullable(Text()),
                   "tokenizer": Nullable(Text()), "seed": Nullable(Count()), "timeout_s": Number("s", positive=True),
                   "max_duration_s": Nullable(Number("s", positive=True)), "fixed_output": Flag(),
                   "slo_ms": DictOf(Text(), Number("ms")), "probe": Flag()},
                  label="a utils.serving.loadgen.Workload")
REQUEST = Fields({"index": Count(), "scheduled_s": Nullable(Number("s")), "sent_s": Nullable(Number("s")),
                  "done_s": Nullable(Number("s")), "ttft_s": Nullable(Number("s")), "e2el_s": Nullable(Number("s")),
                  "itl_s": ListOf(Number("s")), "output_tokens": Count(), "tokens_from_usage": Flag(),
                  "prompt_tokens": Nullable(Count()), "ok": Flag(), "reason": Text(), "detail": Text()},
                 label="one request's record (utils.serving.loadgen.RequestRecord.to_dict)")
GOODPUT = Fields({"slo_ms": DictOf(Text(), Number("ms")), "good_requests": Count(),
                  "request_goodput": Number("req/s", at_least=0.0), "fraction_of_completed": Nullable(Number(at_least=0.0))},
                 label="a run's goodput")
RUN = Fields({"label": Text(), "workload": WORKLOAD, "completed": Count(), "failed": Count(), "cancelled": Count(),
              "not_sent": Count(), "duration_s": Number("s", at_least=0.0),
              "request_throughput": Number("req/s", at_least=0.0), **{m: STATS for m in METRICS},
              "goodput": Nullable(GOODPUT), "requests": ListOf(REQUEST, min_len=1)},
             optional=("goodput",), label="a result of utils.serving.loadgen.run")
SWEEP = Fields({"sweep": Flag(), "workload": WORKLOAD, "runs": ListOf(RUN, min_len=1)},
               label="what utils.serving.loadgen.sweep returns")
CHOICE = Fields({"config": Text(), "goodput_rps": Number("req/s", at_least=0.0), "p95_e2el_ms": Nullable(Number("ms")),
                 "why": Text()}, label="a dict with config, goodput_rps, p95_e2el_ms and why")
RATE = Number("req/s", positive=True)

ANSWERS = {
    "test_percentile": {},
    "test_metrics": {},
    "test_workload": answers(WORKLOAD=WORKLOAD, sweep_result=SWEEP, first=RUN),
    "test_capacity": answers(CAPACITY=RATE, OPERATING_RATE=RATE, sweep_result=SWEEP),
    "test_goodput": answers(WORKLOAD=WORKLOAD, CAPACITY=RATE, OPERATING_RATE=RATE, operating=RUN,
                            goodput_rps=Number("req/s", at_least=0.0), p95_e2el_ms=Nullable(Number("ms"))),
    "test_choice": answers(CHOICE=CHOICE, candidates=DictOf(Text(), RUN), OPERATING_RATE=RATE, WORKLOAD=WORKLOAD),
    "test_scrape": {},
    "test_gpu_limits": {},
    "test_gpu_pod": {},
    "test_time_slicing": {},
}
