"""What wraps the model in ``benchmarks/train_multi_gpu.py``: Accelerate's DDP, FSDP or DeepSpeed
(``benchmarks/accelerate/*.yaml``), DDP's bucket and hook options, DDP over a one-rank group,
and a record of what actually wrapped it.

DDP's options go through Accelerate's ``DistributedDataParallelKwargs``: ``bucket_cap_mb``
(fewer, larger buckets mean fewer all-reduce launches and, under ``torch.compile``, fewer graph
splits), ``gradient_as_bucket_view`` and the ``bf16`` hook (PyTorch's ``bf16_compress_hook``,
half the bytes of fp32 gradients). The ``noop`` hook is PyTorch's ``noop_hook``
(``torch/distributed/algorithms/ddp_comm_hooks/debugging_hooks.py``), which hands every bucket
back without communicating: DDP's reducer still runs but no gradient crosses the link, the
headroom analysis PyTorch documents the hook for.
"""
from __future__ import annotations

import argparse

from benchmarks.multi_gpu_checks import UsageError


def accelerator_for(args: argparse.Namespace):
    """``(accelerator, ddp_kwargs)`` for this launch. Without CUDA Accelerate is asked for
    ``cpu=True``: it picks MULTI_CPU (gloo) only when told, so a DDP config then runs on CPUs.
    Under a DeepSpeed config the engine's batch sizes come from ``--batch-per-device`` (no
    DataLoader goes through ``prepare`` for Accelerate to read them from) and gradient clipping
    is off: left ``"auto"``, ``Accelerator.prepare_deepspeed`` fills in 1.0, while the DDP and
    FSDP runs do not clip, and clipping adds a global norm (a reduction and a pass over the
    gradients). Under ZeRO-3 transformers builds the model inside ``deepspeed.zero.Init``
    (``transformers/modeling_utils.py``), which draws the random weights in another
    order: its losses are not comparable step by step with the other wrappers'."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    hook = DDPCommunicationHookType.BF16 if args.comm_hook == "bf16" else DDPCommunicationHookType.NO  # noop: wrap()
    ddp_kwargs = DistributedDataParallelKwargs(bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.bucket_view,
                                               comm_hook=hook)
    accelerator = Accelerator(mixed_precision="bf16" if args.bf16 else None, cpu=not torch.cuda.is_available(),
                              kwargs_handlers=[ddp_kwargs])
    if accelerator.distributed_type.value == "DEEPSPEED":
        ds_cfg = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_cfg["train_micro_batch_size_per_gpu"] = args.batch_per_device
        ds_cfg["train_batch_size"] = args.batch_per_device * accelerator.num_processes  # DeepSpeed checks the product
        ds_cfg["gradient_clipping"] = 0.0
    return accelerator, ddp_kwargs


def wrap(args: argparse.Namespace, accelerator, ddp_kwargs, model, opt):
    """``(model, opt)`` prepared by Accelerate, then in DDP over one rank (``--ddp-one-process``)
    and with the noop hook (``--comm-hook noop``) where asked. Under DeepSpeed
    ``accelerator.backward`` has the engine reduce, step and zero the gradients, and the prepared
    optimizer's ``step`` does nothing. Returns ``(model, opt)``; ``model`` is the wrapper that
    owns ``no_sync`` and the parameters."""
    model, opt = accelerator.prepare(model, opt)
    if args.ddp_one_process:  # after prepare, as Accelerate wraps DDP after its autocast
        model = ddp_one_process(model, ddp_kwargs, accelerator.device)
    if args.comm_hook == "noop":  # Accelerate has no such hook type: register PyTorch's on the DDP wrapper itself
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        model.register_comm_hook(None, noop_hook)  # check_launch refused noop unless this is DDP
    return model, opt


def ddp_class():
    """PyTorch's DDP class, imported late: the arguments are checked before torch loads."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def ddp_one_process(model, ddp_kwargs, device):
    """``model`` (already prepared by Accelerate, autocast included) in PyTorch's DDP over a
    one-rank group, built as Accelerate builds it for 2+ processes (``Accelerator.prepare_model``:
    its ``DistributedDataParallelKwargs``, then their hook). A group ``torchrun`` started is used
    as it is; otherwise an in-process ``HashStore`` holds the rendezvous of this one rank."""
    import torch
    import torch.distributed as td

    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    if not td.is_initialized():
        td.init_process_group("nccl" if cuda else "gloo", store=td.HashStore(), rank=0, world_size=1)
    if td.get_world_size() != 1:
        raise UsageError(f"--ddp-one-process needs one process; this group has {td.get_world_size()}")
    ddp = ddp_class()(model, device_ids=[index] if cuda else None, output_device=index, **ddp_kwargs.to_kwargs())
    ddp_kwargs.register_comm_hook(ddp)
    return ddp


def no_sync(accelerator, wrapped):
    """``no_sync`` of the wrapper: DDP's own (Accelerate's does nothing on one process, where a
    ``--ddp-one-process`` wrapper still needs it), else Accelerate's (FSDP, DeepSpeed)."""
    if isinstance(wrapped, ddp_class()):
        return wrapped.no_sync()
    return accelerator.no_sync(wrapped)


def distributed_info(accelerator, wrapped=None) -> dict:
    """What actually wraps the model: read from the prepared module (FSDP1 keeps its
    ``sharding_strategy``, DDP its logging data, DeepSpeed its engine), not from the plugin,
    whose fields depend on which config key set it. With ``--bf16`` Accelerate gives FSDP bf16
    parameters and gradient reductions (``param_dtype``/``reduce_dtype``), recorded as
    ``fsdp_mixed_precision``."""
    info = {"distributed_type": str(accelerator.distributed_type.value)}
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None:
        info["fsdp_version"] = plugin.fsdp_version
        strat = getattr(wrapped, "sharding_strategy", None)
        if strat is None:
            strat = plugin.reshard_after_forward if plugin.reshard_after_forward is not None else plugin.sharding_strategy
        if isinstance(strat, bool):  # FSDP2: reshard_after_forward, the equivalent of FULL_SHARD / SHARD_GRAD_OP
            strat = "FULL_SHARD" if strat else "SHARD_GRAD_OP"
        info["sharding_strategy"] = getattr(strat, "name", str(strat))
        info["fsdp_mixed_precision"] = str(getattr(plugin, "mixed_precision_policy", None))
    elif info["distributed_type"] == "DEEPSPEED":
        info.update(_deepspeed_info(accelerator, wrapped))
    elif accelerator.num_processes == 1 and not isinstance(wrapped, ddp_class()):
        info["sharding_strategy"] = "none (one process, no wrapper)"
    elif accelerator.num_processes == 1 or accelerator.distributed_type.value in ("MULTI_GPU", "MULTI_CPU"):
        info["sharding_strategy"] = "DDP (one process)" if accelerator.num_processes == 1 else "DDP (replicated)"
        logged = getattr(wrapped, "_get_ddp_logging_data", None)  # what DDP itself runs with
        if logged is not None:
            d = logged()
            info["ddp"] = {"bucket_cap_mb": d.get("bucket_cap_bytes", 0) / 2**20, "comm_hook": d.get("comm_hook") or "none",
                           "gradient_as_bucket_view": bool(d.get("gradient_as_bucket_view"))}
    return info


def _deepspeed_info(accelerator, engine) -> dict:
    """The ZeRO stage, read back from the engine when there is one (else from the plugin), and
    the engine's own bf16, micro-batch and clipping settings."""
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else \
        accelerator.state.deepspeed_plugin.zero_stage
    info: dict = {"sharding_strategy": f"DeepSpeed ZeRO-{stage}"}
    if hasattr(engine, "bfloat16_enabled"):
        import deepspeed

        info["deepspeed"] = {"version": deepspeed.__version__, "zero_stage": stage,
                             "bf16_weights": bool(engine.bfloat16_enabled()),
                             "micro_batch_per_gpu": engine.train_micro_batch_size_per_gpu(),
                             "gradient_clipping": engine.gradient_clipping()}
    return info
