"""A lab's answers as the README's tables, and what is not done yet, for ``python -m grader report``.

Lab-agnostic: each lab declares its graded cells' answers and their types in
``grader/labs/<lab>/answers.py`` (``grader.schema`` specs), and a record holds each cell's answers
as the notebook computed them. A cell's answers are printed under the exercise's own heading
(``grader/portfolio/answers.py``), each with the unit its spec gives; a fraction (MFU, a share, an
efficiency, a relative error) is a percentage. Nothing is computed from the numbers; every one is
the record's.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from grader import labs
from grader.portfolio.format import is_number, md_table, num, percent
from grader.schema import NONFINITE, UNENCODABLE, DictOf, Fields, ListOf, Nullable, TupleOf

FRACTION = re.compile(r"(^|_)(mfu|share|fraction|efficiency|error)($|_)", re.IGNORECASE)
UNIT_SUFFIX = (("_pct", "%"), ("_ms", "ms"), ("_us", "us"), ("_gib", "GiB"), ("_gbs", "GB/s"), ("_tflops", "TFLOP/s"),
               ("tokens_per_s", "tokens/s"), ("_rps", "req/s"), ("_s", "s"))
MAX_TEXT = 160  # characters of a string shown in a table
INLINE = 6  # values of a dict or list shown in its table row; the rest in the full list
FULL = 60  # values of one answer in the full list
SKIP = {"base_url", "trace_path"}  # a local address or a file on the machine that measured: nothing to a reader


def declared(lab: str) -> dict[str, dict]:
    """``{cell: {name: grader.labs.Answer}}``: the lab's graded cells and the answers each hands in."""
    return labs.load(lab).answers


def _inner(spec: Any) -> Any:
    while isinstance(spec, Nullable):
        spec = spec.inner
    return spec


def child(spec: Any, key: str | int) -> Any:
    """The spec of ``value[key]`` where ``value`` has ``spec``; None where the spec does not say."""
    spec = _inner(spec)
    if isinstance(spec, Fields):
        return spec.fields.get(key)
    if isinstance(spec, DictOf):
        return spec.value
    if isinstance(spec, ListOf):
        return spec.item
    if isinstance(spec, TupleOf):
        return spec.items[int(key)] if str(key).isdigit() and int(key) < len(spec.items) else None
    return None


def suffix_unit(name: str) -> str:
    """The unit a name ends with (``median_ms``: ms), or ""."""
    low = name.lower()
    return next((u for suffix, u in UNIT_SUFFIX if low.endswith(suffix)), "")


def unit(spec: Any, name: str, path: tuple[str, ...] = ()) -> str:
    """The unit of a number: its spec's, else the one its name ends with, else the one the dict
    holding it is named with (``mem_used_gib`` for its ``max``)."""
    u = getattr(_inner(spec), "unit", "") or ""
    if u:
        return u
    return next((u for n in (name, *reversed(path[:-1])) if (u := suffix_unit(n))), "")


def label(key: str, shown_unit: str) -> str:
    """A dict key as the README names it: without the unit suffix its value already shows
    (``median_ms`` -> ``median``)."""
    low = key.lower()
    for suffix, u in UNIT_SUFFIX:
        if low.endswith(suffix) and u == shown_unit and len(key) > len(suffix):
            return key[:-len(suffix)]
    return key


def is_fraction(spec: Any, name: str) -> bool:
    """A unitless number that is a share of a whole: by name (``mfu``, ``fixed_share``,
    ``scaling_efficiency``, ``copy_fraction``, ``kv_growth_error``) or by a spec bounded to [0, 1]."""
    s = _inner(spec)
    if getattr(s, "unit", "") or any(name.lower().endswith(suffix) for suffix, _ in UNIT_SUFFIX):
        return False
    return bool(FRACTION.search(name)) or (getattr(s, "at_least", None) == 0.0 and getattr(s, "at_most", None) == 1.0)


def value(v: Any, spec: Any, name: str, path: tuple[str, ...] = ()) -> str:
    """One recorded scalar with its unit, as the README prints it."""
    if is_number(v):
        if is_fraction(spec, name):
            return percent(v)
        u = unit(spec, name, path)
        if u == "%":
            return f"{num(v)}%"
        if u == "$":
            return f"${num(v)}"
        if u == "x":
            return f"{num(v)}x"
        return f"{num(v)} {u}".rstrip()
    text = num(v)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3].rstrip() + "..."


def is_scalar(v: Any) -> bool:
    return not isinstance(v, (Mapping, list, tuple)) or (isinstance(v, Mapping) and (NONFINITE in v or UNENCODABLE in v))


def flat(v: Any, spec: Any, name: str, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """``(path, printed value)`` of every scalar in an answer, its spec followed down for units;
    a dict's fields in the order its spec declares them."""
    if is_scalar(v):
        key = path[-1] if path else name
        text = value(v, spec, key, path)
        shown = unit(spec, key, path) if is_number(v) and not is_fraction(spec, key) else ""
        yield ".".join((*path[:-1], label(path[-1], shown))) if path else "", text
        return
    if isinstance(v, Mapping):
        order = list(_inner(spec).fields) if isinstance(_inner(spec), Fields) else []
        items = [(k, v[k]) for k in order if k in v] + [(k, x) for k, x in v.items() if k not in order]
    else:
        items = list(enumerate(v))
    for k, x in items:
        if k not in SKIP:
            yield from flat(x, child(spec, k), name, (*path, str(k)))


def summary(v: Any, spec: Any, name: str) -> str:
    """An answer in one table cell: a scalar with its unit; a dict or list as its first values,
    each named, and how many more the full list holds."""
    if is_scalar(v):
        return value(v, spec, name)
    parts = sorted(flat(v, spec, name), key=lambda pt: pt[0].count("."))  # its own fields before nested ones
    if not parts:
        return "empty"
    shown = ", ".join(f"{p} {t}" if p else t for p, t in parts[:INLINE])
    return shown + (f" ... and {len(parts) - INLINE} more (below)" if len(parts) > INLINE else "")


def _groups(lab: str, data: dict, titles: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The graded cells that hand in answers, grouped by exercise title, in notebook order."""
    out: list[tuple[str, list[str]]] = []
    for cell, specs in declared(lab).items():
        if not specs:
            continue
        t = titles.get(cell, cell)
        if out and out[-1][0] == t:
            out[-1][1].append(cell)
        else:
            out.append((t, [cell]))
    return out


def _shown(lab: str, data: dict, titles: dict[str, str]) -> list[tuple[str, list[tuple[str, Any, Any]]]]:
    """``[(title, [(name, value, spec), ...])]``: each answer under the first exercise that hands it in."""
    seen: dict[str, Any] = {}
    specs = declared(lab)
    out = []
    for t, cells in _groups(lab, data, titles):
        rows = []
        for cell in cells:
            got = data["answers"].get(cell) or {}
            for name, ans in specs[cell].items():
                if name in got and not (name in seen and seen[name] == got[name]):
                    seen[name] = got[name]
                    rows.append((name, got[name], ans.spec))
        if rows:
            out.append((t, rows))
    return out


def results(lab: str, data: dict, titles: dict[str, str]) -> list[str]:
    """``## Results``: per exercise, a table of its answers with units."""
    out = []
    for t, rows in _shown(lab, data, titles):
        out += [f"### {t}", "", *md_table(["answer", "value"], [(f"`{n}`", summary(v, s, n)) for n, v, s in rows]), ""]
    return (["## Results", "", *out] if out else
            ["## Results", "", "The record holds no answers yet: no exercise was done when it was written.", ""])


def every_value(lab: str, data: dict, titles: dict[str, str]) -> list[str]:
    """A folded list of every value of every answer the record holds."""
    out = ["<details><summary>Every value the record holds</summary>", ""]
    for t, rows in _shown(lab, data, titles):
        out += [f"**{t}**", ""]
        for n, v, s in rows:
            parts = list(flat(v, s, n))
            text = "; ".join(f"{p} {x}" if p else x for p, x in parts[:FULL])
            more = f"; ... and {len(parts) - FULL} more" if len(parts) > FULL else ""
            out.append(f"- `{n}`: {text or 'empty'}{more}")
        out.append("")
    return out + ["</details>", ""]


def expression(ans: Any, name: str) -> str:
    """How the notebook names an answer: its name, or the expression the record reads
    (``monitor.summary()``)."""
    return getattr(ans, "expr", "") or name


def todo(lab: str, data: dict, titles: dict[str, str], unanswered: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """``[(exercise title, what is missing)]``, in notebook order: the record's missing names (by
    exercise), and the notebook's unanswered cells (``(title, "code" or "markdown")``)."""
    specs = declared(lab)
    missing = data.get("missing") or {}
    order = list(dict.fromkeys([*titles.values(), *(titles.get(c, c) for c in specs)]))  # the notebook's order
    found: dict[str, list[str]] = {}
    for cell, names in missing.items():
        shown = [f"`{expression(specs.get(cell, {}).get(n), n)}`" for n in names]
        found.setdefault(titles.get(cell, cell), [])
        found[titles.get(cell, cell)] += [s for s in shown if s not in found[titles.get(cell, cell)]]
    written = {t for t, kind in unanswered if kind == "markdown"}
    for t, _ in unanswered:
        found.setdefault(t, [])
    lines = []
    for t in sorted(found, key=lambda t: order.index(t) if t in order else len(order)):
        names = found[t]
        if names:
            what = f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not set yet"
        else:
            what = "not written yet" if t in written else "not done yet"
        lines.append((t, what))
    return lines


def progress(lab: str, data: dict) -> tuple[int, int]:
    """``(done, total)``: graded cells that hand in answers, and those the record has all of."""
    cells = [c for c, s in declared(lab).items() if s]
    missing = data.get("missing") or {}
    return sum(c not in missing and c in data["answers"] for c in cells), len(cells)
