"""How ``python -m grader report`` prints a recorded value, and Markdown tables.

One rounding rule for the whole README (:func:`num`), so that every number the README shows
can be traced back to the record it came from; a fraction (MFU, a share, an efficiency) is a
percentage (:func:`percent`), a number in a title a few significant figures (:func:`sig`), and
the machine's cuDNN a version (:func:`cudnn_version`). Markdown tables follow GitHub's "tables"
extension (https://github.github.com/gfm/#tables-extension-): a ``|`` inside a cell is
written ``\\|``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from grader.schema import NONFINITE, UNENCODABLE


def is_number(v: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def num(v: Any) -> str:
    """A recorded value as the README prints it.

    Whole numbers in full with thousands separators (``16384`` -> ``16,384``); from 1,000 up,
    rounded to the unit (``48246.8`` -> ``48,247``); below, four significant digits
    (``0.61693`` -> ``0.6169``); below 0.001, scientific with four digits (``8.460e-08``).
    Booleans are ``yes``/``no``, ``None`` and the empty string are ``-``, other strings are
    themselves; a value the notebook could not record says what it was."""
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping) and NONFINITE in v:
        return {"nan": "not a number (NaN)", "inf": "infinite", "-inf": "minus infinity"}.get(str(v[NONFINITE]),
                                                                                            str(v[NONFINITE]))
    if isinstance(v, Mapping) and UNENCODABLE in v:
        return f"not recorded ({v[UNENCODABLE]})"
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


def sig(v: Any, digits: int = 3) -> str:
    """A number for a title or a caption: ``digits`` significant figures, thousands separated
    (``0.0939334`` -> ``0.0939``, ``989.5`` -> ``990``, ``4800.0`` -> ``4,800``)."""
    if not is_number(v):
        return num(v)
    x = float(v)
    if x == 0:
        return "0"
    exp = math.floor(math.log10(abs(x)))
    if exp < -4:
        return f"{x:.{digits - 1}e}"
    decimals = max(digits - 1 - exp, 0)
    return f"{round(x, decimals):,.{decimals}f}"


def percent(v: Any) -> str:
    """A fraction as a percentage with three significant figures (``0.61693`` -> ``61.7%``)."""
    if not is_number(v):
        return num(v)
    return sig(100 * float(v), 3) + "%"


def cudnn_version(v: Any) -> str:
    """cuDNN's version as ``torch.backends.cudnn.version()`` gives it, read as a version:
    ``major*10000 + minor*100 + patch`` from cuDNN 9 (``91900`` -> ``9.19.0``; torch compares it
    with ``91100`` for 9.11), ``major*1000 + minor*100 + patch`` before (``8902`` -> ``8.9.2``)."""
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return num(v)
    if v >= 10000:
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


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
    """``(path, value)`` of every scalar under nested dicts and lists (a list item's path step is
    its index); a non-finite or unrecordable marker is one leaf."""
    if isinstance(d, Mapping) and not (NONFINITE in d or UNENCODABLE in d):
        for k, v in d.items():
            yield from leaves(v, (*path, str(k)))
    elif isinstance(d, (list, tuple)):
        for i, v in enumerate(d):
            yield from leaves(v, (*path, str(i)))
    else:
        yield path, d


def get(d: Any, *path: Any, default: Any = None) -> Any:
    """``d[path[0]][path[1]]...`` through dicts and lists, or ``default`` where a step is missing."""
    for p in path:
        if isinstance(d, Mapping):
            if p not in d:
                return default
            d = d[p]
        elif isinstance(d, (list, tuple)) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        else:
            return default
    return d
