"""Reading nbgrader notebooks in the lab tests (a cell's grade id, its source, a cell by id),
and the grader tests' shared steps: grading runs, their scores, a phase module loaded fresh."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path


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


def points(nb: dict) -> dict[str, float]:
    """``{grade_id: points}`` of the notebook's automatically graded cells (the test cells)."""
    return {gid(c): c["metadata"]["nbgrader"]["points"] for c in nb["cells"]
            if c["metadata"]["nbgrader"].get("grade") and c["cell_type"] == "code"}


def writeup_points(nb: dict) -> dict[str, float]:
    """``{grade_id: points}`` of the notebook's written answers (manually graded markdown cells)."""
    return {gid(c): c["metadata"]["nbgrader"]["points"] for c in nb["cells"]
            if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "markdown"}


def leaked_lines(source: dict, released: dict) -> list[str]:
    """Lines between ``### BEGIN``/``### END`` markers of the source (solutions, hidden tests)
    that stand in the released notebook and nowhere visible in the source."""
    hidden_or_solution, visible = [], set()
    for c in source["cells"]:
        inside = False
        for line in src(c).splitlines():
            if "### BEGIN" in line or "### END" in line:
                inside = "### BEGIN" in line
            elif line.strip():
                (hidden_or_solution.append(line.strip()) if inside else visible.add(line.strip()))
    shown = {ln.strip() for c in released["cells"] for ln in src(c).splitlines()}
    return [ln for ln in hidden_or_solution if ln in shown and ln not in visible]


# -- grading runs -------------------------------------------------------------------------------

def autograde(root: Path, assignment: str, subs: Path, out: Path, *extra: str, jobs: int, timeout_s: int,
              quiet: bool = True, wait_s: int = 1200) -> dict:
    """``python -m grader autograde`` on the folder ``subs``: ``{"out", "results"`` (by student),
    ``"rows"`` (grades.csv by student), ``"stdout", "stderr"}``."""
    cmd = [sys.executable, "-m", "grader", "autograde", "--assignment", assignment, "--submissions", str(subs),
           "--out", str(out), "--jobs", str(jobs), "--timeout", str(timeout_s), *extra] + (["--quiet"] if quiet else [])
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=wait_s)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["student_id"]: r for r in json.loads((out / "results.json").read_text())}
    with open(out / "grades.csv", newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    return {"out": out, "subs": subs, "results": results, "rows": rows, "stdout": proc.stdout, "stderr": proc.stderr}


def check_each(root: Path, subs: dict[str, dict], tmp: Path, *args: str, wait_s: int = 900) -> dict:
    """``python -m grader check`` on each notebook of ``subs``, all at once:
    ``{name: (returncode, stdout, stderr, the JSON result)}``."""
    procs = {}
    for name, nb in subs.items():
        path = tmp / f"{name}.ipynb"
        path.write_text(json.dumps(nb))
        procs[name] = subprocess.Popen([sys.executable, "-m", "grader", "check", str(path), "--json-out",
                                        str(tmp / f"{name}.json"), *args], cwd=root, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
    outs = {name: p.communicate(timeout=wait_s) for name, p in procs.items()}
    return {name: (procs[name].returncode, *outs[name], json.loads((tmp / f"{name}.json").read_text()))
            for name in subs}


def scores(result: dict) -> dict[str, float]:
    """``{cell: score}`` of one graded notebook's automatically graded cells (the written answers,
    ``mode`` "manual", are the instructor's)."""
    return {c["cell"]: c["score"] for c in result["cells"] if c.get("mode") != "manual"}


def messages(result: dict) -> str:
    """Every cell's feedback message, named by its cell, on one line."""
    return " | ".join(f"{c['cell']}: {c.get('message', '')}" for c in result["cells"] if c.get("message"))


def assert_release_clean(assignment: str, release: Path, source: Path, markers: tuple[str, ...],
                         expected_points: dict) -> None:
    """The released notebook is what ``python -m grader release`` writes now, shows none of
    ``markers``, grades ``expected_points``, and leaks no solution or hidden-test line; every
    source cell has a grade_id."""
    from grader.release import released_text

    text = released_text(assignment)
    assert text == release.read_text(), "notebooks/ is stale: run python -m grader release"
    for marker in markers:
        assert marker not in text
    nb = json.loads(text)
    assert points(nb) == expected_points
    source_nb = json.loads(source.read_text())
    assert all(gid(c) for c in source_nb["cells"]), "every source cell needs a grade_id (deleted cells are restored by it)"
    leaked = leaked_lines(source_nb, nb)
    assert not leaked, f"solution or hidden-test lines in the release: {leaked[:5]}"


def run_source_cells(source: Path, cells):
    """Generator for a module fixture: the source notebook's cells named in ``cells``, solutions
    included, executed in one namespace with one torch thread (two notebooks' threads spinning on two
    shared cores slow each other tenfold at random); yields the namespace, then restores the thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g: dict = {"__name__": "__main__"}
    try:
        for c in json.loads(Path(source).read_text())["cells"]:
            if gid(c) in cells:
                exec(compile(src(c), gid(c), "exec"), g)  # noqa: S102
        yield g
    finally:
        torch.set_num_threads(threads)
