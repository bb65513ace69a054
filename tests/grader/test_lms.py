"""grader/lms.py: ``python -m grader export``. Every student of the class and of the roster is listed
with a status (graded, awaiting manual grading, not graded) and why; the Canvas and Moodle files are
read back here by the rules those systems' importers apply (Canvas: ``GradebookImporter`` in
canvas-lms ``app/models/gradebook_importer.rb``: the header's ``Student``, ``ID``, ``SIS User ID``,
``SIS Login ID`` and ``Section`` columns, the ``Points Possible`` row, a student found by ID, SIS
User ID or SIS Login ID; Moodle: ``grade/import/csv/classes/load_data.php``: one identifier column
mapped to a user field on every row, a grade cell empty or a number), one row per student and one
column per assignment, in UTF-8. The graded classes are written as ``autograde`` writes them
(results.json, autograded notebooks), with no gradebook: the manual grades from a real formgrader
reach the export in tests/integration/test_formgrader_browser.py."""
from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader import lms

ROOT = Path(__file__).resolve().parents[2]
NOTE = "screen: cell 3 calls get_ipython"


def _cell(name, points, score, manual=False, pending=False):
    return {"cell": name, "points": points, "score": score, "mode": "manual" if manual else "computed",
            "needs_manual_grade": pending}


def _class(out: Path, assignment: str, students: dict[str, dict]) -> Path:
    """A graded class: ``students[sid]`` has ``score``, ``status``, ``graded`` (a graded notebook),
    ``pending`` (answered write-ups), ``needs_review``, ``max``."""
    results = []
    for sid, s in students.items():
        mx = s.get("max", 24.0)
        cells = [_cell("test_a", mx - 4, s.get("score", 0.0)),
                 _cell("limiter_writeup", 2.0, 0.0, manual=True, pending=s.get("pending", False)),
                 _cell("sweep_writeup", 2.0, 0.0, manual=True, pending=s.get("pending", False))]
        r = {"student_id": sid, "assignment": assignment, "score": s.get("score", 0.0), "max_score": mx,
             "status": s.get("status", "ok"), "cells": cells, "notes": s.get("notes", [])}
        if s.get("needs_review"):
            r["needs_review"] = True
        results.append(r)
        if s.get("graded", True):
            (out / "autograded" / sid).mkdir(parents=True)
            (out / "autograded" / sid / f"{assignment}.ipynb").write_text("{}")
    (out / "results.json").write_text(json.dumps(results))
    return out


@pytest.fixture()
def classes(tmp_path):
    lab0 = _class(tmp_path / "lab0", "00_foundations", {
        "ana": {"score": 20.0, "pending": True},
        "bo": {"score": 7.0},
        "cy": {"status": "cy.ipynb is a .ipynb file, not a Jupyter notebook", "graded": False},
        "dee": {"status": "held for review, not graded: get_ipython", "graded": False, "needs_review": True},
        "eve": {"score": 15.0, "needs_review": True, "notes": [NOTE], "status": "graded; " + NOTE},
        "zed": {"score": 3.0},  # graded, not on the roster
        "gus": {"score": 5.0, "status": "the kernel died while running the notebook"},  # graded in part; off roster
    })
    lab1 = _class(tmp_path / "lab1", "01_single_gpu", {"ana": {"score": 11.5, "max": 15.0}})
    return lab0, lab1, tmp_path / "no-course"  # a course root with no gradebook: the batch's scores alone


ROSTER = ("\ufeffStudent ID,First Name,Last Name,E-mail,SIS_ID,Login ID,Canvas ID,Section,Notes\n"
          "ana,Ana,\"Ångström, Jr.\",ana@example.edu,S001,ana01,101,Lab 1,x\n"
          "bo,Bo,Bø,bo@example.edu,S002,bo02,,Lab 1,\n"
          "\n"
          "cy,Cy,Young,cy@example.edu,S003,,,Lab 2,\n"
          "dee,Dee,Dunn,dee@example.edu,S004,,,Lab 2,\n"
          "eve,Eve,Eck,eve@example.edu,S005,,,Lab 2,\n"
          "fay,Fay,Fox,fay@example.edu,S006,,,Lab 2,\n")  # fay: on the roster, no submission


@pytest.fixture()
def roster(tmp_path):
    p = tmp_path / "roster.csv"
    p.write_bytes(ROSTER.encode("utf-8"))  # with the byte-order mark Excel's "CSV UTF-8" writes
    return p


# -- the roster --------------------------------------------------------------------------------------

def test_roster_reads_excel_utf8_with_loose_header_names(roster):
    rows = lms.read_roster(roster)
    assert [r["student_id"] for r in rows] == ["ana", "bo", "cy", "dee", "eve", "fay"]  # the blank line skipped
    assert rows[0] == {"student_id": "ana", "first_name": "Ana", "last_name": "Ångström, Jr.", "name": "",
                       "email": "ana@example.edu", "sis_id": "S001", "login_id": "ana01", "canvas_id": "101",
                       "section": "Lab 1", "username": ""}


@pytest.mark.parametrize("text, message", [
    ("name,email\nAna,a@x\n", "no student_id column"),
    ("student_id,name\nana,Ana\nana,Ana again\n", "student_id 'ana' on lines 2 and 3"),
    ("student_id,name\n,Nobody\n", "line 2: no student_id"),
    ("", "is empty"),
])
def test_roster_errors_are_one_line(tmp_path, text, message):
    p = tmp_path / "r.csv"
    p.write_text(text)
    with pytest.raises(lms.ExportError, match=re.escape(message)):
        lms.read_roster(p)


def test_roster_not_utf8_or_missing(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes("student_id,name\nbo,Bø\n".encode("latin-1"))
    with pytest.raises(lms.ExportError, match="not UTF-8"):
        lms.read_roster(p)
    with pytest.raises(lms.ExportError, match="no such file"):
        lms.read_roster(tmp_path / "nowhere.csv")


# -- our export: every student, with a status and why -----------------------------------------------------

def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_export_lists_every_student_with_status_and_why(classes, roster, tmp_path):
    lab0, lab1, course = classes
    s = lms.export([lab0, lab1], tmp_path / "all.csv", roster=roster, course=course)
    assert s["students"] == 8 and s["off_roster"] == ["zed", "gus"]
    rows = _read(tmp_path / "all.csv")
    assert list(rows[0]) == lms.LONG_COLUMNS
    by = {(r["assignment"], r["student_id"]): r for r in rows}
    assert len(rows) == 16 and len(by) == 16  # 8 students (roster order, then the others) x 2 assignments
    assert [r["student_id"] for r in rows[:8]] == ["ana", "bo", "cy", "dee", "eve", "fay", "zed", "gus"]
    lab = "00_foundations"
    assert by[lab, "ana"]["status"] == "awaiting manual grading" and by[lab, "ana"]["score"] == "20"
    assert by[lab, "ana"]["needs_manual_grade"] == "limiter_writeup (2 points); sweep_writeup (2 points)"
    assert "written answers to grade" in by[lab, "ana"]["why"] and "no gradebook in" in by[lab, "ana"]["why"]
    assert (by[lab, "bo"]["status"], by[lab, "bo"]["score"], by[lab, "bo"]["why"]) == ("graded", "7", "")
    assert by[lab, "cy"]["status"] == "not graded" and "not a Jupyter notebook" in by[lab, "cy"]["why"]
    assert by[lab, "dee"]["status"] == "not graded" and by[lab, "dee"]["why"].startswith("held for review")
    assert by[lab, "eve"]["status"] == "awaiting manual grading" and NOTE in by[lab, "eve"]["why"]
    assert (by[lab, "fay"]["status"], by[lab, "fay"]["score"], by[lab, "fay"]["why"]) == ("not graded", "", "no submission")
    assert (by[lab, "gus"]["status"], by[lab, "gus"]["score"]) == ("not graded", "5")  # as the batch counts it
    assert by[lab, "gus"]["why"].startswith("the kernel died")
    assert by[lab, "ana"]["last_name"] == "Ångström, Jr." and by[lab, "ana"]["sis_id"] == "S001"
    assert (by["01_single_gpu", "ana"]["status"], by["01_single_gpu", "ana"]["score"],
            by["01_single_gpu", "ana"]["max_score"]) == ("graded", "11.5", "15")
    assert by["01_single_gpu", "bo"]["why"] == "no submission"


def test_export_without_roster_lists_the_class(classes, tmp_path):
    lab0, _, course = classes
    lms.export([lab0], tmp_path / "all.csv", course=course)
    assert [r["student_id"] for r in _read(tmp_path / "all.csv")] == ["ana", "bo", "cy", "dee", "eve", "zed", "gus"]


# -- Canvas ---------------------------------------------------------------------------------------------

def _canvas_import(path: Path) -> dict:
    """The file as Canvas's GradebookImporter reads it (canvas-lms app/models/gradebook_importer.rb):
    ``header?`` (row[0] =~ /Student/, row[1] =~ /ID/, SIS User ID then SIS Login ID at 2 and 3, the
    last student column =~ /Section/), ``check_for_non_student_row`` (a /Points Possible/ row gives
    the points), ``process_student`` (found by ID, else SIS User ID, else SIS Login ID)."""
    raw = path.read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf")
    rows = list(csv.reader(raw.decode("utf-8").splitlines()))
    header = rows[0]
    assert len(header) > 3 and re.search("Student", header[0]) and re.search("ID", header[1])
    assert re.search(r"SIS\s+User\s+ID", header[2]) and re.search(r"SIS\s+Login\s+ID", header[3])
    student_columns = 5
    assert re.search("Section", header[student_columns - 1])
    assignments = header[student_columns:]
    points, students = None, []
    for row in rows[1:]:
        assert len(row) == len(header)
        if re.search("Points Possible", row[0]):
            points = dict(zip(assignments, (float(x) for x in row[student_columns:]), strict=True))
            continue
        key = ("ID", row[1]) if row[1].strip() else ("SIS User ID", row[2]) if row[2].strip() else \
            ("SIS Login ID", row[3]) if row[3].strip() else None
        assert key is not None, f"Canvas would look {row[0]!r} up by name"
        grades = dict(zip(assignments, row[student_columns:], strict=True))
        assert all(g == "" or float(g) >= 0 for g in grades.values())
        students.append({"name": row[0], "key": key, "section": row[4], "grades": grades})
    return {"assignments": assignments, "points": points, "students": students}


def test_canvas_file_is_what_its_importer_reads(classes, roster, tmp_path):
    lab0, lab1, course = classes
    s = lms.export([lab0, lab1], tmp_path / "canvas.csv", fmt="canvas", roster=roster, course=course)
    got = _canvas_import(tmp_path / "canvas.csv")
    assert got["assignments"] == ["00_foundations", "01_single_gpu"]
    assert got["points"] == {"00_foundations": 24.0, "01_single_gpu": 15.0}
    assert [st["key"] for st in got["students"]] == [("ID", "101"), ("SIS User ID", "S002"), ("SIS User ID", "S003"),
                                                      ("SIS User ID", "S004"), ("SIS User ID", "S005"),
                                                      ("SIS User ID", "S006")]  # one row per roster student
    assert got["students"][0]["name"] == "Ångström, Jr., Ana" and got["students"][0]["section"] == "Lab 1"
    grades = {st["key"][1]: st["grades"] for st in got["students"]}
    assert grades["101"] == {"00_foundations": "", "01_single_gpu": "11.5"}  # ana's write-ups wait: no grade yet
    assert grades["S002"] == {"00_foundations": "7", "01_single_gpu": ""}  # bo graded; lab 01 not submitted
    assert grades["S003"]["00_foundations"] == "0"  # unreadable: the batch's 0
    assert grades["S004"]["00_foundations"] == "" and grades["S005"]["00_foundations"] == ""  # held, flagged
    blank = {(sid, a) for sid, a, _ in s["blank"]}
    assert ("ana", "00_foundations") in blank and ("fay", "01_single_gpu") in blank and ("cy", "00_foundations") not in blank
    assert s["off_roster"] == ["zed", "gus"]


def test_canvas_needs_an_id_canvas_can_find_on_every_row(classes, tmp_path):
    lab0, _, course = classes
    r = tmp_path / "r.csv"
    r.write_text("student_id,name,email\nana,Ana,ana@example.edu\n")
    with pytest.raises(lms.ExportError, match="ID, SIS User ID or SIS Login ID.*ana"):
        lms.export([lab0], tmp_path / "c.csv", fmt="canvas", roster=r, course=course)
    with pytest.raises(lms.ExportError, match="needs --roster"):
        lms.export([lab0], tmp_path / "c.csv", fmt="canvas", course=course)


# -- Moodle ---------------------------------------------------------------------------------------------

def _moodle_import(path: Path, map_from: str) -> dict:
    """The file as Moodle's CSV grade import reads it (grade/import/csv/classes/load_data.php): a
    row's user from the ``map_from`` column (an empty one aborts the import), a grade cell ``-`` for
    no grade (an empty one is no grade only for an existing grade item: ``import_new_grade_item``
    keeps it), else a number (anything else aborts it)."""
    text = path.read_bytes().decode("utf-8")
    rows = list(csv.reader(text.splitlines()))
    header = rows[0]
    assert header[:5] == ["First name", "Last name", "ID number", "Email address", "Username"]
    col = header.index(map_from)
    out = {}
    for row in rows[1:]:
        assert len(row) == len(header) and row[col].strip(), row
        for value in row[5:]:
            assert value.strip() == "-" or float(value) >= 0
        out[row[col]] = dict(zip(header[5:], row[5:], strict=True))
    return out


def test_moodle_file_is_what_its_importer_reads(classes, roster, tmp_path):
    lab0, lab1, course = classes
    s = lms.export([lab0, lab1], tmp_path / "moodle.csv", fmt="moodle", roster=roster, course=course)
    assert s["identifier"] == ("Email address", "useremail")
    got = _moodle_import(tmp_path / "moodle.csv", "Email address")
    assert list(got) == [f"{x}@example.edu" for x in ("ana", "bo", "cy", "dee", "eve", "fay")]
    assert got["ana@example.edu"] == {"00_foundations": "-", "01_single_gpu": "11.5"}  # no grade yet
    assert got["fay@example.edu"] == {"00_foundations": "-", "01_single_gpu": "-"}  # no submission
    assert got["bo@example.edu"]["00_foundations"] == "7" and got["cy@example.edu"]["00_foundations"] == "0"
    assert "Ångström, Jr." in (tmp_path / "moodle.csv").read_text(encoding="utf-8")


def test_moodle_falls_back_to_an_identifier_every_row_has_or_refuses(classes, tmp_path):
    lab0, _, course = classes
    r = tmp_path / "r.csv"
    r.write_text("student_id,name,email,sis_id\nana,Ana,,S1\nbo,Bo,bo@example.edu,S2\n")
    s = lms.export([lab0], tmp_path / "m.csv", fmt="moodle", roster=r, course=course)
    assert s["identifier"] == ("ID number", "useridnumber")
    assert list(_moodle_import(tmp_path / "m.csv", "ID number")) == ["S1", "S2"]
    r.write_text("student_id,name,email,sis_id\nana,Ana,,S1\nbo,Bo,bo@example.edu,\n")
    with pytest.raises(lms.ExportError, match="no roster column has one for every student"):
        lms.export([lab0], tmp_path / "m.csv", fmt="moodle", roster=r, course=course)


# -- the command ----------------------------------------------------------------------------------------

def test_export_command(classes, roster, tmp_path):
    lab0, lab1, course = classes

    def run(*args):
        return subprocess.run([sys.executable, "-m", "grader", "export", *map(str, args), "--course", str(course)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    proc = run(lab0, lab1, "--format", "moodle", "--roster", roster, "--out", tmp_path / "m.csv")
    assert proc.returncode == 0, proc.stderr
    assert 'map from "Email address"' in proc.stdout and "no grade: ana 00_foundations: awaiting manual" in proc.stdout
    assert "not on the roster, left out: zed, gus" in proc.stderr
    for args, message in (((lab0, lab0, "--out", tmp_path / "x.csv"), "are both graded classes of 00_foundations"),
                          ((lab0, "--format", "canvas", "--out", tmp_path / "x.csv"), "needs --roster"),
                          ((tmp_path / "nowhere", "--out", tmp_path / "x.csv"), "no results.json")):
        proc = run(*args)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
