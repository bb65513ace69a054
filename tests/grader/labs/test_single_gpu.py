"""Lab 01's judges (grader/labs/single_gpu/judges.py), pure: each passes the right answers and fails each
wrong one with a message that names the mistake, live and from a GPU record; the hidden cases drawn
from the seed; the learner's functions run in a real sandbox where the course's rules are tripwires;
the optimized-loop harness on this CPU; and the grader's own measurements on a CPU.

The answers are built as the notebook's export sends them (tests/grader/labs/single_gpu_answers.py);
a Reference stands for the grader's measurement. Graded through the real commands:
tests/grader/labs/test_single_gpu_grading.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import pytest

from grader import definitions
from grader.answers import encode
from grader.expect import Fail, Unusable
from grader.judging import Answers, Case, Run, _calls, _new_sandbox
from grader.labs.single_gpu import harness, judges, reference
from grader.labs.single_gpu.answers import ANSWERS
from grader.schema import loads
from tests.grader.labs import single_gpu_answers as made
from tests.nbcells import cell, src
from utils.diagnosis.profile_diagnosis import ProfileSummary, diagnose
from utils.train.training import RECIPES, naive_config, replace, with_changes

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "grader" / "source" / "01_single_gpu" / "01_single_gpu.ipynb"
CTX = made.ctx()
T4 = made.ctx("t4", "cuda", made.GPU_CARD)
JUDGE = {c.cell: c.judge for c in judges.CHECKS}
CHECKS = {c.cell: c for c in judges.CHECKS}
CPU = "cpu-bound (no GPU in the trace)"


def solution(grade_id: str, ns: dict | None = None) -> dict:
    """The source notebook's solution cell ``grade_id``, run in ``ns``."""
    ns = {} if ns is None else ns
    exec(compile(src(cell(json.loads(SOURCE.read_text()), grade_id)), grade_id, "exec"), ns)  # noqa: S102
    return ns


REFERENCE_DIAGNOSE = solution("diagnose_function")["diagnose"]


def decoded(c: str, values: dict) -> dict:
    specs = ANSWERS[c]
    return {name: specs[name].spec.decode(loads(json.dumps(encode(v))), name) for name, v in values.items()}


def judge(c: str, values: dict, ref=None, harness_out=None, sections=None, ground_truth=()):
    a = Answers(decoded(c, values), harness=harness_out, sections=sections, ground_truth=ground_truth)
    return JUDGE[c](a, ref if ref is not None else made.ref())


def record_ref(c=T4):
    return reference.from_record(c, {})


def diagnosed(profile: dict, fn=REFERENCE_DIAGNOSE) -> list[dict]:
    """What harness.diagnose_each returns for ``fn`` on the learner's profile and its variants."""
    params = judges.diagnosis_params(None, Answers({"profile": profile}))
    out = []
    for spec in params["summaries"]:
        try:
            out.append({"ok": json.loads(json.dumps(encode(fn(judges.from_spec(spec)))))})
        except Exception as exc:  # noqa: BLE001 - as the harness reports it
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


# -- the rate functions and diagnose on hidden cases ---------------------------------------------------

def _results(values: list) -> list[Case]:
    return [Case(True, v) for v in values]


def test_rates_on_hidden_cases():
    rng = random.Random(7)
    inputs = {"tokens_per_second": judges.tokens_cases(rng, CTX), "mfu": judges.mfu_cases(rng, CTX),
              "full_finetune_gib": judges.finetune_cases(rng, CTX)}
    fns = solution("rates_functions")
    right = {k: _results([fns[k](*args) for args in v]) for k, v in inputs.items()}
    assert all("right on all 10" in ln for ln in judges.rates(Answers({}, calls=right, inputs=inputs), None))
    wrong = {"tokens_per_second": lambda tokens, ms: tokens / ms,  # milliseconds taken as seconds
             "mfu": lambda tps, f, peak: tps * f / (peak * 1e15),  # the peak read as PFLOP/s
             "full_finetune_gib": lambda n: 16.0}  # the visible example's answer for every model
    for name, fn in wrong.items():
        calls = dict(right, **{name: _results([fn(*args) for args in inputs[name]])})
        with pytest.raises(Fail, match=rf"{name} disagreed with the rule on 10 of 10 hidden cases") as exc:
            judges.rates(Answers({}, calls=calls, inputs=inputs), None)
        named = [f"{x:.4g}" for row in inputs[name] for x in row if len(f"{x:.4g}") >= 5]
        assert not [x for x in named if x in str(exc.value)]  # no hidden input named


def without(rule: str):
    """The reference ``diagnose`` with one rule left out, the GPU rules tried first, or one first fix wrong."""
    ref = REFERENCE_DIAGNOSE

    def diagnose(s):
        if rule == "idle first" and s.gpu_idle_fraction is not None and s.gpu_idle_fraction >= 0.3:
            return ref(dataclasses.replace(s, loader_wait_fraction=0.0, h2d_ms_per_step=0.0))
        if rule == "loader" and s.loader_wait_fraction >= 0.2:
            return ref(dataclasses.replace(s, loader_wait_fraction=0.0))
        if rule == "copies" and s.loader_wait_fraction < 0.2 and s.h2d_ms_per_step >= 0.2 * s.step_time_ms:
            return ref(dataclasses.replace(s, h2d_ms_per_step=0.0))
        got = ref(s)
        wrong = {"sync": ("host-sync-bound", ("overhead-bound (launch/Python)", "batch_size")),
                 "idle unnamed": ("idle GPU, cause not named", ("host-sync-bound", "sync_every_step")),
                 "matmul share": ("memory-bound", ("compute-bound", "precision")),
                 "no GPU": (CPU, ("compute-bound", "precision")),
                 "fix": ("host-sync-bound", ("host-sync-bound", "num_workers"))}.get(rule)
        return wrong[1] if wrong and got[0] == wrong[0] else got
    return diagnose


RULES = ("loader", "copies", "sync", "idle unnamed", "matmul share", "no GPU", "idle first", "fix")


def _unseen(fn, seed: int = 11):
    cases = judges.unseen_cases(random.Random(seed), CTX)
    got = []
    for (spec,) in cases:
        try:
            got.append(Case(True, json.loads(json.dumps(encode(fn(judges.from_spec(spec)))))))
        except Exception as exc:  # noqa: BLE001
            got.append(Case(False, error=str(exc)))
    return judges.unseen(Answers({}, calls={"diagnose": got}, inputs={"diagnose": cases}), None)


def test_the_reference_diagnose_is_right_on_every_unseen_loop():
    assert _unseen(REFERENCE_DIAGNOSE) == ["diagnose: right on all 18 hidden cases"]  # 16 drawn, 2 profiled here


def test_the_reference_diagnose_is_right_on_many_draws():
    from utils.diagnosis.diagnosis_cases import synthetic_cases

    for seed in range(30):
        for name, s in synthetic_cases(seed):
            got = REFERENCE_DIAGNOSE(s)
            want, fixes = judges.verdict(s)
            assert got[0] == want and got[1] in fixes, (seed, name, got)


@pytest.mark.parametrize("fn", [without(r) for r in RULES] + [
    lambda s: ("data-loading-bound", "num_workers"), lambda s: (CPU, None),  # constants
    lambda s: (s.diagnosis, None),  # the summary's own verdict: blank on every summary handed over
    lambda s: "compute-bound"], ids=[*RULES, "constant", "constant_cpu", "copies_the_blank_verdict", "wrong_shape"])
def test_a_wrong_diagnose_fails_the_unseen_loops(fn):
    with pytest.raises(Fail, match=r"diagnose disagreed with the rule on \d+ of 18 hidden cases"):
        _unseen(fn)


def test_hidden_cases_come_from_the_seed():
    for make in (judges.tokens_cases, judges.mfu_cases, judges.finetune_cases):
        assert make(random.Random(1), CTX) != make(random.Random(2), CTX)
        assert make(random.Random(1), CTX) == make(random.Random(1), CTX)
    one, two = judges.unseen_cases(random.Random(1), CTX), judges.unseen_cases(random.Random(2), CTX)
    assert [c[0]["kwargs"]["step_time_ms"] for c in one[:16]] != [c[0]["kwargs"]["step_time_ms"] for c in two[:16]]
    s = made.summary("host-sync-bound")
    assert judges.from_spec(judges.to_spec(s)) == s.evidence()  # what the sandbox builds is what the judge rebuilds


# -- the naive baseline ------------------------------------------------------------------------------

def base(**change) -> dict:
    return dict(made.answers()["test_baseline"], **change)


def test_the_baseline_passes_and_says_how_it_compares():
    assert judge("test_baseline", base()) == [
        f"baseline_tps: grader {made.NAIVE_TPS:.4g} tokens/s, yours {made.NAIVE_TPS:.4g} tokens/s (band +-150%, test)"]


def test_a_baseline_that_is_not_the_naive_loop_or_not_its_own_measurement_fails():
    s = CTX.sizes
    big = dataclasses.asdict(with_changes(naive_config(s.naive_batch, s.seq_len), batch_size=s.big_batch))
    b = base()["baseline"]
    per_ms = {**b, "tokens_per_s": b["tokens_per_s"] / 1000}
    for change, named in [
            (dict(naive_config=big), r"naive must be training.build_loop.*batch_size=8 \(expected 2\)"),
            (dict(naive_preset="gpt2-small"), "naive must be training.build_loop"),
            (dict(baseline_tps=42.1e3), r"baseline_tps = 42100, expected"),  # the text's H200 figure typed in
            (dict(baseline=per_ms), r"baseline\['tokens_per_s'\] = .*its steps over its total_s"),
            (dict(baseline={**b, "p20_ms": 2 * b["median_ms"]}), "not a timing"),
            (dict(baseline={**b, "tokens_per_s": None}), "tokens_per_step=naive.tokens_per_step"),
            (dict(monitor={}), "recorded nothing"),
            (dict(monitor_s=0.0), "shorter than the measured steps"),
            (dict(monitor={"cpu": {**base()["monitor"]["cpu"], "util_cpu_pct": {"mean": 180.0, "max": 250.0}}}),
             "between 0 and 100%")]:
        with pytest.raises(Fail, match=named):
            judge("test_baseline", base(**change))


def test_a_baseline_far_from_the_graders_fails_even_when_its_summary_agrees():
    """Tokens per millisecond given as tokens/s, with the Stopwatch summary rebuilt to agree: 1000x below
    the grader's naive loop, outside its band (x2.5 in smoke mode, x8 at most widened for load)."""
    per_ms = made.answers(naive_tps=made.NAIVE_TPS / 1000)["test_baseline"]  # summary and monitor to agree
    with pytest.raises(Fail, match=r"baseline_tps = 2 tokens/s, but the grader measured 2000 tokens/s"):
        judge("test_baseline", per_ms)


def test_a_gpu_baseline_above_the_datasheet_fails_and_a_record_is_a_note():
    a = made.answers(T4, naive_tps=3000.0)["test_baseline"]
    assert judge("test_baseline", a, record_ref()) == ["baseline_tps: 3000 tokens/s as recorded (not re-measured)"]
    fast = made.answers(T4, naive_tps=30000.0)["test_baseline"]  # 23 TFLOP/s of fp32 on a T4 (8.1)
    with pytest.raises(Fail, match="above the T4 fp32 datasheet peak"):
        judge("test_baseline", fast, record_ref())


# -- the diagnosis of the learner's own profile ----------------------------------------------------------

def diag(label: str = CPU, **change) -> dict:
    return dict(made.answers(label=label)["test_diagnosis"], **change)


def test_the_diagnosis_passes_live_and_from_a_record():
    a = diag()
    lines = judge("test_diagnosis", a, harness_out=diagnosed(a["profile"]))
    assert "grader's profile of the naive loop: cpu-bound" in lines[0]
    g = diag("compute-bound")
    lines = judge("test_diagnosis", g, record_ref(), harness_out=diagnosed(g["profile"]))
    assert "on your recorded cuda profile" in lines[0]


@pytest.mark.parametrize("fn, change, named", [
    (None, dict(BOTTLENECK="compute-bound", FIRST_FIX="precision"), "but your diagnose returns"),
    (None, dict(FIRST_FIX="num_workers"), "but your diagnose returns"),
    (lambda s: (CPU, "precision"), dict(FIRST_FIX="precision"), "not what the table in section 3 says"),
    (lambda s: (CPU, None), {}, "DataLoader wait at 60%"),  # right on the profile, constant: the variants catch it
    (lambda s: (s.diagnosis, None), {}, "must be one of"),  # the summary's verdict: blank, as handed over
    (lambda s: s.diagnosis, {}, r"must return \(bottleneck, first fix\)"),
    (lambda s: 1 / 0, {}, "your diagnose raised ZeroDivisionError"),
], ids=["claims_another_verdict", "claims_another_fix", "wrong_fix", "constant", "copies_the_verdict", "wrong_shape",
        "raises"])
def test_a_wrong_diagnosis_of_its_own_profile_fails(fn, change, named):
    a = diag(**change)
    with pytest.raises(Fail, match=named):
        judge("test_diagnosis", a, harness_out=diagnosed(a["profile"], fn or REFERENCE_DIAGNOSE))


def test_an_edited_or_foreign_profile_or_a_call_to_the_course_fails():
    a = diag()
    edited = dict(a, profile={**a["profile"], "diagnosis": "compute-bound"}, BOTTLENECK="compute-bound",
                  FIRST_FIX="precision")
    with pytest.raises(Fail, match="was edited"):
        judge("test_diagnosis", edited, harness_out=diagnosed(edited["profile"]))
    with pytest.raises(Fail, match="called the course's own rules"):
        judge("test_diagnosis", a, harness_out=[{"error": "GroundTruthError: utils.diagnosis.profile_diagnosis.diagnose is "
                                                          "the course's implementation"}] * 3)
    waits = made.summary(CPU)  # the grader's CPU profile of the naive loop, waiting on its DataLoader
    waits = dataclasses.replace(waits, loader_wait_fraction=0.6, loader_wait_ms_per_step=0.6 * waits.step_time_ms)
    waits.diagnosis, waits.explanation, waits.suggestion, waits.findings = diagnose(waits)
    with pytest.raises(Fail, match="the grader's profile of the naive loop finds 'data-loading-bound'"):
        judge("test_diagnosis", a, dataclasses.replace(made.ref(), profile=waits), harness_out=diagnosed(a["profile"]))
    g = diag("data-loading-bound")  # a GPU-shaped profile against the grader's CPU one
    g["profile"] = {**g["profile"], "device": "cuda"}
    with pytest.raises(Fail, match="your profile is of a cuda trace"):
        judge("test_diagnosis", g, harness_out=diagnosed(g["profile"]))
    g = diag("host-sync-bound")  # from a record: the learner's diagnose is re-run on the recorded profile
    with pytest.raises(Fail, match="with its DataLoader wait at 60% of the step: your diagnose says 'host-sync-bound'"):
        judge("test_diagnosis", g, record_ref(), harness_out=diagnosed(g["profile"], lambda s: ("host-sync-bound",
                                                                                               "sync_every_step")))


# -- the optimized loop --------------------------------------------------------------------------------

def opt(**change) -> dict:
    return dict(made.answers()["test_optimized"], **change)


def opt_judge(values=None, ref=None, **harness_kw):
    h, sections = made.harness_result(**harness_kw)
    return judge("test_optimized", values or opt(), ref, h, sections)


def test_the_optimized_loop_passes_and_says_how_it_compares():
    lines = opt_judge()
    assert lines[0].startswith("your loop, audited: 512 tokens per step fed to the model")
    assert lines[1].startswith("speedup: grader 4 x, yours 4 x")
    assert "from 8 to 7.75" in lines[2]


def test_numbers_the_notebook_did_not_measure_fail():
    """The text's 9.5x typed in; optimized tokens/s made up from it; 20x with its measurement edited to agree
    (outside the band of the grader's 4x even at x2.5)."""
    a = opt()
    with pytest.raises(Fail, match=r"speedup = 9\.5, expected 4"):
        opt_judge(opt(speedup=9.5))
    made_up = 9.5 * a["baseline_tps"]
    with pytest.raises(Fail, match=r"optimized_tps = .*, expected .*opt_row\['tokens_per_s'\]"):
        opt_judge(opt(speedup=9.5, optimized_tps=made_up))
    made_up = 20 * a["baseline_tps"]
    with pytest.raises(Fail, match=r"speedup = 20 x, but the grader measured 4 x"):
        opt_judge(opt(speedup=20.0, optimized_tps=made_up, opt_row={**a["opt_row"], "tokens_per_s": made_up}))
    with pytest.raises(Fail, match="while audited.measure timed it, your loop fed the model 256 tokens"):
        opt_judge(opt(opt_row={**a["opt_row"], "tokens_per_step_counted": 256.0}))


@pytest.mark.parametrize("changes, named", [
    ({"tokens_per_step_counted": [512, 512, 256, 512, 512]}, "step 2 fed the model 256 tokens"),
    ({"tokens_per_step_counted": [512] * 4}, "counted tokens in 4 steps, not 5"),
    ({"steps_that_updated": 2}, "2 of 4 steps left every weight unchanged"),  # the optimizer every other step
    ({"steps_that_updated": 0}, "4 of 4 steps left every weight unchanged"),  # never steps the optimizer
    ({"host_syncs": 4}, "4 host syncs in 4 steps, 0 in the course's"),  # .item() every step
    ({"host_syncs": 7, "reference_host_syncs": 4}, "0.75 more per step"),  # a GradScaler's syncs, plus one per step
    ({"fixed_loss_after": 10.6}, "yours must fall at least 0.5x as much"),
    ({"fixed_loss_after": 11.5}, "yours must fall"),
    ({"first_loss_reported": 10.93 / 4}, "step 1 returned the loss 2.7325"),  # divided by 4 accumulation steps
    ({"precision": "fp32", "first_loss_reported": 11.1}, r"1% allowed in fp32"),
    ({"precision": "fp16", "steps_that_updated": 2}, "2 of 4 steps left"),  # a GradScaler may skip one, not two
], ids=["tokens", "steps_missing", "every_other_step", "never_steps", "sync_every_step", "sync_beyond_the_scaler",
        "barely_trains", "diverges", "loss_over_accumulation", "fp32_tolerance", "fp16_two_skipped"])
def test_the_audit_rules_fail_the_graders_audit_and_the_notebooks(changes, named):
    from utils.diagnosis.loop_audit import problems

    ok = made.audit_report(512, "bf16")
    assert problems(ok) == [] and problems({**ok, "precision": "fp16", "steps_that_updated": 3}) == []
    assert problems({**ok, "host_syncs": 5, "reference_host_syncs": 4, "first_loss_reported": 11.2}) == []
    bad = {**ok, **changes}
    h, sections = made.harness_result()
    with pytest.raises(Fail, match="the grader audited a fresh FastLoop: .*" + named):
        judge("test_optimized", opt(), None, {**h, "audit": bad}, sections)
    with pytest.raises(Fail, match=r"your own audit of FastLoop \(audited.problems\(\)\): .*" + named):
        opt_judge(opt(audit=bad))


def test_a_loop_that_skips_its_work_while_timed_fails():
    """Fewer tokens fed than claimed (it caches its batch, or returns an old loss), fewer steps than asked, or
    the tokens fed but the weights left alone (forward only): the timed steps show it."""
    with pytest.raises(Fail, match="while the grader timed it, your loop fed the model 0 tokens per step, not the 512"):
        opt_judge(tokens_per_step=0)
    with pytest.raises(Fail, match="timed section ran 1 steps of your loop, not 3"):
        opt_judge(calls=1)
    with pytest.raises(Fail, match=r"took the loss of text the grader drew afterwards from 8 to 8; the course's loop "
                                   r"takes it 0\.2 lower .* at least 0\.25x as far"):
        opt_judge(drop=0.0)
    h, sections = made.harness_result()
    with pytest.raises(Fail, match="could not time your FastLoop in all its sections"):
        judge("test_optimized", opt(), None, h, {k: v for k, v in sections.items() if k != "steps-2"})
    with pytest.raises(Fail, match="your FastLoop raised RuntimeError: CUDA error"):
        judge("test_optimized", opt(), None, {"error": "your FastLoop raised RuntimeError: CUDA error while the "
                                                       "grader audited it"}, {})


def test_a_loop_slower_than_the_naive_one_is_below_the_floor():
    """Measured at 0.5x the naive loop (and reported as such): below 1x, the floor on every tier. The miss is
    Unusable, so that the grader measures again and, beside busy cores (where the two loops do not slow
    alike), leaves it out instead of failing it (grader/judging.py)."""
    a = made.answers(speedup=0.5)["test_optimized"]
    with pytest.raises(Unusable, match=r"measured your FastLoop at 0\.5x the naive loop's tokens/s .* below the 1x"):
        opt_judge(a, speedup=0.5)


def test_the_optimized_loop_from_a_record():
    """From a T4 record: the recorded numbers' own consistency, the recorded audit, the tier's floor (2x), and
    the notebook's FastLoop audited again here on the CPU (the harness runs untimed)."""
    a = made.answers(T4, naive_tps=3000.0, speedup=3.0, precision="fp16")["test_optimized"]
    h, _ = made.harness_result()
    lines = judge("test_optimized", a, record_ref(), h, {})
    assert "audited again here" in lines[0] and "at least 2x on the t4 tier" in lines[1]
    slow = made.answers(T4, naive_tps=3000.0, speedup=1.5, precision="fp16")["test_optimized"]
    with pytest.raises(Fail, match=r"the record's speedup 1\.5x is below the 2x its tier \(t4\) expects"):
        judge("test_optimized", slow, record_ref(), h, {})
    with pytest.raises(Fail, match="the grader audited a fresh FastLoop: 4 host syncs"):
        judge("test_optimized", a, record_ref(), {**h, "audit": made.audit_report(512, host_syncs=4)}, {})
    absurd = made.answers(T4, naive_tps=30000.0, speedup=5.0, precision="fp16")["test_optimized"]  # 115 TFLOP/s
    with pytest.raises(Fail, match="above the T4 fp16 datasheet peak"):
        judge("test_optimized", absurd, record_ref(), h, {})


def test_the_harness_parameters_are_this_machines():
    p = judges.optimized_params(CTX, None)
    assert p["sections"] == harness.SECTIONS and p["preset"] == CTX.sizes.model
    rec = judges.optimized_params(T4, None)  # no GPU here: the record's loop is audited on the CPU, untimed
    assert rec["sections"] == 0 and rec["preset"] == CTX.sizes.model


# -- LoRA and QLoRA peaks, and the cause --------------------------------------------------------------

def ft(**change) -> dict:
    return dict(made.answers()["test_finetune"], **change)


def test_the_lean_recipes_pass():
    lines = judge("test_finetune", ft())
    assert lines[0].startswith("lora_peak_gib: grader 0.0068 GiB") and "not checked against the 0.7x goal" in lines[2]


def test_recipes_that_are_not_the_lean_ones_or_peaks_not_measured_fail():
    a = ft()
    trap = RECIPES["lora_bf16_autocast_eval"]
    trap_row = made.finetune_row(trap, made.PEAKS["trap"])
    for change, named in [
            (dict(lora_peak_gib=4.09, qlora_peak_gib=2.70, lora=made.finetune_row(RECIPES["lora_bf16_lean"], 4.09),
                  qlora=made.finetune_row(replace(RECIPES["lora_bf16_lean"], quant="nf4"), 2.70)),
             r"lora_peak_gib = 4\.09 GiB, but the grader measured"),  # the text's H200 table, rows made to agree
            (dict(LEAN_QLORA=a["LEAN_LORA"]), "LEAN_QLORA must be a training.FinetuneRecipe with quant='nf4'"),
            (dict(LEAN_LORA=dataclasses.asdict(trap), lora=trap_row, lora_peak_gib=made.PEAKS["trap"]),
             "more than the course's lean recipe's"),  # the eval-mode trap, with its own honest peak
            (dict(lora={**a["lora"], "recipe": dataclasses.asdict(trap)}), "was measured with the recipe"),
            (dict(lora={**a["lora"], "activations_gib": 0.0}), r"lora\['activations_gib'\]"),
            (dict(LEAN_LORA={**a["LEAN_LORA"], "lora_r": 10**6}), "a LoRA rank above 1024")]:
        with pytest.raises(Fail, match=named):
            judge("test_finetune", ft(**change))
    no_grads = made.ref()
    inner = no_grads.peak_of
    no_grads.peak_of = lambda f: {**inner(f), "lora_grads_ok": False}
    with pytest.raises(Fail, match="LEAN_LORA: some LoRA adapters got no gradient"):
        judge("test_finetune", ft(), no_grads)


def test_qlora_on_a_gpu_with_bitsandbytes_must_be_lean_enough():
    peaks = {**made.PEAKS, "lean": 3.2, "qlora": 2.0, "trap": 9.0}
    a = made.answers(T4, peaks=peaks)["test_finetune"]
    gpu_ref = made.ref(T4, bnb=(True, "ok"), peaks=peaks)
    assert "QLoRA 2 GiB vs lean LoRA 3.2 GiB (0.62x, at most 0.7)" in judge("test_finetune", a, gpu_ref)[2]
    heavy = {**peaks, "qlora": 2.8}
    a = made.answers(T4, peaks=heavy)["test_finetune"]
    with pytest.raises(Fail, match=r"QLoRA peaks at 2\.8 GiB, above 0\.7 x the lean bf16 LoRA"):
        judge("test_finetune", a, made.ref(T4, bnb=(True, "ok"), peaks=heavy))


def test_finetune_from_a_record():
    peaks = {"lean": 3.2, "trap": 9.0, "qlora": 2.0}
    a = made.answers(T4, peaks=peaks)["test_finetune"]
    assert "as recorded (not re-measured)" in judge("test_finetune", a, record_ref())[0]
    for change, named in [
            (dict(qlora={**a["qlora"], "quant": "none", "note": "4-bit QLoRA fell back"}), "ran unquantized"),
            (dict(qlora_peak_gib=3.0, qlora=made.finetune_row(replace(RECIPES["lora_bf16_lean"], quant="nf4"), 3.0,
                                                              "nf4")),
             r"QLoRA peak 3 GiB is above 0\.7 x"),
            (dict(lora_peak_gib=40.0, lora={**a["lora"], "peak_gib": 40.0, "activations_gib": 40.0 - 0.47 * 3.2}),
             "above the T4's memory")]:
        with pytest.raises(Fail, match=named):
            judge("test_finetune", dict(a, **change), record_ref())


def test_the_cause_live_and_from_a_record():
    a = made.answers()["test_cause"]
    lines = judge("test_cause", a)
    assert "eval_mode 0.0098" in lines[2]
    with pytest.raises(Fail, match=r"CAUSE = 'autocast', but of the single changes only eval_mode reaches 1\.2x"):
        judge("test_cause", dict(a, CAUSE="autocast"))
    with pytest.raises(Fail, match=r"lean_peak_gib = 4\.09 GiB, but the grader measured"):  # the H200 table's peaks
        judge("test_cause", dict(a, trap_peak_gib=11.81, lean_peak_gib=4.09))
    flat = {**made.PEAKS, "eval_mode": made.PEAKS["lean"]}
    with pytest.raises(Unusable, match="none of the single changes reached"):
        judge("test_cause", a, made.ref(peaks=flat))
    g = made.answers(T4, peaks={"lean": 3.2, "trap": 9.0, "qlora": 2.0})["test_cause"]
    assert "as recorded" in judge("test_cause", g, record_ref())[0]
    with pytest.raises(Fail, match="only 'eval_mode' reaches 2x its peak on a GPU"):
        judge("test_cause", dict(g, CAUSE="fp32_upcast"), record_ref())
    with pytest.raises(Fail, match="less than 2x its lean recipe's"):
        judge("test_cause", dict(g, trap_peak_gib=4.0), record_ref())


def test_every_graded_cell_has_a_judge_and_answers():
    nb = json.loads(SOURCE.read_text())
    graded = {c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
              if c["cell_type"] == "code" and c["metadata"]["nbgrader"].get("grade")}
    assert graded == set(CHECKS) == set(ANSWERS)
    assert "BEGIN HIDDEN TESTS" not in SOURCE.read_text()


# -- in a real sandbox: the course's rules are tripwires, the cases come from the seed -----------------------

PRELUDE = definitions.job(json.loads(SOURCE.read_text()))["prelude"]
HOSTILE = '''
import types
from utils.measure import flops
from utils.diagnosis import profile_diagnosis

def tokens_per_second(tokens_per_step, step_ms):
    return tokens_per_step / (step_ms * 1e-3)

def mfu(tokens_per_s, flops_per_token, peak_tflops):  # the course's implementation
    return flops.mfu_from_throughput(tokens_per_s, flops_per_token, peak_tflops)

def full_finetune_gib(n_params):
    return 16 * n_params / 2**30

def diagnose(summary):  # a copy of the course's function under another name is still the course's code
    d = types.FunctionType(profile_diagnosis.diagnose.__code__, profile_diagnosis.diagnose.__globals__)(summary)[0]
    return d, None

def read_the_rules(summary):
    with open(profile_diagnosis.__file__) as fh:
        return fh.read()[:100], None
'''


def _run(tmp_path, definitions_src: str, seed: int = 5) -> dict:
    """judging._calls on the computed cells with ``definitions_src`` as the learner's definitions."""
    from grader import labs
    from grader.context import live

    work = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    work.mkdir()
    run = Run(labs.load(made.A), {}, {}, live(made.A), {"prelude": PRELUDE, "definitions": [definitions_src]},
              definitions.read_code(ROOT), work, seed)
    answers = {c: Answers({}) for c in ("test_rates", "test_unseen")}
    problems: dict = {}
    _calls(run, [CHECKS[c] for c in answers], answers, problems)
    return answers


@pytest.mark.slow
def test_in_a_sandbox_calling_the_course_or_a_table_of_answers_fails(tmp_path):
    a = _run(tmp_path, HOSTILE)
    assert a["test_rates"].ground_truth and a["test_rates"].ground_truth[0].startswith("utils.measure.flops:mfu")
    assert any(not c.ok and "GroundTruthError" in c.error for c in a["test_rates"].calls["mfu"])
    assert "utils.diagnosis.profile_diagnosis:diagnose" in a["test_unseen"].ground_truth
    reference_src = "\n".join(src(cell(json.loads(SOURCE.read_text()), g)) for g in ("rates_functions", "diagnose_function"))
    good = _run(tmp_path, reference_src)
    assert not good["test_rates"].ground_truth and not good["test_unseen"].ground_truth
    assert len(judges.rates(good["test_rates"], None)) == 3
    assert judges.unseen(good["test_unseen"], None) == ["diagnose: right on all 18 hidden cases"]
    # a table: the right answers for the cases of seed 5, looked up by their inputs; seed 6 draws others
    table = {json.dumps(i): c.value for i, c in zip(good["test_rates"].inputs["mfu"], good["test_rates"].calls["mfu"],
                                                     strict=True)}
    verdicts = [c.value for c in good["test_unseen"].calls["diagnose"]]
    steps = [spec["kwargs"]["step_time_ms"] for (spec,) in good["test_unseen"].inputs["diagnose"]]
    tabled = reference_src + f'''
TABLE = {table!r}
VERDICTS = {dict(zip(steps, map(tuple, verdicts), strict=True))!r}
def mfu(tokens_per_s, flops_per_token, peak_tflops):
    return TABLE.get(__import__("json").dumps([tokens_per_s, flops_per_token, peak_tflops]), 0.0)
def diagnose(summary):
    return VERDICTS.get(summary.step_time_ms, ("compute-bound", "precision"))
'''
    same = _run(tmp_path, tabled)
    assert len(judges.rates(same["test_rates"], None)) == 3  # on its own seed the table is right
    other = _run(tmp_path, tabled, seed=6)
    with pytest.raises(Fail, match="mfu disagreed with the rule on 10 of 10"):
        judges.rates(other["test_rates"], None)
    with pytest.raises(Fail, match=r"diagnose disagreed with the rule on 1\d of 18"):  # the profiled loops' steps differ
        judges.unseen(other["test_unseen"], None)


@pytest.mark.slow
def test_in_a_sandbox_the_course_source_cannot_be_read(tmp_path):
    from grader import labs
    from grader.context import live

    run = Run(labs.load(made.A), {}, {}, live(made.A), {"prelude": PRELUDE, "definitions": [HOSTILE]},
              definitions.read_code(ROOT), tmp_path, 1)
    with _new_sandbox(run, [CHECKS["test_diagnosis"]], True, "read") as box:
        got = box.call("read_the_rules", [[judges.to_spec(made.summary(CPU))]])
        assert "error" in got[0] and re.search(r"PermissionError: reading .*profile_diagnosis.py is not allowed", got[0]["error"])
        out, _ = box.harness("grader.labs.single_gpu.harness:diagnose_each",
                             judges.diagnosis_params(None, Answers(decoded("test_diagnosis", diag()))))
        assert all("GroundTruthError" in r["error"] for r in out)


# -- the optimized loop's harness, on this CPU -----------------------------------------------------------

WRONG_LOOPS = '''
class SyncEvery(FastLoop):  # reads the loss on the host every step
    def step(self):
        loss = super().step()
        self.logged = loss.item()
        return loss

class HalfSequence(FastLoop):  # feeds the model half of each sequence
    def step(self):
        x, y = next(self.batches)
        n = x.shape[1] // 2
        loss = self.loss_of(x[:, :n], y[:, :n])
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

class Idle(FastLoop):  # once past the audit and the warm-up: the batch fed, nothing learned
    def step(self):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls <= 7:
            return super().step()
        x, y = next(self.batches)
        with torch.no_grad():
            return self.loss_of(x, y)
'''


@pytest.fixture(scope="module")
def measured():
    """The grader's own measurements on this CPU, every need, once for this module."""
    return reference.measure(CTX, frozenset(("naive", "profile", "course_drop", "finetune", "cause")), 1.0, {})


@pytest.mark.slow
def test_the_harness_audits_and_times_the_loop_here(tmp_path, measured):
    """The reference FastLoop, audited and timed by the harness, passes the judge against the grader's own
    naive loop and course drop; a loop that feeds the model its tokens while timed but learns nothing, one
    that syncs every step and one that feeds half of each sequence fail, each with its reason (the other
    audit rules: test_the_audit_rules_fail_the_graders_audit_and_the_notebooks)."""
    from grader import labs
    from grader.context import live

    nb = json.loads(SOURCE.read_text())
    job = definitions.job(nb)
    job["definitions"].append(WRONG_LOOPS)
    run = Run(labs.load(made.A), {}, {}, live(made.A), job, definitions.read_code(ROOT), tmp_path, 1)
    ref = dataclasses.replace(measured, measured={"naive": dataclasses.replace(measured.measured["naive"], rel=7.0)})
    check = CHECKS["test_optimized"]  # (the band is the widest: this machine's load is not under test)
    params = judges.optimized_params(CTX, None)
    got = {}
    with _new_sandbox(run, [check], False, "loops") as box:
        for name in ("FastLoop", "Idle", "SyncEvery", "HalfSequence"):
            timed = name in ("FastLoop", "Idle")
            got[name] = box.harness(check.harness, dict(params, loop=name, sections=params["sections"] if timed else 0))
    h, sections = got["FastLoop"]
    rates = sorted(h["tokens_per_step"] * params["steps"] / sec.seconds for k, sec in sections.items() if k != "check")
    sp = rates[1] / ref.measured["naive"].value
    a = opt(speedup=sp, optimized_tps=sp * made.NAIVE_TPS, baseline_tps=made.NAIVE_TPS,
            opt_row={**opt()["opt_row"], "tokens_per_s": sp * made.NAIVE_TPS}, audit=h["audit"])
    if sp >= 1:  # the floor is this machine's to meet: beside busy cores it may not
        assert judge("test_optimized", a, ref, h, sections)[0].startswith("your loop, audited")
    h, sections = got["Idle"]
    check_out = sections["check"].outputs
    assert check_out["loss_before"] == check_out["loss_after"]  # the weights the timed steps left: where they were
    with pytest.raises(Fail, match="must fall at least 0.25x as far"):
        judge("test_optimized", a, ref, h, sections)
    for name, named in (("SyncEvery", "4 host syncs in 4"), ("HalfSequence", "fed the model 256 tokens, but the loop")):
        with pytest.raises(Fail, match=named):
            judge("test_optimized", a, ref, *got[name])


@pytest.mark.slow
def test_the_graders_own_measurements_on_this_cpu(measured):
    r = measured
    naive = r.measured["naive"]
    assert naive.value > 0 and 1.5 <= naive.rel <= 3.0
    assert isinstance(r.profile, ProfileSummary) and r.profile.device == "cpu" and r.profile.diagnosis == CPU
    assert r.course_drop > 0 and r.bnb[0] is False
    lean, trap = r.peak(reference.lean_recipe()), r.peak(reference.trap_recipe())
    assert lean["lora_grads_ok"] and 0 < lean["peak_gib"] < trap["peak_gib"]
    assert r.peak(reference.single_recipe("eval_mode"))["peak_gib"] >= judges.TRAP_FACTOR_CPU * lean["peak_gib"]
    q = r.peak(dataclasses.asdict(replace(RECIPES["lora_bf16_lean"], quant="nf4")))
    assert q["quant"] == "none" and "fell back" in q["note"]  # no GPU: 4-bit falls back to 16-bit LoRA, and says so
    assert math.isclose(q["peak_gib"], lean["peak_gib"])
