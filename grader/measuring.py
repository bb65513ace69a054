"""The grader's own measurements: each timed several times, its band from its own spread alone.

A lab's ``reference.py`` measures what its judges compare against with :func:`timed`, which runs
``utils.measure.timing.benchmark`` :data:`REPEATS` times and returns the median of the medians with the band
:func:`grader.expect.band` draws from the spread of those runs (and the slowdown the judge measured
on a loaded machine). Nothing the learner reports about their own spread enters a band.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from grader import expect
from utils.measure.timing import benchmark

REPEATS = 3  # the grader times each reference this many times: the band is 3x their spread
BUDGET_S = 1.0  # utils.measure.timing.benchmark's time budget per repeat


@dataclasses.dataclass(frozen=True)
class Measured:
    """One reference quantity: the grader's median over its runs, the band from their spread, and why."""

    value: float
    rel: float
    why: str = ""

    def against(self, value: float, name: str, unit: str) -> str:
        """The learner's ``value`` within this band of the grader's; the feedback line (Fail when not)."""
        return expect.in_band(value, self.value, self.rel, name, unit, self.why)


def timed(fn: Callable, *args, slowdown: float, smoke: bool, floor: float | None = None, warmup: int = 3,
          max_runs: int = 30, budget_s: float = BUDGET_S, repeats: int = REPEATS) -> tuple[float, float, str]:
    """``(median ms, band, why)`` of ``fn(*args)`` over ``repeats`` runs of ``utils.measure.timing.benchmark``: the
    median of their medians; the band from their spread (across runs, and each run's p20-p80 spread)."""
    runs = [benchmark(fn, *args, warmup=warmup, max_runs=max_runs, budget_s=budget_s) for _ in range(repeats)]
    medians = [r.median_ms for r in runs]
    within = [(r.p80_ms - r.p20_ms) / r.median_ms for r in runs if r.median_ms > 0]
    across = expect.spread(medians)
    rel = expect.band([across, *within], smoke, slowdown, floor)
    why = f"the grader's {repeats} runs spread {100 * across:.1f}%" + (
        f", widened x{slowdown:.2g} for load" if slowdown > 1 else "")
    return statistics.median(medians), rel, why


def measured(fn: Callable, *args, to_value: Callable[[float], float], **kwargs) -> Measured:
    """:func:`timed`, its median turned into the compared quantity (``to_value(ms)``: TFLOP/s, GB/s...)."""
    med, rel, why = timed(fn, *args, **kwargs)
    return Measured(to_value(med), rel, why)
