"""Lab 00's judges: each graded cell's answers against the rule, the grader's measurement or a record.

Each judge is pure (``grader/judging.py``). The learner's four formula functions and the two
quantization functions are run by the grader on cases drawn from the grading run's secret seed, in a
sandbox where the course's own implementations of those formulas are unavailable (``forbid``). The
measured cells are checked for consistency first (every rate from its own counts and timing, every
count exact for the lab's sizes), then against the grader's own measurement (``reference.py``).
"""
from __future__ import annotations

import math

from grader.expect import RuleFail, approx, cases, close, equal, label, not_above, positive
from grader.judging import Check
from grader.labs.foundations.answers import KERNELS, LABELS, ROOFS
from utils.measure import matmul_sweep
from utils.measure.flops import (
    attainable_tflops,
    batch_scaling,
    bound,
    fixed_share,
    flops_per_token_from_config,
    non_embedding_params_from_config,
    ridge_point,
    step_bound,
)
from utils.measure.memory import bytes_per_dtype
from utils.model.models import preset_config
from utils.units import gb_per_s, tflop_per_s

THIN_DIVISOR = 32  # the thin matmul is (n x n/32) @ (n/32 x n): its intensity sits near a GPU's ridge
FORMULAS = ("utils.measure.flops:arithmetic_intensity", "utils.units:tflop_per_s", "utils.units:gb_per_s",
            "utils.measure.flops:bound", "utils.measure.flops:attainable_tflops", "utils.measure.flops:ridge_point",
            "utils.measure.flops:roofline_fraction", "utils.measure.flops:step_bound")
QUANTIZATION = tuple(f"utils.measure.matmul_sweep:{f}" for f in (
    "quantization", "predicted_slow", "useful_fraction", "output_tiles", "waves", "wave_efficiency",
    "tile_efficiency", "aligned"))


# -- hidden cases, drawn from the run's secret seed ------------------------------------------------

def _log_uniform(rng, lo: float, hi: float) -> float:
    return 10 ** rng.uniform(math.log10(lo), math.log10(hi))


def intensity_cases(rng, ctx) -> list:
    return [[_log_uniform(rng, 1.0, 1e15), _log_uniform(rng, 1.0, 1e12)] for _ in range(10)] + [[0.0, 4.0]]


def rate_cases(rng, ctx) -> list:
    return [[_log_uniform(rng, 1.0, 1e16), _log_uniform(rng, 1e-4, 1e4)] for _ in range(10)]


def bound_cases(rng, ctx) -> list:
    """``(intensity, achieved, peak, bandwidth)``: intensities either side of the ridge and shares of
    the roof either side of 10%, each at least 2% from its threshold (rounding cannot decide a case)."""
    out = []
    while len(out) < 40:
        peak, bw = _log_uniform(rng, 0.05, 2000.0), _log_uniform(rng, 10.0, 8000.0)
        ridge = ridge_point(peak, bw)
        i = ridge * _log_uniform(rng, 0.01, 100.0)
        share = rng.choice([_log_uniform(rng, 1e-4, 0.098), rng.uniform(0.102, 1.0)])
        if abs(i / ridge - 1) < 0.02:
            continue
        out.append([i, share * attainable_tflops(i, peak, bw), peak, bw])
    return out


def quantization_shapes(rng, ctx) -> list:
    """``(m, n, k, sm_count, dtype_bytes)``: outputs of exactly one wave, one tile past it and half a wave;
    dimensions cut by multiples of 64, 8 and odd sizes; k alone misaligned; 1-, 2- and 4-byte types."""
    out = []
    for _ in range(24):
        sms = rng.choice([7, 40, 56, 58, 72, 80, 108, 114, 132, 142, rng.randint(1, 200)])
        kind = rng.randrange(5)
        if kind == 0:
            m, n = 128 * sms * rng.randint(1, 3), 128
        elif kind == 1:
            m, n = 128 * (sms * rng.randint(1, 2) + 1), 128 * rng.randint(1, 2)
        elif kind == 2:
            m, n = 64 * rng.randint(1, 160), 64 * rng.randint(1, 160)
        elif kind == 3:
            m, n = 8 * rng.randint(1, 1200), 8 * rng.randint(1, 1200)
        else:
            m, n = rng.randint(1, 10000), rng.randint(1, 10000)
        k = rng.choice([8 * rng.randint(1, 2048), rng.randint(1, 16384)])
        out.append([m, n, k, sms, rng.choice([1, 2, 2, 4])])
    return out


# -- judges of the formula cells --------------------------------------------------------------------

def intensity(a, ref):
    want = [f / b for f, b in a.inputs["arithmetic_intensity"]]
    return [cases(a.calls["arithmetic_intensity"], want, "arithmetic_intensity", "FLOPs / bytes moved", approx(1e-9))]


def rates(a, ref):
    return [cases(a.calls["achieved_tflops"], [f / (ms * 1e-3) / 1e12 for f, ms in a.inputs["achieved_tflops"]],
                  "achieved_tflops", "flops / (time_ms / 1000) / 1e12 (TFLOP/s)", approx(1e-9)),
            cases(a.calls["achieved_bandwidth_gbs"],
                  [b / (ms * 1e-3) / 1e9 for b, ms in a.inputs["achieved_bandwidth_gbs"]],
                  "achieved_bandwidth_gbs", "bytes / (time_ms / 1000) / 1e9 (GB/s)", approx(1e-9))]


def classify(a, ref):
    want = [bound(i, p, b, t) for i, t, p, b in a.inputs["classify_bound"]]
    return [cases(a.calls["classify_bound"], want, "classify_bound",
                  '"overhead" below 10% of min(peak, intensity x bandwidth), else "compute" at or above the ridge '
                  'point (peak / bandwidth) and "memory" below it')]


def quantization(a, ref):
    want = []
    for m, n, sms in a.inputs["quantization"]:
        q = matmul_sweep.quantization(m, n, 8, sms, 2)  # tiles, waves and the useful fraction do not depend on k
        want.append([q.tiles, q.waves, q.useful_fraction])
    slow = [matmul_sweep.quantization(m, n, k, sms, b).slow for m, n, k, sms, b in a.inputs["predict_slow"]]
    return [cases(a.calls["quantization"], want, "quantization", "(ceil(m/128) x ceil(n/128) tiles, ceil(tiles / "
                  "sm_count) waves, m n / (waves x sm_count x 128 x 128))", approx(1e-9)),
            cases(a.calls["predict_slow"], slow, "predict_slow", "True if a dimension x dtype_bytes is not a multiple "
                  "of 16, or the useful fraction is below 0.8; a bool", lambda got, w: got is bool(w))]


# -- judges of the measured cells -------------------------------------------------------------------

def _timing(t: dict, name: str) -> float:
    if not t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]:
        raise RuleFail(f"{name}: p20 {t['p20_ms']:.4g} <= median {t['median_ms']:.4g} <= p80 {t['p80_ms']:.4g} ms does not "
                   "hold: not a timing from utils.measure.timing.benchmark")
    return t["median_ms"]


def _nbytes(ctx) -> int:
    return int(bytes_per_dtype(ctx.dtype))


def matmul(a, ref):
    ctx = ref.ctx
    n = ctx.sizes.matmul_n
    equal(a.matmul_flops, 2 * n**3, "matmul_flops", f"an n x n by n x n matmul does 2 n^3 FLOPs (n = {n})")
    equal(a.matmul_bytes, 3 * n * n * _nbytes(ctx), "matmul_bytes",
          f"read A and B and write C once, {_nbytes(ctx)} bytes per {ctx.dtype} element")
    med = _timing(a.matmul_time, "matmul_time")
    close(a.matmul_tflops, tflop_per_s(a.matmul_flops, med), "matmul_tflops", "matmul_flops over matmul_time's median",
          rel=1e-3)
    ceiling, what = ref.peak_tflops(ctx.dtype)
    not_above(a.matmul_tflops, ceiling, "matmul_tflops", "TFLOP/s", what)
    return [ref.against("matmul", a.matmul_tflops, "matmul_tflops", "TFLOP/s")]


def memory(a, ref):
    ctx = ref.ctx
    numel = ctx.sizes.elementwise_numel
    equal(a.ew_flops, numel, "ew_flops", "one add per element")
    equal(a.ew_bytes, 8 * numel, "ew_bytes", "read x and write out: 4 + 4 bytes per fp32 element")
    cmed, emed = _timing(a.copy_time, "copy_time"), _timing(a.ew_time, "ew_time")
    close(a.copy_gbs, gb_per_s(8 * numel, cmed), "copy_gbs", "8 bytes per element over copy_time's median", rel=1e-3)
    close(a.ew_gbs, gb_per_s(a.ew_bytes, emed), "ew_gbs", "ew_bytes over ew_time's median", rel=1e-3)
    close(a.ew_tflops, tflop_per_s(a.ew_flops, emed), "ew_tflops", "ew_flops over ew_time's median", rel=1e-3)
    if ctx.device == "cuda" and ctx.spec:
        for name in ("copy_gbs", "ew_gbs"):
            not_above(getattr(a, name), ctx.spec.bandwidth_gbs, name, "GB/s", f"the {ctx.spec.name} datasheet bandwidth")
    return [ref.against("copy", a.copy_gbs, "copy_gbs", "GB/s"), ref.against("ew_gbs", a.ew_gbs, "ew_gbs", "GB/s")]


def intensities(n: int, nbytes: int) -> dict:
    """FLOP per byte of each kernel from the exact counts."""
    k = max(1, n // THIN_DIVISOR)
    return {"matmul": 2 * n**3 / (3 * n * n * nbytes), "thin_matmul": 2 * n * k * n / ((2 * n * k + n * n) * nbytes),
            "elementwise": 0.125, "tiny_ops": 0.125}


def datasheet_ceilings(ctx) -> tuple[float, float] | None:
    if ctx.device != "cuda" or ctx.spec is None:
        return None
    peak = ctx.spec.peak_tflops(ctx.dtype)
    return (float(peak), float(ctx.spec.bandwidth_gbs)) if peak and ctx.spec.bandwidth_gbs else None


def roofline(a, ref):
    ctx = ref.ctx
    n, ops, nbytes = ctx.sizes.matmul_n, ctx.sizes.tiny_ops, _nbytes(ctx)
    k = max(1, n // THIN_DIVISOR)
    equal(a.tiny_flops, ops, "tiny_flops", "one add per op")
    equal(a.tiny_bytes, 8 * ops, "tiny_bytes", "each op reads and writes one fp32")
    equal(a.thin_flops, 2 * n * k * n, "thin_flops", f"2 n k n for n = {n}, k = {k}")
    equal(a.thin_bytes, (2 * n * k + n * n) * nbytes, "thin_bytes", f"read A (n x k) and B (k x n), write C (n x n); {ctx.dtype}")
    close(a.tiny_tflops, tflop_per_s(ops, _timing(a.tiny_time, "tiny_time")), "tiny_tflops", "from tiny_time", rel=1e-3)
    close(a.thin_tflops, tflop_per_s(2 * n * k * n, _timing(a.thin_time, "thin_time")), "thin_tflops", "from thin_time",
          rel=1e-3)
    want_i = intensities(n, nbytes)
    achieved = {}
    for name in KERNELS:
        i, achieved[name] = a.kernels[name]
        close(i, want_i[name], f"kernels[{name!r}] intensity", "its FLOPs over its bytes", rel=1e-3)
        positive(achieved[name], f"kernels[{name!r}] TFLOP/s")
    close(achieved["tiny_ops"], a.tiny_tflops, "kernels['tiny_ops'] TFLOP/s", "tiny_tflops", rel=1e-6)
    close(achieved["thin_matmul"], a.thin_tflops, "kernels['thin_matmul'] TFLOP/s", "thin_tflops", rel=1e-6)
    for roof in ROOFS:
        for v, what in zip(a.CEILINGS[roof], ("peak", "bandwidth"), strict=True):
            positive(v, f"CEILINGS[{roof!r}] {what}")
    sheet = datasheet_ceilings(ctx)
    want_sheet = sheet or tuple(a.CEILINGS["measured"])
    if any(abs(x - y) > 1e-6 * y for x, y in zip(a.CEILINGS["datasheet"], want_sheet, strict=True)):
        raise RuleFail(f"CEILINGS['datasheet'] = {a.CEILINGS['datasheet']}, expected {want_sheet}: "
                   + (f"the {ctx.spec.name} datasheet peak for {ctx.dtype} and its bandwidth" if sheet
                      else "with no datasheet row here, the measured ceilings"))
    roofs = {"datasheet": want_sheet, "measured": tuple(a.CEILINGS["measured"])}
    bad = []
    for roof in ROOFS:
        peak, bw = roofs[roof]
        for name in KERNELS:
            got = label(a.placements[roof][name], LABELS, f"placements[{roof!r}][{name!r}]")
            want = bound(want_i[name], peak, bw, achieved[name])
            if got != want:
                bad.append(f"placements[{roof!r}][{name!r}] = {got!r}, expected {want!r}: {want_i[name]:.3g} FLOP/B at "
                           f"{achieved[name]:.3g} TFLOP/s on the {roof} roofline ({peak:.4g} TFLOP/s, {bw:.4g} GB/s, "
                           f"ridge {ridge_point(peak, bw):.3g} FLOP/B)")
    if bad:
        raise RuleFail("; ".join(bad) + ". The rule: overhead below 10% of the roof at that intensity, else compute at "
                   "or above the ridge and memory below it")
    if sheet:
        for name in KERNELS:
            not_above(achieved[name], attainable_tflops(want_i[name], *sheet), f"kernels[{name!r}]", "TFLOP/s",
                      f"the {ctx.spec.name} datasheet roofline at {want_i[name]:.3g} FLOP/B")
    return [ref.against("matmul", a.CEILINGS["measured"][0], "CEILINGS['measured'] peak", "TFLOP/s"),
            ref.against("copy", a.CEILINGS["measured"][1], "CEILINGS['measured'] bandwidth", "GB/s"),
            ref.against("matmul", achieved["matmul"], "kernels['matmul']", "TFLOP/s"),
            ref.against("ew_tflops", achieved["elementwise"], "kernels['elementwise']", "TFLOP/s"),
            ref.against("thin", achieved["thin_matmul"], "kernels['thin_matmul']", "TFLOP/s"),
            ref.against("tiny", achieved["tiny_ops"], "kernels['tiny_ops']", "TFLOP/s")]


def _flops_per_token(sizes) -> float:
    return flops_per_token_from_config(preset_config(sizes.model), sizes.seq_len)


def _fp32_peaks(ctx) -> list[float]:
    """The datasheet peaks an fp32 training step may be measured against: plain fp32, and TF32 where
    the notebook turned it on."""
    return [p for p in (ctx.spec.fp32_tflops, ctx.spec.tf32_tflops) if p] if ctx.spec else []


def training(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    tr = a.train
    _timing(tr, "train")
    per_step = s.batch_size * s.seq_len
    if tr["tokens_per_s"] is None:
        raise RuleFail("train['tokens_per_s'] is None: give the Stopwatch tokens_per_step=TOKENS_PER_STEP")
    close(tr["tokens_per_s"], per_step * tr["steps"] / tr["total_s"], "train['tokens_per_s']",
          f"{per_step} tokens per step x its steps over its total_s", rel=1e-3)
    close(a.tokens_per_s, tr["tokens_per_s"], "tokens_per_s", "train['tokens_per_s']", rel=1e-9)
    if not a.monitor:
        raise RuleFail("the GpuMonitor recorded nothing: run the training loop inside `with GpuMonitor(...) as monitor:`")
    if a.monitor_s < 0.8 * tr["total_s"]:
        raise RuleFail(f"the monitor ran {a.monitor_s:.2f} s, shorter than the training ({tr['total_s']:.2f} s): start it "
                   "before the loop and stop it after")
    for dev, d in a.monitor.items():
        for key in ("util_gpu_pct", "util_mem_pct", "util_cpu_pct"):
            for stat in ("mean", "max"):
                v = (d.get(key) or {}).get(stat)
                if v is not None and not 0 <= v <= 100:
                    raise RuleFail(f"monitor {dev} {key} {stat} = {v:.4g}%: a utilization is between 0 and 100%")
        peak_mem, total = (d.get("mem_used_gib") or {}).get("max"), d.get("mem_total_gib")
        if peak_mem is not None and total and not 0 <= peak_mem <= total * 1.05:
            raise RuleFail(f"monitor {dev} mem_used_gib max = {peak_mem:.4g} GiB, but the device has {total:.4g} GiB")
    peaks = _fp32_peaks(ctx)
    if ctx.device == "cuda" and peaks:
        not_above(a.tokens_per_s * _flops_per_token(s) / 1e12, max(peaks), "tokens_per_s x FLOPs per token",
                  "TFLOP/s", f"the {ctx.spec.name} fp32 peak")
    return [ref.against("tokens_per_s", a.tokens_per_s, "tokens_per_s", "tokens/s")]


def limiter(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    batch, small = s.batch_size, max(1, s.batch_size // 4)
    equal(a.small_batch, small, "small_batch", "a quarter of the full batch")
    full, short = _timing(a.full_time, "full_time"), _timing(a.small_time, "small_time")
    r = batch_scaling(batch, full, small, short)
    close(a.batch_scaling, r, "batch_scaling", "tokens/s at the full batch over tokens/s at the small one", rel=1e-3)
    close(a.fixed_share, fixed_share(r, batch, small), "fixed_share", "(batch_scaling - 1) / (B / b - 1)", rel=1e-3,
          abs_tol=1e-9)
    close(a.step_tflops, tflop_per_s(_flops_per_token(s) * batch * s.seq_len, full), "step_tflops",
          "FLOPS_PER_TOKEN x TOKENS_PER_STEP over full_time's median", rel=1e-3)
    peak = positive(a.TRAIN_PEAK_TFLOPS, "TRAIN_PEAK_TFLOPS")
    close(a.mfu, a.step_tflops / peak, "mfu", "step_tflops / TRAIN_PEAK_TFLOPS", rel=1e-3)
    notes = []
    peaks = _fp32_peaks(ctx)
    if ctx.device == "cuda" and peaks:
        if not any(abs(peak - p) <= 1e-6 * p for p in peaks):
            raise RuleFail(f"TRAIN_PEAK_TFLOPS = {peak:.4g}, expected the {ctx.spec.name} fp32 or tf32 datasheet peak "
                       f"({', '.join(f'{p:g}' for p in peaks)})")
        not_above(a.mfu, 1.0, "mfu", "", "100% of the datasheet peak")
    else:
        notes.append(ref.against("matmul", peak, "TRAIN_PEAK_TFLOPS (your measured matmul)", "TFLOP/s"))
    if ref.step_bytes is not None:
        close(a.STEP_BYTES, ref.step_bytes, "STEP_BYTES", "the bytes one step's operations read and write, counted by "
              "utils.measure.step_traffic", rel=1e-3)
    else:
        least = 16 * non_embedding_params_from_config(preset_config(s.model))
        if a.STEP_BYTES < least:
            raise RuleFail(f"STEP_BYTES = {a.STEP_BYTES:.4g}, less than one step must move ({least:.4g}: the fp32 weights "
                       "read twice, their gradients written and the optimizer's update)")
    close(a.step_gbs, gb_per_s(a.STEP_BYTES, full), "step_gbs", "STEP_BYTES over full_time's median", rel=1e-3)
    bw = positive(a.TRAIN_PEAK_GBS, "TRAIN_PEAK_GBS")
    close(a.bandwidth_share, a.step_gbs / bw, "bandwidth_share", "step_gbs / TRAIN_PEAK_GBS", rel=1e-3)
    if ctx.device == "cuda" and ctx.spec and ctx.spec.bandwidth_gbs:
        close(bw, ctx.spec.bandwidth_gbs, "TRAIN_PEAK_GBS", f"the {ctx.spec.name} datasheet bandwidth")
    else:
        notes.append(ref.against("copy", bw, "TRAIN_PEAK_GBS (your measured copy)", "GB/s"))
    want = step_bound(a.fixed_share, a.mfu, a.bandwidth_share)
    if a.LIMITER != want:
        raise RuleFail(f"LIMITER = {a.LIMITER!r}, expected {want!r}: your fixed_share {a.fixed_share:.2f}, mfu {a.mfu:.2f} "
                   f"and bandwidth_share {a.bandwidth_share:.2f} give {want!r} by the rule (overhead above a 0.5 fixed "
                   "share or when neither share reaches 0.4; else the larger of MFU and the bandwidth share)")
    return [ref.against("batch_scaling", a.batch_scaling, "batch_scaling", "x"), *notes]


def sweep(a, ref):
    ctx = ref.ctx
    sms = ref.sm_count
    if sms is not None:
        equal(a.SM_COUNT, sms, "SM_COUNT", "this device's multi_processor_count")
    want = matmul_sweep.sweep_shapes(a.SM_COUNT, ctx.tier)
    if {k: tuple(v) for k, v in a.SWEEP_SHAPES.items()} != want:
        raise RuleFail(f"SWEEP_SHAPES is not the setup cell's sweep for {a.SM_COUNT} SMs: expected {want}")
    for name, d in (("sweep_time", a.sweep_time), ("sweep_tflops", a.sweep_tflops)):
        if set(d) != set(want):
            raise RuleFail(f"{name} must have one entry per label of SWEEP_SHAPES ({', '.join(want)})")
    for lab, (m, n, k) in want.items():
        close(a.sweep_tflops[lab], tflop_per_s(2 * m * n * k, _timing(a.sweep_time[lab], f"sweep_time[{lab!r}]")),
              f"sweep_tflops[{lab!r}]", "2 m n k over its sweep_time's median", rel=1e-3)
    best_label, best = matmul_sweep.best(a.sweep_tflops)
    close(a.MAX_ACHIEVABLE_TFLOPS, best, "MAX_ACHIEVABLE_TFLOPS", f"the fastest shape's rate ({best_label})", rel=1e-9)
    ceiling, what = ref.peak_tflops(ctx.dtype)
    not_above(a.MAX_ACHIEVABLE_TFLOPS, ceiling, "MAX_ACHIEVABLE_TFLOPS", "TFLOP/s", what)
    return [ref.against(f"sweep:{lab}", a.sweep_tflops[lab], f"sweep_tflops[{lab!r}]", "TFLOP/s") for lab in want]


CHECKS = [
    Check("test_intensity", intensity, calls={"arithmetic_intensity": intensity_cases}, forbid=FORMULAS),
    Check("test_rates", rates, calls={"achieved_tflops": rate_cases, "achieved_bandwidth_gbs": rate_cases},
          forbid=FORMULAS),
    Check("test_bound", classify, calls={"classify_bound": bound_cases}, forbid=FORMULAS),
    Check("test_matmul", matmul, measures=("matmul",)),
    Check("test_memory", memory, measures=("memory",)),
    Check("test_roofline", roofline, measures=("matmul", "memory", "thin", "tiny")),
    Check("test_training", training, measures=("train",)),
    Check("test_limiter", limiter, measures=("train", "step_bytes", "matmul", "memory")),
    Check("test_quantization", quantization, calls={"quantization": lambda rng, ctx: [
        [m, n, sms] for m, n, k, sms, b in quantization_shapes(rng, ctx)], "predict_slow": quantization_shapes},
        forbid=QUANTIZATION),
    Check("test_sweep", sweep, measures=("sweep",)),
]
