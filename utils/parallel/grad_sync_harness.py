"""One rank of the gradient-synchronization run: the learner's three versions against DDP.

Every rank builds the same model (same seed, fp32, dropout off so that every version computes the
same gradients) five times: for no synchronization at all (``none``, the compute-only step),
PyTorch's ``DistributedDataParallel`` (``ddp``, with ``bucket_cap_mb`` set to the learner's
bucket) and the learner's ``each``, ``bucketed`` and ``overlapped`` versions
(:mod:`utils.parallel.grad_sync`). Each step, every version starts from DDP's current weights, runs
forward and backward on this rank's own batch (random tokens, a different batch on each rank and
step) and synchronizes; the versions take turns in a rotating order so that none always runs
first. Timed: forward, backward and synchronization, between device synchronizations (the step
a CUDA GPU really took); the optimizer step (SGD on DDP's copy) is outside the timing.

After every step each version's gradients are compared with DDP's on every rank
(:data:`utils.parallel.grad_sync.GRAD_RTOL`), and the harness counts the learner's ``all_reduce`` calls
(a wrapper around ``torch.distributed.all_reduce`` installed before their module is imported):
how many, how many bytes, and how many started during the backward. Launched by
``benchmarks/grad_sync.py`` under ``torchrun``; rank 0 returns the result.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import statistics
import time
from pathlib import Path

from utils.model.models import build_model
from utils.parallel.grad_sync import GRAD_RTOL, LEARNER_VERSIONS, NAMES, VERSIONS


class LearnerError(Exception):
    """The learner's code raised, or could not be imported: a one-line reason, theirs to fix."""


class _Counter:
    """Counts ``torch.distributed.all_reduce`` calls while a learner version runs."""

    def __init__(self):
        self.active, self.in_backward, self.calls = False, False, []

    def install(self, dist) -> None:
        original = dist.all_reduce

        def all_reduce(tensor, *args, **kwargs):
            if self.active:
                self.calls.append((tensor.numel() * tensor.element_size(), self.in_backward))
            return original(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce

    def stats(self) -> dict:
        sizes = [b for b, _ in self.calls]
        return {"calls": len(sizes), "bytes": sum(sizes), "max_call_bytes": max(sizes, default=0),
                "in_backward": sum(1 for _, back in self.calls if back),
                "bytes_in_backward": sum(b for b, back in self.calls if back)}


def load_answer(path: str | Path):
    """The learner's module, imported from the file :func:`utils.parallel.grad_sync.write_answer_module` wrote."""
    spec = importlib.util.spec_from_file_location("grad_sync_answer", str(path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise LearnerError(f"your sync cell, run as a module in the launched process, raised {type(exc).__name__}: "
                           f"{exc} (it may use only its own imports and definitions)") from None
    missing = [n for n in NAMES.values() if not callable(getattr(module, n, None))]
    if missing:
        raise LearnerError(f"your sync cell does not define {', '.join(missing)}")
    return module


def _learner(what: str, fn, *args):
    try:
        return fn(*args)
    except LearnerError:
        raise
    except Exception as exc:
        raise LearnerError(f"your {what} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
            from None


def _rel_errors(grads: dict, reference) -> tuple[float, str]:
    """The worst parameter of ``grads`` (name -> gradient) against ``reference``'s gradients:
    max |g - g_ref| over max |g_ref|, and its name."""
    worst, name = 0.0, ""
    for n, p in reference.named_parameters():
        r = p.grad
        if r is None:
            continue
        g = grads.get(n)
        if g is None or g.shape != r.shape:
            return math.inf, n
        err = (g.float() - r.float()).abs().max().item() / max(r.abs().max().item(), 1e-30)
        if not math.isfinite(err):
            return math.inf, n
        if err > worst:
            worst, name = err, n
    return worst, name


def _summary(ms: list[float]) -> dict:
    q = statistics.quantiles(ms, n=5) if len(ms) >= 2 else [ms[0]] * 4
    return {"median_ms": statistics.median(ms), "p20_ms": q[0], "p80_ms": q[3], "runs": len(ms)}


def run_rank(answer_path: str | Path, cfg: dict, device) -> dict | None:
    """This rank's part of the run (the process group is up); rank 0 returns the gathered result."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    counter = _Counter()
    counter.install(dist)
    answer = load_answer(answer_path)
    rank, world = dist.get_rank(), dist.get_world_size()
    on_gpu = device.type == "cuda"

    def sync_device():
        if on_gpu:
            torch.cuda.synchronize(device)

    torch.manual_seed(cfg["seed"])
    base = build_model(cfg["preset"], device=device).eval()  # eval: no dropout, the same gradients everywhere
    base.config.use_cache = False
    versions = list(VERSIONS) + ["bucketed_check"] * (cfg.get("check_bucket_mb") is not None)
    models = {v: copy.deepcopy(base) for v in versions}
    del base
    ddp = DistributedDataParallel(models["ddp"], device_ids=[device.index] if on_gpu else None,
                                  bucket_cap_mb=cfg["bucket_mb"])
    overlap = _learner("OverlappedSync(model)", answer.OverlappedSync, models["overlapped"])
    finish = getattr(overlap, "finish", None)
    if not callable(finish):
        raise LearnerError("your OverlappedSync has no finish() method")
    syncs = {"each": ("sync_each(model)", lambda m: answer.sync_each(m)),
             "bucketed": ("sync_bucketed(model, bucket_mb)", lambda m: answer.sync_bucketed(m, cfg["bucket_mb"])),
             "bucketed_check": ("sync_bucketed(model, bucket_mb)",
                                lambda m: answer.sync_bucketed(m, cfg.get("check_bucket_mb"))),
             "overlapped": ("OverlappedSync.finish()", lambda m: finish())}
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    vocab = models["ddp"].config.vocab_size
    grads = {v: {"worst_rel_err": 0.0, "worst_param": "", "steps": 0} for v in versions if v not in ("none", "ddp")}
    calls: dict = {}
    snapshots: dict = {}
    times: dict = {v: [] for v in VERSIONS}
    for step in range(cfg["warmup"] + cfg["steps"]):
        g = torch.Generator().manual_seed(cfg["seed"] * 7919 + step * 131 + rank)
        x = torch.randint(0, vocab, (cfg["batch"], cfg["seq"]), generator=g).to(device)
        order = versions[step % len(versions):] + versions[:step % len(versions)]
        for v in order:
            m = models[v]
            if v != "ddp":
                with torch.no_grad():
                    for p, q in zip(m.parameters(), models["ddp"].parameters(), strict=True):
                        p.copy_(q)
            m.zero_grad(set_to_none=True)
            learner = v in syncs
            counter.calls, counter.active = [], learner
            sync_device()
            t0 = time.perf_counter()
            loss = (ddp if v == "ddp" else m)(input_ids=x, labels=x).loss
            counter.in_backward = True
            if v == "overlapped":
                _learner("OverlappedSync gradient hook", loss.backward)
            else:
                loss.backward()
            counter.in_backward = False
            if learner:
                what, fn = syncs[v]
                _learner(what, fn, m)
            sync_device()
            ms = (time.perf_counter() - t0) * 1e3
            counter.active = False
            if learner:
                calls[v] = counter.stats()
                # the gradients as the sync left them when it returned: a finish() that does not wait is caught
                snapshots[v] = {n: q.grad.detach().clone() for n, q in m.named_parameters() if q.grad is not None}
            if step >= cfg["warmup"] and v in times:
                times[v].append(ms)
        for v in grads:
            err, name = _rel_errors(snapshots[v], models["ddp"])
            grads[v]["steps"] += 1
            if err > grads[v]["worst_rel_err"] or not grads[v]["worst_param"]:
                grads[v].update(worst_rel_err=err, worst_param=name)
        opt.step()
    params = [p for p in models["ddp"].parameters() if p.grad is not None]
    mine = {"rank": rank, "times": {v: _summary(times[v]) for v in VERSIONS}, "grads": grads, "calls": calls}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    versions_out = {}
    for v in VERSIONS:  # the slowest rank's median: a step ends when every rank has its gradients
        slowest = max(everyone, key=lambda r: r["times"][v]["median_ms"])
        versions_out[v] = {**slowest["times"][v], "per_rank_median_ms": [r["times"][v]["median_ms"] for r in everyone]}
    grads_out = {}
    for v in grads:
        worst = max(everyone, key=lambda r: r["grads"][v]["worst_rel_err"])
        e = worst["grads"][v]
        grads_out[v] = {"match": e["worst_rel_err"] <= GRAD_RTOL, "worst_rel_err": e["worst_rel_err"],
                        "worst_param": e["worst_param"], "rank": worst["rank"], "steps_checked": e["steps"]}
    return {"world_size": world, "grad_tensors": len(params),
            "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in params),
            "largest_grad_bytes": max(p.grad.numel() * p.grad.element_size() for p in params),
            "versions": versions_out, "grads": grads_out, "calls": everyone[0]["calls"],
            "learner_versions": list(LEARNER_VERSIONS)}
