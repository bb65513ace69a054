"""Phase 0's measurement record: what the notebook writes, and grading from it.

``save_record`` writes every measured number of ``00_foundations`` with the raw fields it was
derived from (FLOPs, bytes, times, batch sizes), each kernel's placement on both rooflines, the
machine's fingerprint and the ``utils`` hash (``utils.record``). On a grading machine without a GPU, the ``*_from_record`` checks
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
LABELS = ("compute", "memory", "overhead")
KERNELS = ("matmul", "thin_matmul", "elementwise", "tiny_ops")
ROOFS = ("datasheet", "measured")  # the two rooflines each kernel is placed on
THIN_DIVISOR = 32  # the thin matmul is (n x n/32) @ (n/32 x n): its intensity sits near a GPU's ridge


def dtype_bytes(dtype: Any) -> int:
    from utils.memory import bytes_per_dtype

    return int(bytes_per_dtype(checks.dtype_name(dtype)))


# -- the placement rule on both rooflines (live and from the record) -----------------------------

def thin_k(n: int) -> int:
    """The thin matmul's inner dimension for an ``n``-wide matmul, as the notebook's locked cell sets it."""
    return max(1, n // THIN_DIVISOR)


def intensities(n: int, nbytes: int) -> dict:
    """FLOP per byte of each kernel, from the exact counts: the ``n^3`` matmul, the thin
    ``(n x k) @ (k x n)`` one, ``x + 1`` and the tiny adds in fp32."""
    k = thin_k(n)
    return {"matmul": 2 * n**3 / (3 * n * n * nbytes), "thin_matmul": 2 * n * k * n / ((2 * n * k + n * n) * nbytes),
            "elementwise": 0.125, "tiny_ops": 0.125}


def datasheet_ceilings(spec, dtype: Any) -> tuple[float, float] | None:
    """``(peak TFLOP/s of dtype, bandwidth GB/s)`` from a spec row, or None where it has no such
    figures (a CPU, a GPU missing from ``utils.hardware``): then the notebook places kernels on
    the measured ceilings twice, and says so."""
    if spec is None:
        return None
    peak = spec.peak_tflops(checks.dtype_name(dtype))
    return (float(peak), float(spec.bandwidth_gbs)) if peak and spec.bandwidth_gbs else None


def misplaced(placements: Any, intensity: dict, achieved: dict, roofs: dict) -> list[str]:
    """Every placement that is not ``utils.flops.bound`` of its kernel's intensity and achieved
    TFLOP/s on that roofline, described with its numbers (not the answer)."""
    from utils.flops import bound, ridge_point

    if not isinstance(placements, dict) or set(placements) != set(ROOFS):
        raise AssertionError(f"placements must be a dict with the keys {', '.join(map(repr, ROOFS))}, "
                             f"one dict of kernel -> label per roofline")
    bad = []
    for roof in ROOFS:
        per = placements[roof]
        if not isinstance(per, dict) or set(per) != set(KERNELS):
            raise AssertionError(f"placements[{roof!r}] must be a dict with the keys {', '.join(map(repr, KERNELS))}")
        peak, bw = roofs[roof]
        for name in KERNELS:
            label = checks.as_label(per[name], LABELS, f"placements[{roof!r}][{name!r}]")
            if label != bound(intensity[name], peak, bw, achieved[name]):
                bad.append(f"placements[{roof!r}][{name!r}] = {label!r} does not follow from {intensity[name]:.3g} FLOP/B "
                           f"at {achieved[name]:.3g} TFLOP/s on the {roof} roofline ({peak:.4g} TFLOP/s, {bw:.4g} GB/s, "
                           f"ridge {ridge_point(peak, bw):.3g} FLOP/B)")
    return bad


# -- writing --------------------------------------------------------------------------------

_NEEDED = ("MATMUL_DTYPE", "n", "matmul_time", "matmul_flops", "matmul_bytes", "matmul_tflops", "copy_time", "copy_gbs",
           "ew_time", "ew_flops", "ew_bytes", "ew_gbs", "ew_tflops", "tiny_time", "tiny_flops", "tiny_bytes", "tiny_tflops",
           "thin_time", "thin_flops", "thin_bytes", "thin_tflops", "placements", "train", "tokens_per_s", "monitor", "SIZES", "TOKENS_PER_STEP", "FLOPS_PER_TOKEN",
           "TRAIN_PEAK_TFLOPS", "full_time", "small_time", "small_batch", "batch_scaling", "fixed_share",
           "step_tflops", "mfu", "LIMITER", "STEP_BYTES", "step_gbs", "bandwidth_share", "TRAIN_PEAK_GBS", "SM_COUNT", "SWEEP_SHAPES", "sweep_time", "sweep_tflops",
           "MAX_ACHIEVABLE_TFLOPS")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (the notebook's
    ``globals()``), as a ``utils.record.Record`` beside the notebook; returns the Record."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    g, pl = ns, ns["placements"]

    def placed(kernel: str) -> dict:
        return {roof: pl[roof].get(kernel) if isinstance(pl, dict) and isinstance(pl.get(roof), dict) else None
                for roof in ROOFS}

    def t(r) -> dict:
        return {"median_ms": r.median_ms, "p20_ms": r.p20_ms, "p80_ms": r.p80_ms, "runs": r.runs}

    rec = Record.new()
    rec.add("matmul_tflops", g["matmul_tflops"], "TFLOP/s", g["matmul_time"].method, checks.spread(g["matmul_time"]),
            n=g["n"], dtype=checks.dtype_name(g["MATMUL_DTYPE"]), flops=g["matmul_flops"], bytes=g["matmul_bytes"],
            placements=placed("matmul"), **t(g["matmul_time"]))
    rec.add("thin_matmul_tflops", g["thin_tflops"], "TFLOP/s", g["thin_time"].method, checks.spread(g["thin_time"]),
            n=g["n"], k=thin_k(g["n"]), dtype=checks.dtype_name(g["MATMUL_DTYPE"]), flops=g["thin_flops"],
            bytes=g["thin_bytes"], placements=placed("thin_matmul"), **t(g["thin_time"]))
    rec.add("copy_gbs", g["copy_gbs"], "GB/s", g["copy_time"].method, checks.spread(g["copy_time"]),
            bytes=2 * g["SIZES"].elementwise_numel * 4, **t(g["copy_time"]))
    rec.add("elementwise_gbs", g["ew_gbs"], "GB/s", g["ew_time"].method, checks.spread(g["ew_time"]), flops=g["ew_flops"],
            bytes=g["ew_bytes"], tflops=g["ew_tflops"], placements=placed("elementwise"), **t(g["ew_time"]))
    rec.add("tiny_ops_tflops", g["tiny_tflops"], "TFLOP/s", g["tiny_time"].method, checks.spread(g["tiny_time"]),
            flops=g["tiny_flops"], bytes=g["tiny_bytes"], placements=placed("tiny_ops"), **t(g["tiny_time"]))
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
            step_bytes=g["STEP_BYTES"], step_gbs=g["step_gbs"], bandwidth_share=g["bandwidth_share"],
            peak_gbs=g["TRAIN_PEAK_GBS"], limiter=g["LIMITER"])
    from utils.env import device_tier

    best = max(g["sweep_tflops"], key=g["sweep_tflops"].get)
    rec.add("sweep_max_tflops", g["MAX_ACHIEVABLE_TFLOPS"], "TFLOP/s", g["sweep_time"][best].method,
            checks.spread(g["sweep_time"][best]), sm_count=g["SM_COUNT"], tier=device_tier(),
            dtype=checks.dtype_name(g["MATMUL_DTYPE"]), best=best,
            rows={label: {"shape": list(shape), "tflops": g["sweep_tflops"][label], **t(g["sweep_time"][label])}
                  for label, shape in g["SWEEP_SHAPES"].items()})
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


# -- reading --------------------------------------------------------------------------------

def _times(rec, name: str) -> float:
    """The recorded median after checking p20 <= median <= p80."""
    return _median(rec.measurements[name].extra, name)


def _median(extra: dict, name: str) -> float:
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


def roofline() -> None:
    """Each recorded placement, on the card's datasheet roofline and on the recorded ceilings, is
    the rule's on the recorded counts and rates; every count is exact and every rate follows from
    its median; nothing is above the card's datasheet roofline."""
    from utils.flops import attainable_tflops

    rec, spec = checks.open_record()
    peak, dtype, n = checks.recorded(rec, "matmul_tflops", "dtype", "n")
    bw = checks.recorded(rec, "copy_gbs")[0]
    n = int(checks.as_number(n, "record matmul n"))
    nbytes = dtype_bytes(dtype)
    _, k, tfl, tby, tdt = checks.recorded(rec, "thin_matmul_tflops", "k", "flops", "bytes", "dtype")
    if k != thin_k(n) or tdt != dtype:
        raise AssertionError(f"record thin matmul: k = {k!r} in {tdt!r}, expected k = n / {THIN_DIVISOR} = {thin_k(n)} in {dtype!r}")
    checks.assert_close(tfl, 2 * n * thin_k(n) * n, "record thin matmul flops (2 n k n)")
    checks.assert_close(tby, (2 * n * thin_k(n) + n * n) * nbytes, "record thin matmul bytes (read A and B, write C)")
    intensity, achieved, placed = intensities(n, nbytes), {}, {}
    rows = {"matmul": ("matmul_tflops", None), "thin_matmul": ("thin_matmul_tflops", None),
            "elementwise": ("elementwise_gbs", "tflops"), "tiny_ops": ("tiny_ops_tflops", None)}
    for kernel, (name, t_key) in rows.items():
        got = checks.recorded(rec, name, "flops", "bytes", "placements", *((t_key,) if t_key else ()))
        fl, by = checks.as_number(got[1], f"record {name} flops"), checks.assert_positive(got[2], f"record {name} bytes")
        checks.assert_close(fl / by, intensity[kernel], f"record {kernel} intensity (its flops / bytes)")
        achieved[kernel] = checks.as_number(got[4], f"record {name} tflops") if t_key else got[0]
        checks.assert_close(achieved[kernel], tflop_per_s(fl, _times(rec, name)), f"record {kernel} TFLOP/s vs its flops and median_ms",
                            rel=1e-3)
        placed[kernel] = got[3] if isinstance(got[3], dict) else {}
    placements = {roof: {kernel: placed[kernel].get(roof) for kernel in KERNELS} for roof in ROOFS}
    datasheet = datasheet_ceilings(spec, dtype)
    bad = misplaced(placements, intensity, achieved, {"datasheet": datasheet or (peak, bw), "measured": (peak, bw)})
    if bad:
        raise AssertionError("record: " + "; ".join(bad))
    for kernel in KERNELS:
        roof = attainable_tflops(intensity[kernel], *(datasheet or (peak, bw)))
        checks.assert_not_above(achieved[kernel], roof, f"recorded {kernel}", "TFLOP/s",
                                f"the {spec.name} datasheet roofline at {intensity[kernel]:.3g} FLOP/B")
    checks.record_ok("roofline placements on the datasheet and the measured rooflines")


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
    mfu, step_tf, peak, fpt, bsz, small, full_ms, small_ms, r, share, label, nbytes, gbs, bw_share, peak_gbs = checks.recorded(
        rec, "train_mfu", "step_tflops", "peak_tflops", "flops_per_token", "batch_size", "small_batch",
        "full_median_ms", "small_median_ms", "batch_scaling", "fixed_share", "limiter", "step_bytes", "step_gbs",
        "bandwidth_share", "peak_gbs")
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
    from utils.flops import non_embedding_params_from_config

    least = 16 * non_embedding_params_from_config(preset_config(str(model)))  # read in forward and backward, grads, AdamW
    if checks.as_number(nbytes, "recorded step_bytes") < least:
        raise AssertionError(f"recorded step_bytes {nbytes:.4g} is less than one step must move ({least:.4g}: {model}'s "
                             f"fp32 weights read twice, their gradients written and the optimizer's update)")
    checks.assert_close(gbs, gb_per_s(nbytes, full_ms), "recorded step_gbs vs its step_bytes and full_median_ms", rel=1e-3)
    checks.assert_close(bw_share, gbs / checks.assert_positive(peak_gbs, "recorded peak_gbs"), "recorded bandwidth_share", rel=1e-3)
    if spec.bandwidth_gbs and not math.isclose(peak_gbs, spec.bandwidth_gbs, rel_tol=1e-6):
        raise AssertionError(f"recorded peak_gbs {peak_gbs} is not the {spec.name} datasheet bandwidth ({spec.bandwidth_gbs})")
    if label != step_bound(share, mfu, bw_share):
        raise AssertionError(f"recorded limiter {label!r} does not follow from fixed_share {share:.2f}, mfu {mfu:.2f} "
                             f"and bandwidth_share {bw_share:.2f}")
    checks.record_ok(f"limiter {label!r} (fixed share {share:.2f}, MFU {mfu:.2f}, bandwidth share {bw_share:.2f})")


def sweep(achieved_tflops) -> None:
    """The recorded sweep: its SM count the card's, its shapes the setup's for that count and tier,
    every rate from its shape and median, the best the fastest, below the card's datasheet peak."""
    from utils import matmul_sweep as ms

    rec, spec = checks.open_record()
    best_tf, sms, tier, dtype, best, rows = checks.recorded(rec, "sweep_max_tflops", "sm_count", "tier", "dtype", "best", "rows")
    if spec.name in ms.SM_COUNTS and sms != ms.SM_COUNTS[spec.name]:
        raise AssertionError(f"record sm_count {sms!r}, but the {spec.name} has {ms.SM_COUNTS[spec.name]} SMs")
    try:
        want = ms.sweep_shapes(sms, tier)
    except (ValueError, TypeError) as exc:
        raise AssertionError(f"record sweep: {exc}") from None
    if not isinstance(rows, dict) or {k: tuple(r.get("shape", ())) for k, r in rows.items() if isinstance(r, dict)} != want:
        raise AssertionError(f"record sweep rows are not the shapes swept on {sms} SMs ({tier}): {want}")
    rates = {}
    for label, (m, n, k) in want.items():
        r = rows[label]
        med = _median(r, f"sweep {label}")
        rates[label] = checks.as_number(r.get("tflops"), f"record sweep {label} tflops")
        checks.assert_close(rates[label], tflop_per_s(2 * m * n * k, med), f"record sweep {label} TFLOP/s vs its shape and median_ms",
                            rel=1e-3)
    fastest = max(rates, key=rates.get)
    if best != fastest:
        raise AssertionError(f"record sweep best {best!r}, but the fastest row is {fastest!r}")
    checks.assert_close(best_tf, rates[fastest], "recorded MAX_ACHIEVABLE_TFLOPS vs the fastest row", rel=1e-3)
    m, n, k = want[fastest]
    with checks.quiet():
        checks.assert_close(achieved_tflops(float(2 * m * n * k), rows[fastest]["median_ms"]), best_tf,
                            "your achieved_tflops on the recorded best shape", rel=1e-3)
    checks.assert_not_above(best_tf, spec.peak_tflops(checks.dtype_name(dtype)), "recorded MAX_ACHIEVABLE_TFLOPS", "TFLOP/s",
                            f"the {spec.name} {dtype} datasheet peak")
    checks.record_ok(f"sweep of {len(want)} shapes on {sms} SMs, best {best_tf:.4g} TFLOP/s ({fastest})")
