"""grader/formgrade.py: ``python -m grader gradebook OUT`` puts a graded class (the ``--out`` of
``autograde`` or ``merge``) into a course root's nbgrader gradebook, where the formgrader lists it
(read here through nbgrader's own API, which the formgrader's pages call), the written answers
waiting for a manual grade with their number check. The class here is written as ``autograde``
writes one (results.json and autograded notebooks), so the test takes seconds; that the batch's
results look like this is tests/grader/test_phase0.py's."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from grader.release import reference_submission

ROOT = Path(__file__).resolve().parents[2]
A = "00_foundations"
NOTE = "Quoted numbers: 1, 0 printed by this run's cells; not found among them: 97.5%."


def _cells(nb: dict, score_of) -> list[dict]:
    out = []
    for c in nb["cells"]:
        md = c["metadata"].get("nbgrader", {})
        if not md.get("grade"):
            continue
        if c["cell_type"] == "markdown":
            answered = "".join(c["source"]) != "YOUR ANSWER HERE"
            out.append({"cell": md["grade_id"], "points": md["points"], "score": 0.0, "mode": "manual",
                        "needs_manual_grade": answered, "message": NOTE if answered else "No response"})
        else:
            out.append({"cell": md["grade_id"], "points": md["points"], "score": score_of(md), "mode": "measured live"})
    return out


def _graded_class(out: Path) -> dict:
    """``out`` as ``python -m grader autograde --out`` leaves it: two graded, one held for review."""
    ref, rel = reference_submission(A), json.loads((ROOT / "notebooks" / f"{A}.ipynb").read_text())
    results = [
        {"student_id": "ana", "assignment": A, "status": "ok", "cells": _cells(ref, lambda md: float(md["points"]))},
        {"student_id": "bo", "assignment": A, "status": "ok", "cells": _cells(rel, lambda md: 0.0)},
        {"student_id": "cy", "assignment": A, "status": "held for review, not graded: get_ipython", "cells": []},
    ]
    for sid, nb in (("ana", ref), ("bo", rel)):
        (out / "autograded" / sid).mkdir(parents=True)
        (out / "autograded" / sid / f"{A}.ipynb").write_text(json.dumps(nb))
    (out / "results.json").write_text(json.dumps(results))
    return {r["student_id"]: r for r in results}


def _course(tmp_path: Path) -> Path:
    course = tmp_path / "course"
    shutil.copytree(ROOT / "grader" / "source" / A, course / "source" / A)
    shutil.copyfile(ROOT / "grader" / "nbgrader_config.py", course / "nbgrader_config.py")
    return course


def _load(out: Path, course: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", "gradebook", str(out), "--course", str(course)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_graded_class_is_what_the_formgrader_lists_and_regrading_keeps_manual_grades(tmp_path):
    from nbgrader.api import Gradebook
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    out, course = tmp_path / "out", _course(tmp_path)
    out.mkdir()
    results = _graded_class(out)
    proc = _load(out, course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded 2 graded submissions of {A}" in proc.stdout and "cy: no graded notebook (held for review" in proc.stdout
    assert (course / "autograded" / "ana" / A / f"{A}.ipynb").is_file()
    listed = {s["student"]: s for s in NbGraderAPI(coursedir=CourseDirectory(root=str(course)))
              .get_notebook_submissions(A, A)}
    assert set(listed) == {"ana", "bo"}
    assert listed["ana"]["needs_manual_grade"] and not listed["bo"]["needs_manual_grade"]
    auto = sum(c["score"] for c in results["ana"]["cells"])
    assert listed["ana"]["code_score"] == auto == 20 and listed["bo"]["score"] == 0
    db = f"sqlite:///{course / 'gradebook.db'}"
    with Gradebook(db) as gb:
        assert gb.find_comment("limiter_writeup", A, A, "ana").auto_comment == NOTE
        g = gb.find_grade("limiter_writeup", A, A, "ana")
        assert g.auto_score is None and g.needs_manual_grade
        assert gb.find_grade("limiter_writeup", A, A, "bo").auto_score == 0
        g.manual_score = 1.5  # the instructor grades the answer in the formgrader
        gb.db.commit()
    assert _load(out, course).returncode == 0  # loaded again (a student regraded): the manual grade stays
    with Gradebook(db) as gb:
        assert gb.find_grade("limiter_writeup", A, A, "ana").manual_score == 1.5
        assert gb.find_submission(A, "ana").score == 21.5


def test_what_is_not_a_graded_class_is_one_line(tmp_path):
    course = _course(tmp_path)
    cases = {"empty": None, "not_json": "{", "mixed": json.dumps([{"student_id": "a", "assignment": A},
                                                                  {"student_id": "b", "assignment": "01_single_gpu"}])}
    for name, text in cases.items():
        out = tmp_path / name
        out.mkdir()
        if text is not None:
            (out / "results.json").write_text(text)
        proc = _load(out, course)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, (name, proc)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "no results.json" in _load(tmp_path / "empty", course).stderr
    assert "mixes assignments" in _load(tmp_path / "mixed", course).stderr
