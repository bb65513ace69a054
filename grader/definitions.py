"""The learner's definitions, read as text from the screened notebook, and the code a sandbox runs on.

A sandbox (``grader/sandbox.py``) holds the learner's definitions alone, never the kernel's state:

1. the imports and literal constants of the course's own locked cells (``import torch``,
   ``from utils import timing``, ``TILE = 128``);
2. from every cell the release does not lock (the answer cells and any cell the learner added):
   ``def``, ``class`` and ``import`` statements, and assignments of values that run nothing to
   compute (constants, lambdas). Nothing else of those cells runs, so a statement that computes
   at run time (``THRESHOLD = measure()``) is not there: a function that reads such a global
   fails in the sandbox, and the feedback says why.

The text comes from the notebook the screen read and the kernel ran: the same bytes.

:func:`read_code` takes the course code (``utils/``, ``grader/``) into memory when a grading run
starts, before any learner code runs; :func:`write_code` writes a fresh copy of it for each sandbox,
so a kernel that rewrote the course on disk cannot change what a sandbox imports.
"""
from __future__ import annotations

import ast
from pathlib import Path

from grader import REPO_ROOT
from grader.screen import as_python

CODE_DIRS = ("utils", "grader")  # what a sandbox imports from the course


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def parse(text: str) -> ast.Module | None:
    """A cell as the Python IPython runs (a magic becomes a ``get_ipython()`` call); None when it does not parse."""
    try:
        return ast.parse(as_python(text))
    except SyntaxError:
        return None


def bound(node: ast.AST) -> set[str]:
    """Names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def runs_nothing(node: ast.AST) -> bool:
    """An expression whose evaluation calls nothing: literals, names, lambdas (their bodies run only
    when called), arithmetic and containers of those."""
    if isinstance(node, ast.Lambda):
        return all(runs_nothing(d) for d in node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Subscript,
                         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Attribute)):
        return False
    return all(runs_nothing(c) for c in ast.iter_child_nodes(node))


def literal(node: ast.AST) -> bool:
    """An assignment to plain names of a value that runs nothing (``N = 4``, ``f = lambda x: x``)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return all(isinstance(t, ast.Name) for t in targets) and runs_nothing(node.value)


def course_cell(md: dict, locked: frozenset | None = None) -> bool:
    """A cell the release locks (setup, prose code); every other code cell is the learner's. ``locked``:
    the grade ids of the locked cells as the gradebook has them: a cell a learner added and marked
    locked in its metadata is the learner's all the same."""
    return (bool(md.get("locked")) and not md.get("solution")
            and (locked is None or md.get("grade_id") in locked))


def job(nb: dict, locked: frozenset | None = None) -> dict:
    """``{"prelude": [...], "definitions": [...]}``: the course cells' imports and literal constants,
    and the learner's definitions, one source per cell (see the module docstring). ``locked``: as for
    :func:`course_cell` (the course's locked cells run before the sandbox's policy is in force)."""
    prelude, definitions = [], []
    for cell in nb.get("cells", []):
        md = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or (md.get("grade") and not md.get("solution")):
            continue  # a test cell: the learner's feedback, not a definition
        tree = parse(source(cell))
        if tree is None:
            continue
        if course_cell(md, locked):
            kept = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) or literal(n)]
            prelude.extend(ast.unparse(n) for n in kept)
        else:
            kept = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                            ast.AsyncFunctionDef, ast.ClassDef)) or literal(n)]
            if kept:
                definitions.append("\n".join(ast.unparse(n) for n in kept))
    return {"prelude": ["\n".join(prelude)] if prelude else [], "definitions": definitions}


def read_code(root: Path = REPO_ROOT) -> dict[str, bytes]:
    """``{relative path: bytes}`` of the course's Python code under ``root`` (:data:`CODE_DIRS`)."""
    files = {}
    for d in CODE_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".json", ".txt", ".toml"):
                files[p.relative_to(root).as_posix()] = p.read_bytes()
    return files


def write_code(files: dict[str, bytes], dest: Path) -> Path:
    """Write ``files`` (:func:`read_code`) under ``dest``; returns ``dest``."""
    for rel, data in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest
