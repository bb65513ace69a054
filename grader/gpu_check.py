"""End-to-end GPU check of the grader: ``python -m grader.gpu_check OUT_DIR [--assignment ID]`` (default phase 0).

Runs unattended on a machine with a CUDA GPU and nbgrader installed:

1. writes the reference answers into the released notebook (``OUT/00_foundations.ipynb``);
2. ``python -m grader check`` on it, on the GPU: every measured cell re-measured live
   (``OUT/check_gpu.json``, ``.txt``; graded notebook, record and feedback under ``OUT/gpu/``);
3. the same check with the GPU hidden (``CUDA_VISIBLE_DEVICES=``), given the record step 2
   wrote: the measured cells are graded from the record, as on a CPU-only grading machine
   (``OUT/check_from_record.json``, ``.txt``);
4. ``OUT/summary.json``: both scores, how each cell was graded, every recorded measurement
   with its unit, and the grader's live comparison lines (the numbers for benchmarks/RESULTS.md).

Exit status 0 when both runs score full marks (``--live-only``: when step 2 does).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from grader import REPO_ROOT

ASSIGNMENT = "00_foundations"


def _check(nb: Path, out: Path, name: str, env: dict, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "grader", "check", str(nb), "--json-out", str(out / f"{name}.json"),
           "--out", str(out / name.removeprefix("check_")), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    (out / f"{name}.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    print(proc.stdout, flush=True)
    res = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").is_file() else {}
    return {"exit": proc.returncode, "wall_s": round(wall_s, 1), "score": res.get("score"), "max_score": res.get("max_score"),
            "auto_max_score": res.get("auto_max_score", res.get("max_score")), "status": res.get("status"), "cells": {c["cell"]: {"score": c["score"], "mode": c.get("mode"),
                                                              "message": c.get("message")} for c in res.get("cells", [])}}


def _grader_lines(notebook: Path) -> list[str]:
    if not notebook.is_file():
        return []
    lines = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                lines += [ln for ln in "".join(o["text"]).splitlines() if ln.startswith("grader:")]
    return lines


def _cell_errors(notebook: Path) -> list[str]:
    """One line per cell of the graded notebook that raised: its index, the error and its message's
    first line. A test cell's NameError names only the symptom; the cell above it names the cause."""
    if not notebook.is_file():
        return []
    found = []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                first = (o.get("evalue") or "").strip().splitlines()[:1]
                found.append(f"cell {i}: {o.get('ename')}: {first[0][:400] if first else ''}")
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m grader.gpu_check", description="grade a lab's reference answers "
                                 "live on this GPU, then from the record it wrote with the GPU hidden")
    ap.add_argument("out", help="output folder")
    ap.add_argument("--assignment", default=ASSIGNMENT, help=f"the lab (default {ASSIGNMENT})")
    ap.add_argument("--live-only", action="store_true", help="skip step 3 (grading from the record with the GPU "
                    "hidden, which tests/ cover on CPU): saves a CPU run of the whole lab")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    args = [a.out]
    assignment = a.assignment
    import torch

    from grader.release import reference_submission

    out = Path(args[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; this check needs one (CPU grading is what the tests cover)", file=sys.stderr)
        return 2
    nb = out / f"{assignment}.ipynb"
    nb.write_text(json.dumps(reference_submission(assignment), indent=1))
    summary: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    summary["check_gpu"] = _check(nb, out, "check_gpu", dict(os.environ), [])
    graded = out / "gpu" / "autograded" / "self"
    record = graded / f"{assignment}.record.json"
    summary["live_lines"] = _grader_lines(graded / f"{assignment}.ipynb")
    summary["cell_errors"] = _cell_errors(graded / f"{assignment}.ipynb")
    if record.is_file():
        rec = json.loads(record.read_text())
        summary["measurements"] = {k: {"value": m["value"], "unit": m["unit"], "method": m.get("method"),
                                       "spread": m.get("spread"), **{f: m["extra"].get(f) for f in ("placement", "limiter")
                                                                     if f in m.get("extra", {})}}
                                   for k, m in rec["measurements"].items()}
        summary["fingerprint"] = rec.get("fingerprint")
        cpu_env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        if a.live_only:
            summary["check_from_record"] = {"exit": 0, "status": "skipped (--live-only)"}
        else:
            summary["check_from_record"] = _check(nb, out, "check_from_record", cpu_env, ["--record", str(record)])
    else:
        summary["check_from_record"] = {"exit": None, "status": f"no record at {record}: the GPU run did not finish"}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    ok = all(summary[k].get("exit") == 0 for k in ("check_gpu", "check_from_record"))
    print(json.dumps({k: summary[k] for k in ("gpu", "check_gpu", "check_from_record", "cell_errors")}, indent=1,
                     default=str))
    print(f"wrote {out / 'summary.json'}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
