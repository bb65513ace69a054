"""Lab 02's gradient synchronization written by hand, three ways, against PyTorch DDP.

Launch one process per GPU (or two CPU processes with --smoke); every rank imports the learner's
module (written from the notebook by ``utils.parallel.grad_sync.write_answer_module``), trains the same
model with no synchronization, with DDP and with the learner's three versions, compares their
gradients with DDP's and times each (``utils/parallel/grad_sync_harness.py``). Rank 0 writes the JSON:

    torchrun --standalone --nproc_per_node 2 benchmarks/grad_sync.py --answer answer.py --out s.json
    torchrun --standalone --nproc_per_node 2 benchmarks/grad_sync.py --smoke --answer answer.py --out s.json

An error in the learner's code ends every rank with one line, ``grad_sync.py: error: your ...``.
NVLink multicast (NVLS) is off unless the environment says otherwise (as in allreduce.py).
"""
from __future__ import annotations

import os

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from utils.parallel.distributed import exit_without_teardown  # noqa: E402
from utils.parallel.grad_sync import LEARNER_VERSIONS, exposed_share, sizes, vs_ddp  # noqa: E402

ENV_VARS = ("NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
TIMEOUT_S = {"gloo": 60, "nccl": 300}  # a collective one rank never joins fails after this, not at the launch's limit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answer", type=Path, required=True, help="the learner's module (sync_each, sync_bucketed, OverlappedSync)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes")
    ap.add_argument("--tier", default=None, help="sizes of utils.parallel.grad_sync.SIZES (default: cpu with --smoke, else h100)")
    ap.add_argument("--smoke", action="store_true", help="gloo on CPU processes at the cpu tier's sizes")
    ap.add_argument("--seed", type=int, default=0, help="weights and batches")
    ap.add_argument("--bucket-mb", type=float, default=None, help="bucket of sync_bucketed and DDP (default: the tier's)")
    ap.add_argument("--check-bucket-mb", type=float, default=None,
                    help="also check sync_bucketed's gradients at this bucket (untimed)")
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        ap.error("launch with torchrun, e.g. torchrun --standalone --nproc_per_node 2 benchmarks/grad_sync.py ...")
    if not a.answer.is_file():
        ap.error(f"no answer module at {a.answer}")
    use_nccl = torch.cuda.is_available() and not a.smoke
    try:
        s = sizes(a.tier or ("h100" if use_nccl else "cpu"))
    except ValueError as exc:
        ap.error(str(exc))
    for name in ("bucket_mb", "check_bucket_mb"):
        if getattr(a, name) is not None and not getattr(a, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    cfg = {"preset": s.preset, "batch": s.batch, "seq": s.seq, "steps": s.steps, "warmup": s.warmup, "seed": a.seed,
           "bucket_mb": a.bucket_mb or s.bucket_mb, "check_bucket_mb": a.check_bucket_mb, "dtype": "float32"}
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=TIMEOUT_S["nccl" if use_nccl else "gloo"])
    if use_nccl:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)

    from utils.parallel.grad_sync_harness import LearnerError, run_rank

    try:
        res = run_rank(a.answer, cfg, device)
    except LearnerError as exc:
        print(f"grad_sync.py: error: {exc}", file=sys.stderr, flush=True)
        os._exit(3)  # a rank may be blocked in a collective the failed one never joins: do not wait for it
    dist.destroy_process_group()
    if res is None:
        return 0

    from utils.device.hardware import fingerprint
    from utils.measure.record import utils_hash

    res.update({"benchmark": "grad_sync", "backend": "nccl" if use_nccl else "gloo", "smoke": not use_nccl,
                "device": torch.cuda.get_device_name(local_rank) if use_nccl else "cpu", "config": cfg,
                "vs_ddp": vs_ddp(res), "exposed_comm_share": {v: exposed_share(res, v) for v in LEARNER_VERSIONS},
                "command": " ".join(["torchrun", f"--nproc_per_node {res['world_size']}", Path(sys.argv[0]).name]
                                    + sys.argv[1:]),
                "env": {k: os.environ.get(k) for k in ENV_VARS}, "fingerprint": fingerprint(local_rank if use_nccl else 0),
                "utils_sha256": utils_hash()})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2, default=str))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo's teardown can abort a rank after the results are written
