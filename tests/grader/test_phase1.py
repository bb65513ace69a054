"""The grader against the phase-1 notebook: real ``python -m grader check`` runs on CPU (smoke mode).

The reference solution scores full marks, the untouched release scores zero, a submission with
a constant ``diagnose``, an optimized loop that reads the loss on the host every step and a wrong
cause loses exactly those cells, and one whose ``diagnose`` copies the summary's own verdict loses the two diagnosis
cells. tests/grader/test_phase1_diagnosis.py tries every kind of wrong ``diagnose`` on the checks
themselves.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nbcells import check_each
from tests.nbcells import gid as _gid
from tests.nbcells import scores as _scores
from tests.nbcells import src as _src

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grader" / "source" / "01_single_gpu" / "01_single_gpu.ipynb"
RELEASE = ROOT / "notebooks" / "01_single_gpu.ipynb"
MAX = 17
DIAGNOSIS = ("test_diagnosis", "test_unseen")

pytestmark = pytest.mark.slow




def answered() -> dict:
    from grader.release import reference_submission

    return reference_submission("01_single_gpu")


def _edit(nb: dict, gid: str, old: str, new: str) -> None:
    cell = next(c for c in nb["cells"] if _gid(c) == gid)
    assert old in _src(cell), (gid, old)
    cell["source"] = _src(cell).replace(old, new)


def _cell_src(nb: dict, gid: str, source: str) -> None:
    next(c for c in nb["cells"] if _gid(c) == gid)["source"] = source


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("phase1")
    wrong = answered()
    _cell_src(wrong, "diagnose_function", 'def diagnose(summary):\n    return "data-loading-bound", "num_workers"\n')
    _edit(wrong, "optimized_loop", "if self.steps % self.log_every == 0:", "if True:")  # .item() every step
    _edit(wrong, "cause_answer", "CAUSE = max(single_peaks, key=single_peaks.get)", 'CAUSE = "autocast"')
    copies = answered()  # the summary's own verdict: blank on every summary the hidden tests hand it
    _cell_src(copies, "diagnose_function", "def diagnose(summary):\n    return summary.diagnosis, None\n")
    subs = {"rel": json.loads(RELEASE.read_text()), "wrong": wrong, "copies": copies}  # the reference: graded_reference
    runs = check_each(ROOT, subs, tmp)
    return {name: (rc, out, res) for name, (rc, out, err, res) in runs.items()}


def test_reference_scores_full_marks(graded_reference):
    g = graded_reference("01_single_gpu")  # graded once per session, beside a busy core (tests/conftest.py)
    rc, out, res = g["rc"], g["out"] + g["err"], g["result"]
    assert rc == 0, out
    assert res["score"] == res["auto_max_score"] == MAX and res["max_score"] == MAX + 2
    assert all(c["mode"] == "measured live" for c in res["cells"] if c["cell"] not in ("test_rates", "report_writeup"))
    assert [c["mode"] for c in res["cells"] if c["cell"] == "report_writeup"] == ["manual"]
    assert len(res["cells"]) >= 6


def test_release_scores_zero(graded):
    rc, _, res = graded["rel"]
    assert rc == 1 and res["score"] == 0


def test_wrong_answers_lose_their_cells_only(graded):
    rc, out, res = graded["wrong"]
    scores = _scores(res)
    assert rc == 1
    assert all(scores[c] == 0 for c in (*DIAGNOSIS, "test_optimized", "test_cause")), out
    assert scores["test_rates"] == 2 and scores["test_baseline"] == 2 and scores["test_finetune"] == 3, out
    msgs = " | ".join(c.get("message", "") for c in res["cells"])
    # the constant is wrong on the naive loop's own profile, and on the first clear-cut summary the visible test tries
    assert "your diagnose says 'data-loading-bound'" in msgs and "a clear-cut" in msgs, msgs
    assert "host syncs in 4 steps" in msgs and "CAUSE" in msgs


def test_a_diagnose_that_copies_the_verdict_loses_both_diagnosis_cells_only(graded):
    rc, out, res = graded["copies"]
    scores = _scores(res)
    assert rc == 1 and all(scores[c] == 0 for c in DIAGNOSIS), out
    assert res["score"] == MAX - 5, out
    msgs = " | ".join(c.get("message", "") for c in res["cells"])
    assert "the bottleneck '' on your profile: it must be one of" in msgs and "returned ('', None)" in msgs, msgs


def test_release_is_current_and_clean():
    from grader.release import released_text

    text = released_text("01_single_gpu")
    assert text == RELEASE.read_text(), "notebooks/ is stale: run python -m grader release"
    for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "_p1.check_", "BOTTLENECK, FIRST_FIX = diagnose(profile)\\n",
                   "self.optimizer.step()", "opt_row = audited.measure(SIZES.steps)\\n",
                   'return \\"host-sync-bound\\", \\"sync_every_step\\"'):  # solution lines as the JSON text has them
        assert marker not in text


def test_every_source_cell_has_an_nbgrader_id():
    cells = json.loads(SOURCE.read_text())["cells"]
    assert all(_gid(c) for c in cells)
    assert sum(1 for c in cells if c["metadata"]["nbgrader"].get("grade")) >= 6
