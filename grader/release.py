"""``python -m grader release [--check]``: ``grader/source/`` -> ``notebooks/``.

nbgrader's ``generate_assignment`` strips solutions and hidden tests, locks cells and adds
checksums; it runs on a temporary course copy (with a throw-away gradebook), so a release
writes nothing but ``notebooks/<assignment>.ipynb``. The output is deterministic (same source,
same bytes): nbgrader keeps the source's cell ids, its checksums are hashes of the cell
contents, and the file is written with sorted keys and a final newline. ``--check``
compares the parsed notebooks, not the bytes, so a notebook saved by Jupyter with a
different indent is not reported stale; any difference in cells or metadata is.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from grader import NOTEBOOKS_DIR, SOURCE_DIR
from grader import course as C


def released_text(assignment: str, source_dir: Path = SOURCE_DIR) -> str:
    """The released notebook of ``assignment`` as the exact text written to notebooks/."""
    work = Path(tempfile.mkdtemp(prefix="gpulab-release-"))
    try:
        root = C.make_course(work, assignment, source_dir)
        nb = json.loads(C.released_path(root, assignment).read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for cell in nb["cells"]:  # no outputs, no execution counts, ever
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def release(check: bool = False, source_dir: Path = SOURCE_DIR, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """Write (or with ``check`` compare) every released notebook; returns the problems.

    Problems, one line each: a notebook that is missing or differs from a fresh release, or
    a notebook in notebooks/ with no source. Writing returns the files written."""
    names = C.assignments(source_dir)
    if not names:
        raise C.CourseError(f"no assignments in {source_dir}")
    out = []
    for a in names:
        text = released_text(a, source_dir)
        dest = notebooks_dir / f"{a}.ipynb"
        if not check:
            notebooks_dir.mkdir(parents=True, exist_ok=True)
            if not dest.is_file() or dest.read_text() != text:
                dest.write_text(text)
                out.append(f"wrote {dest}")
            continue
        if not dest.is_file():
            out.append(f"{dest} is missing: run `python -m grader release`")
        else:
            try:
                same = json.loads(dest.read_text()) == json.loads(text)
            except json.JSONDecodeError:
                same = False
            if not same:
                out.append(f"{dest} is out of date with {source_dir / a}: run `python -m grader release`")
    if check and notebooks_dir.is_dir():
        for nb in sorted(notebooks_dir.glob("*.ipynb")):
            if nb.stem not in names:
                out.append(f"{nb} has no source in {source_dir} (delete it, or add grader/source/{nb.stem}/)")
    return out


def reference_submission(assignment: str, source_dir: Path = SOURCE_DIR, notebooks_dir: Path = NOTEBOOKS_DIR) -> dict:
    """The released notebook with the source's answers typed into its answer cells: what a
    learner who got everything right submits. Tests and the GPU check grade it."""
    released = json.loads((notebooks_dir / f"{assignment}.ipynb").read_text())
    source = json.loads((source_dir / assignment / f"{assignment}.ipynb").read_text())

    def gid(cell: dict):
        return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")

    answers = {gid(c): c["source"] for c in source["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    for cell in released["cells"]:
        if gid(cell) in answers:
            cell["source"] = answers[gid(cell)]
    return released
