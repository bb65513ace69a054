"""The grader's noise handling (grader/remeasure.py, grader/checks.py): when its own measurement
is unusable or the machine is loaded, it measures again, widens the timing bands by the slowdown it
measured, or leaves the comparison out and says so; a learner's number 10x off still fails. Cell
timeouts scale with the machine's measured speed and load (grader/course.py), and a test cell that
fails after an earlier cell timed out says so (grader/worker.py).

The load a decision depends on is injected (:class:`FakeLoad`), so that no test here depends on how
busy the test machine is; the real probes are checked for their ranges only, and against a real
busy process in tests/grader/test_under_load.py. Fast: no kernels.
"""
from __future__ import annotations

import json
import math

import pytest

from grader import checks, remeasure


class Times:
    def __init__(self, median, p20, p80):
        self.median_ms, self.p20_ms, self.p80_ms = median, p20, p80


class FakeLoad:
    """A :class:`grader.remeasure.Load` whose window reports what the test says."""

    loaded_now, slowdown_now = False, 1.0

    def __init__(self):
        self.loaded, self.slowdown = FakeLoad.loaded_now, FakeLoad.slowdown_now

    def close(self):
        return self

    def describe(self):
        return "made-up load" if self.loaded else "made-up quiet machine"


def fake(loaded: bool, slowdown: float = 1.0):
    FakeLoad.loaded_now, FakeLoad.slowdown_now = loaded, slowdown
    return FakeLoad


@pytest.fixture(autouse=True)
def no_pause(monkeypatch):
    monkeypatch.setattr(checks, "NOISY_PAUSE_S", 0.0)


def comparing(yours: float, grader: list[float], smoke_mode: bool = False):
    """A compare() as the phases write it: the grader's number (one per attempt, the last one
    repeated) against the learner's, in a band from the grader's own spread."""
    calls = []

    def compare():
        ref = grader[min(len(calls), len(grader) - 1)]
        calls.append(ref)
        ok = isinstance(ref, float) and math.isfinite(ref) and ref > 0
        t = checks.mine(Times(1e3 / ref, 0.95e3 / ref, 1.05e3 / ref) if ok else Times(10.0, 9.9, 10.1))
        rel = checks.band(t, smoke_mode=smoke_mode)
        checks.assert_in_band(yours, ref, rel, "tokens_per_s", "tokens/s")
        checks.say_versus("training", ref, yours, "tokens/s", rel)
    return compare, calls


# -- the decision ---------------------------------------------------------------------------------

def test_ten_times_the_grader_on_a_quiet_machine_fails():
    compare, calls = comparing(1000.0, [100.0])
    with pytest.raises(AssertionError, match="but the grader re-measured 100 tokens/s"):
        checks.agree(compare, 3, load=fake(loaded=False))
    assert len(calls) == 3  # quiet misses: the attempts asked for, no more


def test_ten_times_the_grader_still_fails_on_a_loaded_machine():
    compare, calls = comparing(1000.0, [100.0])
    with pytest.raises(AssertionError, match=r"widened for load \(x4\): made-up load"):
        checks.agree(compare, 2, load=fake(loaded=True, slowdown=remeasure.MAX_SLOWDOWN))
    assert len(calls) == 2 + checks.NOISY_RETRIES  # bounded


def test_a_miss_under_load_is_measured_again_with_the_band_widened_by_the_slowdown(capsys):
    compare, calls = comparing(100.0, [45.0, 48.0])  # 2.2x the grader: outside +-35%, inside x1.35 x 2
    checks.agree(compare, 2, load=fake(loaded=True, slowdown=2.0))
    out = capsys.readouterr().out
    assert len(calls) == 2 and "widened for load (x2): made-up load" in out
    assert checks.band(Times(10, 9.9, 10.1), smoke_mode=False) == checks.GPU_BAND_FLOOR  # widening ends with agree()


def test_the_same_miss_on_a_quiet_machine_fails():
    compare, _ = comparing(100.0, [45.0, 48.0])
    with pytest.raises(AssertionError, match="accepted 35.56 to 64.8 "):
        checks.agree(compare, 2, load=fake(loaded=False))


def test_widening_is_capped_so_that_a_band_can_still_fail():
    checks._SLACK.update(factor=100.0, why="test")
    try:
        assert checks.band(Times(10, 9, 11), smoke_mode=True) == checks.LOAD_BAND_CAP[True]
        assert checks.band(Times(10, 9, 11), smoke_mode=False) == checks.LOAD_BAND_CAP[False]
    finally:
        checks._SLACK.update(factor=1.0, why="")
    assert checks.LOAD_BAND_CAP[True] + 1 < 10 and checks.LOAD_BAND_CAP[False] + 1 < 10


@pytest.mark.parametrize("bad", [0.0, -3.0, math.nan, math.inf, None])
def test_a_degenerate_grader_number_under_load_is_not_held_against_the_learner(bad, capsys):
    compare, calls = comparing(22.47, [bad])
    assert checks.agree(compare, 2, load=fake(loaded=True, slowdown=2.0)) is None
    out = capsys.readouterr().out
    assert "not compared, so not counted against you" in out and "came back" in out and "made-up load" in out
    assert len(calls) == 2 + checks.NOISY_RETRIES


def test_a_degenerate_grader_number_that_recovers_is_compared(capsys):
    compare, calls = comparing(22.47, [0.0, 20.0])
    checks.agree(compare, 2, load=fake(loaded=True))
    assert len(calls) == 2 and "grader 20 tokens/s, yours 22.47" in capsys.readouterr().out


def test_a_degenerate_grader_number_on_a_quiet_machine_fails():
    # a learner's made-up run that the engine cannot reproduce gives the grader 0 req/s: not excused
    compare, _ = comparing(22.47, [0.0])
    with pytest.raises(AssertionError, match=r"came back 0 tokens/s, in all 4 tries on a quiet machine"):
        checks.agree(compare, 2, load=fake(loaded=False))


def test_without_a_load_window_a_degenerate_number_is_the_machines(capsys):
    compare, _ = comparing(22.47, [0.0])  # checks.agree as phases 0 and 1 call it
    assert checks.agree(compare, 3) is None
    assert "not compared" in capsys.readouterr().out


def test_grader_runs_spread_wider_than_the_cap_get_the_widest_band_under_load_never_a_pass(capsys):
    def compare(yours):
        wild = checks.mine(Times(10.0, 1.0, 30.0))  # (30 - 1) / 10 = 290%: 3x that is beyond any cap

        def attempt():
            rel = checks.band(wild, smoke_mode=False)
            checks.assert_in_band(yours, 10.0, rel, "t", "ms")
            checks.say_versus("t", 10.0, yours, "ms", rel)
        return attempt

    checks.agree(compare(4.0), 2, load=fake(loaded=True, slowdown=1.5))  # x2.5: outside x2, inside x3
    out = capsys.readouterr().out
    assert "band +-200%; widened for load (the grader's own runs spread 290% around their median): made-up load" in out
    with pytest.raises(AssertionError, match="but the grader re-measured 10 ms"):  # 10x: outside even that
        checks.agree(compare(1.0), 2, load=fake(loaded=True, slowdown=1.5))
    checks.agree(compare(5.0), 2, load=fake(loaded=False))  # quiet: inside the usual capped band (x2)
    # quiet, but the grader's own runs cannot hold a band: its measurement is in doubt, not the answer
    checks.agree(compare(4.0), 2, load=fake(loaded=False))
    assert "band +-200%; widened: the grader's own runs spread 290% around their median" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="but the grader re-measured 10 ms"):  # 10x still fails
        checks.agree(compare(1.0), 2, load=fake(loaded=False))


def test_re_measurements_that_disagree_among_the_tries_widen_the_band_on_a_quiet_machine(capsys):
    refs = iter([5.5, 8.3, 8.7, 8.8, 9.0])  # one value drifting between tries, each try's runs tight

    def drifting(yours):
        def attempt():
            ref = next(refs)
            rel = checks.band(checks.mine(Times(ref, 0.99 * ref, 1.01 * ref)), smoke_mode=False)
            checks.assert_in_band(yours, ref, rel, "tpot", "ms")
            checks.say_versus("tpot", ref, yours, "ms", rel)
        return attempt

    checks.agree(drifting(3.0), 2, load=fake(loaded=False))  # 3.0 is outside 8.3 +-35%, inside x3 of 8.7
    out = capsys.readouterr().out
    assert "widened: the grader's own re-measurements of tpot ranged 5.5 to 8.3 ms over 2 tries" in out
    refs = iter([5.0, 5.1, 5.0, 5.1, 5.0])  # a reproducible re-measurement: a wrong answer stays wrong
    with pytest.raises(AssertionError, match="but the grader re-measured"):
        checks.agree(drifting(3.0), 2, load=fake(loaded=False))


def test_a_difference_of_medians_gets_the_spread_of_the_difference():
    t1, tn = Times(50.0, 47.5, 52.5), Times(100.0, 95.0, 105.0)  # 10% spread each
    assert checks.band(tn, t1, smoke_mode=False) == pytest.approx(0.35)  # 3 x 10% < the floor
    assert checks.difference_spread(tn, t1) == pytest.approx(0.3)  # (10 + 5) / 50
    assert checks.difference_band((tn, t1), smoke_mode=False) == pytest.approx(0.9)
    assert checks.difference_spread(t1, tn) == math.inf  # no positive difference
    assert checks.difference_band((t1, tn), smoke_mode=False) == pytest.approx(checks.GPU_BAND_FLOOR)


def test_a_learners_own_wide_spread_is_no_excuse():
    noisy_learner = Times(10.0, 1.0, 30.0)  # not the grader's: widens the band to its cap, no further
    with pytest.raises(AssertionError, match="but the grader re-measured"):
        checks.agree(lambda: checks.assert_in_band(100.0, 10.0, checks.band(noisy_learner, smoke_mode=False), "t", "ms"),
                     2, load=fake(loaded=False))


# -- the load probe -------------------------------------------------------------------------------

def _load(pressure, steal, share):
    w = remeasure.Load()
    w.pressure, w.steal, w.share = pressure, steal, share
    return w


@pytest.mark.parametrize("pressure, steal, share, loaded, slowdown", [
    (0.0, 0.0, 1.0, False, 1.0),
    (0.5, 0.0, 1.0, True, 2.0),  # some task waited half the window: a sequential job ran 2x slower at most
    (0.0, 0.1, 1.0, True, 1 / 0.9),
    (0.0, None, 0.5, True, 2.0),  # the probe got half a core
    (None, None, 1.0, False, 1.0),  # nothing to read here: quiet, as far as the grader can tell
    (1.0, 0.0, 0.01, True, remeasure.MAX_SLOWDOWN),
])
def test_load_decision_and_slowdown(pressure, steal, share, loaded, slowdown):
    w = _load(pressure, steal, share)
    assert w.loaded is loaded
    assert w.slowdown == pytest.approx(slowdown)
    assert "a probe got" in w.describe()


def test_the_real_probes_give_numbers_in_their_ranges():
    w = remeasure.Load().close()
    assert w.pressure is None or 0.0 <= w.pressure <= 1.0
    assert w.steal is None or 0.0 <= w.steal <= 1.0
    assert 0.0 < w.share <= 1.0 and 1.0 <= w.slowdown <= remeasure.MAX_SLOWDOWN
    sp = remeasure.machine_speed(repeats=1)
    assert sp["loop_s"] > 0 and sp["cores"] >= 1
    assert sp["others"] is None or 0.0 <= sp["others"] <= sp["cores"] + 0.5  # clock-tick resolution


# -- cell timeouts --------------------------------------------------------------------------------

REFERENCE = {"loop_s": remeasure.REFERENCE_LOOP_S, "others": 0.0, "cores": 2}


@pytest.mark.parametrize("speed, jobs, factor", [
    (REFERENCE, 1, 1.0),
    (REFERENCE, 2, 1.0),  # the smoke defaults were set for --jobs 2 on two cores
    (dict(REFERENCE, others=1.0), 1, 2.0),  # one of two cores busy with other work
    (dict(REFERENCE, loop_s=3 * remeasure.REFERENCE_LOOP_S), 1, 3.0),  # a core a third as fast
    (dict(REFERENCE, cores=1), 1, 2.0),
    (dict(REFERENCE, cores=2, others=None), 4, 2.0),
    (dict(REFERENCE, loop_s=1.0, others=1.9), 8, remeasure.MAX_TIMEOUT_FACTOR),
    (dict(REFERENCE, loop_s=0.5 * remeasure.REFERENCE_LOOP_S, cores=16), 1, 1.0),  # never below the default
])
def test_timeout_factor(speed, jobs, factor):
    got, why = remeasure.timeout_factor(speed, jobs)
    assert got == pytest.approx(factor)
    assert "calibration loop" in why and f"{jobs} job" in why


@pytest.fixture()
def machine(monkeypatch):
    """Make the machine the timeouts see one of two cores busy with other work."""
    from utils import env

    monkeypatch.setattr(remeasure, "machine_speed", lambda repeats=5: dict(REFERENCE, others=1.0))
    monkeypatch.setattr(env, "smoke_mode", lambda: True)
    monkeypatch.delenv("GPULAB_CELL_TIMEOUT", raising=False)


def test_the_smoke_timeout_scales_and_says_why(machine):
    from grader import course

    t = course.cell_timeout("00_foundations")
    assert t.seconds == 2 * course.SMOKE_TIMEOUT_S
    assert t.why.startswith(f"{t.seconds} s: the 60 s smoke default x2") and "1.0 of 2 cores busy" in t.why
    assert t.iopub_s == 2 * course.IOPUB_TIMEOUT_S and t.startup_s == 2 * course.STARTUP_TIMEOUT_S
    assert course.default_timeout_s("00_foundations") == t.seconds


def test_an_explicit_timeout_is_kept_as_given(machine, monkeypatch):
    from grader import course

    t = course.cell_timeout("00_foundations", override=20)
    assert t.seconds == 20 and "as --timeout gives" in t.why
    assert t.iopub_s == 2 * course.IOPUB_TIMEOUT_S  # the wait for a cell's last output still scales
    monkeypatch.setenv("GPULAB_CELL_TIMEOUT", "45")
    assert course.cell_timeout().seconds == 45 and "GPULAB_CELL_TIMEOUT" in course.cell_timeout().why
    assert course.cell_timeout(override=30).seconds == 30


@pytest.mark.parametrize("raw, match", [("soon", "is not a whole number"), ("-5", "must be positive")])
def test_a_bad_timeout_variable_is_one_clear_line(machine, monkeypatch, raw, match):
    from grader import course

    monkeypatch.setenv("GPULAB_CELL_TIMEOUT", raw)
    with pytest.raises(course.CourseError, match=match) as exc:
        course.cell_timeout()
    assert "\n" not in str(exc.value)


def test_the_gpu_timeout_is_not_scaled(machine, monkeypatch):
    from grader import course
    from utils import env

    monkeypatch.setattr(env, "smoke_mode", lambda: False)
    assert course.cell_timeout().seconds == course.GPU_TIMEOUT_S


# -- reporting a timeout --------------------------------------------------------------------------

def _code(gid: str | None, outputs: list, graded: bool = False) -> dict:
    md = {"nbgrader": {"grade_id": gid, "grade": graded, "points": 1 if graded else 0}} if gid else {}
    return {"cell_type": "code", "metadata": md, "source": f"# {gid}", "outputs": outputs}


TIMEOUT = {"output_type": "error", "ename": "CellTimeoutError", "evalue": "", "traceback": []}


def _name_error(name: str) -> dict:
    return {"output_type": "error", "ename": "NameError", "evalue": f"name '{name}' is not defined", "traceback": []}


def test_a_failure_after_a_timeout_says_that_an_earlier_cell_timed_out(tmp_path):
    from grader.worker import cell_reports

    nb = {"cells": [_code("early_test", [_name_error("X")], graded=True),
                    _code("breaks_answer", [{"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                             "traceback": []}, TIMEOUT]),
                    _code("test_breaks", [_name_error("BREAKS")], graded=True),
                    _code("test_timed", [TIMEOUT], graded=True),
                    _code("test_fine", [], graded=True)]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    rep = cell_reports(path, "120 s: the 60 s smoke default x2")
    assert rep["early_test"]["message"] == "NameError: name 'X' is not defined"  # before the timeout: the learner's
    assert rep["test_breaks"]["message"] == ("NameError: name 'BREAKS' is not defined [an earlier cell, 'breaks_answer', "
                                             "timed out (per-cell limit 120 s: the 60 s smoke default x2): what it "
                                             "defines may be missing]")
    assert rep["test_timed"]["message"] == "timed out (per-cell limit 120 s: the 60 s smoke default x2)"
    assert rep["test_fine"]["message"] == ""
