"""Scaling table and chart from recorded phase 2 runs: tokens/s per GPU by GPU count, all-reduce bandwidth.

    python benchmarks/scaling_chart.py FOLDER_OR_JSON... [--png FILE] [--title TEXT]

Reads every ``benchmarks/train_multi_gpu.py`` and ``benchmarks/allreduce.py`` result among the
arguments (other JSON files are skipped), prints one markdown row per curve and GPU count
(tokens/s per GPU, scaling efficiency against the curve's 1-GPU point, exposed communication;
``utils.parallel.scaling``), and with ``--png`` draws per-GPU throughput by GPU count beside the
all-reduce bus bandwidth by message size (``utils.plots.per_device_scaling``). Each folder is one
study; ``bash benchmarks/run_gpu.sh OUT scaling`` makes one at 1, 2, 4 and 8 GPUs, as many as
the machine has.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROG = "scaling_chart.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="result folders or JSON files")
    ap.add_argument("--png", type=Path, help="write the chart here")
    ap.add_argument("--title", help="title of the throughput panel")
    a = ap.parse_args(argv)
    from utils.parallel import scaling

    try:
        curves = scaling.training_curves(a.paths)
        allreduce = scaling.allreduce_curves(a.paths)
    except scaling.ScalingDataError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if not curves and not allreduce:
        print(f"{PROG}: error: no train_multi_gpu.py or allreduce.py results in {', '.join(a.paths)}", file=sys.stderr)
        return 2
    if curves:
        print(scaling.markdown_table(curves))
    for label, rows in allreduce.items():
        print(f"all-reduce, {label}: " + ", ".join(f"{b:,} B {g:.1f} GB/s" for b, g in rows))
    if a.png:
        if not a.png.parent.is_dir():
            print(f"{PROG}: error: no folder {a.png.parent} for --png", file=sys.stderr)
            return 2
        try:
            scaling.figure(curves, allreduce or None, title=a.title).savefig(a.png, dpi=120)
        except (OSError, ValueError) as exc:  # unwritable path, unknown image extension
            print(f"{PROG}: error: cannot write {a.png}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
