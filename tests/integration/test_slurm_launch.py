"""Lab 02's training run launched across "nodes" on a real one-node Slurm cluster (.ci/slurm-up.sh):
deploy/slurm/train-multi-node.sbatch submitted as two Slurm tasks on the one node, each a torchrun
agent (--nnodes 2 --nproc-per-node 1) meeting the other at a c10d rendezvous, one CPU worker each
over gloo at lab 02's smoke sizes. The job must complete, rank 0's JSON must show a world of 2 with
both ranks' throughput and identical replicas (the gradients crossed between the tasks), and each
task's log must show the worker it started. The same launch runs lab 02's all-reduce benchmark.
The script's own input errors are checked without Slurm."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.labs import sizes as lab_sizes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "train-multi-node.sbatch"
# A job is two processes importing torch, then seconds of training: 48 to 122 s per job measured on
# 2 cores shared with other work (load average 12 to 15). The bound only stops a job that hangs
# (torchrun's rendezvous waits 600 s for a missing agent).
DEADLINE_S = 420
WORKER = re.compile(r"worker: rank (\d+) of (\d+), local rank (\d+), node rank (\d+); Slurm task (\d+) on (\S+); "
                    r"workers store at (\S+)")


def _smoke_args() -> list[str]:
    """train_multi_gpu.py's options at lab 02's CPU sizes, as utils/parallel/launch.py run_training passes them."""
    s = lab_sizes("02_multi_gpu", "cpu")
    return ["--preset", s.model, "--batch-per-device", str(s.batch_per_device), "--seq", str(s.seq_len),
            "--steps", str(s.steps), "--warmup", str(s.warmup)]


def _job_state(job: str) -> tuple[str, str]:
    """(JobState, ExitCode) from scontrol: the cluster keeps no accounting database, so no sacct."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30).stdout
    state = re.search(r"\bJobState=(\S+)", line)
    code = re.search(r"\bExitCode=(\S+)", line)
    return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "?")


def _logs(folder: Path) -> str:
    return "".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-2000:]}\n" for p in sorted(folder.rglob("*.log")))


def _run_job(tmp_path: Path, args: list[str], **env_extra: str) -> Path:
    """Submit the batch script as two Slurm tasks on the one node, one CPU worker each; wait for
    it (bounded: cancelled and failed past DEADLINE_S); its OUT folder once it completed."""
    out = tmp_path / "run"
    env = {**os.environ, "GPULAB_PYTHON": sys.executable, "GPULAB_GPUS_PER_NODE": "0", **env_extra}
    proc = subprocess.run(["sbatch", "--parsable", "--nodes", "1", "--ntasks", "2", "--ntasks-per-node", "2",
                           "--cpus-per-task", "1", "--time", "5", "--chdir", str(ROOT),
                           "--output", str(tmp_path / "job.log"), str(SCRIPT), str(out), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + DEADLINE_S
    state, code = _job_state(job)
    while state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(2)
        state, code = _job_state(job)
    if state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        reason = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True).stdout
        subprocess.run(["scancel", job], capture_output=True)
        pytest.fail(f"job {job} still {state} after {DEADLINE_S} s ({reason.strip()}); cancelled. Logs:\n{_logs(tmp_path)}")
    assert (state, code) == ("COMPLETED", "0:0"), f"job {job} ended {state} (exit {code}); logs:\n{_logs(tmp_path)}"
    return out


def _workers(out: Path) -> dict[int, tuple[int, int, str]]:
    """Slurm task -> (global rank, node rank, workers' store) of the one worker each task's agent started."""
    workers = {}
    for task in (0, 1):
        log = out / f"task-{task}.log"
        assert log.is_file(), f"no log of Slurm task {task}; logs:\n{_logs(out)}"
        found = [m.groups() for m in WORKER.finditer(log.read_text())]
        assert len(found) == 1, f"task {task} should start exactly one worker:\n{log.read_text()}"
        rank, world, local, node, slurm_task, _host, store = found[0]
        assert (world, local, slurm_task) == ("2", "0", str(task)), found[0]
        workers[task] = (int(rank), int(node), store)
    assert sorted(w[0] for w in workers.values()) == [0, 1], workers  # one global rank per task
    assert sorted(w[1] for w in workers.values()) == [0, 1], workers  # the rendezvous gave each agent a node rank
    assert workers[0][2] == workers[1][2] and workers[0][2].startswith("127.0.0.1:"), workers  # one store, loopback
    return workers


@pytest.mark.slow
def test_two_slurm_tasks_train_as_two_nodes_over_a_c10d_rendezvous(slurm, tmp_path):
    out = _run_job(tmp_path, _smoke_args())
    res = json.loads((out / "result.json").read_text())
    assert res["world_size"] == 2 and res["distributed_type"] == "MULTI_CPU", res
    assert res["sharding_strategy"] == "DDP (replicated)" and res["replicas_identical"] is True
    assert res["tokens_per_s_per_device"] > 0
    assert sorted(r["rank"] for r in res["per_rank"]) == [0, 1]
    assert all(r["tokens_per_s"] > 0 and r["device"].startswith("cpu") for r in res["per_rank"]), res["per_rank"]
    _workers(out)


@pytest.mark.slow
def test_the_same_launch_measures_the_all_reduce_across_the_tasks(slurm, tmp_path):
    """GPULAB_SCRIPT=benchmarks/allreduce.py: the bus bandwidth between "nodes", as lab 02 measures it on one."""
    sizes = lab_sizes("02_multi_gpu", "cpu").allreduce_sizes.split(",")[:2]
    out = _run_job(tmp_path, ["--smoke", "--sizes", ",".join(sizes), "--iters", "5"], GPULAB_SCRIPT="benchmarks/allreduce.py")
    res = json.loads((out / "result.json").read_text())
    assert res["world_size"] == 2 and res["backend"] == "gloo", res
    assert [r["n_ranks"] for r in res["results"]] == [2, 2]
    for r in res["results"]:  # 2 ranks: busbw = algbw x 2(n-1)/n = algbw
        assert r["busbw_gbs"] > 0 and r["busbw_gbs"] == pytest.approx(r["algbw_gbs"]), r
    _workers(out)


def _direct(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    """The batch script run by hand, as a mistaken user might: its checks come before any srun."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GPULAB_"))}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env={**env, **env_extra}, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("env_extra, args, says", [
    ({}, ("out",), "submit this with sbatch"),
    ({"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(ROOT)}, (), "usage:"),
    ({"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": "/"}, ("out",), "is not the course root"),
    ({"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(ROOT), "GPULAB_SCRIPT": "benchmarks/nope.py"}, ("out",), "not found"),
    ({"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(ROOT)}, ("out",), "how many GPUs per node"),
    ({"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(ROOT), "GPULAB_GPUS_PER_NODE": "two"}, ("out",), "whole number"),
])
def test_the_batch_script_refuses_bad_input_in_one_line(env_extra, args, says, tmp_path):
    proc = _direct(env_extra, *[str(tmp_path / a) for a in args])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()  # refused before it made anything
