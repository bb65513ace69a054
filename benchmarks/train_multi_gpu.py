"""Phase 2 reference training run on 1..N GPUs: DDP or FSDP through Accelerate, timed per rank.

    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/train_multi_gpu.py --out r2.json --bf16 --compile --baseline r1.json
    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/train_multi_gpu.py \\
        --out cpu.json --preset gpt2-tiny --batch-per-device 2 --seq 64 --steps 3 --warmup 1
    python benchmarks/train_multi_gpu.py --check-config benchmarks/accelerate/fsdp_full_shard.yaml

The model is ``utils.models.build_model(preset)`` (random weights, no network), the data the
shipped text cut into ``TokenBlocks``, rank ``r`` of ``W`` taking blocks ``r, r+W, r+2W, ...``
(each rank a disjoint shard, as a ``DistributedSampler`` would give). Each rank times its own
steps with ``utils.timing.Stopwatch`` (CUDA events on a GPU, so no per-step sync), after a
barrier so all ranks start together; rank 0 gathers every rank's numbers and writes one JSON:
per-rank tokens/s, their sum (``total_tokens_per_s``), the slowest rank and the total it
bounds (``W x slowest``: ranks wait for each other at every gradient all-reduce, so the
slowest sets the pace), step-time statistics, peak memory per rank and MFU against the
datasheet peak (``utils.hardware``; bf16 peak with ``--bf16``, fp32 otherwise).

``--measure-comm`` (DDP only) times the same steps a second time with the whole step under
``accelerator.no_sync`` (no gradient all-reduce) and reports
``share = 1 - t_nosync / t_sync`` (medians). This is the *exposed* communication, the part
of the all-reduce the backward pass did not hide, not the total time spent in NCCL, which
DDP's bucketing overlaps with the backward pass.

``--baseline FILE`` reads a 1-GPU result of this script (same preset, batch, seq) and adds
``utils.distributed.scaling_efficiency`` of per-device throughput. The baseline must have run
under the same wrapper (``launch_family``): under bf16, FSDP and DeepSpeed compute on bf16
weight copies while a plain 1-GPU run autocasts fp32 weights at every step, so eager FSDP2
scored 109.6% against a plain run on two H200s (RESULTS.md); it is refused.

``--grad-accum N`` runs N micro-batches per optimizer step with ``no_sync`` on all but the
last (gradients all-reduced once per step); ``--no-sync-accum`` drops the ``no_sync``, so
every micro-batch all-reduces: the accumulation mistake issue 5 asks to measure.

``--bucket-mb``, ``--bucket-view`` and ``--comm-hook bf16`` are DDP's overlap and traffic knobs
(``DistributedDataParallelKwargs``); the hook halves the bytes each step all-reduces.
``--comm-hook noop`` registers PyTorch's ``noop_hook`` (``ddp_comm_hooks.debugging_hooks``),
which hands every bucket back without communicating: DDP's reducer still runs (bucket copies,
hooks, and under ``torch.compile`` DDPOptimizer's graph splits) but no gradient crosses the
link, so the ranks drift apart (``replicas_identical`` false; a headroom measurement, not
training). Its efficiency is the ceiling with free communication; with ``--measure-comm`` its
"exposed" share is what DDP's machinery alone costs over ``no_sync``. PyTorch documents the
hook for this headroom analysis.
``--ddp-optimizer`` sets ``torch._dynamo.config.optimize_ddp`` for a ``--compile`` run:
``ddp_optimizer`` (PyTorch's default) splits the compiled graph at DDP's bucket boundaries so
each bucket's all-reduce can start during the backward; ``no_optimization`` compiles one graph
and all-reduces after its backward (no overlap, no graph breaks); ``python_reducer`` replaces
DDP's C++ reducer by per-parameter hooks that Compiled Autograd traces into the compiled
backward, where Inductor buckets the all-reduces (``bucket_cap_mb``) and schedules them among
the backward's kernels, again without graph breaks (PyTorch marks it experimental; see the
``optimize_ddp`` comment in ``torch/_dynamo/config.py``). Under it the script compiles forward
and backward together (``torch._dynamo.config.compiled_autograd``, which traces backward calls
made inside a compiled function) and refuses ``--comm-hook``: the Python reducer calls its
hooks with another signature than DDP's (``DistributedDataParallel._register_accum_grad_hook``).
``--comm-reorder`` asks Inductor to move that mode's all-reduces among the backward's kernels
(on an H200 they otherwise ran after the backward's last kernel, with nothing to overlap), by
one of its two schedulers: ``passes`` (the default) runs the ``reorder_for_compute_comm_overlap``
passes ``torch/_inductor/config.py`` recommends; ``overlap`` runs the newer overlap scheduler
(``aten_distributed_optimizations.enable_overlap_scheduling``), which estimates each kernel's
and each collective's time and issues collectives early enough to hide them.

``--ddp-one-process`` wraps the one process's model in PyTorch's DDP over a one-rank process
group (Accelerate wraps only when there are 2+ processes). The reducer then runs as on N GPUs
(bucket copies, the hook, under ``torch.compile`` DDPOptimizer's graph splits) while no gradient
crosses a link: NCCL's all-reduce over one rank is a local copy at most, and with ``--comm-hook
noop`` nothing is called at all. Against a plain 1-GPU run (``--baseline``) it is what DDP itself
costs on this GPU, the ceiling of any N-GPU efficiency before communication, measurable with one
GPU: on one H200 (GPT-2 small, bf16, batch 16 x 1024) 1.6 to 2.0% of the compiled step at 100 and
200 MB bucket views, 4.0% at PyTorch's default 25 MB without views (RESULTS.md). Its result is
marked ``ddp_one_process`` and never serves as a baseline (``utils.scaling`` gives it its own
wrapper family, ``"DDP, one process"``).

``--compile-scope`` says what ``--compile`` wraps: ``model`` (the default) compiles the prepared
model, so everything the Hugging Face forward returns leaves the compiled graph, the
``[batch, seq, vocab]`` logits included; ``loss`` wraps the model, before ``prepare``, in a module
whose forward returns only the loss (``_loss_only``), so Inductor need not hand the logits back
and autograd need not feed their backward a zero gradient (``python_reducer`` always compiles the
whole step). The wrapper goes *inside* DDP because Dynamo does not trace DDP's own forward: it
compiles the forward of the module DDP wraps, so compiling a loss function around the DDP model
would still compile the Hugging Face forward with its logits (seen on two gloo processes: a
graph break and the logits returned). FSDP's wrap policy reads the Hugging Face model's layer
classes, so the loss scope is for DDP and one process only.

Every rank records its training loss for each synchronised step (``loss_per_step``; kept on
the GPU until the timed loop ends, so no step waits for it): runs under different compile modes
can then be compared on what they learn, not only on speed.

``--profile DIR`` profiles five more synchronised steps on every rank after the timed ones
(``utils.profiling.profile_steps``; traces ``DIR/trace_rankR.json``) and records, per rank, the
GPU's idle share and ``utils.profiling.comm_overlap``: the all-reduce's kernel time per step,
how much of it ran next to compute kernels and how much the GPU spent on it alone.

The NCCL/NVSHMEM multicast variables are set (``setdefault``) before torch is imported:
NVLink multicast can take a shared host's GPUs out of service (shared/REFERENCE.md).
A DeepSpeed config (``benchmarks/accelerate/deepspeed_zero{1,2,3}.yaml``; DeepSpeed ZeRO where
installed) runs the same loop: ``accelerator.backward`` then has the engine reduce, step and
zero the gradients, and the prepared optimizer's ``step`` does nothing. The script gives
DeepSpeed the micro-batch (no DataLoader goes through ``prepare``) and turns off the gradient
clipping Accelerate would otherwise add, and refuses the DDP and compile options. On a CPU it is
refused with one line, like FSDP: Accelerate 1.15 either replaces it by plain multi-CPU DDP or,
told it is not a CPU run, reports every rank as process 0 of 1 (tried on two gloo processes).
On one CPU process, where Accelerate's numbers are right, ZeRO-1 and ZeRO-2 gave the plain
loop's losses to the last digit. ZeRO-3 starts from other random weights: transformers sees
ZeRO-3 and builds the model under ``deepspeed.zero.Init``, which draws them in another order
(same initialiser, std 0.02), so its losses are not comparable step by step.
FSDP on a CPU is refused with one line: Accelerate 1.15 switches to FSDP only for GPU-like
distributed types (``accelerate/state.py``), so an FSDP config on gloo would silently run as
plain multi-CPU DDP. On a CPU machine launch the DDP config: ``accelerate launch --cpu
--num_processes 2`` starts a single process unless MPI is set up (Accelerate's simple
launcher), while ``--config_file benchmarks/accelerate/ddp.yaml --num_processes 2`` starts two
through torchrun, and the script asks Accelerate for ``cpu=True`` (gloo) when there is no CUDA.
"""
from __future__ import annotations

import os

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROG = "train_multi_gpu.py"
DDP_OPTIMIZERS = ("ddp_optimizer", "no_optimization", "python_reducer")  # torch._dynamo.config.optimize_ddp values
COMM_REORDERS = ("passes", "overlap")  # --comm-reorder: Inductor's two compute/communication schedulers
ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_")


class UsageError(ValueError):
    """Bad input: reported as one line, exit status 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON file rank 0 writes")
    p.add_argument("--preset", default="gpt2-small")
    p.add_argument("--batch-per-device", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=30, help="measured optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile, allocator)")
    p.add_argument("--compile", action="store_true", help="torch.compile the prepared model")
    p.add_argument("--compile-scope", choices=("model", "loss"), default="model",
                   help="what --compile wraps: the model (its outputs, logits included, leave the graph) or a "
                        "module around it returning only the loss")
    p.add_argument("--bf16", action="store_true", help="Accelerate mixed_precision='bf16' (overrides the config)")
    p.add_argument("--bucket-mb", type=int, default=25, help="DDP bucket_cap_mb (PyTorch's default 25)")
    p.add_argument("--bucket-view", action="store_true", help="DDP gradient_as_bucket_view=True (no grad copy)")
    p.add_argument("--comm-hook", choices=("none", "bf16", "noop"), default="none",
                   help="DDP communication hook: bf16 all-reduces gradients as bf16 (half the bytes of fp32); noop "
                        "communicates nothing (headroom: DDP's cost without the all-reduce; the replicas drift apart)")
    p.add_argument("--ddp-optimizer", choices=DDP_OPTIMIZERS, default="ddp_optimizer",
                   help="torch._dynamo.config.optimize_ddp under --compile (default: PyTorch's, ddp_optimizer)")
    p.add_argument("--comm-reorder", nargs="?", const="passes", choices=COMM_REORDERS, default=None,
                   help="with python_reducer: Inductor moves the all-reduces among the backward's kernels, by its "
                        "reorder_for_compute_comm_overlap passes (passes, the default) or its overlap scheduler (overlap)")
    p.add_argument("--ddp-one-process", action="store_true",
                   help="wrap the single process's model in DDP over a one-rank group: DDP's own cost with no link "
                        "(compare with a plain 1-GPU run through --baseline)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--no-sync-accum", action="store_true", help="all-reduce on every micro-batch")
    p.add_argument("--measure-comm", action="store_true", help="also time steps without gradient sync (DDP)")
    p.add_argument("--baseline", type=Path, help="a 1-GPU result of this script: adds scaling efficiency")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="after the timed steps, profile 5 more on every rank (traces in DIR): GPU idle, comm overlap")
    p.add_argument("--check-config", type=Path, metavar="YAML",
                   help="parse an Accelerate config file, print its distributed type, exit")
    return p.parse_args(argv)


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


def validate(args: argparse.Namespace) -> dict | None:
    """Check every argument before any process group starts; returns the baseline result."""
    from utils.models import MODEL_PRESETS

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
    if args.comm_reorder and _missing_comm_reorder(args.comm_reorder):
        raise UsageError(f"this torch has no Inductor {_missing_comm_reorder(args.comm_reorder)}; "
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
    if args.baseline is None:
        return None
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
    base_scope = base.get("config", {}).get("compile_scope") or "model"  # absent before the option; None if eager
    if base_scope != args.compile_scope:
        raise UsageError(f"--baseline {args.baseline} has compile_scope={base_scope!r}, this run "
                         f"{args.compile_scope!r}: compare like with like")
    from utils.scaling import wrapper_family

    if wrapper_family(base) != launch_family():  # FSDP and ZeRO hold bf16 weights on one GPU; a plain run does not
        raise UsageError(f"--baseline {args.baseline} ran as {wrapper_family(base)}, this launch is {launch_family()}: "
                         f"give it a 1-GPU run with the same --config_file")
    mine_ca = args.compile and args.ddp_optimizer == "python_reducer"
    if bool(base.get("compiled_autograd")) != mine_ca:
        raise UsageError(f"--baseline {args.baseline} {'ran' if base.get('compiled_autograd') else 'did not run'} "
                         f"under Compiled Autograd and this run {'does' if mine_ca else 'does not'}: give it a 1-GPU "
                         "run with the same --ddp-optimizer")
    return base


def launch_family(env=os.environ) -> str:
    """The wrapper this launch asks for, from what ``accelerate launch`` put in the environment,
    named as ``utils.scaling.wrapper_family`` names a result's."""
    if env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return f"FSDP{env.get('FSDP_VERSION', '1')}"
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return f"DeepSpeed ZeRO-{env.get('ACCELERATE_DEEPSPEED_ZERO_STAGE', '2')}"
    return "DDP"


def _cpu_run() -> bool:
    """This launch trains on CPUs: no CUDA here, or `accelerate launch --cpu`."""
    import torch

    return os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true" or not torch.cuda.is_available()


def _check_deepspeed(args: argparse.Namespace) -> None:
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


def _fsdp_on_cpu() -> bool:
    return launch_family().startswith("FSDP") and _cpu_run()


def _batches(args: argparse.Namespace, rank: int, world: int, vocab_size: int, device) -> list:
    """Up to 8 distinct (input_ids, labels) micro-batches of this rank's shard, already on the device."""
    import torch

    from utils.models import TokenBlocks, get_tokenizer

    ds = TokenBlocks(get_tokenizer(None, offline=True), None, args.seq, vocab_size=vocab_size)
    out = []
    for b in range(8):
        idx = [(rank + world * (b * args.batch_per_device + j)) % len(ds) for j in range(args.batch_per_device)]
        x = torch.stack([ds[i][0] for i in idx]).to(device)
        out.append((x, x))  # HF convention: labels = input_ids, shifted inside the loss
    return out


def _distributed_info(accelerator, wrapped=None) -> dict:
    """What actually wraps the model: read from the prepared module (FSDP1 keeps its
    ``sharding_strategy``), not from the plugin, whose fields depend on which config key set it."""
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
        # with --bf16 Accelerate gives FSDP bf16 parameters and gradient reductions
        # (param_dtype/reduce_dtype): fewer casts per step than a 1-GPU autocast run, so compare
        # FSDP against FSDP on one GPU
        info["fsdp_mixed_precision"] = str(getattr(plugin, "mixed_precision_policy", None))
    elif info["distributed_type"] == "DEEPSPEED":  # read back from the engine when there is one
        stage = wrapped.zero_optimization_stage() if hasattr(wrapped, "zero_optimization_stage") else \
            accelerator.state.deepspeed_plugin.zero_stage
        info["sharding_strategy"] = f"DeepSpeed ZeRO-{stage}"
        if hasattr(wrapped, "bfloat16_enabled"):
            import deepspeed

            info["deepspeed"] = {"version": deepspeed.__version__, "zero_stage": stage,
                                 "bf16_weights": bool(wrapped.bfloat16_enabled()),
                                 "micro_batch_per_gpu": wrapped.train_micro_batch_size_per_gpu(),
                                 "gradient_clipping": wrapped.gradient_clipping()}
    elif accelerator.num_processes == 1 and not isinstance(wrapped, _ddp_class()):
        info["sharding_strategy"] = "none (one process, no wrapper)"
    elif accelerator.num_processes == 1 or accelerator.distributed_type.value in ("MULTI_GPU", "MULTI_CPU"):
        info["sharding_strategy"] = "DDP (one process)" if accelerator.num_processes == 1 else "DDP (replicated)"
        logged = getattr(wrapped, "_get_ddp_logging_data", None)  # what DDP itself runs with
        if logged is not None:
            d = logged()
            info["ddp"] = {"bucket_cap_mb": d.get("bucket_cap_bytes", 0) / 2**20, "comm_hook": d.get("comm_hook") or "none",
                           "gradient_as_bucket_view": bool(d.get("gradient_as_bucket_view"))}
    return info


def _ddp_class():
    """PyTorch's DDP class, imported late: this module parses and checks arguments before torch loads."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _ddp_one_process(model, ddp_kwargs, device):
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
    ddp = _ddp_class()(model, device_ids=[index] if cuda else None, output_device=index, **ddp_kwargs.to_kwargs())
    ddp_kwargs.register_comm_hook(ddp)
    return ddp


def _no_sync(accelerator, wrapped):
    """``no_sync`` of the wrapper: DDP's own (Accelerate's does nothing on one process, where a
    ``--ddp-one-process`` wrapper still needs it), else Accelerate's (FSDP, DeepSpeed)."""
    if isinstance(wrapped, _ddp_class()):
        return wrapped.no_sync()
    return accelerator.no_sync(wrapped)


def _profile(trace: Path, step_fn) -> dict:
    """Five synchronised steps under ``utils.profiling.profile_steps`` (after 1 skipped and 2
    discarded); the Chrome trace stays at ``trace``. Returns the GPU-idle numbers and
    ``utils.profiling.comm_overlap``: how much of the all-reduce ran next to compute."""
    from utils.profiling import comm_overlap, load_events, profile_steps

    counter = iter(range(10**9))
    s = profile_steps(lambda: step_fn(next(counter)), steps=5, trace_path=trace)
    return {"trace": str(trace), "step_time_ms": s.step_time_ms, "gpu_idle_fraction": s.gpu_idle_fraction,
            "gpu_busy_ms_per_step": s.gpu_busy_ms_per_step, "diagnosis": s.diagnosis,
            "comm": comm_overlap(load_events(trace))}


def replicas_identical(checksums: list[float], rel_tol: float = 1e-9) -> bool:
    """DDP's promise after synchronised steps: every rank holds the same weights. ``checksums``
    are each rank's sum of all parameters (float64); ranks that trained on their own shards
    without the all-reduce drift apart at the first step."""
    return max(checksums) - min(checksums) <= rel_tol * max(1.0, abs(checksums[0]))


# The passes torch/_inductor/config.py recommends for reorder_for_compute_comm_overlap_passes
COMM_REORDER_PASSES = ("reorder_communication_preserving_peak_memory", "sink_waits_iterative",
                       "reorder_communication_preserving_peak_memory")


def _missing_comm_reorder(mode: str) -> str | None:
    """What this torch's Inductor lacks for ``--comm-reorder MODE`` (a pass or a setting), or None."""
    import torch._inductor.comms as comms
    import torch._inductor.config as inductor_config

    if mode == "overlap":
        opts = getattr(inductor_config, "aten_distributed_optimizations", None)
        return None if hasattr(opts, "enable_overlap_scheduling") else "setting aten_distributed_optimizations.enable_overlap_scheduling"
    return next((f"pass {p}" for p in COMM_REORDER_PASSES if not hasattr(comms, p)), None)


def _enable_comm_reorder(mode: str) -> None:
    """Inductor's compute/communication scheduling, for the collectives Compiled Autograd put in
    the backward graph. Without it, on an H200 with torch 2.11 the fused all-reduces ran after
    the backward's last kernel (0% overlap, RESULTS.md): a collective starts on NCCL's stream
    only once the compute stream reaches the point where it was issued.

    ``passes``: ``reorder_for_compute_comm_overlap`` with the passes ``torch/_inductor/config.py``
    recommends (they run on Inductor's scheduler nodes). ``overlap``: the overlap scheduler of
    ``torch/_inductor/fx_passes/overlap_scheduling.py``, a post-grad FX pass that orders the graph
    by estimated kernel and collective times so each collective is hidden behind compute."""
    import torch._inductor.config as inductor_config

    if mode == "overlap":
        inductor_config.aten_distributed_optimizations.enable_overlap_scheduling = True
        return
    inductor_config.reorder_for_compute_comm_overlap = True
    inductor_config.reorder_for_compute_comm_overlap_passes = list(COMM_REORDER_PASSES)


def _loss_only(model):
    """``model`` inside a module whose forward returns only the Hugging Face loss. Compiled (or
    compiled inside DDP), its graph's one output is the scalar loss: the ``[batch, seq, vocab]``
    logits stay inside, so they are not handed back to the caller and their backward gets no
    zero gradient (3.07 GiB at 16 x 1024 on an H200, RESULTS.md). The model is registered as the
    child ``inner``, so its parameters and their order are unchanged."""
    import torch

    class LossOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, labels):
            return self.inner(input_ids=input_ids, labels=labels).loss

    return LossOnly(model)


def _dynamo_counters() -> dict:
    """Rank 0's torch.compile tallies: Dynamo graphs and graph breaks, and how many backward
    graphs Compiled Autograd captured (0 unless ``--ddp-optimizer python_reducer``)."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "compiled_autograd_captures": int(counters["compiled_autograd"]["captures"])}


def run(args: argparse.Namespace, baseline: dict | None) -> dict | None:
    """The timed loop on this rank; rank 0 returns the gathered result (others None)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, gather_object

    from utils.flops import flops_per_token_from_config, mfu_from_throughput
    from utils.hardware import current_spec, fingerprint
    from utils.models import build_model
    from utils.record import utils_hash
    from utils.timing import Stopwatch

    # DDP's gradient buckets: fewer, larger buckets mean fewer all-reduce launches (and, under
    # torch.compile, fewer graph splits by DDPOptimizer, which cuts the graph at each bucket)
    # --comm-hook bf16: PyTorch's bf16_compress_hook through Accelerate (DDPCommunicationHookType.BF16):
    # under autocast DDP all-reduces the fp32 gradients; compressed, half the bytes cross the link
    hook = DDPCommunicationHookType.BF16 if args.comm_hook == "bf16" else DDPCommunicationHookType.NO  # noop: below
    ddp_kwargs = DistributedDataParallelKwargs(bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=args.bucket_view,
                                               comm_hook=hook)
    # cpu=True without CUDA: a DDP config launched on a CPU machine then runs over gloo
    # (Accelerate picks MULTI_CPU only when told cpu; `accelerate launch --cpu` alone starts one process)
    accelerator = Accelerator(mixed_precision="bf16" if args.bf16 else None, cpu=not torch.cuda.is_available(),
                              kwargs_handlers=[ddp_kwargs])
    if accelerator.distributed_type.value == "DEEPSPEED":  # no DataLoader goes through prepare to infer it from
        ds_cfg = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_cfg["train_micro_batch_size_per_gpu"] = args.batch_per_device
        ds_cfg["train_batch_size"] = args.batch_per_device * accelerator.num_processes  # DeepSpeed checks the product
        # left "auto", Accelerate fills in clipping at 1.0 (Accelerator.prepare_deepspeed); the DDP and
        # FSDP runs do not clip, and clipping adds a global norm (a reduction and a pass over the grads)
        ds_cfg["gradient_clipping"] = 0.0
    dist = _distributed_info(accelerator)
    if args.measure_comm and dist["distributed_type"] not in ("MULTI_GPU", "MULTI_CPU") and not args.ddp_one_process:
        raise UsageError(f"--measure-comm needs DDP with 2+ processes, this run is {dist['distributed_type']}")
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    on_cuda = device.type == "cuda"

    torch.manual_seed(0)  # same initial weights on every rank (FSDP does not broadcast them)
    model = build_model(args.preset, device=device)
    cfg = model.config
    cfg.use_cache = False  # training: no KV cache (building one costs memory and recompiles under torch.compile)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=on_cuda)
    python_reducer = args.compile and args.ddp_optimizer == "python_reducer"
    if args.compile:  # before prepare: DDP reads the mode when it is constructed (python_reducer)
        torch._dynamo.config.optimize_ddp = args.ddp_optimizer
        torch._dynamo.config.compiled_autograd = python_reducer
    if args.comm_reorder:
        _enable_comm_reorder(args.comm_reorder)
    loss_scope = args.compile and args.compile_scope == "loss"
    if loss_scope:  # inside DDP's wrapper: the graph Dynamo compiles is then the one returning only the loss
        model = _loss_only(model)
    model, opt = accelerator.prepare(model, opt)
    if args.ddp_one_process:  # after prepare, as Accelerate wraps DDP after its autocast
        model = _ddp_one_process(model, ddp_kwargs, device)
    wrapped = model  # no_sync lives on the DDP/FSDP wrapper
    if args.comm_hook == "noop":  # Accelerate has no such hook type: register PyTorch's on the DDP wrapper itself
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        wrapped.register_comm_hook(None, noop_hook)  # main() refused noop unless this is DDP on 2+ processes
    dist = _distributed_info(accelerator, wrapped)
    if args.compile and not python_reducer:
        model = torch.compile(model)
    batches = _batches(args, rank, world, cfg.vocab_size, device)
    tokens_per_step = args.batch_per_device * args.seq * args.grad_accum

    def loss_of(x, y):
        return model(x, y) if loss_scope else model(input_ids=x, labels=y).loss

    def forward_backward(x, y):
        loss = loss_of(x, y) / args.grad_accum
        accelerator.backward(loss)  # under --bf16 (no loss scaler) this is loss.backward()
        return loss.detach()

    if python_reducer:  # Compiled Autograd traces the backward called inside this compiled function
        forward_backward = torch.compile(forward_backward)

    def step(i: int, sync: bool):
        """One optimizer step; returns its loss (summed over micro-batches) as a GPU tensor."""
        loss = 0.0
        for m in range(args.grad_accum):
            x, y = batches[(i * args.grad_accum + m) % len(batches)]
            last = m == args.grad_accum - 1
            skip = not sync or (not last and not args.no_sync_accum)
            with _no_sync(accelerator, wrapped) if skip else contextlib.nullcontext():
                loss = loss + forward_backward(x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def timed(sync: bool, losses: list | None = None) -> dict:
        sw = Stopwatch(warmup_steps=args.warmup, tokens_per_step=tokens_per_step, device=device)
        accelerator.wait_for_everyone()
        for i in range(args.warmup + args.steps):
            with sw.step():
                loss = step(i, sync)
            if losses is not None:
                losses.append(loss)  # read after the loop: a .item() here would sync every step
        return sw.summary()

    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    step_losses: list = []
    s = timed(sync=True, losses=step_losses)
    mine = {"rank": rank, "device": str(device), "tokens_per_s": s["tokens_per_s"], "steps": s["steps"],
            "warmup_steps": s["warmup_steps"], "timing_method": s["method"], "median_ms": s["median_ms"],
            "p20_ms": s["p20_ms"], "p80_ms": s["p80_ms"], "mean_ms": s["mean_ms"], "std_ms": s["std_ms"],
            "total_s": s["total_s"], "step_times_ms": s["step_times_ms"],
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if on_cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if on_cuda else None,
            "loss_per_step": [float(v) for v in step_losses]}
    # every replica must hold the same weights after synced steps (DDP; ZeRO-1 and -2 replicate the weights too)
    if dist["sharding_strategy"] in ("DDP (replicated)", "DeepSpeed ZeRO-1", "DeepSpeed ZeRO-2") and world > 1:
        with torch.no_grad():
            mine["param_checksum"] = float(sum(p.double().sum() for p in wrapped.parameters()))
    if args.profile is not None:
        mine["profile"] = _profile(args.profile / f"trace_rank{rank}.json", lambda i: step(i, True))
    if args.measure_comm:
        n = timed(sync=False)
        mine["nosync_median_ms"] = n["median_ms"]
        mine["exposed_comm_share"] = max(0.0, 1.0 - n["median_ms"] / s["median_ms"])
    ranks = gather_object([mine])
    accelerator.wait_for_everyone()
    is_main = accelerator.is_main_process
    # every rank tears the group down before exiting: a rank that exits with gloo's threads
    # still running can abort ("terminate called without an active exception"), seen in CI
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if not is_main:
        return None

    ranks = sorted(ranks, key=lambda r: r["rank"])
    tps = [r["tokens_per_s"] for r in ranks]
    slow = min(ranks, key=lambda r: r["tokens_per_s"])
    per_device = statistics.fmean(tps)
    spec = current_spec(0) if on_cuda else None
    peak_dtype = "bf16" if args.bf16 else "fp32"
    peak = spec.peak_tflops(peak_dtype) if spec is not None else None
    fpt = flops_per_token_from_config(cfg, args.seq)
    res = {
        "world_size": world, **dist, "ddp_one_process": args.ddp_one_process, "mixed_precision": accelerator.mixed_precision,
        "config": {"preset": args.preset, "batch_per_device": args.batch_per_device, "seq": args.seq,
                   "steps": args.steps, "warmup": args.warmup, "compile": args.compile,
                   "compile_scope": args.compile_scope if args.compile else None, "bf16": args.bf16,
                   "grad_accum": args.grad_accum, "no_sync_accum": args.no_sync_accum,
                   "bucket_mb": args.bucket_mb, "bucket_view": args.bucket_view, "comm_hook": args.comm_hook,
                   "ddp_optimizer": args.ddp_optimizer, "comm_reorder": args.comm_reorder},
        "dynamo_optimize_ddp": torch._dynamo.config.optimize_ddp if args.compile else None,
        "compiled_autograd": bool(torch._dynamo.config.compiled_autograd),
        "dynamo_counters": _dynamo_counters() if args.compile else None,
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
    if None not in sums:  # DDP only (FSDP ranks hold different shards)
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
        from utils.distributed import scaling_efficiency

        base_tps = baseline["total_tokens_per_s"]
        res["baseline"] = {"file": str(args.baseline), "tokens_per_s": base_tps}
        res["scaling_efficiency"] = scaling_efficiency(per_device, base_tps, world, per_device=True)
        res["scaling_efficiency_slowest"] = scaling_efficiency(slow["tokens_per_s"], base_tps, world, per_device=True)
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.check_config is not None:
            print(json.dumps(check_config(args.check_config)))
            return 0
        baseline = validate(args)
        if _fsdp_on_cpu():
            raise UsageError("FSDP needs CUDA GPUs here (NCCL); on a CPU run the DDP config or no config")
        if args.ddp_optimizer == "python_reducer" and launch_family().startswith("FSDP"):
            raise UsageError("--ddp-optimizer python_reducer is a DDP mode; launch with the DDP config, not an FSDP one")
        if launch_family().startswith("DeepSpeed"):
            if _cpu_run():
                raise UsageError("DeepSpeed needs CUDA GPUs here: on a CPU, Accelerate 1.15 either drops it for plain "
                                 "multi-CPU DDP or reports every rank as process 0 of 1; on a CPU launch the DDP config")
            _check_deepspeed(args)
        if args.comm_hook != "none" and launch_family() != "DDP":
            raise UsageError(f"--comm-hook is a DDP option; this launch is {launch_family()}: launch the DDP config")
        if args.ddp_one_process and (int(os.environ.get("WORLD_SIZE", "1")) > 1 or launch_family() != "DDP"):
            raise UsageError("--ddp-one-process wraps a single process in DDP; launch one process with no FSDP or "
                             "DeepSpeed config (python benchmarks/train_multi_gpu.py ...)")
        if args.comm_hook == "noop" and int(os.environ.get("WORLD_SIZE", "1")) < 2 and not args.ddp_one_process:
            raise UsageError("--comm-hook noop measures DDP without its all-reduce; it needs DDP with 2+ processes "
                             "(accelerate launch --num_processes 2 or more) or --ddp-one-process")
        if args.comm_hook == "bf16" and _cpu_run():
            raise UsageError("--comm-hook bf16 needs CUDA GPUs (PyTorch's bf16_compress_hook runs on NCCL); drop it on a CPU")
        if args.compile_scope == "loss" and launch_family().startswith("FSDP"):
            raise UsageError("--compile-scope loss is for DDP and one process: FSDP's wrap policy reads the model's "
                             "layer classes, which the loss wrapper hides; drop --compile-scope loss under FSDP")
        if args.comm_reorder == "overlap" and _cpu_run():
            raise UsageError("--comm-reorder overlap needs CUDA GPUs (the overlap scheduler times kernels through "
                             "Triton's GPU driver); on a CPU use --comm-reorder passes")
        res = run(args, baseline)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if res is not None:
        args.out.write_text(json.dumps(res, indent=1, default=str))
        keep = ("world_size", "distributed_type", "sharding_strategy", "tokens_per_s_per_device", "total_tokens_per_s",
                "slowest_rank_tokens_per_s", "mfu_per_device", "peak_allocated_gib_per_rank", "exposed_comm_share",
                "scaling_efficiency", "replicas_identical")
        print(json.dumps({k: res[k] for k in keep if k in res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
