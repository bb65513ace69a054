"""Argument checks shared by the pure-maths modules: one-line ``ValueError``s that name
the argument and the value, so a learner sees what to fix instead of a NaN downstream.

A number is a finite real (``int``, ``float``, NumPy scalars), never a ``bool``. ``error``
lets a module raise its own ``ValueError`` subclass (:class:`KVConfigError`, which the KV-cache
modules share) with the same message.
"""
from __future__ import annotations

import math
import numbers


class KVConfigError(ValueError):
    """A config or a number the KV-cache calculator cannot use (``utils.kv.kvcache``,
    ``utils.kv.vllm_releases``, ``utils.kv.vllm_kv``, the engine log parsers); the message says what
    to fix. Defined here, below all of them, so none imports another for it."""


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def positive(name: str, value: float, error: type[ValueError] = ValueError) -> float:
    """``value`` as a float if it is a finite number > 0, else ``error``."""
    if not _is_number(value) or value <= 0:
        raise error(f"{name} must be a positive number, got {value!r}")
    return float(value)


def non_negative(name: str, value: float, error: type[ValueError] = ValueError) -> float:
    """``value`` as a float if it is a finite number >= 0, else ``error``."""
    if not _is_number(value) or value < 0:
        raise error(f"{name} must be a non-negative number, got {value!r}")
    return float(value)


def positive_int(name: str, value: int, error: type[ValueError] = ValueError) -> int:
    """``value`` if it is an ``int`` >= 1 (not a ``bool``), else ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return value


def positives(error: type[ValueError] = ValueError, /, **values: float) -> None:
    """:func:`positive` on each keyword argument, its name the keyword."""
    for name, value in values.items():
        positive(name, value, error)


def non_negatives(error: type[ValueError] = ValueError, /, **values: float) -> None:
    """:func:`non_negative` on each keyword argument, its name the keyword."""
    for name, value in values.items():
        non_negative(name, value, error)
