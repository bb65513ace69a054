"""Phase 1's measurement record: what ``01_single_gpu`` writes, and grading from it.

``save_record`` writes the notebook's headline numbers (baseline and optimized throughput,
the speedup, LoRA and QLoRA peak memory with their breakdown) with the machine's fingerprint
and the ``utils`` hash (``utils.record``). On a grading machine without a GPU the measured
cells of :mod:`grader.phase1` grade a GPU record instead of re-measuring (docs/grading.md):
the record is this course's and untouched (:func:`grader.checks.record_spec`), the learner's
numbers are the recorded ones, and the recorded ones meet the lab's goals. An invented but
consistent record passes: the record proves the arithmetic, not the run.
"""
from __future__ import annotations

from pathlib import Path

from grader import checks  # grader.phase(1) rebinds it to a fresh copy

PHASE = "01_single_gpu"
QLORA_RATIO = 0.7  # graded on a GPU with bitsandbytes: 4-bit peak <= 0.7 x the lean bf16 LoRA peak
_NEEDED = ("baseline_tps", "optimized_tps", "speedup", "lora_peak_gib", "qlora_peak_gib", "OPTIMIZED", "lora", "qlora")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's headline numbers (read by name from its ``globals()``) beside it;
    returns the path written."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    rec = Record.new()
    rec.add("baseline_tokens_per_s", ns["baseline_tps"], "tokens/s", "utils.timing.Stopwatch", None)
    rec.add("optimized_tokens_per_s", ns["optimized_tps"], "tokens/s", "utils.training.measure_loop", None,
            config=ns["OPTIMIZED"].to_dict())
    rec.add("speedup", ns["speedup"], "x", "optimized / naive tokens/s", None)
    for key in ("lora", "qlora"):
        r = ns[key]
        rec.add(f"{key}_peak_gib", ns[f"{key}_peak_gib"], "GiB", r["peak_source"], None,
                **{k: r[k] for k in ("weights_gib", "optimizer_gib", "activations_gib", "quant", "tokens_per_s")})
    return rec.save(path or checks.record_path(PHASE, smoke_mode()))


# -- grading from the record ----------------------------------------------------------------

def _recorded(name: str) -> float:
    """The recorded value of ``name``, after checking the record is a GPU's and this course's."""
    rec = checks.submitted_record()
    checks.record_spec(rec)
    return checks.recorded(rec, name)[0]


def baseline(baseline_tps) -> None:
    v = checks.assert_positive(_recorded("baseline_tokens_per_s"), "record baseline_tokens_per_s")
    checks.assert_close(baseline_tps, v, "baseline_tps vs the record", rel=1e-6)


def optimized(speedup, min_speedup: float) -> None:
    sp = _recorded("speedup")
    checks.assert_close(speedup, sp, "speedup vs the record", rel=1e-6)
    if sp < min_speedup:
        raise AssertionError(f"the record's speedup {sp:.3g}x is below {min_speedup}x")


def finetune(lora_peak_gib, qlora_peak_gib) -> None:
    lo, q = _recorded("lora_peak_gib"), _recorded("qlora_peak_gib")
    checks.assert_close(lora_peak_gib, lo, "lora_peak_gib vs the record", rel=1e-6)
    checks.assert_close(qlora_peak_gib, q, "qlora_peak_gib vs the record", rel=1e-6)
    if q > QLORA_RATIO * lo:
        raise AssertionError(f"the record's QLoRA peak {q:.3g} GiB is above {QLORA_RATIO} x LoRA's {lo:.3g}")
