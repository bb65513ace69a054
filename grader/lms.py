"""A graded class out of the course: ``python -m grader export OUT... [--format csv|canvas|moodle]
[--roster ROSTER.csv] [--course DIR] --out FILE``.

Each ``OUT`` is the ``--out`` folder of ``python -m grader autograde`` or ``merge`` (one assignment
each). Scores are the batch's automatic ones plus what the instructor gave in the formgrader: the
course root's gradebook (``--course``, default ``grader/``) is read for every student whose grading
it holds (grader/formgrade.py, :func:`~grader.formgrade.gradebook_state`). Every student gets a
status:

- ``graded``: final (``why`` is empty, or the batch's note);
- ``awaiting manual grading``: written answers without a grade yet (named, with their points), or
  a submission flagged for an instructor's review;
- ``not graded``: no graded notebook, with the batch's one-line reason (unreadable, past its time,
  its course copy changed), or "no submission" for a student of the roster that the class does not hold.

Formats:

- ``csv`` (default): one row per student and assignment, every student of the class and of the
  roster: ``assignment, student_id, last_name, first_name, email, sis_id, score, max_score, status,
  why, needs_manual_grade``. ``nbgrader export`` leaves out a submission its gradebook does not hold
  (one that could not be read) and has no status, so a student whose write-ups wait shows a total
  as if final; this file says both.
- ``canvas``: Canvas's Gradebook import file (Grades, Actions, Import). Its importer reads a header
  row whose first columns are ``Student``, ``ID``, then ``SIS User ID`` and ``SIS Login ID``, and
  ``Section`` last; every later column is an assignment, matched by title (a title Canvas does not
  know becomes a new assignment); a row whose first cell is ``Points Possible`` gives each
  assignment's points; a student is found by ``ID`` (Canvas's numeric user id), else ``SIS User ID``,
  else ``SIS Login ID``, else the name. Sources: Canvas's importer, ``GradebookImporter`` in
  instructure/canvas-lms ``app/models/gradebook_importer.rb`` (``header?``, ``update_column_count``,
  ``check_for_non_student_row``, ``process_student``); a university's Canvas guide to the same import
  ("Student Name (last name, first name) OR Student ID OR Student SIS User ID ... SIS Login ID ...
  Section ... Assignment Name",
  https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades).
  UTF-8, as Canvas's CSV imports read it ("All text should be UTF-8 encoded",
  https://canvas.beta.instructure.com/doc/api/file.sis_csv.html).
- ``moodle``: Moodle's gradebook "Import > CSV file": a header row, one row per student, a column
  per grade item; on the preview page the instructor maps one identifier column ("Map from") to a
  user field ("Map to": ``userid``, ``username``, ``useridnumber`` or ``useremail``) and each grade
  column to a grade item or a new one. Moodle aborts the whole import on a row whose user it cannot
  find, reads ``-`` as no grade (an empty cell too, for an existing grade item; for a new grade item
  only ``-`` is left out, ``import_new_grade_item``) and any other non-number as an error, so every
  row here carries the identifier chosen, and the grade cells hold numbers or ``-``. Columns:
  ``First name, Last name, ID number, Email address, Username``, then the assignments. UTF-8 (the
  import form's default encoding), comma-separated. Sources: MoodleDocs, "Grade import"
  (https://docs.moodle.org/311/en/Grade_import; the mapping tip: "Change both dropdowns to: 'Email
  Address' to 'useremail', or to 'Id Number' to 'useridnumber'"), and Moodle's importer,
  ``grade/import/csv/classes/load_data.php`` (``map_user_data_with_value``, ``update_grade_item``,
  ``import_new_grade_item``).

In both LMS files a cell holds a number only where the grade is final: ``graded``, or ``not
graded`` with the 0 the batch gave (an unreadable notebook). It holds no grade for a student
awaiting manual grading or an instructor's review, or with no submission: ``-`` for Moodle (no grade); empty
for Canvas, which keeps an empty cell empty, and would clear a grade typed into Canvas by hand for
that student and assignment (its importer counts an empty cell against a grade there as a change).
:func:`export` returns those cells, and the command prints them, with why.

The roster (``--roster``) is the instructor's CSV, UTF-8 (a byte-order mark, as Excel writes, is
fine), one row per student, with a header naming its columns (case and spaces, underscores or
hyphens between words do not matter): ``student_id`` (required: the id the grader knows, the
submission's file or folder name), ``first_name`` and ``last_name`` or ``name``, ``email``,
``sis_id`` (Canvas's SIS User ID, Moodle's ID number), and for Canvas ``login_id`` (SIS Login
ID), ``canvas_id`` (Canvas's numeric user ID) and ``section``, for Moodle ``username``
(``e-mail``, ``email address``, ``SIS User ID`` and ``SIS Login ID`` are read as their names here).
Other columns are ignored.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from grader import COURSE_ROOT
from grader.course import CourseError

FORMATS = ("csv", "canvas", "moodle")
ROSTER_COLUMNS = ("student_id", "first_name", "last_name", "name", "email", "sis_id", "login_id", "canvas_id",
                  "section", "username")
GRADED, AWAITING, NOT_GRADED = "graded", "awaiting manual grading", "not graded"
LONG_COLUMNS = ["assignment", "student_id", "last_name", "first_name", "email", "sis_id", "score", "max_score",
                "status", "why", "needs_manual_grade"]
CANVAS_ID_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_POINTS_ROW = "Points Possible"
MOODLE_ID_COLUMNS = ["First name", "Last name", "ID number", "Email address", "Username"]
# Moodle's identifier columns, in the order one is chosen, with the user field each maps to
MOODLE_IDENTIFIERS = (("Email address", "email", "useremail"), ("ID number", "sis_id", "useridnumber"),
                      ("Username", "username", "username"))


class ExportError(CourseError):
    """A roster or a set of graded classes that cannot be exported; one line."""


ROSTER_ALIASES = {"e_mail": "email", "email_address": "email", "sis_user_id": "sis_id", "sis_login_id": "login_id"}


def _key(header: str) -> str:
    key = re.sub(r"[\s_\-]+", "_", header.strip().lower())
    return ROSTER_ALIASES.get(key, key)


def read_roster(path: Path) -> list[dict]:
    """The roster's rows, each with every key of ``ROSTER_COLUMNS`` (empty where the file has none)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ExportError(f"roster {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ExportError(f"roster {path} is not UTF-8 (byte {exc.start}): save it as \"CSV UTF-8\"") from None
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise ExportError(f"roster {path} is empty: it needs a header row with student_id")
    keys = {_key(h): h for h in reader.fieldnames if h is not None}
    if "student_id" not in keys:
        raise ExportError(f"roster {path} has no student_id column (its columns: {', '.join(reader.fieldnames)}; "
                          f"known: {', '.join(ROSTER_COLUMNS)})")
    rows, seen = [], {}
    for line, raw in enumerate(reader, start=2):
        row = {k: (raw.get(keys[k]) or "").strip() if k in keys else "" for k in ROSTER_COLUMNS}
        if not any(row.values()):
            continue  # a blank line
        sid = row["student_id"]
        if not sid:
            raise ExportError(f"roster {path}, line {line}: no student_id")
        if sid in seen:
            raise ExportError(f"roster {path}: student_id {sid!r} on lines {seen[sid]} and {line}")
        seen[sid] = line
        rows.append(row)
    return rows


def _names(person: dict) -> tuple[str, str]:
    """``(first, last)`` from the roster's columns."""
    if person.get("first_name") or person.get("last_name"):
        return person.get("first_name", ""), person.get("last_name", "")
    return person.get("name", ""), ""


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    x = round(float(x), 4)
    return str(int(x)) if x == int(x) else f"{x:.4f}".rstrip("0")


def class_status(out: Path, course: Path = COURSE_ROOT) -> tuple[str, float, list[dict]]:
    """``(assignment, max_score, rows)``: one row per student of the graded class in ``out``:
    ``{"student_id", "score", "max_score", "status", "why", "pending", "final"}``, ``final`` saying
    whether an LMS may take ``score`` as the grade."""
    from grader.formgrade import gradebook_state

    assignment, results, state = gradebook_state(out, course)
    rows, max_score = [], 0.0
    for r in results:
        sid = str(r["student_id"])
        max_score = max(max_score, float(r.get("max_score") or 0.0))
        status_line = str(r.get("status", ""))
        s = state.get(sid)  # None: no graded notebook
        if s is not None and s["in_gradebook"]:
            score, pending = max(s["score"] - s["late_submission_penalty"], 0.0), s["pending"]
        else:
            score = float(r.get("score") or 0.0)
            pending = [(c["cell"], float(c.get("points", 0.0))) for c in r.get("cells", [])
                       if s is not None and c.get("mode") == "manual" and c.get("needs_manual_grade")]
        why = []
        if pending:
            why.append("written answers to grade: " + "; ".join(f"{c} ({p:g} points)" for c, p in pending)
                       + ("" if s["in_gradebook"] else f" ({s['why']})"))
        if r.get("needs_review") and s is not None:
            notes = [n for n in r.get("notes", []) if str(n).startswith("screen:")]
            why.append("flagged for an instructor's review" + (f": {notes[0]}" if notes else ""))
        row = {"student_id": sid, "max_score": float(r.get("max_score") or 0.0), "score": score, "pending": pending}
        if not status_line.startswith(("ok", "graded")):  # as the batch counts it: unreadable, held, timed out, ...
            row.update(status=NOT_GRADED, why="; ".join([status_line or "not graded", *why]),
                       final=not r.get("needs_review") and not pending)
        elif why:
            row.update(status=AWAITING, why="; ".join(why), final=False)
        else:
            row.update(status=GRADED, why="" if status_line == "ok" else status_line, final=True)
        rows.append(row)
    return assignment, max_score, rows


def _classes(outs: list[Path], course: Path) -> list[tuple[str, float, dict[str, dict]]]:
    got, seen = [], {}
    for out in outs:
        assignment, max_score, rows = class_status(Path(out), course)
        if assignment in seen:
            raise ExportError(f"{out} and {seen[assignment]} are both graded classes of {assignment}: give one")
        seen[assignment] = out
        got.append((assignment, max_score, {r["student_id"]: r for r in rows}))
    return got


def _missing(sid: str, max_score: float) -> dict:
    return {"student_id": sid, "score": None, "max_score": max_score, "status": NOT_GRADED, "why": "no submission",
            "pending": [], "final": False}


def export(outs: list[Path], dest: Path, fmt: str = "csv", roster: Path | None = None,
           course: Path = COURSE_ROOT) -> dict:
    """Write ``dest`` in ``fmt`` from the graded classes ``outs``. Returns ``{"format", "assignments",
    "students", "blank": [(student, assignment, why)], "off_roster": [students], "identifier"}``:
    ``blank`` the LMS cells left empty, ``off_roster`` graded students the roster lacks (left out of
    an LMS file), ``identifier`` the Moodle column to map."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    if not outs:
        raise ExportError("export needs the --out folder of at least one graded class")
    people = read_roster(roster) if roster is not None else None
    if fmt != "csv" and people is None:
        raise ExportError(f"--format {fmt} needs --roster: the LMS finds each student by the ids the roster gives")
    classes = _classes(list(outs), Path(course))
    by_id = {p["student_id"]: p for p in people} if people is not None else {}
    graded_ids = list(dict.fromkeys(sid for _, _, rows in classes for sid in rows))
    summary = {"format": fmt, "assignments": [a for a, _, _ in classes], "blank": [], "identifier": None,
               "off_roster": [sid for sid in graded_ids if people is not None and sid not in by_id]}
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        order = [p["student_id"] for p in people] if people is not None else []
        order += [sid for sid in graded_ids if sid not in set(order)]
        records = []
        for assignment, max_score, rows in classes:
            for sid in order:
                r = rows.get(sid) or _missing(sid, max_score)
                first, last = _names(by_id.get(sid, {}))
                records.append({"assignment": assignment, "student_id": sid, "last_name": last, "first_name": first,
                                "email": by_id.get(sid, {}).get("email", ""),
                                "sis_id": by_id.get(sid, {}).get("sis_id", ""),
                                "score": _fmt(r["score"]), "max_score": _fmt(r["max_score"]), "status": r["status"],
                                "why": r["why"],
                                "needs_manual_grade": "; ".join(f"{c} ({p:g} points)" for c, p in r["pending"])})
        with open(dest, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=LONG_COLUMNS)
            w.writeheader()
            w.writerows(records)
        summary["students"] = len(order)
        return summary

    def cell(sid: str, assignment: str, max_score: float, rows: dict) -> str:
        r = rows.get(sid) or _missing(sid, max_score)
        if r["final"]:
            return _fmt(r["score"])
        summary["blank"].append((sid, assignment, f"{r['status']}: {r['why']}"))
        return "-" if fmt == "moodle" else ""  # Moodle: "-" is no grade for a new grade item too

    if fmt == "canvas":
        lacking = [p["student_id"] for p in people if not (p["canvas_id"] or p["sis_id"] or p["login_id"])]
        if lacking:
            raise ExportError(f"Canvas finds a student by ID, SIS User ID or SIS Login ID, and the roster gives none of "
                              f"them (canvas_id, sis_id, login_id) for {', '.join(lacking[:5])}"
                              + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""))
        table = [CANVAS_ID_COLUMNS + [a for a, _, _ in classes],
                 [CANVAS_POINTS_ROW, "", "", "", ""] + [_fmt(m) for _, m, _ in classes]]
        for p in people:
            first, last = _names(p)
            student = f"{last}, {first}" if last and first else (last or first)
            table.append([student, p["canvas_id"], p["sis_id"], p["login_id"], p["section"]]
                         + [cell(p["student_id"], a, m, rows) for a, m, rows in classes])
    else:  # moodle
        ident = next((col for col, key, _ in MOODLE_IDENTIFIERS if all(p[key] for p in people)), None)
        if ident is None:
            gaps = "; ".join(f"{key}: {', '.join(p['student_id'] for p in people if not p[key])[:120]}"
                             for _, key, _ in MOODLE_IDENTIFIERS)
            raise ExportError("Moodle's import needs one identifier on every row (it aborts the whole import on a row "
                              f"it cannot match), and no roster column has one for every student (missing {gaps})")
        summary["identifier"] = (ident, dict((c, f) for c, _, f in MOODLE_IDENTIFIERS)[ident])
        table = [MOODLE_ID_COLUMNS + [a for a, _, _ in classes]]
        for p in people:
            first, last = _names(p)
            table.append([first, last, p["sis_id"], p["email"], p["username"]]
                         + [cell(p["student_id"], a, m, rows) for a, m, rows in classes])
    with open(dest, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(table)
    summary["students"] = len(people)
    return summary
