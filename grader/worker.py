"""Grade one prepared submission in its own process: ``python -m grader.worker ...``.

The batch (grader/batch.py) prepares a course copy per student and starts one of these per
submission, so parallel jobs share no gradebook, no environment variables (the kernel
inherits them) and no Jupyter kernel, and a runaway submission can be killed as a whole
process group. The result is one JSON file: score, per-cell grades with each judge's verdict
(the verdicts file ``grader.preprocessors.JudgeCells`` writes: mode, message, notes, verified
and provisional points), and a one-line status.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from grader.processes import become_subreaper, kill_descendants
from grader.startup import skip_iri_grammars

skip_iri_grammars()  # before anything imports nbformat (grader/startup.py)

KERNEL_DEATH_RETRIES = 1  # a dead kernel is graded once more: a machine's fault must not cost the learner


def _snapshot(course: Path, assignment: str, student: str) -> dict[Path, bytes]:
    """The bytes every attempt grades: the prepared submission (screened by the batch) and the course
    copy's gradebook, read once before any kernel runs (``_restore`` writes them back before each attempt)."""
    from grader import course as C

    keep = {p: p.read_bytes() for p in C.submitted_dir(course, assignment, student).rglob("*") if p.is_file()}
    db = course / "gradebook.db"
    if db.is_file():
        keep[db] = db.read_bytes()
    return keep


def _restore(keep: dict[Path, bytes], course: Path, assignment: str, student: str) -> None:
    from grader import course as C

    folder = C.submitted_dir(course, assignment, student)
    for p in list(folder.rglob("*")):
        if p.is_file() and p not in keep:
            p.unlink()
    for p, data in keep.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


WATCHED = ("source", "release", "submitted", "jupyter/kernels", "nbgrader_config.py")  # what no notebook may change


def course_changes(course: Path, before: dict | None = None) -> dict | list[str]:
    """File states of the watched parts of a course copy (with ``before``: the paths that changed since)."""
    from grader.batch import _file_states, changed_files

    now = {}
    for part in WATCHED:
        p = course / part
        if p.is_dir():
            now.update({f"{part}/{k}": v for k, v in _file_states(p).items()})
        elif p.is_file():
            st = p.stat()
            now[part] = (False, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return now if before is None else changed_files(before, now)


def _judged_cells(grades: dict, verdicts_file: Path, result: dict) -> None:
    """Per-cell mode, message and notes from the judges' verdicts; the verified and provisional points."""
    try:
        found = json.loads(verdicts_file.read_text())
    except (OSError, ValueError):
        found = {}
    verdicts = found.get("verdicts", {})
    result["seed"] = found.get("seed")
    result["calls_s"] = found.get("calls_s", 0.0)
    if found.get("record_problem"):
        result["notes"].append(found["record_problem"])
    verified = provisional = 0.0
    for cell in grades["cells"]:
        if cell.get("mode") == "manual":
            cell["passed"] = False
            continue
        v = verdicts.get(cell["cell"])
        if v is None:
            cell.update(mode="-", message="not graded" if result["status"] != "ok" else "no verdict", provisional=False)
            cell["passed"] = False
            continue
        cell.update(mode=v["mode"], message=v["message"], notes=v["notes"], provisional=v["provisional"],
                    judge_s=v.get("seconds", 0.0))
        cell["passed"] = bool(v["passed"])
        if v["provisional"]:
            provisional += float(v["points"])
        else:
            verified += float(v["points"])
    result["verified_score"], result["provisional_score"] = verified, provisional


def grade(course: Path, assignment: str, student: str, timeout_s: int, feedback: bool, iopub_s: int | None = None,
          startup_s: int | None = None, timeout_why: str = "", count_provisional: bool = False,
          seed: int | None = None) -> dict:
    from grader import course as C

    result = {"student_id": student, "assignment": assignment, "status": "ok", "notes": [],
              "timeout_s": timeout_s, "timeout_why": timeout_why, "count_provisional": count_provisional}
    keep = _snapshot(course, assignment, student)
    verdicts, changed = course / "verdicts.json", []
    for attempt in range(1 + KERNEL_DEATH_RETRIES):
        result["status"] = "ok"
        _restore(keep, course, assignment, student)  # a retry grades the screened bytes, whatever the kernel wrote
        verdicts.unlink(missing_ok=True)
        watched = course_changes(course)
        started = time.perf_counter()
        try:
            C.autograde(course, assignment, student, timeout_s, iopub_s, startup_s, verdicts=verdicts,
                        count_provisional=count_provisional, seed=seed)
        except C.CourseError as exc:
            result["status"] = str(exc) + (f" (per-cell limit {timeout_why})" if "timeout" in str(exc) and timeout_why else "")
        finally:
            kill_descendants()  # nothing the notebook started may outlive its grading
            changed += [p for p in course_changes(course, watched) if p not in changed]
            result["grading_s"] = round(time.perf_counter() - started, 1)  # the last attempt's
        if result["status"] != C.KERNEL_DIED:
            break
        if attempt < KERNEL_DEATH_RETRIES:
            result["notes"].append("the kernel died during grading (on a shared machine the OOM killer or "
                                   "another job can do that); the notebook was graded again from the start")
    grades = C.read_grades(course, assignment, student)
    _judged_cells(grades, verdicts, result)
    if changed:
        result["needs_review"] = True
        result["notes"].append("the notebook changed files of its course copy while it was graded ("
                               + ", ".join(changed[:3]) + (", ..." if len(changed) > 3 else "")
                               + "); every attempt graded the submitted bytes; flagged for review")
    if result["status"] != "ok":
        grades["score"] = 0.0
        result["verified_score"] = result["provisional_score"] = 0.0
        for cell in grades["cells"]:
            cell["score"], cell["passed"] = 0.0, False
    result.update(grades)
    if feedback and C.autograded_path(course, assignment, student).is_file():
        try:
            C.generate_feedback(course, assignment, student)
        except C.CourseError as exc:
            result["notes"].append(f"no feedback HTML: {exc}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.worker", description=__doc__.splitlines()[0])
    p.add_argument("--course", type=Path, required=True)
    p.add_argument("--assignment", required=True)
    p.add_argument("--student", required=True)
    p.add_argument("--timeout", type=int, required=True)
    p.add_argument("--iopub-timeout", type=int, help="seconds a cell's last output may take after its reply")
    p.add_argument("--startup-timeout", type=int, help="seconds a kernel may take to start")
    p.add_argument("--timeout-why", default="", help="how the per-cell limit was chosen, for the result")
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--no-feedback", action="store_true")
    p.add_argument("--count-provisional", action="store_true", help="count points judged from a learner's record")
    p.add_argument("--seed", type=int, help="the hidden cases' seed (default: drawn afresh)")
    a = p.parse_args(argv)
    from grader import course as C

    C.prepare_process_env(a.course / "jupyter")
    become_subreaper()
    from grader.preprocessors import start_preload

    start_preload(a.assignment)  # the judges' code, in memory before the notebook's first cell runs
    try:
        result = grade(a.course, a.assignment, a.student, a.timeout, not a.no_feedback, a.iopub_timeout,
                       a.startup_timeout, a.timeout_why, a.count_provisional, a.seed)
    except Exception as exc:  # the batch must go on: report, do not crash
        traceback.print_exc()
        result = {"student_id": a.student, "assignment": a.assignment, "score": 0.0, "cells": [],
                  "status": f"grader error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    a.result.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
