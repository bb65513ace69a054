"""Grade many submissions: one course copy and one worker process per student.

``grade_batch`` releases the assignment once into a master course copy (its gradebook then
holds the source cells, hidden tests and checksums), copies that per student, repairs and
places each notebook in nbgrader's ``submitted/`` layout, and runs ``grader.worker`` for
each, ``jobs`` at a time. A submission that cannot be read, crashes its kernel or runs past
its time limit gets a score of 0 and a one-line ``status``; the others are unaffected.

Outputs (``out_dir``): ``grades.csv`` (nbgrader's ``export`` columns plus ``status``),
``results.json`` (per-cell detail), ``feedback/<student>/<assignment>.html`` and
``autograded/<student>/<assignment>.ipynb``.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader import REPO_ROOT, SOURCE_DIR
from grader import course as C
from grader.submissions import Submission, SubmissionError, prepare

CSV_COLUMNS = [  # nbgrader's CsvExportPlugin columns, in its order, then ours
    "assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
    "raw_score", "late_submission_penalty", "score", "max_score", "status",
]
RECORD_ENV = "GPULAB_SUBMITTED_RECORD"  # grader/checks.py reads the learner's record from here
KEEP_ENV = "GPULAB_KEEP_GRADING_DIRS"  # set to 1 to keep the temporary course copies for debugging


def _zero(sub: Submission, assignment: str, max_score: float, status: str, cells: list[dict]) -> dict:
    return {
        "student_id": sub.student_id, "assignment": assignment, "score": 0.0, "max_score": max_score,
        "status": status, "notes": [], "timestamp": "", "duedate": None,
        "cells": [dict(c, score=0.0, passed=False, mode="-", message="not graded") for c in cells],
    }


def _kernel_env(smoke: bool, utils_sha256: str) -> dict:
    """The environment every grading kernel inherits.

    In smoke mode each kernel gets one CPU thread: torch's OpenMP threads spin-wait, and two
    notebooks (or a notebook and anything else) sharing two cores with two threads each slow
    down tenfold at random, which no band survives. One thread each is slower, and steady."""
    env = dict(os.environ)
    env.pop(RECORD_ENV, None)
    env["GPULAB_UTILS_SHA256"] = utils_sha256
    if smoke:
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
    return env


def _run_worker(work: Path, assignment: str, sub: Submission, timeout_s: int, total_timeout_s: float,
                feedback: bool, record: Path | None, base_env: dict) -> dict:
    course = work / sub.student_id
    result_file = course / "result.json"
    env = dict(base_env)
    if record is not None:
        env[RECORD_ENV] = str(record)
    cmd = [sys.executable, "-m", "grader.worker", "--course", str(course), "--assignment", assignment,
           "--student", sub.student_id, "--timeout", str(timeout_s), "--result", str(result_file)]
    if not feedback:
        cmd.append("--no-feedback")
    with open(course / "worker.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=total_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and the kernel it started
            proc.wait()
            return {"status": f"grading took longer than {total_timeout_s:.0f} s and was stopped"}
    if not result_file.is_file():
        tail = (course / "worker.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"status": f"grader worker failed (exit {proc.returncode}): {tail[0][:200]}"}
    return json.loads(result_file.read_text())


def grade_batch(
    assignment: str,
    subs: list[Submission],
    out_dir: Path | None,
    *,
    jobs: int = 1,
    timeout_s: int | None = None,
    total_timeout_s: float | None = None,
    feedback: bool = True,
    progress: bool = True,
    source_dir: Path = SOURCE_DIR,
) -> list[dict]:
    """Grade ``subs``; write the outputs to ``out_dir`` (if given); return one dict each."""
    from utils.env import smoke_mode
    from utils.record import utils_hash

    timeout_s = timeout_s or C.default_timeout_s()
    base_env = _kernel_env(smoke_mode(), utils_hash())
    work = Path(tempfile.mkdtemp(prefix="gpulab-grade-"))
    try:
        master = C.make_course(work / "_master", assignment, source_dir)
        released = C.released_path(master, assignment)
        base = C.read_grades(master, assignment, "_nobody_")
        max_score, cell_list = base["max_score"], _grade_cells(released)
        n_code = sum(1 for c in json.loads(released.read_text())["cells"] if c["cell_type"] == "code")
        total = total_timeout_s or (timeout_s * n_code + 120)

        results: dict[str, dict] = {}
        runnable = []
        for sub in subs:
            course = work / sub.student_id
            shutil.copytree(master, course, ignore=shutil.ignore_patterns("autograded", "feedback", "submitted"))
            dest = C.submitted_dir(course, assignment, sub.student_id)
            try:
                notes = prepare(sub, released, dest, f"{assignment}.ipynb")
            except SubmissionError as exc:
                name = sub.notebook.name if sub.notebook else sub.student_id
                results[sub.student_id] = _zero(sub, assignment, max_score, f"{name} {exc}" if sub.notebook else str(exc), cell_list)
                continue
            record = None
            if sub.record is not None:
                record = dest / f"{assignment}.submitted-record.json"
                shutil.copyfile(sub.record, record)
            runnable.append((sub, notes, record))

        bar = _progress(len(subs), progress)
        bar.update(len(results))
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(_run_worker, work, assignment, sub, timeout_s, total, feedback, rec, base_env): (sub, notes)
                       for sub, notes, rec in runnable}
            for fut in as_completed(futures):
                sub, notes = futures[fut]
                r = fut.result()
                if "cells" not in r:  # the worker never finished
                    r = _zero(sub, assignment, max_score, r["status"], cell_list)
                r.setdefault("max_score", max_score)
                r["notes"] = notes + r.get("notes", [])
                if r["status"] == "ok" and notes:
                    r["status"] = "graded; " + "; ".join(notes)
                results[sub.student_id] = r
                bar.update(1)
        bar.close()
        ordered = [results[s.student_id] for s in subs]
        if out_dir is not None:
            _write_outputs(Path(out_dir), work, assignment, ordered)
        return ordered
    finally:
        if os.environ.get(KEEP_ENV, "") in ("", "0"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"grading folders kept in {work}", file=sys.stderr)


def _grade_cells(released: Path) -> list[dict]:
    cells = []
    for c in json.loads(released.read_text())["cells"]:
        md = c["metadata"].get("nbgrader", {})
        if md.get("grade") and c["cell_type"] == "code":
            cells.append({"cell": md["grade_id"], "points": float(md.get("points", 0))})
    return cells


def _progress(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="grading", unit="submission", disable=not enabled, file=sys.stderr)
    except ImportError:  # tqdm is a requirement; stay usable without it
        class _Null:
            def update(self, n): pass
            def close(self): pass
        return _Null()


def _write_outputs(out: Path, work: Path, assignment: str, results: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in results:
            w.writerow({
                "assignment": assignment, "duedate": r.get("duedate") or "", "timestamp": r.get("timestamp", ""),
                "student_id": r["student_id"], "last_name": "", "first_name": "", "email": "",
                "raw_score": r.get("raw_score", r["score"]), "late_submission_penalty": r.get("late_submission_penalty", 0.0),
                "score": r["score"], "max_score": r["max_score"], "status": r["status"],
            })
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    for r in results:
        sid = r["student_id"]
        fb = C.feedback_path(work / sid, assignment, sid)
        if fb.is_file():
            (out / "feedback" / sid).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fb, out / "feedback" / sid / f"{assignment}.html")
        ag = C.autograded_path(work / sid, assignment, sid)
        if ag.is_file():
            (out / "autograded" / sid).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ag, out / "autograded" / sid / f"{assignment}.ipynb")
            for rec in ag.parent.glob("*.record.json"):  # the record the notebook wrote while it was graded
                shutil.copyfile(rec, out / "autograded" / sid / rec.name)
