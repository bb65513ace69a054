"""Phase 0's measurement record: what the notebook writes, and grading from it.

``save_record`` writes every measured number of ``00_foundations`` with the raw fields it was
derived from (FLOPs, bytes, times, batch sizes), the machine's fingerprint and the ``utils``
hash (``utils.record``). On a grading machine without a GPU, the ``*_from_record`` checks
grade a GPU record instead of re-measuring (docs/grading.md): the fingerprint names a
card in ``utils.hardware`` and the hash matches this grader's ``utils``; every derived
number is recomputed from its raw fields; the learner's own functions, applied to the
recorded inputs, give the recorded outputs; nothing exceeds the card's datasheet.

An invented number that is consistent, plausible and below the datasheet passes: the record
proves the arithmetic, not the run. Grade on a GPU where that matters.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grader import checks
from utils.flops import batch_scaling, fixed_share, step_bound
from utils.units import gb_per_s, tflop_per_s

PHASE = "00_foundations"


def dtype_bytes(dtype: Any) -> int:
    from utils.memory import bytes_per_dtype

    return int(bytes_per_dtype(checks.dtype_name(dtype)))


# -- writing --------------------------------------------------------------------------------

_NEEDED = ("MATMUL_DTYPE", "n", "matmul_time", "matmul_flops", "matmul_bytes", "matmul_tflops", "copy_time", "copy_gbs",
           "ew_time", "ew_flops", "ew_bytes", "ew_gbs", "ew_tflops", "tiny_time", "tiny_flops", "tiny_bytes", "tiny_tflops",
           "placements", "train", "tokens_per_s", "monitor", "SIZES", "TOKENS_PER_STEP", "FLOPS_PER_TOKEN",
           "TRAIN_PEAK_TFLOPS", "full_time", "small_time", "small_batch", "batch_scaling", "fixed_share",
           "step_tflops", "mfu", "LIMITER")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (the notebook's
    ``globals()``), as a ``utils.record.Record`` beside the notebook; returns the Record."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    g, pl = ns, ns["placements"]

    def t(r) -> dict:
        return {"median_ms": r.median_ms, "p20_ms": r.p20_ms, "p80_ms": r.p80_ms, "runs": r.runs}

    rec = Record.new()
    rec.add("matmul_tflops", g["matmul_tflops"], "TFLOP/s", g["matmul_time"].method, checks.spread(g["matmul_time"]),
            n=g["n"], dtype=checks.dtype_name(g["MATMUL_DTYPE"]), flops=g["matmul_flops"], bytes=g["matmul_bytes"],
            placement=pl.get("matmul"), **t(g["matmul_time"]))
    rec.add("copy_gbs", g["copy_gbs"], "GB/s", g["copy_time"].method, checks.spread(g["copy_time"]),
            bytes=2 * g["SIZES"].elementwise_numel * 4, **t(g["copy_time"]))
    rec.add("elementwise_gbs", g["ew_gbs"], "GB/s", g["ew_time"].method, checks.spread(g["ew_time"]), flops=g["ew_flops"],
            bytes=g["ew_bytes"], tflops=g["ew_tflops"], placement=pl.get("elementwise"), **t(g["ew_time"]))
    rec.add("tiny_ops_tflops", g["tiny_tflops"], "TFLOP/s", g["tiny_time"].method, checks.spread(g["tiny_time"]),
            flops=g["tiny_flops"], bytes=g["tiny_bytes"], placement=pl.get("tiny_ops"), **t(g["tiny_time"]))
    tr, summ = g["train"], g["monitor"].summary()
    util_max = [s[k]["max"] for s in summ.values() for k in ("util_gpu_pct", "util_cpu_pct")
                if isinstance(s.get(k), dict) and s[k].get("max") is not None]
    mem_max = [s["mem_used_gib"]["max"] for s in summ.values()
               if isinstance(s.get("mem_used_gib"), dict) and s["mem_used_gib"].get("max") is not None]
    rec.add("train_tokens_per_s", g["tokens_per_s"], "tokens/s", tr["method"], None,
            tokens_per_step=g["TOKENS_PER_STEP"], steps=tr["steps"], total_s=tr["total_s"], median_step_ms=tr["median_ms"],
            seq_len=g["SIZES"].seq_len, model=g["SIZES"].model, monitor_source=g["monitor"].source,
            util_max_pct=max(util_max) if util_max else None, mem_max_gib=max(mem_max) if mem_max else None)
    rec.add("train_mfu", g["mfu"], "fraction", "utils.timing.benchmark of train_step", checks.spread(g["full_time"]),
            step_tflops=g["step_tflops"], peak_tflops=g["TRAIN_PEAK_TFLOPS"], flops_per_token=g["FLOPS_PER_TOKEN"],
            batch_size=g["SIZES"].batch_size, small_batch=g["small_batch"], full_median_ms=g["full_time"].median_ms,
            small_median_ms=g["small_time"].median_ms, batch_scaling=g["batch_scaling"], fixed_share=g["fixed_share"],
            limiter=g["LIMITER"])
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


# -- reading --------------------------------------------------------------------------------

def _times(rec, name: str) -> float:
    """The recorded median after checking p20 <= median <= p80."""
    extra = rec.measurements[name].extra
    med = checks.assert_positive(extra.get("median_ms"), f"record {name} median_ms")
    p20 = checks.as_number(extra.get("p20_ms"), f"record {name} p20_ms")
    p80 = checks.as_number(extra.get("p80_ms"), f"record {name} p80_ms")
    if not 0 < p20 <= med <= p80:
        raise AssertionError(f"record {name}: p20 {p20} <= median {med} <= p80 {p80} does not hold")
    return med


def matmul(achieved_tflops) -> None:
    rec, spec = checks.open_record()
    v, n, dtype, fl, by = checks.recorded(rec, "matmul_tflops", "n", "dtype", "flops", "bytes")
    med = _times(rec, "matmul_tflops")
    n = int(checks.as_number(n, "record matmul n"))
    checks.assert_close(fl, 2 * n**3, "record matmul flops (2 n^3)")
    checks.assert_close(by, 3 * n * n * dtype_bytes(dtype), "record matmul bytes")
    checks.assert_close(v, tflop_per_s(fl, med), "record matmul_tflops vs its flops and median_ms", rel=1e-3)
    with checks.quiet():
        checks.assert_close(achieved_tflops(float(fl), med), v, "your achieved_tflops on the recorded matmul", rel=1e-3)
    checks.assert_not_above(v, spec.peak_tflops(checks.dtype_name(dtype)), "recorded matmul_tflops", "TFLOP/s",
                            f"the {spec.name} {dtype} datasheet peak")
    checks.record_ok(f"matmul {v:.4g} TFLOP/s")


def memory(achieved_bandwidth_gbs, achieved_tflops) -> None:
    rec, spec = checks.open_record()
    cv, cby = checks.recorded(rec, "copy_gbs", "bytes")
    ev, efl, eby, etf = checks.recorded(rec, "elementwise_gbs", "flops", "bytes", "tflops")
    cmed, emed = _times(rec, "copy_gbs"), _times(rec, "elementwise_gbs")
    checks.assert_close(eby, 8 * efl, "record elementwise bytes (8 per element in fp32)")
    checks.assert_close(cv, gb_per_s(cby, cmed), "record copy_gbs vs its bytes and median_ms", rel=1e-3)
    checks.assert_close(ev, gb_per_s(eby, emed), "record elementwise_gbs vs its bytes and median_ms", rel=1e-3)
    checks.assert_close(etf, tflop_per_s(efl, emed), "record elementwise tflops vs its flops and median_ms", rel=1e-3)
    with checks.quiet():
        checks.assert_close(achieved_bandwidth_gbs(float(cby), cmed), cv, "your achieved_bandwidth_gbs on the recorded copy", rel=1e-3)
        checks.assert_close(achieved_tflops(float(efl), emed), etf, "your achieved_tflops on the recorded x + 1", rel=1e-3)
    for name, v in (("recorded copy_gbs", cv), ("recorded elementwise_gbs", ev)):
        checks.assert_not_above(v, spec.bandwidth_gbs, name, "GB/s", f"the {spec.name} datasheet bandwidth")
    checks.record_ok(f"copy {cv:.4g} GB/s, x + 1 {ev:.4g} GB/s")


def roofline(classify_bound) -> None:
    from utils.flops import attainable_tflops, bound

    rec, spec = checks.open_record()
    peak, dtype = checks.recorded(rec, "matmul_tflops", "dtype")
    bw = checks.recorded(rec, "copy_gbs")[0]
    rows = {"matmul": ("matmul_tflops", None), "elementwise": ("elementwise_gbs", "tflops"), "tiny_ops": ("tiny_ops_tflops", None)}
    for kernel, (name, t_key) in rows.items():
        got = checks.recorded(rec, name, "flops", "bytes", "placement", *((t_key,) if t_key else ()))
        achieved = checks.as_number(got[4], f"record {name} tflops") if t_key else got[0]
        intensity = checks.as_number(got[1], "flops") / checks.assert_positive(got[2], "bytes")
        expected = bound(intensity, peak, bw, achieved)
        with checks.quiet():
            theirs = classify_bound(intensity, achieved, peak, bw)
        if got[3] != expected or theirs != expected:
            raise AssertionError(f"record {kernel}: placed {got[3]!r}, your classify_bound says {theirs!r}, the rule gives {expected!r}")
        roof = attainable_tflops(intensity, spec.peak_tflops(checks.dtype_name(dtype)) or peak, spec.bandwidth_gbs or bw)
        checks.assert_not_above(achieved, roof, f"recorded {kernel}", "TFLOP/s",
                                f"the {spec.name} datasheet roofline at {intensity:.3g} FLOP/B")
    checks.record_ok("roofline placements")


def training() -> None:
    rec, spec = checks.open_record()
    tps, per_step, steps, total_s, util_max, mem_max = checks.recorded(
        rec, "train_tokens_per_s", "tokens_per_step", "steps", "total_s", "util_max_pct", "mem_max_gib")
    checks.assert_close(tps, checks.as_number(per_step, "tokens_per_step") * checks.as_number(steps, "steps")
                        / checks.assert_positive(total_s, "total_s"), "recorded tokens/s vs tokens, steps and total_s", rel=1e-3)
    checks.assert_utilization([util_max], "recorded utilization")
    card = rec.fingerprint.get("memory_gib") or spec.memory_gb
    checks.assert_memory(mem_max, card, "recorded peak memory")
    checks.record_ok(f"training {tps:,.0f} tokens/s")


def limiter() -> None:
    from utils.flops import flops_per_token_from_config
    from utils.models import preset_config

    rec, spec = checks.open_record()
    mfu, step_tf, peak, fpt, bsz, small, full_ms, small_ms, r, share, label = checks.recorded(
        rec, "train_mfu", "step_tflops", "peak_tflops", "flops_per_token", "batch_size", "small_batch",
        "full_median_ms", "small_median_ms", "batch_scaling", "fixed_share", "limiter")
    _, seq, model = checks.recorded(rec, "train_tokens_per_s", "seq_len", "model")
    with checks.quiet():
        fpt_model = flops_per_token_from_config(preset_config(str(model)), int(seq))
    checks.assert_close(fpt, fpt_model, f"recorded flops_per_token vs {model} at sequence length {seq}")
    r_calc = batch_scaling(bsz, full_ms, small, small_ms)
    checks.assert_close(r, r_calc, "recorded batch_scaling vs its step times", rel=1e-3)
    checks.assert_close(share, fixed_share(r_calc, bsz, small), "recorded fixed_share", rel=1e-3, abs_tol=1e-9)
    checks.assert_close(step_tf, tflop_per_s(fpt * bsz * seq, full_ms), "recorded step_tflops", rel=1e-3)
    checks.assert_close(mfu, step_tf / peak, "recorded mfu", rel=1e-3)
    checks.assert_not_above(mfu, 1.0, "recorded mfu", "", "100% of peak")
    peaks = [p for p in (spec.fp32_tflops, spec.tf32_tflops) if p]
    if peaks and not any(math.isclose(peak, p, rel_tol=1e-6) for p in peaks):
        raise AssertionError(f"recorded peak_tflops {peak} is not the {spec.name} fp32 or tf32 datasheet peak ({peaks})")
    if label != step_bound(share, mfu):
        raise AssertionError(f"recorded limiter {label!r} does not follow from fixed_share {share:.2f} and mfu {mfu:.2f}")
    checks.record_ok(f"limiter {label!r} (fixed share {share:.2f}, MFU {mfu:.2f})")
