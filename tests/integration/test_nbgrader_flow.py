"""nbgrader's own instructor flow on the course root (grader/ with its nbgrader_config.py), as an
nbgrader user runs it: generate_assignment, autograde, generate_feedback and export, each as its
own command. The reference answers score full marks, the untouched release 0, and the export is
nbgrader's CSV, the one learning-management systems import."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.release import reference_submission

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "00_foundations"
pytestmark = pytest.mark.slow


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    # as in an activated virtualenv: nbgrader runs alembic from PATH; the hidden tests import grader and utils
    # GPULAB_REPO: the setup cell looks for the course above the notebook; this course root is elsewhere
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPULAB_REPO": str(ROOT),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_nbgrader_commands_on_the_course_root(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(ROOT / "grader" / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "grader" / "source" / ASSIGNMENT, course / "source" / ASSIGNMENT)
    _nbgrader(course, "generate_assignment", ASSIGNMENT, "--create", "--force")
    released = course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert "BEGIN SOLUTION" not in released.read_text() and "BEGIN HIDDEN TESTS" not in released.read_text()
    for student, nb in (("ana", reference_submission(ASSIGNMENT)), ("bo", json.loads(released.read_text()))):
        d = course / "submitted" / student / ASSIGNMENT
        d.mkdir(parents=True)
        (d / f"{ASSIGNMENT}.ipynb").write_text(json.dumps(nb))
    # nbgrader_config.py's 60 s per cell is for a quiet machine; CI's two cores are shared
    _nbgrader(course, "autograde", ASSIGNMENT, "--create", "--Execute.timeout=600")
    _nbgrader(course, "generate_feedback", ASSIGNMENT)
    for student in ("ana", "bo"):
        assert (course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()
    _nbgrader(course, "export", "--to", str(tmp_path / "grades.csv"))
    with open(tmp_path / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert list(next(iter(rows.values())).keys())[:11] == [
        "assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
        "late_submission_penalty", "score", "max_score"]
    graded = json.loads((course / "autograded" / "ana" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
    errors = [f"{c['metadata'].get('nbgrader', {}).get('grade_id')}: {o['ename']}: {o['evalue'][:300]}"
              for c in graded["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert float(rows["ana"]["score"]) == float(rows["ana"]["max_score"]) == 15, errors
    assert float(rows["bo"]["score"]) == 0
