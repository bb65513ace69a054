"""Every lab's reference solution, graded in smoke mode while a real busy process keeps one core
spinning (tests/busy.py): full marks, every measured cell measured live, and the cell time limit
chosen from the machine's measured speed and load (no ``--timeout``), stated in the result.

One lab at a time (``python -m grader check``, as a learner runs it), so that the load is the one
busy process, not the other labs. The grade is the session's one grade of each reference
(``graded_reference`` in tests/conftest.py): the labs' own tests read it too. The busy process is
checked to have run: it used CPU for at least a tenth of each lab's grading (a loose bound: it spins all along, beside whatever else runs).
The six took 450 s and, beside other jobs, 614 s on the 2-core machine of
benchmarks/RESULTS.md#grading-under-load (``pytest tests/grader/test_under_load.py``, 2026-12-02).
"""
from __future__ import annotations

import pytest

from tests.nbcells import messages

LABS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving", "04_benchmarking_production",
        "05_hardware_and_cost")

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("lab", LABS)
def test_reference_scores_full_marks_beside_a_busy_core(lab, graded_reference):
    from grader.course import SMOKE_TIMEOUT_S

    g = graded_reference(lab)
    res = g["result"]
    assert g["rc"] == 0, g["out"] + g["err"]
    assert res["status"] == "ok" or res["status"].startswith("graded;"), res["status"]
    assert res["cells"] and res["score"] == res["auto_max_score"], messages(res)
    auto = [c for c in res["cells"] if c["mode"] != "manual"]  # the written answers are the instructor's
    assert all(c["score"] == c["points"] for c in auto), messages(res)
    assert all(c["mode"] in ("measured live", "-") for c in auto), res["cells"]
    assert res["timeout_s"] >= SMOKE_TIMEOUT_S and "calibration loop" in res["timeout_why"], res["timeout_why"]
    assert "per-cell time limit" in g["out"]
    # it spun throughout (a loose bound: other work on the machine takes its share of the cores too)
    assert g["busy_alive"] and g["spun_s"] >= 0.1 * g["wall_s"], \
        f"the busy process ran {g['spun_s']:.0f} s of {g['wall_s']:.0f} s"
