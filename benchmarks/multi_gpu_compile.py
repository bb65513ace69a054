"""How ``benchmarks/train_multi_gpu.py --compile`` meets DDP: Dynamo's DDP mode, Compiled
Autograd, Inductor's compute/communication reordering, the loss-only compile scope.

``optimize_ddp`` (``torch/_dynamo/config.py``) takes three values. ``ddp_optimizer``, PyTorch's
default, splits the compiled graph at DDP's bucket boundaries so each bucket's all-reduce can
start during the backward. ``no_optimization`` compiles one graph and all-reduces after its
backward. ``python_reducer`` replaces DDP's C++ reducer by per-parameter hooks that Compiled
Autograd traces into the compiled backward, where Inductor buckets the all-reduces
(``bucket_cap_mb``); PyTorch marks it experimental, and its hooks take another signature than
DDP's (``DistributedDataParallel._register_accum_grad_hook``), so ``--comm-hook`` is refused
with it. Nothing here imports torch at module level.
"""
from __future__ import annotations

import argparse

DDP_OPTIMIZERS = ("ddp_optimizer", "no_optimization", "python_reducer")  # torch._dynamo.config.optimize_ddp values
COMM_REORDERS = ("passes", "overlap")  # --comm-reorder: Inductor's two compute/communication schedulers
# The passes torch/_inductor/config.py recommends for reorder_for_compute_comm_overlap_passes
COMM_REORDER_PASSES = ("reorder_communication_preserving_peak_memory", "sink_waits_iterative",
                       "reorder_communication_preserving_peak_memory")


def uses_compiled_autograd(args: argparse.Namespace) -> bool:
    """The run compiles forward and backward together under Compiled Autograd (``python_reducer``)."""
    return args.compile and args.ddp_optimizer == "python_reducer"


def configure_dynamo(args: argparse.Namespace) -> None:
    """Dynamo's DDP mode and Compiled Autograd, and Inductor's reordering, set before
    ``accelerator.prepare``: DDP reads the mode when it is constructed (``python_reducer``)."""
    import torch

    if args.compile:
        torch._dynamo.config.optimize_ddp = args.ddp_optimizer
        torch._dynamo.config.compiled_autograd = uses_compiled_autograd(args)
    if args.comm_reorder:
        enable_comm_reorder(args.comm_reorder)


def missing_comm_reorder(mode: str) -> str | None:
    """What this torch's Inductor lacks for ``--comm-reorder MODE`` (a pass or a setting), or None."""
    import torch._inductor.comms as comms
    import torch._inductor.config as inductor_config

    if mode == "overlap":
        opts = getattr(inductor_config, "aten_distributed_optimizations", None)
        return None if hasattr(opts, "enable_overlap_scheduling") else "setting aten_distributed_optimizations.enable_overlap_scheduling"
    return next((f"pass {p}" for p in COMM_REORDER_PASSES if not hasattr(comms, p)), None)


def enable_comm_reorder(mode: str) -> None:
    """Inductor's compute/communication scheduling, for the collectives Compiled Autograd put in
    the backward graph; a collective starts on NCCL's stream only once the compute stream reaches
    the point where it was issued, so where it sits in the graph decides what it overlaps.

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


def loss_only(model):
    """``model`` inside a module whose forward returns only the Hugging Face loss. Compiled (or
    compiled inside DDP), its graph's one output is the scalar loss: the ``[batch, seq, vocab]``
    logits stay inside, so they are not handed back to the caller and their backward gets no
    zero gradient. It goes inside DDP because Dynamo compiles the forward of the module DDP wraps,
    not DDP's own. The model is registered as the child ``inner``, so its parameters and their
    order are unchanged."""
    import torch

    class LossOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, labels):
            return self.inner(input_ids=input_ids, labels=labels).loss

    return LossOnly(model)


def compile_step(args: argparse.Namespace, model, make_forward_backward):
    """The forward-and-backward function as ``--compile`` runs it: ``make_forward_backward(model)``
    over the compiled model, or under ``python_reducer`` the whole function compiled, so that
    Compiled Autograd traces the backward it calls (``torch._dynamo.config.compiled_autograd``)."""
    import torch

    compiled_autograd = uses_compiled_autograd(args)
    if args.compile and not compiled_autograd:
        model = torch.compile(model)
    forward_backward = make_forward_backward(model)
    return torch.compile(forward_backward) if compiled_autograd else forward_backward


def dynamo_counters() -> dict:
    """Rank 0's torch.compile tallies: Dynamo graphs and graph breaks, and how many backward
    graphs Compiled Autograd captured (0 unless ``--ddp-optimizer python_reducer``)."""
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "compiled_autograd_captures": int(counters["compiled_autograd"]["captures"])}
