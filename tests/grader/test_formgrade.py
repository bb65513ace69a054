"""grader/formgrade.py: ``python -m grader gradebook OUT`` puts a graded class (the ``--out`` of
``autograde`` or ``merge``) into a course root's nbgrader gradebook, where the formgrader lists it
(read here through nbgrader's own API, which the formgrader's pages call): counted on "Manage
Assignments", listed as graded, the written answers waiting for a manual grade with their number
check. ``python -m grader feedback OUT`` then brings the feedback HTML and grades.csv up to date with
the grades given. The class here is written as ``autograde`` writes one (results.json, grades.csv
and autograded notebooks), so the tests take seconds; the same flow on a class really graded, with
the grades typed into the formgrader in a browser, is tests/integration/test_formgrader_browser.py's."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    results[0]["timestamp"] = "2026-01-05T10:00:00"  # ana's, as a submission with nbgrader's timestamp.txt has one
    (out / "results.json").write_text(json.dumps(results))
    from grader.batch import CSV_COLUMNS

    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in results:
            auto = sum(c["score"] for c in r["cells"])
            w.writerow({c: "" for c in CSV_COLUMNS} | {
                "assignment": A, "student_id": r["student_id"], "raw_score": auto, "score": auto, "max_score": 24.0,
                "late_submission_penalty": 0.0, "status": r["status"], "verified_score": auto, "provisional_score": 0.0,
                "needs_manual_grade": "limiter_writeup (2 points); sweep_writeup (2 points)" if r["student_id"] == "ana"
                else ""})
    return {r["student_id"]: r for r in results}


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A course root with the assignment released into its gradebook (nbgrader's generate_assignment,
    as ``gradebook`` runs it on a course that lacks it), once for the module: tens of seconds each."""
    from grader.formgrade import _ensure_assignment

    course = tmp_path_factory.mktemp("released") / "course"
    shutil.copytree(ROOT / "grader" / "source" / A, course / "source" / A)
    shutil.copyfile(ROOT / "grader" / "nbgrader_config.py", course / "nbgrader_config.py")
    from grader.course import ensure_scripts_on_path

    ensure_scripts_on_path()
    _ensure_assignment(course, A)
    return course


@pytest.fixture()
def course(released, tmp_path) -> Path:
    return Path(shutil.copytree(released, tmp_path / "course"))


def _load(out: Path, course: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", "gradebook", str(out), "--course", str(course)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _api(course: Path):
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    return NbGraderAPI(coursedir=CourseDirectory(root=str(course)))


def _grade_by_hand(course: Path, student: str, cell: str, score: float) -> None:
    """What the formgrader's grade API does with a score typed on the grading page."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        g = gb.find_grade(cell, A, A, student)
        g.manual_score, g.needs_manual_grade = score, False
        gb.db.commit()


def test_a_graded_class_is_what_the_formgrader_lists_and_regrading_keeps_manual_grades(tmp_path, course):
    from nbgrader.api import Gradebook

    out = tmp_path / "out"
    out.mkdir()
    results = _graded_class(out)
    proc = _load(out, course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded 2 graded submissions of {A}" in proc.stdout and "cy: no graded notebook (held for review" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr  # nbgrader's add_submission under SQLAlchemy 2: silenced
    assert "jupyter server" in proc.stdout and "/formgrader" in proc.stdout
    assert (course / "autograded" / "ana" / A / f"{A}.ipynb").is_file()
    api = _api(course)
    # "Manage Assignments" counts submitted/<student>/<assignment>/; graded ones list only when the timestamps agree
    assert api.get_assignment(A)["num_submissions"] == 2
    assert api.get_autograded_students(A) == {"ana", "bo"}
    assert (course / "submitted" / "ana" / A / "timestamp.txt").read_text().strip() == "2026-01-05 10:00:00.000000 UTC"
    assert not (course / "submitted" / "bo" / A / "timestamp.txt").exists()  # no timestamp: none on either side
    assert {s["student"]: s["autograded"] for s in api.get_submissions(A)} == {"ana": True, "bo": True}
    listed = {s["student"]: s for s in api.get_notebook_submissions(A, A)}
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
    _grade_by_hand(course, "ana", "limiter_writeup", 1.5)
    regraded = out / "autograded" / "bo" / f"{A}.ipynb"
    regraded.write_text(regraded.read_text() + "\n")  # bo graded again since
    assert _load(out, course).returncode == 0  # loaded again: ana's manual grade stays, graded; bo's newer grading in
    assert (course / "submitted" / "bo" / A / f"{A}.ipynb").read_text() == regraded.read_text()
    with Gradebook(db) as gb:
        g = gb.find_grade("limiter_writeup", A, A, "ana")
        assert g.manual_score == 1.5 and not g.needs_manual_grade
        assert gb.find_grade("sweep_writeup", A, A, "ana").needs_manual_grade
        assert gb.find_submission(A, "ana").score == 21.5
    assert _api(course).get_autograded_students(A) == {"ana", "bo"}


def _feedback(out: Path, course: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", "feedback", str(out), "--course", str(course)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _rows(out: Path) -> dict[str, dict]:
    with open(out / "grades.csv", newline="") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def test_feedback_brings_feedback_and_grades_up_to_date_with_the_manual_grades(tmp_path, course):
    out = tmp_path / "out"
    out.mkdir()
    _graded_class(out)
    (out / "feedback" / "cy").mkdir(parents=True)
    (out / "feedback" / "cy" / f"{A}.html").write_text("<p>held for review</p>")
    assert _load(out, course).returncode == 0
    _grade_by_hand(course, "ana", "limiter_writeup", 1.5)
    before = _rows(out)
    proc = _feedback(out, course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "for 2 students" in proc.stdout and "Warning" not in proc.stderr
    page = (out / "feedback" / "ana" / f"{A}.html").read_text()
    assert "(Score: 1.5 / 2.0)" in page and "Score: 21.5 / 24.0" in page  # nbgrader's feedback, from the gradebook
    rows = _rows(out)
    assert float(rows["ana"]["score"]) == float(rows["ana"]["raw_score"]) == 21.5
    assert float(rows["ana"]["verified_score"]) == 21.5  # the instructor's grade is verified
    assert rows["ana"]["needs_manual_grade"] == "sweep_writeup (2 points)"  # still waiting
    assert rows["bo"] == {**before["bo"], "raw_score": "0.0", "score": "0.0", "verified_score": "0.0"}
    assert rows["cy"] == before["cy"]  # not graded: its row and its feedback stay
    assert (out / "feedback" / "cy" / f"{A}.html").read_text() == "<p>held for review</p>"
    from grader.lms import export

    export([out], tmp_path / "all.csv", course=course)  # the export reads the same gradebook
    with open(tmp_path / "all.csv", newline="") as fh:
        ours = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert (ours["ana"]["status"], ours["ana"]["score"]) == ("awaiting manual grading", "21.5")
    assert ours["ana"]["why"] == "written answers to grade: sweep_writeup (2 points)"
    assert ours["cy"]["status"] == "not graded" and ours["cy"]["why"].startswith("held for review")
    _grade_by_hand(course, "ana", "sweep_writeup", 2.0)
    assert _feedback(out, course).returncode == 0
    rows = _rows(out)
    assert float(rows["ana"]["score"]) == 23.5 and rows["ana"]["needs_manual_grade"] == ""
    assert "(Score: 2.0 / 2.0)" in (out / "feedback" / "ana" / f"{A}.html").read_text()
    export([out], tmp_path / "all.csv", course=course)
    with open(tmp_path / "all.csv", newline="") as fh:
        ours = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert (ours["ana"]["status"], ours["ana"]["score"], ours["ana"]["why"]) == ("graded", "23.5", "")


def test_feedback_skips_a_student_the_gradebook_holds_another_grading_of(tmp_path, course):
    out = tmp_path / "out"
    out.mkdir()
    _graded_class(out)
    assert _load(out, course).returncode == 0
    graded = out / "autograded" / "bo" / f"{A}.ipynb"
    graded.write_text(graded.read_text() + "\n")  # bo regraded since the class was loaded
    proc = _feedback(out, course)
    assert proc.returncode == 0, proc.stderr
    assert "bo: the gradebook in" in proc.stdout and "does not hold this grading" in proc.stdout
    assert "for 1 student;" in proc.stdout
    empty = tmp_path / "empty-course"
    empty.mkdir()
    proc = _feedback(out, empty)  # nothing loaded anywhere: each student named, nothing written
    assert proc.returncode == 0 and "for 0 students" in proc.stdout and "no gradebook in" in proc.stdout


def test_what_is_not_a_graded_class_is_one_line(tmp_path, course):
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
