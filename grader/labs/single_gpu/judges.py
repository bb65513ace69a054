"""Lab 01's judges: each graded cell's answers against the rule, the grader's measurement or a record.

Each judge is pure (``grader/judging.py``): it runs no learner code. The learner's three rate
functions and their ``diagnose`` are run by the grader on cases drawn from the grading run's secret
seed, in a sandbox where the course's own implementations are tripwires (``forbid``); ``diagnose`` is
also run, in such a sandbox, on the learner's own profile (a harness: the profile is an answer). The
learner's ``FastLoop`` is audited and timed in a sandbox of its own by ``harness.optimized``, timed
from the grader's side. The measured cells are checked for consistency first (every number from its
own raw fields, every count exact for the lab's sizes), then against the grader's own measurement
(``reference.py``): the naive loop's throughput and profile, how far the course's loop takes a loss,
and the peak memory of the learner's and the course's recipes.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from grader import labs
from grader.expect import Fail, Unusable, approx, band, cases, close, equal, in_band, not_above, spread, usable
from grader.judging import Check
from grader.labs.single_gpu import harness
from grader.labs.single_gpu.answers import CAUSES
from grader.labs.single_gpu.reference import MEMORY_BAND, lean_recipe, single_recipe, trap_recipe
from utils.diagnosis import diagnosis_cases, loop_audit
from utils.diagnosis.profile_diagnosis import ProfileSummary
from utils.diagnosis.profile_diagnosis import diagnose as course_diagnose
from utils.measure.flops import flops_per_token_from_config
from utils.model.models import preset_config
from utils.train.training import naive_config
from utils.units import GIB

ASSIGNMENT = "01_single_gpu"
RATES = ("utils.measure.flops:mfu", "utils.measure.flops:mfu_from_throughput", "utils.units:tflop_per_s",
         "utils.measure.memory:training_memory_estimate", "utils.train.training:full_finetune_estimate")
DIAGNOSIS = ("utils.diagnosis.profile_diagnosis:diagnose", "utils.diagnosis.profile_diagnosis:summarize",
             "utils.diagnosis.diagnosis_cases:synthetic", "utils.diagnosis.diagnosis_cases:synthetic_cases",
             "utils.diagnosis.diagnosis_cases:clear_of_thresholds", "utils.diagnosis.diagnosis_cases:variants",
             "utils.diagnosis.diagnosis_cases:profiled", "utils.diagnosis.profiling:profile_steps")
# The LoopConfig switch (utils.train.training) to change first for each verdict, as the notebook's table
# gives it; None where no switch of the loop addresses it.
FIRST_FIXES = {
    "data-loading-bound": ("num_workers",),
    "copy-bound": ("pin_memory", "non_blocking"),
    "host-sync-bound": ("sync_every_step",),
    "overhead-bound (launch/Python)": ("batch_size", "compile_mode", "fused_adamw"),
    "idle GPU, cause not named": (None,),
    "compute-bound": ("precision",),
    "memory-bound": ("compile_mode", "precision"),
    "cpu-bound (no GPU in the trace)": (None,),
}
DIAGNOSE_RULE = ("the rules of section 3, in order (loader wait >= 0.20; copies >= 20% of the step; no GPU in the "
                 "trace; GPU idle >= 0.30: host-sync-bound, overhead-bound or idle GPU by syncs and CPU work against "
                 "GPU busy time; else compute-bound at a matmul share >= 0.5, memory-bound below), and a first fix "
                 "from its table")
NEVER_SLOWER = 1.0  # the optimized loop's speedup over the naive loop, at least, on every tier (smoke mode too)
DROP_FRACTION = 0.25  # the timed steps take the loss at least this fraction as far as the course's loop takes it
QLORA_RATIO = 0.7  # on a GPU with bitsandbytes: 4-bit peak <= 0.7 x the lean bf16 LoRA peak
TRAP_FACTOR_GPU, TRAP_FACTOR_CPU = 2.0, 1.2  # eval-mode peak over lean peak (measured: 11.8 / 4.09 GiB on an H200, 1.34x on a CPU)
GPU_CAUSE = "eval_mode"  # what the single changes give on a GPU (the notebook's H200 table; benchmarks/RESULTS.md)
MAX_LORA_R = 1024  # a recipe the grader measures: a rank beyond this is not a LoRA recipe of this lab


# -- hidden cases, drawn from the run's secret seed ------------------------------------------------

def _log_uniform(rng, lo: float, hi: float) -> float:
    return 10 ** rng.uniform(math.log10(lo), math.log10(hi))


def tokens_cases(rng, ctx) -> list:
    return [[max(1, round(_log_uniform(rng, 1, 1e7))), _log_uniform(rng, 1e-3, 1e5)] for _ in range(10)]


def mfu_cases(rng, ctx) -> list:
    return [[_log_uniform(rng, 1.0, 1e8), _log_uniform(rng, 1e3, 1e13), _log_uniform(rng, 0.1, 5000.0)]
            for _ in range(10)]


def finetune_cases(rng, ctx) -> list:
    return [[max(1, round(_log_uniform(rng, 1, 1e12)))] for _ in range(10)]


def to_spec(summary: ProfileSummary) -> dict:
    """A summary without its verdict, as a sandbox argument (built there: ``grader/sandbox.py``)."""
    fields = dataclasses.asdict(summary.evidence())
    fields["top"] = [{"__build__": "utils.diagnosis.trace_metrics:OpStat", "kwargs": t} for t in fields["top"]]
    return {"__build__": "utils.diagnosis.profile_diagnosis:ProfileSummary", "kwargs": fields}


def from_spec(spec: dict) -> ProfileSummary:
    """The summary :func:`to_spec` encoded, rebuilt here."""
    fields = dict(spec["kwargs"])
    fields["top"] = [t["kwargs"] for t in fields["top"]]
    return ProfileSummary.from_dict(fields)


def unseen_cases(rng, ctx) -> list:
    """Two synthetic summaries of every verdict drawn from ``rng`` (``utils.diagnosis.diagnosis_cases``), then real
    profiles of small loops built to be one kind of bound, taken now on this device."""
    drawn = diagnosis_cases.synthetic_cases(rng.randrange(1 << 30), per_label=2)
    profiled = [(name, s) for name, s, _ in diagnosis_cases.profiled(ctx.device)]
    return [[to_spec(s)] for _, s in drawn + profiled]


# -- judges of the function cells --------------------------------------------------------------------

def rates(a, ref):
    return [cases(a.calls["tokens_per_second"], [t / (ms * 1e-3) for t, ms in a.inputs["tokens_per_second"]],
                  "tokens_per_second", "tokens_per_step / (step_ms / 1000)", approx(1e-6)),
            cases(a.calls["mfu"], [t * f / (p * 1e12) for t, f, p in a.inputs["mfu"]], "mfu",
                  "tokens_per_s x flops_per_token / (peak_tflops x 1e12), a fraction", approx(1e-6)),
            cases(a.calls["full_finetune_gib"], [16 * n / GIB for (n,) in a.inputs["full_finetune_gib"]],
                  "full_finetune_gib", "16 bytes per parameter, in GiB (2**30 bytes)", approx(1e-6))]


def verdict(summary: ProfileSummary) -> tuple:
    """The course's verdict on a summary's numbers and the first fixes its table allows."""
    want = course_diagnose(summary)[0]
    return want, FIRST_FIXES[want]


def _right(got, want: tuple) -> bool:
    return isinstance(got, list) and len(got) == 2 and got[0] == want[0] and got[1] in want[1]


def unseen(a, ref):
    want = [verdict(from_spec(spec)) for (spec,) in a.inputs["diagnose"]]
    return [cases(a.calls["diagnose"], want, "diagnose", DIAGNOSE_RULE, _right)]


# -- judges of the measured cells -------------------------------------------------------------------

def _timing(t: dict, name: str) -> float:
    if not t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]:
        raise Fail(f"{name}: p20 {t['p20_ms']:.4g} <= median {t['median_ms']:.4g} <= p80 {t['p80_ms']:.4g} ms does not "
                   "hold: not a timing from utils.measure.timing")
    return t["median_ms"]


def _flops_per_token(sizes) -> float:
    return flops_per_token_from_config(preset_config(sizes.model), sizes.seq_len)


def _peak(ctx, precision: str) -> float | None:
    """The datasheet ceiling of a training step in ``precision`` (fp32 may run as TF32)."""
    if ctx.device != "cuda" or ctx.spec is None:
        return None
    keys = ("fp32", "tf32") if precision == "fp32" else (precision,)
    peaks = [p for p in (ctx.spec.peak_tflops(k) for k in keys) if p]
    return max(peaks) if peaks else None


def _plausible_rate(ctx, tokens_per_s: float, precision: str, name: str) -> None:
    peak = _peak(ctx, precision)
    if peak:
        not_above(tokens_per_s * _flops_per_token(ctx.sizes) / 1e12, peak, f"{name} x FLOPs per token", "TFLOP/s",
                  f"the {ctx.spec.name} {precision} datasheet peak")


def baseline(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    want = dataclasses.asdict(naive_config(s.naive_batch, s.seq_len))
    if a.naive_preset != s.model or a.naive_config != want:
        diff = [f"{k}={a.naive_config.get(k)!r} (expected {v!r})" for k, v in want.items() if a.naive_config.get(k) != v]
        raise Fail(f"naive must be training.build_loop({s.model!r}, training.naive_config({s.naive_batch}, {s.seq_len})): "
                   "the baseline is the given naive loop; yours is " + (f"{a.naive_preset!r}" if a.naive_preset != s.model
                                                                        else "; ".join(diff[:4])))
    equal(a.naive_tokens_per_step, s.naive_batch * s.seq_len, "naive.tokens_per_step", "batch x sequence length")
    b = a.baseline
    _timing(b, "baseline")
    if b["tokens_per_s"] is None:
        raise Fail("baseline['tokens_per_s'] is None: give the Stopwatch tokens_per_step=naive.tokens_per_step")
    close(b["tokens_per_s"], a.naive_tokens_per_step * b["steps"] / b["total_s"], "baseline['tokens_per_s']",
          f"{a.naive_tokens_per_step} tokens per step x its steps over its total_s", rel=1e-3)
    close(a.baseline_tps, b["tokens_per_s"], "baseline_tps", "baseline['tokens_per_s'] (stopwatch.summary())", rel=1e-9)
    if not a.monitor:
        raise Fail("the GpuMonitor recorded nothing: run the loop inside `with GpuMonitor(interval_s=0.1) as monitor:`")
    if a.monitor_s < 0.8 * b["total_s"]:
        raise Fail(f"the monitor ran {a.monitor_s:.2f} s, shorter than the measured steps ({b['total_s']:.2f} s): start "
                   "it before the loop and stop it after")
    for dev, d in a.monitor.items():
        for key in ("util_gpu_pct", "util_mem_pct", "util_cpu_pct"):
            for stat in ("mean", "max"):
                v = (d.get(key) or {}).get(stat)
                if v is not None and not 0 <= v <= 100:
                    raise Fail(f"monitor {dev} {key} {stat} = {v:.4g}%: a utilization is between 0 and 100%")
        peak_mem, total = (d.get("mem_used_gib") or {}).get("max"), d.get("mem_total_gib")
        if peak_mem is not None and total and not 0 <= peak_mem <= total * 1.05:
            raise Fail(f"monitor {dev} mem_used_gib max = {peak_mem:.4g} GiB, but the device has {total:.4g} GiB")
    _plausible_rate(ctx, a.baseline_tps, "fp32", "baseline_tps")
    return [ref.against("naive", a.baseline_tps, "baseline_tps", "tokens/s")]


def _summary(fields: dict) -> ProfileSummary:
    try:
        return ProfileSummary.from_dict(fields)
    except (TypeError, ValueError) as exc:
        raise Fail(f"profile cannot be read as a ProfileSummary: {exc}") from None


def _numbers(s: ProfileSummary) -> str:
    """The numbers the rules read, on one line, for feedback."""
    step = s.step_time_ms or 1e-9
    gpu = (f"GPU idle {s.gpu_idle_fraction:.0%}, CPU work {s.cpu_work_ms_per_step:.3g} ms vs GPU busy "
           f"{s.gpu_busy_ms_per_step:.3g} ms, matmul share {s.matmul_share or 0:.0%}" if s.gpu_idle_fraction is not None
           else "no GPU in the trace")
    return (f"loader wait {s.loader_wait_fraction:.0%}, copies {s.h2d_ms_per_step / step:.0%} of the step, "
            f"{s.host_syncs_per_step:g} syncs/step, {gpu}")


def _pair(result, what: str) -> tuple:
    """The learner's ``diagnose`` result (a harness reply) as ``(bottleneck, first fix)``."""
    if not isinstance(result, dict) or ("ok" not in result and "error" not in result):
        raise Fail(f"the grader could not read what your diagnose returned on {what}")
    if "error" in result:
        raise Fail(f"your diagnose raised {result['error']} on {what}")
    out = result["ok"]
    if not isinstance(out, list) or len(out) != 2:
        raise Fail(f"diagnose must return (bottleneck, first fix), got {out!r:.80} on {what}")
    if type(out[0]) is not str or out[0] not in FIRST_FIXES:
        raise Fail(f"diagnose returned the bottleneck {out[0]!r:.60} on {what}: it must be one of "
                   "utils.diagnosis.profile_diagnosis.BOTTLENECKS")
    if out[1] is not None and type(out[1]) is not str:
        raise Fail(f"diagnose returned the fix {out[1]!r:.60} on {what}: a LoopConfig field name, or None")
    return out[0], out[1]


def _assert_right(got: tuple, summary: ProfileSummary, name: str) -> None:
    want, fixes = verdict(summary)
    if got[0] != want:
        raise Fail(f"{name}: your diagnose says {got[0]!r}, which the rules of section 3 do not give for these "
                   f"numbers: {_numbers(summary)}")
    if got[1] not in fixes:
        raise Fail(f"{name}: {got[0]!r} is right, but {got[1]!r} is not what the table in section 3 says to change first")


def diagnosis_params(ctx, a) -> dict:
    """The learner's profile without its verdict, and the same with one cause made unmistakable."""
    s = _summary(a.profile)
    return {"summaries": [to_spec(s)] + [to_spec(v) for _, v in diagnosis_cases.variants(s)]}


def diagnosis(a, ref):
    s = _summary(a.profile)
    want = course_diagnose(s)[0]
    if a.profile["diagnosis"] != want:
        raise Fail(f"profile.diagnosis = {a.profile['diagnosis']!r} was edited: its own numbers give {want!r}")
    results = a.harness if isinstance(a.harness, list) else []
    variants = diagnosis_cases.variants(s)
    if len(results) != 1 + len(variants):
        raise Fail("the grader could not run your diagnose on your profile")
    for r in results:
        if isinstance(r, dict) and "GroundTruthError" in str(r.get("error", "")):
            raise Fail("your diagnose called the course's own rules (utils.diagnosis.profile_diagnosis, utils.diagnosis.diagnosis_cases "
                       "or utils.diagnosis.profiling): write the rules yourself; it earns no points")
    got = _pair(results[0], "your profile")
    if (a.BOTTLENECK, a.FIRST_FIX) != got:
        raise Fail(f"BOTTLENECK, FIRST_FIX = {(a.BOTTLENECK, a.FIRST_FIX)!r}, but your diagnose returns {got!r} on the "
                   "same profile")
    _assert_right(got, s, "BOTTLENECK, FIRST_FIX")
    for (how, v), r in zip(variants, results[1:], strict=True):
        _assert_right(_pair(r, f"your profile {how}"), v, f"your diagnose on your profile {how}")
    mine = ref.profile
    if not ref.live or mine is None:
        return [f"your diagnose gives {got[0]!r} (fix {got[1]!r}) on your recorded {s.device} profile, and is right "
                "on it with one cause made unmistakable (not re-profiled here)"]
    if s.device != mine.device:
        raise Fail(f"your profile is of a {s.device} trace, but the naive loop here runs on {mine.device}: profile "
                   "naive.step as the exercise says")
    if a.BOTTLENECK != mine.diagnosis and a.BOTTLENECK not in mine.findings:
        raise Fail(f"BOTTLENECK = {a.BOTTLENECK!r}, but the grader's profile of the naive loop finds {mine.diagnosis!r} "
                   f"(also: {', '.join(mine.findings[1:]) or 'nothing else'})")
    return [f"grader's profile of the naive loop: {mine.diagnosis} ({_numbers(mine)}); yours: {a.BOTTLENECK}, fix first "
            f"{a.FIRST_FIX!r}; your diagnose is right on your profile with one cause made unmistakable"]


def _live_here(ctx) -> bool:
    """Whether ``ctx`` is this machine's (a GPU record's context is not, on a grader without a GPU)."""
    return ctx.device != "cuda" or torch.cuda.is_available()


def optimized_params(ctx, a) -> dict:
    """The harness's sizes: this machine's (a GPU record's loop is audited again here, on the CPU, untimed)."""
    live = _live_here(ctx)
    s = ctx.sizes if live else labs.load(ASSIGNMENT).sizes("cpu")
    return {"preset": s.model, "seq_len": s.seq_len, "naive_batch": s.naive_batch, "warmup": harness.WARMUP,
            "steps": harness.steps_per_section(s), "sections": harness.SECTIONS if live else 0}


def _audit(report, name: str) -> None:
    bad = loop_audit.problems(report) if isinstance(report, dict) else ["the audit report cannot be read"]
    if bad:
        raise Fail(f"{name}: " + "; ".join(bad))


def optimized(a, ref):
    ctx = ref.ctx
    sp = a.speedup
    close(sp, a.optimized_tps / a.baseline_tps, "speedup", "optimized_tps / baseline_tps", rel=1e-3)
    close(a.optimized_tps, a.opt_row["tokens_per_s"], "optimized_tps", "opt_row['tokens_per_s']", rel=1e-6)
    claimed = a.audit["tokens_per_step_claimed"]
    equal(a.opt_row["tokens_per_step_claimed"], claimed, "opt_row['tokens_per_step_claimed']",
          "the audited loop's tokens_per_step")
    if a.opt_row["tokens_per_step_counted"] != claimed:
        raise Fail(f"while audited.measure timed it, your loop fed the model {a.opt_row['tokens_per_step_counted']:.6g} "
                   f"tokens per step, not the {claimed} it claims")
    _audit(a.audit, "your own audit of FastLoop (audited.problems())")
    h = a.harness if isinstance(a.harness, dict) else {}
    if h.get("error"):
        raise Fail(str(h["error"])[:400])
    _audit(h.get("audit"), "the grader audited a fresh FastLoop")
    r = h["audit"]
    floor = max(ctx.sizes.min_speedup, NEVER_SLOWER)
    audited = (f"your loop, audited: {r['tokens_per_step_claimed']} tokens per step fed to the model, every step "
               f"updated the weights, {r['host_syncs']} host syncs in {r['steps']} steps ({r['reference_host_syncs']} "
               f"in the course's sync-free loop), fixed-batch loss {r['fixed_loss_before']:.4g} -> "
               f"{r['fixed_loss_after']:.4g}")
    _plausible_rate(ctx, a.optimized_tps, a.audit["precision"], "optimized_tps")
    if not ref.live:
        if sp < floor:
            raise Fail(f"the record's speedup {sp:.3g}x is below the {floor:g}x its tier ({ctx.tier}) expects")
        return [audited + " (audited again here, on this machine; its speed is the record's)",
                f"speedup {sp:.3g}x as recorded (not re-measured), at least {floor:g}x on the {ctx.tier} tier"]
    equal(r["tokens_per_step_claimed"], claimed, "the tokens_per_step of the FastLoop the grader built",
          "the one your notebook audited")
    timed = sorted(k for k in a.sections if k.startswith("steps-"))
    if len(timed) != harness.SECTIONS or "check" not in a.sections:
        raise Fail("the grader could not time your FastLoop in all its sections")
    steps = harness.steps_per_section(ctx.sizes)
    rates = []
    for k in timed:
        out = a.sections[k].outputs if isinstance(a.sections[k].outputs, dict) else {}
        calls, tokens = out.get("calls"), out.get("tokens")
        if calls != steps:
            raise Fail(f"the grader's timed section ran {calls!r} steps of your loop, not {steps}")
        if tokens != claimed * steps:
            per = f"{tokens / steps:.6g}" if type(tokens) in (int, float) else repr(tokens)[:20]
            raise Fail(f"while the grader timed it, your loop fed the model {per} tokens per step, not the "
                       f"{claimed} it claims")
        rates.append(claimed * steps / a.sections[k].seconds)
    check = a.sections["check"].outputs if isinstance(a.sections["check"].outputs, dict) else {}
    before, after = check.get("loss_before"), check.get("loss_after")
    if not all(type(v) in (int, float) and math.isfinite(v) for v in (before, after)):
        raise Fail(f"the loss of the text the grader drew could not be measured after the timed steps ({before!r}, "
                   f"{after!r})")
    want = DROP_FRACTION * usable(ref.course_drop, "course loop's loss drop")
    if before - after < want:
        raise Fail(f"in the {len(timed) * steps} steps the grader timed, your loop took the loss of text the grader drew "
                   f"afterwards from {before:.4g} to {after:.4g}; the course's loop takes it {ref.course_drop:.3g} lower "
                   f"in as many steps: yours must fall at least {DROP_FRACTION:g}x as far (a loop that skips its work "
                   "while timed does not train)")
    fast = sorted(rates)[len(rates) // 2]
    naive = ref.measured["naive"]
    mine = fast / usable(naive.value, "naive loop's tokens/s", "tokens/s")
    rel = max(naive.rel, band([spread(rates)], ctx.smoke, ref.slowdown))
    why = f"the grader's {len(rates)} timings of your loop spread {100 * spread(rates):.1f}%; naive loop: {naive.why}"
    line = in_band(sp, mine, rel, "speedup", "x", why)
    if mine < floor:  # on a loaded machine the two loops do not slow alike: the floor is the machine's doubt there
        raise Unusable(f"the grader measured your FastLoop at {mine:.3g}x the naive loop's tokens/s "
                       f"({fast:.4g} against {naive.value:.4g} tokens/s), below the {floor:g}x this device tier expects")
    return [audited, line, f"at least {floor:g}x on this tier; while timed your loop took the loss of text drawn "
                           f"afterwards from {before:.4g} to {after:.4g} (the course's loop: {ref.course_drop:.3g} lower)"]


def _recipe(fields: dict, name: str) -> dict:
    if fields["lora_r"] > MAX_LORA_R:
        raise Fail(f"{name}.lora_r = {fields['lora_r']}: a LoRA rank above {MAX_LORA_R} is not a recipe of this lab")
    return fields


def _breakdown(row: dict, name: str) -> None:
    parts = row["weights_gib"] + row["optimizer_gib"] + row["gradients_gib"]
    close(row["activations_gib"], max(0.0, row["peak_gib"] - parts), f"{name}['activations_gib']",
          "peak_gib minus weights, optimizer state and gradients", rel=1e-6, abs_tol=1e-6)


def finetune(a, ref):
    ctx = ref.ctx
    for name, r, q in (("LEAN_LORA", a.LEAN_LORA, "none"), ("LEAN_QLORA", a.LEAN_QLORA, "nf4")):
        if r["quant"] != q:
            raise Fail(f"{name} must be a training.FinetuneRecipe with quant={q!r}, got quant={r['quant']!r}")
        _recipe(r, name)
    for name, row, recipe, peak in (("lora", a.lora, a.LEAN_LORA, a.lora_peak_gib),
                                    ("qlora", a.qlora, a.LEAN_QLORA, a.qlora_peak_gib)):
        if row["recipe"] != recipe:
            raise Fail(f"{name} was measured with the recipe {row['recipe']}, not LEAN_{name.upper()}")
        close(peak, row["peak_gib"], f"{name}_peak_gib", f"{name}['peak_gib']", rel=1e-9)
        _breakdown(row, name)
    if ctx.device == "cuda" and ctx.spec and ctx.spec.memory_gb:
        total = ctx.spec.memory_gb * 1e9 / GIB
        for name in ("lora_peak_gib", "qlora_peak_gib"):
            not_above(getattr(a, name), total, name, "GiB", f"the {ctx.spec.name}'s memory")
    if not ref.live:
        if a.qlora["quant"] != "nf4":
            raise Fail(f"the record's QLoRA ran unquantized ({a.qlora['note'] or 'quant none'}): on a GPU it must be 4-bit")
        if a.qlora_peak_gib > QLORA_RATIO * a.lora_peak_gib:
            raise Fail(f"the record's QLoRA peak {a.qlora_peak_gib:.3g} GiB is above {QLORA_RATIO} x LoRA's "
                       f"{a.lora_peak_gib:.3g} GiB")
        return [f"LoRA {a.lora_peak_gib:.3g} GiB, QLoRA {a.qlora_peak_gib:.3g} GiB as recorded (not re-measured)"]
    mine_lo, mine_q, lean = ref.peak(a.LEAN_LORA), ref.peak(a.LEAN_QLORA), ref.peak(lean_recipe())
    for name, m in (("LEAN_LORA", mine_lo), ("LEAN_QLORA", mine_q)):
        if not m["lora_grads_ok"]:
            raise Fail(f"{name}: some LoRA adapters got no gradient, so the recipe does not train them")
    why = "a fixed recipe's peak"
    notes = [in_band(a.lora_peak_gib, mine_lo["peak_gib"], MEMORY_BAND, "lora_peak_gib", "GiB", why),
             in_band(a.qlora_peak_gib, mine_q["peak_gib"], MEMORY_BAND, "qlora_peak_gib", "GiB", why)]
    if mine_lo["peak_gib"] > lean["peak_gib"] * (1 + MEMORY_BAND):
        raise Fail(f"LEAN_LORA peaks at {mine_lo['peak_gib']:.3g} GiB, more than the course's lean recipe's "
                   f"{lean['peak_gib']:.3g} GiB: it is not the lean one")
    ok, why_not = ref.bnb
    if ok:
        if mine_q["quant"] != "nf4":
            raise Fail(f"LEAN_QLORA ran unquantized here ({mine_q['note']}): it must be 4-bit")
        if mine_q["peak_gib"] > QLORA_RATIO * lean["peak_gib"]:
            raise Fail(f"QLoRA peaks at {mine_q['peak_gib']:.3g} GiB, above {QLORA_RATIO} x the lean bf16 LoRA "
                       f"({lean['peak_gib']:.3g} GiB)")
        notes.append(f"QLoRA {mine_q['peak_gib']:.3g} GiB vs lean LoRA {lean['peak_gib']:.3g} GiB "
                     f"({mine_q['peak_gib'] / lean['peak_gib']:.2f}x, at most {QLORA_RATIO})")
    else:
        notes.append(f"QLoRA not checked against the {QLORA_RATIO}x goal here ({why_not}); peaks re-measured "
                     f"({mine_lo['peak_source']})")
    return notes


def cause(a, ref):
    ctx = ref.ctx
    if not ref.live:
        factor = TRAP_FACTOR_GPU
        if a.trap_peak_gib < factor * a.lean_peak_gib:
            raise Fail(f"the record's heavy recipe peaks at {a.trap_peak_gib:.3g} GiB, less than {factor:g}x its lean "
                       f"recipe's {a.lean_peak_gib:.3g} GiB: on a GPU the heavy recipe is at least that much heavier")
        if a.CAUSE != GPU_CAUSE:
            raise Fail(f"CAUSE = {a.CAUSE!r}, but of the single changes to the lean recipe only {GPU_CAUSE!r} reaches "
                       f"{factor:g}x its peak on a GPU (the course's measurements; not re-measured here)")
        return [f"lean {a.lean_peak_gib:.3g} GiB, heavy {a.trap_peak_gib:.3g} GiB as recorded (not re-measured)"]
    factor = TRAP_FACTOR_GPU if ctx.device == "cuda" else TRAP_FACTOR_CPU
    lean, trap = ref.peak(lean_recipe())["peak_gib"], ref.peak(trap_recipe())["peak_gib"]
    why = "a fixed recipe's peak"
    notes = [in_band(a.lean_peak_gib, lean, MEMORY_BAND, "lean_peak_gib", "GiB", why),
             in_band(a.trap_peak_gib, trap, MEMORY_BAND, "trap_peak_gib", "GiB", why)]
    peaks = {c: ref.peak(single_recipe(c))["peak_gib"] for c in CAUSES if c != "fp32_upcast"}
    culprits = [c for c, v in peaks.items() if v >= factor * lean]
    notes.append(f"lean {lean:.3g} GiB; one change at a time: " + ", ".join(f"{k} {v:.3g}" for k, v in peaks.items()))
    if not culprits:
        raise Unusable(f"none of the single changes reached {factor:g}x the lean peak ({lean:.3g} GiB) here")
    if a.CAUSE not in culprits:
        raise Fail(f"CAUSE = {a.CAUSE!r}, but of the single changes only {', '.join(culprits)} reach{'es' if len(culprits) == 1 else ''} "
                   f"{factor:g}x the lean peak")
    return notes


SANDBOX_SIZES = ("from grader import labs as _labs\nfrom utils import training as _training\n"
                 "SIZES = _labs.sizes('01_single_gpu')\n"
                 "PRECISION = _training.best_precision()")  # what the notebook's locked cells compute for FastLoop

CHECKS = [
    Check("test_rates", rates, calls={"tokens_per_second": tokens_cases, "mfu": mfu_cases,
                                      "full_finetune_gib": finetune_cases}, forbid=RATES),
    Check("test_baseline", baseline, measures=("naive",)),
    Check("test_diagnosis", diagnosis, measures=("profile",), forbid=DIAGNOSIS,
          harness="grader.labs.single_gpu.harness:diagnose_each", harness_params=diagnosis_params,
          imports=("grader.labs.single_gpu.harness",), timeout_s=120.0),
    Check("test_unseen", unseen, calls={"diagnose": unseen_cases}, forbid=DIAGNOSIS),
    Check("test_optimized", optimized, measures=("naive", "course_drop"),
          harness="grader.labs.single_gpu.harness:optimized", harness_params=optimized_params, setup=SANDBOX_SIZES,
          imports=("grader.labs.single_gpu.harness",), timeout_s=900.0),
    Check("test_finetune", finetune, measures=("finetune",)),
    Check("test_cause", cause, measures=("cause",)),
]
