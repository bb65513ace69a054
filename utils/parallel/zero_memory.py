"""The bytes each rank really holds under DDP, ZeRO-1 and FSDP2, beside ZeRO's model-state arithmetic.

One launch (``torchrun --standalone --nproc_per_node N -m utils.parallel.zero_memory``, started by
:func:`run` through ``utils.parallel.launch``) builds a stack of ``nn.Linear`` layers (fp32), takes one
AdamW step under each stage, and on every rank counts the bytes of what that rank holds
(:func:`held_bytes`): its parameters (a DTensor's local shard), their gradients and the
optimizer's per-element state, each storage counted once at its allocated size. Two CPU
processes over gloo, or one process per GPU over NCCL, as the plan says. The stages and the
PyTorch sources (torch 2.13) that say what each rank stores:

- ``ddp``: ``DistributedDataParallel(gradient_as_bucket_view=True)``
  (torch/nn/parallel/distributed.py): the gradients are views of DDP's buckets, so the
  buckets are the gradients, not a second copy. Every rank holds everything.
- ``zero1``: DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (torch/distributed/optim/zero_redundancy_optimizer.py): ``_partition_parameters`` hands out
  whole parameters, largest first, each to the rank with the fewest elements so far; a rank's
  AdamW (its ``optim`` attribute) holds state for its own parameters only.
- ``zero3``: FSDP2, ``fully_shard`` on each layer and on the model
  (torch/distributed/fsdp/_fully_shard/). ``FSDPParam._init_sharded_param`` (``_fsdp_param.py``)
  cuts each parameter along dim 0 into chunks of ceil(rows / N) rows (the last ranks get
  fewer, or none) and allocates every rank's shard padded to that size, the DTensor's local
  tensor a view of its own rows; ``foreach_reduce`` (``_fsdp_collectives.py``)
  reduce-scatters a layer's gradients into one padded buffer per rank, each sharded gradient
  a view of it; AdamW allocates its state like the local, unpadded shard.

Stage 2 is not measured: PyTorch has no sharding of gradients and optimizer state alone that
keeps whole parameters between steps. FSDP2 with ``reshard_after_forward=False`` keeps the
gathered parameters only from the forward to the end of the backward, where
``FSDPParamGroup.post_backward`` (``_fsdp_param_group.py``) reshards them: between steps it
holds what stage 3 holds. ``set_reshard_after_backward(False)`` keeps them, but the
optimizer updates the shards, and ``FSDPParamGroup.unshard`` returns at once while the
parameters are unsharded: the kept copy misses the update. That setting is meant for
gradient accumulation, with no step in between.

AdamW's ``step`` counters (one 0-dim tensor per parameter) are reported apart, as
``step_counter_bytes``: ZeRO counts per-element state. Lab 02 prints each rank's bytes beside
the learner's ``memory_per_gpu_gb`` (:func:`table`); the grader runs another model and allows
each rank the shard remainder of :func:`remainder_bytes`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

from utils.parallel.distributed import exit_without_teardown
from utils.parallel.launch import run_zero_memory

STAGES = ("ddp", "zero1", "zero3")
NOT_MEASURED = {"zero2": "PyTorch keeps no whole parameters beside sharded gradients between steps (FSDP2 "
                         "reshards them after every backward)"}
LAYERS = (96, 255, 127, 9)  # the notebook's stack: 96 -> 255 -> 127 -> 9 (odd widths: shards that do not divide)
BATCH = 8  # rows of the one batch each rank trains on
CATEGORIES = ("weights_bytes", "grads_bytes", "optimizer_bytes")
TIMEOUT_S = {"gloo": 60, "nccl": 300}  # a collective one rank never joins fails after this


# -- the model and what a rank holds ------------------------------------------------------------

def param_shapes(layers) -> list[tuple[int, ...]]:
    """Shapes of the stack's parameters in ``model.parameters()`` order: each layer's
    ``(out, in)`` weight, then its ``(out,)`` bias."""
    widths = [int(w) for w in layers]
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"layers must be two or more positive widths, got {layers!r}")
    shapes: list[tuple[int, ...]] = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        shapes += [(b, a), (b,)]
    return shapes


def n_params(layers) -> int:
    return sum(_numel(s) for s in param_shapes(layers))


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def build(layers, seed: int, device: Any):
    """``nn.Sequential`` of ``Linear`` layers with ReLU between them, fp32, on ``device``."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    shapes = param_shapes(layers)[::2]
    mods: list[nn.Module] = []
    for i, (out, inp) in enumerate(shapes):
        mods.append(nn.Linear(inp, out))
        if i < len(shapes) - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods).to(device)


def _local(t):
    """A DTensor's shard on this rank (``to_local``); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_bytes(tensors) -> int:
    """Bytes of the storages under ``tensors``, each counted once at its allocated size: a view of
    a padded shard or of a shared gradient buffer counts the whole buffer, once."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = _local(t).untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def held_bytes(model, optimizer) -> dict[str, int]:
    """What this rank holds after a step: bytes of its parameters, gradients and per-element
    optimizer state (walked tensor by tensor, :func:`_storage_bytes`), their total, AdamW's
    0-dim step counters apart, and the elements of its local parameter shards."""
    params = list(model.parameters())
    local_opt = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own AdamW, for its parameters
    state = [v for s in local_opt.state.values() for v in s.values() if hasattr(v, "untyped_storage")]
    out = {"weights_bytes": _storage_bytes(params),
           "grads_bytes": _storage_bytes([p.grad for p in params if p.grad is not None]),
           "optimizer_bytes": _storage_bytes([v for v in state if v.dim() > 0]),
           "step_counter_bytes": _storage_bytes([v for v in state if v.dim() == 0]),
           "param_elements": sum(_local(p).numel() for p in params)}
    out["total_bytes"] = sum(out[k] for k in CATEGORIES)
    return out


def _wrap(stage: str, model, device):
    """``model`` wrapped for ``stage`` and its AdamW (:data:`STAGES`)."""
    import torch
    from torch import nn

    if stage in ("ddp", "zero1"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True,
                                      device_ids=[device.index] if device.type == "cuda" else None)
        if stage == "zero1":
            return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW)
        return ddp, torch.optim.AdamW(ddp.parameters())
    from torch.distributed.fsdp import fully_shard

    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters())


def measure_rank(stage: str, layers, seed: int, device: Any) -> dict:
    """One forward, backward and AdamW step of the stack under ``stage`` on this rank's own
    batch; :func:`held_bytes` after the step (the gradients still held)."""
    import torch
    import torch.distributed as dist

    model, opt = _wrap(stage, build(layers, seed, device), device)
    gen = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    x = torch.randn(BATCH, int(layers[0]), generator=gen).to(device)
    model(x).square().mean().backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    held = held_bytes(model, opt)
    if stage == "ddp":  # the run's byte widths, from the tensors themselves
        p = next(iter(model.parameters()))
        held["bytes_per_param"] = {"weights": p.element_size(), "grads": p.grad.element_size(),
                                   "optimizer": sum(v.element_size() for v in opt.state[p].values() if v.dim() > 0)}
    return held


# -- launching it, and reading it ----------------------------------------------------------------

def run(p, predict=None, layers=LAYERS, name: str = "zero_memory", *, seed: int = 0, verbose: bool = True) -> dict:
    """The sharded run on the plan ``p`` (``utils.parallel.launch.run_zero_memory``); with ``verbose``, its
    torchrun command and :func:`table` of the bytes each rank held, beside ``predict`` (a
    ``memory_per_gpu_gb``) if given. Returns the run's JSON. Lab 02 runs it with the learner's
    function; the grader, quietly, with a stack of other widths."""
    res = run_zero_memory(p, layers, name, seed=seed, verbose=verbose)
    if verbose:
        print(table(res, predict), flush=True)
    return res


def table(res: dict, memory_per_gpu_gb=None) -> str:
    """Per stage and rank, the bytes held (weights, gradients, optimizer state, total); given
    ``memory_per_gpu_gb``, its prediction with the run's byte widths in bytes and the difference."""
    w = res["bytes_per_param"]
    n, world = res["n_params"], res["world_size"]
    head = (f"{n:,} parameters on {world} ranks over {res['backend']}, {res['dtype']}: {w['weights']} + {w['grads']} + "
            f"{w['optimizer']} bytes per parameter (weights + gradients + AdamW state); bytes held after one step")
    cols = f"{'stage':<7}{'rank':>5}{'weights':>10}{'grads':>10}{'optimizer':>11}{'total':>10}"
    lines = [head, cols + (f"{'predicted':>11}{'measured - predicted':>22}" if memory_per_gpu_gb else "")]
    for stage in STAGES:
        for r in res["stages"][stage]:
            row = (f"{stage:<7}{r['rank']:>5}{r['weights_bytes']:>10,}{r['grads_bytes']:>10,}{r['optimizer_bytes']:>11,}"
                   f"{r['total_bytes']:>10,}")
            if memory_per_gpu_gb:
                pred = memory_per_gpu_gb(n, world, stage, w["weights"], w["grads"], w["optimizer"]) * 1e9
                row += f"{pred:>11,.0f}{r['total_bytes'] - pred:>+22,.0f}"
            lines.append(row)
    lines += [f"{stage:<7}not measured: {why}" for stage, why in NOT_MEASURED.items()]
    return "\n".join(lines)


def chunk_rows(rows: int, n: int) -> list[int]:
    """Rows of each of ``n`` ranks when FSDP2 shards ``rows`` along dim 0 (``torch.chunk``):
    ceil(rows / n) each, in rank order, until the rows run out."""
    c = -(-rows // n)
    return [max(0, min(c, rows - r * c)) for r in range(n)]


def remainder_bytes(shapes, n: int, stage: str, widths: dict) -> float:
    """The most one rank's bytes can differ from an even split (``bytes_per_param * n_params /
    n`` for what the stage shards) for parameters of ``shapes``, from how each stage shards:

    - ``ddp``: nothing is split: 0.
    - ``zero1``: whole parameters go to the least-loaded rank, so the ranks' optimizer elements
      differ by at most the largest parameter, and one rank's from the mean by at most
      ``(n - 1) / n`` of it.
    - ``zero3``: a parameter of ``rows`` rows of ``k`` elements is stored padded to
      ``ceil(rows / n)`` rows on every rank (weights and gradients: at most ``k * (ceil(rows /
      n) - rows / n)`` elements over the even split) and its optimizer state holds the rank's
      own rows (:func:`chunk_rows`; off by ``k * |own rows - rows / n|``); summed over the
      parameters.
    """
    if stage == "ddp":
        return 0.0
    if stage == "zero1":
        return float(widths["optimizer"] * Fraction(max(_numel(s) for s in shapes) * (n - 1), n))
    if stage != "zero3":
        raise ValueError(f"no measured stage {stage!r}; measured: {', '.join(STAGES)}")
    pad, own = Fraction(0), Fraction(0)
    for s in shapes:
        k, even = _numel(s[1:]), Fraction(s[0], n)
        pad += k * (max(chunk_rows(s[0], n)) - even)
        own += k * max(abs(r - even) for r in chunk_rows(s[0], n))
    return float((widths["weights"] + widths["grads"]) * pad + widths["optimizer"] * own)


def run_problems(res: dict, layers, nproc: int, backend: str) -> list[str]:
    """What makes ``res`` other than the run asked for: another model, rank count or backend, a
    stage or a rank missing, a total that is not the sum of its parts."""
    want = {"layers": [int(x) for x in layers], "world_size": nproc, "backend": backend, "n_params": n_params(layers)}
    bad = [f"{k}={res.get(k)!r}, not {v!r}" for k, v in want.items() if res.get(k) != v]
    for stage in STAGES:
        ranks = res.get("stages", {}).get(stage) or []
        if [r.get("rank") for r in ranks] != list(range(nproc)):
            bad.append(f"{stage}: ranks {[r.get('rank') for r in ranks]}, not 0 to {nproc - 1}")
        bad += [f"{stage} rank {r['rank']}: total {r.get('total_bytes')} is not the sum of its parts" for r in ranks
                if r.get("total_bytes") != sum(r.get(k, 0) for k in CATEGORIES)]
    return bad


# -- one rank of the launch ----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m utils.parallel.zero_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file rank 0 writes")
    ap.add_argument("--layers", default=",".join(map(str, LAYERS)), help="widths of the Linear stack, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="gloo on CPU processes even where GPUs are visible")
    a = ap.parse_args(argv)
    for var, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(var, value)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        ap.error("launch with torchrun: torchrun --standalone --nproc_per_node 2 -m utils.parallel.zero_memory --out OUT")
    try:
        layers = [int(x) for x in a.layers.split(",")]
        param_shapes(layers)
    except ValueError as exc:
        ap.error(f"--layers: {exc}")

    import torch
    import torch.distributed as dist

    nccl = torch.cuda.is_available() and not a.smoke
    timeout = datetime.timedelta(seconds=TIMEOUT_S["nccl" if nccl else "gloo"])
    if nccl:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    stages, widths = {}, None
    for stage in STAGES:
        mine = {"rank": rank, **measure_rank(stage, layers, a.seed, device)}
        widths = mine.pop("bytes_per_param", widths)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        stages[stage] = gathered
    dist.destroy_process_group()
    if rank == 0:
        res = {"benchmark": "zero_memory", "world_size": world, "backend": "nccl" if nccl else "gloo",
               "device": torch.cuda.get_device_name(device) if nccl else "cpu", "dtype": "float32", "layers": layers,
               "seed": a.seed, "n_params": n_params(layers), "param_shapes": [list(s) for s in param_shapes(layers)],
               "bytes_per_param": widths, "stages": stages, "not_measured": NOT_MEASURED, "torch": torch.__version__,
               "command": " ".join(["torchrun", f"--nproc_per_node {world}", "-m utils.parallel.zero_memory"] + sys.argv[1:])}
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo's teardown can abort a rank after the results are written
