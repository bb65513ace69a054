"""The input checks of ``benchmarks/train_multi_gpu.py``: every refusal is one line, before any
process group starts.

``validate`` checks the arguments and reads ``--baseline``; ``check_launch`` checks them
against what ``accelerate launch`` put in the environment (``launch_family``) and the machine
(``cpu_run``); ``check_config`` parses an Accelerate config file with Accelerate's own loader.
Nothing here imports torch at module level: the command line is checked before torch loads.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.multi_gpu_compile import missing_comm_reorder, uses_compiled_autograd


class UsageError(ValueError):
    """Bad input: reported as one line, exit status 2."""


def check_config(path: Path) -> dict:
    """Parse an Accelerate config file with Accelerate's own loader; one-line error if bad."""
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist; pass one of benchmarks/accelerate/*.yaml")
    from accelerate.commands.config.config_args import load_config_from_file

    try:
        cfg = load_config_from_file(str(path))
    except Exception as exc:  # accelerate raises several types for a malformed file
        raise UsageError(f"config file {path} is not a valid Accelerate config: {exc}") from None
    return {"distributed_type": str(cfg.distributed_type.value if hasattr(cfg.distributed_type, "value")
                                    else cfg.distributed_type),
            "num_processes": cfg.num_processes, "fsdp_config": cfg.fsdp_config or None,
            "deepspeed_config": cfg.deepspeed_config or None}


def launch_family(env=os.environ) -> str:
    """The wrapper this launch asks for, from what ``accelerate launch`` put in the environment,
    named as ``utils.parallel.scaling.wrapper_family`` names a result's."""
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return f"FSDP{env.get('FSDP_VERSION', '1')}"
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return f"DeepSpeed ZeRO-{env.get('ACCELERATE_DEEPSPEED_ZERO_STAGE', '2')}"
    return "DDP"


def cpu_run() -> bool:
    """This launch trains on CPUs: no CUDA here, or `accelerate launch --cpu`."""
    import torch

    return os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true" or not torch.cuda.is_available()


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def validate(args: argparse.Namespace) -> dict | None:
    """Check every argument before any process group starts; returns the baseline result."""
    from utils.model.models import MODEL_PRESETS

    if args.out is None:
        raise UsageError("--out FILE.json is required")
    if not args.out.parent.is_dir():
        raise UsageError(f"the folder of --out ({args.out.parent}) does not exist; create it first")
    if args.preset not in MODEL_PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    if args.ddp_optimizer != "ddp_optimizer" and not args.compile:
        raise UsageError(f"--ddp-optimizer {args.ddp_optimizer} only changes how torch.compile splits the graph; add --compile")
    if args.compile_scope != "model" and (not args.compile or args.ddp_optimizer == "python_reducer"):
        raise UsageError("--compile-scope loss changes what --compile wraps; add --compile (python_reducer always "
                         "compiles the whole step)")
    if args.comm_reorder and args.ddp_optimizer != "python_reducer":
        raise UsageError("--comm-reorder reorders the all-reduces Compiled Autograd traced; add --compile --ddp-optimizer python_reducer")
    if args.comm_reorder and missing_comm_reorder(args.comm_reorder):
        raise UsageError(f"this torch has no Inductor {missing_comm_reorder(args.comm_reorder)}; "
                         f"drop --comm-reorder {args.comm_reorder}")
    if args.ddp_optimizer == "python_reducer" and args.comm_hook != "none":
        raise UsageError("--ddp-optimizer python_reducer calls communication hooks with its own signature; drop --comm-hook")
    for name, low in (("batch_per_device", 1), ("seq", 1), ("steps", 1), ("warmup", 0), ("grad_accum", 1),
                      ("bucket_mb", 1)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if args.profile is not None:
        try:
            args.profile.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create --profile folder {args.profile}: {exc}") from None
    return None if args.baseline is None else _read_baseline(args)


def _read_baseline(args: argparse.Namespace) -> dict:
    """The ``--baseline`` result, refused unless it is a 1-process run of the same program: shape,
    compile mode and scope, wrapper family (``utils.parallel.scaling.wrapper_family``), Compiled Autograd."""
    try:
        base = json.loads(args.baseline.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read --baseline {args.baseline}: {exc}") from None
    if base.get("world_size") != 1:
        raise UsageError(f"--baseline {args.baseline} has world_size {base.get('world_size')}; pass a 1-GPU result")
    for key in ("preset", "batch_per_device", "seq", "grad_accum", "compile"):
        if base.get("config", {}).get(key, False if key == "compile" else None) != getattr(args, key):
            raise UsageError(f"--baseline {args.baseline} has {key}={base.get('config', {}).get(key)!r}, "
                             f"this run {getattr(args, key)!r}: compare like with like")
    base_scope = base.get("config", {}).get("compile_scope") or "model"  # absent in older results; None if eager
    if base_scope != args.compile_scope:
        raise UsageError(f"--baseline {args.baseline} has compile_scope={base_scope!r}, this run "
                         f"{args.compile_scope!r}: compare like with like")
    from utils.parallel.scaling import wrapper_family

    if wrapper_family(base) != launch_family():  # FSDP and ZeRO hold bf16 weights on one GPU; a plain run does not
        raise UsageError(f"--baseline {args.baseline} ran as {wrapper_family(base)}, this launch is {launch_family()}: "
                         f"give it a 1-GPU run with the same --config_file")
    mine_ca = uses_compiled_autograd(args)
    if bool(base.get("compiled_autograd")) != mine_ca:
        raise UsageError(f"--baseline {args.baseline} {'ran' if base.get('compiled_autograd') else 'did not run'} "
                         f"under Compiled Autograd and this run {'does' if mine_ca else 'does not'}: give it a 1-GPU "
                         "run with the same --ddp-optimizer")
    return base


def check_deepspeed(args: argparse.Namespace) -> None:
    """A DeepSpeed config: DeepSpeed must be installed, and the options that drive DDP or
    torch.compile are refused rather than silently ignored (the engine steps and syncs itself)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise UsageError("this is a DeepSpeed config and deepspeed is not installed: pip install deepspeed, "
                         "or launch the DDP or FSDP config")
    for flag, on in (("--compile", args.compile), ("--measure-comm", args.measure_comm),
                     ("--grad-accum", args.grad_accum != 1), ("--comm-hook", args.comm_hook != "none"),
                     ("--bucket-view", args.bucket_view), ("--bucket-mb", args.bucket_mb != 25),
                     ("--no-sync-accum", args.no_sync_accum)):
        if on:
            raise UsageError(f"{flag} is a DDP/torch.compile option; under DeepSpeed the engine syncs and steps "
                             f"itself: drop {flag}")


def check_launch(args: argparse.Namespace) -> None:
    """The options against this launch's wrapper and machine. FSDP and DeepSpeed need CUDA:
    Accelerate switches to FSDP only for GPU-like distributed types (``accelerate/state.py``), so
    on gloo an FSDP config would run as plain multi-CPU DDP, and a DeepSpeed one either does the
    same or reports every rank as process 0 of 1."""
    family = launch_family()
    if family.startswith("FSDP") and cpu_run():
        raise UsageError("FSDP needs CUDA GPUs here (NCCL); on a CPU run the DDP config or no config")
    if args.ddp_optimizer == "python_reducer" and family.startswith("FSDP"):
        raise UsageError("--ddp-optimizer python_reducer is a DDP mode; launch with the DDP config, not an FSDP one")
    if family.startswith("DeepSpeed"):
        if cpu_run():
            raise UsageError("DeepSpeed needs CUDA GPUs here: on a CPU, Accelerate 1.15 either drops it for plain "
                             "multi-CPU DDP or reports every rank as process 0 of 1; on a CPU launch the DDP config")
        check_deepspeed(args)
    if args.comm_hook != "none" and family != "DDP":
        raise UsageError(f"--comm-hook is a DDP option; this launch is {family}: launch the DDP config")
    if args.ddp_one_process and (_world_size() > 1 or family != "DDP"):
        raise UsageError("--ddp-one-process wraps a single process in DDP; launch one process with no FSDP or "
                         "DeepSpeed config (python benchmarks/train_multi_gpu.py ...)")
    if args.comm_hook == "noop" and _world_size() < 2 and not args.ddp_one_process:
        raise UsageError("--comm-hook noop measures DDP without its all-reduce; it needs DDP with 2+ processes "
                         "(accelerate launch --num_processes 2 or more) or --ddp-one-process")
    if args.comm_hook == "bf16" and cpu_run():
        raise UsageError("--comm-hook bf16 needs CUDA GPUs (PyTorch's bf16_compress_hook runs on NCCL); drop it on a CPU")
    if args.compile_scope == "loss" and family.startswith("FSDP"):
        raise UsageError("--compile-scope loss is for DDP and one process: FSDP's wrap policy reads the model's "
                         "layer classes, which the loss wrapper hides; drop --compile-scope loss under FSDP")
    if args.comm_reorder == "overlap" and cpu_run():
        raise UsageError("--comm-reorder overlap needs CUDA GPUs (the overlap scheduler times kernels through "
                         "Triton's GPU driver); on a CPU use --comm-reorder passes")
