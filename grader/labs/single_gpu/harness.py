"""Lab 01's harnesses: course code that runs inside a sandbox, on the learner's definitions.

Everything here runs in the learner's process (``grader/sandbox.py``), so what it returns is a claim:
the judges (``judges.py``) check it against rules and the grader's own measurements, never trust it.

- :func:`optimized`: the learner's ``FastLoop``, audited by ``utils.diagnosis.loop_audit`` on a fresh seeded
  model (the tokens each step feeds the model, weight updates, host syncs, the loss falling, the
  loss it reports), then warmed up and timed from the grader's side in :data:`SECTIONS` sections of
  :func:`steps_per_section` steps each (``clock.go`` / ``clock.done``; the judge times go to done,
  the harness syncs the device before done). After the timed steps a last section's seed, drawn by
  the judge only then, picks the text the loss is measured on: the fp32 loss of those blocks with
  the weights the timed steps started from and with the weights they left. A loop that skips its
  work while timed leaves the weights, so that loss, where they were.
- :func:`diagnose_each`: the learner's ``diagnose`` on summaries the grader built (their profile, and
  the same with one cause made unmistakable), in a sandbox where the course's rules are tripwires.
"""
from __future__ import annotations

import random

SECTIONS = 3  # timed sections of the optimized loop: the grader's spread of its throughput
WARMUP = 2  # steps after the audit and before the timed ones (the audit's first step already compiled)
EVAL_BLOCKS = 8  # blocks of the course's text the loss before and after the timed steps is measured on


def steps_per_section(sizes) -> int:
    """Steps in one timed section: half the lab's measured steps, at least two."""
    return max(2, sizes.steps // 2)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def eval_blocks(seed: int, n_blocks: int) -> list[int]:
    """The blocks of the course's text the loss is measured on, drawn from ``seed`` (distinct, any of them)."""
    return random.Random(seed).sample(range(n_blocks), min(EVAL_BLOCKS, n_blocks))


def eval_batch(data, seed: int, device):
    """``EVAL_BLOCKS`` blocks of ``data`` (``utils.diagnosis.loop_audit.loop_dataset``) drawn from ``seed``, on ``device``."""
    import torch

    return torch.stack([data[i][0] for i in eval_blocks(seed, len(data.blocks))]).to(device)


def optimized(ns: dict, params: dict, clock) -> dict:
    """Audit the learner's ``FastLoop`` and time it (see the module docstring). ``params``: ``preset``,
    ``seq_len``, ``naive_batch``, ``steps`` (per section), ``sections`` (0: audit only), ``warmup``; ``loop``:
    the class's name, ``FastLoop`` unless given."""
    from utils.diagnosis import loop_audit
    from utils.measure.timing import device_sync
    from utils.model.models import preset_config

    name = params.get("loop", "FastLoop")
    make = ns.get(name)
    if make is None or not callable(make):
        return {"error": f"{name} is not defined by your definitions (a class {name}(model, dataset, device))"}
    try:
        audited = loop_audit.audit(make, params["preset"], params["seq_len"], params["naive_batch"])
    except Exception as exc:  # the learner's loop raised while audited
        return {"error": f"your FastLoop raised {_first_line(exc)} while the grader audited it"}
    out = {"audit": audited.report, "tokens_per_step": audited.tokens_per_step}
    if not params["sections"]:
        return out
    model, counter = audited.counter.model, audited.counter
    try:
        for _ in range(params["warmup"]):
            audited.step()
        device_sync(audited.device)
        counter.paused = True
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}  # the weights the timed steps start from
        counter.paused = False
    except Exception as exc:
        return {**out, "error": f"your FastLoop raised {_first_line(exc)} in the steps before the grader timed it"}
    for i in range(params["sections"]):  # the learner's exceptions here reach the judge as the sandbox's error
        label = f"steps-{i}"
        clock.go(label)
        tokens, calls = audited.mark()
        for _ in range(params["steps"]):
            audited.step()
        device_sync(audited.device)
        clock.done(label, {"calls": audited.calls - calls, "tokens": counter.tokens - tokens})
    seed = clock.go("check")
    counter.paused = True
    data = loop_audit.loop_dataset(params["seq_len"], preset_config(params["preset"]).vocab_size)
    batch = eval_batch(data, seed, audited.device)
    after = loop_audit.fixed_batch_loss(model, batch)
    model.load_state_dict(start)
    before = loop_audit.fixed_batch_loss(model, batch)
    clock.done("check", {"loss_before": before, "loss_after": after})
    return out


def diagnose_each(ns: dict, params: dict, clock) -> list[dict]:
    """The learner's ``diagnose`` on each of ``params["summaries"]`` (built in the sandbox from their
    fields): per summary ``{"ok": its return value}`` or ``{"error": the first line of what it raised}``."""
    fn = ns.get("diagnose")
    if fn is None or not callable(fn):
        return [{"error": "diagnose is not defined by your definitions"}] * len(params["summaries"])
    out = []
    for summary in params["summaries"]:
        try:
            out.append({"ok": fn(summary)})
        except BaseException as exc:  # noqa: BLE001 - the learner's function: anything it raises is its answer
            out.append({"error": _first_line(exc)})
    return out
