"""A class graded in shards, and the shards merged back into one set of outputs.

``autograde --shard K/N`` grades the submissions whose position in the class (the order
``grader.submissions.find`` gives, which sorts by student) is K-1 modulo N, and writes
``shard.json`` beside its ``grades.csv``: the assignment, K, N, the class size and each graded
student's position. ``python -m grader merge OUT...`` reads those folders and writes one
``grades.csv``, ``results.json``, ``feedback/`` and ``autograded/``, in the class's order, the
same files an unsharded batch writes. It refuses a set of shards with one missing, one twice,
two of different classes or assignments, or a student graded twice. Hand-written because
nbgrader has no notion of shards: its ``autograde`` grades what it finds, one gradebook.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

MANIFEST = "shard.json"
SCHEMA = "gpulab.shard/1"


class ShardError(Exception):
    """A bad ``--shard`` value or a set of shard outputs that cannot be merged; one line."""


def parse(text: str) -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)``, 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShardError(f"--shard {text!r}: expected K/N, e.g. 2/4 (the second of four shards)") from None
    if not 1 <= k <= n:
        raise ShardError(f"--shard {text}: K must be between 1 and N")
    return k, n


def select(items: list, k: int, n: int) -> list[tuple[int, object]]:
    """``(position, item)`` for the items of shard ``k`` of ``n``: every n-th, from the (k-1)-th."""
    return [(i, x) for i, x in enumerate(items) if i % n == k - 1]


def write_manifest(out: Path, assignment: str, k: int, n: int, class_size: int,
                   positions: dict[str, int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps({"schema": SCHEMA, "assignment": assignment, "shard": k, "of": n,
                                            "class_size": class_size, "positions": positions}, indent=1) + "\n")


def _read(folder: Path) -> dict:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ShardError(f"{folder}: no such folder (pass the --out folder of each shard)")
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardError(f"{folder}: no {MANIFEST}; is it the output of `autograde --shard K/N`?") from None
    except (OSError, ValueError) as e:
        raise ShardError(f"{path}: unreadable ({e})") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise ShardError(f"{path}: not a shard manifest")
    for name in ("grades.csv", "results.json"):
        if not (folder / name).is_file():
            raise ShardError(f"{folder}: no {name}; did that shard finish?")
    return m


def merge(folders: list[Path], dest: Path) -> dict:
    """Merge shard outputs into ``dest``; returns ``{"assignment", "shards", "students"}``."""
    if not folders:
        raise ShardError("merge needs the output folders of the shards")
    manifests = [(Path(f), _read(Path(f))) for f in folders]
    first = manifests[0][1]
    for folder, m in manifests:
        for key in ("assignment", "of", "class_size"):
            if m.get(key) != first.get(key):
                raise ShardError(f"{folder}: {key} {m.get(key)!r}, but {manifests[0][0]} has {first.get(key)!r}: "
                                 "shards of different batches")
    n = first["of"]
    seen: dict[int, Path] = {}
    for folder, m in manifests:
        if m["shard"] in seen:
            raise ShardError(f"shard {m['shard']}/{n} given twice: {seen[m['shard']]} and {folder}")
        seen[m["shard"]] = folder
    if missing := sorted(set(range(1, n + 1)) - set(seen)):
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{n}' for k in missing)} missing "
                         f"from the folders given")
    rows: dict[int, tuple[dict, dict, Path]] = {}
    header: list[str] | None = None
    for folder, m in manifests:
        results = {r["student_id"]: r for r in json.loads((folder / "results.json").read_text())}
        with open(folder / "grades.csv", newline="") as fh:
            reader = csv.DictReader(fh)
            header = header or reader.fieldnames
            for row in reader:
                sid = row["student_id"]
                pos = m["positions"].get(sid)
                if pos is None or sid not in results:
                    raise ShardError(f"{folder}: {sid} is in grades.csv but not in its {MANIFEST} or results.json")
                if pos in rows:
                    raise ShardError(f"{sid} graded in two shards: {rows[pos][2]} and {folder}")
                rows[pos] = (row, results[sid], folder)
    if len(rows) != first["class_size"]:
        raise ShardError(f"the shards hold {len(rows)} of the class's {first['class_size']} submissions")
    dest.mkdir(parents=True, exist_ok=True)
    ordered = [rows[p] for p in sorted(rows)]
    with open(dest / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(row for row, _, _ in ordered)
    (dest / "results.json").write_text(json.dumps([r for _, r, _ in ordered], indent=1, default=str))
    for row, _, folder in ordered:
        for kind in ("feedback", "autograded"):
            src = folder / kind / row["student_id"]
            if src.is_dir():
                shutil.copytree(src, dest / kind / row["student_id"], dirs_exist_ok=True)
    return {"assignment": first["assignment"], "shards": n, "students": len(ordered)}
