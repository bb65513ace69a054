"""A graded class into nbgrader's gradebook, for the formgrader, and back out once the written
answers are graded: ``python -m grader gradebook OUT`` and ``python -m grader feedback OUT``.

``python -m grader autograde`` (and ``merge``, after sharded grading on a cluster) grades each
submission in a temporary course copy of its own, so its gradebooks are gone when it ends; what
stays is ``OUT/results.json`` and ``OUT/autograded/<student>/<assignment>.ipynb``. The written
answers (grader/writeups.py) still need an instructor, and nbgrader's formgrader reads only the
course root's gradebook (``gradebook.db`` in ``grader/``) and its ``submitted/`` and
``autograded/<student>/<assignment>/`` folders. :func:`load_class` writes them from ``OUT``, through
nbgrader's own ``Gradebook`` API (nbgrader/api.py): the assignment (nbgrader's ``generate_assignment``
on the course root, when the gradebook lacks it), each student and submission (``add_submission``
makes a grade per graded cell and a comment per answer cell), then each cell's automatic score as
the batch graded it:

- a test cell: its score, no manual grade needed;
- a written answer: no automatic score and a manual grade needed, or 0 when left as released
  (as nbgrader's ``SaveAutoGrades`` does it), with the number check as its automatic comment;
- a submission that was not graded (unreadable, its course copy changed, past
  its time) has no graded notebook in ``OUT``: it is skipped and named, with its status.

The formgrader counts a submission ("Manage Assignments", "# submissions") from the folder
``submitted/<student>/<assignment>/``, and lists it as graded only when that folder's
``timestamp.txt`` equals the gradebook's timestamp (``NbGraderAPI.get_autograded_students``): both
are written here, the graded notebook standing in for the submission.

Scores an instructor has already given (``manual_score``) are never touched, so loading the
class again, after regrading one student, keeps the manual grading done so far. Then, in the
course root, ``jupyter server`` (or ``jupyter lab``) and the page ``/formgrader`` to grade.

After grading, :func:`sync` brings ``OUT`` up to date with the gradebook: each student's feedback
HTML is generated again by nbgrader's ``GenerateFeedback`` (which reads the grades from the
gradebook, the instructor's included) into ``OUT/feedback/<student>/<assignment>.html``, and
``OUT/grades.csv`` is rewritten with the gradebook's totals and the write-ups still waiting.
:func:`gradebook_state` is what both, and the export (grader/lms.py), read: for each student,
whether the gradebook holds this very grading (its graded notebook byte for byte), the total
there, and the written answers still waiting for a grade.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import warnings
from pathlib import Path

from grader import COURSE_ROOT
from grader.course import CourseError


@contextlib.contextmanager
def quiet_gradebook():
    """nbgrader's ``Gradebook.add_submission`` makes its rows in a way SQLAlchemy 2 warns about
    ("Object of type <SubmittedAssignment> not in session, add operation along ... will not
    proceed": the autoflush it triggers runs before the new row is added; the row is added right
    after, and nothing is lost). Those warnings, and only those, are silenced here."""
    with warnings.catch_warnings():
        try:
            from sqlalchemy.exc import SAWarning
        except ImportError:  # pragma: no cover - nbgrader requires SQLAlchemy
            SAWarning = Warning  # noqa: N806
        warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session", category=SAWarning)
        yield


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


def _db(course: Path) -> str:
    return f"sqlite:///{Path(course) / 'gradebook.db'}"


def _ensure_assignment(course: Path, assignment: str) -> None:
    """The assignment in ``course``'s gradebook, made by nbgrader's generate_assignment if missing."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader import course as C

    with Gradebook(_db(course)) as gb:
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


def _timestamp(text) -> object:
    """A timestamp as nbgrader keeps it (naive UTC), or None."""
    from nbgrader.utils import parse_utc

    if not text or not str(text).strip():
        return None
    try:
        return parse_utc(str(text).strip())
    except (ValueError, OverflowError):
        return None


def _place_submission(course: Path, assignment: str, sid: str, graded: Path, timestamp: str | None,
                      previous: bytes | None):
    """``submitted/<sid>/<assignment>/``, which the formgrader counts, with ``timestamp.txt`` (when there
    is a timestamp). A submission already there is replaced only where an earlier load put it (it is
    the graded notebook loaded then, ``previous``); one from nbgrader's own collect is kept. Returns
    the timestamp the gradebook must hold for the formgrader to list the submission as graded."""
    folder = course / "submitted" / sid / assignment
    folder.mkdir(parents=True, exist_ok=True)
    there = folder / f"{assignment}.ipynb"
    if not there.is_file() or (previous is not None and there.read_bytes() == previous):
        shutil.copyfile(graded, there)
    stamp = folder / "timestamp.txt"
    ts = _timestamp(timestamp)
    if ts is None and stamp.is_file():
        ts = _timestamp(stamp.read_text())
    if ts is not None:
        stamp.write_text(f"{ts:%Y-%m-%d %H:%M:%S.%f} UTC\n")
    return ts


def load_class(out: Path, course: Path = COURSE_ROOT) -> dict:
    """Write the graded class in ``out`` into ``course``'s gradebook, ``submitted/`` and ``autograded/``
    folders. Returns ``{"assignment", "loaded": [student ids], "skipped": {student: why}}``."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader import course as C

    out, course = Path(out), Path(course)
    assignment, results = _results(out)
    C.ensure_scripts_on_path()  # nbgrader runs alembic from PATH to make a new gradebook
    loaded, skipped = [], {}
    with quiet_gradebook():
        _ensure_assignment(course, assignment)
        with Gradebook(_db(course)) as gb:
            for r in results:
                sid = str(r["student_id"])
                graded = out / "autograded" / sid / f"{assignment}.ipynb"
                if not graded.is_file():
                    skipped[sid] = f"no graded notebook ({str(r.get('status', ''))[:120]})"
                    continue
                dest = course / "autograded" / sid / assignment
                dest.mkdir(parents=True, exist_ok=True)
                before = dest / f"{assignment}.ipynb"
                previous = before.read_bytes() if before.is_file() else None
                shutil.copyfile(graded, dest / f"{assignment}.ipynb")
                for rec in graded.parent.glob(f"{assignment}*.record.json"):
                    shutil.copyfile(rec, dest / rec.name)
                ts = _place_submission(course, assignment, sid, graded, r.get("timestamp"), previous)
                gb.update_or_create_student(sid)
                try:
                    sub = gb.find_submission(assignment, sid)
                except MissingEntry:
                    sub = gb.add_submission(assignment, sid)
                sub.timestamp = ts  # as submitted/<sid>/<assignment>/timestamp.txt has it (None: neither has one)
                for c in r.get("cells", []):
                    try:
                        grade = gb.find_grade(c["cell"], assignment, assignment, sid)
                    except MissingEntry:
                        continue  # a cell this gradebook's assignment does not grade
                    if c.get("mode") == "manual":
                        answered = bool(c.get("needs_manual_grade"))
                        grade.auto_score = None if answered else 0.0
                        # a grade the instructor already gave stays, and needs no reader again
                        grade.needs_manual_grade = answered and grade.manual_score is None
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


def gradebook_state(out: Path, course: Path = COURSE_ROOT) -> tuple[str, list[dict], dict[str, dict]]:
    """``(assignment, results, state)``: ``results`` is ``OUT/results.json``; ``state[student]`` is
    ``{"in_gradebook": bool, "why": str, "score", "max_score", "late_submission_penalty", "pending":
    [(cell, points)], "manual": {cell: score}}`` for each graded student, read from ``course``'s
    gradebook where it holds this grading (the same graded notebook), else ``in_gradebook`` False with
    the reason. Never writes the gradebook, and makes none where there is none."""
    out, course = Path(out), Path(course)
    assignment, results = _results(out)
    state: dict[str, dict] = {}
    db = course / "gradebook.db"
    graded = {str(r["student_id"]): out / "autograded" / str(r["student_id"]) / f"{assignment}.ipynb" for r in results}
    for sid, nb in graded.items():
        if not nb.is_file():
            continue
        there = course / "autograded" / sid / assignment / f"{assignment}.ipynb"
        if not db.is_file():
            state[sid] = {"in_gradebook": False, "why": f"no gradebook in {course} (python -m grader gradebook {out})"}
        elif not there.is_file() or there.read_bytes() != nb.read_bytes():
            state[sid] = {"in_gradebook": False, "why": f"the gradebook in {course} does not hold this grading of the "
                                                        f"submission (python -m grader gradebook {out})"}
        else:
            state[sid] = {"in_gradebook": True, "why": ""}
    if not any(s["in_gradebook"] for s in state.values()):
        return assignment, results, state
    from nbgrader.api import Gradebook, MissingEntry

    with quiet_gradebook(), Gradebook(_db(course)) as gb:
        for sid, s in state.items():
            if not s["in_gradebook"]:
                continue
            try:
                sub = gb.find_submission(assignment, sid)
            except MissingEntry:
                s.update(in_gradebook=False, why=f"the gradebook in {course} has no submission of {sid} "
                                                 f"(python -m grader gradebook {out})")
                continue
            pending, manual = [], {}
            for nb in sub.notebooks:
                for g in nb.grades:
                    if g.needs_manual_grade:
                        pending.append((g.name, float(g.max_score)))
                    if g.manual_score is not None:
                        manual[g.name] = float(g.manual_score)
            s.update(score=float(sub.score), max_score=float(sub.max_score), pending=pending, manual=manual,
                     late_submission_penalty=float(sub.late_submission_penalty or 0.0))
    return assignment, results, state


def _write_csv(path: Path, header: list[str], rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)  # a reader sees the old file or the new one


def _num(text, default: float = 0.0) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def sync(out: Path, course: Path = COURSE_ROOT) -> dict:
    """After manual grading: for every student whose grading the gradebook holds, the feedback HTML
    generated again from the gradebook (nbgrader's GenerateFeedback in ``course``) and copied to
    ``OUT/feedback/<student>/<assignment>.html``; ``OUT/grades.csv`` rewritten with the gradebook's
    total (``score``, ``raw_score``; ``verified_score`` gains what the instructor gave) and the
    write-ups still waiting (``needs_manual_grade``). Returns ``{"assignment", "synced": [ids],
    "skipped": {student: why}}``; students not graded keep their row and their feedback."""
    from grader import course as C

    out, course = Path(out), Path(course)
    assignment, results, state = gradebook_state(out, course)
    synced, skipped = [], {}
    C.ensure_scripts_on_path()
    for r in results:
        sid = str(r["student_id"])
        s = state.get(sid)
        if s is None:
            continue  # not graded: its row and its feedback say why already
        if not s["in_gradebook"]:
            skipped[sid] = s["why"]
            continue
        try:
            C.generate_feedback(course, assignment, sid)
        except CourseError as exc:
            skipped[sid] = f"nbgrader generate_feedback failed: {exc}"
            continue
        html = C.feedback_path(course, assignment, sid)
        (out / "feedback" / sid).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(html, out / "feedback" / sid / f"{assignment}.html")
        synced.append(sid)
    grades = out / "grades.csv"
    if synced and grades.is_file():
        with open(grades, newline="") as fh:
            reader = csv.DictReader(fh)
            header, rows = list(reader.fieldnames or []), list(reader)
        for row in rows:
            s = state.get(row.get("student_id", ""))
            if row.get("student_id") not in synced or s is None:
                continue
            old = _num(row.get("score"))
            penalty = s["late_submission_penalty"]
            new = max(s["score"] - penalty, 0.0)
            row.update(raw_score=s["score"], score=new, late_submission_penalty=penalty,
                       needs_manual_grade="; ".join(f"{c} ({p:g} points)" for c, p in s["pending"]))
            if "verified_score" in row:
                row["verified_score"] = _num(row.get("verified_score"), old) + (new - old)
        _write_csv(grades, header, rows)
    return {"assignment": assignment, "synced": synced, "skipped": skipped}
