"""Launching lab 02's multi-process runs the way people launch them, and where they go.

``torchrun`` runs the all-reduce benchmark (``benchmarks/allreduce.py``) and ``accelerate
launch`` with the configs in ``benchmarks/accelerate/`` runs training
(``benchmarks/train_multi_gpu.py``) and TRL post-training (``benchmarks/post_train_trl.py``),
one process per GPU over NCCL. Without two GPUs the runs are two CPU processes over gloo at
smoke sizes (:func:`plan_for`): the same code, a check of the plumbing; one GPU cannot show
scaling across GPUs. Each ``run_*`` prints the command, runs it in its own process group
(all of it is killed on a timeout or an interrupt), keeps its output out of the notebook
(stderr in a test cell would cost the cell its points) and returns the JSON the script wrote.

The notebook and the grader's re-measurements (``grader/labs/multi_gpu/reference.py``) launch through here, the
per-rank memory of DDP, ZeRO-1 and FSDP2 (``utils/parallel/zero_memory.py``, run as a module) too.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from utils.course import env
from utils.parallel.grad_sync import write_answer_module

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {name: REPO / "benchmarks" / "accelerate" / f"{name}.yaml" for name in ("ddp", "fsdp_full_shard",
                                                                                   "fsdp_shard_grad_op")}
TRAIN, ALLREDUCE = REPO / "benchmarks" / "train_multi_gpu.py", REPO / "benchmarks" / "allreduce.py"
POST_TRAIN = REPO / "benchmarks" / "post_train_trl.py"
# NVLink multicast (NVLS) off in every launched process (launch_env): the runs share their host
MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"))
TIMEOUT_S = {"gloo": 170.0, "nccl": 540.0}  # one launch, processes started to JSON written


class Plan(NamedTuple):
    backend: str  # "nccl": one process per GPU; "gloo": CPU processes
    nproc: int  # processes of the N-device runs
    n_gpus: int
    tier: str  # the sizes' tier (utils.course.env)
    sizes: Any  # grader/labs/multi_gpu/sizes.py's Phase2Sizes
    note: str
    work: str  # folder for the runs' JSON and logs

    @property
    def kind(self) -> str:
        return "cpu" if self.backend == "gloo" else "gpu"


def plan_for(n_gpus: int, smoke: bool, tier: str, by_tier: Mapping[str, Any], work: str | None = None) -> Plan:
    """Two or more GPUs: N = all of them over NCCL at the tier's sizes. Otherwise two CPU
    processes over gloo at smoke sizes (one process per GPU is what DDP needs, so one GPU
    cannot show scaling). ``by_tier`` is the lab's sizes by tier, ``cpu`` (smoke) included
    (``grader/labs/multi_gpu/sizes.py``'s ``BY_TIER``)."""
    work = work or tempfile.mkdtemp(prefix="gpulab-phase2-")
    if not smoke and n_gpus >= 2:
        return Plan("nccl", n_gpus, n_gpus, tier, by_tier[tier],
                    f"{n_gpus} GPUs: one process per GPU over NCCL, {tier} sizes", work)
    if not smoke and n_gpus == 1:
        note = ("ONE GPU: scaling across GPUs cannot be measured here (DDP needs a process per GPU). The "
                "multi-process cells run 2 CPU processes over gloo at smoke sizes instead: the same code, graded as "
                "plumbing. For real numbers use two GPUs (Kaggle: Accelerator > GPU T4 x2).")
    else:
        note = "NO GPU (smoke mode): 2 CPU processes over gloo at tiny sizes; the numbers check the plumbing, not a GPU."
    return Plan("gloo", 2, n_gpus, "cpu", by_tier["cpu"], note, work)


def plan(by_tier: Mapping[str, Any], work: str | None = None) -> Plan:
    """The plan for this machine (``utils.course.env``: smoke mode, GPU count, size tier), at the
    sizes ``by_tier`` gives each tier (:func:`plan_for`)."""
    import torch

    smoke = env.smoke_mode()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return plan_for(n, smoke, "cpu" if smoke else env.device_tier(), by_tier, work)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(p: Plan, extra: dict | None = None) -> dict:
    """The child processes' environment: multicast off (shared hosts), offline, the repo
    importable; CPU plans hide the GPUs and give each process an equal share of the cores
    (the 1-process baseline too, so per-device throughputs compare like with like)."""
    env = dict(os.environ)
    for k, v in MULTICAST_OFF:
        env.setdefault(k, v)
    env.update({"MASTER_ADDR": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))})
    if p.backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = str(max(1, min(8, (os.cpu_count() or 2) // p.nproc)))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


# Lines of torchrun's failure summary (torch/distributed/elastic/multiprocessing/errors/__init__.py,
# ChildFailedError.format_msg): they frame a failure and never say what it was.
_SUMMARY_NOISE = ("error_file:", "traceback :", "traceback:", "root cause", "exitcode", "host ", "host:", "rank ", "rank:",
                  "time ", "time:", "failures:", "<no_other_failures>", "to enable traceback")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b:?")
_SIGNAL_LINE = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID")
# Failures that are the machine's, not the script's: the rendezvous port taken between choosing it and
# binding it, a peer's socket reset or refused (gloo's connectFullMesh, c10d's TCPStore), a rank killed
# by a signal (the out-of-memory killer on a shared machine). One fresh launch is worth it; a bug fails again.
TRANSIENT = ("address already in use", "eaddrinuse", "connection reset by peer", "connection refused", "connectfullmesh",
             "distnetworkerror", "diststoreerror", "broken pipe", "connection closed by peer", "failed to recv",
             "socket timeout", "sigkill", "sigbus")
LAUNCH_ATTEMPTS = 2


def why_failed(text: str) -> str:
    """The line of a failed run's output that says why: a script's own one-line error (argparse
    style), else the last exception line of a rank's traceback, else a signal that killed a rank,
    else the last line that mentions an error. torchrun's summary block (``error_file: <N/A>``,
    ``ChildFailedError``) is skipped: it only frames the failure."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.lower().startswith(_SUMMARY_NOISE) and "ChildFailedError" not in ln
              and not set(ln) <= set("=-_*")]
    for ln in reversed(useful):
        if ": error: " in ln:
            return ln[:300]
    for ln in reversed(useful):
        if _EXCEPTION_LINE.match(ln):
            return ln[:300]
    for i in range(len(lines) - 1, -1, -1):  # a C++ exception no one caught: std::terminate, then SIGABRT
        if lines[i].startswith("what():") and i and lines[i - 1].startswith("terminate called after throwing"):
            kind = lines[i - 1].split("an instance of", 1)[-1].strip(" '")
            return f"a rank aborted on an uncaught C++ exception ({kind}): {lines[i][7:].strip()}"[:300]
        if lines[i].startswith("terminate called without an active exception"):
            return "a rank aborted: terminate called without an active exception (a thread left running at exit)"
    for ln in reversed(lines):
        if m := _SIGNAL_LINE.search(ln):
            cause = {"SIGKILL": "out of memory, or stopped from outside", "SIGABRT": "it aborted itself (a failed check "
                     "or an uncaught C++ error in native code)", "SIGSEGV": "a crash in native code"}.get(m.group(2), "stopped from outside")
            return f"a process was killed by signal {m.group(1)} ({m.group(2)}): {cause}"
    for ln in reversed(useful):
        if ("error" in ln.lower() or "Exception" in ln) and not ln.startswith(("File ", "Traceback", "raise ")):
            return ln[:300]
    return useful[-1][:300] if useful else (lines[-1][:300] if lines else "no output")


def transient(text: str) -> str | None:
    """The signature in a failed run's output that makes it the machine's failure (:data:`TRANSIENT`), or None."""
    low = text.lower()
    return next((t for t in TRANSIENT if t in low), None)


def _launch(make_cmd, shown: str, out: Path, env: dict, timeout_s: float, verbose: bool) -> dict:
    """Run ``make_cmd()`` in its own process group; the JSON it wrote at ``out``, or RuntimeError.
    A failure whose output is the machine's (:func:`transient`) is launched once more, with a fresh
    command (a new rendezvous port), and the second failure is reported; a timeout is not retried."""
    if verbose:
        print("$ " + shown, flush=True)
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, LAUNCH_ATTEMPTS + 1):
        out.unlink(missing_ok=True)
        proc = subprocess.Popen(make_cmd(), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            so, se = proc.communicate(timeout=timeout_s)
        except BaseException as exc:  # timeout, or the notebook interrupted: take every rank down with it
            os.killpg(proc.pid, signal.SIGKILL)
            so, se = proc.communicate()
            log.write_text(f"$ {shown}\n--- stdout ---\n{so}\n--- stderr ---\n{se}")
            if isinstance(exc, subprocess.TimeoutExpired):
                raise RuntimeError(f"`{shown.split(' --out')[0]}` ran past {timeout_s:.0f} s and was stopped; log: {log}") from None
            raise
        log.write_text(f"$ {shown}\n--- stdout ---\n{so}\n--- stderr ---\n{se}")
        if proc.returncode == 0 and out.is_file():
            break
        why = transient(se + "\n" + so)
        if why is None or attempt == LAUNCH_ATTEMPTS:
            again = f" (launched twice: the first failed on {why!r} too)" if why and attempt > 1 else ""
            raise RuntimeError(f"`{shown.split(' --out')[0]} ...` failed (exit {proc.returncode}): {why_failed(se + chr(10) + so)}"
                               f"{again}; full log: {log}")
        log.rename(log.with_suffix(f".attempt{attempt}.log"))
        if verbose:
            print(f"  the launch failed on the machine's side ({why!r}); launching it once more", flush=True)
    res = json.loads(out.read_text())
    res["file"] = str(out)
    return res


def run_training(p: Plan, nproc: int, name: str, *, config: str = "ddp", batch_per_device: int | None = None,
                 grad_accum: int = 1, no_sync_accum: bool = False, measure_comm: bool = False,
                 baseline: dict | None = None, env: dict | None = None, verbose: bool = True) -> dict:
    """``accelerate launch --config_file benchmarks/accelerate/<config>.yaml --num_processes
    <nproc> benchmarks/train_multi_gpu.py ...`` at the plan's sizes; returns its JSON (plus
    ``file``). ``baseline``: a 1-process result, for the script's own scaling efficiency."""
    s = p.sizes
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; use one of {', '.join(CONFIGS)}")
    if not 1 <= nproc <= p.nproc:
        raise ValueError(f"nproc must be between 1 and {p.nproc} here, got {nproc!r}")
    out = Path(p.work) / f"{name}.json"
    args = ["--preset", s.model, "--batch-per-device", str(batch_per_device or s.batch_per_device), "--seq",
            str(s.seq_len), "--steps", str(s.steps), "--warmup", str(s.warmup), "--grad-accum", str(grad_accum)]
    args += ["--bf16"] * s.bf16 + ["--compile"] * s.compile + ["--no-sync-accum"] * no_sync_accum
    args += ["--measure-comm"] * measure_comm
    if baseline is not None:
        args += ["--baseline", str(baseline["file"])]
    launch = ["--config_file", str(CONFIGS[config]), "--num_processes", str(nproc)]
    def cmd() -> list[str]:  # a fresh rendezvous port for each attempt
        return [sys.executable, "-m", "accelerate.commands.launch", *launch, "--main_process_ip", "127.0.0.1",
                "--main_process_port", str(_free_port()), str(TRAIN), "--out", str(out), *args]
    pre = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = (f"{pre + ' ' if pre else ''}accelerate launch --config_file benchmarks/accelerate/{config}.yaml "
             f"--num_processes {nproc} benchmarks/train_multi_gpu.py --out {out.name} " + " ".join(
                 a if not a.startswith("/") else Path(a).name for a in args))
    res = _launch(cmd, shown, out, launch_env(p, env), TIMEOUT_S[p.backend], verbose)
    if verbose:
        extra = "".join(f", {k.replace('_', ' ')} {res[k]:.1%}" for k in ("exposed_comm_share", "scaling_efficiency")
                        if isinstance(res.get(k), float))
        mem = [m for m in res.get("peak_allocated_gib_per_rank") or [] if m is not None]
        print(f"  {res['world_size']} process(es), {res.get('sharding_strategy')}: "
              f"{res['tokens_per_s_per_device']:,.0f} tokens/s per device{extra}"
              + (f", peak {max(mem):.2f} GiB" if mem else ""), flush=True)
    return res


def run_allreduce(p: Plan, name: str = "allreduce", *, env: dict | None = None, verbose: bool = True) -> dict:
    """``torchrun --standalone --nproc_per_node N benchmarks/allreduce.py`` at the plan's
    sizes (``--smoke``: gloo on CPU processes); returns its JSON (plus ``file``)."""
    s = p.sizes
    out = Path(p.work) / f"{name}.json"
    args = ["--sizes", s.allreduce_sizes, "--iters", str(s.allreduce_iters)] + ["--smoke"] * (p.backend == "gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(p.nproc), str(ALLREDUCE),
           "--out", str(out), *args]  # --standalone: torchrun picks a free port itself
    pre = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    shown = (f"{pre + ' ' if pre else ''}torchrun --standalone --nproc_per_node {p.nproc} benchmarks/allreduce.py "
             f"--out {out.name} " + " ".join(args))
    res = _launch(lambda: cmd, shown, out, launch_env(p, env), TIMEOUT_S[p.backend], verbose)
    if verbose:
        for r in res["results"]:
            frac = r.get("busbw_fraction_of_link")
            print(f"  {r['bytes']:>12,} B {r['time_us']:>10.1f} us  algbw {r['algbw_gbs']:8.2f} GB/s  busbw "
                  f"{r['busbw_gbs']:8.2f} GB/s" + (f"  {frac:.0%} of the link" if frac else ""), flush=True)
    return res


def run_post_training(p: Plan, name: str = "post_train_trl", verbose: bool = True) -> dict | None:
    """TRL SFT then DPO on every process of the plan (``benchmarks/post_train_trl.py``) at the
    tier's ``post_batch`` x ``post_max_len`` (``grader/labs/multi_gpu/sizes.py``), or
    None with one line saying why not (script or TRL missing, the run failed): ungraded."""
    script = POST_TRAIN
    if not script.is_file():
        print(f"skipped: {script.relative_to(REPO)} is not in this copy of the course", flush=True)
        return None
    if importlib.util.find_spec("trl") is None:
        print("skipped: TRL is not installed (pip install trl, then run this cell again)", flush=True)
        return None
    out = Path(p.work) / f"{name}.json"
    s = p.sizes  # the tier's sizes: DPO at the script's defaults is an estimated 37 GiB per GPU in fp32 (utils.course.lab_memory)
    args = ["--smoke"] if p.backend == "gloo" else (["--bf16"] * s.bf16 + ["--batch-per-device", str(s.post_batch),
                                                                          "--max-length", str(s.post_max_len)])
    def cmd() -> list[str]:  # a fresh rendezvous port for each attempt
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS["ddp"]), "--num_processes",
                str(p.nproc), "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port()), str(script),
                "--out", str(out), *args]
    shown = (f"accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes {p.nproc} "
             f"benchmarks/post_train_trl.py --out {out.name} " + " ".join(args))
    try:
        return _launch(cmd, shown, out, launch_env(p), 2 * TIMEOUT_S[p.backend], verbose)
    except RuntimeError as exc:
        print(f"skipped: {exc}", flush=True)
        return None


def run_grad_sync(p: Plan, sync_each, sync_bucketed, overlapped, name: str = "grad_sync", *, seed: int = 0,
                  bucket_mb: float | None = None, check_bucket_mb: float | None = None, verbose: bool = True) -> dict:
    """``torchrun --standalone --nproc_per_node N benchmarks/grad_sync.py`` on the learner's three
    gradient synchronizations (``utils.parallel.grad_sync``: their cell written to ``<work>/<name>_answer.py``)
    at the plan's tier; returns its JSON (plus ``file``)."""
    answer = write_answer_module(Path(p.work) / f"{name}_answer.py", sync_each, sync_bucketed, overlapped)
    out = Path(p.work) / f"{name}.json"
    args = ["--tier", p.tier, "--seed", str(seed)] + ["--smoke"] * (p.backend == "gloo")
    for flag, mb in (("--bucket-mb", bucket_mb), ("--check-bucket-mb", check_bucket_mb)):
        args += [flag, f"{mb:g}"] if mb is not None else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(p.nproc),
           str(REPO / "benchmarks" / "grad_sync.py"), "--answer", str(answer), "--out", str(out), *args]
    shown = (f"torchrun --standalone --nproc_per_node {p.nproc} benchmarks/grad_sync.py --answer {answer.name} "
             f"--out {out.name} " + " ".join(args))
    res = _launch(lambda: cmd, shown, out, launch_env(p), TIMEOUT_S[p.backend], verbose)
    if verbose:
        t = res["versions"]
        print(f"  {'version':<12}{'median ms':>10}{'vs DDP':>8}  gradients", flush=True)
        for v in ("none", "ddp", *res["learner_versions"]):
            g = res["grads"].get(v)
            same = "-" if g is None else ("equal DDP's" if g["match"] else f"DIFFER ({g['worst_param']})")
            print(f"  {v:<12}{t[v]['median_ms']:>10.2f}{t['ddp']['median_ms'] / t[v]['median_ms']:>8.2f}  {same}", flush=True)
    return res


def run_zero_memory(p: Plan, layers, name: str = "zero_memory", *, seed: int = 0, verbose: bool = True) -> dict:
    """``torchrun --standalone --nproc_per_node N -m utils.parallel.zero_memory`` on a stack of Linear layers
    of widths ``layers``: the bytes each rank holds under DDP, ZeRO-1 and FSDP2 after one AdamW step
    (``--smoke``: gloo on CPU processes); returns its JSON (plus ``file``). :func:`utils.parallel.zero_memory.run`
    prints it."""
    out = Path(p.work) / f"{name}.json"
    args = ["--layers", ",".join(str(int(w)) for w in layers), "--seed", str(seed)] + ["--smoke"] * (p.backend == "gloo")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(p.nproc), "-m",
           "utils.parallel.zero_memory", "--out", str(out), *args]
    shown = f"torchrun --standalone --nproc_per_node {p.nproc} -m utils.parallel.zero_memory --out {out.name} " + " ".join(args)
    return _launch(lambda: cmd, shown, out, launch_env(p), TIMEOUT_S[p.backend], verbose)
