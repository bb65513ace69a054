"""Phase 0's limiter check, called as the hidden test calls it (``grader.phase(0)``), on the
reference answers of the source notebook run here (smoke mode), and on wrong ones: "memory" given
as the default bucket where the step's counted bandwidth does not back it, the bandwidth in the
wrong unit, a step's bytes that are not the count, another card's memory ceiling; and on GPU
records of the limiter, edited. The notebook-level runs are in tests/grader/test_phase0.py.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.grader.test_phase0 import gpu_record
from tests.nbcells import run_source_cells

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grader" / "source" / "00_foundations" / "00_foundations.ipynb"
CELLS = ("device", "roofline_functions", "timing_demo", "matmul_answer", "memory_answer", "train_setup", "train_answer",
         "limiter_setup", "limiter_answer")
NAMES = ("LIMITER", "batch_scaling", "fixed_share", "step_tflops", "mfu", "full_time", "small_time", "train_step", "xb",
         "yb", "small_batch", "TRAIN_PEAK_TFLOPS", "STEP_BYTES", "step_gbs", "bandwidth_share", "TRAIN_PEAK_GBS")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ns():
    """The source notebook's cells up to the limiter, solutions included, run here; one torch
    thread (tests/grader/test_phase0_roofline.py says why)."""
    yield from run_source_cells(SOURCE, CELLS)


def call(p0, g: dict, **change) -> None:
    p0.check_limiter(*[change.get(k, g[k]) for k in NAMES])


def consistent(g: dict, full_ms: float, small_ms: float, **change) -> dict:
    """The learner's numbers, as the reference cell computes them, from made-up step times (and
    ``TRAIN_PEAK_GBS`` changed), the limiter left out."""
    from utils.timing import TimingResult

    h = {**g, **change}
    b, sb = h["SIZES"].batch_size, h["small_batch"]
    r = (b / full_ms) / (sb / small_ms)
    step_tflops = h["FLOPS_PER_TOKEN"] * h["TOKENS_PER_STEP"] / (full_ms * 1e-3) / 1e12
    step_gbs = h["STEP_BYTES"] / (full_ms * 1e-3) / 1e9
    return {**change, "full_time": TimingResult.from_times([full_ms] * 5, "perf_counter"),
            "small_time": TimingResult.from_times([small_ms] * 5, "perf_counter"), "batch_scaling": r,
            "fixed_share": (r - 1) / (b / sb - 1), "step_tflops": step_tflops, "mfu": step_tflops / h["TRAIN_PEAK_TFLOPS"],
            "step_gbs": step_gbs, "bandwidth_share": step_gbs / h["TRAIN_PEAK_GBS"]}


def test_the_reference_limiter_passes(phase, ns, capsys):
    call(phase(0), ns)
    assert "measured live" in capsys.readouterr().out


def test_memory_as_the_default_bucket_fails(phase, ns):
    # a step that scales with the batch (no fixed share), far below both ceilings: the old rule's
    # "memory" (MFU under 0.4, nothing measured) is not what the step's counted bandwidth says
    from utils.flops import step_bound

    nums = consistent(ns, 1e6, 0.5e6)  # a million ms: both shares near zero
    assert nums["fixed_share"] == 0 and nums["mfu"] < 0.4 and nums["bandwidth_share"] < 0.4
    assert step_bound(nums["fixed_share"], nums["mfu"], nums["bandwidth_share"]) == "overhead"
    with pytest.raises(AssertionError, match=r"LIMITER = 'memory', but your numbers .* give 'overhead'"):
        call(phase(0), ns, LIMITER="memory", **nums)


def test_memory_is_the_verdict_when_the_bandwidth_backs_it(phase, ns):
    # the same made-up times against a memory ceiling half the step's bandwidth: memory, and compute fails
    full_ms = 1e6
    nums = consistent(ns, full_ms, full_ms / 2, TRAIN_PEAK_GBS=ns["STEP_BYTES"] / (full_ms * 1e-3) / 1e9 / 2)
    with pytest.raises(AssertionError, match=r"LIMITER = 'compute', but your numbers .* give 'memory'"):
        call(phase(0), ns, LIMITER="compute", **nums)


@pytest.mark.parametrize("what, match", [
    ("GiB/s", r"step_gbs \(STEP_BYTES over full_time\)"),
    ("half the bytes", r"STEP_BYTES \(the bytes one step's operations read and write\)"),
    ("share of the compute peak", r"bandwidth_share \(step_gbs / TRAIN_PEAK_GBS\)"),
])
def test_wrong_bandwidth_arithmetic_fails(phase, ns, what, match):
    g = ns
    change = {"GiB/s": {"step_gbs": g["step_gbs"] * 1e9 / 2**30, "bandwidth_share": g["step_gbs"] * 1e9 / 2**30 / g["TRAIN_PEAK_GBS"]},
              "half the bytes": {"STEP_BYTES": g["STEP_BYTES"] // 2, "step_gbs": g["step_gbs"] / 2,
                                 "bandwidth_share": g["bandwidth_share"] / 2},
              "share of the compute peak": {"bandwidth_share": g["step_gbs"] / (g["TRAIN_PEAK_TFLOPS"] * 1e3)}}[what]
    with pytest.raises(AssertionError, match=match):
        call(phase(0), ns, **change)


def test_another_cards_memory_ceiling_on_this_cpu_fails_the_re_measurement(phase, ns):
    from utils.flops import step_bound

    share = ns["step_gbs"] / 3350.0  # an H100's datasheet bandwidth, with the share and limiter that follow
    limiter = step_bound(ns["fixed_share"], ns["mfu"], share)
    with pytest.raises(AssertionError, match="TRAIN_PEAK_GBS = .* but the grader re-measured"):
        call(phase(0), ns, TRAIN_PEAK_GBS=3350.0, bandwidth_share=share, LIMITER=limiter)


# -- from a GPU record ----------------------------------------------------------------------------

def edited(**how) -> dict:
    rec = copy.deepcopy(gpu_record())
    rec["measurements"]["train_mfu"]["extra"].update(how)
    return rec


def test_the_recorded_limiter_passes(phase, capsys):
    phase(0, record=gpu_record()).check_limiter(*([None] * len(NAMES)))
    assert "graded from record" in capsys.readouterr().out


@pytest.mark.parametrize("how, match", [  # records built in the test: the utils hash is the one the grader checks
    ({"limiter": "memory"}, r"recorded limiter 'memory' does not follow"),
    ({"step_bytes": 1e6, "step_gbs": 1e6 / 0.3 / 1e9, "bandwidth_share": 1e6 / 0.3 / 1e9 / 3350}, "less than one step must move"),
    ({"step_gbs": 1000.0}, "recorded step_gbs vs its step_bytes"),
    ({"peak_gbs": 4800.0, "bandwidth_share": 200.0 / 4800}, "not the H100-SXM datasheet bandwidth"),
])
def test_an_edited_recorded_limiter_fails(phase, how, match):
    with pytest.raises(AssertionError, match=match):
        phase(0, record=edited(**how)).check_limiter(*([None] * len(NAMES)))
