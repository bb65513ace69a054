"""The measurements of ``benchmarks/train_multi_gpu.py``: each rank's timed steps, its record,
and rank 0's result over all ranks.

Each rank times its own steps with ``utils.measure.timing.Stopwatch`` (CUDA events on a GPU, so no
per-step sync) after a barrier, so all ranks start together. The result gives per-rank tokens/s,
their sum, and the slowest rank with the total it bounds (``W x slowest``): ranks wait for each
other at every gradient all-reduce, so the slowest sets the pace. MFU is against the datasheet
peak (``utils.device.hardware``; bf16 with ``--bf16``, fp32 otherwise), FLOPs per token from
``utils.measure.flops``, scaling efficiency from ``utils.parallel.distributed.scaling_efficiency``.

``--measure-comm`` gives ``exposed_comm_share = 1 - t_nosync / t_sync`` (median steps, worst
rank): the part of the all-reduce the backward did not hide, not the total time spent in NCCL,
which DDP's bucketing overlaps with the backward.
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_")
REPLICATED = ("DDP (replicated)", "DeepSpeed ZeRO-1", "DeepSpeed ZeRO-2")  # every rank holds all the weights
PROFILED_STEPS = 5


def timed_steps(step, sync: bool, *, warmup: int, steps: int, tokens_per_step: int, device, barrier,
                losses: list | None = None) -> dict:
    """``warmup + steps`` calls of ``step(i, sync)`` under a ``Stopwatch``, after ``barrier()``;
    returns its summary. Each step's loss tensor is appended to ``losses`` and read only after
    the loop: a ``.item()`` inside it would sync every step."""
    from utils.measure.timing import Stopwatch

    sw = Stopwatch(warmup_steps=warmup, tokens_per_step=tokens_per_step, device=device)
    barrier()
    for i in range(warmup + steps):
        with sw.step():
            loss = step(i, sync)
        if losses is not None:
            losses.append(loss)
    return sw.summary()


def rank_record(rank: int, device, s: dict, losses: list) -> dict:
    """One rank's numbers from its ``Stopwatch`` summary ``s``, its peak memory (GiB, CUDA only)
    and its loss for every synchronised step."""
    import torch

    on_cuda = device.type == "cuda"
    return {"rank": rank, "device": str(device), "tokens_per_s": s["tokens_per_s"], "steps": s["steps"],
            "warmup_steps": s["warmup_steps"], "timing_method": s["method"], "median_ms": s["median_ms"],
            "p20_ms": s["p20_ms"], "p80_ms": s["p80_ms"], "mean_ms": s["mean_ms"], "std_ms": s["std_ms"],
            "total_s": s["total_s"], "step_times_ms": s["step_times_ms"],
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if on_cuda else None,
            "loss_per_step": [float(v) for v in losses]}


def param_checksum(module) -> float:
    """The sum of all of ``module``'s parameters in float64: equal on every rank whose replica
    received the same updates."""
    import torch

    with torch.no_grad():
        return float(sum(p.double().sum() for p in module.parameters()))


def replicas_identical(checksums: list[float], rel_tol: float = 1e-9) -> bool:
    """DDP's promise after synchronised steps: every rank holds the same weights. ``checksums``
    are each rank's sum of all parameters (float64); ranks that trained on their own shards
    without the all-reduce drift apart at the first step."""
    return max(checksums) - min(checksums) <= rel_tol * max(1.0, abs(checksums[0]))


def profile_record(trace: Path, step_fn) -> dict:
    """Five synchronised steps under ``utils.diagnosis.profiling.profile_steps`` (after 1 skipped and 2
    discarded); the Chrome trace stays at ``trace``. Returns the GPU-idle numbers and
    ``utils.diagnosis.trace_metrics.comm_overlap``: how much of the all-reduce ran next to compute."""
    from utils.diagnosis.profiling import profile_steps
    from utils.diagnosis.trace_events import load_events
    from utils.diagnosis.trace_metrics import comm_overlap

    counter = iter(range(10**9))
    s = profile_steps(lambda: step_fn(next(counter)), steps=PROFILED_STEPS, trace_path=trace)
    return {"trace": str(trace), "step_time_ms": s.step_time_ms, "gpu_idle_fraction": s.gpu_idle_fraction,
            "gpu_busy_ms_per_step": s.gpu_busy_ms_per_step, "diagnosis": s.diagnosis,
            "comm": comm_overlap(load_events(trace))}


def _config(args: argparse.Namespace) -> dict:
    return {"preset": args.preset, "batch_per_device": args.batch_per_device, "seq": args.seq,
            "steps": args.steps, "warmup": args.warmup, "compile": args.compile,
            "compile_scope": args.compile_scope if args.compile else None, "bf16": args.bf16,
            "grad_accum": args.grad_accum, "no_sync_accum": args.no_sync_accum,
            "bucket_mb": args.bucket_mb, "bucket_view": args.bucket_view, "comm_hook": args.comm_hook,
            "ddp_optimizer": args.ddp_optimizer, "comm_reorder": args.comm_reorder}


def result(args: argparse.Namespace, ranks: list[dict], *, dist: dict, mixed_precision: str, model_config,
           on_cuda: bool, tokens_per_step: int, baseline: dict | None) -> dict:
    """Rank 0's JSON over every rank's ``rank_record``: throughput totals and the slowest rank,
    MFU, the run's configuration and environment, the replica check, the exposed communication
    and, with ``baseline``, the scaling efficiency of per-device throughput."""
    import torch

    from benchmarks.multi_gpu_compile import dynamo_counters
    from utils.device.hardware import current_spec, fingerprint
    from utils.measure.flops import flops_per_token_from_config, mfu_from_throughput
    from utils.measure.record import utils_hash

    world = len(ranks)
    ranks = sorted(ranks, key=lambda r: r["rank"])
    tps = [r["tokens_per_s"] for r in ranks]
    slow = min(ranks, key=lambda r: r["tokens_per_s"])
    per_device = statistics.fmean(tps)
    spec = current_spec(0) if on_cuda else None
    peak_dtype = "bf16" if args.bf16 else "fp32"
    peak = spec.peak_tflops(peak_dtype) if spec is not None else None
    fpt = flops_per_token_from_config(model_config, args.seq)
    res = {
        "world_size": world, **dist, "ddp_one_process": args.ddp_one_process, "mixed_precision": mixed_precision,
        "config": _config(args),
        "dynamo_optimize_ddp": torch._dynamo.config.optimize_ddp if args.compile else None,
        "compiled_autograd": bool(torch._dynamo.config.compiled_autograd),
        "dynamo_counters": dynamo_counters() if args.compile else None,
        "tokens_per_step_per_device": tokens_per_step,
        "per_rank": ranks,
        "tokens_per_s_per_device": per_device,
        "total_tokens_per_s": sum(tps),
        "slowest_rank": slow["rank"], "slowest_rank_tokens_per_s": slow["tokens_per_s"],
        "total_tokens_per_s_slowest_bound": world * slow["tokens_per_s"],
        "step_median_ms_slowest": max(r["median_ms"] for r in ranks),
        "peak_allocated_gib_per_rank": [r["peak_allocated_gib"] for r in ranks],
        "flops_per_token": fpt, "peak_tflops": peak, "peak_dtype": peak_dtype,
        "mfu_per_device": mfu_from_throughput(per_device, fpt, peak) if peak else None,
        "mfu_note": None if peak else "no datasheet peak for this device (CPU or unknown GPU)",
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if on_cuda else None,
        "fingerprint": fingerprint(0), "utils_sha256": utils_hash(),
    }
    sums = [r.get("param_checksum") for r in ranks]
    if None not in sums:  # replicated weights only (FSDP and ZeRO-3 ranks hold different shards)
        res["replicas_identical"] = replicas_identical(sums)
    if args.comm_hook == "noop" and world > 1:  # a headroom run: nothing crossed the link, the replicas drifted apart
        res["gradients_synchronised"] = False
    if args.measure_comm:
        res["exposed_comm_share"] = max(r["exposed_comm_share"] for r in ranks)
        res["exposed_comm_note"] = ("1 - t_nosync/t_sync (median step, worst rank): exposed, not total, communication"
                                    if args.comm_hook != "noop" else
                                    "1 - t_nosync/t_noop_hook: DDP's reducer (bucket copies, hooks, graph splits) "
                                    "without any communication")
    if baseline is not None:
        from utils.parallel.distributed import scaling_efficiency

        base_tps = baseline["total_tokens_per_s"]
        res["baseline"] = {"file": str(args.baseline), "tokens_per_s": base_tps}
        res["scaling_efficiency"] = scaling_efficiency(per_device, base_tps, world, per_device=True)
        res["scaling_efficiency_slowest"] = scaling_efficiency(slow["tokens_per_s"], base_tps, world, per_device=True)
    return res
