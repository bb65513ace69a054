"""The measurement record: where numbers came from, written beside the notebook.

A record holds the fingerprint of the machine (``utils.device.hardware.fingerprint``, plus a
hash of the ``utils/`` source that took the numbers) and named measurements, each with a
unit and a note of how it was taken. The grader reads it when the grading machine has no
GPU (docs/grading.md, "Graded from a measurement record"): it then checks plausibility,
internal consistency and the fingerprint instead of re-measuring.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from utils.course.env import repo_root

SCHEMA = "gpulab.record/1"


def utils_hash(root: Path | None = None) -> str:
    """sha256 over the ``utils/*.py`` sources (path and content), in sorted order.

    The grader compares it with its own copy: a record taken with a patched ``utils``
    does not match."""
    base = (root or repo_root()) / "utils"
    h = hashlib.sha256()
    for p in sorted(base.rglob("*.py")):
        h.update(p.relative_to(base).as_posix().encode())
        h.update(b"\0")
        h.update(p.read_bytes().replace(b"\r\n", b"\n"))
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class Measurement:
    name: str
    value: float
    unit: str
    method: str = ""  # how it was taken: "utils.measure.timing.benchmark, CUDA events, 25 runs"
    spread: float | None = None  # relative standard error or (p80-p20)/median, if known
    extra: dict = field(default_factory=dict)
    time_unix: float = field(default_factory=time.time)


@dataclass
class Record:
    fingerprint: dict = field(default_factory=dict)
    utils_sha256: str = ""
    measurements: dict[str, Measurement] = field(default_factory=dict)
    schema: str = SCHEMA

    @classmethod
    def new(cls) -> Record:
        from utils.device.hardware import fingerprint

        return cls(fingerprint=fingerprint(), utils_sha256=utils_hash())

    def add(self, name: str, value: float, unit: str, method: str = "", spread: float | None = None, **extra) -> Measurement:
        """Add (or replace) the measurement ``name``; the value must be a finite number."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"measurement {name!r} must be a finite number, got {value!r}")
        m = Measurement(name, float(value), unit, method, spread, dict(extra))
        self.measurements[name] = m
        return m

    def value(self, name: str) -> float:
        if name not in self.measurements:
            raise KeyError(f"the record has no measurement {name!r}; it has: {', '.join(sorted(self.measurements)) or 'none'}")
        return self.measurements[name].value

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "fingerprint": self.fingerprint,
            "utils_sha256": self.utils_sha256,
            "measurements": {k: asdict(m) for k, m in self.measurements.items()},
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True, default=_json_default))
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a measurement record (expected schema {SCHEMA!r})")
        ms = {}
        for k, m in (data.get("measurements") or {}).items():
            if not isinstance(m, dict) or not {"name", "value", "unit"} <= set(m):
                raise ValueError(f"measurement {k!r} is malformed: needs name, value and unit")
            allowed = {f for f in Measurement.__dataclass_fields__}
            ms[k] = Measurement(**{f: v for f, v in m.items() if f in allowed})
        return cls(data.get("fingerprint") or {}, data.get("utils_sha256", ""), ms)

    @classmethod
    def load(cls, path: str | Path) -> Record:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no measurement record at {path}: run the notebook on a GPU first") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(data)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if obj.__class__.__name__ == "_NotAvailable":
        return None
    return str(obj)
