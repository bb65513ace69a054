"""The typed boundary between a sandbox and the grader: what an answer may be, checked strictly.

Everything that leaves a process that ran learner code (the notebook's kernel, a sandbox
worker) arrives as JSON text. This module turns that text into values the judges can trust by
type: a :class:`Number` is a finite ``float`` and nothing else, a :class:`Label` one of its
strings, a :class:`Fields` a ``dict`` of exactly the declared fields. No object crosses, so no
value can lie about itself (an ``__eq__`` that always agrees has no JSON form). Each lab
declares its answers with these specs in its ``answers.py``: that file is the seam between the
notebook and the grader, as the adapters file of Stanford CS336's assignments is between a student's code and its
tests.

The kernel side turns Python values into JSON with :func:`encode` (``grader/answers.py``); the
grader side reads them back with :func:`loads` and ``spec.decode``. Written by hand: JSON Schema
validators check shapes, not "finite float, not bool", and the messages here name the answer the
learner wrote.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

MAX_DEPTH = 12  # nesting of lists and dicts an answer may have
MAX_ITEMS = 200_000  # list items and dict entries in one cell's answers, all levels together
MAX_TEXT = 100_000  # characters of one string
NONFINITE = "__nonfinite__"  # encode(): NaN and infinities, which JSON cannot carry, as {"__nonfinite__": "nan"}
UNENCODABLE = "__unencodable__"  # encode(): an object with no plain form, as {"__unencodable__": "its type"}


class AnswerError(ValueError):
    """An answer that is not what its spec says: the message names it and says what it should be."""


def _got(value: Any) -> str:
    """How a decoded JSON value reads in a message: its kind and a short repr."""
    if isinstance(value, dict) and NONFINITE in value:
        return f"the non-finite number {value[NONFINITE]}"
    if isinstance(value, dict) and UNENCODABLE in value:
        return f"a {value[UNENCODABLE]} object"
    kind = {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list", dict: "a dict",
            type(None): "None"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text[:60]}{'...' if len(text) > 60 else ''})"


class Spec:
    """One answer's type. ``decode(value, name)`` returns the checked value or raises AnswerError."""

    what = "a value"

    def decode(self, value: Any, name: str) -> Any:  # pragma: no cover - every spec overrides it
        raise NotImplementedError

    def fail(self, value: Any, name: str, why: str = "") -> AnswerError:
        return AnswerError(f"{name} must be {self.what}{why}, got {_got(value)}")


@dataclasses.dataclass(frozen=True)
class Number(Spec):
    """A finite real number (a JSON int or float, never a bool), returned as a ``float``."""

    unit: str = ""
    positive: bool = False
    at_least: float | None = None
    at_most: float | None = None

    @property
    def what(self) -> str:
        kind = "a positive number" if self.positive else "a number"
        return kind + (f" in {self.unit}" if self.unit else "")

    def decode(self, value: Any, name: str) -> float:
        if type(value) not in (int, float):
            raise self.fail(value, name)
        v = float(value)
        if not math.isfinite(v):
            raise self.fail(value, name, " (finite)")
        if self.positive and not v > 0:
            raise self.fail(value, name)
        if self.at_least is not None and v < self.at_least:
            raise self.fail(value, name, f" of at least {self.at_least:g}")
        if self.at_most is not None and v > self.at_most:
            raise self.fail(value, name, f" of at most {self.at_most:g}")
        return v


@dataclasses.dataclass(frozen=True)
class Count(Spec):
    """An exact whole number: a JSON int, or a float with no fractional part; returned as ``int``."""

    at_least: int = 0

    @property
    def what(self) -> str:
        return f"a whole number of at least {self.at_least}"

    def decode(self, value: Any, name: str) -> int:
        if type(value) is float and math.isfinite(value) and value == int(value) and abs(value) < 2**63:
            value = int(value)
        if type(value) is not int or value < self.at_least:
            raise self.fail(value, name)
        return value


@dataclasses.dataclass(frozen=True)
class Label(Spec):
    """One of a fixed set of strings."""

    choices: tuple[str, ...]

    @property
    def what(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)

    def decode(self, value: Any, name: str) -> str:
        if type(value) is not str or value not in self.choices:
            raise self.fail(value, name)
        return value


@dataclasses.dataclass(frozen=True)
class Text(Spec):
    """Any string."""

    what = "a string"

    def decode(self, value: Any, name: str) -> str:
        if type(value) is not str:
            raise self.fail(value, name)
        return value


@dataclasses.dataclass(frozen=True)
class Flag(Spec):
    """True or False (a bool, not 0 or 1)."""

    what = "True or False"

    def decode(self, value: Any, name: str) -> bool:
        if type(value) is not bool:
            raise self.fail(value, name)
        return value


@dataclasses.dataclass(frozen=True)
class Nullable(Spec):
    """None, or a value of ``inner``."""

    inner: Spec

    @property
    def what(self) -> str:
        return f"None or {self.inner.what}"

    def decode(self, value: Any, name: str) -> Any:
        return None if value is None else self.inner.decode(value, name)


@dataclasses.dataclass(frozen=True)
class ListOf(Spec):
    """A list (or tuple) of ``item`` values, ``min_len`` to ``max_len`` long; returned as a list."""

    item: Spec
    min_len: int = 0
    max_len: int = 100_000

    @property
    def what(self) -> str:
        n = f"{self.min_len} to {self.max_len}" if self.max_len < 100_000 else f"at least {self.min_len}"
        return f"a list of {n} items, each {self.item.what}" if self.min_len or self.max_len < 100_000 \
            else f"a list of {self.item.what}"

    def decode(self, value: Any, name: str) -> list:
        if type(value) is not list or not self.min_len <= len(value) <= self.max_len:
            raise self.fail(value, name)
        return [self.item.decode(v, f"{name}[{i}]") for i, v in enumerate(value)]


@dataclasses.dataclass(frozen=True)
class TupleOf(Spec):
    """A fixed-length sequence whose items have their own specs; returned as a tuple."""

    items: tuple[Spec, ...]

    @property
    def what(self) -> str:
        return f"a sequence of {len(self.items)}: " + ", ".join(s.what for s in self.items)

    def decode(self, value: Any, name: str) -> tuple:
        if type(value) is not list or len(value) != len(self.items):
            raise self.fail(value, name)
        return tuple(s.decode(v, f"{name}[{i}]") for i, (s, v) in enumerate(zip(self.items, value, strict=True)))


@dataclasses.dataclass(frozen=True)
class DictOf(Spec):
    """A dict from ``key`` to ``value``. ``keys``: the exact set it must have (decoded keys), if
    given. Keys travel as JSON strings: a :class:`Count` key reads ``"8"`` back as ``8``."""

    key: Spec
    value: Spec
    keys: tuple | None = None

    @property
    def what(self) -> str:
        if self.keys is not None:
            return "a dict with the keys " + ", ".join(repr(k) for k in self.keys) + f", each {self.value.what}"
        return f"a dict of {self.key.what} -> {self.value.what}"

    def _key(self, k: str, name: str) -> Any:
        if isinstance(self.key, Count):
            if not (k.isdigit() and str(int(k)) == k):
                raise AnswerError(f"{name} must have whole-number keys, got the key {k!r}")
            return self.key.decode(int(k), f"a key of {name}")
        return self.key.decode(k, f"a key of {name}")

    def decode(self, value: Any, name: str) -> dict:
        if type(value) is not dict or NONFINITE in value or UNENCODABLE in value:
            raise self.fail(value, name)
        out = {}
        for k, v in value.items():
            key = self._key(k, name)
            out[key] = self.value.decode(v, f"{name}[{key!r}]")
        if self.keys is not None and set(out) != set(self.keys):
            missing = [k for k in self.keys if k not in out]
            extra = [k for k in out if k not in self.keys]
            why = (f"; missing {', '.join(map(repr, missing))}" if missing else "") + \
                  (f"; unexpected {', '.join(map(repr, extra[:5]))}" if extra else "")
            raise AnswerError(f"{name} must be {self.what}{why}")
        return out


@dataclasses.dataclass(frozen=True)
class Fields(Spec):
    """A dict with named fields, each of its own spec; fields beyond them are dropped. ``optional``:
    fields that may be absent (read as None)."""

    fields: dict
    optional: tuple[str, ...] = ()
    label: str = ""  # what the learner knows it as: "the dict from stopwatch.summary()"

    @property
    def what(self) -> str:
        return self.label or ("a dict with " + ", ".join(self.fields))

    def __hash__(self):  # frozen dataclass holding a dict
        return hash((tuple(self.fields), self.optional, self.label))

    def decode(self, value: Any, name: str) -> dict:
        if type(value) is not dict or NONFINITE in value or UNENCODABLE in value:
            raise self.fail(value, name)
        missing = [f for f in self.fields if f not in value and f not in self.optional]
        if missing:
            raise AnswerError(f"{name} must be {self.what}: it lacks {', '.join(missing)}")
        return {f: (s.decode(value[f], f"{name}[{f!r}]") if f in value else None) for f, s in self.fields.items()}


# what utils.measure.timing.benchmark returns (TimingResult), as its fields
TIMING = Fields({"median_ms": Number("ms", positive=True), "p20_ms": Number("ms", at_least=0.0),
                 "p80_ms": Number("ms", at_least=0.0), "runs": Count(1), "method": Text()},
                label="a timing from utils.measure.timing.benchmark")


def loads(text: str) -> Any:
    """JSON ``text`` as plain values; NaN and infinity literals refused (JSON has none), and the
    size limits of this module enforced. ValueError with one line when it is not that."""

    def refuse(token: str):
        raise ValueError(f"{token} is not JSON")

    value = json.loads(text, parse_constant=refuse)
    _within_limits(value)
    return value


def _within_limits(value: Any) -> None:
    count, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, str) and len(v) > MAX_TEXT:
            raise ValueError(f"a string of {len(v):,} characters (at most {MAX_TEXT:,})")
        if isinstance(v, (list, dict)):
            count += len(v)
            if count > MAX_ITEMS:
                raise ValueError(f"more than {MAX_ITEMS:,} items")
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
