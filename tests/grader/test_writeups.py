"""grader/writeups.py: the written answers are manually graded cells, and the numbers they quote
are checked against what the run printed. Through the real grader:
tests/integration/test_nbgrader_flow.py (the formgrader's view on the course root) and
tests/integration/test_formgrader_browser.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import writeups
from grader.writeups import check, quotes
from tests.nbcells import writeup_points

ROOT = Path(__file__).resolve().parents[2]
WRITEUPS = {"00_foundations": ("limiter_writeup", "sweep_writeup"), "01_single_gpu": ("report_writeup",),
            "02_multi_gpu": ("scaling_writeup",), "04_benchmarking_production": ("choice_writeup",)}


def printed(*lines: str):
    return [q for line in lines for q in quotes(line)]


@pytest.mark.parametrize("quote, line, ok", [
    ("26,328 tokens/s", "naive: 26,328 tokens/s, step 38.9 ms", True),
    ("about 26,300 tokens/s", "naive: 26,328 tokens/s", True),  # rounded to hundreds
    ("26.3k tokens/s", "naive: 26,328 tokens/s", True),
    ("26k tokens/s", "naive: 26,328 tokens/s", True),
    ("27k tokens/s", "naive: 26,328 tokens/s", False),
    ("MFU 34.8%", "MFU 34.8%", True),
    ("MFU 35%", "mfu 0.3481", True),  # a percentage of a printed fraction
    ("MFU 40%", "mfu 0.3481", False),
    ("a fixed share of 0.35", "fixed share 34.8%", True),  # a fraction of a printed percentage
    ("9.55x faster", "speedup 9.55x", True),
    ("9.6x faster", "speedup 9.55x", True),
    ("9.1x faster", "speedup 9.55x", False),
    ("38.9 ms", "step 38.87 ms", True),
    ("39.2 ms", "step 38.87 ms", False),
    ("1.2e-3 s", "took 0.0012 s", True),
])
def test_a_quote_matches_a_printed_number_within_its_rounding(quote, line, ok):
    v = check(quote, printed(line))
    assert v.answered and (v.matched if ok else v.unmatched), (quote, line, v)


def test_counts_and_the_courses_own_numbers_are_not_quotes():
    course = printed("the course's rule: overhead if s > 0.5; on one H200, every fix 9.55x")
    v = check("Step 3 of 4 GPUs: the share is above 0.5, as the H200's 9.55x showed, at head dim 64.", [], course)
    assert v.matched == [] and v.unmatched == ["64"], v  # 3 and 4 are counts, 0.5 and 9.55x the course's


def test_notes_say_no_response_none_quoted_all_matched_or_which_did_not():
    assert check(writeups.STUB, []).note() == "No response: the answer cell is as released."
    assert check("  ", []).note().startswith("No response")
    assert "none" in check("It is overhead-bound.", []).note()
    assert check("MFU 34.8%", printed("MFU 34.8%")).note() == "Quoted numbers: 1, all printed by this run's cells (34.8%)."
    note = check("MFU 34.8% and 97.5% of the bandwidth", printed("MFU 34.8%")).note()
    assert note == "Quoted numbers: 2, 1 printed by this run's cells; not found among them: 97.5%.", note


def _nb(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(text: str):
    return {"cell_type": "code", "metadata": {}, "source": "print()", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": text}]}


def _md(text: str, writeup: bool = False):
    meta = {"nbgrader": {"grade": True, "solution": True, "grade_id": "w", "points": 2}} if writeup else {}
    return {"cell_type": "markdown", "metadata": meta, "source": text}


def test_a_writeup_is_checked_against_its_own_sections_output():
    nb = _nb([_md("## 1. Matmul"), _code("matmul 712.4 TFLOP/s"), _md("## 2. Training"), _code("MFU 3.1%"),
              _md("Training is overhead-bound: MFU 3.1% and 712 TFLOP/s.", writeup=True)])
    assert writeups.notes(nb) == {"w": "Quoted numbers: 2, 1 printed by this run's cells; not found among them: 712."}


def test_the_four_labs_have_their_writeups_with_points_and_a_rubric():
    for lab, grade_ids in WRITEUPS.items():
        nb = json.loads((ROOT / "notebooks" / f"{lab}.ipynb").read_text())
        assert writeup_points(nb) == dict.fromkeys(grade_ids, 2), lab
        cells = nb["cells"]
        for grade_id in grade_ids:
            i = next(k for k, c in enumerate(cells) if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
            assert "".join(cells[i]["source"]) == writeups.STUB  # released without the model answer
            assert "Rubric" in "".join(cells[i - 1]["source"]) and cells[i - 1]["metadata"]["nbgrader"]["locked"]


def test_autograde_runs_the_number_check_right_after_nbgraders_own_grades():
    """grader/nbgrader_config.py lists nbgrader's own autograde steps, with its Execute guarded
    (GuardedExecute), the judges right after it (JudgeCells) and QuotedNumbers after SaveAutoGrades,
    and its sanitizing steps with InsertExports last: if an nbgrader release changes its own lists,
    this says so."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    from grader import course as C

    theirs = Autograde(coursedir=CourseDirectory(), config=Config())
    cfg = C.load_config(ROOT / "grader")
    mine = Autograde(coursedir=CourseDirectory(config=cfg), config=cfg)
    default = [p.__name__ for p in theirs.autograde_preprocessors]
    ours = [p.__name__ for p in mine.autograde_preprocessors]
    k = default.index("SaveAutoGrades") + 1
    assert default[0] == "Execute"
    assert ours == ["GuardedExecute", "JudgeCells"] + default[1:k] + ["QuotedNumbers"] + default[k:]
    assert [p.__name__ for p in mine.sanitize_preprocessors] == [p.__name__ for p in theirs.sanitize_preprocessors] + [
        "InsertExports"]
