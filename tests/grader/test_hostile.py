"""The grader against broken and hostile submitted files: each loses its own points only, with a
one-line reason, and nothing blocks or crashes the batch: unreadable files, links out of the
submissions folder, pipes and devices, nbformat 3, malformed and edited metadata, an error while
one submission is prepared, a killed worker's process tree, edits to the repository itself; and the
screen flags each kernel trick for review before it runs. No kernel runs here: the tricks' effect on
a grade, through the real ``autograde``, is tests/grader/test_attacks.py's.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader import batch
from grader import course as C
from grader.submissions import (
    Submission,
    SubmissionError,
    canonical_metadata,
    find_submissions,
    read_notebook,
)
from tests.nbcells import gid

ROOT = Path(__file__).resolve().parents[2]
A = "hx"  # the tiny assignment
TIMEOUT_S = 20


# -- a tiny assignment ----------------------------------------------------------------------

def _code(source: str, grade_id: str, *, grade=False, solution=False, locked=False, points=0) -> dict:
    md = {"grade_id": grade_id, "grade": grade, "solution": solution, "locked": locked, "schema_version": 3}
    if grade:
        md["points"] = points
    return {"cell_type": "code", "execution_count": None, "id": grade_id, "metadata": {"nbgrader": md},
            "outputs": [], "source": source}


HIDDEN_VALUE = "assert value > 0"


def _source_nb() -> dict:
    cells = [
        _code("import os, sys\nfrom grader import checks", "setup", locked=True),
        _code("### BEGIN SOLUTION\nvalue = 42\n### END SOLUTION", "answer", solution=True),
        _code(HIDDEN_VALUE, "test_value", grade=True, locked=True, points=1),
        _code("### BEGIN SOLUTION\ndef double(x):\n    return 2 * x\n### END SOLUTION", "answer2", solution=True),
        _code("assert double(1) == 2", "test_double", grade=True, locked=True, points=2),
    ]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}}


def _scratch(code: str, cid: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [], "source": code}


def _after(nb: dict, grade_id: str, code: str, cid: str = "mine") -> dict:
    i = next(i for i, c in enumerate(nb["cells"]) if gid(c) == grade_id)
    nb["cells"].insert(i + 1, _scratch(code, cid))
    return nb




@pytest.fixture(scope="module")
def released(tmp_path_factory) -> tuple[Path, dict]:
    """``(source_dir, released notebook)`` of the tiny assignment."""
    source = tmp_path_factory.mktemp("source")
    (source / A).mkdir()
    (source / A / f"{A}.ipynb").write_text(json.dumps(_source_nb()))
    root = C.make_course(tmp_path_factory.mktemp("course"), A, source)
    return source, json.loads(C.released_path(root, A).read_text())


def _answered(released_nb: dict) -> dict:
    nb = copy.deepcopy(released_nb)
    answers = {gid(c): c["source"] for c in _source_nb()["cells"] if c["metadata"]["nbgrader"]["solution"]}
    for c in nb["cells"]:
        if gid(c) in answers:
            c["source"] = answers[gid(c)].replace("### BEGIN SOLUTION\n", "").replace("\n### END SOLUTION", "")
    return nb


# -- kernel tricks: the screen flags them (their grades: tests/grader/test_attacks.py) -----------

CLEAR_ERRORS = """from IPython.display import clear_output
def _hide(result):
    if result.error_in_exec is not None:
        result.error_in_exec = None
        clear_output()
get_ipython().events.register("post_run_cell", _hide)"""

PARTIAL_CREDIT = "get_ipython().events.register('pre_run_cell', lambda info: get_ipython().displayhook(1))"

REBIND_ROOT = """import grader, pathlib, tempfile
_d = pathlib.Path(tempfile.mkdtemp())
(_d / "checks.py").write_text("def assert_close(*a, **k):\\n    pass\\ndef submitted_record():\\n    return None\\n")
try:
    grader.COURSE_ROOT = _d
except AttributeError:
    pass
value = 1"""

OWN_RECORD = """import os, tempfile
from utils.measure.record import Record
_p = tempfile.mktemp(suffix=".json")
Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"}).save(_p)
os.environ["GPULAB_SUBMITTED_RECORD"] = _p
value = 1"""

EDIT_ON_DISK = """import grader
_f = grader.COURSE_ROOT / "checks.py"
_orig = _f.read_text()
_f.write_text("def assert_close(*a, **k):\\n    pass\\ndef submitted_record():\\n    return None\\n")
value = 1"""

WRITE_GRADEBOOK = """import pathlib, sqlite3
_db = next(p / "gradebook.db" for p in pathlib.Path.cwd().parents if (p / "gradebook.db").is_file())
with sqlite3.connect(_db) as _c:  # the course copy's gradebook, while it is being graded
    _c.execute("update grade set extra_credit = 5, manual_score = 9")
    _c.execute("update grade_cells set max_score = 0")"""

# the five-line cheat: every later cell that mentions a check becomes ``pass``; with wrong answers
TRANSFORMER = """def _skip(lines):
    return ["pass\\n"] if any("assert" in ln or "checks." in ln for ln in lines) else lines
get_ipython().input_transformers_cleanup.append(_skip)
def double(x):
    return x + 1
value = 7"""

DAEMON = """import subprocess
_p = subprocess.Popen(["sleep", "300"], start_new_session=True)
print("daemon pid", _p.pid)"""


def test_an_error_while_preparing_costs_that_submission_only(tmp_path, monkeypatch):
    """A record that vanished before grading and an exception nobody foresaw while one submission is
    prepared: each of those scores 0 with one line, and the batch grades the others (the worker is
    stood in for: no kernel)."""
    release = ROOT / "notebooks" / "00_foundations.ipynb"
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("ok", "prepare_crash"):
        (subs / f"{name}.ipynb").write_bytes(release.read_bytes())
    found = find_submissions(subs, "00_foundations")
    gone = Submission("record_gone", subs / "ok.ipynb", subs / "no_such.record.json")
    prepare = batch.prepare

    def crashes_once(sub, *args):
        if sub.student_id == "prepare_crash":
            raise RuntimeError("unforeseen\nsecond line")
        return prepare(sub, *args)

    def worker(work, assignment, sub, *args, **kw):
        return {"student_id": sub.student_id, "score": 1.0, "max_score": 1.0, "status": "ok", "cells": []}

    monkeypatch.setattr(batch, "prepare", crashes_once)
    monkeypatch.setattr(batch, "_run_worker", worker)
    results = {r["student_id"]: r for r in batch.grade_batch("00_foundations", found + [gone], None, jobs=1,
                                                             progress=False)}
    r = results["record_gone"]
    assert r["score"] == 0 and "no_such.record.json cannot be read" in r["status"], r["status"]
    r = results["prepare_crash"]
    assert r["score"] == 0 and r["status"].endswith("could not be prepared for grading (RuntimeError: unforeseen)")
    assert results["ok"]["status"] == "ok"  # the batch went on


# -- no kernel needed -------------------------------------------------------------------------

def test_files_that_are_no_notebooks_get_one_line_and_never_block(tmp_path, monkeypatch, released):
    subs = tmp_path / "subs"
    subs.mkdir()
    good = json.dumps(_answered(released[1]))
    (tmp_path / "elsewhere.ipynb").write_text(good)
    os.symlink(tmp_path / "elsewhere.ipynb", subs / "link_out.ipynb")
    os.symlink("/dev/zero", subs / "zeros.ipynb")  # reading it never ends
    os.mkfifo(subs / "pipe.ipynb")  # opening it blocks until a writer comes
    (subs / "folder.ipynb").mkdir()
    (subs / "José.ipynb").write_text(good)
    (subs / "with space.ipynb").write_text(good)
    found = {s.student_id: s.problem for s in find_submissions(subs, A)}
    assert "outside the submissions folder" in found["link_out"] and "outside" in found["zeros"]
    assert "not a regular file" in found["pipe"] and "is a folder" in found["folder"]
    assert found["José"] == "" and "letters, digits" in found["with space"]
    assert all("\n" not in p for p in found.values())
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_notebook(subs / "pipe.ipynb")
    monkeypatch.setattr("grader.submissions.MAX_FILE_MB", 0)
    with pytest.raises(SubmissionError, match="over the 0 MB limit"):
        read_notebook(subs / "José.ipynb")


def test_nbformat_3_is_read_and_malformed_cells_are_refused(tmp_path, released):
    import nbformat

    v3 = nbformat.convert(nbformat.from_dict(_answered(released[1])), 3)
    (tmp_path / "v3.ipynb").write_text(nbformat.writes(v3, version=3))
    assert {gid(c) for c in read_notebook(tmp_path / "v3.ipynb").cells} >= {"answer", "test_value", "test_double"}
    for name, edit, reason in (("meta", lambda c: c.update(metadata=[]), "metadata is not a JSON object"),
                               ("src", lambda c: c.update(source=[1, 2]), "source is not text")):
        nb = _answered(released[1])
        edit(nb["cells"][1])
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
        with pytest.raises(SubmissionError, match=reason):
            read_notebook(tmp_path / f"{name}.ipynb")


def test_edited_nbgrader_metadata_is_put_back_from_the_release(released):
    import nbformat

    rel = nbformat.from_dict(released[1])
    nb = nbformat.from_dict(_answered(released[1]))
    test = next(c for c in nb.cells if gid(c) == "test_double")
    test.metadata.nbgrader.update(points=100, grade=False, solution=True, locked=False)  # worth more, not a test
    answer = next(c for c in nb.cells if gid(c) == "answer")
    answer.metadata.nbgrader.update(grade=True, points=50)
    nb.cells.append(copy.deepcopy(answer))  # a duplicate: the last copy keeps the id
    assert canonical_metadata(nb, rel) == 1
    assert test.metadata.nbgrader == next(c for c in rel.cells if gid(c) == "test_double").metadata.nbgrader
    assert "nbgrader" not in answer.metadata and gid(nb.cells[-1]) == "answer"
    assert not nb.cells[-1].metadata.nbgrader.get("grade")


def test_edits_to_the_repository_itself_are_reported(tmp_path):
    # a notebook that finds the real repository (beside sys.executable, say) cannot be named,
    # but the batch grades everyone on the code it read at the start and says what changed
    for d in batch.CODE_DIRS:
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.py").write_text("x = 1\n")
    code = batch.read_code(tmp_path)
    assert batch.repo_changes(code, tmp_path) == []
    (tmp_path / "grader" / "a.py").write_text("x = 2\n")
    (tmp_path / "utils" / "new.py").write_text("")
    assert batch.repo_changes(code, tmp_path) == ["grader/a.py", "utils/new.py"]


def test_a_timed_out_worker_takes_its_kernel_and_children_with_it():
    # the kernel runs in a session of its own: killing the worker's process group left it running
    import psutil

    code = ("import subprocess, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
            "print(p.pid, flush=True); time.sleep(300)")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(worker.stdout.readline())
    try:
        batch._kill_tree(worker.pid)
        worker.wait(timeout=30)
        gone = not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert gone, "the worker's child survived"
    finally:
        for pid in (child, worker.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


@pytest.mark.parametrize("code", [CLEAR_ERRORS, PARTIAL_CREDIT, REBIND_ROOT, OWN_RECORD, EDIT_ON_DISK, WRITE_GRADEBOOK,
                                  DAEMON, TRANSFORMER], ids=["clears_errors", "partial_credit", "rebinds_root",
                                                             "own_record", "edits_grader", "writes_gradebook", "daemon",
                                                             "transformer"])
def test_the_screen_holds_each_of_these_before_it_runs(code, released):
    from grader.screen import screen_notebook

    _, rel = released
    assert screen_notebook(_after(copy.deepcopy(rel), "setup", code), rel), code
