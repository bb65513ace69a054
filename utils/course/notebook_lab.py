"""Which lab a notebook is: the one whose graded cells (nbgrader ``grade_id`` in each cell's
metadata, https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html)
it shares most with a reference notebook; failing that, the lab its file name starts with.

A learner's notebook may be renamed (``01_single_gpu (1).ipynb``, ``my_run.ipynb``) or have cells
added, so the ids, not the name, decide first. Used by ``python -m grader check`` (against
``grader/source/``) and ``python -m grader report`` (against ``notebooks/``).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def grade_ids(nb: dict) -> set[str]:
    """The nbgrader grade ids of ``nb``'s cells (a notebook as parsed JSON)."""
    out = set()
    for c in nb.get("cells", []) if isinstance(nb, dict) else []:
        meta = c.get("metadata") if isinstance(c, dict) else None
        g = meta.get("nbgrader", {}).get("grade_id") if isinstance(meta, dict) and isinstance(meta.get("nbgrader"), dict) else None
        if isinstance(g, str) and g:
            out.add(g)
    return out


def _ids_of(path: Path) -> set[str]:
    try:
        return grade_ids(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return set()


def lab_of(ids: set[str], references: Mapping[str, Path], file_stem: str) -> str | None:
    """The lab (a key of ``references``, each a reference notebook's path) whose notebook shares
    most of ``ids``; else the first lab ``file_stem`` starts with; else None. A reference that is
    missing or unreadable shares nothing."""
    best, best_n = None, 0
    for lab, path in references.items():
        n = len(ids & _ids_of(Path(path))) if ids else 0
        if n > best_n:
            best, best_n = lab, n
    if best:
        return best
    return next((lab for lab in references if file_stem.startswith(lab)), None)
