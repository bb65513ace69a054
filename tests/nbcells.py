"""Reading nbgrader notebooks in the lab tests: a cell's grade id, its source, a cell by id."""
from __future__ import annotations


def gid(cell: dict) -> str | None:
    """The cell's nbgrader ``grade_id`` (None for cells nbgrader does not track)."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def src(cell: dict) -> str:
    """The cell's source as one string (nbformat stores a string or a list of lines)."""
    s = cell["source"]
    return "".join(s) if isinstance(s, list) else s


def cell(nb: dict, grade_id: str) -> dict:
    """The cell whose ``grade_id`` is ``grade_id``."""
    return next(c for c in nb["cells"] if gid(c) == grade_id)
