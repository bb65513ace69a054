"""A class graded on a real one-node Slurm cluster (.ci/slurm-up.sh; Debian's slurmctld, slurmd
and munge, which .ci/install-services.sh installs): deploy/slurm/grade-class.sh grades it in two
array tasks on CPU, a dependent job merges them, and the merged grades equal one unsharded
batch's. The class: the reference answers, the untouched release, and a file that is no notebook."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.release import reference_submission

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "00_foundations"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    d = tmp_path_factory.mktemp("class")
    (d / "ref.ipynb").write_text(json.dumps(reference_submission(ASSIGNMENT)))
    shutil.copyfile(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb", d / "blank.ipynb")
    (d / "junk.ipynb").write_text("this is not a notebook")
    return d


def _grades(folder: Path) -> list[tuple]:
    with open(folder / "grades.csv", newline="") as fh:
        return [(r["student_id"], r["score"], r["max_score"], r["status"]) for r in csv.DictReader(fh)]


def _cells(folder: Path) -> list[tuple]:
    return [(r["student_id"], sorted((c["cell"], c["score"]) for c in r.get("cells", [])))
            for r in json.loads((folder / "results.json").read_text())]


def test_a_class_sharded_on_slurm_and_merged_equals_one_batch(slurm, klass, tmp_path):
    env = {**os.environ, "GPULAB_PYTHON": sys.executable, "GPULAB_GPUS_PER_TASK": "0"}
    whole = tmp_path / "whole"
    proc = subprocess.run([sys.executable, "-m", "grader", "autograde", "--assignment", ASSIGNMENT, "--submissions",
                           str(klass), "--out", str(whole), "--quiet"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "slurm"
    proc = subprocess.run([str(ROOT / "deploy" / "slurm" / "grade-class.sh"), ASSIGNMENT, str(klass), str(out), "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    merged = out / "merged" / "grades.csv"
    deadline = time.monotonic() + 900
    while not merged.is_file() and time.monotonic() < deadline:
        time.sleep(2)
    logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted((out / "logs").glob("*.log")))
    assert merged.is_file(), f"no merged grades after 900 s; logs:\n{logs}"
    time.sleep(1)  # merge writes grades.csv first, then results.json and feedback
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-1", "shard-2"]
    assert _grades(out / "merged") == _grades(whole)
    assert _cells(out / "merged") == _cells(whole)
    got = dict((s, float(score)) for s, score, _, _ in _grades(whole))
    auto = sum(c["metadata"]["nbgrader"].get("points", 0) for c in json.loads(
        (ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb").read_text())["cells"]
        if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade"))
    assert got["ref"] == auto > 0 and got["blank"] == 0 and got["junk"] == 0  # the automatic points; write-ups by hand
    assert sorted(p.name for p in (out / "merged" / "feedback").iterdir()) == sorted(
        p.name for p in (whole / "feedback").iterdir())


def test_merge_names_a_shard_that_failed(slurm, klass, tmp_path):
    """A shard that could not run (here: an assignment that does not exist) leaves no output;
    the merge job still runs (afterany) and its log names the missing shards."""
    env = {**os.environ, "GPULAB_PYTHON": sys.executable, "GPULAB_GPUS_PER_TASK": "0"}
    out = tmp_path / "broken"
    proc = subprocess.run([str(ROOT / "deploy" / "slurm" / "grade-class.sh"), "no_such_lab", str(klass), str(out), "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = out / "logs" / "merge.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "error" not in (log.read_text() if log.is_file() else ""):
        time.sleep(2)
    assert "error:" in log.read_text() and "no such folder" in log.read_text()
