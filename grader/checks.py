"""What the notebooks' own cells import as ``checks``: the visible tests' helpers and the record cell.

The visible tests (the learner's feedback; they never decide a grade: docs/grading.md) call
:func:`quiet` around learner code, and :func:`as_number`, :func:`assert_close` and
:func:`assert_positive` on its answers; the record cell calls :func:`save_record`
(:func:`grader.answers.save_record`). Importing this module stays cheap and never imports
nbgrader: the notebooks import it on Colab, where nbgrader is not installed.
"""
from __future__ import annotations

import contextlib
import io
import math
import numbers
import os
import sys
import warnings
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def quiet():
    """Run learner code with stderr captured and warnings off: a warning or a progress bar on
    stderr would read as a failing cell. Both levels: ``sys.stderr`` and file descriptor 2
    (C extensions write there; ipykernel forwards it as stderr)."""
    buf = io.StringIO()
    saved_fd = None
    try:
        sys.stderr.flush()
        saved_fd = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 here: Python-level capture only
        saved_fd = None
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield buf
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def as_number(value: Any, name: str) -> float:
    """``value`` as a float, else a clear AssertionError: built-in and numpy numbers or a one-element
    tensor only (an object with its own ``__eq__`` is not a number)."""
    mod = type(value).__module__
    if type(value).__name__ == "Tensor" and mod.startswith("torch") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.detach().cpu().item()
        mod = type(value).__module__
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or mod not in ("builtins", "numpy"):
        raise AssertionError(f"{name} must be a number (a Python float), got {type(value).__name__}: {value!r:.80}")
    if not math.isfinite(v := float(value)):
        raise AssertionError(f"{name} must be a finite number, got {v}")
    return v


def assert_close(value: Any, expected: float, name: str, rel: float = 1e-6, abs_tol: float = 0.0) -> None:
    if not math.isclose(v := as_number(value, name), expected, rel_tol=rel, abs_tol=abs_tol):
        raise AssertionError(f"{name} = {v:.6g}, expected {expected:.6g}")


def assert_positive(value: Any, name: str) -> float:
    if not (v := as_number(value, name)) > 0:
        raise AssertionError(f"{name} must be positive, got {v:.6g}")
    return v


def record_path(assignment: str, smoke: bool) -> Path:
    """Beside the notebook: a GPU run's record, or a smoke record that never overwrites it."""
    from grader import answers

    return answers.record_path(assignment, smoke)


def save_record(assignment: str, ns: dict, path: str | Path | None = None):
    """Write the notebook's measurement record: every graded cell's answers, read by name from
    ``ns`` (the notebook's ``globals()``), beside the notebook (:func:`grader.answers.save_record`)."""
    from grader import answers

    return answers.save_record(assignment, ns, path)
