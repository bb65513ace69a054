"""The checks the hidden tests of phase 1 (``01_single_gpu``) run.

Each ``check_*`` grades one measured cell by re-measuring in the same kernel session with the
grader's own code: the naive loop is rebuilt, the learner's own optimized loop (a class they
write) is audited afresh (:mod:`utils.loop_audit`) and both are timed here (``utils.timing``
through :mod:`grader.checks`), the profiler is
run again on the naive loop, and LoRA/QLoRA peak memory is measured again. The learner's own
``diagnose`` is run on profiles it has not seen, drawn or taken here (``utils.diagnosis_cases``),
and may not call the course's diagnosis to get its answers. Sizes come from
``utils.env``, not from the notebook's variables. Thresholds are ratios measured in the same
run, so they hold on a T4 and an H200 alike; the minimum speedup is per device tier
(``Phase1Sizes.min_speedup``: a tensor-core GPU gains more from mixed precision than a T4,
a CPU in smoke mode nothing) and never below 1x: the optimized loop may not be slower than the naive one.

Hidden tests get this module from ``grader.phase(1)`` (fresh copies of it, ``checks.py`` and
``phase1_records.py``: ``grader/__init__.py``). With no GPU here and a GPU record submitted,
the measured cells are graded from the record's internal consistency and plausibility
(:mod:`grader.phase1_records`).
"""
from __future__ import annotations

from grader import checks, remeasure  # grader.phase(1) rebinds these to fresh copies: use them at call time only
from grader import phase1_records as records
from utils.units import GIB

PHASE = "01_single_gpu"
MEMORY_BAND = 0.10  # peak memory is near-deterministic for a fixed recipe and shape: +-10%
TRAP_FACTOR_GPU, TRAP_FACTOR_CPU = 2.0, 1.2  # eval-mode peak over lean peak (measured: 11.8 / 4.09 GiB on an H200, 1.34x on a CPU)
CAUSES = ("autocast", "eval_mode", "reentrant_checkpointing", "fp32_upcast")
ATTEMPTS = 3


def sizes():
    from utils.env import phase_sizes

    return phase_sizes(PHASE)


def _begin(what: str) -> str:
    return checks.begin(what, from_record="checked for consistency and plausibility in your GPU measurement record")


# -- 1. pure functions ------------------------------------------------------------------------

def check_rates(tokens_per_second, mfu, full_finetune_gib) -> None:
    with checks.quiet():
        cases = [(tokens_per_second(t, ms), t / ms * 1e3, f"tokens_per_second({t}, {ms})")
                 for t, ms in ((4096, 100.0), (32768, 85.9), (1, 1e-3))]
        cases += [(mfu(tps, f, p), tps * f / (p * 1e12), f"mfu({tps}, {f}, {p})")
                  for tps, f, p in ((381765.0, 8.57e8, 989.0), (41841.0, 8.57e8, 67.0), (1.0, 1.0, 1.0))]
        cases += [(full_finetune_gib(n), 16 * n / GIB, f"full_finetune_gib({n})") for n in (1_100_048_384, 124_439_808, 1)]
    for got, want, name in cases:
        checks.assert_close(got, want, name, rel=1e-6)


# -- 2. the naive baseline ----------------------------------------------------------------------

def _naive_config():
    from utils.training import naive_config

    s = sizes()
    return naive_config(s.naive_batch, s.seq_len)


def _time_loop(loop):
    return checks.timed(loop.step, warmup=2, max_runs=10, budget_s=4.0)


def check_baseline(baseline_tps, baseline, naive, monitor) -> None:
    """The learner's Stopwatch throughput of the naive loop within a band of the grader's timing."""
    if _begin("the naive baseline") == checks.RECORD:
        return records.baseline()
    checks.assert_untampered()
    from utils.training import TrainLoop, build_loop

    s = sizes()
    if not isinstance(naive, TrainLoop) or naive.config != _naive_config() or naive.preset != s.model:
        raise AssertionError(f"naive must be training.build_loop({s.model!r}, training.naive_config("
                             f"{s.naive_batch}, {s.seq_len})): the baseline is the given naive loop")
    tps = checks.assert_positive(baseline_tps, "baseline_tps")
    if not isinstance(baseline, dict) or "tokens_per_s" not in baseline:
        raise AssertionError("baseline must be the dict from stopwatch.summary()")
    checks.assert_close(tps, checks.as_number(baseline["tokens_per_s"], "baseline['tokens_per_s']"),
                        "baseline_tps vs stopwatch.summary()")
    if not monitor.summary():
        raise AssertionError("the GpuMonitor recorded nothing: run the loop inside `with GpuMonitor(...)`")
    with checks.quiet():
        loop = build_loop(s.model, _naive_config())

    def compare():
        ref = _time_loop(loop)
        ref_tps = loop.tokens_per_step / ref.median_ms * 1e3
        rel = checks.band(ref)
        checks.assert_in_band(tps, ref_tps, rel, "baseline_tps", "tokens/s")
        checks.say(f"  naive loop: grader {ref_tps:.4g} tokens/s, yours {tps:.4g} (band +-{100 * rel:.0f}%)")

    remeasure.agree(compare, ATTEMPTS)


# -- 3. the diagnosis the learner writes ----------------------------------------------------------

def check_diagnosis(diagnose, bottleneck, first_fix, profile) -> None:
    """The learner's profile is genuine; BOTTLENECK and FIRST_FIX are what their ``diagnose``
    returns on its numbers (the verdict left out) and what the course's rules give; their
    ``diagnose`` is right on the same profile with one cause made unmistakable
    (``utils.diagnosis_cases.variants``: a constant answer fails here) and on the grader's own
    profile of the naive loop, and their bottleneck is one the grader's profile finds."""
    if _begin("the profiler diagnosis") == checks.RECORD:
        return records.diagnosis(diagnose)
    checks.assert_untampered(records.CASE_MODULES)
    checks.assert_constants_unchanged(("utils.profile_diagnosis",))
    from utils.profile_diagnosis import ProfileSummary
    from utils.profiling import profile_steps
    from utils.training import build_loop

    if not isinstance(profile, ProfileSummary):
        raise AssertionError("profile must be the ProfileSummary that utils.profiling.profile_steps returned")
    d = records.rules_verdict(profile)
    if profile.diagnosis != d:
        raise AssertionError(f"profile.diagnosis = {profile.diagnosis!r} was edited: its own numbers give {d!r}")
    yours = records.their_verdict(diagnose, profile.evidence(), "your profile")
    records.assert_right(yours, (bottleneck, first_fix), profile, "BOTTLENECK, FIRST_FIX")
    records.assert_variants(diagnose, profile, "your profile")
    with checks.quiet():
        loop = build_loop(sizes().model, _naive_config())
        mine = profile_steps(loop.step, steps=3, warmup=1, wait=1)
    on_mine = records.their_verdict(diagnose, mine.evidence(), "the grader's profile")
    records.assert_right(on_mine, None, mine, "your diagnose on the grader's profile of the naive loop")
    if bottleneck != mine.diagnosis and bottleneck not in mine.findings:
        raise AssertionError(f"BOTTLENECK = {bottleneck!r}, but the grader's profile of the naive loop finds "
                             f"{mine.diagnosis!r} (also: {', '.join(mine.findings[1:]) or 'nothing else'})")
    checks.say(f"  grader's profile: {mine.diagnosis} (GPU idle {mine.gpu_idle_fraction}, "
               f"host syncs {mine.host_syncs_per_step:g}/step); yours: {bottleneck}, fix first {first_fix!r}")


def check_unseen(diagnose) -> None:
    """The learner's ``diagnose`` on loops it has not seen: synthetic summaries drawn now, two
    of every verdict, and real profiles of small loops built to be one kind of bound, taken now
    on this device (``utils.diagnosis_cases``). Every one must be right."""
    import random

    checks.say(f"{checks.LIVE} on {checks.device_name()}: your diagnose on summaries of loops it has not seen, "
               "profiled or drawn by the grader in this run")
    checks.assert_untampered(records.CASE_MODULES)
    checks.assert_constants_unchanged(("utils.profile_diagnosis",))
    from utils import diagnosis_cases

    seed = random.SystemRandom().randrange(1 << 30)
    with checks.quiet():
        cases = [(name, s, records.rules_verdict(s)) for name, s in diagnosis_cases.synthetic_cases(seed)]
        cases += diagnosis_cases.profiled()
    wrong = []
    for name, summary, want in cases:
        try:
            got = records.their_verdict(diagnose, summary, name)
        except AssertionError as exc:
            if "course's own" in str(exc):
                raise
            wrong.append(f"{name}: {exc}")
            continue
        if got[0] != want or got[1] not in records.FIRST_FIXES[want]:
            wrong.append(f"{name}: yours {got}, {records.numbers(summary)}")
    right = len(cases) - len(wrong)
    checks.say(f"  {right} of {len(cases)} right (synthetic cases drawn with seed {seed})")
    if wrong:
        raise AssertionError(f"your diagnose got {right} of {len(cases)} unseen loops right; wrong: " + " | ".join(wrong[:4])
                             + (f" and {len(wrong) - 4} more" if len(wrong) > 4 else ""))


# -- 4. the optimized loop ------------------------------------------------------------------------

def audit_loop(fast_loop):
    """A fresh audit of the learner's ``FastLoop`` (``utils.loop_audit``): its exceptions become one line."""
    from utils.loop_audit import audit

    s = sizes()
    if not isinstance(fast_loop, type) and not callable(fast_loop):
        raise AssertionError(f"FastLoop must be your class, got {type(fast_loop).__name__}")
    try:
        with checks.quiet():
            audited = audit(fast_loop, s.model, s.seq_len, s.naive_batch)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"your FastLoop raised {type(exc).__name__}: {str(exc)[:200]}") from None
    bad = audited.problems()
    if bad:
        raise AssertionError("the grader audited a fresh FastLoop: " + "; ".join(bad))
    r = audited.report
    checks.say(f"  your loop, audited: {r['tokens_per_step_claimed']} tokens per step fed to the model, every step "
               f"updated the weights, {r['host_syncs']} host syncs in {r['steps']} steps "
               f"({r['reference_host_syncs']} in the course's sync-free loop), fixed-batch loss "
               f"{r['fixed_loss_before']:.4g} -> {r['fixed_loss_after']:.4g}")
    return audited


def check_optimized(speedup, optimized_tps, baseline_tps, fast_loop, opt_row) -> None:
    """The learner's ``FastLoop``, audited afresh here (``utils.loop_audit``: the tokens each step
    feeds the model, weights updated every step, host syncs, the loss falls, the reported loss is
    the real one), then timed against the naive loop in the same run: at least the tier's speedup
    and never slower than the naive loop, and the learner's reported speedup within the band of
    the grader's. With a GPU record the audit still runs here (the notebook's ``FastLoop`` is in
    this kernel), and the speed is the record's (:func:`grader.phase1_records.optimized`)."""
    mode = _begin("your optimized loop against the naive one")
    checks.assert_untampered(records.LOOP_MODULES)
    checks.assert_constants_unchanged(records.LOOP_MODULES)
    sp = checks.assert_positive(speedup, "speedup")
    checks.assert_close(sp, checks.as_number(optimized_tps, "optimized_tps") / checks.as_number(baseline_tps, "baseline_tps"),
                        "speedup (optimized_tps / baseline_tps)", rel=1e-3)
    if mode == checks.RECORD:
        records.optimized()
        checks.say(f"{checks.LIVE} on {checks.device_name()}: your FastLoop audited again here (its speed is the record's)")
        audit_loop(fast_loop)
        return
    audited = audit_loop(fast_loop)
    from utils.training import build_loop

    if not isinstance(opt_row, dict) or "tokens_per_s" not in opt_row:
        raise AssertionError("opt_row must be the dict audited.measure(...) returned")
    checks.assert_close(optimized_tps, checks.as_number(opt_row["tokens_per_s"], "opt_row['tokens_per_s']"),
                        "optimized_tps vs opt_row['tokens_per_s']")
    s = sizes()
    floor = max(s.min_speedup, records.NEVER_SLOWER)
    claimed = audited.tokens_per_step
    with checks.quiet():
        naive = build_loop(s.model, _naive_config())

    def compare():
        mark = audited.mark()
        ref_n, ref_f = _time_loop(naive), _time_loop(audited)
        fed = audited.tokens_per_call(mark)
        if fed != claimed:
            raise AssertionError(f"while the grader timed it, your loop fed the model {fed:.6g} tokens per step, "
                                 f"not the {claimed} it claims")
        ref_sp = (fed / ref_f.median_ms) / (naive.tokens_per_step / ref_n.median_ms)
        rel = checks.band(ref_n, ref_f)
        checks.say(f"  speedup: grader {ref_sp:.3g}x, yours {sp:.3g}x (band +-{100 * rel:.0f}%{checks.widened()}, "
                   f"at least {floor:g}x on this tier)")
        checks.assert_in_band(sp, ref_sp, rel, "speedup", "x")
        if ref_sp < floor:  # on a loaded machine the two loops do not slow alike: the floor is the machine's doubt there
            miss = checks.Unusable if checks.under_load() else AssertionError
            raise miss(f"the grader measured your FastLoop at {ref_sp:.3g}x the naive loop's tokens/s, below "
                       f"the {floor:g}x this device tier expects")

    remeasure.agree(compare, ATTEMPTS)


# -- 5. LoRA and QLoRA memory ---------------------------------------------------------------------

def _peak(recipe) -> dict:
    from utils.training import measure_finetune

    s = sizes()
    with checks.quiet():
        return measure_finetune(s.ft_model, recipe, s.ft_batch, s.ft_seq_len, steps=1)


def check_finetune(lora_recipe, qlora_recipe, lora_peak_gib, qlora_peak_gib) -> None:
    """Both recipes train every adapter, their peaks re-measured within 10%, the bf16 recipe is
    as lean as the course's, and (GPU with bitsandbytes) QLoRA <= 0.7x of it."""
    if _begin("LoRA and QLoRA peak memory") == checks.RECORD:
        return records.finetune()
    checks.assert_untampered()
    from utils.training import RECIPES, FinetuneRecipe, bitsandbytes_usable

    for name, r, q in (("LEAN_LORA", lora_recipe, "none"), ("LEAN_QLORA", qlora_recipe, "nf4")):
        if not isinstance(r, FinetuneRecipe) or r.quant != q:
            raise AssertionError(f"{name} must be a training.FinetuneRecipe with quant={q!r}")
    lo_ref, q_ref, lean = _peak(lora_recipe), _peak(qlora_recipe), _peak(RECIPES["lora_bf16_lean"])
    for name, ref in (("LEAN_LORA", lo_ref), ("LEAN_QLORA", q_ref)):
        if not ref["lora_grads_ok"]:
            raise AssertionError(f"{name}: some LoRA adapters got no gradient, so the recipe does not train them")
    checks.assert_in_band(lora_peak_gib, lo_ref["peak_gib"], MEMORY_BAND, "lora_peak_gib", "GiB")
    checks.assert_in_band(qlora_peak_gib, q_ref["peak_gib"], MEMORY_BAND, "qlora_peak_gib", "GiB")
    if lo_ref["peak_gib"] > lean["peak_gib"] * (1 + MEMORY_BAND):
        raise AssertionError(f"LEAN_LORA peaks at {lo_ref['peak_gib']:.3g} GiB, more than the lean recipe's "
                             f"{lean['peak_gib']:.3g} GiB: it is not the lean one")
    ok, why = bitsandbytes_usable()
    if ok:
        if q_ref["peak_gib"] > records.QLORA_RATIO * lean["peak_gib"]:
            raise AssertionError(f"QLoRA peaks at {q_ref['peak_gib']:.3g} GiB, above {records.QLORA_RATIO} x the lean bf16 "
                                 f"LoRA ({lean['peak_gib']:.3g} GiB)")
        checks.say(f"  QLoRA {q_ref['peak_gib']:.3g} GiB vs lean LoRA {lean['peak_gib']:.3g} GiB "
                   f"({q_ref['peak_gib'] / lean['peak_gib']:.2f}x, at most {records.QLORA_RATIO})")
    else:
        checks.say(f"  QLoRA not checked against the {records.QLORA_RATIO}x goal here ({why}); peaks re-measured "
                   f"{lo_ref['peak_gib']:.3g} / {q_ref['peak_gib']:.3g} GiB ({lo_ref['peak_source']})")


def check_cause(cause, trap_peak_gib, lean_peak_gib) -> None:
    """The 11.8 GiB recipe: the cause named is the one change that reproduces the large peak.

    Always live, a GPU record or not: the record holds no peaks of the single changes, and the
    notebook's peaks and CAUSE were measured in this kernel, on this machine (on a grader
    without a GPU, the CPU, where eval mode is still the one change that reaches the factor)."""
    checks.say(f"{checks.LIVE} on {checks.device_name()}: what makes a LoRA recipe 3x heavier, "
               "re-measured by the grader in this run")
    checks.assert_untampered()
    from dataclasses import replace

    import torch

    from utils.training import RECIPES

    checks.as_label(cause, CAUSES, "CAUSE")
    lean = _peak(RECIPES["lora_bf16_lean"])["peak_gib"]
    trap = _peak(RECIPES["lora_bf16_autocast_eval"])["peak_gib"]
    checks.assert_in_band(lean_peak_gib, lean, MEMORY_BAND, "lean_peak_gib", "GiB")
    checks.assert_in_band(trap_peak_gib, trap, MEMORY_BAND, "trap_peak_gib", "GiB")
    factor = TRAP_FACTOR_GPU if torch.cuda.is_available() else TRAP_FACTOR_CPU
    single = {"autocast": replace(RECIPES["lora_bf16_lean"], autocast=True),
              "eval_mode": replace(RECIPES["lora_bf16_lean"], train_mode=False),
              "reentrant_checkpointing": replace(RECIPES["lora_bf16_lean"], checkpointing="reentrant")}
    peaks = {k: _peak(r)["peak_gib"] for k, r in single.items()}
    culprits = [k for k, v in peaks.items() if v >= factor * lean]
    checks.say(f"  lean {lean:.3g} GiB; one change at a time: " + ", ".join(f"{k} {v:.3g}" for k, v in peaks.items()))
    if cause not in culprits:
        raise AssertionError(f"CAUSE = {cause!r}, but of the single changes only {culprits or 'none'} reach "
                             f"{factor}x the lean peak")
