"""The grader's start-up savings change nothing but time.

- ``grader.course.new_gradebook`` makes, in the grader's process, the gradebook nbgrader's
  ``Gradebook`` makes by starting ``alembic heads``: the same tables, columns and migration stamp.
- ``grader.startup.skip_iri_grammars`` leaves jsonschema without its ``iri`` checkers only: a
  notebook is still validated (a malformed one still refused), and the grader's entry points call it
  before nbformat is imported.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from grader import course as C

ROOT = Path(__file__).resolve().parents[2]


def _schema(db: Path) -> tuple[dict, list]:
    con = sqlite3.connect(db)
    try:
        tables = {name: sorted(tuple(r[1:4]) for r in con.execute(f"PRAGMA table_info('{name}')"))
                  for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        stamp = list(con.execute("SELECT version_num FROM alembic_version"))
    finally:
        con.close()
    return tables, stamp


def test_new_gradebook_is_the_one_nbgrader_makes(tmp_path):
    from nbgrader.api import Gradebook

    ours = tmp_path / "ours"
    theirs = tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    C.new_gradebook(ours)
    C.ensure_scripts_on_path()  # nbgrader's own way runs the alembic script from PATH
    with Gradebook(f"sqlite:///{theirs / 'gradebook.db'}"):
        pass
    got, want = _schema(ours / "gradebook.db"), _schema(theirs / "gradebook.db")
    assert got == want
    assert len(want[1]) == 1 and want[1][0][0]  # a real head, stamped once
    with Gradebook(f"sqlite:///{ours / 'gradebook.db'}") as gb:  # nbgrader opens it as its own
        gb.add_student("s1")
        assert [s.id for s in gb.students] == ["s1"]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_entry_points_skip_the_iri_grammars_and_still_validate(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps({"cells": [{"cell_type": "code"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    for entry in ("grader.__main__", "grader.worker"):
        proc = _fresh(f"import sys, importlib; importlib.import_module({entry!r}); import nbformat, jsonschema\n"
                      "print(sys.modules.get('rfc3987_syntax', 'absent'))\n"
                      f"nb = nbformat.from_dict(__import__('json').loads(open({str(bad)!r}).read()))\n"
                      "try:\n    nbformat.validate(nb)\nexcept nbformat.ValidationError:\n    print('refused')\n"
                      "print(jsonschema.Draft7Validator({'format': 'email'}, "
                      "format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER).is_valid('x'))")
        assert proc.returncode == 0, proc.stderr[-500:]
        assert proc.stdout.split() == ["None", "refused", "False"], (entry, proc.stdout)


def test_a_module_already_imported_is_left_alone():
    proc = _fresh("import sys, types; m = types.ModuleType('rfc3987_syntax'); sys.modules['rfc3987_syntax'] = m\n"
                  "from grader.startup import skip_iri_grammars; skip_iri_grammars()\n"
                  "print(sys.modules['rfc3987_syntax'] is m)")
    assert proc.stdout.strip() == "True", proc.stderr[-300:]


def test_wait_preloaded_without_a_thread_preloads_here(monkeypatch):
    from grader import preprocessors as P

    seen = []
    monkeypatch.setattr(P, "preload", seen.append)
    monkeypatch.setattr(P, "_PRELOADS", {})
    P.wait_preloaded("00_foundations")
    assert seen == ["00_foundations"]


def test_a_preload_that_failed_raises_where_it_is_waited_for(monkeypatch):
    from grader import preprocessors as P

    def broken(assignment):
        raise ImportError(f"{assignment}'s judges could not be imported")

    monkeypatch.setattr(P, "preload", broken)
    monkeypatch.setattr(P, "_PRELOADS", {})
    P.start_preload("00_foundations")
    try:
        P.wait_preloaded("00_foundations")
    except ImportError as exc:
        assert "could not be imported" in str(exc)
    else:
        raise AssertionError("the preload's error was lost")


def test_the_first_cell_runs_after_the_preload_finished(monkeypatch, tmp_path):
    """The judges' imports overlap the kernel's start, never a cell: a slow preload writes a file
    when it finishes, and the notebook's first cell, run by the grader's executor, sees it."""
    import time

    import nbformat

    from grader import preprocessors as P

    done = tmp_path / "preloaded"

    def slow(assignment):  # finishes 1 s after the kernel is up: a cell not held back would run first
        import psutil

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                "ipykernel" in " ".join(c.cmdline()) for c in psutil.Process().children(recursive=True)):
            time.sleep(0.05)
        time.sleep(1.0)
        done.write_text(assignment)

    monkeypatch.setattr(P, "preload", slow)
    monkeypatch.setattr(P, "_PRELOADS", {})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print(open({str(done)!r}).read())")])
    P.start_preload("00_foundations")
    ex = P.GuardedExecute(timeout=120, kernel_name="python3")
    nb, _ = ex.preprocess(nb, {"nbgrader": {"assignment": "00_foundations"}, "metadata": {"path": str(tmp_path)}})
    outs = nb.cells[0].outputs
    assert [o.get("text", "").strip() for o in outs if o.get("output_type") == "stream"] == ["00_foundations"], outs

