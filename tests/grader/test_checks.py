"""What the notebooks' visible tests import (``grader.checks``) and the grader's input handling
(submitted files, the command line): fast, no kernels."""
from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from grader import checks
from grader.submissions import SubmissionError, find_submissions, read_notebook, restore_deleted_cells

ROOT = Path(__file__).resolve().parents[2]


# -- the visible tests' helpers ---------------------------------------------------------------

def test_as_number_refuses_objects_that_compare_equal_to_anything():
    class Liar(float):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

    import numpy as np

    assert checks.as_number(np.float64(2.5), "x") == 2.5
    with pytest.raises(AssertionError, match="must be a number"):
        checks.as_number(Anything(), "x")
    with pytest.raises(AssertionError, match="must be a number"):
        checks.as_number(Liar(1.0), "x")
    with pytest.raises(AssertionError, match="finite"):
        checks.as_number(math.inf, "x")
    checks.assert_close(2.0, 2.0, "x")
    with pytest.raises(AssertionError, match=r"x = 3, expected 2"):
        checks.assert_close(3.0, 2.0, "x")
    with pytest.raises(AssertionError, match="must be positive"):
        checks.assert_positive(0.0, "x")


def test_quiet_keeps_stderr_and_warnings_out(capsys):
    with checks.quiet() as buf:
        print("to stderr", file=sys.stderr)
        warnings.warn("a warning", stacklevel=1)
        print("for the learner")
    out = capsys.readouterr()
    assert out.err == "" and "to stderr" in buf.getvalue()
    assert out.out == "for the learner\n"


def test_checks_keeps_only_what_the_notebooks_call():
    """The notebooks' cells call these on ``checks`` and nothing else: the grade is the judges', so
    nothing that measures or decides is left here for a notebook to patch."""
    import json
    import re

    called = {m for p in (ROOT / "grader" / "source").glob("*/*.ipynb") for c in json.loads(p.read_text())["cells"]
              for m in re.findall(r"\bchecks\.(\w+)", "".join(c["source"])) if m != "py"}
    public = {n for n in vars(checks) if not n.startswith("_") and callable(getattr(checks, n))
              and getattr(getattr(checks, n), "__module__", "") == checks.__name__}
    assert called and called <= public, called - public
    assert public - called <= {"record_path"}, public - called  # record_path: the release before this design calls it


# -- submitted files and the command line -------------------------------------------------------

def _nb(ids):
    return {"cells": [{"cell_type": "code", "source": "", "metadata": {"nbgrader": {"grade_id": i}}, "outputs": [],
                       "execution_count": None} for i in ids], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_restore_deleted_cells_keeps_released_order(tmp_path):
    import nbformat

    released = nbformat.from_dict(_nb(["a", "b", "c", "d"]))
    sub = nbformat.from_dict(_nb(["a", "c"]))
    sub.cells.insert(1, nbformat.v4.new_code_cell("scratch"))
    assert restore_deleted_cells(sub, released) == ["b", "d"]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "scratch") for c in sub.cells]
    assert ids == ["a", "b", "scratch", "c", "d"] or ids == ["a", "scratch", "b", "c", "d"]
    with pytest.raises(SubmissionError, match="no nbgrader cells"):
        restore_deleted_cells(nbformat.from_dict({**_nb([]), "cells": [{"cell_type": "markdown", "source": "", "metadata": {}}]}), released)


@pytest.mark.parametrize("text, reason", [("", "empty"), ("{oops", "is not a whole notebook"), ('{"a": 1}', "not a Jupyter notebook")])
def test_unreadable_notebooks_get_one_line(tmp_path, text, reason):
    p = tmp_path / "x.ipynb"
    p.write_text(text)
    with pytest.raises(SubmissionError, match=reason) as exc:
        read_notebook(p)
    assert "\n" not in str(exc.value)


def test_find_submissions_in_both_layouts(tmp_path):
    (tmp_path / "alice.ipynb").write_text("{}")
    (tmp_path / "alice.record.json").write_text("{}")
    (tmp_path / "bad name.ipynb").write_text("{}")
    nbg = tmp_path / "submitted" / "bob" / "00_foundations"
    nbg.mkdir(parents=True)
    (nbg / "00_foundations.ipynb").write_text("{}")
    (tmp_path / "submitted" / "carol" / "00_foundations").mkdir(parents=True)
    subs = {s.student_id: s for s in find_submissions(tmp_path, "00_foundations")}
    assert set(subs) == {"alice", "bad name", "bob", "carol"}
    assert subs["alice"].record is not None and subs["bob"].record is None and not subs["bob"].problem
    assert "letters, digits" in subs["bad name"].problem
    assert "expected 00_foundations.ipynb" in subs["carol"].problem


def test_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "autograde", "--assignment", "99_nope", "--submissions",
                           str(tmp_path), "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no assignment '99_nope'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(tmp_path / "missing.ipynb")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "missing.ipynb cannot be read" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
