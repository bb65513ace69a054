"""Lab 00's references: the grader's own measurements on this machine, or a learner's record.

:func:`measure` (live) times, in the grader's process after the notebook's kernel has gone, the same
work the notebook's locked cells set up: the big matmul, the copy and ``x + 1``, the thin matmul,
the tiny-op loop, the training step of the lab's model at the full and the small batch, every shape
of the sweep, and counts the bytes one training step moves. Each is timed several times
(:func:`grader.measuring.timed`); the band a learner's number must fall in comes from the spread of
those runs alone. :func:`from_record` (provisional) has no measurement of its own: its
comparisons say so, and only the datasheet and the record's own consistency are checked.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from grader.measuring import Measured, timed
from utils.measure import matmul_sweep
from utils.measure.step_traffic import count_bytes
from utils.model.models import build_model, get_tokenizer, token_batches
from utils.units import gb_per_s, tflop_per_s

CPU_TFLOPS_CAP = 50.0  # estimate: no CPU socket comes near 50 fp32 TFLOP/s, so a CPU figure above it is invented
_DETERMINISTIC: dict = {}  # counts that do not change between measurements (the step's bytes), per setting


@dataclasses.dataclass
class Reference:
    """What the judges compare against. ``measured``: quantity -> :class:`Measured` (empty from a
    record); ``step_bytes``: the bytes the grader counted for one training step (None from a record)."""

    ctx: Any
    measured: dict
    step_bytes: int | None = None
    sm_count: int | None = None
    live: bool = True

    def against(self, key: str, value: float, name: str, unit: str) -> str:
        """The learner's ``value`` against the grader's measurement ``key``; from a record, a note."""
        if not self.live:
            return f"{name}: {value:.4g} {unit} as recorded (not re-measured)"
        return self.measured[key].against(value, name, unit)

    def peak_tflops(self, dtype: str) -> tuple[float | None, str]:
        """The ceiling no matmul rate may pass: the card's datasheet peak, or an estimate on a CPU."""
        spec = self.ctx.spec
        if self.ctx.device == "cuda":
            return (spec.peak_tflops(dtype) if spec else None), f"the {spec.name if spec else 'GPU'} datasheet peak"
        return CPU_TFLOPS_CAP, "what any CPU can do (an estimate)"


def _model_step(sizes, device: str):
    """The locked ``train_setup`` cell's model, optimizer, a batch and step, built here."""
    torch.manual_seed(0)
    model = build_model(sizes.model, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    batches = token_batches(get_tokenizer(None), None, sizes.batch_size, sizes.seq_len, device=device,
                            vocab_size=model.config.vocab_size)

    def train_step(x, y):
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    x, y = next(batches)
    return train_step, x, y


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's measurements that ``needs`` names, taken now on this machine (``cache``: those
    already taken by this try, shared between cells)."""
    s, dev, smoke = ctx.sizes, ctx.device, ctx.smoke
    dtype = getattr(torch, ctx.dtype)
    out = cache
    n = s.matmul_n
    if "matmul" in needs and "matmul" not in out:
        a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
        med, rel, why = timed(lambda: a @ b, slowdown=slowdown, smoke=smoke)
        out["matmul"] = Measured(tflop_per_s(2 * n**3, med), rel, why)
    if "memory" in needs and "copy" not in out:
        x = torch.randn(s.elementwise_numel, device=dev)
        o = torch.empty_like(x)
        med, rel, why = timed(lambda: o.copy_(x), slowdown=slowdown, smoke=smoke)
        out["copy"] = Measured(gb_per_s(8 * s.elementwise_numel, med), rel, why)
        med, rel, why = timed(lambda: torch.add(x, 1.0, out=o), slowdown=slowdown, smoke=smoke)
        out["ew_gbs"] = Measured(gb_per_s(8 * s.elementwise_numel, med), rel, why)
        out["ew_tflops"] = Measured(tflop_per_s(s.elementwise_numel, med), rel, why)
    if "thin" in needs and "thin" not in out:
        k = max(1, n // 32)
        a, b = torch.randn(n, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        med, rel, why = timed(lambda: a @ b, slowdown=slowdown, smoke=smoke)
        out["thin"] = Measured(tflop_per_s(2 * n * k * n, med), rel, why)
    if "tiny" in needs and "tiny" not in out:
        def loop(t, k=s.tiny_ops):
            for _ in range(k):
                t = t + 1
            return t

        t1 = torch.zeros(1, device=dev)
        # launch costs vary with the host: on a GPU at least +-100%
        med, rel, why = timed(loop, t1, slowdown=slowdown, smoke=smoke, floor=None if smoke else 1.0)
        out["tiny"] = Measured(tflop_per_s(s.tiny_ops, med), rel, why)
    if "train" in needs and "tokens_per_s" not in out:
        step, x, y = _model_step(s, dev)
        small = max(1, s.batch_size // 4)
        full_ms, rel_f, why = timed(step, x, y, slowdown=slowdown, smoke=smoke, warmup=1, max_runs=10, budget_s=3.0)
        small_ms, rel_s, _ = timed(step, x[:small], y[:small], slowdown=slowdown, smoke=smoke, warmup=1, max_runs=10,
                                    budget_s=3.0)
        out["tokens_per_s"] = Measured(s.batch_size * s.seq_len / full_ms * 1e3, rel_f, why)
        out["batch_scaling"] = Measured((s.batch_size / full_ms) / (small / small_ms), max(rel_f, rel_s), why)
    if "sweep" in needs and "sweep" not in out:
        sms = matmul_sweep.sm_count()
        rows = {}
        for label, (m, nn, k) in matmul_sweep.sweep_shapes(sms, ctx.tier).items():
            a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, nn, device=dev, dtype=dtype)
            med, rel, why = timed(lambda a=a, b=b: a @ b, slowdown=slowdown, smoke=smoke)
            rows[label] = Measured(tflop_per_s(2 * m * nn * k, med), rel, why)
            del a, b
        out["sweep"] = rows
    step_bytes = None
    if "step_bytes" in needs:
        key = (ctx.tier, dev, s)
        if key not in _DETERMINISTIC:
            step, x, y = _model_step(s, dev)
            step(x, y)  # the notebook counts after training: the optimizer's state exists, as here
            _DETERMINISTIC[key] = int(count_bytes(step, x, y).bytes)
        step_bytes = _DETERMINISTIC[key]
    measured = {k: v for k, v in out.items() if k != "sweep"}
    for label, m in out.get("sweep", {}).items():
        measured[f"sweep:{label}"] = m
    return Reference(ctx, measured, step_bytes, matmul_sweep.sm_count(), live=True)


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own: the record's card (its datasheet row and
    SM count) is all there is to compare with (provisional)."""
    sms = matmul_sweep.SM_COUNTS.get(ctx.spec.name) if ctx.spec else None
    return Reference(ctx, {}, None, sms, live=False)
