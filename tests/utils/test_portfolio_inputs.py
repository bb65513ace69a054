"""``python -m utils.portfolio RECORD`` (and ``python -m grader report RECORD``): a README from
the measurement record alone, ``utils/portfolio_inputs.py``'s ``load``.

Rendered for the same records as tests/utils/test_portfolio.py (the smoke records of
tests/data/records/ and the GPU records under benchmarks/results/) and held to the same rule:
every number in the README is the record's as ``num`` prints it (``invented``). Given a record,
the lab is the one its measurements name, the notebook beside it gives the answers (the README
is then the one the notebook gives), and without one the answers are those the record holds.
Bad input is one line and exit status 2, from this module and from ``python -m grader report``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.test_portfolio import CASES, IDS, LINK, PNG_MAGIC, SMOKE_RECORDS, invented, reference_notebook
from utils import portfolio
from utils.portfolio_answers import STRING_ANSWERS, recorded

ROOT = Path(__file__).resolve().parents[2]
NO_NOTEBOOK = {"cells": []}  # the README of a record alone quotes nothing from a notebook
ALONE = "No notebook beside the record, so only the answers the record holds are shown"


@pytest.fixture(scope="module")
def from_records(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """``{case id: (README text, its folder)}``, each written from the record's path alone."""
    out = {}
    for (_, record), cid in zip(CASES, IDS, strict=True):
        folder = tmp_path_factory.mktemp(cid.replace("/", "_"))
        out[cid] = (portfolio.build(record, folder).read_text(), folder)
    return out


@pytest.mark.parametrize(("lab", "record"), CASES, ids=IDS)
def test_a_record_alone_makes_the_readme(from_records, lab, record):
    readme, folder = from_records[IDS[CASES.index((lab, record))]]
    data = json.loads(record.read_text())
    bad = invented(readme, data, NO_NOTEBOOK)
    assert not bad, f"{len(bad)} numbers not from the record: {bad[:8]}"
    assert f"Lab `{lab}` of the GPU Utilization Roadmap" in readme, "the lab is the one the record's names make"
    for name, m in data["measurements"].items():
        assert f"| {name} | {portfolio.num(m['value'])} | {m['unit']} |" in readme
    assert (portfolio.SMOKE_LINE in readme) == (data["fingerprint"].get("kind") != "gpu")
    links = LINK.findall(readme)
    assert links, f"{lab}: the record has data for a plot"
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(links)
    assert all((folder / link).read_bytes()[:8] == PNG_MAGIC for link in links)
    assert ALONE in readme
    extras = {k: m["extra"] for k, m in data["measurements"].items()}
    for name in STRING_ANSWERS[lab]:
        assert (f"- `{name}` as the run recorded it: " in readme) == (recorded(name, extras) is not None), name


def test_the_smoke_file_name_alone_makes_a_smoke_readme(tmp_path):
    """A record named ``<assignment>.smoke.record.json`` is a smoke record, in one line at the top."""
    gpu = next(p for _, p in CASES if p.name == "00_foundations.record.json" and "benchmarks" in p.parts)
    smoke = tmp_path / "00_foundations.smoke.record.json"
    shutil.copy(gpu, smoke)
    readme = portfolio.build(smoke, tmp_path / "out").read_text()
    assert readme.splitlines()[2] == portfolio.SMOKE_LINE and readme.count(portfolio.SMOKE_LINE) == 1
    assert portfolio.SMOKE_LINE not in portfolio.build(gpu, tmp_path / "gpu").read_text()


@pytest.mark.parametrize("lab", ["00_foundations", "04_benchmarking_production"])
def test_the_notebook_beside_the_record_gives_the_answers(tmp_path, lab):
    """Given the record with the notebook beside it, the README is the one the notebook gives."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SMOKE_RECORDS[lab], work / f"{lab}.smoke.record.json")
    (work / f"{lab}.ipynb").write_text(json.dumps(reference_notebook(lab)))
    from_record = portfolio.build(work / f"{lab}.smoke.record.json", tmp_path / "a").read_text()
    from_notebook = portfolio.build(work / f"{lab}.ipynb", tmp_path / "b").read_text()
    assert from_record == from_notebook
    assert ALONE not in from_record and f"the answers those of the notebook `{lab}.ipynb`" in from_record


def _run(capsys, *args: object) -> tuple[int, list[str]]:
    code = portfolio.main([str(a) for a in args])
    return code, capsys.readouterr().err.splitlines()


def test_bad_records_are_one_line(tmp_path, capsys):
    data = json.loads(SMOKE_RECORDS["00_foundations"].read_text())
    text = tmp_path / "notes.txt"
    text.write_text("tokens/s were good\n")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "other/1", "measurements": {}}))
    unknown = tmp_path / "unknown.record.json"
    unknown.write_text(json.dumps({**data, "measurements": {"fps": {"name": "fps", "value": 60.0, "unit": "1/s"}}}))
    mismatched = tmp_path / "mismatched"
    mismatched.mkdir()
    shutil.copy(SMOKE_RECORDS["01_single_gpu"], mismatched / "01_single_gpu.record.json")
    (mismatched / "01_single_gpu.ipynb").write_text(json.dumps(reference_notebook("00_foundations")))
    alone_nb = tmp_path / "alone" / "02_multi_gpu.ipynb"
    alone_nb.parent.mkdir()
    alone_nb.write_text(json.dumps(reference_notebook("02_multi_gpu")))
    cases = {
        "no measurement record at": (tmp_path / "missing.record.json",),
        "(a folder)": (tmp_path,),
        "is not valid JSON": (text,),
        "not a measurement record (expected schema": (other,),
        "a record of no lab of this course": (unknown,),
        "is already the record": (SMOKE_RECORDS["00_foundations"], "--record", SMOKE_RECORDS["00_foundations"]),
        "a record of lab 01_single_gpu": (mismatched / "01_single_gpu.record.json",),
        "no measurement record beside": (alone_nb,),
    }
    out = tmp_path / "out"
    for expect, args in cases.items():
        code, err = _run(capsys, *args, "--out", out)
        assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and expect in err[0], (expect, err)
        assert "Traceback" not in err[0]
    assert not out.exists(), "bad input writes nothing"


def test_grader_report_takes_a_record(tmp_path):
    """``python -m grader report`` (grader/__main__.py) runs this command line."""
    record = next(p for _, p in CASES if p.name == "02_multi_gpu.record.json" and "benchmarks" in p.parts)
    proc = subprocess.run([sys.executable, "-m", "grader", "report", str(record), "--out", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "README.md").is_file() and list((tmp_path / "site").glob("*.png"))
    proc = subprocess.run([sys.executable, "-m", "grader", "report", str(tmp_path / "none.record.json"), "--out",
                           str(tmp_path / "site2")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
