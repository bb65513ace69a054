"""benchmarks/memory_by_cell.py: nvidia-smi's memory readings joined to nbclient's cell times."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "memory_by_cell.py"
spec = importlib.util.spec_from_file_location("memory_by_cell", SCRIPT)
mbc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mbc)


def _notebook(tmp_path: Path, cells: list[tuple[str, str, str]]) -> Path:
    nb = nbformat.v4.new_notebook()
    for cid, start, end in cells:
        c = nbformat.v4.new_code_cell("pass")
        c.id = cid
        c.metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
        nb.cells.append(c)
    nb.cells.append(nbformat.v4.new_markdown_cell("never executed"))
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, path)
    return path


def test_each_cell_gets_the_highest_reading_while_it_ran(tmp_path):
    nb = _notebook(tmp_path, [("setup", "2026-12-04T10:00:01.000000Z", "2026-12-04T10:00:02.000000Z"),
                              ("train", "2026-12-04T10:00:02.000000Z", "2026-12-04T10:00:04.000000Z"),
                              ("test_train", "2026-12-04T10:00:04.000000Z", "2026-12-04T10:00:05.000000Z")])
    # one reading every 0.5 s from 10:00:00: 0-1 s before the kernel, the train cell's rise, then the grader's after
    readings = [4, 4, 300, 310, 900, "[N/A]", 2500, 2600, 2600, 1200, 700, 800]
    samples = tmp_path / "mem.txt"
    samples.write_text("\n".join(map(str, readings)) + "\n")
    out = tmp_path / "cells.json"
    assert mbc.main([str(nb), str(samples), "--start", "2026-12-04T10:00:00.000000000Z", "--json", str(out)]) == 0
    rows = {r["cell"]: r["peak_mib"] for r in json.loads(out.read_text())["rows"]}
    assert rows == {"before the first cell": 300, "setup": 900, "train": 2600, "test_train": 2600,
                    "after the last cell": 800}
    # --end spreads the readings evenly: 12 readings over 12 s are 1 s apart, so the train cell (2-4 s) sees 300..900
    assert mbc.main([str(nb), str(samples), "--start", "2026-12-04T10:00:00Z", "--end", "2026-12-04T10:00:12Z",
                     "--json", str(out)]) == 0
    rows = {r["cell"]: r["peak_mib"] for r in json.loads(out.read_text())["rows"]}
    assert rows["train"] == 900 and rows["after the last cell"] == 2600


def test_the_printout_names_where_the_device_first_reached_its_highest(tmp_path, capsys):
    nb = _notebook(tmp_path, [("a", "2026-12-04T10:00:00Z", "2026-12-04T10:00:01Z"),
                              ("b", "2026-12-04T10:00:01Z", "2026-12-04T10:00:02Z")])
    (tmp_path / "mem.txt").write_text("10\n5000\n5000\n5000\n")
    assert mbc.main([str(nb), str(tmp_path / "mem.txt"), "--start", "2026-12-04T10:00:00Z"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "first reached here" in x]
    assert len(lines) == 1 and lines[0].startswith("a ")


@pytest.mark.parametrize("case, message", [
    ("no notebook", "cannot read the notebook"),
    ("not json", "is not a notebook"),
    ("no times", "has no cell execution times"),
    ("no readings", "holds no memory readings"),
    ("bad start", "is not an ISO 8601 time"),
    ("local start", "has no time zone"),
    ("end before start", "--end must come after --start"),
    ("start a day late", "no reading falls inside any cell"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, message):
    nb = _notebook(tmp_path, [("a", "2026-12-04T10:00:00Z", "2026-12-04T10:00:01Z")])
    samples = tmp_path / "mem.txt"
    samples.write_text("10\n20\n")
    start, extra = "2026-12-04T10:00:00Z", []
    if case == "no notebook":
        nb = tmp_path / "missing.ipynb"
    elif case == "not json":
        nb.write_text("{not json")
    elif case == "no times":
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), nb)
    elif case == "no readings":
        samples.write_text("[N/A]\n\n")
    elif case == "bad start":
        start = "yesterday"
    elif case == "local start":
        start = "2026-12-04T10:00:00"
    elif case == "end before start":
        extra = ["--end", "2026-12-04T09:00:00Z"]
    elif case == "start a day late":
        start = "2026-12-05T10:00:00Z"
    r = subprocess.run([sys.executable, str(SCRIPT), str(nb), str(samples), "--start", start, *extra],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr
