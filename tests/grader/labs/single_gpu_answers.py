"""Lab 01's answers as the notebook's export would send them, a Reference standing for the grader's
measurement, a harness's outputs, and a GPU measurement record: for tests/grader/labs/test_single_gpu*.py.

Everything is built from chosen numbers for the sizes of a tier (the smoke sizes by default), so a
test changes one thing and knows what the judge must say.
"""
from __future__ import annotations

import dataclasses
import time

from grader.judging import Context
from grader.labs import sizes as lab_sizes
from grader.labs.single_gpu import harness, reference
from grader.labs.single_gpu.judges import FIRST_FIXES
from grader.measuring import Measured
from grader.names import RECORD_SCHEMA
from grader.sandbox import Section
from utils.device import hardware
from utils.diagnosis import diagnosis_cases
from utils.diagnosis.profile_diagnosis import diagnose
from utils.measure.record import utils_hash
from utils.train.training import RECIPES, naive_config, replace

A = "01_single_gpu"
NAIVE_TPS, SPEEDUP = 2000.0, 4.0  # chosen: the grader's naive loop and the learner's optimized one
COURSE_DROP = 0.2  # how far the course's loop takes the loss in the timed steps' place
# peaks (GiB) of the recipes the grader measures, as a CPU accounts them (the lean recipe's is also QLoRA's:
# without a GPU it falls back to 16-bit LoRA)
PEAKS = {"lean": 0.0068, "trap": 0.0091, "autocast": 0.0068, "eval_mode": 0.0098, "reentrant_checkpointing": 0.0068}
GPU_CARD = "Tesla T4"


def ctx(tier: str = "cpu", device: str = "cpu", card: str | None = None) -> Context:
    spec = hardware.spec_for_name(card) if card else None
    return Context(A, tier, lab_sizes(A, tier), tier == "cpu", device, card or "CPU", spec,
                   "float32" if tier == "cpu" else "float16")


def stopwatch(ms: float, steps: int, tokens_per_step: int) -> dict:
    total_s = ms * steps / 1e3
    return {"method": "perf_counter", "steps": steps, "median_ms": ms, "p20_ms": 0.95 * ms, "p80_ms": 1.05 * ms,
            "total_s": total_s, "tokens_per_s": tokens_per_step * steps / total_s}


def summary(label: str, seed: int = 3):
    """A profile whose numbers give ``label``, with its verdict, as profile_steps returns one."""
    s = diagnosis_cases.synthetic(label, seed)
    s.diagnosis, s.explanation, s.suggestion, s.findings = diagnose(s)
    return s


def audit_report(claimed: int, precision: str = "fp32", **changes) -> dict:
    r = {"steps": 4, "warmup_steps": 1, "precision": precision, "tokens_per_step_claimed": claimed,
         "tokens_per_step_counted": [claimed] * 5, "steps_that_updated": 4, "host_syncs": 0, "reference_host_syncs": 0,
         "fixed_loss_before": 10.9, "fixed_loss_after": 9.8, "reference_fixed_loss_before": 10.9,
         "reference_fixed_loss_after": 10.1, "first_loss_reported": 10.95, "first_loss_grader": 10.93}
    return {**r, **changes}


def finetune_row(recipe, peak: float, quant: str = "none", note: str = "") -> dict:
    w, o, g = 0.4 * peak, 0.05 * peak, 0.02 * peak
    return {"recipe": dataclasses.asdict(recipe), "quant": quant, "note": note, "peak_gib": peak, "weights_gib": w,
            "optimizer_gib": o, "gradients_gib": g, "activations_gib": peak - w - o - g, "lora_grads_ok": True,
            "peak_source": "accounted (CPU: tensor bytes, not measured)", "tokens_per_s": 1000.0}


def answers(c: Context | None = None, naive_tps: float = NAIVE_TPS, speedup: float = SPEEDUP,
            peaks: dict | None = None, label: str = "cpu-bound (no GPU in the trace)", precision: str = "fp32") -> dict:
    """Every graded cell's right answers on ``c``'s sizes, the naive loop at ``naive_tps`` tokens/s."""
    c = c or ctx()
    s, p = c.sizes, peaks or PEAKS
    tps_naive = s.naive_batch * s.seq_len
    ms = tps_naive / naive_tps * 1e3
    base = stopwatch(ms, s.steps, tps_naive)
    claimed = s.big_batch * s.seq_len
    opt_ms = claimed / (naive_tps * speedup) * 1e3
    opt = stopwatch(opt_ms, s.steps, claimed)
    opt_row = {**opt, "mfu": None, "tokens_per_step_claimed": claimed, "tokens_per_step_counted": float(claimed)}
    gpu = c.device == "cuda"
    device = {"duration_s": base["total_s"] + 0.5, "samples": 20, "mem_used_gib": {"mean": 3.0, "max": 4.0},
              "mem_total_gib": 15.0}
    device.update({"util_gpu_pct": {"mean": 90.0, "max": 99.0}} if gpu else {"util_cpu_pct": {"mean": 60.0, "max": 90.0}})
    monitor = {("gpu0" if gpu else "cpu"): device}
    prof = summary(label)
    verdict = prof.diagnosis
    lean = RECIPES["lora_bf16_lean"]
    qlean = replace(lean, quant="nf4")
    q_quant = "nf4" if gpu else "none"
    return {
        "test_baseline": {"baseline_tps": base["tokens_per_s"], "baseline": base, "naive_preset": s.model,
                          "naive_config": dataclasses.asdict(naive_config(s.naive_batch, s.seq_len)),
                          "naive_tokens_per_step": tps_naive, "monitor": monitor,
                          "monitor_s": base["total_s"] + 0.5},
        "test_diagnosis": {"profile": dataclasses.asdict(prof), "BOTTLENECK": verdict,
                           "FIRST_FIX": FIRST_FIXES[verdict][0]},
        "test_optimized": {"speedup": opt["tokens_per_s"] / base["tokens_per_s"], "optimized_tps": opt["tokens_per_s"],
                           "baseline_tps": base["tokens_per_s"], "opt_row": opt_row,
                           "audit": audit_report(claimed, precision)},
        "test_finetune": {"LEAN_LORA": dataclasses.asdict(lean), "LEAN_QLORA": dataclasses.asdict(qlean),
                          "lora_peak_gib": p["lean"], "qlora_peak_gib": p.get("qlora", p["lean"]),
                          "lora": finetune_row(lean, p["lean"]),
                          "qlora": finetune_row(qlean, p.get("qlora", p["lean"]), q_quant,
                                                "" if gpu else "4-bit QLoRA fell back to bf16 LoRA: no CUDA GPU")},
        "test_cause": {"CAUSE": "eval_mode", "trap_peak_gib": p["trap"], "lean_peak_gib": p["lean"]},
    }


def fake_peak(peaks: dict | None = None):
    """``Reference.peak`` over chosen peaks: the recipe's fields name which (any other recipe: the lean peak)."""
    p = peaks or PEAKS
    names = {reference.recipe_key(reference.trap_recipe()): "trap",
             **{reference.recipe_key(reference.single_recipe(k)): k for k in reference.SINGLE_CHANGES}}

    def peak_of(fields: dict) -> dict:
        name = names.get(reference.recipe_key(fields), "lean")
        quant = fields["quant"]
        return finetune_row(FinetuneRecipeOf(fields), p["qlora"] if quant == "nf4" and "qlora" in p else p[name], quant)
    return peak_of


def FinetuneRecipeOf(fields: dict):  # noqa: N802 - a constructor
    from utils.train.training import FinetuneRecipe

    return FinetuneRecipe(**fields)


def ref(c: Context | None = None, naive_tps: float = NAIVE_TPS, label: str = "cpu-bound (no GPU in the trace)",
        bnb: tuple = (False, "no CUDA GPU: bitsandbytes 4-bit layers run on a GPU"), peaks: dict | None = None):
    """A live Reference: the grader's naive loop at ``naive_tps`` (band +-150%, the smoke floor), its
    profile giving ``label``, the course's loss drop, the chosen peaks."""
    return reference.Reference(c or ctx(), {"naive": Measured(naive_tps, 1.5, "test")}, True, summary(label, 5),
                               COURSE_DROP, 1.0, bnb, fake_peak(peaks))


def harness_result(c: Context | None = None, naive_tps: float = NAIVE_TPS, speedup: float = SPEEDUP,
                   drop: float = 0.25, tokens_per_step: int | None = None, calls: int | None = None,
                   precision: str = "fp32") -> tuple[dict, dict]:
    """``(harness result, sections)`` of an optimized loop the grader timed at ``speedup`` x the naive loop."""
    s = (c or ctx()).sizes
    claimed = s.big_batch * s.seq_len
    steps = harness.steps_per_section(s)
    seconds = claimed * steps / (naive_tps * speedup)
    fed = claimed if tokens_per_step is None else tokens_per_step
    n = steps if calls is None else calls
    sections = {f"steps-{i}": Section(seconds, {"calls": n, "tokens": fed * n})
                for i in range(harness.SECTIONS)}
    sections["check"] = Section(0.1, {"loss_before": 8.0, "loss_after": 8.0 - drop})
    return {"audit": audit_report(claimed, precision), "tokens_per_step": claimed}, sections


def gpu_record(card: str = GPU_CARD, tier: str = "t4", **overrides) -> dict:
    """A measurement record as a T4 run writes it: every measured cell's answers for the tier's sizes,
    consistent and plausible for the card (an invented record passes: a record proves the arithmetic,
    not the run; its points are provisional)."""
    c = ctx(tier, "cuda", card)
    peaks = {"lean": 3.2, "trap": 9.0, "qlora": 2.0}
    cells = answers(c, naive_tps=3000.0, speedup=3.0, peaks=peaks, label="compute-bound", precision="fp16")
    cells.pop("test_rates", None)
    for cell, values in overrides.items():
        cells[cell] = {**cells[cell], **values}
    spec = hardware.spec_for_name(card)
    return {"schema": RECORD_SCHEMA, "assignment": A, "tier": tier, "smoke": False, "dtype": "float16",
            "fingerprint": {"kind": "gpu", "name": card, "memory_gib": spec.memory_gb * 1e9 / 2**30,
                            "compute_capability": "7.5"},
            "utils_sha256": utils_hash(), "written_unix": time.time(),
            "answers": {**cells, "test_rates": {}, "test_unseen": {}}, "missing": {}}
