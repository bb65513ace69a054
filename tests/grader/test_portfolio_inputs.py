"""``python -m grader report``'s inputs: which lab, record and notebook a README is written from,
and the one line (exit status 2) when the input is wrong. Records are built in code
(``tests/portfolio_records.py``); the notebooks are copies of the released ones."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grader import portfolio
from tests import portfolio_records as R

ROOT = Path(__file__).resolve().parents[2]
V1_RECORD = ROOT / "benchmarks" / "results" / "h200-phase0-graded" / "2026-11-30" / "00_foundations.record.json"


@pytest.fixture
def lab00(tmp_path, monkeypatch) -> Path:
    """Lab 00's H200 record in a folder of its own."""
    return R.write("00_foundations", tmp_path / "lab" / "00_foundations.record.json", R.namespace("00_foundations"),
                   R.H200, monkeypatch)


def _run(capsys, *args: object) -> tuple[int, list[str]]:
    rc = portfolio.main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.err.strip().splitlines()


def test_bad_input_is_one_line(lab00, tmp_path, capsys):
    notebook = tmp_path / "00_foundations.ipynb"
    shutil.copy(ROOT / "notebooks" / "00_foundations.ipynb", notebook)
    out = tmp_path / "out"
    not_json = tmp_path / "x.record.json"
    not_json.write_text("{ not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/1"}))
    unknown = tmp_path / "unknown.record.json"
    unknown.write_text(json.dumps(dict(json.loads(lab00.read_text()), assignment="07_quantum")))
    lab01 = tmp_path / "01.record.json"
    lab01.write_text(json.dumps(dict(json.loads(lab00.read_text()), assignment="01_single_gpu")))
    cases = {
        tmp_path / "nothing.record.json": "no measurement record at",
        tmp_path: "(a folder): pass the <assignment>.record.json",
        not_json: "is not a measurement record (not JSON",
        other: "is not a measurement record of this course (schema gpulab.record/2)",
        V1_RECORD: "older version of the course (gpulab.record/1): run the notebook's last cell again",
        unknown: "'07_quantum', no lab of this course",
        notebook: "no measurement record beside",
    }
    for path, says in cases.items():
        rc, err = _run(capsys, path, "--out", out)
        assert rc == 2 and len(err) == 1 and says in err[0], (path, err)
    rc, err = _run(capsys, notebook, "--record", lab01, "--out", out)
    assert rc == 2 and err == [f"error: {lab01} is the record of lab 01_single_gpu, but 00_foundations.ipynb is lab "
                               "00_foundations"]
    rc, err = _run(capsys, lab00, "--record", lab00, "--out", out)
    assert rc == 2 and "--record goes with a notebook" in err[0]
    assert not out.exists()


def test_the_record_beside_the_notebook_gpu_before_smoke(lab00, tmp_path, monkeypatch):
    folder = lab00.parent
    shutil.copy(ROOT / "notebooks" / "00_foundations.ipynb", folder / "00_foundations.ipynb")
    R.write("00_foundations", folder / "00_foundations.smoke.record.json", R.namespace("00_foundations"), R.LAPTOP,
            monkeypatch)
    inp = portfolio.load(folder / "00_foundations.ipynb")
    assert inp.record_path == lab00 and inp.lab == "00_foundations" and inp.notebook == folder / "00_foundations.ipynb"
    lab00.unlink()
    assert portfolio.load(folder / "00_foundations.ipynb").record_path.name == "00_foundations.smoke.record.json"
    # given the record, the notebook beside it is found too, and titles the exercises
    inp = portfolio.load(folder / "00_foundations.smoke.record.json")
    assert inp.notebook == folder / "00_foundations.ipynb"
    assert inp.titles["test_matmul"] == "Exercise: the matmul, your compute ceiling"
    assert inp.title.startswith("Phase 0: Foundations")


def test_a_record_alone_takes_its_titles_from_the_released_notebook(lab00, tmp_path):
    inp = portfolio.load(lab00)
    assert inp.nb is None and inp.titles["test_sweep"] == "6. How a GPU runs a matmul: SMs, warps, tiles and waves"
    readme = portfolio.build(lab00, tmp_path / "out", here=R.H200).read_text()
    assert "no notebook beside it, so no written answers" in readme and "## My written answers" not in readme


def test_written_answers_are_quoted_under_their_titles(lab00, tmp_path):
    folder = lab00.parent
    nb = json.loads((ROOT / "notebooks" / "00_foundations.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "limiter_writeup")
    cell["source"] = "The fixed share is 12%, so the step is compute-bound.\n\nMFU says so too."
    (folder / "00_foundations.ipynb").write_text(json.dumps(nb))
    readme = portfolio.build(lab00, tmp_path / "out", here=R.H200).read_text()
    written = readme[readme.index("## My written answers"):]
    assert "### Write-up: what limits this step\n\n> The fixed share is 12%, so the step is compute-bound.\n>\n> MFU" in written
    todo = readme[readme.index("## Not yet done"):readme.index("## Results")]
    assert "- **Write-up: what your sweep shows about the GPU**: not written yet." in todo
    assert "what limits this step" not in todo


def test_grader_report_takes_a_notebook_and_its_record(lab00, tmp_path, capsys):
    from grader.__main__ import main

    shutil.copy(ROOT / "notebooks" / "00_foundations.ipynb", tmp_path / "mine.ipynb")
    assert main(["report", str(tmp_path / "mine.ipynb"), "--record", str(lab00), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "README.md").is_file()
