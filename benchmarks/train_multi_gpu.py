"""Phase 2 reference training run on 1..N GPUs: DDP, FSDP or DeepSpeed through Accelerate, timed per rank.

    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/train_multi_gpu.py --out r2.json --bf16 --compile --baseline r1.json
    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/train_multi_gpu.py --out cpu.json --preset gpt2-tiny --seq 64 --steps 3   # no CUDA: gloo
    python benchmarks/train_multi_gpu.py --check-config benchmarks/accelerate/fsdp_full_shard.yaml

The command line; the checks are in ``benchmarks/multi_gpu_checks.py``, the loop in
``multi_gpu_run.py``, the wrappers in ``multi_gpu_wrap.py``, torch.compile's DDP modes in
``multi_gpu_compile.py`` and the result in ``multi_gpu_measure.py``. Rank 0 writes the JSON
to ``--out`` and prints its headline fields as one JSON line.
"""
from __future__ import annotations

import os

# NVLink multicast off before torch loads: on shared hosts it can take the GPUs out of service (docs/reference.md)
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.multi_gpu_checks import UsageError, check_config, check_launch, validate  # noqa: E402
from benchmarks.multi_gpu_compile import COMM_REORDERS, DDP_OPTIMIZERS  # noqa: E402
from benchmarks.multi_gpu_run import run  # noqa: E402
from utils.parallel.distributed import exit_without_teardown  # noqa: E402

PROG = "train_multi_gpu.py"
HEADLINE = ("world_size", "distributed_type", "sharding_strategy", "tokens_per_s_per_device", "total_tokens_per_s",
            "slowest_rank_tokens_per_s", "mfu_per_device", "peak_allocated_gib_per_rank", "exposed_comm_share",
            "scaling_efficiency", "replicas_identical")
EPILOG = """\
--measure-comm times the steps again under no_sync: 1 - t_nosync/t_sync is the exposed
communication (what the backward did not hide), not the time spent in NCCL.
--baseline must be a 1-process run of the same shape, compile mode and wrapper: under bf16,
FSDP and DeepSpeed compute on bf16 weight copies, a plain run autocasts fp32 weights.
--comm-hook noop and --ddp-one-process are headroom runs: DDP's reducer with no gradient
crossing a link (the replicas drift apart under noop); never a baseline.
On a CPU machine launch the DDP config (two gloo processes through torchrun; `accelerate
launch --cpu` alone starts one); FSDP and DeepSpeed are refused there. Examples and results: benchmarks/RESULTS.md, run_gpu.sh multigpu."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="JSON file rank 0 writes")
    p.add_argument("--preset", default="gpt2-small", help="utils.model.models preset, random weights (default gpt2-small)")
    p.add_argument("--batch-per-device", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--steps", type=int, default=30, help="measured optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile, allocator)")
    p.add_argument("--compile", action="store_true", help="torch.compile the prepared model")
    p.add_argument("--compile-scope", choices=("model", "loss"), default="model",
                   help="what --compile wraps: the model (its outputs, logits included, leave the graph) or a "
                        "module around it returning only the loss (DDP and one process)")
    p.add_argument("--bf16", action="store_true", help="Accelerate mixed_precision='bf16' (overrides the config)")
    p.add_argument("--bucket-mb", type=int, default=25, help="DDP bucket_cap_mb (PyTorch's default 25)")
    p.add_argument("--bucket-view", action="store_true", help="DDP gradient_as_bucket_view=True (no grad copy)")
    p.add_argument("--comm-hook", choices=("none", "bf16", "noop"), default="none",
                   help="DDP communication hook: bf16 all-reduces gradients as bf16 (half the bytes of fp32); noop "
                        "communicates nothing (headroom: DDP's cost without the all-reduce; the replicas drift apart)")
    p.add_argument("--ddp-optimizer", choices=DDP_OPTIMIZERS, default="ddp_optimizer",
                   help="torch._dynamo.config.optimize_ddp under --compile: split the graph at DDP's buckets "
                        "(default), one graph with no overlap, or Compiled Autograd tracing the all-reduces")
    p.add_argument("--comm-reorder", nargs="?", const="passes", choices=COMM_REORDERS, default=None,
                   help="with python_reducer: Inductor moves the all-reduces among the backward's kernels, by its "
                        "reorder_for_compute_comm_overlap passes (passes, the default) or its overlap scheduler (overlap)")
    p.add_argument("--ddp-one-process", action="store_true",
                   help="wrap the single process's model in DDP over a one-rank group: DDP's own cost with no link "
                        "(compare with a plain 1-GPU run through --baseline)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step, all-reduced once (no_sync before)")
    p.add_argument("--no-sync-accum", action="store_true", help="all-reduce on every micro-batch")
    p.add_argument("--measure-comm", action="store_true", help="also time steps without gradient sync (DDP)")
    p.add_argument("--baseline", type=Path, help="a 1-GPU result of this script: adds scaling efficiency")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="after the timed steps, profile 5 more on every rank (traces in DIR): GPU idle, comm overlap")
    p.add_argument("--check-config", type=Path, metavar="YAML",
                   help="parse an Accelerate config file, print its distributed type, exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.check_config is not None:
            print(json.dumps(check_config(args.check_config)))
            return 0
        baseline = validate(args)
        check_launch(args)
        res = run(args, baseline)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if res is not None:
        args.out.write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps({k: res[k] for k in HEADLINE if k in res}))
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo's teardown can abort a rank after the results are written
