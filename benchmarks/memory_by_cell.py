"""GPU memory by notebook cell: which cell of a graded lab held the most device memory.

    python benchmarks/memory_by_cell.py NOTEBOOK SAMPLES --start T0 [--end T1 | --interval-s 0.5] [--json OUT]

NOTEBOOK is an executed notebook whose cells carry nbclient's execution times
(``metadata.execution``: ``iopub.execute_input`` and ``shell.execute_reply``, which nbclient records
by default, ``NotebookClient.record_timing``; nbgrader's autograde executes through it). SAMPLES is
the output of ``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500``: one
MiB reading per line, device-wide, started at T0 (ISO 8601 UTC, as ``date -u +%FT%T.%3NZ`` writes).
With ``--end`` (when the sampling stopped) the readings are spread evenly between T0 and T1, which
absorbs the drift of nvidia-smi's own interval; without it they are ``--interval-s`` apart.

Printed: each cell's highest reading while it ran, then the highest before the first cell (the
kernel starting) and after the last (the grader's own work once the notebook is done: the clean
process, engines shutting down). The readings hold what the CUDA caching allocator keeps reserved,
every process's CUDA context and library workspaces, so a cell's row is the device's state while it
ran, not what that cell allocated. ``bash benchmarks/run_gpu.sh OUT t4`` runs this after each lab.

Written by hand: nvidia-smi's readings carry no cell and nbclient's times carry no memory; joining
the two is all this file does.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import datetime
from pathlib import Path

PROG = "memory_by_cell.py"


class InputError(Exception):
    """A file or time this tool cannot use, said in one line."""


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; a trailing ``Z`` and more than 6 fractional digits are accepted."""
    t = text.strip().replace("Z", "+00:00")
    if "." in t:
        head, frac = t.split(".", 1)
        digits = "".join(itertools.takewhile(str.isdigit, frac))
        t = f"{head}.{digits[:6].ljust(6, '0')}{frac[len(digits):]}"
    try:
        out = datetime.fromisoformat(t)
    except ValueError:
        raise InputError(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-04T15:17:16.120Z)") from None
    if out.tzinfo is None:
        raise InputError(f"{text!r} has no time zone: give UTC with a trailing Z")
    return out


def read_samples(path: Path) -> list[int | None]:
    """One reading per line, in MiB; a line nvidia-smi could not fill (``[N/A]``) stays as None,
    so that the readings after it keep their times."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise InputError(f"cannot read the memory samples {path}: {e.strerror}") from None
    out = [int(x) if x.strip().isdigit() else None for x in lines if x.strip()]
    if not any(v is not None for v in out):
        raise InputError(f"{path} holds no memory readings (one MiB value per line, from nvidia-smi -lms)")
    return out


def cell_times(path: Path) -> list[tuple[str, datetime, datetime]]:
    """``(cell id, start, end)`` of every cell that ran, in order."""
    try:
        nb = json.loads(path.read_text())
    except OSError as e:
        raise InputError(f"cannot read the notebook {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not a notebook (invalid JSON at line {e.lineno})") from None
    rows = []
    for i, cell in enumerate(nb.get("cells", [])):
        ex = (cell.get("metadata") or {}).get("execution") or {}
        if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            name = cell.get("id") or f"cell {i}"
            rows.append((name, parse_time(ex["iopub.execute_input"]), parse_time(ex["shell.execute_reply"])))
    if not rows:
        raise InputError(f"{path} has no cell execution times: execute it with nbclient (record_timing, the default)")
    return rows


def by_cell(samples: list[int | None], start: datetime, cells, interval_s: float) -> list[dict]:
    """Each cell's highest reading while it ran (None where no reading fell inside it), then the
    rows ``before the first cell`` and ``after the last cell``."""
    def seconds(t: datetime) -> float:
        return (t - start).total_seconds()

    def peak(lo: float, hi: float) -> int | None:
        i0, i1 = max(0, int(lo / interval_s)), min(len(samples), int(hi / interval_s) + 1)
        vals = [v for v in samples[i0:i1] if v is not None]
        return max(vals) if vals else None

    end_s = len(samples) * interval_s
    rows = [{"cell": "before the first cell", "start_s": 0.0, "end_s": seconds(cells[0][1]),
             "peak_mib": peak(0.0, seconds(cells[0][1]))}]
    for name, a, b in cells:
        rows.append({"cell": name, "start_s": seconds(a), "end_s": seconds(b), "peak_mib": peak(seconds(a), seconds(b))})
    rows.append({"cell": "after the last cell", "start_s": seconds(cells[-1][2]), "end_s": end_s,
                 "peak_mib": peak(seconds(cells[-1][2]), end_s)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path, help="an executed notebook (nbclient's cell times in its metadata)")
    ap.add_argument("samples", type=Path, help="nvidia-smi memory.used readings, one MiB value per line")
    ap.add_argument("--start", required=True, help="when the first reading was taken (ISO 8601 UTC)")
    ap.add_argument("--end", help="when the sampling stopped (spreads the readings evenly up to it)")
    ap.add_argument("--interval-s", type=float, default=0.5, help="seconds between readings, without --end")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    a = ap.parse_args(argv)
    try:
        samples = read_samples(a.samples)
        start = parse_time(a.start)
        interval = a.interval_s
        if a.end:
            interval = (parse_time(a.end) - start).total_seconds() / len(samples)
        if not interval > 0:
            raise InputError("the readings' interval must be positive: --end must come after --start")
        rows = by_cell(samples, start, cell_times(a.notebook), interval)
        if all(r["peak_mib"] is None for r in rows[1:-1]):
            raise InputError(f"no reading falls inside any cell of {a.notebook} (readings from {a.start} for "
                             f"{len(samples) * interval:.0f} s): check --start")
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    top = max((r["peak_mib"] or 0) for r in rows)
    first = next(r for r in rows if r["peak_mib"] == top)
    print(f"{'cell':32s} {'from s':>8s} {'to s':>8s} {'peak MiB':>9s}")
    for r in rows:
        mark = "  <- the device's highest, first reached here" if r is first else ""
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:,}"
        print(f"{r['cell'][:32]:32s} {r['start_s']:8.1f} {r['end_s']:8.1f} {peak:>9s}{mark}")
    if a.json:
        a.json.write_text(json.dumps({"notebook": str(a.notebook), "samples": str(a.samples), "start": a.start,
                                      "interval_s": interval, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
