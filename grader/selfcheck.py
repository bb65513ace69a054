"""``python -m grader check NOTEBOOK``: the whole grade of one notebook, for self-study.

It is an nbgrader autograde of that one notebook (locked and test cells restored from
``grader/source``, the learner's answer cells kept), then the lab's judges on the answers it
exported (``grader/judging.py``), run the same way the instructor's batch runs it. Unlike ``nbgrader validate``, which exits 0 even when tests
fail (jupyter/nbgrader#1908) and runs whatever tests the notebook now contains, this exits
non-zero unless every graded cell earned all its points.

Exit status: 0 all passed; 1 some cell lost points; 2 the notebook could not be graded.
"""
from __future__ import annotations

import json
from pathlib import Path

from grader import SOURCE_DIR
from grader import course as C
from grader.batch import grade_batch
from grader.submissions import Submission, record_name
from utils.course.notebook_lab import grade_ids, lab_of


def guess_assignment(notebook: Path, source_dir: Path = SOURCE_DIR) -> str:
    """The lab whose graded cell ids the notebook shares most (:func:`utils.course.notebook_lab.lab_of`), else the
    lab its file name starts with. A name that says one lab while the cells are another's is refused:
    a learner who saved lab 01 as ``00_foundations.ipynb`` learns it, rather than a grade of the wrong lab."""
    names = C.assignments(source_dir)
    try:
        ids = grade_ids(json.loads(notebook.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        ids = set()
    refs = {a: source_dir / a / f"{a}.ipynb" for a in names}
    by_cells = lab_of(ids, refs, "")
    by_name = next((a for a in names if notebook.stem.startswith(a)), None)
    if by_cells and by_name and by_cells != by_name:
        raise C.CourseError(f"{notebook.name} is named for {by_name}, but its cells are {by_cells}'s: rename the file, "
                            f"or pass --assignment {by_cells} (or --assignment {by_name}) to say which lab to grade")
    found = by_cells or by_name
    if found is None:
        raise C.CourseError(f"{notebook.name} matches no assignment in {source_dir} (known: {', '.join(names)}); "
                            "pass --assignment")
    return found


def check_notebook(notebook: Path, *, assignment: str | None = None, record: Path | None = None,
                   timeout_s: int | None = None, out_dir: Path | None = None, source_dir: Path = SOURCE_DIR,
                   screen: bool = True, count_provisional: bool = False) -> dict:
    """Grade ``notebook``; returns the result dict that ``--json-out`` writes. With
    ``out_dir``, the graded notebook and the record it wrote are kept there (as ``autograde``
    keeps them, under ``autograded/self/``)."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise C.CourseError(f"no notebook at {notebook}")
    assignment = assignment or guess_assignment(notebook, source_dir)
    if record is None:
        for cand in (notebook.with_name(record_name(assignment)), notebook.with_name(f"{notebook.stem}.record.json")):
            if cand.is_file():
                record = cand
                break
    sub = Submission("self", notebook, record)
    (res,) = grade_batch(assignment, [sub], out_dir, jobs=1, timeout_s=timeout_s, feedback=out_dir is not None,
                         progress=False, source_dir=source_dir, screen=screen, count_provisional=count_provisional)
    res["notebook"] = str(notebook)
    res["record"] = str(record) if record else None
    res["passed"] = res["status"] == "ok" or res["status"].startswith("graded;")
    auto_max = res.get("auto_max_score", res["max_score"])  # the written answers are the instructor's
    earned = res.get("verified_score", res["score"]) + res.get("provisional_score", 0.0)  # self-study: a record's count
    res["passed"] = bool(res["passed"] and res["cells"] and earned >= auto_max)
    return res


def time_line(res: dict) -> str:
    """Where the grading time went: the whole run, the drawn cases the learner's functions ran on, and
    the cells the grader spent longest on (their harnesses and measurements), so an instructor sees
    what a class of this lab costs."""
    judged = sorted(((c.get("judge_s") or 0.0, c["cell"]) for c in res.get("cells", [])), reverse=True)
    spent = sum(s for s, _ in judged) + (res.get("calls_s") or 0.0)
    top = ", ".join(f"{cell} {s:.0f} s" for s, cell in judged[:3] if s >= 1)
    return (f"time: {res['grading_s']:.0f} s in all: the notebook run {max(0.0, res['grading_s'] - spent):.0f} s, "
            f"the grader's own work {spent:.0f} s (drawn cases {res.get('calls_s') or 0.0:.0f} s"
            + (f"; longest: {top}" if top else "") + ")")


def format_table(res: dict) -> str:
    """The per-cell table printed by ``check``."""
    rows = [("cell", "points", "score", "passed", "graded", "note")]
    for c in res["cells"]:
        manual = c.get("mode") == "manual"
        rows.append((c["cell"], f"{c['points']:g}", "-" if manual else f"{c['score']:g}",
                     "instructor" if manual else "yes" if c.get("passed") else "NO", c.get("mode", "-"), c.get("message", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:5], widths, strict=True)) + ("  " + r[5] if r[5] else "") for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(f"score {res['score']:g} / {res['max_score']:g}    status: {res['status']}")
    if res.get("assignment"):
        lines.append(f"graded as {res['assignment']}" + (f" ({res['notebook']})" if res.get("notebook") else ""))
    if res.get("manual_points"):
        lines.append(f"automatic score {res['score']:g} / {res['auto_max_score']:g}, partial: {res['manual_points']:g} points "
                     "of written answers await a manual grade (the note beside each is the check of the numbers it quotes)")
    if res.get("timeout_why"):
        lines.append(f"per-cell time limit: {res['timeout_why']}")
    if res.get("grading_s"):
        lines.append(time_line(res))
    for note in res.get("notes", []):
        if note.startswith("screen: "):
            lines.append(f"  {note.removeprefix('screen: ')}")
    if res.get("needs_review"):
        lines.append("Flagged for an instructor's review (the lines above say why); the grade was decided by the "
                     "grader's judges outside your notebook all the same.")
    if res.get("provisional_score"):
        counted = "counted" if res.get("count_provisional") else "not counted in the score above"
        lines.append(f"provisional: {res['provisional_score']:g} points were judged from your measurement record "
                     f"(this machine has no GPU; a record is checked for consistency, not re-measured), {counted}. "
                     "Grade on a GPU to have them verified.")
    return "\n".join(lines)
