"""What ``benchmarks/post_train_trl.py`` adds to TRL's trainers: GRPO's reward, and the two clocks
its timings come from (a step-window clock, a timer around the policy's sampling call).

TRL's own timings of the sampling call go to experiment trackers only (``trl/extras/profiling.py``)
and carry no device sync, and its per-step ``step_time`` excludes the optimizer step
(``trl/trainer/grpo_trainer.py``), so the script times the window and the sampling itself.
"""
from __future__ import annotations

import time

from utils.measure.timing import device_sync


def char_pairs(text: str) -> set[str]:
    text = text.lower()
    return {text[i:i + 2] for i in range(len(text) - 1)}


def overlap_reward(completions: list[str], reference: list[str], **_) -> list[float]:
    """GRPO's reward, one per completion: the share of the completion's distinct character pairs
    (lower-cased) that also occur in the book's own continuation of its prompt, in [0, 1]; 0 for
    an empty completion.

    TRL calls it with the decoded ``completions`` and the dataset's other columns (``reference``)
    repeated to match, plus keyword arguments it does not need. It costs microseconds next to a
    forward pass and gives the same number for the same text, so it never shows in the timings;
    and it varies between completions even for random weights (the sampled word pieces share more
    or fewer letter pairs with English text), so the group advantages are not all zero and GRPO's
    update runs as it would on a trained model. A higher reward means closer to the book's text
    at the level of letters, not better writing: for learning one would use a task's checker or
    a reward model; this one exists to make the step's work real.
    """
    rewards = []
    for text, ref in zip(completions, reference, strict=True):
        mine = char_pairs(text)
        rewards.append(len(mine & char_pairs(ref)) / len(mine) if mine else 0.0)
    return rewards


def window_clock(warmup: int, last: int, device):
    """A TrainerCallback that stamps the wall clock, after a device sync, at the end of step
    ``warmup`` (or at train begin when there is no warm-up) and at the end of step ``last``."""
    from transformers import TrainerCallback

    class WindowClock(TrainerCallback):
        def __init__(self):
            self.stamps: dict[int, float] = {}

        def _stamp(self, step: int) -> None:
            device_sync(device)
            self.stamps[step] = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            if warmup == 0:
                self._stamp(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, last):
                self._stamp(state.global_step)

    return WindowClock()


class GenerationTimer:
    """Times every call of ``model.generate`` (GRPOTrainer's sampling call when ``use_vllm`` is off) with a device
    sync and a clock at both ends, by shadowing the method on this model instance until :meth:`remove`."""

    def __init__(self, model, device):
        self.model = model
        self.device = device
        self.calls: list[tuple[float, float, int]] = []  # (start, end, sampled token positions)
        self._generate = model.generate
        model.generate = self._timed

    def _timed(self, *args, **kwargs):
        device_sync(self.device)  # work queued before (the last optimizer step) is not generation's
        start = time.perf_counter()
        out = self._generate(*args, **kwargs)
        device_sync(self.device)
        end = time.perf_counter()
        ids = out if hasattr(out, "shape") else out.sequences
        prompt = kwargs.get("input_ids", args[0] if args else None)
        self.calls.append((start, end, ids.shape[0] * (ids.shape[1] - prompt.shape[1]) if prompt is not None else 0))
        return out

    def window(self, start: float, end: float) -> dict:
        """Calls that started after ``start`` and ended by ``end``: count, seconds inside, sampled positions."""
        calls = [c for c in self.calls if c[0] >= start and c[1] <= end]
        return {"calls": len(calls), "seconds": sum(b - a for a, b, _ in calls), "tokens": sum(n for *_, n in calls)}

    def remove(self) -> None:
        self.model.__dict__.pop("generate", None)
