"""How ``python -m utils.portfolio`` prints a recorded number, and Markdown tables.

One rounding rule for the whole README (:func:`num`), so that every number the README
shows can be traced back to the record it came from: the portfolio's tests
(``tests/utils/test_portfolio.py``) print every number of a record with :func:`num` and
find each number of the README's text among them. Markdown tables follow GitHub's
"tables" extension (https://github.github.com/gfm/#tables-extension-): a ``|`` inside a
cell is written ``\\|``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any


def is_number(v: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def num(v: Any) -> str:
    """A recorded value as the README prints it.

    Whole numbers in full with thousands separators (``16384`` -> ``16,384``); from 1,000 up,
    rounded to the unit (``48246.8`` -> ``48,247``); below, four significant digits
    (``0.61693`` -> ``0.6169``); below 0.001, scientific with four digits (``8.460e-08``). The
    examples are values of benchmarks/results/h200-phase0-graded/2026-11-30/00_foundations.record.json.
    Booleans are ``yes``/``no``, ``None`` and the empty string are ``-``, other strings are themselves."""
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if not is_number(v):
        return str(v)
    x = float(v)
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 1e-3:
        return f"{x:.4g}"
    return f"{x:.3e}"


def cell(v: Any) -> str:
    """A value as a table cell: :func:`num`, lists joined with commas, ``|`` escaped."""
    if isinstance(v, (list, tuple)):
        text = ", ".join(num(x) for x in v) if v else "-"
    else:
        text = num(v)
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    """A GitHub Markdown table, one line per row; cells through :func:`cell`."""
    header = list(header)
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        out.append("| " + " | ".join(cell(v) for v in row) + " |")
    return out


def leaves(d: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(path, value)`` of every scalar under nested dicts; lists of scalars are one leaf,
    lists holding dicts are left out (the lab's own tables show them)."""
    if isinstance(d, Mapping):
        for k, v in d.items():
            yield from leaves(v, (*path, str(k)))
    elif isinstance(d, (list, tuple)):
        if all(not isinstance(x, (Mapping, list, tuple)) for x in d):
            yield path, list(d)
    else:
        yield path, d


def pairs(items: Iterable[tuple[str, Any]]) -> str:
    """``key value, key value`` for a table cell (values through :func:`num`)."""
    return ", ".join(f"{k} {cell(v)}" for k, v in items) or "-"


def get(d: Any, *path: Any, default: Any = None) -> Any:
    """``d[path[0]][path[1]]...`` through dicts, lists and attributes (a measurement's
    ``extra``), or ``default`` where a step is missing."""
    for p in path:
        if isinstance(d, Mapping):
            if p not in d:
                return default
            d = d[p]
        elif isinstance(d, (list, tuple)) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        elif isinstance(p, str) and d is not None and not isinstance(d, (str, list, tuple)) and hasattr(d, p):
            d = getattr(d, p)
        else:
            return default
    return d
