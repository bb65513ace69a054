#!/usr/bin/env bash
# GPU memory by notebook cell of labs 00 and 03 at the h100 tier, for the memory plans
# (each lab's grader/labs/<lab>/plan.py: its moments and MEASURED_PEAKS).
#
#   bash benchmarks/memory_h100.sh OUTDIR        # from the repository root, on an H100 80GB
#
# Each lab's source notebook (under grader/source/, the reference answers) runs in a kernel
# of this interpreter (grader.course.prepare_process_env: nothing is installed, GPULAB_GRADING=1)
# with GPULAB_TIER=h100, its working folder a temporary one, while nvidia-smi reads GPU 0's
# memory.used every 0.5 s; then benchmarks/memory_by_cell.py joins the readings with the cells'
# nbclient times. Only the notebook runs (no grading), each lab under a time limit
# (LAB00_S, default 100 s; LAB03_S, default 200 s; about 5 minutes in all): a lab stopped at its
# limit keeps the cells it finished, since the notebook is written after every cell, and its
# kernel is shut down before the next lab starts. vLLM runs in lab 03 only where it is
# installed (the notebook says which in h100_log.txt).
#
# Writes six files directly under OUTDIR: h100_mem_LAB.txt (the readings, MiB, one a line) and
# h100_memcells_LAB.json (memory_by_cell.py's rows) for each lab, h100_peaks.txt (each lab's highest
# reading, with the GPU's name and the times) and h100_log.txt (everything printed).
# Needs the course's Python packages (requirements.txt: torch, transformers, nbclient, ipykernel).
set -u
out=${1:?usage: bash benchmarks/memory_h100.sh OUTDIR}
mkdir -p "$out"
log="$out/h100_log.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GPULAB_TIER=h100 GPULAB_INSTALL_VLLM=0 PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0; git log -1 --format='%h %ad' --date=iso; } >> "$log" 2>&1
python -c "import nbclient, nbformat, ipykernel, torch, transformers" >> "$log" 2>&1 || { echo "missing packages: see $log" | tee -a "$log"; exit 2; }

for a in 00_foundations 03_inference_serving; do
  limit=$([ "$a" = 00_foundations ] && echo "${LAB00_S:-100}" || echo "${LAB03_S:-200}")
  t0=$(date -u +%FT%T.%3NZ)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 500 > "$out/h100_mem_$a.txt" & smi=$!
  echo "== $a from $t0, limit ${limit} s" >> "$log"
  timeout -k 10 $((limit + 60)) python - "$a" "$work" "$limit" >> "$log" 2>&1 <<'EOF'
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from grader.course import prepare_process_env

lab, work, deadline = sys.argv[1], Path(sys.argv[2]), time.monotonic() + float(sys.argv[3])
prepare_process_env(work / "kernel")  # this interpreter's kernel, GPULAB_REPO, nothing installed
nb = nbformat.read(f"grader/source/{lab}/{lab}.ipynb", as_version=4)
dest = work / f"{lab}.ipynb"
run_dir = work / f"run_{lab}"
run_dir.mkdir()


class OutOfTime(Exception):
    pass


def saved(**_):  # after every cell: a lab stopped at its time limit keeps the cells it finished
    nbformat.write(nb, dest)
    if time.monotonic() > deadline:
        raise OutOfTime  # raised inside nbclient's kernel context: the kernel is shut down


def left(cell):  # a cell may run until the lab's deadline (nbclient then stops it, kernel shut down too)
    return max(5, int(deadline - time.monotonic()))


client = NotebookClient(nb, timeout_func=left, kernel_name="python3", allow_errors=True,
                        resources={"metadata": {"path": str(run_dir)}}, on_cell_executed=saved)
try:
    client.execute()
except Exception as exc:  # out of time, or a cell past the deadline: the cells run so far are kept
    print(f"stopped: {type(exc).__name__}: {str(exc)[:200]}")
finally:
    nbformat.write(nb, dest)
for cell in nb.cells:  # what each cell said, errors included, for the log
    for o in cell.get("outputs", []):
        text = o.get("text") or "".join(o.get("traceback", [])[-1:]) or ""
        if text:
            print(f"[{cell.get('id')}] {text.strip()[:400]}")
EOF
  rc=$?
  kill $smi; wait $smi 2>/dev/null
  t1=$(date -u +%FT%T.%3NZ)
  echo "$a peak_mib $(sort -n "$out/h100_mem_$a.txt" | tail -1) exit $rc from $t0 to $t1" | tee -a "$out/h100_peaks.txt"
  python benchmarks/memory_by_cell.py "$work/$a.ipynb" "$out/h100_mem_$a.txt" --start "$t0" --end "$t1" \
    --json "$out/h100_memcells_$a.json" >> "$log" 2>&1
done
