"""All-reduce bandwidth across the GPUs of one machine, as nccl-tests reports it.

Launch one process per GPU; rank 0 writes the table (bytes, time_us, algbw_gbs,
busbw_gbs per size; utils.parallel.distributed.allreduce_benchmark) with the machine's fingerprint:

    torchrun --standalone --nproc_per_node 2 benchmarks/allreduce.py --out out/allreduce.json
    torchrun --standalone --nproc_per_node 2 benchmarks/allreduce.py --out a.json --sizes 1MiB,16MiB,256MiB,1GiB
    torchrun --nproc_per_node 2 benchmarks/allreduce.py --smoke --out a.json     # CPU, gloo, small sizes

NCCL when CUDA is available (one GPU per local rank), else gloo on the CPU with the smoke
sizes. NVLink multicast (NVLS) is switched off unless the environment already says
otherwise: on shared multi-GPU hosts it can take the host's GPUs out of service
(docs/reference.md), and the all-reduce then runs over NVLink without it.
"""
from __future__ import annotations

import os

for _var, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_var, _value)

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from utils.parallel.distributed import (  # noqa: E402
    LINK_PEAKS,
    allreduce_benchmark,
    exit_without_teardown,
    link_peak,
    parse_size_bytes,
)

GPU_SIZES = "1MiB,16MiB,256MiB,1GiB"
SMOKE_SIZES = "4KiB,64KiB,1MiB"
ENV_VARS = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "NCCL_P2P_DISABLE",
            "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "CUDA_VISIBLE_DEVICES")


def _nvlink_active_links(device_index: int) -> int | None:
    """Active NVLinks of one GPU through the NVML seam (None without NVML)."""
    from utils.device import nvml
    from utils.device.hardware import nvml_handle_for_torch

    if not nvml.status().available:
        return None
    h = nvml_handle_for_torch(device_index)
    active = 0
    for link in range(18):
        state = nvml.query("nvmlDeviceGetNvLinkState", h, link)
        if state is nvml.NA:
            break
        active += int(state == 1)
    return active


def _nccl_version() -> str:
    import torch

    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes")
    ap.add_argument("--sizes", help=f"comma-separated sizes (default {GPU_SIZES}; --smoke: {SMOKE_SIZES})")
    ap.add_argument("--smoke", action="store_true", help="gloo on the CPU with small sizes, even with a GPU")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per size (default 20; smoke 5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls per size (default 5; smoke 2)")
    ap.add_argument("--dtype", default="float32", help="float32 (as nccl-tests' default), bfloat16 or float16")
    ap.add_argument("--rank-reduce", choices=("max", "mean"), default="max",
                    help="combine the ranks' median times by max (default) or mean")
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        ap.error("launch with torchrun, e.g. torchrun --standalone --nproc_per_node 2 benchmarks/allreduce.py --out a.json")
    use_nccl = torch.cuda.is_available() and not a.smoke
    smoke = not use_nccl
    try:
        sizes = [parse_size_bytes(s) for s in (a.sizes or (SMOKE_SIZES if smoke else GPU_SIZES)).split(",") if s.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    iters = a.iters if a.iters is not None else (5 if smoke else 20)
    warmup = a.warmup if a.warmup is not None else (2 if smoke else 5)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_nccl:
        if local_rank >= torch.cuda.device_count():
            ap.error(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible): "
                     "use --nproc_per_node <= the GPU count")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        rows = allreduce_benchmark(sizes, iters=iters, warmup=warmup, dtype=a.dtype, device=device,
                                   rank_reduce=a.rank_reduce)
        nvlinks = _nvlink_active_links(local_rank) if use_nccl else None
        dist.barrier()
    finally:
        rank = dist.get_rank()
        world = dist.get_world_size()
        dist.destroy_process_group()
    if rank != 0:
        return 0

    from utils.device.hardware import fingerprint
    from utils.measure.record import utils_hash

    fp = fingerprint(local_rank if use_nccl else 0)
    link = None
    if use_nccl:
        try:
            lp = link_peak(torch.cuda.get_device_name(local_rank))
            key = next(k for k, v in LINK_PEAKS.items() if v is lp)
            if key.startswith("nvlink") and nvlinks == 0:
                lp, key = None, None  # an SXM name but NVML reports no active NVLink: do not claim its peak
            if lp is not None:
                link = {"key": key, "name": lp.name, "per_direction_gbs": lp.per_direction_gbs,
                        "bidirectional_gbs": lp.bidirectional_gbs, "source": lp.source,
                        "note": "assumed from the GPU model; confirm the path with nvidia-smi topo -m"}
        except ValueError:
            link = None
    for r in rows:
        r["busbw_fraction_of_link"] = r["busbw_gbs"] / link["per_direction_gbs"] if link else None
    result = {
        "benchmark": "allreduce",
        "command": " ".join(["torchrun", f"--nproc_per_node {world}", Path(sys.argv[0]).name] + sys.argv[1:]),
        "backend": "nccl" if use_nccl else "gloo",
        "smoke": smoke,
        "world_size": world,
        "dtype": a.dtype,
        "iters": iters,
        "warmup": warmup,
        "rank_reduce": a.rank_reduce,
        "definitions": {"algbw_gbs": "bytes / time / 1e9", "busbw_gbs": "algbw_gbs * 2(n-1)/n (nccl-tests)",
                        "time_us": f"{a.rank_reduce} over ranks of each rank's median per-call time"},
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "nccl_version": _nccl_version() if use_nccl else None,
        "nvlink_active_links": nvlinks,
        "link": link,
        "results": rows,
        "fingerprint": fp,
        "utils_sha256": utils_hash(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2, default=str))
    for r in rows:
        frac = f"  {100 * r['busbw_fraction_of_link']:.0f}% of link" if r["busbw_fraction_of_link"] else ""
        print(f"{r['bytes']:>12d} B  {r['time_us']:10.1f} us  algbw {r['algbw_gbs']:8.2f} GB/s  "
              f"busbw {r['busbw_gbs']:8.2f} GB/s{frac}", flush=True)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo's teardown can abort a rank after the results are written
