"""Argument checks shared by the pure-maths modules: one-line ``ValueError``s that name
the argument and the value, so a learner sees what to fix instead of a NaN downstream."""
from __future__ import annotations

import math


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def positive(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number > 0, else ValueError."""
    if not _is_number(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def non_negative(name: str, value: float) -> float:
    """``value`` as a float if it is a finite number >= 0, else ValueError."""
    if not _is_number(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    return float(value)
