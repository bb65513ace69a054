"""``python -m grader report``: a lab's README from the measurement record its last cell wrote.

Records (``gpulab.record/2``) are built in code (``tests/portfolio_records.py``): a value of every
answer each lab declares, written by the notebook's own ``save_record`` with an H200's
fingerprint, so no notebook runs here. Checked: every lab renders a full record; a partly solved
lab renders what it has and lists the rest by the notebook's exercise titles, never by the
grader's cell ids; a record from another machine says so in one line; cuDNN reads as a version,
a fraction as a percentage, a plot title to three significant figures; overlapping plot labels
are moved apart; ``--help`` is the grader's own.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import labs, portfolio
from grader.portfolio.format import cudnn_version, num, percent, sig
from tests import portfolio_records as R

ROOT = Path(__file__).resolve().parents[2]
LABS = labs.assignments()
LINK = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# lab 00 as an H200 measured it (benchmarks/results/h200-phase0-graded), and a smoke run's
# measured roof, whose peak printed in full made the title "0.0939334 TFLOP/s peak"
LAB00 = dict(kernels={"matmul": (2730.7, 612.3), "thin_matmul": (31.9, 95.1), "elementwise": (0.25, 1.1),
                      "tiny_ops": (0.24, 0.9)},
             CEILINGS={"datasheet": (989.5, 4800.0), "measured": (0.0939334, 3.61)}, mfu=0.61693, fixed_share=0.1234)


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """``{lab: (record, README)}``: every lab's full H200 record and its README, read on a laptop."""
    base = tmp_path_factory.mktemp("full")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        for lab in LABS:
            ns = R.namespace(lab, **(LAB00 if lab == "00_foundations" else {}))
            out[lab] = R.write(lab, base / lab / f"{lab}.record.json", ns, R.H200, mp)
    return {lab: (p, portfolio.build(p, base / lab / "readme", here=R.LAPTOP).read_text()) for lab, p in out.items()}


def _grade_ids(lab: str) -> set[str]:
    return set(labs.load(lab).answers)


@pytest.mark.parametrize("lab", LABS)
def test_a_full_record_renders_every_answer_in_the_learners_terms(full, lab):
    path, readme = full[lab]
    data = json.loads(path.read_text())
    assert data["missing"] == {}, data["missing"]
    for cell, answers in data["answers"].items():
        for name in answers:
            assert f"`{name}`" in readme, (cell, name)
    assert not [g for g in _grade_ids(lab) if g in readme]  # exercises by title, never by cell id
    assert "## Not yet done" not in readme
    assert "| cuDNN | 9.19.0 |" in readme and "91,900" not in readme
    for link in LINK.findall(readme):
        assert (path.parent / "readme" / link).read_bytes()[:8] == PNG_MAGIC
    assert "internal" not in readme and "extras" not in readme


def test_lab00_numbers_read_as_a_learner_would(full):
    readme = full["00_foundations"][1]
    assert "| `mfu` | 61.7% |" in readme and "| `fixed_share` | 12.3% |" in readme
    assert "0.6169" not in readme
    assert "(0.0939 TFLOP/s, 3.61 GB/s)" in readme and "0.0939334" not in readme
    assert "![roofline](roofline.png)" in readme
    assert "| `matmul_time` | median " in readme and " ms, p20 " in readme  # the unit once, not "median_ms ... ms"


@pytest.mark.parametrize(("v", "text"), [(91900, "9.19.0"), (90100, "9.1.0"), (8902, "8.9.2"), (None, "-")])
def test_cudnn_reads_as_a_version(v, text):
    assert cudnn_version(v) == text


@pytest.mark.parametrize(("v", "text"), [(0.0939334, "0.0939"), (989.5, "990"), (4800.0, "4,800"), (3.61, "3.61"),
                                         (123456.7, "123,457"), (0.000012345, "1.23e-05")])
def test_titles_keep_three_significant_figures(v, text):
    assert sig(v) == text


def test_fractions_are_percentages_and_other_numbers_keep_four_digits():
    assert percent(0.61693) == "61.7%" and percent(1.0) == "100%" and percent(0.0004) == "0.0400%"
    assert num(0.61693) == "0.6169" and num(48246.8) == "48,247" and num({"__nonfinite__": "nan"}) == "not a number (NaN)"


def test_a_partly_solved_lab_shows_what_it_has_and_lists_the_rest(tmp_path, monkeypatch):
    ns = R.namespace("00_foundations", **LAB00)
    for name in ("matmul_tflops", "kernels", "LIMITER"):
        del ns[name]
    path = R.write("00_foundations", tmp_path / "00_foundations.record.json", ns, R.H200, monkeypatch)
    readme = portfolio.build(path, tmp_path / "out", here=R.LAPTOP).read_text()
    todo = readme[readme.index("## Not yet done"):readme.index("## Results")]
    assert "the answers of 3 of its 6 measured exercises" in todo
    assert "- **Exercise: the matmul, your compute ceiling**: `matmul_tflops` is not set yet." in todo
    assert "- **Exercise: tiny ops, a thin matmul, and two rooflines**: `kernels` is not set yet." in todo
    assert "- **5. What limits this training step?**: `LIMITER` is not set yet." in todo
    assert not [g for g in _grade_ids("00_foundations") if g in readme]
    results = readme[readme.index("## Results"):]
    assert "| `copy_gbs` |" in results and "| `matmul_time` |" in results and "| `mfu` | 61.7% |" in results
    assert "| `matmul_tflops` |" not in results
    assert "- Roofline: drawn once you finish *Exercise: tiny ops, a thin matmul, and two rooflines*." in readme
    assert not (tmp_path / "out" / "roofline.png").exists()


def test_the_notebook_beside_a_partial_record_adds_its_unanswered_exercises(tmp_path, monkeypatch):
    ns = R.namespace("01_single_gpu")
    del ns["CAUSE"]
    R.write("01_single_gpu", tmp_path / "01_single_gpu.record.json", ns, R.H200, monkeypatch)
    shutil.copy(ROOT / "notebooks" / "01_single_gpu.ipynb", tmp_path / "01_single_gpu.ipynb")  # the untouched release
    readme = portfolio.build(tmp_path / "01_single_gpu.ipynb", tmp_path / "out", here=R.LAPTOP).read_text()
    todo = readme[readme.index("## Not yet done"):readme.index("## Results")]
    assert "- **Exercise: find the cause yourself**: `CAUSE` is not set yet." in todo
    assert "- **Write-up: your before/after report**: not written yet." in todo
    assert "- **Exercise: your optimized loop**: not done yet." in todo
    assert "points" not in todo and "report_writeup" not in readme
    assert todo.index("optimized loop") < todo.index("before/after report") < todo.index("find the cause")


def test_a_record_with_no_answers_yet_still_renders(tmp_path, monkeypatch):
    path = R.write("03_inference_serving", tmp_path / "r.record.json", {}, R.LAPTOP, monkeypatch)
    readme = portfolio.build(path, tmp_path / "out", here=R.LAPTOP).read_text()
    assert "the answers of 0 of its 4 measured exercises" in readme
    assert "The record holds no answers yet" in readme


def _foreign(readme: str) -> list[str]:
    return [line for line in readme.splitlines() if "another machine" in line]


def test_a_record_from_another_machine_says_so_in_one_line(full, tmp_path, monkeypatch):
    path, readme = full["02_multi_gpu"]
    assert _foreign(readme) == ["**Measured on another machine:** this record comes from NVIDIA H200, not from this "
                                "machine (a CPU, Intel(R) Core(TM) i7-1185G7); every number shown is that machine's."]
    assert _foreign(portfolio.build(path, tmp_path / "same", here=R.H200).read_text()) == []
    other_h200 = dict(R.H200, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert len(_foreign(portfolio.build(path, tmp_path / "other", here=other_h200).read_text())) == 1
    smoke = R.write("02_multi_gpu", tmp_path / "s.smoke.record.json", R.namespace("02_multi_gpu"), R.LAPTOP, monkeypatch)
    readme = portfolio.build(smoke, tmp_path / "smoke", here=R.LAPTOP).read_text()
    assert _foreign(readme) == [] and portfolio.SMOKE_LINE in readme


def test_the_command_warns_on_this_cpu_machine(full, tmp_path, capsys):
    """No ``here`` given: this machine's own fingerprint (a CPU in CI) against the H200 record."""
    from grader.__main__ import main

    path = full["00_foundations"][0]
    assert main(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'out' / 'README.md'}"
    lines = _foreign((tmp_path / "out" / "README.md").read_text())
    assert len(lines) == 1 and "NVIDIA H200" in lines[0]


def test_overlapping_labels_are_moved_apart():
    import matplotlib

    matplotlib.use("Agg")
    from grader.portfolio.plots import declutter
    from utils import plots

    fig = plots.roofline(0.0939, 3.61, [("elementwise", 0.25, 0.0009), ("tiny_ops", 0.24, 0.00088),
                                        ("thin", 0.26, 0.00089)])
    declutter(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert not [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]


def test_report_help_is_the_graders():
    r = subprocess.run([sys.executable, "-m", "grader", "report", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: python -m grader report "), r.stdout[:200]
    assert "utils.portfolio" not in r.stdout
