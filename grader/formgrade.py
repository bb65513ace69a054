"""A graded class into nbgrader's gradebook, for the formgrader: ``python -m grader gradebook OUT``.

``python -m grader autograde`` (and ``merge``, after sharded grading on a cluster) grades each
submission in a temporary course copy of its own, so its gradebooks are gone when it ends; what
stays is ``OUT/results.json`` and ``OUT/autograded/<student>/<assignment>.ipynb``. The written
answers (grader/writeups.py) still need an instructor, and nbgrader's formgrader reads only the
course root's gradebook (``gradebook.db`` in ``grader/``) and its ``autograded/<student>/<assignment>/``
folders. This module writes both from ``OUT``, through nbgrader's own ``Gradebook`` API
(nbgrader/api.py): the assignment (nbgrader's ``generate_assignment`` on the course root, when the
gradebook lacks it), each student and submission (``add_submission`` makes a grade per graded
cell and a comment per answer cell), then each cell's automatic score as the batch graded it:

- a test cell: its score, no manual grade needed;
- a written answer: no automatic score and a manual grade needed, or 0 when left as released
  (as nbgrader's ``SaveAutoGrades`` does it), with the number check as its automatic comment;
- a submission that was not graded (held for review by grader/screen.py, unreadable, past its
  time) has no graded notebook in ``OUT``: it is skipped and named, with its status.

Scores an instructor has already given (``manual_score``) are never touched, so loading the
class again, after regrading one student, keeps the manual grading done so far. Then, in the
course root: ``nbgrader formgrader`` to grade, ``nbgrader export`` for the CSV.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from grader import COURSE_ROOT
from grader.course import CourseError


def _results(out: Path) -> tuple[str, list[dict]]:
    path = Path(out) / "results.json"
    if not path.is_file():
        raise CourseError(f"no results.json in {out}: give the --out folder of `python -m grader autograde` or `merge`")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CourseError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}): grade the class again") from None
    if not isinstance(results, list) or not results or not all(isinstance(r, dict) and "student_id" in r
                                                               for r in results):
        raise CourseError(f"{path} holds no graded submissions")
    names = {r.get("assignment") for r in results}
    if len(names) != 1 or None in names:
        raise CourseError(f"{path} mixes assignments ({', '.join(sorted(map(str, names)))}): load one at a time")
    return names.pop(), results


def _ensure_assignment(course: Path, assignment: str) -> None:
    """The assignment in ``course``'s gradebook, made by nbgrader's generate_assignment if missing."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader import course as C

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        try:
            gb.find_assignment(assignment)
            return
        except MissingEntry:
            pass
    if not (course / "source" / assignment).is_dir():
        raise CourseError(f"{course} has no source/{assignment}/: give the course root that holds the assignment "
                          "(the repository's grader/)")
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    cfg = C.load_config(course)
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    app = GenerateAssignment(coursedir=coursedir, config=cfg)
    app.force, app.create_assignment = True, True
    C._run(app)


def load_class(out: Path, course: Path = COURSE_ROOT) -> dict:
    """Write the graded class in ``out`` into ``course``'s gradebook and autograded folders.
    Returns ``{"assignment", "loaded": [student ids], "skipped": {student: why}}``."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader import course as C

    out, course = Path(out), Path(course)
    assignment, results = _results(out)
    C.ensure_scripts_on_path()  # nbgrader runs alembic from PATH to make a new gradebook
    _ensure_assignment(course, assignment)
    loaded, skipped = [], {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for r in results:
            sid = str(r["student_id"])
            graded = out / "autograded" / sid / f"{assignment}.ipynb"
            if not graded.is_file():
                skipped[sid] = f"no graded notebook ({str(r.get('status', ''))[:120]})"
                continue
            dest = course / "autograded" / sid / assignment
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(graded, dest / f"{assignment}.ipynb")
            for rec in graded.parent.glob(f"{assignment}*.record.json"):
                shutil.copyfile(rec, dest / rec.name)
            gb.update_or_create_student(sid)
            try:
                gb.find_submission(assignment, sid)
            except MissingEntry:
                gb.add_submission(assignment, sid, **({"timestamp": r["timestamp"]} if r.get("timestamp") else {}))
            for c in r.get("cells", []):
                try:
                    grade = gb.find_grade(c["cell"], assignment, assignment, sid)
                except MissingEntry:
                    continue  # a cell this gradebook's assignment does not grade
                if c.get("mode") == "manual":
                    answered = bool(c.get("needs_manual_grade"))
                    grade.auto_score, grade.needs_manual_grade = (None, True) if answered else (0.0, False)
                    try:
                        gb.find_comment(c["cell"], assignment, assignment, sid).auto_comment = c.get("message") or None
                    except MissingEntry:
                        pass
                else:
                    grade.auto_score = float(c.get("score", 0.0))
                    grade.needs_manual_grade = grade.manual_score is not None  # nbgrader's rule: a regrade is reviewed
            gb.db.commit()
            loaded.append(sid)
    return {"assignment": assignment, "loaded": loaded, "skipped": skipped}
