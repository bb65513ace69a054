"""The notebook's side of the typed boundary: a cell's answers as JSON, and the measurement record.

Each lab declares, per graded cell, the names its judge reads and their specs
(``grader/labs/<lab>/answers.py``). While a notebook is graded, the grader inserts an export
cell before each graded cell (``grader/preprocessors.py``); it calls :func:`export`, which
prints one line: :data:`grader.names.ANSWERS_MARK`, then the cell's answers as JSON. That line
is all the grader takes from the kernel. The kernel runs the learner's code, so it could print
anything there; whatever it prints is read as the learner's answers and judged like any other
(``grader/judging.py``). Nothing the kernel holds is ever read back as an object.

:func:`save_record` writes every graded cell's answers, with the machine's fingerprint, beside
the notebook: the measurement record a grader without a GPU judges, provisionally
(docs/grading.md, "What a record proves"). A lab only partly solved still writes one: what is
missing because exercises are not done yet is said by those exercises, any other missing name by
its cell, and the rest is kept.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grader import NOTEBOOKS_DIR, labs
from grader.names import ANSWERS_MARK, RECORD_SCHEMA
from grader.schema import MAX_DEPTH, NONFINITE, UNENCODABLE


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able plain data: numbers (numpy and one-element tensors included), strings,
    bools, None, lists (from lists, tuples and sets), dicts (keys as strings) and the fields of a
    dataclass (a ``utils.measure.timing`` result). A torch dtype or device becomes its name. Anything else
    becomes a marker naming its type, so the judge can say what it got."""
    if depth > MAX_DEPTH:
        return {UNENCODABLE: "too deeply nested"}
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {NONFINITE: repr(value)}
    mod = type(value).__module__ or ""
    if mod.startswith("torch") and type(value).__name__ in ("dtype", "device"):
        return str(value).removeprefix("torch.")
    if mod.startswith("torch") and type(value).__name__ == "Size":
        return [int(d) for d in value]
    if mod.startswith(("numpy", "torch")) and hasattr(value, "item"):
        try:
            if getattr(value, "ndim", 0) == 0 or _numel(value) == 1:
                return encode(value.item(), depth + 1)
        except (TypeError, ValueError, RuntimeError):
            pass
        return {UNENCODABLE: f"{mod.split('.')[0]}.{type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}"}
    if isinstance(value, (bool, int)) and not isinstance(value, bool) and type(value).__module__ == "builtins":
        return int(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if type(k) in (bool, int, float, str) or (type(k).__module__.startswith("numpy") and hasattr(k, "item")):
                out[str(k.item() if hasattr(k, "item") else k)] = encode(v, depth + 1)
            else:
                return {UNENCODABLE: f"dict with a {type(k).__name__} key"}
        return out
    if isinstance(value, (list, tuple)):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((encode(v, depth + 1) for v in value), key=repr)
    return {UNENCODABLE: type(value).__name__}


def _numel(value: Any) -> int:
    n = getattr(value, "numel", None)
    return int(n()) if callable(n) else int(getattr(value, "size", 0))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def collect(assignment: str, cell: str, ns: dict) -> dict:
    """``{"cell", "values", "missing", "errors"}`` of one graded cell: each declared answer evaluated
    in the notebook's namespace ``ns`` and encoded; a name not defined yet is ``missing``, an
    answer that raised when read is in ``errors`` with its first line."""
    values, missing, errors = {}, [], {}
    for name, answer in labs.load(assignment).answers.get(cell, {}).items():
        try:
            values[name] = encode(eval(answer.expr, ns))  # noqa: S307 - the course's own expression, in the learner's kernel
        except NameError:
            missing.append(name)
        except Exception as exc:  # the learner's object raised when read: the judge says so
            errors[name] = _first_line(exc)
    return {"cell": cell, "values": values, "missing": missing, "errors": errors}


def export(assignment: str, cell: str, ns: dict) -> None:
    """Print the cell's answers (:func:`collect`) as the one line the grader reads."""
    print(ANSWERS_MARK + json.dumps(collect(assignment, cell, ns), separators=(",", ":")), flush=True)


def record_path(assignment: str, smoke: bool, folder: str | Path = ".") -> Path:
    """Beside the notebook: a GPU run's record, or a smoke record that never overwrites it."""
    return Path(folder) / (f"{assignment}.smoke.record.json" if smoke else f"{assignment}.record.json")


@dataclasses.dataclass(frozen=True)
class Saved:
    """What :func:`save_record` wrote: where, and which cells' answers it holds or lacks."""

    path: Path
    device: str
    complete: tuple[str, ...]
    incomplete: dict
    open_exercises: tuple[str, ...] = ()  # the exercises not done yet, as the notebook heads them
    unexplained: dict | None = None  # cell -> its missing names no open exercise accounts for (None: all of them)

    def __str__(self) -> str:
        line = f"wrote {self.path}: the answers of {len(self.complete)} graded cells, measured on {self.device}"
        rest = self.incomplete if self.unexplained is None else self.unexplained
        if self.open_exercises:
            waiting = sum(1 for c, names in self.incomplete.items() if len(rest.get(c, ())) < len(names))
            line += (f"; {waiting} graded cells wait for exercises not done yet; the {len(self.open_exercises)} "
                     "exercises not done yet: " + ", ".join(self.open_exercises))
        if rest:
            line += "; not answered yet: " + "; ".join(f"{c} ({', '.join(n)})" for c, n in rest.items())
        return line


def _open_exercises(assignment: str, cells: dict, ns: dict) -> tuple[tuple[str, ...], dict | None]:
    """The exercises not done yet (by the released notebook: ``utils/course/exercise_hints.py``), and each
    cell's missing names that none of them accounts for. ``((), None)`` when the notebook cannot be read."""
    from utils.course import exercise_hints

    try:
        m = exercise_hints.load(assignment, NOTEBOOKS_DIR.parent)
    except (OSError, ValueError):
        return (), None
    gone = {g for g, ex in m.exercises.items() if not exercise_hints.done(ex, ns)}
    rest = {}
    for c, r in cells.items():
        found, left = exercise_hints.open_exercises(m, r["missing"], ns)
        gone.update(found)
        if left or r["errors"]:
            rest[c] = left + sorted(r["errors"])
    order = list(m.exercises)
    return tuple(m.exercises[g].label for g in sorted(gone, key=order.index)), rest


def save_record(assignment: str, ns: dict, path: str | Path | None = None) -> Saved:
    """Write every graded cell's answers with the machine's fingerprint, the size tier and a hash of
    the ``utils`` that measured them, beside the notebook (:func:`record_path`). Cells whose names
    are not all defined are recorded as far as they are, and listed."""
    from utils.course.env import device_tier, matmul_dtype, smoke_mode
    from utils.device.hardware import fingerprint
    from utils.measure.record import utils_hash

    smoke = smoke_mode()
    cells = {cell: collect(assignment, cell, ns) for cell in labs.load(assignment).answers}
    fp = fingerprint()
    data = {"schema": RECORD_SCHEMA, "assignment": assignment, "tier": device_tier(), "smoke": smoke,
            "dtype": str(matmul_dtype()).removeprefix("torch."),
            "fingerprint": fp, "utils_sha256": utils_hash(), "written_unix": time.time(),
            "answers": {c: r["values"] for c, r in cells.items()},
            "missing": {c: r["missing"] + sorted(r["errors"]) for c, r in cells.items() if r["missing"] or r["errors"]}}
    target = Path(path) if path is not None else record_path(assignment, smoke)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(target)
    return Saved(target, str(fp.get("name", "?")), tuple(c for c in cells if c not in data["missing"]),
                 dict(data["missing"]), *(_open_exercises(assignment, cells, ns) if data["missing"] else ((), None)))
