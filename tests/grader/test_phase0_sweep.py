"""Phase 0's matmul sweep, called as the hidden tests call it (``grader.phase(0)``): the reference
``quantization``, ``predict_slow`` and sweep of the source notebook run here (smoke mode), then
wrong answers, each built from what the mistake is: the tile and wave arithmetic done wrong,
the alignment rule in elements instead of bytes, another threshold, a lookup of the visible
examples; an invented or inconsistent sweep, a ``time_matmul`` that does not time the shape it
is given; and GPU records of the sweep, plausible, invented and edited. The notebook-level runs
(the reference at full marks, the release at 0, the records) are in tests/grader/test_phase0.py.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.grader.test_phase0 import gpu_record
from tests.nbcells import run_source_cells

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grader" / "source" / "00_foundations" / "00_foundations.ipynb"
CELLS = ("device", "roofline_functions", "sweep_setup", "quantization_answer", "sweep_answer")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ns():
    """The source notebook's cells the sweep needs, solutions included, run here; one torch thread
    (tests/grader/test_phase0_roofline.py says why)."""
    yield from run_source_cells(SOURCE, CELLS)


def sweep_args(g: dict, **change) -> list:
    names = ("time_matmul", "sweep_time", "sweep_tflops", "MAX_ACHIEVABLE_TFLOPS", "SWEEP_SHAPES", "SM_COUNT", "achieved_tflops")
    return [change.get(k, g[k]) for k in names]


# -- the arithmetic: quantization and predict_slow ------------------------------------------------

def test_the_reference_arithmetic_passes(phase, ns):
    phase(0).check_quantization(ns["quantization"], ns["predict_slow"])


def _tiles(m, n, tile=128):
    return math.ceil(m / tile) * math.ceil(n / tile)


def floor_waves(m, n, sm_count, tile=128):  # waves rounded down: the last, partial wave forgotten
    tiles = _tiles(m, n)
    waves = max(1, tiles // sm_count)
    return tiles, waves, m * n / (waves * sm_count * tile * tile)


def tile_only(m, n, sm_count, tile=128):  # tile quantization alone: idle SMs in the last wave not counted
    tiles = _tiles(m, n)
    return tiles, math.ceil(tiles / sm_count), m * n / (tiles * tile * tile)


def wave_only(m, n, sm_count, tile=128):  # wave quantization alone: the padded tiles counted as work
    tiles = _tiles(m, n)
    waves = math.ceil(tiles / sm_count)
    return tiles, waves, tiles / (waves * sm_count)


def right(m, n, sm_count, tile=128):
    tiles = _tiles(m, n)
    waves = math.ceil(tiles / sm_count)
    return tiles, waves, m * n / (waves * sm_count * tile * tile)


def slow_rule(aligned, threshold=0.8):
    def predict_slow(m, n, k, sm_count, dtype_bytes):
        return bool(not aligned(m, n, k, dtype_bytes) or right(m, n, sm_count)[2] < threshold)
    return predict_slow


BYTES = slow_rule(lambda m, n, k, b: all(d * b % 16 == 0 for d in (m, n, k)))


def visible_lookup(m, n, k, sm_count, dtype_bytes):  # answers the notebook's two examples and nothing else
    return m == 8193


@pytest.mark.parametrize("quantization, predict_slow, match", [
    (floor_waves, BYTES, r"quantization\(\d+, \d+, \d+\) gives \d+ tiles in \d+ waves"),
    (tile_only, BYTES, "useful fraction"),
    (wave_only, BYTES, "useful fraction"),
    (right, slow_rule(lambda m, n, k, b: all(d % 8 == 0 for d in (m, n, k))), r"predict_slow\(\d+, \d+, \d+, 80, 4\) = True, expected False"),
    (right, slow_rule(lambda m, n, k, b: True), r"predict_slow\(4096, 4096, 4100, 80, 2\)"),  # alignment forgotten
    (right, slow_rule(lambda m, n, k, b: all(d * b % 16 == 0 for d in (m, n))), r"predict_slow\(4096, 4096, 4100"),  # k forgotten
    (right, slow_rule(lambda m, n, k, b: all(d * b % 16 == 0 for d in (m, n, k)), 0.5), "expected True"),
    (right, slow_rule(lambda m, n, k, b: all(d * b % 16 == 0 for d in (m, n, k)), 0.9), "expected False"),
    (right, visible_lookup, "predict_slow"),
    (right, lambda m, n, k, s, b: int(BYTES(m, n, k, s, b)), "predict_slow"),  # 1 and 0, not True and False
    (lambda m, n, s, tile=128: right(m, n, s)[2], BYTES, r"must return \(tiles, waves, useful_fraction\)"),
])
def test_wrong_arithmetic_fails(phase, ns, quantization, predict_slow, match):
    with pytest.raises(AssertionError, match=match):
        phase(0).check_quantization(quantization, predict_slow)


def test_the_wrong_rules_pass_the_visible_examples_the_hidden_cases_catch():
    # each wrong rule above that agrees with the notebook's visible examples is still caught: the
    # hidden cases are where they differ (tests/grader/test_graded_cells.py checks the rows of this lab)
    from grader.phase0 import QUANT_CASES

    for m in (128 * 132, 128 * 133):  # the visible examples: 132 SMs, an output one tile wide
        assert wave_only(m, 128, 132) == right(m, 128, 132)
    assert visible_lookup(8193, 8192, 8192, 132, 2) and not visible_lookup(8192, 8192, 8192, 132, 2)
    assert all(sms != 132 for *_, sms, _ in QUANT_CASES)  # no hidden case is on the visible examples' card


# -- the sweep, measured live ------------------------------------------------------------------

def test_the_reference_sweep_passes(phase, ns, capsys):
    phase(0).check_sweep(*sweep_args(ns))
    out = capsys.readouterr().out
    assert "measured live" in out and "the best shape" in out and "time_matmul(320, 128, 256)" in out


def _rescaled(ns, label, factor):
    """``sweep_time`` with ``label``'s timing made ``factor`` times faster, and the rates that follow."""
    from utils.timing import TimingResult

    t = ns["sweep_time"][label]
    times = dict(ns["sweep_time"])
    times[label] = TimingResult.from_times([t.median_ms / factor] * 5, t.method)
    rates = {lab: ns["achieved_tflops"](2 * math.prod(ns["SWEEP_SHAPES"][lab]), r.median_ms) for lab, r in times.items()}
    return times, rates


def test_sweep_mistakes_fail(phase, ns):
    p0, g = phase(0), ns
    cases = {
        "the mean, not the best": (sweep_args(g, MAX_ACHIEVABLE_TFLOPS=sum(g["sweep_tflops"].values()) / 6), "MAX_ACHIEVABLE_TFLOPS"),
        "a rate not from its timing": (sweep_args(g, sweep_tflops={**g["sweep_tflops"], "square, odd": 2 * g["sweep_tflops"]["square, odd"]}),
                                       r"sweep_tflops\['square, odd'\]"),
        "the odd shape left out": (sweep_args(g, SWEEP_SHAPES={k: v for k, v in g["SWEEP_SHAPES"].items() if k != "square, odd"}),
                                   "SWEEP_SHAPES is not the setup cell's sweep"),
        "an H100's SM count on this device": (sweep_args(g, SM_COUNT=132), "SM_COUNT"),
    }
    for args, match in cases.values():
        with pytest.raises(AssertionError, match=match):
            p0.check_sweep(*args)


def test_an_invented_best_consistent_with_its_timings_fails_the_re_measurement(phase, ns):
    best = max(ns["sweep_tflops"], key=ns["sweep_tflops"].get)
    times, rates = _rescaled(ns, best, 20)  # the best shape's timing 20x faster than it ran
    with pytest.raises(AssertionError, match="MAX_ACHIEVABLE_TFLOPS = .* but the grader re-measured"):
        phase(0).check_sweep(*sweep_args(ns, sweep_time=times, sweep_tflops=rates, MAX_ACHIEVABLE_TFLOPS=max(rates.values())))


def test_an_impossible_best_fails_before_any_timing(phase, ns):
    best = max(ns["sweep_tflops"], key=ns["sweep_tflops"].get)
    times, rates = _rescaled(ns, best, 60 / ns["sweep_tflops"][best])  # 60 TFLOP/s on a CPU
    with pytest.raises(AssertionError, match="not physically possible"):
        phase(0).check_sweep(*sweep_args(ns, sweep_time=times, sweep_tflops=rates, MAX_ACHIEVABLE_TFLOPS=max(rates.values())))


def test_a_time_matmul_that_does_not_time_its_shape_fails(phase, ns):
    import torch

    from utils import timing

    a = torch.randn(64, 64)

    def fixed_size(m, n, k):  # times a 64^3 matmul whatever it is asked
        return timing.benchmark(lambda: a @ a, max_runs=30)

    def made_up(m, n, k):  # a result with no run behind it
        return timing.TimingResult.from_times([1e-4] * 5, "perf_counter")

    for fn in (fixed_size, made_up):
        with pytest.raises(AssertionError, match=r"time_matmul\(\d+, \d+, \d+\) as TFLOP/s"):
            phase(0).check_sweep(*sweep_args(ns, time_matmul=fn))


def test_a_time_matmul_that_raises_is_one_line(phase, ns):
    def broken(m, n, k):
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(AssertionError, match=r"time_matmul\(.*\) raised RuntimeError: CUDA out of memory"):
        phase(0).check_sweep(*sweep_args(ns, time_matmul=broken))


# -- from a GPU record ----------------------------------------------------------------------------

def test_a_plausible_recorded_sweep_passes(phase, capsys):
    phase(0, record=gpu_record()).check_sweep(*([None] * 6), lambda f, ms: f / ms / 1e9)
    out = capsys.readouterr().out
    assert "graded from record" in out and "sweep of 6 shapes on 132 SMs, best 700 TFLOP/s" in out


def _edited(**how) -> dict:
    rec = gpu_record()
    m = rec["measurements"]["sweep_max_tflops"]
    for key, value in how.items():
        if key == "row_median":
            m["extra"]["rows"]["square, odd"].update(median_ms=value, p20_ms=0.99 * value, p80_ms=1.01 * value)
        elif key == "value":
            m["value"] = value
        else:
            m["extra"][key] = value
    return rec


@pytest.mark.parametrize("how, match", [  # records built in the test: the utils hash is the one the grader checks
    ({"invented": True}, "not physically possible"),
    ({"sm_count": 108}, "record sm_count 108, but the H100-SXM has 132 SMs"),
    ({"best": "square, odd"}, "record sweep best 'square, odd', but the fastest row is"),
    ({"value": 800.0}, "recorded MAX_ACHIEVABLE_TFLOPS vs the fastest row"),
    ({"row_median": 1.0}, "record sweep square, odd TFLOP/s vs its shape and median_ms"),
    ({"tier": "t4"}, "record sweep rows are not the shapes swept on 132 SMs"),
])
def test_an_invented_or_edited_recorded_sweep_fails(phase, how, match):
    rec = gpu_record(invented=True) if how.get("invented") else _edited(**how)
    with pytest.raises(AssertionError, match=match):
        phase(0, record=rec).check_sweep(*([None] * 6), lambda f, ms: f / ms / 1e9)


def test_the_learners_rate_function_runs_on_the_recorded_best(phase):
    with pytest.raises(AssertionError, match="your achieved_tflops on the recorded best shape"):
        phase(0, record=gpu_record()).check_sweep(*([None] * 6), lambda f, ms: f / ms / 1e6)  # GB/s, not TFLOP/s
