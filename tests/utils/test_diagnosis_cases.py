"""utils.diagnosis.diagnosis_cases, and the parts of utils.diagnosis.profile_diagnosis it rests on (BOTTLENECKS,
``ProfileSummary.evidence`` and ``from_dict``): every synthetic case gives its verdict however
the thresholds are read within their margins, the real CPU loops give theirs, a variant moves
the verdict, and bad input is refused in one line."""
from __future__ import annotations

import json
import random

import pytest

from utils.diagnosis import diagnosis_cases as C
from utils.diagnosis import profile_diagnosis as D

SHIFTS = {"LOADER_WAIT_FRACTION": C.LOADER_MARGIN, "H2D_TIME_FRACTION": C.LOADER_MARGIN,
          "GPU_IDLE_FRACTION": C.IDLE_MARGIN, "MATMUL_SHARE": C.MATMUL_MARGIN}


def test_every_verdict_is_named_once_and_has_its_suggestion():
    assert len(set(D.BOTTLENECKS)) == len(D.BOTTLENECKS) == 8
    assert set(D.BOTTLENECKS) == set(D._SUGGEST) and C.SYNTHETIC == D.BOTTLENECKS


@pytest.mark.parametrize("label", D.BOTTLENECKS)
def test_synthetic_cases_give_their_verdict_under_any_reading_of_the_thresholds(label, monkeypatch):
    r = random.Random(label)
    cases = [C.synthetic(label, r) for _ in range(40)]
    for s in cases:
        assert D.diagnose(s)[0] == label and C.clear_of_thresholds(s)
        assert (s.diagnosis, s.explanation, s.suggestion, s.findings, s.trace_path) == ("", "", "", [], None)
    # each threshold moved by almost its margin, either way: the verdict stays
    for name, margin in SHIFTS.items():
        for sign in (-1, 1):
            monkeypatch.setattr(D, name, getattr(D, name) + sign * 0.9 * margin)
            assert all(D.diagnose(s)[0] == label for s in cases), (name, sign)
            monkeypatch.undo()


def test_synthetic_is_reproducible_from_a_seed_and_differs_across_seeds():
    assert C.synthetic("copy-bound", 7) == C.synthetic("copy-bound", 7)
    assert C.synthetic("copy-bound", 7) != C.synthetic("copy-bound", 8)
    cases = C.synthetic_cases(seed=3)
    assert len(cases) == 2 * len(D.BOTTLENECKS) and len({n for n, _ in cases}) == len(cases)
    assert [n for n, _ in cases] == [f"drawn case {i + 1}" for i in range(len(cases))]  # the name gives nothing away
    verdicts = [D.diagnose(s)[0] for _, s in cases]
    assert sorted(verdicts) == sorted(2 * D.BOTTLENECKS) and verdicts != sorted(verdicts)  # two of each, shuffled


def test_synthetic_refuses_an_unknown_verdict():
    with pytest.raises(ValueError, match="no synthetic case for 'slow'"):
        C.synthetic("slow")


def test_a_number_near_its_threshold_is_not_clear():
    s = C.synthetic("compute-bound", 1)
    assert C.clear_of_thresholds(s)
    near = D.ProfileSummary.from_dict({**s.to_dict(), "loader_wait_fraction": D.LOADER_WAIT_FRACTION + 0.02})
    assert not C.clear_of_thresholds(near)
    near = D.ProfileSummary.from_dict({**s.to_dict(), "gpu_idle_fraction": D.GPU_IDLE_FRACTION - 0.05})
    assert not C.clear_of_thresholds(near)


def test_variants_make_one_cause_unmistakable():
    for label in ("compute-bound", "cpu-bound (no GPU in the trace)", "host-sync-bound"):
        got = [D.diagnose(v)[0] for _, v in C.variants(C.synthetic(label, 2))]
        assert got == ["data-loading-bound", "copy-bound"], (label, got)
        assert all(v.diagnosis == "" for _, v in C.variants(C.synthetic(label, 2)))


def test_evidence_keeps_the_numbers_and_drops_the_verdict():
    s = C.synthetic("memory-bound", 5)
    full = D.ProfileSummary.from_dict(s.to_dict())
    full.diagnosis, full.explanation, full.suggestion, full.findings = D.diagnose(full)
    e = full.evidence()
    assert e == s and e.top is not full.top and e.h2d_copies_by_source is not full.h2d_copies_by_source
    assert full.diagnosis == "memory-bound"  # the original keeps its verdict


def test_from_dict_reads_what_to_dict_wrote_through_json_and_refuses_other_dicts():
    s = C.synthetic("overhead-bound (launch/Python)", 4)
    back = D.ProfileSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and D.diagnose(back)[0] == "overhead-bound (launch/Python)"
    with pytest.raises(ValueError, match="not a ProfileSummary dict"):
        D.ProfileSummary.from_dict({"step_time_ms": 1.0})
    with pytest.raises(ValueError, match="not a ProfileSummary dict"):
        D.ProfileSummary.from_dict([1, 2])
    with pytest.raises(ValueError, match="'top' must be a list of OpStat dicts"):
        D.ProfileSummary.from_dict({**s.to_dict(), "top": [{"name": "gemm"}]})


torch = pytest.importorskip("torch")


def test_the_cpu_loops_give_the_verdicts_they_were_built_for():
    cases = C.profiled("cpu")
    assert [n for n, _, _ in cases] == list(C.LOOPS_CPU)
    got = {n: d for n, _, d in cases}
    assert got == {"slow-dataset loop": "data-loading-bound", "in-memory MLP loop": "cpu-bound (no GPU in the trace)"}
    assert all(s.diagnosis == "" and D.diagnose(s)[0] == d for _, s, d in cases)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_loops_give_the_verdicts_they_were_built_for():
    got = {n: d for n, _, d in C.profiled("cuda")}
    assert got == {"slow-dataset loop": "data-loading-bound", "pageable-copy loop": "copy-bound",
                   "item()-per-step loop": "host-sync-bound", "tiny-adds loop": "overhead-bound (launch/Python)",
                   "matmul loop": "compute-bound", "elementwise loop": "memory-bound"}
