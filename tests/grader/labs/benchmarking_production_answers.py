"""Consistent lab-04 answers for any tier's sizes, as the notebook's export sends them: load-test
results summarised by ``utils.serving.loadgen`` itself from made-up request records, a sweep as
``utils.serving.loadgen.sweep`` lays it out, and a Reference standing for the grader's own runs. For the
judges' tests (tests/grader/labs/test_benchmarking_production.py) and to build a GPU record
(tests/grader/labs/test_benchmarking_production_grading.py)."""
from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np

from grader.answers import encode
from grader.labs import load
from grader.labs.benchmarking_production import judges, reference
from grader.names import RECORD_SCHEMA
from grader.schema import loads
from utils.capacity.operating_point import HEADROOM, MIN_GOOD_FRACTION, candidate_row
from utils.measure.record import utils_hash
from utils.serving.loadgen import RequestRecord, Workload, summarize

ASSIGNMENT = "04_benchmarking_production"
ENGINE = "vllm continuous batching, bf16"  # the label the grader's engine stands for here
OTHER = "vllm continuous batching, w8a8"


def fake_run(w: Workload, label: str, ttft_ms: float, tpot_ms: float, gap_s: float) -> dict:
    """A loadgen result: ``w.num_requests`` requests ``gap_s`` apart, each ``ttft_ms`` to its first
    token and ``tpot_ms`` per token after it (a little spread), summarised by utils.serving.loadgen itself."""
    recs = []
    for i in range(w.num_requests):
        sent = i * gap_s
        ttft, tpot = ttft_ms / 1e3 * (1 + 0.05 * (i % 3)), tpot_ms / 1e3 * (1 + 0.02 * (i % 4))
        e2el = ttft + tpot * (w.output_len - 1)
        recs.append(RequestRecord(i, scheduled_s=sent, sent_s=sent, done_s=sent + e2el, ttft_s=ttft, e2el_s=e2el,
                                  itl_s=[tpot] * (w.output_len - 1), output_tokens=w.output_len, tokens_from_usage=True,
                                  prompt_tokens=w.input_len, ok=True))
    s = summarize(recs, duration_s=max(r.done_s for r in recs), slo=w.slo_ms or None, concurrency=w.concurrency,
                  request_rate=w.request_rate)
    s.update(label=label, workload=w.describe(), requests=[r.to_dict() for r in recs])
    return json.loads(json.dumps(s))  # as it crosses: plain data


def workload(sizes, base_url: str = "http://127.0.0.1:8000", **slo) -> Workload:
    return Workload(base_url, "/m", num_requests=sizes.num_requests, input_len=sizes.input_len,
                    output_len=sizes.output_len, tokenizer="/m", fixed_output=True, max_duration_s=sizes.max_duration_s,
                    slo_ms=slo or {"ttft": 250.0, "tpot": 30.0, "e2el": 1500.0})


def sweep(w: Workload, sizes, ttft_ms: float = 50.0, tpot_ms: float = 10.0) -> dict:
    """``utils.serving.loadgen.sweep(w, points=sizes.sweep_points)`` as it would come out: synchronous, throughput,
    then the rates evenly spaced between their request rates, slower as the rate grows."""
    one = 1.2 * (ttft_ms + tpot_ms * (w.output_len - 1)) / 1e3  # one at a time: each sent when the last finished
    runs = [fake_run(dataclasses.replace(w, concurrency=1), "synchronous", ttft_ms, tpot_ms, one),
            fake_run(dataclasses.replace(w, probe=False), "throughput", 8 * ttft_ms, 2.5 * tpot_ms, 0.0)]
    lo, hi = runs[0]["request_throughput"], runs[1]["request_throughput"]
    for k, rate in enumerate(np.linspace(lo, hi, sizes.sweep_points + 2)[1:-1]):
        runs.append(fake_run(dataclasses.replace(w, probe=False, request_rate=float(rate)), f"rate {rate:.3g}",
                             ttft_ms * (1.5 + 3 * k), tpot_ms * (1.2 + 1.5 * k), 1 / rate))
    return {"schema": "gpulab.loadgen/1", "sweep": True, "points": sizes.sweep_points, "workload": w.describe(),
            "runs": runs}


def answers(sizes, ttft_ms: float = 50.0, tpot_ms: float = 10.0) -> dict[str, dict]:
    """Right answers of every measured cell (and test_capacity's numbers) for ``sizes``."""
    first_w = dataclasses.replace(workload(sizes), slo_ms={}, concurrency=1, fixed_output=True)
    first = fake_run(first_w, "first (synchronous)", ttft_ms, tpot_ms, 0.6)
    w = workload(sizes, ttft=4 * ttft_ms, tpot=3 * tpot_ms, e2el=4 * (ttft_ms + tpot_ms * (sizes.output_len - 1)))
    sw = sweep(w, sizes, ttft_ms, tpot_ms)
    cap = judges.reference_capacity(sw, MIN_GOOD_FRACTION)
    rate = HEADROOM * cap
    op = fake_run(dataclasses.replace(w, request_rate=rate), "operating point", 1.2 * ttft_ms, 1.1 * tpot_ms, 1 / rate)
    other = fake_run(dataclasses.replace(w, base_url="http://127.0.0.1:8001", request_rate=rate), OTHER,
                     1.5 * ttft_ms, 1.3 * tpot_ms, 1 / rate)
    cands = {ENGINE: op, OTHER: other}
    rows = {n: candidate_row(r) for n, r in cands.items()}
    pick = judges.reference_choice(rows)
    choice = {"config": pick, "goodput_rps": rows[pick]["goodput_rps"], "p95_e2el_ms": rows[pick]["p95_e2el_ms"],
              "why": "the best goodput at the operating rate, by the rule"}
    return {
        "test_workload": {"WORKLOAD": w, "sweep_result": sw, "first": first},
        "test_capacity": {"CAPACITY": cap, "OPERATING_RATE": rate, "sweep_result": sw},
        "test_goodput": {"WORKLOAD": w, "CAPACITY": cap, "OPERATING_RATE": rate, "operating": op,
                         "goodput_rps": op["goodput"]["request_goodput"], "p95_e2el_ms": op["e2el_ms"]["p95"]},
        "test_choice": {"CHOICE": choice, "candidates": cands, "OPERATING_RATE": rate, "WORKLOAD": w},
    }


def decoded(cell: str, values: dict) -> dict:
    """``values`` as the judge gets them: encoded by the export, sent as JSON, decoded by the cell's specs."""
    specs = load(ASSIGNMENT).answers[cell]
    return {name: specs[name].spec.decode(loads(json.dumps(encode(v))), name) for name, v in values.items()}


def ref(ctx, values: dict, goodput: tuple = (), p95: tuple = (), e2el_ms: float = 150.0,
        slowdown: float = 1.0) -> reference.Reference:
    """The grader's reference with its runs at the operating rate made up: ``goodput`` and ``p95``
    (default: the learner's own numbers, x0.95, x1, x1.05), its E2E latency one request at a time
    ``e2el_ms``."""
    a = decoded("test_goodput", {k: values["test_goodput"][k] for k in ("WORKLOAD", "OPERATING_RATE", "operating")})
    op = a["operating"]
    goodput = goodput or tuple(op["goodput"]["request_goodput"] * f for f in (0.95, 1.0, 1.05))
    p95 = p95 or tuple((op["e2el_ms"]["p95"] or 100.0) * f for f in (0.95, 1.0, 1.05))
    r = reference.Reference(ctx, True, slowdown, SimpleNamespace(label=ENGINE), {})
    r.cache[("operating", reference._key(a["WORKLOAD"]), float(a["OPERATING_RATE"]))] = reference.Operating(
        list(goodput), list(p95))
    r.cache[("sync", reference._key(a["WORKLOAD"]))] = e2el_ms
    return r


def record(tier: str = "t4", gpu: str = "Tesla T4", tpot_ms: float = 10.0) -> dict:
    """A measurement record as the notebook writes it on ``gpu`` (fingerprint, tier, sizes, a hash of
    this utils/): every measured cell's answers from made-up but consistent runs."""
    from grader.labs import sizes as lab_sizes

    sizes = lab_sizes(ASSIGNMENT, tier)
    vals = answers(sizes, ttft_ms=40.0, tpot_ms=tpot_ms)
    ans = {cell: encode(v) for cell, v in vals.items()}
    for cell in load(ASSIGNMENT).answers:
        ans.setdefault(cell, {})
    return {"schema": RECORD_SCHEMA, "assignment": ASSIGNMENT, "tier": tier, "smoke": False, "dtype": "float16",
            "fingerprint": {"kind": "gpu", "name": gpu, "memory_gib": 15.0, "compute_capability": "7.5"},
            "utils_sha256": utils_hash(), "written_unix": time.time(), "answers": ans, "missing": {}}
