"""Lab 03 graded for real: its sandboxes, the grader's own measurements on this CPU, and whole
submissions through ``python -m grader autograde``.

* The sandboxes (``grader/judging.py`` on the lab's checks): a calculator and a decode formula that
  call the course's arithmetic, and a scheduler that calls the grader's rule, get no points, whatever
  they return.
* ``reference.measure`` on the smoke context gives usable numbers for every need.
* One ``autograde --jobs 2`` batch grades the reference answers (full marks), the untouched release
  (zero), two hostile submissions (the course's arithmetic behind the learner's names; decode numbers
  typed in and a scheduler right on the notebook's trace only), each scoring no more than its honest
  part, and the reference with a T4 record beside it: its measured cells judged from the record,
  provisional, not counted without ``--count-provisional`` (counted with it in a second, one-notebook
  batch). vLLM is left out of these runs (``GPULAB_VLLM_PYTHON`` points nowhere): the serving cell is
  not graded, and its engine alone would take minutes per notebook; tests/conftest.py's
  ``graded_reference`` grades the reference with it.
"""
from __future__ import annotations

import json
import math
import os

import pytest

from grader.labs.inference_serving import reference as R
from tests.grader.labs import inference_serving_cases as C
from tests.nbcells import autograde, cell, messages, scores, src

pytestmark = pytest.mark.slow
NO_VLLM = {"GPULAB_VLLM_PYTHON": "/nonexistent/no-vllm-for-these-runs"}

COURSE_CALCULATOR = '''def kv_cache_calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib, block_size=16):
    """vLLM's own arithmetic, from the course."""
    from utils.kv.kvcache import KVSpec, dtype_bytes
    from utils.kv.vllm_kv import vllm_plan

    p = vllm_plan(KVSpec(layers, kv_heads, head_dim, dtype_bytes(dtype)), context, int(kv_memory_gib * 2**30),
                  batch=batch, block_size=block_size, token_formula="blocks")
    return {"bytes_per_token": p.bytes_per_token, "cache_bytes": p.batch_kv_bytes_unpaged,
            "num_blocks": p.num_blocks, "max_concurrency": p.max_concurrency}
'''
COURSE_FORMULA = '''def bytes_per_decode_step(weight_bytes, kv_bytes_per_token, batch, context_len):
    return inference.decode_bytes_per_step(weight_bytes, kv_bytes_per_token, batch, context_len)
'''
TYPED_DECODE = '''
for name, d in decode.items():  # numbers from a GPU run, typed in: consistent, twenty times faster than this machine
    n = SIZES.new_tokens
    d["tn"] = timing.TimingResult.from_times([d["t1"].median_ms + 0.05 * (n - 1) * f for f in (0.99, 1, 1.01)],
                                             d["t1"].method)
    d["tpot_ms"] = (d["tn"].median_ms - d["t1"].median_ms) / (n - 1)
    d["tokens_per_s"] = 1e3 / d["tpot_ms"]
    d["bandwidth_gbs"] = BYTES_PER_STEP * d["tokens_per_s"] / 1e9
    d["copy_fraction"] = d["bandwidth_gbs"] / copy_gbs
'''
NOTEBOOK_TRACE_ONLY = '''

_rule = continuous_batching


def continuous_batching(engine, allocator):
    """Right where the notebook looks, static batching anywhere else."""
    if [tuple(r) for r in engine.trace] == [tuple(r) for r in paged_batching.make_trace(12, seed=4)]:
        return _rule(engine, allocator)
    return paged_batching.static_batching(engine)
'''


# -- the sandboxes ----------------------------------------------------------------------------------

def _judge(nb: dict, cells: dict, tmp_path, monkeypatch, measure=None) -> dict:
    """``grader.judging.judge_all`` on ``nb``'s definitions for ``cells`` (grade id -> exported values)."""
    from grader import context, definitions, labs
    from grader.judging import Run, judge_all

    lab = labs.load(C.ASSIGNMENT)
    if measure is not None:
        monkeypatch.setattr(lab.part("reference"), "measure", measure)
    exports = {c: json.dumps({"cell": c, "values": C.plain(v), "missing": [], "errors": {}}) for c, v in cells.items()}
    run = Run(lab, {c: float(C.POINTS[c]) for c in cells}, exports, context.live(C.ASSIGNMENT), definitions.job(nb),
              definitions.read_code(), tmp_path, seed=12345)
    return judge_all(run)


def _with(nb: dict, cell_id: str, text: str) -> dict:
    nb = json.loads(json.dumps(nb))
    cell(nb, cell_id)["source"] = text
    return nb


def test_the_course_arithmetic_behind_the_learners_names_earns_nothing(tmp_path, monkeypatch):
    nb = json.loads(C.SOURCE.read_text())
    decode_src = src(cell(nb, "decode_answer"))
    nb = _with(nb, "kv_calculator_answer", COURSE_CALCULATOR)
    nb = _with(nb, "decode_answer", COURSE_FORMULA + decode_src[decode_src.index("\n### BEGIN SOLUTION\nBYTES"):])
    ctx = C.context()
    verdicts = _judge(nb, {"test_kv_calculator": {}, "test_decode": C.decode_values(ctx),
                           "test_kv_growth": C.growth_values(ctx)}, tmp_path, monkeypatch)
    for c, fn in (("test_kv_calculator", "utils.kv.kvcache.dtype_bytes"), ("test_kv_growth", "utils.kv.kvcache.dtype_bytes"),
                  ("test_decode", "utils.serving.inference.decode_bytes_per_step")):
        v = verdicts[c]
        assert v.points == 0 and f"your answer called {fn}, the course's own implementation" in v.message, v


def test_the_graders_rule_is_out_of_reach_of_the_scheduler(tmp_path, monkeypatch):
    nb = json.loads(C.SOURCE.read_text())
    values = C.batching_values()

    def measure(ctx, needs, slowdown, cache):
        return C.reference(ctx, measured={"gain": R.Measured(values["throughput_gain"], 0.5, "by hand")})

    paged = src(cell(nb, "paged_answer"))
    cheat = paged.replace("def continuous_batching(engine, allocator):", "def _mine(engine, allocator):") + (
        "\n\ndef continuous_batching(engine, allocator):\n"
        "    from grader.labs.inference_serving import reference\n"
        "    reference.rule_schedule(engine)\n")
    bad = _judge(_with(nb, "paged_answer", cheat), {"test_batching": values}, tmp_path, monkeypatch, measure)
    v = bad["test_batching"]
    assert v.points == 0 and "reference.rule_schedule, the course's own implementation" in v.message, v.message


# -- the grader's own measurements ------------------------------------------------------------------

def test_reference_measure_on_a_cpu_gives_usable_numbers_for_every_need():
    from grader import context

    ctx = context.live(C.ASSIGNMENT)
    ref = R.measure(ctx, frozenset({"decode", "growth", "quant", "gain"}), 1.0, {})
    assert ref.measured == {} and ref.quant_modes == () and "CUDA" in ref.quant_why  # measured when a judge compares
    for k in ("tpot:eager", "tpot:static_compiled", "tpot:fast", "copy", "growth", "gain", "quant:weights:fp32",
              "quant:ppl:fp32"):
        m = ref.value(k)
        assert m.value > 0 and math.isfinite(m.value) and 0 < m.rel <= 7.0, (k, m)
    assert ref.value("growth").value == 2048.0  # llama-tiny, 2 sequences of fp32: read exactly
    assert ref.value("speedup") > 0
    with pytest.raises(KeyError, match="not among this cell's measurements"):
        R.measure(ctx, frozenset({"growth"}), 1.0, {}).value("gain")
    assert ref.bytes_per_step == ref.weight_bytes_read + ref.context_len * ref.kv_bytes_per_token


# -- whole submissions, through the real commands ---------------------------------------------------

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    from grader.release import reference_submission, released_text

    rel = tmp_path_factory.mktemp("release")
    (rel / f"{C.ASSIGNMENT}.ipynb").write_text(released_text(C.ASSIGNMENT))
    answered = reference_submission(C.ASSIGNMENT, notebooks_dir=rel)
    subs, rec_subs = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("record-only")

    def put(folder, name, nb, record=None):
        (folder / f"{name}.ipynb").write_text(json.dumps(nb, indent=1))
        if record is not None:
            (folder / f"{name}.record.json").write_text(json.dumps(record))

    put(subs, "reference", answered)
    put(subs, "release", json.loads((rel / f"{C.ASSIGNMENT}.ipynb").read_text()))
    decode_src = src(cell(answered, "decode_answer"))
    course = _with(answered, "kv_calculator_answer", COURSE_CALCULATOR + src(cell(answered, "kv_calculator_answer"))[
        src(cell(answered, "kv_calculator_answer")).index("\nEXAMPLES"):])
    put(subs, "course_arithmetic", _with(course, "decode_answer", COURSE_FORMULA + decode_src[
        decode_src.index("\n### BEGIN SOLUTION\nBYTES"):]))
    typed = _with(answered, "decode_answer", decode_src.replace("### END SOLUTION\nprint(", TYPED_DECODE.lstrip("\n")
                                                                 + "### END SOLUTION\nprint(", 1))
    put(subs, "typed_and_special_cased", _with(typed, "paged_answer", src(cell(answered, "paged_answer")) + NOTEBOOK_TRACE_ONLY))
    put(subs, "with_t4_record", answered, C.gpu_record("t4"))
    put(rec_subs, "with_t4_record", answered, C.gpu_record("t4"))
    old = {k: os.environ.get(k) for k in NO_VLLM}
    os.environ.update(NO_VLLM)
    try:
        out = tmp_path_factory.mktemp("graded")
        main = autograde(C.ROOT, C.ASSIGNMENT, subs, out, jobs=2, timeout_s=600, wait_s=2400)
        counted = autograde(C.ROOT, C.ASSIGNMENT, rec_subs, tmp_path_factory.mktemp("graded-counted"),
                            "--count-provisional", jobs=1, timeout_s=600, wait_s=1200)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return {"main": main, "counted": counted}


def _result(batch, name):
    r = batch["main"]["results"][name]
    assert r["status"] == "ok", r["status"]
    return r


def test_the_reference_gets_full_marks_measured_live(batch):
    r = _result(batch, "reference")
    assert scores(r) == C.POINTS, messages(r)
    assert {c["cell"]: c["mode"] for c in r["cells"] if c["cell"] in C.MEASURED} == dict.fromkeys(C.MEASURED, "measured live")


def test_the_release_scores_zero_with_a_message_per_cell(batch):
    r = _result(batch, "release")
    assert r["score"] == 0 and all(c["score"] == 0 and c["message"] for c in r["cells"] if c["cell"] in C.POINTS)


def test_the_course_arithmetic_earns_only_the_honest_part(batch):
    r = _result(batch, "course_arithmetic")
    assert scores(r) == {**dict.fromkeys(C.POINTS, 0), "test_quantization": 2}, messages(r)
    assert "the course's own implementation" in messages(r)


def test_typed_numbers_and_a_special_cased_scheduler_lose_those_cells(batch):
    r = _result(batch, "typed_and_special_cased")
    assert scores(r) == {**C.POINTS, "test_decode": 0, "test_batching": 0}, messages(r)
    m = messages(r)
    assert "but the grader measured" in m.split("test_decode:")[1]
    assert any(why in m.split("test_batching:")[1] for why in ("you admitted", "your allocator handed out"))


def test_a_gpu_record_is_provisional_and_counted_only_when_asked(batch):
    r = _result(batch, "with_t4_record")
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "graded from record" for c in C.MEASURED) and modes["test_kv_calculator"] == "computed"
    assert r["verified_score"] == 3 and r["provisional_score"] == 13 and r["score"] == 3, messages(r)
    row = batch["main"]["rows"]["with_t4_record"]
    assert float(row["verified_score"]) == 3 and float(row["provisional_score"]) == 13 and float(row["score"]) == 3
    counted = batch["counted"]["results"]["with_t4_record"]
    assert counted["score"] == 16 and counted["provisional_score"] == 13, messages(counted)
    html = (batch["main"]["out"] / "feedback" / "with_t4_record" / f"{C.ASSIGNMENT}.html").read_text()
    assert "Tesla T4" in html and "provisional" in html
