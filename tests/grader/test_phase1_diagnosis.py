"""Phase 1's diagnosis checks, called as the hidden tests call them (``grader.phase(1)``), on the
reference ``diagnose`` of the source notebook and on every kind of wrong one: a constant answer
(each verdict in turn), a copy of the summary's own verdict, a call into the course's rules, each
rule left out, the rules in the wrong order, a wrong first fix, a wrong shape. Live on this CPU
(smoke mode) and from a GPU record. About a minute on two cores: each live check profiles small
loops on the CPU.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.nbcells import cell, src

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grader" / "source" / "01_single_gpu" / "01_single_gpu.ipynb"
CPU = "cpu-bound (no GPU in the trace)"

pytestmark = pytest.mark.slow


def reference():
    """The source notebook's solution ``diagnose``."""
    ns: dict = {}
    exec(compile(src(cell(json.loads(SOURCE.read_text()), "diagnose_function")), "diagnose_function", "exec"), ns)  # noqa: S102
    return ns["diagnose"]


def _fix(label):
    from grader.phase1_records import FIRST_FIXES

    return FIRST_FIXES[label][0]


def without(rule: str):
    """The reference with one rule left out, or the GPU rules tried first (``"idle first"``), or
    one first fix wrong: each is wrong on every case of at least one verdict."""
    from dataclasses import replace

    ref = reference()

    def diagnose(s):
        if rule == "idle first" and s.gpu_idle_fraction is not None and s.gpu_idle_fraction >= 0.3:
            return ref(replace(s, loader_wait_fraction=0.0, h2d_ms_per_step=0.0))
        if rule == "loader" and s.loader_wait_fraction >= 0.2:
            return ref(replace(s, loader_wait_fraction=0.0))
        if rule == "copies" and s.loader_wait_fraction < 0.2 and s.h2d_ms_per_step >= 0.2 * s.step_time_ms:
            return ref(replace(s, h2d_ms_per_step=0.0))
        got = ref(s)
        wrong = {"sync": ("host-sync-bound", ("overhead-bound (launch/Python)", "batch_size")),
                 "idle unnamed": ("idle GPU, cause not named", ("host-sync-bound", "sync_every_step")),
                 "matmul share": ("memory-bound", ("compute-bound", "precision")),
                 "no GPU": (CPU, ("compute-bound", "precision")),
                 "fix": ("host-sync-bound", ("host-sync-bound", "num_workers"))}.get(rule)
        return wrong[1] if wrong and got[0] == wrong[0] else got
    return diagnose


RULES = ("loader", "copies", "sync", "idle unnamed", "matmul share", "no GPU", "idle first", "fix")


def calls_the_rules(s):
    from utils.profile_diagnosis import diagnose

    d = diagnose(s)[0]
    return d, _fix(d)


def copies_the_code(s):  # the course's function under another name: still the course's code
    import types

    from utils.profile_diagnosis import diagnose

    d = types.FunctionType(diagnose.__code__, diagnose.__globals__)(s)[0]
    return d, _fix(d)


# -- every verdict right on unseen loops --------------------------------------------------------

def test_the_reference_gets_every_unseen_loop_right(phase, capsys):
    phase(1).check_unseen(reference())
    out = capsys.readouterr().out
    right = re.search(r"(\d+) of (\d+) right", out)
    assert "measured live" in out and right and right[1] == right[2] and int(right[2]) >= 18, out  # 16 drawn + the loops


def test_the_reference_is_right_on_many_draws():
    from grader.phase1_records import FIRST_FIXES, rules_verdict
    from utils.diagnosis_cases import synthetic_cases

    ref = reference()
    for seed in range(60):
        for name, s in synthetic_cases(seed):
            got = ref(s)
            assert got[0] == rules_verdict(s) and got[1] in FIRST_FIXES[got[0]], (seed, name, got)


@pytest.mark.parametrize("label", [
    "data-loading-bound", "copy-bound", "host-sync-bound", "overhead-bound (launch/Python)",
    "idle GPU, cause not named", "compute-bound", "memory-bound", CPU])
def test_a_constant_diagnose_fails_the_unseen_loops(phase, label):
    with pytest.raises(AssertionError, match=r"got \d+ of \d+ unseen loops right"):
        phase(1).check_unseen(lambda s: (label, _fix(label)))


@pytest.mark.parametrize("rule", RULES)
def test_leaving_out_or_misordering_any_rule_fails_the_unseen_loops(phase, rule):
    with pytest.raises(AssertionError, match=r"unseen loops right"):
        phase(1).check_unseen(without(rule))


@pytest.mark.parametrize("wrong, match", [
    (lambda s: (s.diagnosis, _fix("compute-bound")), "got 0 of"),  # the summary's verdict is blank
    (lambda s: (s.findings[0], None), "got 0 of"),
    (lambda s: "compute-bound", "must return \\(bottleneck, first fix\\)"),
    (calls_the_rules, "calls the course's own utils.profile_diagnosis.diagnose"),
    (copies_the_code, "calls the course's own utils.profile_diagnosis.diagnose"),
])
def test_copying_the_verdict_or_calling_the_rules_fails(phase, wrong, match):
    with pytest.raises(AssertionError, match=match):
        phase(1).check_unseen(wrong)


# -- the learner's own profile, live and from a record ---------------------------------------------

@pytest.fixture(scope="module")
def naive_profile():
    from utils.env import phase_sizes
    from utils.profiling import profile_steps
    from utils.training import build_loop, naive_config

    s = phase_sizes("01_single_gpu")
    return profile_steps(build_loop(s.model, naive_config(s.naive_batch, s.seq_len)).step, steps=3)


def test_the_reference_diagnosis_of_its_own_profile_passes(phase, naive_profile):
    ref = reference()
    assert ref(naive_profile) == (CPU, None)
    phase(1).check_diagnosis(ref, CPU, None, naive_profile)


@pytest.mark.parametrize("wrong, claimed, match", [
    (lambda s: (CPU, None), (CPU, None), "DataLoader wait at 60%"),  # right here, constant: the variants catch it
    (lambda s: (s.diagnosis, None), (CPU, None), "must be one of"),
    (calls_the_rules, (CPU, None), "calls the course's own"),
    (None, ("compute-bound", "precision"), "BOTTLENECK, FIRST_FIX"),  # the reference, a wrong BOTTLENECK
    (None, (CPU, "precision"), "BOTTLENECK, FIRST_FIX"),
])
def test_a_wrong_diagnosis_of_its_own_profile_fails(phase, naive_profile, wrong, claimed, match):
    with pytest.raises(AssertionError, match=match):
        phase(1).check_diagnosis(wrong or reference(), *claimed, naive_profile)


def test_an_edited_profile_fails(phase, naive_profile):
    from dataclasses import replace

    edited = replace(naive_profile, diagnosis="compute-bound")
    with pytest.raises(AssertionError, match="was edited"):
        phase(1).check_diagnosis(reference(), "compute-bound", "precision", edited)


def gpu_record(summary, bottleneck, fix, diagnosis=None) -> dict:
    """A phase-1 record as an H100 run would write it: the naive loop's profile and its diagnosis."""
    from grader.phase1_records import rules_verdict
    from utils.record import Record, utils_hash

    rec = Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1}, utils_sha256=utils_hash())
    rec.add("naive_profile_step_ms", summary.step_time_ms, "ms", "utils.profiling.profile_steps", None,
            summary=summary.evidence().to_dict(), diagnosis=diagnosis or rules_verdict(summary), bottleneck=bottleneck,
            first_fix=fix)
    return rec.to_dict()


@pytest.mark.parametrize("label", ["compute-bound", "host-sync-bound", "memory-bound"])
def test_a_gpu_profile_in_the_record_is_diagnosed_again_by_the_learners_function(phase, capsys, label):
    from utils.diagnosis_cases import synthetic

    s = synthetic(label, 11)
    phase(1, record=gpu_record(s, label, _fix(label))).check_diagnosis(reference(), None, None, None)
    assert "graded from record" in capsys.readouterr().out
    for wrong, claimed, match in [
            (lambda x: (label, _fix(label)), (label, _fix(label)), "DataLoader wait at 60%"),  # constant
            (lambda x: (x.diagnosis, None), (label, None), "must be one of"),
            (calls_the_rules, (label, _fix(label)), "calls the course's own"),
            (None, ("data-loading-bound", "num_workers"), "the record's BOTTLENECK, FIRST_FIX")]:
        with pytest.raises(AssertionError, match=match):
            phase(1, record=gpu_record(s, *claimed)).check_diagnosis(wrong or reference(), None, None, None)
    with pytest.raises(AssertionError, match="its own numbers do not give: it was edited"):
        phase(1, record=gpu_record(s, label, _fix(label), diagnosis="data-loading-bound")).check_diagnosis(
            reference(), None, None, None)
