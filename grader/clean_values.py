"""The values a graded cell reads, handed from the learner's kernel to the clean process as data.

``grader/clean_room.py`` re-runs a graded cell's tests outside the kernel. What those tests read
beyond the learner's definitions (a constant the notebook computed, a timing, a spec row) is
written by a snapshot cell the batch inserts before the graded cell (:func:`snapshot`, in the
kernel), as the ``repr`` of plain data only: numbers, strings, containers of them, and the
course's own objects as their fields (:func:`plain`). The clean process reads them back with
``ast.literal_eval`` and rebuilds the course's objects with the course's own constructors
(:func:`rebuilt`), so no code of the notebook's travels.

Written by hand: pickle would carry code, and JSON has no tuples, sets or non-string keys.
"""
from __future__ import annotations

import ast
import json
import math
import os
import re
from pathlib import Path

VALUES_ENV = "GPULAB_CLEAN_VALUES"  # the file the snapshot cells write, set by the batch per submission
REPR_LIMIT = 200_000  # characters: a value whose repr is longer is not handed over

COURSE_TAG = "__course_value__"  # marks a course object handed over as its fields (plain(); rebuilt() reads it)


def plain(value, depth: int = 0):
    """``value`` as plain data: containers walked; an instance of a dataclass of the course's
    ``utils`` package (a timing result, a hardware spec row, a fine-tuning recipe) as a tagged dict
    of its fields, a torch dtype or device and a float that is not finite by name; anything else as it is
    (:func:`snapshot` then keeps it only if its ``repr`` is a literal)."""
    import dataclasses

    kind = type(value)
    if depth > 20:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and kind.__module__.startswith("utils."):
        return {COURSE_TAG: f"{kind.__module__}:{kind.__qualname__}",
                **{f.name: plain(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value) if f.init}}
    if kind.__module__ == "torch" and kind.__name__ in ("dtype", "device"):
        return {COURSE_TAG: f"torch:{kind.__name__}", "name": str(value).removeprefix("torch.")}
    if kind is float and not math.isfinite(value):  # a request rate of inf: repr gives a name, not a literal
        return {COURSE_TAG: "float", "name": repr(value)}
    if kind in (list, tuple, set, frozenset):
        return kind(plain(v, depth + 1) for v in value)
    if kind is dict:
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    return value


def rebuilt(value):
    """:func:`plain`'s output read back: each tagged dict becomes the course's object again, built
    from its literal fields by the course's own constructor (nothing of the notebook's code runs),
    and must give back the same fields (a class whose constructor transforms them is refused)."""
    import dataclasses
    import importlib

    if type(value) in (list, tuple, set, frozenset):
        return type(value)(rebuilt(v) for v in value)
    if type(value) is not dict:
        return value
    tag = value.get(COURSE_TAG)
    if tag is None:
        return {k: rebuilt(v) for k, v in value.items()}
    if tag == "float" and value.get("name") in ("inf", "-inf", "nan"):
        return float(value["name"])
    module, _, name = str(tag).partition(":")
    if module == "torch" and name in ("dtype", "device") and isinstance(value.get("name"), str):
        import torch

        made = torch.device(value["name"]) if name == "device" else getattr(torch, value["name"], None)
        if not isinstance(made, (torch.dtype, torch.device)):
            raise ValueError(f"not a torch dtype: {value['name']!r}")
        return made
    cls = importlib.import_module(module) if re.fullmatch(r"utils(\.[a-z0-9_]+)+", module) else None
    for part in name.split(".") if cls else ():
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"not a dataclass of the course: {tag!r}")
    made = cls(**{k: rebuilt(v) for k, v in value.items() if k != COURSE_TAG})
    if plain(made) != value:
        raise ValueError(f"{tag} does not rebuild from its fields")
    return made


def snapshot(ns: dict, grade_id: str, names: tuple[str, ...]) -> None:
    """Append the plain values of ``names`` in ``ns`` (a kernel's globals) for ``grade_id`` to the
    file :data:`VALUES_ENV` names (the course's objects as their fields, :func:`plain`); a value that is
    not plain data is left out. Prints nothing."""
    path = os.environ.get(VALUES_ENV)
    if not path:
        return
    values = {}
    for name in names:
        if name not in ns:
            continue
        try:
            text = repr(plain(ns[name]))
            if len(text) <= REPR_LIMIT:
                ast.literal_eval(text)
                values[name] = text
        except Exception:  # an object, a repr that raises or is not a literal: not handed over
            continue
    with open(path, "a") as f:
        f.write(json.dumps([grade_id, values]) + "\n")


def read(path: Path | None) -> dict[str, dict[str, str]]:
    """The last snapshot written for each cell (a cell the notebook ran twice: its last run)."""
    out: dict[str, dict[str, str]] = {}
    if path is None or not Path(path).is_file():
        return out
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            gid, values = json.loads(line)
            if isinstance(gid, str) and isinstance(values, dict):
                out[gid] = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, str)}
        except (ValueError, TypeError):
            continue
    return out
