"""Every lab's reference solution graded N times in smoke mode beside a busy core: passes per lab.

A process spinning ``while True: pass`` (tests/busy.py) keeps one core busy for the whole run, and
each lab's reference answers (``grader.release.reference_submission``) are graded one at a time
with ``python -m grader check``, with no ``--timeout``: the grader picks the cell time limit from
the machine's measured speed and load (docs/grading.md#cell-timeouts-from-the-machines-speed). A run
passes when it exits 0 with full marks. The goal is N of N for every lab.

    .venv/bin/python benchmarks/grade_under_load.py [--n 10] [--labs 00_foundations,04_benchmarking_production]
        [--busy 1] [--json-out benchmarks/results/cpu-grading-under-load/grade_under_load.json]

Writes one JSON (machine, command, the load averages before and after, per lab: passes, each
run's wall time, time limit and failed cells) and prints one markdown table row per lab. Other work
on the machine adds to the load: the load averages say how much there was.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from utils.device.hardware import _cpu_name

ROOT = Path(__file__).resolve().parents[1]

LABS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving", "04_benchmarking_production",
        "05_hardware_and_cost")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu-grading-under-load" / "grade_under_load.json"


def _busy_module():
    spec = importlib.util.spec_from_file_location("busy", ROOT / "tests" / "busy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def grade_once(lab: str, notebook: Path, work: Path, wait_s: float) -> dict:
    """One ``python -m grader check`` of ``notebook``: passed, wall time, the time limit, failures."""
    out = work / f"{lab}.{time.monotonic_ns()}.json"
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "grader", "check", str(notebook), "--json-out", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=wait_s)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        rc, tail = None, [f"no result after {wait_s:.0f} s"]
    wall = time.monotonic() - t0
    res = json.loads(out.read_text()) if out.is_file() else {}
    failed = {c["cell"]: c.get("message", "") for c in res.get("cells", [])
              if c.get("mode") != "manual" and c.get("score") != c.get("points")}  # written answers: the instructor's
    passed = rc == 0 and bool(res.get("cells")) and res.get("score") == res.get("auto_max_score", res.get("max_score"))
    return {"passed": passed, "rc": rc, "wall_s": round(wall, 1), "score": res.get("score"),
            "max_score": res.get("max_score"), "status": res.get("status"), "timeout_s": res.get("timeout_s"),
            "timeout_why": res.get("timeout_why"), "failed_cells": failed, "tail": [] if passed else tail}


def row(lab: str, r: dict) -> str:
    walls = [x["wall_s"] for x in r["runs"]]
    limits = sorted({x["timeout_s"] for x in r["runs"] if x["timeout_s"]})
    return (f"| {lab} | {r['passes']} / {len(r['runs'])} | {min(walls):.0f} to {max(walls):.0f} s | "
            f"{', '.join(f'{s} s' for s in limits) or '-'} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10, help="grades per lab (default 10)")
    p.add_argument("--labs", default=",".join(LABS), help="comma-separated assignment ids (default: all six)")
    p.add_argument("--busy", type=int, default=1, help="busy processes, one core each (default 1)")
    p.add_argument("--wait", type=float, default=1800.0, help="seconds one grade may take before it counts as failed")
    p.add_argument("--json-out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    labs = [x.strip() for x in a.labs.split(",") if x.strip()]
    unknown = [x for x in labs if x not in LABS]
    if unknown:
        p.error(f"unknown lab {unknown[0]!r} (known: {', '.join(LABS)})")
    if a.n < 1 or a.busy < 0:
        p.error("--n must be at least 1 and --busy at least 0")

    from grader.release import reference_submission

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still kills its busy processes
    busy = _busy_module()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gpulab-under-load-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        procs = [stack.enter_context(busy.busy_core()) for _ in range(a.busy)]
        for lab in labs:
            nb = work / f"{lab}.ipynb"
            nb.write_text(json.dumps(reference_submission(lab)))
            runs = []
            for i in range(a.n):
                cpu0, t0 = [busy.cpu_seconds(q) for q in procs], time.monotonic()
                r = grade_once(lab, nb, work, a.wait)
                spun = [busy.cpu_seconds(q) - c for q, c in zip(procs, cpu0, strict=True)]
                r["busy_cpu_share"] = [round(s / max(time.monotonic() - t0, 1e-9), 2) for s in spun]
                runs.append(r)
                print(f"{lab} {i + 1}/{a.n}: {'pass' if r['passed'] else 'FAIL'} {r['wall_s']} s, limit "
                      f"{r['timeout_s']} s" + ("" if r["passed"] else f": {r['failed_cells'] or r['tail']}"),
                      file=sys.stderr, flush=True)
            results[lab] = {"passes": sum(r["passed"] for r in runs), "runs": runs}
            write(a.json_out, summary(a, argv, started, load_before, results))  # after each lab: a kill keeps these
    out = summary(a, argv, started, load_before, results)
    write(a.json_out, out)
    print("| lab | passes | wall time per grade | cell time limit chosen |")
    print("|---|---|---|---|")
    for line in out["table"]:
        print(line)
    return 0 if all(r["passes"] == a.n for r in results.values()) else 1


def write(path: Path, out: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


def summary(a, argv, started, load_before, results: dict) -> dict:
    return {
        "what": "each lab's reference solution graded with python -m grader check (smoke mode, no --timeout) "
                "while busy processes spin on one core each",
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/grade_under_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpu": _cpu_name(), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count(), "python": platform.python_version()},
        "n": a.n, "busy_processes": a.busy,
        "loadavg_before_after": [load_before, os.getloadavg() if hasattr(os, "getloadavg") else None],
        "labs": results,
        "table": [row(lab, r) for lab, r in results.items()],
    }


if __name__ == "__main__":
    sys.exit(main())
