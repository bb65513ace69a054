"""The learner's own answers in a lab notebook, for ``python -m utils.portfolio``.

An answer cell is one nbgrader marks ``solution: true`` in its metadata (the source notebooks
under ``grader/source/`` mark them so; https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html).
Released, an unanswered cell still holds the stub ``grader/nbgrader_config.py`` puts there:
``YOUR ANSWER HERE`` (Markdown) or ``# YOUR CODE HERE`` / ``raise NotImplementedError()``
(code). A Markdown answer is prose, quoted as written; in a code answer the string answers are
the assignments of a string (``LIMITER = "compute"``, a dict of strings such as ``CHOICE``) and
the answer names each lab asks for, which the record may hold as the run computed them.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEXT_STUB = "YOUR ANSWER HERE"
CODE_STUB = ("YOUR CODE HERE", "raise NotImplementedError()")

# The string answers each lab asks for by name (the reference answers in grader/source/):
# a learner may compute them, so they are looked for whatever the right-hand side is.
STRING_ANSWERS = {
    "00_foundations": ("LIMITER",),
    "01_single_gpu": ("BOTTLENECK", "FIRST_FIX", "CAUSE"),
    "02_multi_gpu": ("EXPLANATION",),
    "03_inference_serving": (),
    "04_benchmarking_production": ("CHOICE",),
    "05_hardware_and_cost": (),
}


@dataclass
class Answer:
    grade_id: str
    cell_type: str  # "markdown" or "code"
    answered: bool
    prose: str = ""  # a Markdown answer, as written
    statements: list[str] = field(default_factory=list)  # string-answer assignments, verbatim
    names: list[str] = field(default_factory=list)  # the answer names those assign
    printed: str = ""  # the cell's saved stdout, when the notebook was run


def source(cell: dict) -> str:
    """A cell's source as one string (nbformat stores a string or a list of lines)."""
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else str(s)


def grade_id(cell: dict) -> str | None:
    return (cell.get("metadata") or {}).get("nbgrader", {}).get("grade_id")


def load_notebook(path: Path) -> dict:
    """The notebook as a dict; ``ValueError`` with one line when it is not a notebook."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a notebook (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a notebook ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{path} is not a notebook (no list of cells)")
    return nb


def _stdout(cell: dict) -> str:
    return "".join("".join(o["text"]) if isinstance(o.get("text"), list) else str(o.get("text", ""))
                   for o in cell.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _is_string(node: ast.AST) -> bool:
    """A string constant, an f-string, or a dict literal one of whose values is one."""
    if isinstance(node, (ast.JoinedStr,)) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    return isinstance(node, ast.Dict) and any(v is not None and _is_string(v) for v in node.values)


def _assigned(node: ast.AST) -> list[str]:
    names = []
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.append(n.id)
    return names


def string_statements(code: str, wanted: tuple[str, ...] = ()) -> list[tuple[str, list[str]]]:
    """``(statement as written, names)`` for each top-level statement (outside a function or
    class) that gives an upper-case name a string (or a dict holding one), or that assigns one
    of ``wanted`` whatever its value: an ``if`` that picks the string is quoted whole, so the
    rule the learner wrote shows with it. Code that does not parse has none."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []

    def matches(node: ast.stmt) -> list[str]:
        names: list[str] = []
        stack = [node]
        while stack:
            n = stack.pop(0)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                got = _assigned(n)
                if any(g in wanted for g in got) or (_is_string(n.value) and any(g.isupper() for g in got)):
                    names += [g for g in got if g not in names]
            for attr in ("body", "orelse", "finalbody"):
                inner = getattr(n, attr, None)
                if isinstance(inner, list):
                    stack.extend(x for x in inner if isinstance(x, ast.stmt))
            for handler in getattr(n, "handlers", None) or []:
                stack.extend(handler.body)
        return names

    found, lines = [], code.splitlines()
    for node in tree.body:
        names = matches(node)
        if names:  # whole lines, so a comment the learner put beside it stays
            found.append(("\n".join(lines[node.lineno - 1:node.end_lineno]), names))
    return found


def answers(nb: dict, assignment: str) -> list[Answer]:
    """Every answer cell of ``nb``: whether it was answered, its prose (Markdown) or its string
    answers (code), in notebook order. Code answers without a string answer are left out
    unless unanswered."""
    wanted = STRING_ANSWERS.get(assignment, ())
    out = []
    for c in nb["cells"]:
        meta = (c.get("metadata") or {}).get("nbgrader") or {}
        if not meta.get("solution"):
            continue
        text, gid = source(c), grade_id(c) or "(no grade_id)"
        if c.get("cell_type") == "markdown":
            answered = bool(text.strip()) and TEXT_STUB not in text
            out.append(Answer(gid, "markdown", answered, prose=text.strip() if answered else ""))
            continue
        answered = bool(text.strip()) and not all(s in text for s in CODE_STUB)
        if not answered:
            out.append(Answer(gid, "code", False))
            continue
        stmts = string_statements(text, wanted)
        if stmts:
            names = list(dict.fromkeys(n for _, ns in stmts for n in ns if n.isupper() or n in wanted))
            out.append(Answer(gid, "code", True, statements=[s for s, _ in stmts], names=names,
                              printed=_stdout(c).strip()))
    return out


def recorded(name: str, data: Any) -> Any:
    """The value the record holds for the answer ``name`` (``LIMITER`` -> an extra ``limiter``),
    searched breadth-first through the measurements' extras; ``None`` when it has none."""
    key = name.lower()
    stack = [data]
    while stack:
        d = stack.pop(0)
        if isinstance(d, dict):
            if key in d and d[key] is not None:
                return d[key]
            stack.extend(v for v in d.values() if isinstance(v, (dict, list)))
        elif isinstance(d, list):
            stack.extend(v for v in d if isinstance(v, (dict, list)))
    return None
