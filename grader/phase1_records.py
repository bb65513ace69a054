"""Phase 1's measurement record: what ``01_single_gpu`` writes, and grading from it.

``save_record`` writes the notebook's headline numbers (baseline and optimized throughput,
the speedup, the audit of the learner's optimized loop (``utils.loop_audit``), LoRA and QLoRA peak memory with their breakdown, the profile of the naive loop
with the learner's diagnosis of it) with the machine's fingerprint and the ``utils`` hash
(``utils.record``). On a grading machine without a GPU the measured
cells of :mod:`grader.phase1` grade a GPU record instead of re-measuring (docs/grading.md):
the record is this course's and untouched (:func:`grader.checks.record_spec`), the learner's
numbers are the recorded ones, and the recorded ones meet the lab's goals. An invented but
consistent record passes: the record proves the arithmetic, not the run. The diagnosis is the
exception: the learner's ``diagnose`` runs again here, on the recorded profile's numbers.

The helpers that judge a learner's ``diagnose`` (:func:`their_verdict`, :func:`assert_right`)
live here, so that the live checks and the record's share them.
"""
from __future__ import annotations

from pathlib import Path

from grader import checks  # grader.phase(1) rebinds it to a fresh copy

PHASE = "01_single_gpu"
QLORA_RATIO = 0.7  # graded on a GPU with bitsandbytes: 4-bit peak <= 0.7 x the lean bf16 LoRA peak
NEVER_SLOWER = 1.0  # the optimized loop's speedup over the naive loop, at least, on every tier (smoke mode too)
_NEEDED = ("baseline_tps", "optimized_tps", "speedup", "lora_peak_gib", "qlora_peak_gib", "audited", "opt_row", "lora",
           "qlora", "profile", "BOTTLENECK", "FIRST_FIX")
CASE_MODULES = ("utils.diagnosis_cases",)  # the unseen loops, tamper-checked beside grader.tamper.UTILS_MODULES
LOOP_MODULES = ("utils.loop_audit",)  # the audit of the learner's loop, likewise
# The LoopConfig switch (utils.training) to change first for each verdict, as the notebook's table
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


# -- judging a diagnosis ---------------------------------------------------------------------

def rules_verdict(summary) -> str:
    """The course's verdict on a summary's numbers (``utils.profile_diagnosis.diagnose``)."""
    from utils.profile_diagnosis import diagnose

    return diagnose(summary)[0]


def numbers(s) -> str:
    """The numbers the rules read, on one line, for feedback."""
    step = s.step_time_ms or 1e-9
    gpu = (f"GPU idle {s.gpu_idle_fraction:.0%}, CPU work {s.cpu_work_ms_per_step:.3g} ms vs GPU busy "
           f"{s.gpu_busy_ms_per_step:.3g} ms, matmul share {s.matmul_share or 0:.0%}" if s.gpu_idle_fraction is not None
           else "no GPU in the trace")
    return (f"loader wait {s.loader_wait_fraction:.0%}, copies {s.h2d_ms_per_step / step:.0%} of the step, "
            f"{s.host_syncs_per_step:g} syncs/step, {gpu}")


def their_verdict(diagnose, summary, what: str) -> tuple:
    """``diagnose(summary)`` as ``(bottleneck, first fix)``, one of the verdicts and a switch
    name or None. A profile hook watches the call: reaching ``utils.profile_diagnosis.diagnose``
    or ``summarize``, ``utils.profiling`` or the grader's cases is copying, not diagnosing."""
    import os
    import sys

    from utils import diagnosis_cases, profile_diagnosis, profiling

    if not callable(diagnose):
        raise AssertionError(f"diagnose must be a function of one ProfileSummary, got {type(diagnose).__name__}")
    tool = {profile_diagnosis.__file__, os.path.realpath(profile_diagnosis.__file__)}
    banned = {f for m in (diagnosis_cases, profiling) for f in (m.__file__, os.path.realpath(m.__file__))}
    seen: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename in banned or (code.co_filename in tool and code.co_name in ("diagnose", "summarize")):
                seen.append(f"{os.path.basename(code.co_filename)[:-3]}.{code.co_name}")

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        out = checks.call(diagnose, summary, name="diagnose", show_args=False)
    finally:
        sys.setprofile(previous)
    if seen:
        raise AssertionError(f"your diagnose calls the course's own utils.{seen[0]} (on {what}): write the rules yourself")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise AssertionError(f"diagnose must return (bottleneck, first fix), got {out!r:.80} on {what}")
    if type(out[0]) is not str or out[0] not in profile_diagnosis.BOTTLENECKS:
        raise AssertionError(f"diagnose returned the bottleneck {out[0]!r:.60} on {what}: it must be one of "
                             "utils.profile_diagnosis.BOTTLENECKS")
    if out[1] is not None and type(out[1]) is not str:
        raise AssertionError(f"diagnose returned the fix {out[1]!r:.60} on {what}: a LoopConfig field name, or None")
    return out[0], out[1]


def assert_right(got: tuple, claimed, summary, name: str) -> None:
    """``got`` (the learner's verdict on ``summary``) is the rules' verdict with a first fix the
    table allows; ``claimed`` (what the notebook says, if anything) is ``got``."""
    if claimed is not None and (not isinstance(claimed, tuple) or claimed != got):
        raise AssertionError(f"{name} = {claimed!r:.100}, but your diagnose returns {got!r} on the same profile")
    want = rules_verdict(summary)
    if got[0] != want:
        raise AssertionError(f"{name}: your diagnose says {got[0]!r}, which the rules of section 3 do not give "
                             f"for these numbers: {numbers(summary)}")
    if got[1] not in FIRST_FIXES[want]:
        raise AssertionError(f"{name}: {got[0]!r} is right, but {got[1]!r} is not what the table in section 3 "
                             "says to change first")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's headline numbers (read by name from its ``globals()``) beside it;
    returns the path written."""
    from utils.env import smoke_mode
    from utils.loop_audit import Audit
    from utils.profile_diagnosis import ProfileSummary
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    prof = ns["profile"]
    if not isinstance(prof, ProfileSummary):
        raise ValueError("profile must be the ProfileSummary that utils.profiling.profile_steps returned")
    rec = Record.new()
    rec.add("baseline_tokens_per_s", ns["baseline_tps"], "tokens/s", "utils.timing.Stopwatch", None)
    audited, row = ns["audited"], ns["opt_row"]
    if not isinstance(audited, Audit) or not isinstance(row, dict):
        raise ValueError("audited must be loop_audit.audit(FastLoop, ...) and opt_row its measure(...)")
    rec.add("optimized_tokens_per_s", ns["optimized_tps"], "tokens/s", "utils.loop_audit.Audit.measure", None,
            config={"tokens_per_step": audited.tokens_per_step, "precision": audited.precision},
            tokens_per_step_counted=row.get("tokens_per_step_counted"), audit=audited.report)
    rec.add("speedup", ns["speedup"], "x", "optimized / naive tokens/s", None)
    for key in ("lora", "qlora"):
        r = ns[key]
        rec.add(f"{key}_peak_gib", ns[f"{key}_peak_gib"], "GiB", r["peak_source"], None,
                **{k: r[k] for k in ("weights_gib", "optimizer_gib", "activations_gib", "quant", "tokens_per_s")})
    rec.add("naive_profile_step_ms", prof.step_time_ms, "ms", "utils.profiling.profile_steps", None,
            summary=prof.evidence().to_dict(), diagnosis=prof.diagnosis, bottleneck=ns["BOTTLENECK"],
            first_fix=ns["FIRST_FIX"])
    return rec.save(path or checks.record_path(PHASE, smoke_mode()))


# -- grading from the record ----------------------------------------------------------------

def _recorded(name: str) -> float:
    """The recorded value of ``name``, after checking the record is a GPU's and this course's."""
    rec = checks.submitted_record()
    checks.record_spec(rec)
    return checks.recorded(rec, name)[0]


# The notebook's own numbers are not compared with the record's: on a grading machine without a
# GPU the notebook ran again on its CPU, so its tokens/s and peaks are this machine's, not the
# record's card's. The record is checked against itself and the lab's rules instead.

def baseline() -> None:
    v = checks.assert_positive(_recorded("baseline_tokens_per_s"), "record baseline_tokens_per_s")
    checks.record_ok(f"naive baseline {v:.4g} tokens/s")


def optimized() -> None:
    """The record's speedup is its own tokens/s ratio and at least what its card's size tier
    expects (the tier of the record's GPU, not this grading machine's smoke tier), never below
    1x; the loop's recorded audit on that GPU shows no problem (``utils.loop_audit.problems``),
    and its measured steps fed the model the tokens it claims."""
    from utils.env import phase_sizes
    from utils.loop_audit import problems
    from utils.tier_plan import fingerprint_tier

    min_speedup = max(NEVER_SLOWER, phase_sizes(PHASE, fingerprint_tier(checks.submitted_record().fingerprint)).min_speedup)
    sp = _recorded("speedup")
    base = checks.assert_positive(_recorded("baseline_tokens_per_s"), "record baseline_tokens_per_s")
    opt = checks.assert_positive(_recorded("optimized_tokens_per_s"), "record optimized_tokens_per_s")
    checks.assert_close(sp, opt / base, "record speedup vs its optimized / baseline tokens/s", rel=1e-3)
    if sp < min_speedup:
        raise AssertionError(f"the record's speedup {sp:.3g}x is below {min_speedup:g}x")
    _, counted, audit = checks.recorded(checks.submitted_record(), "optimized_tokens_per_s", "tokens_per_step_counted",
                                        "audit")
    bad = problems(audit) if isinstance(audit, dict) else ["the record's audit is not an audit report"]
    if bad:
        raise AssertionError("the record's audit of your loop on its GPU: " + "; ".join(bad))
    if counted != audit["tokens_per_step_claimed"]:
        raise AssertionError(f"the record's measured steps fed the model {counted!r:.20} tokens each, not the "
                             f"{audit['tokens_per_step_claimed']} the loop claims")
    checks.record_ok(f"speedup {sp:.3g}x, the loop's audit on the GPU clean")


def finetune() -> None:
    lo = checks.assert_positive(_recorded("lora_peak_gib"), "record lora_peak_gib")
    q = checks.assert_positive(_recorded("qlora_peak_gib"), "record qlora_peak_gib")
    if q > QLORA_RATIO * lo:
        raise AssertionError(f"the record's QLoRA peak {q:.3g} GiB is above {QLORA_RATIO} x LoRA's {lo:.3g}")
    checks.record_ok(f"LoRA {lo:.3g} GiB, QLoRA {q:.3g} GiB")


def assert_variants(diagnose, summary, what: str) -> None:
    """The learner's ``diagnose`` is right on ``summary`` with one cause made unmistakable."""
    from utils.diagnosis_cases import variants

    for how, v in variants(summary):
        assert_right(their_verdict(diagnose, v, f"{what} {how}"), None, v, f"your diagnose on {what} {how}")


def diagnosis(diagnose) -> None:
    """The recorded profile's verdict follows from its numbers, and the learner's ``diagnose``,
    run here on those numbers, gives the recorded BOTTLENECK and FIRST_FIX, both right."""
    from utils.profile_diagnosis import ProfileSummary

    checks.assert_untampered(CASE_MODULES)  # the rules that judge it run in this kernel
    checks.assert_constants_unchanged(("utils.profile_diagnosis",))
    rec = checks.submitted_record()
    checks.record_spec(rec)
    _, summary, said, bottleneck, fix = checks.recorded(rec, "naive_profile_step_ms", "summary", "diagnosis",
                                                        "bottleneck", "first_fix")
    try:
        s = ProfileSummary.from_dict(summary)
    except (ValueError, TypeError) as exc:
        raise AssertionError(f"the record's profile cannot be read: {exc}") from None
    if rules_verdict(s) != said:
        raise AssertionError(f"the record's profile says {said!r}, which its own numbers do not give: it was edited")
    assert_right(their_verdict(diagnose, s.evidence(), "your recorded profile"), (bottleneck, fix), s,
                 "the record's BOTTLENECK, FIRST_FIX")
    assert_variants(diagnose, s, "your recorded profile")
    checks.record_ok(f"your diagnose gives {bottleneck!r} (fix {fix!r}) on your recorded {s.device} profile")
