"""A lab notebook as ``python -m grader report`` reads it: its exercises' titles and the
learner's written answers.

An exercise's title is the heading above its cells (``### Exercise: the matmul, your compute
ceiling``): the README names exercises as the learner sees them, never by the grader's cell ids.
An answer cell is one nbgrader marks ``solution: true`` in its metadata (the source notebooks
under ``grader/source/`` mark them so;
https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html).
Released, an unanswered cell still holds the stub ``grader/nbgrader_config.py`` puts there:
``YOUR ANSWER HERE`` (Markdown) or ``# YOUR CODE HERE`` / ``raise NotImplementedError()``
(code). A Markdown answer (a write-up) is quoted as written.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

TEXT_STUB = "YOUR ANSWER HERE"
CODE_STUB = ("YOUR CODE HERE", "raise NotImplementedError()")
_POINTS = re.compile(r"\s*\([^()]*\bpoints?\b[^()]*\)\s*$")  # "(2 points, graded by your instructor)"


@dataclass
class Answer:
    grade_id: str
    cell_type: str  # "markdown" or "code"
    answered: bool
    title: str  # the exercise it belongs to, as the notebook heads it
    prose: str = ""  # a Markdown answer, as written


def source(cell: dict) -> str:
    """A cell's source as one string (nbformat stores a string or a list of lines)."""
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else str(s)


def grade_id(cell: dict) -> str | None:
    return ((cell.get("metadata") or {}).get("nbgrader") or {}).get("grade_id")


def load_notebook(path: Path) -> dict:
    """The notebook as a dict; ``ValueError`` with one line when it is not a notebook."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a notebook ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{path} is not a notebook (no list of cells)")
    return nb


def heading(text: str) -> str:
    """A Markdown heading's words: no ``#``, no trailing "(2 points, graded by your instructor)"."""
    return _POINTS.sub("", text.lstrip("#").strip()).strip()


def title(nb: dict) -> str | None:
    """The notebook's first ``# `` heading."""
    for c in nb["cells"]:
        if c.get("cell_type") == "markdown":
            for line in source(c).splitlines():
                if line.startswith("# "):
                    return heading(line)
    return None


def exercise_titles(nb: dict) -> dict[str, str]:
    """``{grade_id: title}`` of every cell with a grade id: the last heading (``##`` or deeper)
    above it, or in it (a Markdown cell that opens with its own heading)."""
    out, current = {}, ""
    for c in nb["cells"]:
        if c.get("cell_type") == "markdown":
            for line in source(c).splitlines():
                if line.startswith("##"):
                    current = heading(line)
        gid = grade_id(c)
        if gid:
            out[gid] = current or gid
    return out


def answers(nb: dict) -> list[Answer]:
    """Every answer cell of ``nb`` in notebook order: whether it was answered, and a Markdown
    answer's prose."""
    titles = exercise_titles(nb)
    out = []
    for c in nb["cells"]:
        meta = (c.get("metadata") or {}).get("nbgrader") or {}
        if not meta.get("solution"):
            continue
        text, gid = source(c), grade_id(c) or "(no grade_id)"
        if c.get("cell_type") == "markdown":
            answered = bool(text.strip()) and TEXT_STUB not in text
            out.append(Answer(gid, "markdown", answered, titles.get(gid, gid), text.strip() if answered else ""))
        else:
            answered = bool(text.strip()) and not all(s in text for s in CODE_STUB)
            out.append(Answer(gid, "code", answered, titles.get(gid, gid)))
    return out
