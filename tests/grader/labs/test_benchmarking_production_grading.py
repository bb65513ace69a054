"""Lab 04 graded through the real command, in one batch: ``python -m grader autograde --jobs 2`` on
the reference answers (full automatic marks), the untouched release (0), two hostile submissions
written by a learner who read the grader, one of them with a GPU record beside it (its measured
cells judged from the record: provisional, counted only with ``--count-provisional``).

- ``course``: the course's own implementations called from the answer cells (``utils.measure.timing``'s
  quantile, ``utils.serving.loadgen.summarize``, ``utils.capacity.operating_point.step_rate``), a scrape that returns
  the notebook's own page, a pod written for the notebook's own arguments; the measured part left
  undone (the load runs are the expensive part of this test). Scores the two cells it wrote
  honestly. (Importing the grader's own rules is the screen's to hold: grader/screen.py.) A T4 record
  beside it: its measured cells are judged from the record, provisionally, counted only with
  ``--count-provisional`` (a second batch of that one notebook).
- ``forged``: the sweep and the operating run made up in the kernel (consistent, built with
  ``utils.serving.loadgen.summarize`` from invented requests, every token in 0.01 ms): the workload's unloaded
  runs and the operating run are faster than the grader's own engine, so those cells fail; the
  rule cells it wrote honestly pass (``test_capacity`` applies the rule to whatever sweep it is
  given: whether the sweep ran is ``test_workload``'s question).

The engine is ``transformers serve`` here (``GPULAB_VLLM_PYTHON`` pointed at nothing): vLLM's CPU
build starts in 50 to 110 s on two cores, and the reference alone starts three engines; the judges
do not depend on the engine, and tests/grader/labs/test_benchmarking_production.py starts the
default one. About 6 minutes on two quiet cores.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.grader.labs import benchmarking_production_answers as made
from tests.nbcells import autograde, gid

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "04_benchmarking_production"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_percentile": 1, "test_metrics": 3, "test_workload": 2, "test_capacity": 2, "test_goodput": 3,
          "test_choice": 2, "test_scrape": 1, "test_gpu_limits": 2, "test_gpu_pod": 2, "test_time_slicing": 1}
MEASURED = ("test_workload", "test_goodput", "test_choice")
UNDONE = "raise NotImplementedError()"
NO_VLLM = {"GPULAB_VLLM_PYTHON": "/nonexistent/no-vllm-for-these-runs"}  # transformers serve: see the docstring

COURSE = {  # answer cell -> what a learner who read the grader writes there
    "percentile_answer": "def percentile(values, p):\n    from utils.measure.timing import _quantile\n"
                         "    return _quantile(sorted(values), p / 100)\n",
    "metrics_answer": ("def latency_metrics(trace):\n    from utils.serving.loadgen import summarize\n"
                       "    from utils.serving.loadgen.trace import records_from_trace\n"
                       "    s = summarize(records_from_trace(trace), duration_s=1.0)\n"
                       "    return {m: {k: s[m][k] for k in ('mean', 'p50', 'p90', 'p95', 'p99')} for m in "
                       "('ttft_ms', 'tpot_ms', 'itl_ms', 'e2el_ms')}\n\nmine = latency_metrics(TRACE)\n"),
    "capacity_answer": ("def capacity_rate(sweep, min_good_fraction):\n"
                        "    ok = [operating_point.step_rate(r) for r in sweep['runs'] if r['completed'] == "
                        "r['workload']['num_requests'] and (r['goodput'] or {}).get('fraction_of_completed') is not None "
                        "and r['goodput']['fraction_of_completed'] >= min_good_fraction]\n"
                        "    return max(ok) if ok else sweep['runs'][0]['request_throughput']\n"),
    "sweep_answer": UNDONE,
    "goodput_answer": UNDONE,
    "choice_answer": UNDONE,
    "scrape_answer": ("PAGE = {'gpulab_exporter_nvml_up': [({}, 0.0)], 'gpulab_exporter_gpus': [({}, 0.0)]}\n"
                      "def scrape(url):\n    return PAGE\n\nscraped = scrape(metrics_server.url)\n"),
    "gpu_pod_answer": ("def gpu_pod(image, model, gpus, port):\n    c = {'name': 'vllm', 'image': 'gpulab-vllm:0.33.0', "
                       "'args': ['TinyLlama/TinyLlama-1.1B-Chat-v1.0', '--port=8000'], 'ports': [{'containerPort': 8000}], "
                       "'resources': {'limits': {'nvidia.com/gpu': 1}}}\n"
                       "    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {'name': 'vllm'}, "
                       "'spec': {'containers': [c]}}\n"),
}
COURSE_HONEST = {"test_gpu_limits": 2, "test_time_slicing": 1}

FORGE = '''
import numpy as np
from utils.serving.loadgen import RequestRecord, summarize

def made_up(w, label, gap_s):
    """a result of loadgen.run, every token in 0.01 ms, summarised by utils.serving.loadgen itself"""
    recs = []
    for i in range(w.num_requests):
        e2el = 0.001 + 1e-5 * (w.output_len - 1)
        recs.append(RequestRecord(i, scheduled_s=i * gap_s, sent_s=i * gap_s, done_s=i * gap_s + e2el, ttft_s=0.001,
                                  e2el_s=e2el, itl_s=[1e-5] * (w.output_len - 1), output_tokens=w.output_len,
                                  tokens_from_usage=True, prompt_tokens=w.input_len, ok=True))
    s = summarize(recs, duration_s=max(r.done_s for r in recs), slo=w.slo_ms or None, concurrency=w.concurrency,
                  request_rate=w.request_rate)
    s.update(label=label, workload=w.describe(), requests=[r.to_dict() for r in recs])
    return s
'''
FORGED = {
    "sweep_answer": FORGE + '''
WORKLOAD = loadgen.Workload(**server.workload_fields(), num_requests=SIZES.num_requests, input_len=SIZES.input_len,
                            output_len=SIZES.output_len, arrival="poisson", burstiness=1.0,
                            max_duration_s=SIZES.max_duration_s,
                            slo_ms={k: f * max(first[f"{k}_ms"]["p50"], operating_point.SLO_FLOOR_MS)
                                    for k, f in (("ttft", 5), ("tpot", 3), ("e2el", 4))})
_runs = [made_up(dataclasses.replace(WORKLOAD, concurrency=1), "synchronous", 0.01),
         made_up(dataclasses.replace(WORKLOAD, probe=False), "throughput", 0.0)]
for _r in np.linspace(_runs[0]["request_throughput"], _runs[1]["request_throughput"], SIZES.sweep_points + 2)[1:-1]:
    _runs.append(made_up(dataclasses.replace(WORKLOAD, probe=False, request_rate=float(_r)), f"rate {_r:.3g}", 1 / _r))
sweep_result = {"sweep": True, "points": SIZES.sweep_points, "workload": WORKLOAD.describe(), "runs": _runs,
                "warnings": []}
''',
    "goodput_answer": '''
operating = made_up(dataclasses.replace(WORKLOAD, request_rate=OPERATING_RATE), "operating point", 1 / OPERATING_RATE)
goodput_rps = operating["goodput"]["request_goodput"]
p95_e2el_ms = operating["e2el_ms"]["p95"]
''',
}
FORGED_FAILS = ("test_workload", "test_goodput", "test_choice")


def _notebook(base: dict, replace: dict) -> dict:
    nb = json.loads(json.dumps(base))
    for c in nb["cells"]:
        if gid(c) in replace:
            c["source"] = replace[gid(c)]
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from grader.release import reference_submission

    tmp = tmp_path_factory.mktemp("lab04")
    subs, rec_subs = tmp / "subs", tmp / "record-only"
    subs.mkdir()
    rec_subs.mkdir()
    ref = reference_submission(ASSIGNMENT)
    release = json.loads(RELEASE.read_text())
    course = _notebook(ref, COURSE)
    notebooks = {"reference": ref, "release": release, "course": course, "forged": _notebook(ref, FORGED)}
    for name, nb in notebooks.items():
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))
    (subs / "course.record.json").write_text(json.dumps(made.record()))  # its measured cells, from a T4
    (rec_subs / "course.ipynb").write_text(json.dumps(course))
    (rec_subs / "course.record.json").write_text(json.dumps(made.record()))
    old = {k: os.environ.get(k) for k in NO_VLLM}
    os.environ.update(NO_VLLM)
    try:
        main = autograde(ROOT, ASSIGNMENT, subs, tmp / "out", jobs=2, timeout_s=900, wait_s=3600)
        counted = autograde(ROOT, ASSIGNMENT, rec_subs, tmp / "out-counted", "--count-provisional", jobs=1,
                            timeout_s=900, wait_s=1200)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return {"results": main["results"], "rows": main["rows"], "out": main["out"], "counted": counted}


def scores(result: dict) -> dict:
    return {c["cell"]: c["score"] for c in result["cells"] if c.get("mode") != "manual"}


def messages(result: dict) -> str:
    return " | ".join(f"{c['cell']}: {c.get('message', '')}" for c in result["cells"] if c.get("message"))


pytestmark = pytest.mark.slow


def test_the_reference_scores_full_automatic_marks_measured_live(graded):
    r = graded["results"]["reference"]
    assert scores(r) == POINTS, messages(r)
    assert all("live" in c["mode"] for c in r["cells"] if c["cell"] in MEASURED), r["cells"]


def test_the_release_scores_zero_with_a_reason_per_cell(graded):
    r = graded["results"]["release"]
    assert r["score"] == 0 and set(scores(r)) == set(POINTS)
    assert all(c.get("message") for c in r["cells"] if c["cell"] in POINTS), r["cells"]


def test_calling_the_course_scores_only_the_honest_cells(graded):
    r = graded["results"]["course"]
    got = {c["cell"]: c for c in r["cells"] if c["cell"] in POINTS}
    assert {c: v["score"] for c, v in got.items() if v["score"] and not v["provisional"]} == COURSE_HONEST, messages(r)
    for cell in ("test_percentile", "test_metrics"):
        assert "the course's own implementation" in got[cell]["message"], got[cell]
    assert "differs from prometheus_client's parse" in got["test_scrape"]["message"]
    assert "refused on 4 of 4 hidden" in got["test_gpu_pod"]["message"]


def test_forged_measurements_lose_their_cells(graded):
    r = graded["results"]["forged"]
    got = scores(r)
    assert {c for c, s in got.items() if not s} == set(FORGED_FAILS), messages(r)
    msg = {c["cell"]: c.get("message", "") for c in r["cells"]}
    assert "faster than the engine" in msg["test_workload"], msg["test_workload"]
    for cell in ("test_goodput", "test_choice"):
        assert "the grader measured" in msg[cell] or "faster than the engine" in msg[cell], msg[cell]


def test_a_gpu_record_is_provisional_and_counted_only_when_asked(graded):
    """The course submission carries a T4 record: its measured cells (undone in the notebook) are
    judged from the record, provisionally, and count only with ``--count-provisional``."""
    row, r = graded["rows"]["course"], graded["results"]["course"]
    earned, honest = sum(POINTS[c] for c in MEASURED), sum(COURSE_HONEST.values())
    cells = {c["cell"]: c for c in r["cells"]}
    assert all(cells[c]["provisional"] and cells[c]["mode"] == "graded from record" for c in MEASURED), r["cells"]
    assert r["provisional_score"] == earned and r["verified_score"] == honest and r["score"] == honest, messages(r)
    assert float(row["provisional_score"]) == earned and float(row["verified_score"]) == honest
    counted = graded["counted"]["results"]["course"]
    assert counted["score"] == honest + earned and counted["provisional_score"] == earned, messages(counted)
    html = (graded["out"] / "feedback" / "course" / f"{ASSIGNMENT}.html").read_text()
    assert "Tesla T4" in html and "provisional" in html
