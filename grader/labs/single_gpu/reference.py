"""Lab 01's references: the grader's own measurements on this machine, or a learner's record.

:func:`measure` (live) runs, in the grader's process after the notebook's kernel has gone, the course
code the notebook's cells run: the naive loop (``utils.train.training``), timed several times
(:func:`grader.measuring.timed`, its band from the spread of those runs alone) and profiled
(``utils.diagnosis.profiling``) and stepped on for as many steps as the optimized loop is timed for, for how
far a loss falls in them (:func:`course_drop`); and the peak memory of
LoRA recipes (``utils.train.training.measure_finetune``): the course's lean and heavy recipes and each
single change between them, and, on demand, whatever recipe a learner gave (:meth:`Reference.peak`).
Peaks of a fixed recipe and shape are nearly deterministic (on a CPU an account of tensor bytes,
exactly so), so they are compared within :data:`MEMORY_BAND`.

:func:`from_record` (provisional) has no measurement of its own: its comparisons become notes, and
only the record's own consistency, the datasheet and the lab's rules are checked.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from grader.labs.single_gpu import harness
from grader.measuring import Measured, timed
from utils.diagnosis import loop_audit
from utils.diagnosis.profiling import profile_steps
from utils.train.training import (
    RECIPES,
    FinetuneRecipe,
    bitsandbytes_usable,
    build_loop,
    measure_finetune,
    naive_config,
    replace,
)

MEMORY_BAND = 0.10  # peak memory of a fixed recipe and shape: +-10%
# the single changes to the lean recipe test_cause weighs (CAUSES in answers.py; fp32_upcast is not one of them)
SINGLE_CHANGES = {"autocast": {"autocast": True}, "eval_mode": {"train_mode": False},
                  "reentrant_checkpointing": {"checkpointing": "reentrant"}}


def recipe_key(fields: dict) -> tuple:
    return tuple(sorted(fields.items()))


@dataclasses.dataclass
class Reference:
    """What the judges compare against. ``measured``: quantity -> :class:`Measured` (the naive loop's
    tokens/s); ``profile``: the grader's profile of the naive loop; ``course_drop``: how far the
    course's loop took a loss in the timed steps' place; ``peaks``: recipe -> its measurement
    (:meth:`peak`); ``slowdown``: the load factor bands were widened by. From a record all are empty."""

    ctx: Any
    measured: dict
    live: bool = True
    profile: Any = None
    course_drop: float | None = None
    slowdown: float = 1.0
    bnb: tuple[bool, str] = (False, "")
    peak_of: Callable[[dict], dict] | None = None

    def against(self, key: str, value: float, name: str, unit: str) -> str:
        """The learner's ``value`` against the grader's measurement ``key``; from a record, a note."""
        if not self.live:
            return f"{name}: {value:.4g} {unit} as recorded (not re-measured)"
        return self.measured[key].against(value, name, unit)

    def peak(self, recipe: dict) -> dict:
        """``measure_finetune`` of the recipe with these fields, at the lab's fine-tune sizes, measured by
        the grader (once per try, shared between cells)."""
        if self.peak_of is None:
            raise RuntimeError("no peaks from a record")
        return self.peak_of(recipe)


def lean_recipe() -> dict:
    return dataclasses.asdict(RECIPES["lora_bf16_lean"])


def trap_recipe() -> dict:
    return dataclasses.asdict(RECIPES["lora_bf16_autocast_eval"])


def single_recipe(cause: str) -> dict:
    return dataclasses.asdict(replace(RECIPES["lora_bf16_lean"], **SINGLE_CHANGES[cause]))


def course_drop(loop, sizes, seed: int) -> float:
    """How far the course's ``loop`` (the naive loop: fp32, the naive batch) takes the fp32 loss of
    :data:`harness.EVAL_BLOCKS` blocks drawn from ``seed`` in as many steps as the optimized loop is
    timed for. The loop has run at least as many steps before as the harness runs before its timed ones."""
    batch = harness.eval_batch(loop_audit.loop_dataset(sizes.seq_len, loop.vocab_size), seed, loop.device)
    before = loop_audit.fixed_batch_loss(loop.model, batch)
    for _ in range(harness.SECTIONS * harness.steps_per_section(sizes)):
        loop.step()
    return before - loop_audit.fixed_batch_loss(loop.model, batch)


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's measurements that ``needs`` names, taken now on this machine (``cache``: those
    already taken by this try, shared between cells)."""
    s, dev, smoke = ctx.sizes, ctx.device, ctx.smoke
    out = cache
    if needs & {"naive", "profile", "course_drop"} and "naive_loop" not in out:
        out["naive_loop"] = build_loop(s.model, naive_config(s.naive_batch, s.seq_len), dev)
    if "naive" in needs and "naive" not in out:
        loop = out["naive_loop"]
        med, rel, why = timed(loop.step, slowdown=slowdown, smoke=smoke, warmup=1, max_runs=6, budget_s=1.0)
        out["naive"] = Measured(loop.tokens_per_step / med * 1e3, rel, why)
    if "profile" in needs and "profile" not in out:
        out["profile"] = profile_steps(out["naive_loop"].step, steps=3)
    if "course_drop" in needs and "course_drop" not in out:
        loop = out["naive_loop"]
        if "naive" not in out:  # the timing ran more steps than the harness runs before its timed ones
            for _ in range(loop_audit.WARMUP_STEPS + loop_audit.AUDIT_STEPS + harness.WARMUP):
                loop.step()
        out["course_drop"] = course_drop(loop, s, random.randrange(1 << 30))
    if ("finetune" in needs or "cause" in needs) and "peaks" not in out:
        out["peaks"] = {}
        out["bnb"] = bitsandbytes_usable()

    def peak_of(fields: dict) -> dict:
        key = recipe_key(fields)
        if key not in out["peaks"]:
            out["peaks"][key] = measure_finetune(s.ft_model, FinetuneRecipe(**fields), s.ft_batch, s.ft_seq_len,
                                                 steps=1, device=dev)
        return out["peaks"][key]

    if "cause" in needs:
        for fields in (lean_recipe(), trap_recipe(), *(single_recipe(c) for c in SINGLE_CHANGES)):
            peak_of(fields)
    measured = {"naive": out["naive"]} if "naive" in out else {}
    return Reference(ctx, measured, True, out.get("profile"), out.get("course_drop"), slowdown,
                     out.get("bnb", (False, "")), peak_of if "peaks" in out else None)


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own: the record's card (its datasheet row) is
    all there is to compare with (provisional)."""
    return Reference(ctx, {}, live=False)
