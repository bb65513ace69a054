"""nbgrader's own instructor flow on the course root (grader/ with its nbgrader_config.py), as an
nbgrader user runs it: generate_assignment, autograde, generate_feedback and export, each as its
own command. The reference answers score full automatic marks, the untouched release 0, the
export is nbgrader's CSV, and the formgrader, served for real by `jupyter server` in the course root,
counts both submissions and lists the written answer for a manual grade with its number check
(nbgrader's CSV is long, one row per student and assignment, with no status: for a learning-management
system, `python -m grader export --format canvas|moodle`, tests/grader/test_lms.py)."""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grader.release import reference_submission

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "00_foundations"
pytestmark = pytest.mark.slow


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    # as in an activated virtualenv: nbgrader runs alembic from PATH; the hidden tests import grader and utils
    # GPULAB_REPO: the setup cell looks for the course above the notebook; this course root is elsewhere
    # OMP/MKL_NUM_THREADS=1: the kernel's torch on one thread, as `python -m grader autograde` runs it in smoke mode
    # (grader/batch.py, _kernel_env): two spinning threads on a shared 2-core machine slow the learner's in-kernel
    # measurements at random, several times over, against the grader's own
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPULAB_REPO": str(ROOT), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
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
    # 20 automatic points of 24: the two written answers (2 points each) wait for the instructor
    assert float(rows["ana"]["score"]) == 20 and float(rows["ana"]["max_score"]) == 24, errors
    assert float(rows["bo"]["score"]) == 0
    _formgrader_sees_the_written_answer(course)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _formgrader_sees_the_written_answer(course: Path) -> None:
    """nbgrader's formgrader, served by a real Jupyter server on the course root, asked what its
    "Manual Grading" pages ask: the answered submission needs a manual grade, for the written
    answer only, whose comment is the number check; the untouched release scores 0 there without
    one ("No response"); the grading page of the answered one renders the write-up."""
    port, token = _free_port(), "formgrader-test"
    # `jupyter server` in the course root, as docs/grading.md says (nbgrader 0.9 has no formgrader command)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTER_RUNTIME_DIR": str(course / ".runtime"),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    server = subprocess.Popen(["jupyter", "server", "--no-browser", f"--port={port}",
                               "--ServerApp.ip=127.0.0.1", "--allow-root", f"--IdentityProvider.token={token}",
                               f"--ServerApp.root_dir={course}"], cwd=course, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    base, head = f"http://127.0.0.1:{port}/formgrader", {"Authorization": f"token {token}"}

    def get(path: str) -> str:
        with urllib.request.urlopen(urllib.request.Request(base + path, headers=head), timeout=60) as r:
            return r.read().decode()

    try:
        for _ in range(120):  # the server's start-up, seconds on a busy machine
            try:
                subs = {s["student"]: s for s in json.loads(get(f"/api/submitted_notebooks/{ASSIGNMENT}/{ASSIGNMENT}"))}
                break
            except OSError:
                assert server.poll() is None, f"jupyter_server exited: {server.stderr.read()[-2000:]}"
                time.sleep(1)
        else:
            raise AssertionError("the formgrader did not answer in 120 s")
        assert subs["ana"]["needs_manual_grade"] and not subs["bo"]["needs_manual_grade"], subs
        # "Manage Assignments": nbgrader's own flow has submitted/<student>/<assignment>/, so both are counted
        assert [a["num_submissions"] for a in json.loads(get("/api/assignments")) if a["name"] == ASSIGNMENT] == [2]
        for student, starts in (("ana", "Quoted numbers:"), ("bo", "No response")):
            sid = subs[student]["id"]
            pending = [g["name"] for g in json.loads(get(f"/api/grades?submission_id={sid}")) if g["needs_manual_grade"]]
            notes = {c["name"]: c["auto_comment"] for c in json.loads(get(f"/api/comments?submission_id={sid}"))}
            assert sorted(pending) == (["limiter_writeup", "sweep_writeup"] if student == "ana" else []), (student, pending)
            assert all((notes[w] or "").startswith(starts) for w in ("limiter_writeup", "sweep_writeup")), (student, notes)
        page = get(f"/submissions/{subs['ana']['id']}/")
        assert "limiter_writeup" in page and "The printed line decides it" in page
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # `jupyter` starts `jupyter-server`: the whole group
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
