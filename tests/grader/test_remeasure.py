"""How loaded and how fast the machine is while the grader measures (grader/remeasure.py): the load
window's decision and the slowdown it measures (which the judges widen bands by: grader/judging.py),
and cell timeouts scaled with the machine's measured speed and load (grader/course.py).

The load a decision depends on is set on the window, so that no test here depends on how busy the
test machine is; the real probes are checked for their ranges only. Fast: no kernels.
"""
from __future__ import annotations

import pytest

from grader import remeasure

# -- the load window's decision ------------------------------------------------------------------

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
    from utils.course import env

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
    from utils.course import env

    monkeypatch.setattr(env, "smoke_mode", lambda: False)
    assert course.cell_timeout().seconds == course.GPU_TIMEOUT_S
