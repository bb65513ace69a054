"""The table of every graded cell (docs/graded-cells.md) held to the source notebooks.

The table test parses docs/graded-cells.md and fails when a graded cell of a source notebook
has no row, a row's points differ from the notebook's, a row names a cell the notebook does not
grade, or a row names a test that does not exist: the table cannot go stale. The checker itself
is shown finding each of those on an edited copy of the doc and on a made-up lab.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from tests.nbcells import gid

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "graded-cells.md"
SOURCES = sorted((ROOT / "grader" / "source").glob("*/*.ipynb"))


# -- the table of graded cells ----------------------------------------------------------------------

ROW = re.compile(r"^\|\s*`(?P<cell>\w+)`\s*\((?P<points>\d+(?:\.\d+)?) points?\)\s*\|(?P<rest>.*)\|\s*$")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
MANUAL = "manual (rubric)"


def graded_cells(nb: dict) -> dict[str, dict]:
    """``{grade_id: {"points", "manual"}}`` of a notebook's graded cells; manual ones are the
    answer cells an instructor grades with a rubric (nbgrader ``solution`` and ``grade``)."""
    out = {}
    for c in nb["cells"]:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            out[gid(c)] = {"points": float(meta.get("points", 0)), "manual": bool(meta.get("solution"))}
    return out


def table_rows(text: str) -> dict[str, dict[str, dict]]:
    """``{assignment: {grade_id: {"points", "columns"}}}`` from the doc: one section per lab,
    its heading naming the assignment in backticks, one table row per graded cell."""
    rows: dict[str, dict[str, dict]] = {}
    lab = None
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.search(r"`(\d\d_\w+)`", line)
            lab = m.group(1) if m else None
            if lab:
                rows.setdefault(lab, {})
        elif lab and (m := ROW.match(line)):
            rows[lab][m["cell"]] = {"points": float(m["points"]),
                                    "columns": [c.strip() for c in m["rest"].split("|")]}
    return rows


def defined_tests(path: Path) -> set[str]:
    """Names of the module-level functions of a test file."""
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def table_problems(text: str, notebooks: dict[str, dict]) -> list[str]:
    """What is wrong with the table ``text`` against ``notebooks`` (``{assignment: notebook}``):
    a graded cell without a row or with other points, a row for a cell that is not graded, a
    manual cell not marked as such, an automatic cell with no test, a test that does not exist."""
    rows, problems = table_rows(text), []
    for lab, nb in notebooks.items():
        cells, have = graded_cells(nb), rows.get(lab)
        if have is None:
            problems.append(f"{lab}: no section")
            continue
        for cid, meta in cells.items():
            row = have.get(cid)
            if row is None:
                problems.append(f"{lab} {cid}: no row")
                continue
            if row["points"] != meta["points"]:
                problems.append(f"{lab} {cid}: {row['points']:g} points in the table, {meta['points']:g} in the notebook")
            if len(row["columns"]) != 3:
                problems.append(f"{lab} {cid}: {len(row['columns']) + 1} columns, not 4")
                continue
            checks_col, _, tests_col = row["columns"]
            refs = TEST_REF.findall(tests_col)
            if meta["manual"] and not checks_col.startswith(MANUAL):
                problems.append(f"{lab} {cid}: a manually graded cell, but its row does not say {MANUAL!r}")
            if not meta["manual"] and checks_col.startswith(MANUAL):
                problems.append(f"{lab} {cid}: graded automatically, but its row says {MANUAL!r}")
            if not refs and not (meta["manual"] and tests_col == "manual"):
                problems.append(f"{lab} {cid}: names no test" + (" (write 'manual' if none)" if meta["manual"] else ""))
            for file, name in refs:
                path = ROOT / file
                if not path.is_file():
                    problems.append(f"{lab} {cid}: {file} does not exist")
                elif name not in defined_tests(path):
                    problems.append(f"{lab} {cid}: {file} defines no {name}")
        problems += [f"{lab} {cid}: a row, but the notebook grades no such cell" for cid in have if cid not in cells]
    problems += [f"{lab}: a section for a lab that has no source notebook" for lab in rows if lab not in notebooks]
    return problems


def source_notebooks() -> dict[str, dict]:
    """``{assignment: notebook}`` of every source notebook."""
    return {p.stem: json.loads(p.read_text()) for p in SOURCES}


def test_the_table_has_every_graded_cell_with_its_points_and_existing_tests():
    """docs/graded-cells.md against the source notebooks as they are now: every graded cell of
    every lab has its row and points, manual cells are marked, and every test named exists."""
    nbs = source_notebooks()
    assert len(nbs) == 6 and sum(len(graded_cells(nb)) for nb in nbs.values()) >= 44
    problems = table_problems(DOC.read_text(), nbs)
    assert not problems, "docs/graded-cells.md is out of date:\n" + "\n".join(problems)


def test_the_table_check_finds_a_missing_row_wrong_points_and_a_test_that_does_not_exist():
    """The checker above, on the doc with one row dropped, one row's points changed and one test
    renamed to one that does not exist: it reports each, naming the cell."""
    nbs = source_notebooks()
    text = DOC.read_text()
    lines = text.splitlines()
    row_of = {m["cell"]: i for i, line in enumerate(lines) if (m := ROW.match(line))}
    assert {"test_intensity", "test_percentile", "test_speedup"} <= set(row_of)
    lines[row_of["test_percentile"]] = ""  # lab 04's percentile cell loses its row
    lines[row_of["test_speedup"]] = lines[row_of["test_speedup"]].replace("(1 point)", "(3 points)", 1)
    lines[row_of["test_intensity"]] = re.sub(r"::(\w+)`", r"::\1_renamed`", lines[row_of["test_intensity"]])
    problems = table_problems("\n".join(lines), nbs)
    assert "04_benchmarking_production test_percentile: no row" in problems
    assert "05_hardware_and_cost test_speedup: 3 points in the table, 1 in the notebook" in problems
    assert any(p.startswith("00_foundations test_intensity:") and "_renamed" in p for p in problems), problems


def test_the_table_check_holds_manual_cells_to_their_own_rule():
    """A manually graded cell (nbgrader ``solution`` and ``grade``) needs a row saying
    "manual (rubric)" and names its number check's test or "manual"; an automatic cell may not
    say "manual (rubric)" and must name a test. Checked on a made-up lab, whose wrong rows the
    real labs' table cannot hold."""
    def graded(cid, points, manual):
        return {"cell_type": "markdown", "source": "", "metadata": {"nbgrader": {
            "grade": True, "solution": manual, "grade_id": cid, "points": points}}}

    nbs = {"99_made_up": {"cells": [graded("why_answer", 3, True), graded("test_sum", 1, False),
                                    graded("plan_answer", 2, True)]}}
    head = "## Lab 99 (`99_made_up`)\n\n| cell | what it checks | what a wrong answer looks like | test |\n|---|---|---|---|\n"
    ok = head + ("| `why_answer` (3 points) | manual (rubric): why the step is slow | a guess | manual |\n"
                 "| `test_sum` (1 point) | a sum | off by one | `tests/grader/test_graded_cells.py::test_the_table_check_finds_a_missing_row_wrong_points_and_a_test_that_does_not_exist` |\n"
                 "| `plan_answer` (2 points) | manual (rubric): the plan, its numbers checked | none | "
                 "`tests/grader/test_graded_cells.py::test_the_table_check_holds_manual_cells_to_their_own_rule` |\n")
    assert table_problems(ok, nbs) == []
    bad = head + ("| `why_answer` (3 points) | why the step is slow | a guess | manual |\n"
                  "| `test_sum` (1 point) | manual (rubric): a sum | off by one | manual |\n"
                  "| `plan_answer` (2 points) | manual (rubric): the plan | none | none yet |\n")
    assert table_problems(bad, nbs) == [
        "99_made_up why_answer: a manually graded cell, but its row does not say 'manual (rubric)'",
        "99_made_up test_sum: graded automatically, but its row says 'manual (rubric)'",
        "99_made_up test_sum: names no test",
        "99_made_up plan_answer: names no test (write 'manual' if none)",
    ]
