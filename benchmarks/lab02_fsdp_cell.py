"""Lab 02's FSDP cell, outside the notebook: the same ``utils.parallel.launch.run_training`` calls.

    python benchmarks/lab02_fsdp_cell.py --out OUT

FSDP on one process first, then each FSDP config against it (as the cell does since FSDP
under bf16 computes on bf16 weight copies, unlike a plain autocast run), then a plain 1-GPU run
given as the baseline of an FSDP launch, which ``train_multi_gpu.py`` must refuse. On a
one-GPU machine every run has one process (a plan of all GPUs over NCCL, cut to one): it checks
the cell's GPU path and the refusal, not scaling. Writes ``OUT/summary.json``; the runs' JSON
and logs stay in ``OUT``. Needs CUDA GPUs (FSDP is refused on a CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grader.labs.multi_gpu.sizes import BY_TIER

KEEP = ("world_size", "distributed_type", "fsdp_version", "sharding_strategy", "tokens_per_s_per_device",
        "scaling_efficiency", "peak_allocated_gib_per_rank", "fsdp_mixed_precision")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tier", default="h100", help="the size tier of the runs (utils.course.env), default h100")
    a = ap.parse_args(argv)
    import torch

    from utils.parallel import launch

    if not torch.cuda.is_available():
        print("lab02_fsdp_cell.py: error: FSDP needs CUDA GPUs (NCCL); run it on a GPU machine", file=sys.stderr)
        return 2
    try:
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"lab02_fsdp_cell.py: error: cannot create --out {a.out}: {exc}", file=sys.stderr)
        return 2
    n = torch.cuda.device_count()
    p = launch.plan_for(max(n, 2), False, a.tier, BY_TIER, str(a.out))._replace(nproc=n, n_gpus=n)
    out: dict = {"gpus": n, "tier": a.tier}
    try:  # run_training raises RuntimeError with the failing launch's one-line reason and its log
        one = launch.run_training(p, 1, "fsdp_1", config="fsdp_full_shard")
        out["fsdp_1"] = {k: one.get(k) for k in KEEP}
        for cfg in ("fsdp_shard_grad_op", "fsdp_full_shard"):
            out[cfg] = {k: v for k, v in launch.run_training(p, n, cfg, config=cfg, baseline=one).items() if k in KEEP}
        plain = launch.run_training(p, 1, "ddp_1")
    except RuntimeError as exc:
        print(f"lab02_fsdp_cell.py: error: {exc}", file=sys.stderr)
        return 1
    out["ddp_1"] = {k: plain.get(k) for k in KEEP}
    try:
        launch.run_training(p, 1, "fsdp_vs_plain", config="fsdp_full_shard", baseline=plain)
        out["refused"] = None
    except RuntimeError as exc:
        out["refused"] = str(exc)
    (a.out / "summary.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    return 0 if out["refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
