"""A training loop someone else wrote, audited: what it really does per step, and how fast.

Lab 01's optimized loop is the learner's own code: a class built from ``(model, dataset,
device)`` with a ``tokens_per_step`` and a ``step()`` that runs one optimizer step and returns
that step's loss. :func:`audit` builds it on a fresh model (seeded, so its weights start as the
course's naive loop's do) and the course's data, and watches it run:

- **tokens**: a forward pre-hook on the model counts the tokens of every forward call
  (``input_ids.numel()``); each step must feed the model exactly the tokens it claims. The hook
  runs outside ``torch.compile``'s graphs (``torch.compiler.disable``), so a compiled loop is
  counted too, and a forward it never sees counts nothing: a loop that hides work loses, never
  gains.
- **updates**: a sample of every parameter before and after each step; a step that leaves
  them all unchanged did not step the optimizer.
- **host syncs**, in the steps after the first (which may compile): on a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronizing
  CUDA call warn, and the warnings are counted (PyTorch's own detector: "CUDA semantics",
  torch docs); on a CPU, where nothing waits on a device, the host reads that would be syncs on
  a GPU (``.item()``, ``float()``, ``.tolist()``, ``.cpu()``...) that the loop's own code makes
  are counted through a ``TorchFunctionMode``. The course's own sync-free loop at the same precision is counted the
  same way: what the model or a GradScaler needs is not held against the learner.
- **training**: the loss of a fixed batch (fp32, eval mode, no grad) before and after the audited
  steps, against the same for the course's loop (``utils.train.training``, same seed, same data); and
  the first watched step's reported loss against the grader's own fp32 loss of the batches that
  step fed the model (with the weights it saw), within a tolerance for the precision (:data:`LOSS_REL_TOL`).

:func:`problems` turns an audit's numbers into the list of what is wrong, a pure function, so a
measurement record is judged by the same rules (``grader/labs/single_gpu/judges.py``).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import sysconfig
import warnings
from typing import Any

from utils.measure.flops import flops_per_token_from_config
from utils.model.models import TokenBlocks, get_tokenizer, preset_config
from utils.train.training import LoopConfig, RepeatedBlocks, best_precision, build_loop, measure_loop, naive_config
from utils.validate import positive_int

AUDIT_STEPS = 4  # steps watched; enough for a loop that logs every few steps to show it
WARMUP_STEPS = 1  # steps run first and not watched for syncs: a compiled loop compiles in its first call
EVAL_BLOCKS = 4  # the fixed batch whose loss shows training: the data's first blocks
TRAIN_FRACTION = 0.5  # the loop's drop in fixed-batch loss must be at least half the course loop's
MAX_EXTRA_SYNCS_PER_STEP = 0.5  # a host sync every step is 1 per step; logging every k >= 2 steps is 1/k
LOSS_REL_TOL = {"fp32": 0.01, "bf16": 0.03, "fp16": 0.03}  # reported first loss vs the grader's fp32 loss
HOST_READS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
SAMPLE_PER_PARAM = 256  # elements of each parameter compared before and after a step


def loop_dataset(seq_len: int, vocab_size: int, length: int = 100_000):
    """The course's training data as a map-style dataset of ``(input_ids, labels)`` blocks of
    ``seq_len`` tokens: the naive loop's (``utils.train.training.make_loader``), long enough that an
    epoch never ends during a lab."""
    return RepeatedBlocks(TokenBlocks(get_tokenizer(None), None, seq_len, vocab_size=vocab_size), length)


def fresh_model(preset: str, seq_len: int, device: Any = None, seed: int = 0):
    """The model the course's naive loop starts from, built the way it builds it
    (``utils.train.training.TrainLoop``, the same seed), in train mode, without a KV cache."""
    return build_loop(preset, naive_config(1, seq_len), device, seed).model


class TokenCounter:
    """Counts the tokens of every forward call of ``model``; while ``reference`` is on, also the
    grader's fp32 loss of each of those batches (train mode, as the step saw them, no grad)."""

    def __init__(self, model):
        import torch

        self.model, self.tokens, self.paused, self.reference, self.losses = model, 0, False, False, []
        self._inside = False
        self.handle = model.register_forward_pre_hook(torch.compiler.disable(self._hook), with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if self.paused or self._inside:
            return None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return None
        self.tokens += int(ids.numel())
        if self.reference:
            import torch

            labels = kwargs.get("labels")
            self._inside = True
            try:
                with torch.no_grad(), torch.autocast(ids.device.type, enabled=False):
                    out = module(input_ids=ids, labels=ids if labels is None else labels)
                self.losses.append(out.loss.detach())  # read after the step: no sync inside it
            finally:
                self._inside = False
        return None

    def remove(self) -> None:
        self.handle.remove()


class HostSyncs:
    """Counts host syncs inside ``with``: CUDA's sync debug mode on a GPU, host reads on a CPU."""

    def __init__(self, device):
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.count = 0

    def __enter__(self):
        import torch

        if self.cuda:
            self._warn = warnings.catch_warnings(record=True)
            self._seen = self._warn.__enter__()
            warnings.simplefilter("always")
            self._mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._reads = _HostReads()
            self._reads.__enter__()
        return self

    def __exit__(self, *exc):
        import torch

        if self.cuda:
            torch.cuda.set_sync_debug_mode(self._mode)
            self.count += sum("synchroniz" in str(w.message) for w in self._seen)
            self._warn.__exit__(*exc)
        else:
            self._reads.__exit__(*exc)
            self.count += self._reads.count
        return False


def _library_dirs() -> tuple[str, ...]:
    """Where library code lives: the Python installation, its packages, and the ``utils`` package."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} | {os.path.dirname(os.path.dirname(__file__))}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _host_reads_mode():
    """A ``TorchFunctionMode`` counting host reads (:data:`HOST_READS`) that the loop's own code
    makes: the caller (past torch's tensor-method shims) is outside every library. torch's
    optimizers read CPU step counters, which are no sync on a GPU either."""
    from torch.overrides import TorchFunctionMode

    libraries = _library_dirs()
    torch_dir = os.path.dirname(os.path.realpath(__import__("torch").__file__))
    shims = tuple(os.path.join(torch_dir, f)
                  for f in ("_tensor.py", "overrides.py", "_tensor_str.py"))

    @functools.lru_cache(maxsize=4096)
    def where(filename: str) -> tuple[bool, bool]:
        path = os.path.realpath(filename)
        return path in shims, path.startswith(libraries)

    class HostReads(TorchFunctionMode):
        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in HOST_READS:
                frame = sys._getframe(1)
                while frame is not None and where(frame.f_code.co_filename)[0]:
                    frame = frame.f_back
                self.count += frame is not None and not where(frame.f_code.co_filename)[1]
            return func(*args, **(kwargs or {}))

    return HostReads


def _HostReads():  # noqa: N802 (a class made on first use: torch is imported lazily here)
    return _host_reads_mode()()


def _sample(model):
    import torch

    return torch.cat([p.detach().reshape(-1)[:SAMPLE_PER_PARAM].float() for p in model.parameters()]).clone()


def fixed_batch_loss(model, batch) -> float:
    """fp32 loss of ``batch`` in eval mode, no grad (the model's mode is put back)."""
    import torch

    was = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(batch.device.type, enabled=False):
            return float(model(input_ids=batch, labels=batch).loss)
    finally:
        model.train(was)


def _as_loss(value) -> float:
    try:
        return float(value.detach().float().mean()) if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return math.nan


class Audit:
    """The audited loop (``loop``), its numbers (``report``, JSON-ready) and its token counter,
    still attached, so that :meth:`measure` and a grader's timing count the tokens too."""

    def __init__(self, loop, report: dict, counter: TokenCounter, flops_per_token: float, precision: str):
        self.loop, self.report, self.counter = loop, report, counter
        self.flops_per_token, self.precision = flops_per_token, precision
        self.device = counter.model.device
        self.tokens_per_step, self.calls = report["tokens_per_step_claimed"], 0
        self.config = _Precision(precision)  # what utils.train.training.measure_loop reads for MFU

    def step(self):
        """One step of the audited loop, counted (calls and tokens)."""
        self.calls += 1
        return self.loop.step()

    def tokens_per_call(self, since: tuple[int, int]) -> float:
        """Tokens the model saw per step since ``since`` (``(tokens, calls)`` from :meth:`mark`)."""
        calls = self.calls - since[1]
        return (self.counter.tokens - since[0]) / calls if calls else math.nan

    def mark(self) -> tuple[int, int]:
        return self.counter.tokens, self.calls

    def problems(self) -> list[str]:
        return problems(self.report)

    def measure(self, steps: int, warmup_steps: int = 3, monitor: bool = True) -> dict:
        """``utils.train.training.measure_loop`` on the audited loop, plus the tokens it really fed
        the model per measured step (``tokens_per_step_counted``)."""
        mark = self.mark()
        row = measure_loop(self, steps, warmup_steps=warmup_steps, monitor=monitor)
        row["tokens_per_step_claimed"] = self.tokens_per_step
        row["tokens_per_step_counted"] = self.tokens_per_call(mark)
        return row


class _Precision:
    def __init__(self, precision: str):
        self.precision = precision


def audit(make_loop, preset: str, seq_len: int, reference_batch: int, steps: int = AUDIT_STEPS,
          device: Any = None, seed: int = 0) -> Audit:
    """Build ``make_loop(model, dataset, device)`` on a fresh seeded model and the course's data,
    run ``steps`` steps under watch, and the course's own sync-free loop (``utils.train.training``,
    ``reference_batch`` x ``seq_len``, the device's precision) beside it from the same weights.
    The learner's exceptions propagate: the caller reports them."""
    import torch

    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    precision = best_precision(dev)
    cfg = preset_config(preset)
    model = fresh_model(preset, seq_len, dev, seed)
    data = loop_dataset(seq_len, cfg.vocab_size)
    fixed = torch.stack([data[i][0] for i in range(EVAL_BLOCKS)]).to(dev)
    counter = TokenCounter(model)
    loop = make_loop(model, data, dev)
    claimed = getattr(loop, "tokens_per_step", None)
    positive_int("your loop's tokens_per_step", claimed)
    if not callable(getattr(loop, "step", None)):
        raise ValueError("your loop has no step() method")
    counter.paused = True
    before = fixed_batch_loss(model, fixed)
    counter.paused = False
    counted, updated, reported = [], 0, None
    syncs = HostSyncs(dev)
    for i in range(WARMUP_STEPS + steps):  # the first call compiles, if the loop compiles: not watched for syncs
        watched = i >= WARMUP_STEPS
        counter.reference = i == WARMUP_STEPS
        w0, n0 = _sample(model), counter.tokens
        with syncs if watched else contextlib.nullcontext():
            out = loop.step()
        counter.reference = False
        counted.append(counter.tokens - n0)
        if watched:
            updated += int(not torch.equal(w0, _sample(model)))
        if i == WARMUP_STEPS:
            reported = _as_loss(out)
    counter.paused = True
    after = fixed_batch_loss(model, fixed)
    counter.paused = False
    cuda = dev.type == "cuda"  # the course's loop without a sync: pinned memory, asynchronous copies, fused AdamW
    ref_loop = build_loop(preset, LoopConfig(batch_size=reference_batch, seq_len=seq_len, precision=precision,
                                             pin_memory=cuda, non_blocking=cuda, sync_every_step=False,
                                             fused_adamw=cuda), dev, seed)
    ref_before = fixed_batch_loss(ref_loop.model, fixed)
    ref_syncs = HostSyncs(dev)
    for i in range(WARMUP_STEPS + steps):
        with ref_syncs if i >= WARMUP_STEPS else contextlib.nullcontext():
            ref_loop.step()
    ref_after = fixed_batch_loss(ref_loop.model, fixed)
    del ref_loop
    grader_first = sum(float(x) for x in counter.losses) / len(counter.losses) if counter.losses else math.nan
    report = {"steps": steps, "warmup_steps": WARMUP_STEPS, "precision": precision, "tokens_per_step_claimed": int(claimed),
              "tokens_per_step_counted": counted, "steps_that_updated": updated,
              "host_syncs": syncs.count, "reference_host_syncs": ref_syncs.count,
              "fixed_loss_before": before, "fixed_loss_after": after,
              "reference_fixed_loss_before": ref_before, "reference_fixed_loss_after": ref_after,
              "first_loss_reported": reported, "first_loss_grader": grader_first}
    return Audit(loop, report, counter, flops_per_token_from_config(cfg, seq_len), precision)


def problems(report: dict) -> list[str]:
    """What is wrong with an audited loop, one line each (empty: nothing). A pure function of
    :func:`audit`'s ``report``, so a recorded audit is judged by the same rules."""
    try:
        steps, warmup = int(report["steps"]), int(report["warmup_steps"])
        claimed = report["tokens_per_step_claimed"]
        counted = [int(c) for c in report["tokens_per_step_counted"]]
        updated, syncs, ref_syncs = (int(report[k]) for k in ("steps_that_updated", "host_syncs", "reference_host_syncs"))
        before, after, ref_before, ref_after, first, grader_first = (
            float(report[k]) for k in ("fixed_loss_before", "fixed_loss_after", "reference_fixed_loss_before",
                                       "reference_fixed_loss_after", "first_loss_reported", "first_loss_grader"))
        tol = LOSS_REL_TOL[report["precision"]]
    except (KeyError, TypeError, ValueError) as exc:
        return [f"the audit report cannot be read ({type(exc).__name__}: {exc})"]
    out = []
    if steps < 1 or len(counted) != warmup + steps:
        out.append(f"the audit counted tokens in {len(counted)} steps, not {warmup + steps}")
    wrong = [(i, c) for i, c in enumerate(counted) if c != claimed]
    if wrong:
        i, c = wrong[0]
        out.append(f"step {i} fed the model {c} tokens, but the loop claims tokens_per_step = {claimed} "
                   f"({len(wrong)} of {len(counted)} steps differ)")
    if updated < steps - (report["precision"] == "fp16"):  # a GradScaler skips a step whose gradients overflowed
        out.append(f"{steps - updated} of {steps} steps left every weight unchanged: each step must step the optimizer")
    extra = (syncs - ref_syncs) / max(steps, 1)
    if extra > MAX_EXTRA_SYNCS_PER_STEP:
        out.append(f"{syncs} host syncs in {steps} steps, {ref_syncs} in the course's sync-free loop: "
                   f"{extra:.2g} more per step (at most {MAX_EXTRA_SYNCS_PER_STEP}; read the loss every few steps)")
    drop, ref_drop = before - after, ref_before - ref_after
    if not (math.isfinite(drop) and drop > 0 and drop >= TRAIN_FRACTION * ref_drop):
        out.append(f"the fixed batch's loss went {before:.4g} -> {after:.4g} in {steps} steps; the course's loop "
                   f"took it {ref_before:.4g} -> {ref_after:.4g}: yours must fall at least {TRAIN_FRACTION:g}x as much")
    if not (math.isfinite(first) and math.isfinite(grader_first) and abs(first - grader_first) <= tol * abs(grader_first)):
        out.append(f"step {warmup} returned the loss {first:.5g}, but the batches it fed the model have the loss "
                   f"{grader_first:.5g} (fp32, by the grader; {tol:.0%} allowed in {report['precision']})")
    return out
