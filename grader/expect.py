"""What a judge says: the checks a lab's judges are written with, and the bands they compare in.

A judge (``grader/labs/<lab>/judges.py``) is a pure function of decoded answers and a reference. It
passes by returning (a list of feedback lines, or None) and fails by raising :class:`Fail` with a
message that says what was expected, what the answer gave, and the rule it broke. It never names a
hidden input: :func:`cases` reports how many hidden cases an answer got wrong and one expected and
given value, not the case itself. :class:`Unusable` is the grader's own measurement failing (zero,
not finite): never the learner's fault (docs/grading.md, "When the grader's own measurement is bad").

Bands come from the grader's own repeated runs only (:func:`band`): the spread the learner reports
never widens them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from grader.schema import UNENCODABLE

GPU_FLOOR = 0.15  # +-15% at least on a GPU: the grader's own runs seconds apart (docs/graded-cells.md, repeatability)
SMOKE_FLOOR = 1.5  # x2.5 either way on a CPU: the learner's run and the grader's share cores with other work
SPREAD_FACTOR = 3.0  # band = 3 x the grader's own relative spread, when wider than the floor
GPU_CAP = 1.0  # never wider than x2 either way on a GPU: a band must be able to fail
SMOKE_CAP = 3.0  # x4 either way on a CPU: 500 "TFLOP/s" from a CPU matmul still fails
LOAD_CAP = {True: 7.0, False: 2.0}  # widened for load: never wider than x8 in smoke mode, x3 on a GPU
DATASHEET_SLACK = 1.05  # a measurement may read 5% over a datasheet figure (rounding, boost); more is impossible


class Fail(AssertionError):
    """A judge's verdict against the answer: the message is the learner's feedback."""


class RuleFail(Fail):
    """A failure that is the answer's own (a wrong count, an inconsistent rate, a broken rule): measuring
    again cannot change it, so a measured cell that fails this way is not measured again."""


class Unusable(Fail):
    """The grader's own measurement cannot grade anything (zero, negative, not finite)."""


def number(value: Any, name: str) -> float:
    """A decoded answer is already a float; this guards judge arithmetic on optional fields."""
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RuleFail(f"{name} must be a finite number, got {value!r:.60}")
    return float(value)


def close(value: Any, want: float, name: str, rule: str = "", rel: float = 1e-6, abs_tol: float = 0.0) -> None:
    """``value`` equal to ``want`` within ``rel`` (relative) or ``abs_tol``."""
    v = number(value, name)
    if not math.isclose(v, want, rel_tol=rel, abs_tol=abs_tol):
        raise RuleFail(f"{name} = {v:.6g}, expected {want:.6g}" + (f": {rule}" if rule else ""))


def equal(value: Any, want: Any, name: str, rule: str = "") -> None:
    if value != want:
        raise RuleFail(f"{name} = {value!r:.80}, expected {want!r:.80}" + (f": {rule}" if rule else ""))


def positive(value: Any, name: str) -> float:
    v = number(value, name)
    if not v > 0:
        raise RuleFail(f"{name} must be positive, got {v:.6g}")
    return v


def usable(value: Any, what: str, unit: str = "") -> float:
    """The grader's own measurement as a float; :class:`Unusable` unless positive and finite."""
    v = float(value) if type(value) in (int, float) else math.nan
    if not (math.isfinite(v) and v > 0):
        raise Unusable(f"the grader's own {what} came back {v:.4g}{' ' + unit if unit else ''}")
    return v


def spread(samples: Iterable[float]) -> float:
    """Relative spread of the grader's repeated measurements: (max - min) / median (0 for one sample)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        return math.inf
    med = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return (xs[-1] - xs[0]) / med if med > 0 else math.inf


def band(spreads: Iterable[float], smoke: bool, slowdown: float = 1.0, floor: float | None = None) -> float:
    """The relative tolerance for comparing an answer with the grader's measurement: the wider of the
    floor and :data:`SPREAD_FACTOR` x the grader's own relative spreads, capped; on a loaded machine
    widened by the measured ``slowdown`` up to :data:`LOAD_CAP`."""
    base = floor if floor is not None else (SMOKE_FLOOR if smoke else GPU_FLOOR)
    cap = max(base, SMOKE_CAP if smoke else GPU_CAP)
    rel = min(cap, max([base] + [SPREAD_FACTOR * s for s in spreads if math.isfinite(s)]))
    if slowdown > 1:
        rel = max(rel, min(LOAD_CAP[smoke], (1 + rel) * slowdown - 1))
    return rel


def in_band(value: Any, reference: float, rel: float, name: str, unit: str, why: str = "") -> str:
    """``value`` within a factor ``1 + rel`` of the grader's ``reference`` either way; returns the
    feedback line."""
    v = number(value, name)
    ref = usable(reference, f"measurement of {name}", unit)
    lo, hi = ref / (1 + rel), ref * (1 + rel)
    if not lo <= v <= hi:
        raise Fail(f"{name} = {v:.4g} {unit}, but the grader measured {ref:.4g} {unit}; accepted {lo:.4g} to "
                   f"{hi:.4g} (band +-{100 * rel:.0f}%{', ' + why if why else ''})")
    return f"{name}: grader {ref:.4g} {unit}, yours {v:.4g} {unit} (band +-{100 * rel:.0f}%{', ' + why if why else ''})"


def not_above(value: Any, ceiling: float | None, name: str, unit: str, what: str) -> None:
    """Plausibility: ``value`` may not exceed a datasheet ``ceiling`` (with 5% slack)."""
    v = number(value, name)
    if ceiling is not None and v > ceiling * DATASHEET_SLACK:
        u = f" {unit}" if unit else ""
        raise RuleFail(f"{name} = {v:.4g}{u} is above {what} ({ceiling:.4g}{u}): not physically possible")


def label(value: Any, choices: tuple[str, ...], name: str) -> str:
    if type(value) is not str or value not in choices:
        raise RuleFail(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r:.60}")
    return value


def shown(value: Any) -> str:
    """A value for a message: an object that could not cross as data by its type, else a short repr."""
    if isinstance(value, dict) and UNENCODABLE in value:
        return f"a {value[UNENCODABLE]} object (answers must be plain numbers, strings, lists and dicts)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def cases(results: list, expected: list, name: str, rule: str,
          same: Callable[[Any, Any], bool] | None = None) -> str:
    """The learner's function on hidden cases (``results``: sandbox ``Case`` objects, in order) against
    ``expected`` (the rule's values, computed here). Fails naming how many cases differ, the first
    expected and given value and ``rule``, never the inputs. Returns the feedback line."""
    same = same or (lambda a, b: a == b)
    wrong, first = 0, None
    for r, want in zip(results, expected, strict=True):
        if not r.ok:
            wrong += 1
            first = first or f"it raised {r.error}"
        elif not same(r.value, want):
            wrong += 1
            first = first or f"expected {shown(want)}, got {shown(r.value)}"
    if wrong:
        raise RuleFail(f"{name} disagreed with the rule on {wrong} of {len(results)} hidden cases (first: {first}). "
                   f"The rule: {rule}")
    return f"{name}: right on all {len(results)} hidden cases"


def approx(rel: float = 1e-6, abs_tol: float = 0.0) -> Callable[[Any, Any], bool]:
    """A :func:`cases` comparison for numbers (and lists or tuples of numbers, compared item by item)."""

    def same(got: Any, want: Any) -> bool:
        if isinstance(want, (list, tuple)):
            return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
                same(g, w) for g, w in zip(got, want, strict=True))
        if isinstance(want, bool) or isinstance(got, bool):
            return got is want
        if want == math.inf:
            return got == math.inf
        return type(got) in (int, float) and math.isfinite(got) and math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol)

    return same
