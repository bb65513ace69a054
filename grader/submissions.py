"""Finding submitted notebooks, reading them, and putting deleted cells back.

A submission folder holds ``<student>.ipynb`` files (beside each, optionally, its
measurement record ``<student>.record.json``), or nbgrader's layout
``[submitted/]<student>/<assignment>/<assignment>.ipynb`` with the record the notebook
wrote beside it (``<assignment>.record.json``). A notebook that cannot be read gets a
one-line reason and a zero; the batch goes on.

Only regular files inside the submissions folder are read: a link to a file outside it, a
device or a pipe (reading ``/dev/zero`` or a FIFO never ends) gets a one-line reason instead.

Edited nbgrader metadata: nbgrader trusts it too far. A duplicated cell (Jupyter's copy and
paste copies the metadata) or an edited grade id stops autograde with ``KeyError:
'grade_id'``, and an edited grade/solution flag with "Inconsistent checksums", zeroing the
whole notebook. So every cell whose grade id is in the release gets the released metadata
and cell type back (the last copy of a duplicate keeps the id: it is the one that runs last,
and the one nbgrader's ``DeduplicateIds`` keeps); the others become plain cells.

Deleted cells: nbgrader restores an edited locked cell from the gradebook, but a deleted one
is simply gone (only deleted *test* cells come back, with ``add_missing_cells``). Before
grading, every cell of the released notebook that is missing from the submission (matched by
nbgrader ``grade_id``) is put back in its place: locked cells as released (autograde then
restores them from the gradebook), answer cells as the released stub, which earns nothing.
"""
from __future__ import annotations

import copy
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

STUDENT_ID = re.compile(r"^[^\W_][\w.@+-]*$")  # letters (any script), digits, _.@+-; no glob characters for nbgrader
MAX_FILE_MB = 200  # a notebook saved with big outputs is tens of MB; past 200 MB it is not a notebook worth reading


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


def file_problem(path: Path, folder: Path | None = None) -> str:
    """Why ``path`` cannot be read as a submitted file ("" if it can): not a regular file, a
    link out of ``folder``, or too big. Checked before any read, so a pipe cannot hang it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if folder is not None and not Path(path).resolve().is_relative_to(Path(folder).resolve()):
        return "is a link to a file outside the submissions folder: put the file itself there"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a notebook file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a device, pipe or socket): not a notebook"
    if st.st_size > MAX_FILE_MB * 2**20:
        return f"is {st.st_size / 2**20:.0f} MB, over the {MAX_FILE_MB} MB limit: clear its outputs and submit it again"
    return ""


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
        if not s.problem and s.notebook is not None:
            s.problem = file_problem(s.notebook, folder)
        if not s.problem and s.record is not None and (why := file_problem(s.record, folder)):
            s.problem = f"its record {s.record.name} {why}"
    return subs


def read_notebook(path: Path):
    """The notebook at ``path`` as nbformat v4, or SubmissionError saying what is wrong."""

    if why := file_problem(path):
        raise SubmissionError(why)
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
        if Path(path).suffix.lower() in (".py", ".txt", ".md", ".html") or not text.lstrip().startswith("{"):
            raise SubmissionError(f"is a {Path(path).suffix or 'text'} file, not a Jupyter notebook: give the .ipynb "
                                  "you worked in (Jupyter or Colab: File > Download > .ipynb)") from None
        raise SubmissionError(f"is not a whole notebook ({exc.msg}; line {exc.lineno}, column {exc.colno}): the file "
                              "was cut off or edited by hand; download it again from Jupyter or Colab") from None
    if not isinstance(data, dict) or "nbformat" not in data or not ({"cells", "worksheets"} & set(data)):
        raise SubmissionError("is JSON but not a Jupyter notebook (no 'cells'/'nbformat')")  # v3 keeps cells in worksheets
    if "cells" in data:  # nbformat trusts a v4 notebook's shape; check what it would trip on
        if not isinstance(data["cells"], list):
            raise SubmissionError("is not a valid notebook: 'cells' is not a list")
        for i, cell in enumerate(data["cells"]):
            if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
                raise SubmissionError(f"is not a valid notebook: cell {i} has no cell_type/source")
            src = cell["source"]
            if not (isinstance(src, str) or (isinstance(src, list) and all(isinstance(x, str) for x in src))):
                raise SubmissionError(f"is not a valid notebook: cell {i}'s source is not text")
            if not isinstance(cell.get("metadata", {}), dict):
                raise SubmissionError(f"is not a valid notebook: cell {i}'s metadata is not a JSON object")
    import nbformat  # after the checks above: a file that is no notebook gets its line without this import's seconds

    try:
        nb = nbformat.reads(text, as_version=4, capture_validation_error={})
    except Exception as exc:  # nbformat raises several kinds for a malformed notebook
        raise SubmissionError(f"is not a valid notebook: {str(exc).splitlines()[0][:200]}") from None
    for i, cell in enumerate(nb.cells):
        if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
            raise SubmissionError(f"is not a valid notebook: cell {i} has no cell_type/source")
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"] = nbformat.NotebookNode()
    return nb


def _grade_id(cell) -> str | None:
    md = cell.get("metadata", {}).get("nbgrader", {})
    gid = md.get("grade_id") if isinstance(md, dict) else None
    return gid if isinstance(gid, str) and gid else None


def canonical_metadata(nb, released) -> int:
    """Give each released cell (by grade id) its released nbgrader metadata and cell type;
    strip nbgrader metadata from duplicates (all but the last copy) and unknown ids. Returns
    how many cells were stripped (see the module docstring for why)."""
    rel = {gid: c for c in released.cells if (gid := _grade_id(c))}
    last = {gid: i for i, c in enumerate(nb.cells) if (gid := _grade_id(c)) in rel}
    stripped = 0
    for i, cell in enumerate(nb.cells):
        if "nbgrader" not in cell["metadata"]:
            continue
        gid = _grade_id(cell)
        if gid not in rel or last[gid] != i:
            del cell["metadata"]["nbgrader"]
            stripped += 1
            continue
        r = rel[gid]
        cell["metadata"]["nbgrader"] = copy.deepcopy(r["metadata"]["nbgrader"])
        if cell["cell_type"] != r["cell_type"]:
            cell["cell_type"] = r["cell_type"]
            for key in ("outputs", "execution_count", "attachments"):
                cell.pop(key, None)
            if r["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
    return stripped


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
    if stripped := canonical_metadata(nb, released):
        notes.append(f"{stripped} cell(s) with a duplicated or unknown nbgrader id graded as plain cells")
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
