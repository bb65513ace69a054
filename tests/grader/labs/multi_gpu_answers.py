"""Lab 02's answers and references, made by hand for the judge tests (tests/grader/labs/test_multi_gpu.py):
the runs the notebook's launches return (``train_multi_gpu.py``, ``allreduce.py``, ``grad_sync.py``),
internally consistent at the sizes of a plan, and references that stand for the grader's own runs."""
from __future__ import annotations

import json
import statistics

from grader.answers import encode
from grader.judging import Answers, Context
from grader.labs import sizes as lab_sizes
from grader.labs.multi_gpu import reference
from grader.labs.multi_gpu.answers import ANSWERS
from grader.labs.multi_gpu.sizes import BY_TIER
from grader.sandbox import Section
from grader.schema import loads
from utils.device.hardware import spec_for_name
from utils.parallel import grad_sync, launch

A = "02_multi_gpu"
CPU_PLAN = launch.plan_for(0, True, "cpu", BY_TIER, "/tmp")
H200_PLAN = launch.plan_for(2, False, "h100", BY_TIER, "/tmp")


def ctx(plan=CPU_PLAN, gpu: bool = False) -> Context:
    if not gpu:
        return Context(A, "cpu", plan.sizes, True, "cpu", "CPU", None, "float32", {})
    fp = {"kind": "gpu", "name": "NVIDIA H200", "memory_gib": 139.8, "compute_capability": "9.0", "device_count": 2}
    return Context(A, "h100", lab_sizes(A, "h100"), False, "cuda", "NVIDIA H200", spec_for_name("NVIDIA H200"),
                   "bfloat16", fp)


def live_ref(cache: dict | None = None, slowdown: float = 1.0) -> reference.Reference:
    """A live reference whose launches are already in its cache (``cache``: key -> the run)."""
    return reference.Reference(ctx(), CPU_PLAN, True, slowdown, dict(cache or {}))


def record_ref() -> reference.Reference:
    return reference.from_record(ctx(H200_PLAN, gpu=True), {})


def fake_run(sizes, world: int, tps: float, share: float | None = None, *, backend: str = "gloo",
             env: dict | None = None, spread: float = 0.04, **config) -> dict:
    """A train_multi_gpu.py result at ``sizes``, internally consistent: every rank at ``tps`` tokens/s,
    ``share`` of the step exposed communication, step times ``spread`` apart (p20 to p80)."""
    cfg = {"preset": sizes.model, "batch_per_device": sizes.batch_per_device, "seq": sizes.seq_len, "steps": sizes.steps,
           "warmup": sizes.warmup, "compile": sizes.compile, "bf16": sizes.bf16, "grad_accum": 1, "no_sync_accum": False,
           **config}
    per_step = cfg["batch_per_device"] * cfg["seq"] * cfg["grad_accum"]
    ranks = []
    for r in range(world):
        med = per_step / tps * 1e3
        rank = {"rank": r, "tokens_per_s": tps, "steps": sizes.steps, "total_s": sizes.steps * per_step / tps,
                "median_ms": med, "p20_ms": med * (1 - spread / 2), "p80_ms": med * (1 + spread / 2)}
        if share is not None:
            rank["nosync_median_ms"] = med * (1 - share)
            rank["exposed_comm_share"] = max(0.0, 1 - rank["nosync_median_ms"] / med)
        ranks.append(rank)
    run = {"world_size": world, "distributed_type": ("MULTI_GPU" if backend == "nccl" else "MULTI_CPU"),
           "config": cfg, "tokens_per_step_per_device": per_step, "per_rank": ranks, "tokens_per_s_per_device": tps,
           "total_tokens_per_s": world * tps, "env": dict(env or {})}
    if share is not None:
        run["exposed_comm_share"] = max(r["exposed_comm_share"] for r in ranks)
    return run


def allreduce_table(world: int = 2, backend: str = "gloo", sizes: str = CPU_PLAN.sizes.allreduce_sizes,
                    busbw: float = 0.45) -> dict:
    """A benchmarks/allreduce.py result: every size at ``busbw`` GB/s of bus bandwidth."""
    from utils.parallel.distributed import parse_size_bytes

    rows = []
    for size in (parse_size_bytes(x) for x in sizes.split(",")):
        alg = busbw / (2 * (world - 1) / world)
        t_us = size / (alg * 1e9) * 1e6
        a = size / (t_us * 1e-6) / 1e9
        rows.append({"bytes": size, "time_us": t_us, "algbw_gbs": a, "busbw_gbs": a * 2 * (world - 1) / world})
    return {"results": rows, "world_size": world, "backend": backend, "link": None}


def fake_sync(tier: str = "cpu", t: dict | None = None, world: int = 2, backend: str = "gloo") -> dict:
    """A benchmarks/grad_sync.py result at the tier's sizes, consistent with its medians ``t``, every version right."""
    s = grad_sync.sizes(tier)
    t = t or {"none": 100.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 140.0}
    n, total, largest, buckets = (28, 3_946_496, 2_097_152, 6) if s.preset == "gpt2-tiny" else (148, 497_759_232, 154_389_504, 22)
    run = {"benchmark": "grad_sync", "world_size": world, "backend": backend,
           "config": {"preset": s.preset, "batch": s.batch, "seq": s.seq, "steps": s.steps, "warmup": s.warmup, "seed": 0,
                      "bucket_mb": s.bucket_mb, "check_bucket_mb": None, "dtype": "float32"},
           "grad_tensors": n, "grad_bytes": total, "largest_grad_bytes": largest,
           "versions": {v: {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "runs": s.steps, "per_rank_median_ms": [ms] * world}
                        for v, ms in t.items()},
           "grads": {v: {"match": True, "worst_rel_err": 0.0, "worst_param": "", "rank": 0, "steps_checked": 10}
                     for v in grad_sync.LEARNER_VERSIONS},
           "calls": {"each": {"calls": n, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "bucketed": {"calls": buckets, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "overlapped": {"calls": n, "bytes": total, "max_call_bytes": largest, "in_backward": n}}}
    run["vs_ddp"] = grad_sync.vs_ddp(run)
    run["exposed_comm_share"] = {v: grad_sync.exposed_share(run, v) for v in grad_sync.LEARNER_VERSIONS}
    return run


def decoded(cell: str, values: dict) -> dict:
    """``values`` as they cross the boundary: encoded, read back as JSON, decoded by the cell's specs."""
    specs = ANSWERS[cell]
    return {name: specs[name].spec.decode(loads(json.dumps(encode(v))), name) for name, v in values.items()}


def sync_sections(cfg: dict, expected: dict, times_ms: dict | None = None, *, scale: dict | None = None,
                  calls: dict | None = None) -> dict:
    """The harness's sections of a run ``cfg``: every version's gradients as the grader expects them
    (``scale``: a version's sums multiplied, a wrong average), ``times_ms`` per version per step."""
    out = {}
    times_ms = times_ms or {}
    for step in range(cfg["steps"]):
        for v in cfg["versions"]:
            if v == "none":
                sums = [expected["local"][step][r] for r in range(cfg["world"])]
            else:
                sums = [expected["mean"][step]] * cfg["world"]
            k = (scale or {}).get(v)
            if k is not None:
                sums = [[[x * k for x in p[:-1]] + [p[-1] * k * k] for p in rank] for rank in sums]
            c = (calls or {}).get(v) or _right_calls(v, cfg, expected)
            ms = times_ms.get(v, 100.0) * (1 + 0.01 * (step % 3))
            out[f"{v}/{step}"] = Section(ms / 1e3, {"sums": sums, "calls": [c] * cfg["world"]})
    return out


def _right_calls(v: str, cfg: dict, expected: dict) -> dict | None:
    sizes = expected["numels"]
    total = 4 * sum(sizes)
    if v == "each":
        return {"calls": len(sizes), "bytes": total, "max_call_bytes": 4 * max(sizes), "in_backward": 0}
    if v.startswith("bucketed"):
        return {"calls": 6, "bytes": total, "max_call_bytes": 4 * max(sizes), "in_backward": 0}
    if v == "overlapped":
        return {"calls": len(sizes), "bytes": total, "max_call_bytes": 4 * max(sizes), "in_backward": len(sizes)}
    return None


def sync_answers(cell: str, values: dict, cfg: dict, sections: dict) -> Answers:
    return Answers(decoded(cell, values), inputs={"sync": cfg}, harness={"world_size": cfg.get("world")},
                   sections=sections)


def median(xs):
    return statistics.median(xs)
