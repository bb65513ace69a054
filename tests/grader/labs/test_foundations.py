"""Lab 00's judges (grader/labs/foundations/judges.py), pure: each passes the right answers and fails
each wrong one with a message that names the mistake; and the grader's own measurements on a CPU.

The answers are built here as the notebook's export would send them, for the smoke sizes, from
chosen rates; a Reference stands for the grader's measurement. Graded through the real commands:
tests/grader/test_attacks.py (the reference, the release and the attacks, on lab 00).
"""
from __future__ import annotations

import dataclasses
import json
import random

import pytest

from grader import context
from grader.answers import encode
from grader.expect import Fail
from grader.judging import Answers, Case
from grader.labs.foundations import judges, reference
from grader.labs.foundations.answers import ANSWERS, KERNELS, ROOFS
from grader.measuring import Measured
from grader.schema import loads
from tests.grader.labs import foundations_answers as made
from utils.measure import matmul_sweep
from utils.measure.flops import bound
from utils.units import tflop_per_s

CTX = context.live("00_foundations")
RATES = made.CPU_RATES


def ref(**override):
    r = made.ref(CTX)
    r.measured.update({k: Measured(v, 1.5, "test") for k, v in override.items()})
    return r


def answers() -> dict[str, dict]:
    return made.answers(CTX)


def timing(ms: float) -> dict:
    return made.timing(ms)


JUDGE = {c.cell: c.judge for c in judges.CHECKS}


def judge(cell: str, values: dict, reference_=None):
    specs = ANSWERS[cell]
    decoded = {name: specs[name].spec.decode(loads(json.dumps(encode(v))), name)  # as they cross the boundary
               for name, v in values.items()}
    return JUDGE[cell](Answers(decoded), reference_ or ref())


@pytest.mark.parametrize("cell", ["test_matmul", "test_memory", "test_roofline", "test_training", "test_limiter",
                                  "test_sweep"])
def test_right_answers_pass_and_say_how_they_compare(cell):
    lines = judge(cell, answers()[cell])
    assert lines and all("grader" in ln or "recorded" in ln for ln in lines if "band" in ln)


WRONG = [  # cell, a change, what the message must name
    ("test_matmul", dict(matmul_flops=256**3), "matmul_flops"),
    ("test_matmul", dict(matmul_bytes=3 * 256 * 256 * 2), "4 bytes per float32"),
    ("test_matmul", dict(matmul_tflops=1e3), "matmul_tflops"),
    ("test_memory", dict(ew_bytes=4 * 2**20), "read x and write out"),
    ("test_roofline", dict(thin_bytes=1), "thin_bytes"),
    ("test_training", dict(monitor={}), "recorded nothing"),
    ("test_training", dict(monitor_s=0.0), "shorter than the training"),
    ("test_limiter", dict(small_batch=2), "a quarter of the full batch"),
    ("test_limiter", dict(STEP_BYTES=10**6), "STEP_BYTES"),
    ("test_sweep", dict(SM_COUNT=132), "SM_COUNT"),
    ("test_sweep", dict(MAX_ACHIEVABLE_TFLOPS=0.01), "fastest shape"),
]


@pytest.mark.parametrize("cell, change, named", WRONG)
def test_a_wrong_answer_fails_naming_it(cell, change, named):
    values = dict(answers()[cell], **change)
    with pytest.raises(Fail, match=named):
        judge(cell, values)


def test_a_number_far_from_the_graders_measurement_fails_whatever_spread_it_claims():
    values = answers()["test_matmul"]
    n = CTX.sizes.matmul_n
    ms = 2 * n**3 / (10 * RATES["matmul"] * 1e9)  # ten times the grader's rate, a huge spread claimed
    values.update(matmul_tflops=tflop_per_s(2 * n**3, ms), matmul_time=dict(timing(ms), p20_ms=1e-6, p80_ms=1e6))
    with pytest.raises(Fail, match="the grader measured"):
        judge("test_matmul", values)


def test_every_wrong_placement_fails():
    base = answers()["test_roofline"]
    for roof in ROOFS:
        for kernel in KERNELS:
            for wrong in {"compute", "memory", "overhead"} - {base["placements"][roof][kernel]}:
                values = dict(base, placements={r: dict(p) for r, p in base["placements"].items()})
                values["placements"][roof][kernel] = wrong
                with pytest.raises(Fail, match=rf"placements\['{roof}'\]\['{kernel}'\]"):
                    judge("test_roofline", values)


def test_a_limiter_that_does_not_follow_from_its_numbers_fails():
    values = answers()["test_limiter"]
    values["LIMITER"] = next(x for x in ("compute", "memory", "overhead") if x != values["LIMITER"])
    with pytest.raises(Fail, match="LIMITER"):
        judge("test_limiter", values)


def test_from_a_record_the_comparisons_are_notes_and_the_rules_still_apply():
    rec = dataclasses.replace(ref(), live=False, measured={})
    lines = judge("test_matmul", answers()["test_matmul"], rec)
    assert any("as recorded (not re-measured)" in ln for ln in lines)
    with pytest.raises(Fail, match="matmul_flops"):
        judge("test_matmul", dict(answers()["test_matmul"], matmul_flops=1), rec)


def _results(values: list) -> list[Case]:
    return [Case(True, v) for v in values]


def test_formula_cells_on_hidden_cases():
    rng = random.Random(7)
    cases = judges.bound_cases(rng, CTX)
    right = [bound(i, p, b, t) for i, t, p, b in cases]
    a = Answers({}, calls={"classify_bound": _results(right)}, inputs={"classify_bound": cases})
    assert "all 40 hidden cases" in judges.classify(a, None)[0]
    # a rule with the threshold at 20% instead of 10%: wrong on some drawn cases, the message names no input
    wrong = ["overhead" if t < 0.2 * min(p, i * b / 1e3) else r for (i, t, p, b), r in zip(cases, right, strict=True)]
    a = Answers({}, calls={"classify_bound": _results(wrong)}, inputs={"classify_bound": cases})
    with pytest.raises(Fail, match=r"disagreed with the rule on \d+ of 40 hidden cases") as exc:
        judges.classify(a, None)
    assert all(f"{x:g}" not in str(exc.value) for row in cases for x in row)
    q = judges.quantization_shapes(random.Random(3), CTX)
    qin = [[m, n, s] for m, n, k, s, b in q]
    good = [[x.tiles, x.waves, x.useful_fraction] for x in (matmul_sweep.quantization(m, n, 8, s, 2) for m, n, s in qin)]
    slow = [bool(matmul_sweep.quantization(*row).slow) for row in q]
    a = Answers({}, calls={"quantization": _results(good), "predict_slow": _results(slow)},
                inputs={"quantization": qin, "predict_slow": q})
    assert len(judges.quantization(a, None)) == 2
    a.calls["predict_slow"] = _results([int(x) for x in slow])  # 0/1 instead of a bool
    with pytest.raises(Fail, match="predict_slow"):
        judges.quantization(a, None)


def test_hidden_cases_come_from_the_seed():
    assert judges.bound_cases(random.Random(1), CTX) != judges.bound_cases(random.Random(2), CTX)
    assert judges.quantization_shapes(random.Random(1), CTX) == judges.quantization_shapes(random.Random(1), CTX)


@pytest.mark.slow
def test_the_graders_own_measurements_on_this_cpu():
    r = reference.measure(CTX, frozenset(("matmul", "memory", "thin", "tiny", "train", "step_bytes", "sweep")), 1.0, {})
    for key in ("matmul", "copy", "ew_gbs", "ew_tflops", "thin", "tiny", "tokens_per_s", "batch_scaling"):
        assert r.measured[key].value > 0 and 1.5 <= r.measured[key].rel <= 3.0, key
    assert r.step_bytes > 0 and r.sm_count == matmul_sweep.CPU_STAND_IN_SMS
    assert {k for k in r.measured if k.startswith("sweep:")} == {
        f"sweep:{k}" for k in matmul_sweep.sweep_shapes(r.sm_count, "cpu")}


# wrong answers of the kinds learners give, each against the cases the grader draws
WRONG_RULES = [
    ("arithmetic_intensity", lambda f, b: b / f if f else 0.0, "intensity", "bytes per FLOP"),
    ("arithmetic_intensity", lambda f, b: 4096 / 3 if f > 1e9 else 0.125, "intensity", "the two visible examples only"),
    ("achieved_tflops", lambda f, ms: f / ms / 1e12, "rates", "milliseconds read as seconds"),
    ("achieved_bandwidth_gbs", lambda b, ms: b / (ms * 1e-3) / 2**30, "rates", "GiB/s for GB/s, 7% off"),
    ("classify_bound", lambda i, t, p, b: "overhead" if t < 0.01 * min(p, i * b / 1e3)
     else ("compute" if i >= p * 1e3 / b else "memory"), "classify", "overhead at 1% of the roof"),
    ("classify_bound", lambda i, t, p, b: "overhead" if t < 0.1 * p
     else ("compute" if i >= p * 1e3 / b else "memory"), "classify", "overhead against the peak, not the roof"),
]


@pytest.mark.parametrize("name, wrong, judge_name, kind", WRONG_RULES, ids=[w[3] for w in WRONG_RULES])
def test_a_wrong_rule_fails_on_the_drawn_cases(name, wrong, judge_name, kind):
    check = next(c for c in judges.CHECKS if name in c.calls)
    rng = random.Random(11)
    inputs = {n: make(random.Random(rng.random()), CTX) for n, make in check.calls.items()}
    right = {"arithmetic_intensity": lambda f, b: f / b, "achieved_tflops": lambda f, ms: f / (ms * 1e-3) / 1e12,
             "achieved_bandwidth_gbs": lambda b, ms: b / (ms * 1e-3) / 1e9,
             "classify_bound": lambda i, t, p, b: bound(i, p, b, t)}
    calls = {n: _results([(wrong if n == name else right[n])(*args) for args in inputs[n]]) for n in inputs}
    with pytest.raises(Fail, match=f"{name} disagreed with the rule"):
        getattr(judges, judge_name)(Answers({}, calls=calls, inputs=inputs), None)
