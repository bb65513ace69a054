"""An interrupted batch loses nothing: each submission's result is saved as it finishes, and a
rerun with the same ``--out`` grades only what is missing.

``OUT/partial/<student>.json`` holds one finished result and the sha256 of the submission it
graded (the notebook's bytes, then its record's); the student's feedback and graded notebook
are copied to ``OUT`` at the same moment. A rerun reuses a saved result whose submission is
byte for byte the same, regrades a changed one, and says how many it kept. The finished batch
writes ``grades.csv`` and ``results.json`` from all of them and removes ``partial/``.
Hand-written because nbgrader's own resume (its gradebook) lives in the one sqlite file that
parallel jobs must not share (``grader/course.py``).
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

PARTIAL = "partial"


def submission_sha256(notebook: Path | None, record: Path | None) -> str:
    h = hashlib.sha256()
    for p in (notebook, record):
        h.update(b"\0")
        if p is not None and p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def saved(out: Path | None, subs: list) -> dict[str, dict]:
    """Results of ``subs`` an earlier run of this batch finished, keyed by student."""
    if out is None or not (out / PARTIAL).is_dir():
        return {}
    kept = {}
    for sub in subs:
        p = out / PARTIAL / f"{sub.student_id}.json"
        try:
            entry = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("sha256") == submission_sha256(sub.notebook, sub.record) \
                and isinstance(entry.get("result"), dict):
            kept[sub.student_id] = entry["result"]
    return kept


def save(out: Path | None, sub, result: dict, feedback: Path | None, autograded: Path | None) -> None:
    """Keep one finished result, with its feedback and graded notebook (and the record beside it)."""
    if out is None:
        return
    sid = sub.student_id
    for src, kind in ((feedback, "feedback"), (autograded, "autograded")):
        if src is not None and src.is_file():
            (out / kind / sid).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / kind / sid / src.name)
            if kind == "autograded":
                for rec in src.parent.glob("*.record.json"):
                    if not rec.is_symlink() and rec.is_file():
                        shutil.copyfile(rec, out / kind / sid / rec.name)
    (out / PARTIAL).mkdir(parents=True, exist_ok=True)
    tmp = out / PARTIAL / f".{sid}.json.tmp"
    tmp.write_text(json.dumps({"sha256": submission_sha256(sub.notebook, sub.record), "result": result},
                              default=str))
    tmp.replace(out / PARTIAL / f"{sid}.json")  # atomic: a kill leaves the old file or the new one


def finish(out: Path | None) -> None:
    if out is not None:
        shutil.rmtree(out / PARTIAL, ignore_errors=True)
