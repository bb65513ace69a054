"""Finding submitted notebooks, reading them, and putting deleted cells back.

A submission folder holds ``<student>.ipynb`` files (beside each, optionally, its
measurement record ``<student>.record.json``), or nbgrader's layout
``[submitted/]<student>/<assignment>/<assignment>.ipynb`` with the record the notebook
wrote beside it (``<assignment>.record.json``). A notebook that cannot be read gets a
one-line reason and a zero; the batch goes on.

Deleted cells: nbgrader restores an edited locked cell from the gradebook, but a deleted one
is simply gone (only deleted *test* cells come back, with ``add_missing_cells``). Before
grading, every cell of the released notebook that is missing from the submission (matched by
nbgrader ``grade_id``) is put back in its place: locked cells as released (autograde then
restores hidden tests), answer cells as the released stub, which earns nothing.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")


class SubmissionError(Exception):
    """A submission that cannot be graded; the message is the one-line status."""


@dataclass
class Submission:
    student_id: str
    notebook: Path | None
    record: Path | None = None
    problem: str = ""  # set when the submission cannot be graded at all
    notes: list[str] = field(default_factory=list)


def record_name(assignment: str) -> str:
    """The file the notebook writes its measurement record to (beside itself)."""
    return f"{assignment}.record.json"


def find_submissions(folder: Path, assignment: str) -> list[Submission]:
    """Every submission of ``assignment`` under ``folder``, sorted by student id."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SubmissionError(f"submissions folder {folder} does not exist")
    found: dict[str, Submission] = {}
    for nb in sorted(folder.glob("*.ipynb")):
        rec = nb.with_name(f"{nb.stem}.record.json")
        found[nb.stem] = Submission(nb.stem, nb, rec if rec.is_file() else None)
    base = folder / "submitted" if (folder / "submitted").is_dir() else folder
    for student_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        adir = student_dir / assignment
        if not adir.is_dir():
            continue
        nb = adir / f"{assignment}.ipynb"
        others = sorted(adir.glob("*.ipynb"))
        if not nb.is_file():
            if len(others) == 1:
                nb = others[0]
            else:
                names = ", ".join(p.name for p in others) or "no notebook"
                found[student_dir.name] = Submission(student_dir.name, None, problem=f"expected {assignment}.ipynb in {adir}, found {names}")
                continue
        rec = adir / record_name(assignment)
        found[student_dir.name] = Submission(student_dir.name, nb, rec if rec.is_file() else None)
    subs = [found[k] for k in sorted(found)]
    for s in subs:
        if not s.problem and not STUDENT_ID.match(s.student_id):
            s.problem = f"student id {s.student_id!r} must be letters, digits and _.@+- only (rename the file or folder)"
    return subs


def read_notebook(path: Path):
    """The notebook at ``path`` as nbformat v4, or SubmissionError saying what is wrong."""
    import nbformat

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SubmissionError("is not a text file (not UTF-8): not a notebook") from None
    except OSError as exc:
        raise SubmissionError(f"cannot be read: {exc.strerror}") from None
    if not text.strip():
        raise SubmissionError("is empty (0 bytes of notebook)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): re-download it from Jupyter/Colab") from None
    if not isinstance(data, dict) or "cells" not in data or "nbformat" not in data:
        raise SubmissionError("is JSON but not a Jupyter notebook (no 'cells'/'nbformat')")
    try:
        nb = nbformat.reads(text, as_version=4, capture_validation_error={})
    except Exception as exc:  # nbformat raises several kinds for a malformed notebook
        raise SubmissionError(f"is not a valid notebook: {str(exc).splitlines()[0][:200]}") from None
    for i, cell in enumerate(nb.cells):
        if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
            raise SubmissionError(f"is not a valid notebook: cell {i} has no cell_type/source")
    return nb


def _grade_id(cell) -> str | None:
    md = cell.get("metadata", {}).get("nbgrader", {})
    return md.get("grade_id") if isinstance(md, dict) else None


def restore_deleted_cells(nb, released) -> list[str]:
    """Put back every released cell (by grade_id) missing from ``nb``; returns their ids.

    Each goes right after the nearest earlier released cell that is present, so the order
    of the notebook is the released order. Cells the learner added stay where they are.
    """
    present = {_grade_id(c) for c in nb.cells} - {None}
    if not present:
        raise SubmissionError("has no nbgrader cells: it was not made from the released notebook (start from notebooks/ and keep its cells)")
    restored = []
    last_index_of: dict[str, int] = {}
    for i, c in enumerate(nb.cells):
        gid = _grade_id(c)
        if gid:
            last_index_of[gid] = i
    prev_id = None
    for rcell in released.cells:
        gid = _grade_id(rcell)
        if gid is None:
            continue
        if gid not in present:
            pos = last_index_of[prev_id] + 1 if prev_id in last_index_of else 0
            nb.cells.insert(pos, copy.deepcopy(rcell))
            last_index_of = {k: (v + 1 if v >= pos else v) for k, v in last_index_of.items()}
            last_index_of[gid] = pos
            present.add(gid)
            restored.append(gid)
        prev_id = gid
    return restored


def prepare(sub: Submission, released_nb_path: Path, dest_dir: Path, dest_name: str) -> list[str]:
    """Read, repair and write ``sub`` as ``dest_dir/dest_name``; returns status notes.

    Raises SubmissionError when it cannot be graded."""
    import nbformat

    if sub.problem:
        raise SubmissionError(sub.problem)
    nb = read_notebook(sub.notebook)
    released = nbformat.read(str(released_nb_path), as_version=4)
    notes = []
    restored = restore_deleted_cells(nb, released)
    if restored:
        notes.append(f"restored {len(restored)} deleted cell(s) from the source: {', '.join(restored)}")
    # nbformat 4.5 wants cell ids; old or hand-edited notebooks may lack them
    nb.nbformat_minor = max(nb.get("nbformat_minor", 0), 5)
    for i, cell in enumerate(nb.cells):
        if not cell.get("id"):
            cell["id"] = f"cell-{i}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(dest_dir / dest_name))
    return notes
