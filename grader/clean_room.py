"""A second verdict on a graded cell, from a process the learner's kernel never touched.

nbgrader runs the hidden tests in the learner's kernel, after the learner's cells, so whatever
those cells left in the kernel (an IPython input transformer, an event callback, a display hook,
a patched builtin) runs around the tests. The static screen (``grader/screen.py``) holds for
review every construct known to do that; this module does not depend on knowing them.

After the notebook is graded, a fresh Python process (no IPython, no kernel, none of the
notebook's state) is built from text alone:

1. the imports and literal constants of the course's own locked cells (``from grader import
   checks``, ``utils``...);
2. the learner's definitions, read as text from every cell the release does not lock (the
   answer cells and any cell the learner added): ``def``, ``class``, ``import`` and assignments
   of values that run nothing to compute (constants, lambdas); nothing else of those cells
   runs, so a statement that installs something in the interpreter never runs here;
3. each graded cell's tests (visible and hidden, as the release has them), by direct execution,
   one at a time, when every name they read is defined by 1 or 2, by the cell itself, or by the
   values handed over (below). A cell that reads anything else (a model, a sweep's results)
   keeps its kernel verdict alone.

A cell whose tests also read values the notebook computed gets them handed over as plain data:
before each graded cell, the batch inserts a snapshot cell (:func:`with_snapshots`) that writes
the ``repr`` of each value the cell reads, and of each notebook global the learner's definitions
read, and the clean process takes a value only where ``ast.literal_eval`` reads it back (numbers,
strings, and lists, tuples, dicts and sets of them), never code or objects. An instance of a
dataclass of the course's ``utils`` (a timing result, a spec row, a recipe), a torch dtype and a
torch device go as their fields and are rebuilt here by the course's own constructors
(``grader.clean_values``). The kernel can forge those values, but they are the learner's
answers anyway; the checks that judge them run here, untouched.

A cell that measures runs here too: the grader's re-measurement (``grader.remeasure.agree``) times
again in this process, with the grader's timer, the learner's functions where the check calls them
(lab 00's ``time_matmul``), after the kernel has gone. A miss that a load window found on a loaded
machine raises ``NotMeasuredHere`` instead of failing: it may be the machine's, and the kernel's
verdict, which allowed for its own load, stands.

A cell that passed in the kernel but whose tests raise ``AssertionError`` here scores 0, with
both verdicts in the feedback (:func:`apply`). Any other error here, or an ``AssertionError``
behind which the answer raised ``NameError`` or ``ImportError`` (a notebook global that was not
plain data, an import the notebook installed), says nothing about the answer: the cell keeps its
kernel verdict and the reason is noted. What this still cannot defend is in ``docs/grading.md``,
"What the screen cannot see".

Written by hand: nbgrader has no mode that runs tests outside the kernel, and nbclient runs cells
only in a kernel.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader.clean_values import read, rebuilt

SNAPSHOT_MARK = "# the grader's copy of the values the next test reads, for its clean-process check (not graded)"
CELL_TIMEOUT_S = 30  # a cell whose tests take longer here is left to its kernel verdict
TOTAL_TIMEOUT_S = 180  # the whole clean run; cells not reached keep their kernel verdict
BUILTINS = set(dir(builtins))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _parse(source: str) -> ast.Module | None:
    """The cell as the Python IPython runs (a magic becomes a ``get_ipython()`` call, which no
    cell checked here may read); None when it does not parse."""
    from grader.screen import as_python

    try:
        return ast.parse(as_python(source))
    except SyntaxError:
        return None


def _bound(node: ast.AST) -> set[str]:
    """Names a statement binds at the top of a module."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _runs_nothing(node: ast.AST) -> bool:
    """An expression whose evaluation calls nothing: literals, names, lambdas (their bodies run
    only when called), containers of those."""
    if isinstance(node, ast.Lambda):
        return all(_runs_nothing(d) for d in node.args.defaults + [d for d in node.args.kw_defaults if d])
    if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Subscript,
                         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.BinOp)):
        return isinstance(node, ast.BinOp) and _runs_nothing(node.left) and _runs_nothing(node.right)
    return all(_runs_nothing(c) for c in ast.iter_child_nodes(node))


def _literal(node: ast.AST) -> bool:
    """An assignment to plain names of a value that runs nothing to compute (``N = 4``,
    ``CHOICE = {"engine": "vllm"}``, ``f = lambda x: x``)."""
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return all(isinstance(t, ast.Name) for t in targets) and _runs_nothing(node.value)


def _reads(tree: ast.Module) -> set[str]:
    """Names a cell reads that it does not bind itself (approximately: anything it binds anywhere
    counts as bound, which may let a cell run here that then fails on a NameError, never the reverse)."""
    loaded, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= _bound(n)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return loaded - bound


def _course_cell(md: dict) -> bool:
    """A cell the release locks (setup, prose code) or grades; every other code cell is the
    learner's: the answer cells and any cell they added."""
    return bool(md.get("locked") or md.get("grade")) and not md.get("solution")


def job(nb: dict) -> dict:
    """What the clean process runs, read from a graded notebook: the locked cells' imports and
    constants, the learner's definitions, and the graded cells it can check (``skipped``: the
    others, with why). A definition that would rebind a builtin or a name the course's cells
    import (``all``, ``checks``) is left out, so that a test reads what it was written against;
    so is a name that a statement not run here also binds (``THRESHOLD = 0.5`` in one cell and
    ``THRESHOLD = measured * 2`` in another), or a list, dict or set such a statement mentions (it
    may fill it in place): its value in the kernel is not known here, and is handed over if plain."""
    prelude, definitions, cells, skipped, missed = [], [], {}, {}, {}
    rebound: set[str] = set()  # names some statement not run here also binds: their value there is the kernel's
    mentioned: set[str] = set()  # names some statement not run here reads or binds
    for index, cell in enumerate(nb.get("cells", [])):
        md = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or (md.get("grade") and not md.get("solution")):
            continue
        tree = _parse(_source(cell))
        if tree is None:
            continue
        runs = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) or _literal(n)
                or (not _course_cell(md) and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
        for n in runs:
            n.gpulab_cell = index  # the learner's statements stay grouped by cell (run: one source per cell)
        (prelude if _course_cell(md) else definitions).extend(runs)
        rebound |= {x.id for n in tree.body if n not in runs for x in ast.walk(n)
                    if isinstance(x, ast.Name) and not isinstance(x.ctx, ast.Load)}
        rebound |= {x.name for n in tree.body if n not in runs for x in ast.walk(n)
                    if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        mentioned |= {x.id for n in tree.body if n not in runs for x in ast.walk(n) if isinstance(x, ast.Name)}
    # a list, dict or set that a statement not run here mentions may have been filled in place (decode = {},
    # then decode[b] = ... in a loop): its value in the kernel is not the literal either
    rebound |= {name for n in prelude + definitions if isinstance(n, (ast.Assign, ast.AnnAssign))
                and isinstance(n.value, (ast.List, ast.Dict, ast.Set)) for name in _bound(n) & mentioned}
    prelude = [ast.unparse(n) for n in prelude if not (_bound(n) & rebound) or isinstance(n, (ast.Import, ast.ImportFrom))]
    definitions = [n for n in definitions if not (_bound(n) & rebound) or isinstance(n, (ast.Import, ast.ImportFrom))]
    reserved, course = set(BUILTINS), []
    for src in prelude:  # the course's constants, kept only where they read nothing the notebook computed
        n = ast.parse(src).body[0]
        if isinstance(n, (ast.Import, ast.ImportFrom)) or not _reads(ast.Module([n], [])) - reserved:
            course.append(src)
            reserved |= _bound(n)
    prelude = course
    kept, known = [], set(reserved)
    for n in definitions:  # an assignment that reads what the notebook computed is left to the kernel
        same = isinstance(n, (ast.Import, ast.ImportFrom)) and ast.unparse(n) in prelude  # import torch, again
        if (_bound(n) & reserved and not same) or (isinstance(n, (ast.Assign, ast.AnnAssign))
                                                     and _reads(ast.Module([n], [])) - known):
            continue
        kept.append(n)
        known |= _bound(n)
    known -= rebound  # an import the notebook later rebinds (``from utils import decode``, then ``decode = {...}``)
    for gid, (src, reads) in _tests(nb).items():
        if missing := sorted(set(reads) - known):
            skipped[gid] = "reads what the notebook computed: " + ", ".join(missing[:5])
            missed[gid] = missing
        else:
            cells[gid] = src
    free = {x for n in kept if not isinstance(n, (ast.Import, ast.ImportFrom)) for x in _reads(ast.Module([n], []))}
    by_cell: dict[int, list[str]] = {}
    for n in kept:
        by_cell.setdefault(n.gpulab_cell, []).append(ast.unparse(n))
    return {"prelude": prelude, "definitions": ["\n".join(b) for b in by_cell.values()], "cells": cells, "skipped": skipped,
            "missing": missed, "tests": {gid: src for gid, (src, _) in _tests(nb).items()},
            "globals": sorted(free - known)}


def _tests(nb: dict) -> dict[str, tuple[str, list[str]]]:
    """``{grade_id: (source, names)}`` of each graded code cell that parses: its tests as plain
    Python, and the names they read that the cell does not bind (builtins aside)."""
    out = {}
    for cell in nb.get("cells", []):
        md = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and md.get("grade") and not md.get("solution"):
            tree = _parse(_source(cell))
            if tree is not None:
                out[md["grade_id"]] = (ast.unparse(tree), sorted(_reads(tree) - BUILTINS))
    return out


def with_snapshots(submitted: dict, source: dict) -> dict:
    """``submitted`` with a snapshot cell before each graded cell (``source``: the instructor's
    notebook, hidden tests included, for what the tests read). Inserted after the screen has read
    the submission; the snapshot cells are the grader's, and say so. Each one also takes the
    notebook globals that the learner's definitions read (``DEVICE`` in a timing function)."""
    free = job(submitted)["globals"]
    reads = {gid: sorted(set(names) | set(free)) for gid, (_, names) in _tests(source).items()}
    cells = []
    for cell in submitted.get("cells", []):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if reads.get(gid) and cell.get("cell_type") == "code":
            cells.append({"cell_type": "code", "execution_count": None, "id": f"gpulab-snapshot-{len(cells)}",
                          "metadata": {}, "outputs": [],
                          "source": f"{SNAPSHOT_MARK}\n__import__('grader.clean_values').clean_values.snapshot("
                                    f"globals(), {gid!r}, {tuple(reads[gid])!r})"})
        cells.append(cell)
    return dict(submitted, cells=cells)


def _missing_here(exc: BaseException) -> str:
    """The first line of a ``NameError`` or ``ImportError`` behind ``exc`` (``grader.checks.call``
    turns an answer's exception into an ``AssertionError``; a check that ran the answer in another
    process names it: "raised NameError"), else "": a name or module the kernel had and this
    process lacks says nothing about a cell that passed in the kernel."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (NameError, ImportError)) or re.search(r"raised (NameError|ImportError|ModuleNotFoundError)\b",
                                                                  str(exc)):
            return _first_line(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return ""


class _CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CellTimeout


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run(spec: dict) -> dict:
    """Run ``spec`` (:func:`job`) in this process: the verdict of each cell, ``True`` (passed),
    ``False`` (an assertion failed) or ``None`` (could not be checked here), with a line why."""
    cell_timeout_s = int(spec.get("cell_timeout_s", CELL_TIMEOUT_S))
    from grader.remeasure import CLEAN_ROOM_ENV

    os.environ[CLEAN_ROOM_ENV] = "1"  # a re-measurement that misses under load gives no verdict here
    ns: dict = {"__name__": "__clean_room__"}
    out: dict = {}
    for index, src in enumerate(spec["prelude"] + spec["definitions"]):
        # each cell's kept statements under one file name whose text linecache holds, as IPython
        # does for a cell: a check that reads an answer's source (inspect.getsource) finds it
        name = f"<clean-room-cell-{index}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        for stmt in ast.parse(src).body:  # one at a time: an import that fails here stops nothing else
            try:
                exec(compile(ast.Module([stmt], []), name, "exec"), ns)
            except Exception as exc:  # not the answer's fault here
                out["_setup"] = f"{ast.unparse(stmt).splitlines()[0][:80]}: {_first_line(exc)}"
    alarm = getattr(signal, "alarm", lambda s: None)  # no SIGALRM on Windows: verdicts' whole-run timeout alone
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _alarm)
    for grade_id, src in spec["cells"].items():
        alarm(cell_timeout_s)
        try:
            ns.update({k: rebuilt(ast.literal_eval(v)) for k, v in spec.get("values", {}).get(grade_id, {}).items()})
            exec(compile(src, f"<{grade_id}>", "exec"), ns)
            out[grade_id] = [True, ""]
        except AssertionError as exc:
            gone = _missing_here(exc)
            out[grade_id] = [None, f"{gone}: not the answer's fault"] if gone else [False, _first_line(exc)]
        except _CellTimeout:
            out[grade_id] = [None, f"took over {cell_timeout_s} s here"]
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: no verdict, not a failure
            out[grade_id] = [None, _first_line(exc)]
        finally:
            alarm(0)
    return out


def verdicts(nb_path: Path, *, cell_timeout_s: float | None = None, cwd: Path | None = None,
             only: set[str] | None = None, values: Path | None = None) -> dict:
    """The clean process's verdicts on a graded notebook: ``{grade_id: [ok, why]}``, ``ok`` as in
    :func:`run`; cells it could not run are ``[None, why]``. ``cwd``: where the notebook ran (its
    code copy), so that ``grader`` and ``utils`` import from the same files. ``only``: the cells
    worth a second verdict (those that passed in the kernel); no process starts when none is.
    ``values``: the snapshot file (``grader.clean_values.snapshot``), whose plain values stand in for what a cell
    reads beyond the definitions. ``cell_timeout_s``: the most one cell may take here (the kernel's
    per-cell limit, when a cell re-measures); the whole run stops after that times the cells, at
    least :data:`TOTAL_TIMEOUT_S`."""
    cell_timeout_s = CELL_TIMEOUT_S if cell_timeout_s is None else cell_timeout_s
    spec = job(json.loads(Path(nb_path).read_text()))
    handed, spec["values"], missing = read(values), {}, spec.pop("missing")
    for gid, names in missing.items():
        if set(names) <= set(handed.get(gid, ())):
            spec["cells"][gid] = spec["tests"][gid]
            del spec["skipped"][gid]
        elif gid in handed:
            spec["skipped"][gid] = "reads objects the notebook computed, not plain data: " + ", ".join(
                sorted(set(names) - set(handed[gid]))[:5])
    for gid in spec["cells"]:  # what the tests read, and the globals the definitions read (those the kernel had)
        want = set(missing.get(gid, ())) | set(spec["globals"])
        spec["values"][gid] = {k: v for k, v in handed.get(gid, {}).items() if k in want}
    if only is not None:
        spec["cells"] = {k: v for k, v in spec["cells"].items() if k in only}
    out = {k: [None, why] for k, why in spec["skipped"].items()}
    if not spec["cells"]:
        return out
    with tempfile.TemporaryDirectory(prefix="gpulab-clean-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "verdicts.json"
        job_path.write_text(json.dumps({**spec, "cell_timeout_s": cell_timeout_s}))
        timeout_s = max(TOTAL_TIMEOUT_S, cell_timeout_s * len(spec["cells"]))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY", "IPY", "JUPYTER"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd) if cwd else "", env.get("PYTHONPATH", "")) if p)
        t0 = time.monotonic()
        try:
            subprocess.run([sys.executable, "-m", "grader.clean_room", str(job_path), str(result_path)], cwd=cwd or None,
                           env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            pass
        try:
            got = json.loads(result_path.read_text())
        except (OSError, ValueError):
            got = {}
        why = f"the clean process stopped after {time.monotonic() - t0:.0f} s" if not got else ""
    for k in spec["cells"]:
        out[k] = got.get(k) or [None, why or "not reached"]
    if got.get("_setup"):
        out["_setup"] = [None, got["_setup"]]  # a definition that did not run here (its cells say so too)
    return out


def apply(cells: list[dict], found: dict) -> list[str]:
    """Score 0 every cell (a worker's per-cell grades) that passed in the kernel and failed here;
    returns the notes to report. ``found``: :func:`verdicts`."""
    notes = []
    for cell in cells:
        ok, why = found.get(cell["cell"], [None, ""])
        if ok is False and cell.get("mode") != "manual" and cell.get("score", 0) > 0:
            cell["kernel_score"], cell["score"], cell["passed"] = cell["score"], 0.0, False
            cell["message"] = ("passed in the notebook's kernel, but its tests failed when the grader ran them on "
                               f"your definitions in a clean process ({why}); held at 0 for an instructor to review")
            notes.append(f"{cell['cell']}: kernel and clean process disagree ({why})")
    return notes


def hold_in_gradebook(root: Path, assignment: str, student: str, cells: list[dict]) -> None:
    """Write the zeros :func:`apply` gave into the course copy's gradebook, as manual scores, so
    nbgrader's feedback, formgrader and exports show them (the instructor can give the points back)."""
    from nbgrader.api import Gradebook

    held = [c["cell"] for c in cells if "kernel_score" in c]
    if not held:
        return
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for grade_id in held:
            grade = gb.find_grade(grade_id, assignment, assignment, student)
            grade.manual_score = 0.0
        gb.db.commit()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.clean_room", description=__doc__.splitlines()[0])
    p.add_argument("job", type=Path, help="the JSON that grader.clean_room.job wrote")
    p.add_argument("result", type=Path, help="where the verdicts go")
    a = p.parse_args(argv)
    try:
        spec = json.loads(a.job.read_text())
        handle = open(a.result, "w")  # noqa: SIM115 (opened before any answer's code runs here)
    except (OSError, ValueError) as exc:
        p.error(f"cannot read the job {a.job} or write {a.result}: {exc}")
    out = run(spec)
    handle.write(json.dumps(out))
    handle.close()
    return 0


if __name__ == "__main__":
    os._exit(main())
