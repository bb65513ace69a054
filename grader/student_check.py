"""``python -m grader check NOTEBOOK`` in the student edition: the visible tests, run.

The student edition (``grader/edition.py``) has no ``grader/source/`` and no judges, so it cannot
grade the way the instructors' ``grader/selfcheck.py`` does (nbgrader's autograde, each graded cell
decided by its lab's judge outside the kernel). It runs a copy of the notebook from the top in a fresh kernel, in a
scratch folder (the learner's folder and records are left alone), with every cell run even
after one fails, and reports each graded cell: an autograded test cell passes when its visible
tests raised nothing and wrote nothing to stderr (what nbgrader scores as a failure:
``determine_grade`` in nbgrader/utils.py); a manually graded cell is the instructor's. The grade
is decided when the instructor grades.

Exit status: 0 every visible test passed; 1 some failed; 2 the notebook could not be run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grader import REPO_ROOT

DEFAULT_TIMEOUT_S = 900  # a serving lab starts an engine in one cell (grader/course.py ENGINE_SMOKE_TIMEOUT_S)
HIDDEN = ("Your grade is decided when your instructor grades this notebook: the grader re-measures your numbers and "
          "tries your functions on inputs you have not seen, so passing here is necessary, not sufficient.")


class CheckError(Exception):
    """A notebook this command cannot run, with a one-line reason."""


def _text(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def graded_cells(nb) -> list[dict]:
    """The notebook's graded cells, in order: ``{"cell", "points", "auto"}``."""
    out = []
    for c in nb.cells:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            out.append({"cell": meta.get("grade_id", "?"), "points": float(meta.get("points", 0) or 0),
                        "auto": c.cell_type == "code" and not meta.get("solution")})
    return out


def verdict(cell) -> tuple[str, str]:
    """``(status, note)`` of an executed test cell: passed, failed (why) or not run."""
    outs = cell.get("outputs", [])
    err = next((o for o in outs if o.get("output_type") == "error"), None)
    if err is not None:
        first = (str(err.get("evalue", "")).strip().splitlines() or [""])[0]
        return "failed", f"{err.get('ename', 'Error')}: {first}"[:200]
    stderr = "".join(o.get("text", "") for o in outs if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr.strip():
        return "failed", f"wrote to stderr, which the grader counts as a failure: {stderr.strip().splitlines()[-1][:150]}"
    if cell.get("execution_count") is None:
        return "not run", "the kernel stopped before this cell"
    return "passed", ""


def _kernel_spec(home: Path) -> str:
    spec = home / "kernels" / "gpulab-check"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "Python 3 (check)",
                                                  "language": "python"}))
    return spec.name


def run_visible(notebook: Path, timeout_s: int = DEFAULT_TIMEOUT_S, repo: Path = REPO_ROOT) -> dict:
    """Run a copy of ``notebook`` and return ``{"notebook", "cells": [{cell, points, auto, status, note}], "status"}``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    notebook = Path(notebook)
    if not notebook.is_file():
        raise CheckError(f"no notebook at {notebook}")
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception as exc:  # nbformat raises several kinds for a file that is not a notebook
        raise CheckError(f"{notebook} is not a notebook ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None
    cells = graded_cells(nb)
    if not cells:
        raise CheckError(f"{notebook} has no graded cells: start from a notebook in notebooks/ and keep its cells")
    scratch = Path(tempfile.mkdtemp(prefix="gpulab-check-"))
    status = "ok"
    try:
        shutil.copy2(notebook, scratch / notebook.name)
        kernel = _kernel_spec(scratch / "jupyter")
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = str(scratch / "jupyter") + (os.pathsep + old if old else "")
        pp = os.environ.get("PYTHONPATH")
        env = {**os.environ, "GPULAB_REPO": str(repo), "PYTHONPATH": str(repo) + (os.pathsep + pp if pp else "")}
        client = NotebookClient(nb, timeout=timeout_s, kernel_name=kernel, allow_errors=True, interrupt_on_timeout=True,
                                resources={"metadata": {"path": str(scratch)}})
        try:
            client.execute(env=env)
        except DeadKernelError:
            status = "the kernel died (out of memory, or a crash in native code)"
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    by_id = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    for c in cells:
        c["status"], c["note"] = verdict(by_id[c["cell"]]) if c["auto"] else ("instructor", "graded by your instructor")
    return {"notebook": str(notebook), "cells": cells, "status": status}


def format_table(res: dict) -> str:
    """The per-cell table and the closing lines ``check`` prints."""
    rows = [("cell", "points", "visible tests", "note")]
    rows += [(c["cell"], f"{c['points']:g}", c["status"], c["note"]) for c in res["cells"]]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:3], widths, strict=True)) + ("  " + r[3] if r[3] else "") for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    auto = [c for c in res["cells"] if c["auto"]]
    passed = sum(c["status"] == "passed" for c in auto)
    manual = len(res["cells"]) - len(auto)
    lines += ["", f"visible tests passed in {passed} of {len(auto)} test cells"
              + (f"; {manual} cell{'s' * (manual != 1)} graded by your instructor" if manual else "")]
    if res["status"] != "ok":
        lines.append(f"stopped early: {res['status']}")
    lines.append(HIDDEN)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":  # a lab's README from the learner's own record: the same in both editions
        from grader import portfolio

        return portfolio.main(argv[1:], prog="python -m grader report")
    if argv and argv[0] in ("release", "autograde"):
        print(f"error: this is the student edition: `{argv[0]}` is in the instructors' repository; "
              "`python -m grader check NOTEBOOK` runs your notebook's visible tests", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="python -m grader", description="Run a lab notebook's visible tests "
                                "(`python -m grader report` writes a lab's README from your record).")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="run the notebook from the top and report its visible tests")
    c.add_argument("notebook", type=Path)
    c.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help=f"seconds per cell (default {DEFAULT_TIMEOUT_S})")
    c.add_argument("--json-out", type=Path, help="write the per-cell result here")
    a = p.parse_args(argv)
    if a.timeout <= 0:
        p.error("--timeout must be a positive number of seconds")
    try:
        res = run_visible(a.notebook, a.timeout)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(res))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(res, indent=1))
    if res["status"] != "ok":
        return 2
    return 0 if all(c["status"] == "passed" for c in res["cells"] if c["auto"]) else 1
