"""Grade one prepared submission in its own process: ``python -m grader.worker ...``.

The batch (grader/batch.py) prepares a course copy per student and starts one of these per
submission, so parallel jobs share no gradebook, no environment variables (the kernel
inherits them) and no Jupyter kernel, and a runaway submission can be killed as a whole
process group. The result is one JSON file: score, per-cell grades, how each measured cell
was graded (parsed from the test cells' stdout), and a one-line status.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

KERNEL_DEATH_RETRIES = 1  # a dead kernel is graded once more: a machine's fault must not cost the learner
MARK = "grader:"  # grader/checks.py prints "grader: measured live ..." / "grader: graded from record ..."


def _timed_out(cell: dict) -> bool:
    return any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError" for o in cell.get("outputs", []))


def cell_reports(nb_path: Path, timeout_why: str = "") -> dict[str, dict]:
    """Per test cell: how it was graded and the first line of what went wrong. A test cell that
    fails after an earlier cell timed out says so: what that cell would have defined is missing,
    and the timeout (``timeout_why``: its length and why) may be the machine's, not the learner's."""
    if not nb_path.is_file():
        return {}
    nb = json.loads(nb_path.read_text())
    out, first_timeout = {}, None
    for cell in nb["cells"]:
        md = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and first_timeout is None and _timed_out(cell):
            first_timeout = md.get("grade_id") or "".join(cell.get("source", ""))[:40].strip()
            if not md.get("grade"):
                continue
        if not md.get("grade") or cell.get("cell_type") != "code":
            continue
        mode, message = "", ""
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                text = "".join(o.get("text", ""))
                if o.get("name") == "stdout":
                    for line in text.splitlines():
                        if line.startswith(MARK):
                            low = line.lower()
                            if "graded from record" in low:
                                mode = "graded from record"
                            elif "measured live" in low and mode != "graded from record":
                                mode = "measured live"
                elif o.get("name") == "stderr" and not message:
                    first = next((ln for ln in text.splitlines() if ln.strip()), "")
                    message = f"wrote to stderr: {first[:160]}"
            elif o.get("output_type") == "error":
                ename, evalue = o.get("ename", "Error"), str(o.get("evalue", "")).strip()
                if ename == "CellTimeoutError":
                    message = "timed out" + (f" (per-cell limit {timeout_why})" if timeout_why else "")
                elif not message.startswith("timed out"):
                    message = f"{ename}: {evalue.splitlines()[0] if evalue else ''}"[:300]
        if message and first_timeout is not None and not message.startswith("timed out"):
            message += (f" [an earlier cell, {first_timeout!r}, timed out"
                        + (f" (per-cell limit {timeout_why})" if timeout_why else "") + ": what it defines may be missing]")
        out[md["grade_id"]] = {"mode": mode or "-", "message": message}
    return out


def grade(course: Path, assignment: str, student: str, timeout_s: int, feedback: bool, iopub_s: int | None = None,
          startup_s: int | None = None, timeout_why: str = "") -> dict:
    from grader import course as C

    result = {"student_id": student, "assignment": assignment, "status": "ok", "notes": [],
              "timeout_s": timeout_s, "timeout_why": timeout_why}
    for attempt in range(1 + KERNEL_DEATH_RETRIES):
        result["status"] = "ok"
        try:
            C.autograde(course, assignment, student, timeout_s, iopub_s, startup_s)
        except C.CourseError as exc:
            result["status"] = str(exc) + (f" (per-cell limit {timeout_why})" if "timeout" in str(exc) and timeout_why else "")
        finally:
            C.kill_descendants()  # nothing the notebook started may outlive its grading
        if result["status"] != C.KERNEL_DIED:
            break
        if attempt < KERNEL_DEATH_RETRIES:
            result["notes"].append("the kernel died during grading (on a shared machine the OOM killer or "
                                   "another job can do that); the notebook was graded again from the start")
    grades = C.read_grades(course, assignment, student)
    reports = cell_reports(C.autograded_path(course, assignment, student), timeout_why)
    for cell in grades["cells"]:
        if cell.get("mode") == "manual":  # a written answer: the instructor's, with the quoted-number note
            cell["passed"] = False
            continue
        rep = reports.get(cell["cell"], {"mode": "-", "message": "not run" if result["status"] != "ok" else ""})
        cell.update(rep)
        cell["passed"] = cell["score"] >= cell["points"] and cell["points"] > 0
    if result["status"] == "ok" and C.autograded_path(course, assignment, student).is_file():
        from grader import clean_room, clean_values

        # every cell that scored in the kernel, measured ones included: the clean process measures
        # again with the grader's timer, and gives no verdict where that missed on a loaded machine
        passed = {c["cell"] for c in grades["cells"] if c.get("mode") != "manual" and c.get("score", 0) > 0}
        values = os.environ.get(clean_values.VALUES_ENV)
        found = clean_room.verdicts(C.autograded_path(course, assignment, student), cwd=C.REPO_ROOT, only=passed,
                                    values=Path(values) if values else None,
                                    cell_timeout_s=max(clean_room.CELL_TIMEOUT_S, timeout_s))
        notes = clean_room.apply(grades["cells"], found)
        if notes:
            grades["score"] = max(0.0, grades["score"] - sum(c["kernel_score"] for c in grades["cells"]
                                                              if "kernel_score" in c))
            clean_room.hold_in_gradebook(course, assignment, student, grades["cells"])
            result["notes"] += notes
        result["clean_room"] = {"checked": sorted(k for k, v in found.items() if v[0] is not None),
                                "unchecked": {k: v[1] for k, v in sorted(found.items()) if v[0] is None and k in passed},
                                "disagreed": sorted(c["cell"] for c in grades["cells"] if "kernel_score" in c)}
    if result["status"] != "ok":
        grades["score"] = 0.0
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
    a = p.parse_args(argv)
    from grader import course as C

    C.prepare_process_env(a.course / "jupyter")
    C.become_subreaper()
    try:
        result = grade(a.course, a.assignment, a.student, a.timeout, not a.no_feedback, a.iopub_timeout,
                       a.startup_timeout, a.timeout_why)
    except Exception as exc:  # the batch must go on: report, do not crash
        traceback.print_exc()
        result = {"student_id": a.student, "assignment": a.assignment, "score": 0.0, "cells": [],
                  "status": f"grader error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    a.result.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
