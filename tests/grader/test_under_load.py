"""Every lab's reference solution, graded in smoke mode while a real busy process keeps one core
spinning (tests/busy.py): full marks, every measured cell measured live, and the cell time limit
chosen from the machine's measured speed and load (no ``--timeout``), stated in the result.

One lab at a time (``python -m grader check``, as a learner runs it), so that the load is the one
busy process, not the other labs. The busy process is checked to have run: it used CPU for at
least a tenth of each lab's grading (a loose bound: it spins all along, beside whatever else runs).
The six took 450 s and, beside other jobs, 614 s on the 2-core machine of
benchmarks/RESULTS.md#grading-under-load (``pytest tests/grader/test_under_load.py``, 2026-12-02).
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.busy import busy_core, cpu_seconds
from tests.nbcells import check_each, messages

ROOT = Path(__file__).resolve().parents[2]
LABS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving", "04_benchmarking_production",
        "05_hardware_and_cost")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def busy():
    with busy_core() as proc:
        yield proc


@pytest.mark.parametrize("lab", LABS)
def test_reference_scores_full_marks_beside_a_busy_core(lab, busy, tmp_path):
    from grader.course import SMOKE_TIMEOUT_S
    from grader.release import reference_submission

    nb = reference_submission(lab)
    cpu0, t0 = cpu_seconds(busy), time.monotonic()
    rc, out, err, res = check_each(ROOT, {lab: nb}, tmp_path, wait_s=1800)[lab]
    wall, spun = time.monotonic() - t0, cpu_seconds(busy) - cpu0
    assert rc == 0, out + err
    assert res["status"] == "ok" or res["status"].startswith("graded;"), res["status"]
    assert res["cells"] and res["score"] == res["max_score"], messages(res)
    assert all(c["score"] == c["points"] for c in res["cells"]), messages(res)
    assert all(c["mode"] in ("measured live", "-") for c in res["cells"]), res["cells"]
    assert res["timeout_s"] >= SMOKE_TIMEOUT_S and "calibration loop" in res["timeout_why"], res["timeout_why"]
    assert "per-cell time limit" in out
    # it spun throughout (a loose bound: other work on the machine takes its share of the cores too)
    assert busy.poll() is None and spun >= 0.1 * wall, f"the busy process ran {spun:.0f} s of {wall:.0f} s"
