"""End-to-end GPU check of the grader: ``python -m grader.gpu_check OUT [--assignment ID ...] [--live-only]``.

Runs unattended on a machine with a CUDA GPU and nbgrader installed, for each lab (default: every
registered lab, ``grader/labs/__init__.py``):

1. writes the lab's reference answers into its released notebook (``OUT/<lab>/<lab>.ipynb``,
   :func:`grader.release.reference_submission`);
2. ``python -m grader check`` on it, on the GPU: every cell judged outside the kernel, each measured
   cell against the grader's own measurement here (``OUT/<lab>/check_gpu.json``, ``.txt``; graded
   notebook, record and feedback under ``OUT/<lab>/gpu/``);
3. unless ``--live-only``: the same check with the GPU hidden (``CUDA_VISIBLE_DEVICES=``), given the
   record step 2 wrote and ``--count-provisional``: the measured cells judged from the record,
   provisionally, as on a CPU-only grading machine (``OUT/<lab>/check_from_record.json``, ``.txt``);
4. ``OUT/summary.json``: per lab, each run's score, automatic maximum, wall time and per-cell
   mode and message, the grader's feedback lines, and the record's answers (the numbers for
   benchmarks/RESULTS.md).

Exit status 0 when every run scores full automatic marks.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from grader import REPO_ROOT, labs
from grader.names import LIVE, RECORD


def _check(nb: Path, out: Path, name: str, env: dict, extra: list[str]) -> dict:
    """``python -m grader check`` on ``nb``: exit status, wall time, score and per-cell results."""
    cmd = [sys.executable, "-m", "grader", "check", str(nb), "--json-out", str(out / f"{name}.json"),
           "--out", str(out / name.removeprefix("check_")), *extra]
    t0 = time.perf_counter()
    log = out / f"{name}.txt"  # written as the check runs: a run stopped from outside keeps what it printed
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=fh,
                              stderr=subprocess.STDOUT, text=True)
    wall_s = time.perf_counter() - t0
    print(log.read_text(), flush=True)
    res = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").is_file() else {}
    auto_max = res.get("auto_max_score", res.get("max_score"))
    return {"exit": proc.returncode, "wall_s": round(wall_s, 1), "score": res.get("score"),
            "max_score": res.get("max_score"), "auto_max_score": auto_max, "status": res.get("status"),
            "full_marks": res.get("score") is not None and res.get("score") == auto_max,
            "cells": {c["cell"]: {"score": c["score"], "points": c.get("points"), "mode": c.get("mode"),
                                  "message": c.get("message")} for c in res.get("cells", [])}}


def grader_lines(notebook: Path) -> list[str]:
    """The grader's feedback lines (``grader: <mode>`` and their notes) in a graded notebook."""
    if not notebook.is_file():
        return []
    lines = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                text = "".join(o["text"]).splitlines()
                if text and text[0].startswith("grader:"):
                    lines += text
    return lines


def check_lab(assignment: str, out: Path, live_only: bool) -> dict:
    """Steps 1 to 3 of the module docstring for one lab; its part of the summary."""
    from grader.release import reference_submission

    out.mkdir(parents=True, exist_ok=True)
    nb = out / f"{assignment}.ipynb"
    nb.write_text(json.dumps(reference_submission(assignment), indent=1))
    lab: dict = {"check_gpu": _check(nb, out, "check_gpu", dict(os.environ), [])}
    graded = out / "gpu" / "autograded" / "self"
    lab["lines"] = grader_lines(graded / f"{assignment}.ipynb")
    lab["live_cells"] = sorted(c for c, v in lab["check_gpu"]["cells"].items() if v["mode"] == LIVE)
    record = graded / f"{assignment}.record.json"
    if record.is_file():
        rec = json.loads(record.read_text())
        lab["record"] = {k: rec.get(k) for k in ("tier", "dtype", "fingerprint", "answers", "missing")}
    if live_only:
        lab["check_from_record"] = {"exit": 0, "full_marks": True, "status": "skipped (--live-only)"}
    elif record.is_file():
        cpu_env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        lab["check_from_record"] = _check(nb, out, "check_from_record", cpu_env,
                                          ["--record", str(record), "--count-provisional"])
        lab["record_cells"] = sorted(c for c, v in lab["check_from_record"]["cells"].items() if v["mode"] == RECORD)
    else:
        lab["check_from_record"] = {"exit": None, "full_marks": False,
                                    "status": f"no record at {record}: the GPU run did not finish"}
    return lab


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m grader.gpu_check", description="grade each lab's reference answers "
                                 "live on this GPU, then from the record it wrote with the GPU hidden")
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--assignment", action="append", choices=labs.assignments(),
                    help="a lab (repeat for several; default: every lab)")
    ap.add_argument("--live-only", action="store_true", help="skip step 3 (grading from the record with the GPU "
                    "hidden, which tests/ cover on CPU): saves a CPU run of the whole lab")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; this check needs one (CPU grading is what the tests cover)", file=sys.stderr)
        return 2
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "labs": {}}
    for assignment in a.assignment or labs.assignments():
        summary["labs"][assignment] = check_lab(assignment, out / assignment, a.live_only)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))  # after each lab: a crash keeps the rest
    ok = all(lab[k].get("exit") == 0 and lab[k].get("full_marks") for lab in summary["labs"].values()
             for k in ("check_gpu", "check_from_record"))
    for assignment, lab in summary["labs"].items():
        g, r = lab["check_gpu"], lab["check_from_record"]
        print(f"{assignment}: live {g.get('score')}/{g.get('auto_max_score')} in {g.get('wall_s')} s; "
              f"from record {r.get('score', '-')}/{r.get('auto_max_score', '-')} ({r.get('status')})")
    print(f"wrote {out / 'summary.json'}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
