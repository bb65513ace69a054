"""Where a lab's measured cells are judged: this machine, or a learner's measurement record.

:func:`live` reads this machine the way the notebook's setup cells read it (``utils.course.env``: smoke mode,
the size tier, rehearsing a smaller card with ``GPULAB_TIER``), in the grader's own process: a
notebook cannot change what the grader sees. :func:`read_record` takes a submitted record and says in
one line why it cannot be used when it cannot: a record is only judged where this machine has no
GPU, it came from one, and the ``utils`` that measured it is the grader's.
"""
from __future__ import annotations

from pathlib import Path

import torch

from grader import labs
from grader.judging import Context
from grader.names import RECORD_SCHEMA
from grader.schema import loads
from utils.course.env import TIERS, device_tier, matmul_dtype, smoke_mode
from utils.device import hardware
from utils.measure.record import utils_hash


def live(assignment: str) -> Context:
    """This machine, as the notebook's setup cells choose for ``assignment``."""
    smoke, tier = smoke_mode(), device_tier()
    spec = None if smoke else hardware.current_spec()
    spec = spec if spec is not None and spec.kind == "gpu" else None
    name = torch.cuda.get_device_name(0) if not smoke else "CPU (smoke mode: tiny sizes, lenient bands)"
    return Context(assignment, tier, labs.load(assignment).sizes(tier), smoke, "cpu" if smoke else "cuda", name, spec,
                   str(matmul_dtype()).removeprefix("torch."), hardware.fingerprint() if not smoke else {})


def read_record(path: Path | None, assignment: str) -> tuple[dict | None, Context | None, str]:
    """``(record, its context, "")`` for a usable GPU record at ``path``; else ``(None, None, why)``
    (``why`` is "" when there is no record at all)."""
    if path is None or not Path(path).is_file():
        return None, None, ""
    pre = f"your record {Path(path).name} was not used"
    try:
        data = loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, None, f"{pre}: it is not valid JSON ({str(exc).splitlines()[0][:120]})"
    if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA:
        return None, None, f"{pre}: it is not a measurement record of this course (schema {RECORD_SCHEMA})"
    if data.get("assignment") != assignment:
        return None, None, f"{pre}: it is the record of {data.get('assignment')!r}, not {assignment!r}"
    fp = data.get("fingerprint")
    if not isinstance(fp, dict) or fp.get("kind") != "gpu" or data.get("smoke"):
        return None, None, ""  # a smoke run's record: the smoke run here measures the same things
    if data.get("utils_sha256") != utils_hash():
        return None, None, (f"{pre}: it was measured with a different utils/ than this grader's; run the notebook again "
                            "on a GPU with this version of the course, unmodified")
    spec = hardware.spec_for_name(str(fp.get("name", "")))
    if spec is None:
        return None, None, f"{pre}: its GPU {fp.get('name')!r} has no datasheet row in utils/device/hardware.py to check it against"
    tier, dtype = data.get("tier"), data.get("dtype")
    if tier not in TIERS or tier == "cpu" or dtype not in ("bfloat16", "float16", "float32"):
        return None, None, f"{pre}: its size tier {tier!r} or matmul dtype {dtype!r} is not one the course uses"
    if not isinstance(data.get("answers"), dict) or not isinstance(data.get("missing", {}), dict):
        return None, None, f"{pre}: it holds no answers"
    ctx = Context(assignment, tier, labs.load(assignment).sizes(tier), False, "cuda", str(fp.get("name")), spec, dtype, fp)
    return data, ctx, ""
