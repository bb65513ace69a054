"""The training loop of ``benchmarks/train_multi_gpu.py`` on one rank: model, data, wrapper,
compiled step, timed steps; rank 0 gathers every rank's record into the result.

The model is ``utils.model.models.build_model(preset)`` (random weights, no network) with AdamW; the
data the shipped text cut into ``utils.model.models.TokenBlocks``, rank ``r`` of ``W`` taking blocks
``r, r+W, r+2W, ...`` (a disjoint shard each, as a ``DistributedSampler`` would give). An
optimizer step runs ``--grad-accum`` micro-batches with ``no_sync`` on all but the last, so the
gradients are all-reduced once per step; ``--no-sync-accum`` drops the ``no_sync``, so every
micro-batch all-reduces.
"""
from __future__ import annotations

import argparse
import contextlib

from benchmarks.multi_gpu_checks import UsageError
from benchmarks.multi_gpu_compile import compile_step, configure_dynamo, loss_only
from benchmarks.multi_gpu_measure import REPLICATED, param_checksum, profile_record, rank_record, result, timed_steps
from benchmarks.multi_gpu_wrap import accelerator_for, distributed_info, no_sync, wrap

N_BATCHES = 8  # distinct micro-batches per rank, cycled


def batches(args: argparse.Namespace, rank: int, world: int, vocab_size: int, device) -> list:
    """``N_BATCHES`` distinct (input_ids, labels) micro-batches of this rank's shard, already on the device."""
    import torch

    from utils.model.models import TokenBlocks, get_tokenizer

    ds = TokenBlocks(get_tokenizer(None, offline=True), None, args.seq, vocab_size=vocab_size)
    out = []
    for b in range(N_BATCHES):
        idx = [(rank + world * (b * args.batch_per_device + j)) % len(ds) for j in range(args.batch_per_device)]
        x = torch.stack([ds[i][0] for i in idx]).to(device)
        out.append((x, x))  # HF convention: labels = input_ids, shifted inside the loss
    return out


def _build(args: argparse.Namespace, accelerator, ddp_kwargs):
    """``(wrapped, opt, model_config)``: the model with the same initial weights on every rank
    (FSDP does not broadcast them), inside the loss-only module with ``--compile-scope loss``,
    prepared and wrapped (``benchmarks/multi_gpu_wrap.py``)."""
    import torch

    from utils.model.models import build_model

    torch.manual_seed(0)
    model = build_model(args.preset, device=accelerator.device)
    cfg = model.config
    cfg.use_cache = False  # training: no KV cache (building one costs memory and recompiles under torch.compile)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=accelerator.device.type == "cuda")
    configure_dynamo(args)
    if args.compile and args.compile_scope == "loss":  # inside DDP's wrapper, so Dynamo compiles the loss-only graph
        model = loss_only(model)
    wrapped, opt = wrap(args, accelerator, ddp_kwargs, model, opt)
    return wrapped, opt, cfg


def run(args: argparse.Namespace, baseline: dict | None) -> dict | None:
    """The timed loop on this rank; rank 0 returns the gathered result (others None)."""
    import torch
    from accelerate.utils import gather_object

    accelerator, ddp_kwargs = accelerator_for(args)
    dist = distributed_info(accelerator)
    if args.measure_comm and dist["distributed_type"] not in ("MULTI_GPU", "MULTI_CPU") and not args.ddp_one_process:
        raise UsageError(f"--measure-comm needs DDP with 2+ processes, this run is {dist['distributed_type']}")
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    on_cuda = device.type == "cuda"
    wrapped, opt, cfg = _build(args, accelerator, ddp_kwargs)
    dist = distributed_info(accelerator, wrapped)
    loss_scope = args.compile and args.compile_scope == "loss"

    def make_forward_backward(model):
        def forward_backward(x, y):
            loss = (model(x, y) if loss_scope else model(input_ids=x, labels=y).loss) / args.grad_accum
            accelerator.backward(loss)  # under --bf16 (no loss scaler) this is loss.backward()
            return loss.detach()
        return forward_backward

    forward_backward = compile_step(args, wrapped, make_forward_backward)
    data = batches(args, rank, world, cfg.vocab_size, device)
    tokens_per_step = args.batch_per_device * args.seq * args.grad_accum

    def step(i: int, sync: bool):
        """One optimizer step; returns its loss (summed over micro-batches) as a device tensor."""
        loss = 0.0
        for m in range(args.grad_accum):
            x, y = data[(i * args.grad_accum + m) % len(data)]
            last = m == args.grad_accum - 1
            skip = not sync or (not last and not args.no_sync_accum)
            with no_sync(accelerator, wrapped) if skip else contextlib.nullcontext():
                loss = loss + forward_backward(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def timed(sync: bool, losses: list | None = None) -> dict:
        return timed_steps(step, sync, warmup=args.warmup, steps=args.steps, tokens_per_step=tokens_per_step,
                           device=device, barrier=accelerator.wait_for_everyone, losses=losses)

    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    step_losses: list = []
    s = timed(sync=True, losses=step_losses)
    mine = rank_record(rank, device, s, step_losses)
    if dist["sharding_strategy"] in REPLICATED and world > 1:
        mine["param_checksum"] = param_checksum(wrapped)
    if args.profile is not None:
        mine["profile"] = profile_record(args.profile / f"trace_rank{rank}.json", lambda i: step(i, True))
    if args.measure_comm:
        n = timed(sync=False)
        mine["nosync_median_ms"] = n["median_ms"]
        mine["exposed_comm_share"] = max(0.0, 1.0 - n["median_ms"] / s["median_ms"])
    ranks = gather_object([mine])
    accelerator.wait_for_everyone()
    is_main = accelerator.is_main_process
    # every rank tears the group down before exiting: a rank that exits with gloo's threads
    # still running can abort ("terminate called without an active exception")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if not is_main:
        return None
    return result(args, ranks, dist=dist, mixed_precision=accelerator.mixed_precision, model_config=cfg,
                  on_cuda=on_cuda, tokens_per_step=tokens_per_step, baseline=baseline)
