"""The checks the hidden tests of phase 0 (``00_foundations``) run.

Each ``check_*`` grades one measured cell. With a GPU here, or with no GPU record to grade,
it re-measures the same kernel with the grader's own timing, in the same kernel session,
and compares ("measured live"). With no GPU here but a GPU record from the learner, it
grades the record instead ("graded from record", :mod:`grader.phase0_records`).

The sizes, device and dtype come from ``utils.env`` here, not from the notebook's variables,
and the training step is checked against the locked cell that defines it: a learner who
rebinds ``SIZES``, ``n`` or ``train_step`` gets numbers the grader does not reproduce.

Hidden tests get this module from ``grader.phase(0)``: loaded afresh from its file with fresh
copies of ``checks.py`` and ``phase0_records.py`` (``grader/__init__.py``), so a notebook that
rebinds ``checks`` or patches grader functions cannot change what grades it. Patched clocks
and ``utils`` are caught by :func:`grader.checks.assert_untampered`.
"""
from __future__ import annotations

from typing import Any

# grader.phase(0) rebinds these to fresh copies: use them at call time only
from grader import checks, remeasure
from grader import phase0_records as records
from utils import flops
from utils.step_traffic import count_bytes
from utils.units import gb_per_s, tflop_per_s

PHASE = "00_foundations"
LABELS = records.LABELS
CPU_TFLOPS_CAP = 50.0  # estimate: no CPU socket comes near 50 fp32 TFLOP/s, so a CPU figure above it is invented
ATTEMPTS = 3  # a reference that misses the band is timed again: a busy core or a clock dip spoils one run, not three


# -- what the grader expects ------------------------------------------------------------------

def setting() -> tuple[Any, str, Any]:
    """``(sizes, device, matmul dtype)`` as the notebook's setup cells choose them."""
    return remeasure.setting(PHASE)


def _begin(what: str) -> str:
    return checks.begin(what, "re-timed by the grader in this run")


# -- the grader's own measurements ----------------------------------------------------------

def measure_memory(numel: int, device) -> dict:
    import torch

    x = torch.randn(numel, device=device)
    out = torch.empty_like(x)
    ct = checks.timed(lambda: out.copy_(x))
    et = checks.timed(lambda: torch.add(x, 1.0, out=out))
    return {"copy_time": ct, "copy_gbs": gb_per_s(8 * numel, ct.median_ms), "ew_time": et,
            "ew_gbs": gb_per_s(8 * numel, et.median_ms), "ew_tflops": tflop_per_s(numel, et.median_ms)}


def _tiny_loop(t, k: int):
    for _ in range(k):
        t = t + 1
    return t


def measure_tiny(ops: int, device) -> dict:
    import torch

    t = checks.timed(_tiny_loop, torch.zeros(1, device=device), ops)
    return {"time": t, "tflops": tflop_per_s(ops, t.median_ms)}


# -- 1. the matmul --------------------------------------------------------------------------

def check_matmul(matmul_tflops, matmul_time, matmul_flops, matmul_bytes, achieved_tflops) -> None:
    """Exact FLOP and byte counts; TFLOP/s from the learner's own timing and function, within
    a band of the grader's re-measurement, below the datasheet peak."""
    if _begin("the matmul") == checks.RECORD:
        return records.matmul(achieved_tflops)
    checks.assert_untampered()
    sizes, device, dtype = setting()
    n = sizes.matmul_n
    checks.assert_close(matmul_flops, 2 * n**3, f"matmul_flops (2 n^3 for n = {n})")
    checks.assert_close(matmul_bytes, 3 * n * n * records.dtype_bytes(dtype), f"matmul_bytes (read A and B, write C; {checks.dtype_name(dtype)})")
    med = checks.median(matmul_time, "matmul_time")
    with checks.quiet():
        mine = achieved_tflops(float(matmul_flops), med)
    checks.assert_close(mine, tflop_per_s(2 * n**3, med), "achieved_tflops(matmul_flops, matmul_time.median_ms)", rel=1e-3)
    checks.assert_close(matmul_tflops, mine, "matmul_tflops (from your matmul_time)", rel=1e-3)
    spec = remeasure.gpu_spec()
    if device == "cuda":
        checks.assert_not_above(matmul_tflops, spec and spec.peak_tflops(checks.dtype_name(dtype)), "matmul_tflops", "TFLOP/s",
                                f"the {spec.name if spec else 'GPU'} datasheet peak")
    else:
        checks.assert_not_above(matmul_tflops, CPU_TFLOPS_CAP, "matmul_tflops", "TFLOP/s", "what any CPU can do (an estimate)")

    def compare():
        ref = remeasure.matmul(n, dtype, device)
        rel = checks.band(ref["time"], matmul_time)
        checks.assert_in_band(matmul_tflops, ref["tflops"], rel, "matmul_tflops", "TFLOP/s")
        checks.say_versus(f"{n}^3 {checks.dtype_name(dtype)} matmul", ref["tflops"], matmul_tflops, "TFLOP/s", rel)

    remeasure.agree(compare, ATTEMPTS)


# -- 2. copy and x + 1: the memory roof -------------------------------------------------------

def check_memory(copy_gbs, copy_time, ew_gbs, ew_tflops, ew_time, ew_flops, ew_bytes,
                 achieved_bandwidth_gbs, achieved_tflops) -> None:
    """Exact counts; rates from the learner's timings and functions, within a band of the
    grader's re-measurement, below the datasheet bandwidth."""
    if _begin("copy and x + 1") == checks.RECORD:
        return records.memory(achieved_bandwidth_gbs, achieved_tflops)
    checks.assert_untampered()
    sizes, device, _ = setting()
    numel = sizes.elementwise_numel
    checks.assert_close(ew_flops, numel, "ew_flops (one add per element)")
    checks.assert_close(ew_bytes, 8 * numel, "ew_bytes (read x, write out: 4 + 4 bytes per fp32 element)")
    cmed, emed = checks.median(copy_time, "copy_time"), checks.median(ew_time, "ew_time")
    with checks.quiet():
        c_mine = achieved_bandwidth_gbs(float(8 * numel), cmed)
        e_mine = achieved_bandwidth_gbs(float(ew_bytes), emed)
        t_mine = achieved_tflops(float(ew_flops), emed)
    checks.assert_close(c_mine, gb_per_s(8 * numel, cmed), "achieved_bandwidth_gbs(copy bytes, copy_time.median_ms)", rel=1e-3)
    checks.assert_close(copy_gbs, c_mine, "copy_gbs (from your copy_time)", rel=1e-3)
    checks.assert_close(ew_gbs, e_mine, "ew_gbs (from your ew_time)", rel=1e-3)
    checks.assert_close(ew_tflops, t_mine, "ew_tflops (from your ew_time)", rel=1e-3)
    spec = remeasure.gpu_spec()
    if device == "cuda" and spec:
        for name, v in (("copy_gbs", copy_gbs), ("ew_gbs", ew_gbs)):
            checks.assert_not_above(v, spec.bandwidth_gbs, name, "GB/s", f"the {spec.name} datasheet bandwidth")

    def compare():
        ref = measure_memory(numel, device)
        rel = checks.band(ref["copy_time"], ref["ew_time"], copy_time, ew_time)
        checks.assert_in_band(copy_gbs, ref["copy_gbs"], rel, "copy_gbs", "GB/s")
        checks.assert_in_band(ew_gbs, ref["ew_gbs"], rel, "ew_gbs", "GB/s")
        checks.say_versus("copy", ref["copy_gbs"], copy_gbs, "GB/s", rel)
        checks.say_versus("x + 1", ref["ew_gbs"], ew_gbs, "GB/s", rel)

    remeasure.agree(compare, ATTEMPTS)


# -- 3. tiny ops, a thin matmul and the placements on two rooflines ----------------------------

def measure_thin(n: int, k: int, dtype, device) -> dict:
    """The thin ``(n x k) @ (k x n)`` matmul timed: its timing and TFLOP/s (``2 n k n`` FLOPs)."""
    import torch

    a = torch.randn(n, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    t = checks.timed(lambda: a @ b)
    return {"time": t, "tflops": tflop_per_s(2 * n * k * n, t.median_ms)}


def _kernels(kernels, intensity: dict) -> dict:
    """``{kernel: achieved TFLOP/s}`` from the notebook's ``kernels``, after checking each
    intensity is the one the exact counts give."""
    if not isinstance(kernels, dict) or set(kernels) != set(records.KERNELS):
        raise AssertionError(f"kernels must be a dict with the keys {', '.join(map(repr, records.KERNELS))}")
    out = {}
    for name in records.KERNELS:
        row = kernels[name]
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise AssertionError(f"kernels[{name!r}] must be (intensity in FLOP/byte, achieved TFLOP/s)")
        i, out[name] = (checks.as_number(v, f"kernels[{name!r}]") for v in row)
        checks.assert_close(i, intensity[name], f"kernels[{name!r}] intensity (its FLOPs / bytes)", rel=1e-3)
        checks.assert_positive(out[name], f"kernels[{name!r}] achieved TFLOP/s")
    return out


def _ceilings(ceilings, datasheet: tuple[float, float] | None, what: str) -> dict:
    """``{roof: (peak TFLOP/s, GB/s)}`` from the notebook's ``CEILINGS``: the datasheet row's
    figures where there is one, else the measured ceilings again."""
    if not isinstance(ceilings, dict) or set(ceilings) != set(records.ROOFS):
        raise AssertionError(f"CEILINGS must be a dict with the keys {', '.join(map(repr, records.ROOFS))}")
    out = {}
    for roof in records.ROOFS:
        row = ceilings[roof]
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise AssertionError(f"CEILINGS[{roof!r}] must be (peak TFLOP/s, bandwidth GB/s)")
        out[roof] = tuple(checks.assert_positive(v, f"CEILINGS[{roof!r}]") for v in row)
    want = datasheet or out["measured"]
    if any(abs(a - b) > 1e-6 * b for a, b in zip(out["datasheet"], want, strict=True)):
        raise AssertionError(f"CEILINGS['datasheet'] = {out['datasheet']}, but {what} gives {want}")
    return out


def check_roofline(placements, kernels, ceilings, tiny_tflops, tiny_time, tiny_flops, tiny_bytes,
                   thin_tflops, thin_time, thin_flops, thin_bytes) -> None:
    """Exact counts; every kernel's rate and the measured ceilings within a band of the grader's
    re-measurement; the datasheet ceilings the spec row's; each of the eight placements the
    rule (``utils.flops.bound``) on those numbers.

    The placements are judged on the learner's own numbers once they are shown to be genuine,
    not on the grader's second measurement: a kernel near a ridge may fall either side from one
    run to the next, and the learner is graded on the run they placed. So every wrong label
    fails, whatever the noise. Nothing may be above the datasheet roofline."""
    if _begin("the roofline placements") == checks.RECORD:
        return records.roofline()
    checks.assert_untampered()
    from utils.flops import attainable_tflops, bound

    sizes, device, dtype = setting()
    n, ops, k, nbytes = sizes.matmul_n, sizes.tiny_ops, records.thin_k(sizes.matmul_n), records.dtype_bytes(dtype)
    checks.assert_close(tiny_flops, ops, "tiny_flops (one add per op)")
    checks.assert_close(tiny_bytes, 8 * ops, "tiny_bytes (each op reads and writes one fp32)")
    checks.assert_close(thin_flops, 2 * n * k * n, f"thin_flops (2 n k n for n = {n}, k = {k})")
    checks.assert_close(thin_bytes, (2 * n * k + n * n) * nbytes,
                        f"thin_bytes (read A, n x k, and B, k x n, write C, n x n; {checks.dtype_name(dtype)})")
    tmed, hmed = checks.median(tiny_time, "tiny_time"), checks.median(thin_time, "thin_time")
    checks.assert_close(tiny_tflops, tflop_per_s(ops, tmed), "tiny_tflops (from your tiny_time)", rel=1e-3)
    checks.assert_close(thin_tflops, tflop_per_s(2 * n * k * n, hmed), "thin_tflops (from your thin_time)", rel=1e-3)
    intensity = records.intensities(n, nbytes)
    achieved = _kernels(kernels, intensity)
    spec = remeasure.gpu_spec()
    datasheet = records.datasheet_ceilings(spec, dtype) if device == "cuda" else None
    roofs = _ceilings(ceilings, datasheet, f"the {spec.name} datasheet" if datasheet else
                      "this device, which has no datasheet row (the measured ceilings stand in),")
    bad = records.misplaced(placements, intensity, achieved, roofs)
    if bad:
        raise AssertionError("; ".join(bad))
    if datasheet:
        for name in records.KERNELS:
            checks.assert_not_above(achieved[name], attainable_tflops(intensity[name], *datasheet), f"kernels[{name!r}]",
                                    "TFLOP/s", f"the {spec.name} datasheet roofline at {intensity[name]:.3g} FLOP/B")

    def compare():
        mm, mem = remeasure.matmul(n, dtype, device), measure_memory(sizes.elementwise_numel, device)
        thin, tiny = measure_thin(n, k, dtype, device), measure_tiny(ops, device)
        rel = checks.band(mm["time"], mem["copy_time"], mem["ew_time"])
        peak, bw = roofs["measured"]
        checks.assert_in_band(peak, mm["tflops"], rel, "CEILINGS['measured'] peak (your measured matmul)", "TFLOP/s")
        checks.assert_in_band(bw, mem["copy_gbs"], rel, "CEILINGS['measured'] bandwidth (your measured copy)", "GB/s")
        checks.assert_in_band(achieved["matmul"], mm["tflops"], rel, "kernels['matmul'] TFLOP/s", "TFLOP/s")
        checks.assert_in_band(achieved["elementwise"], mem["ew_tflops"], rel, "kernels['elementwise'] TFLOP/s", "TFLOP/s")
        thin_rel = checks.band(thin["time"], thin_time)
        checks.assert_in_band(achieved["thin_matmul"], thin["tflops"], thin_rel, "kernels['thin_matmul'] TFLOP/s", "TFLOP/s")
        tiny_rel = checks.band(tiny["time"], tiny_time, floor=None if checks.smoke() else 1.0)  # launch costs vary
        checks.assert_in_band(achieved["tiny_ops"], tiny["tflops"], tiny_rel, "kernels['tiny_ops'] TFLOP/s", "TFLOP/s")
        checks.say_versus(f"thin {n} x {k} x {n} matmul", thin["tflops"], achieved["thin_matmul"], "TFLOP/s", thin_rel)
        checks.say_versus("tiny ops", tiny["tflops"], achieved["tiny_ops"], "TFLOP/s", tiny_rel)
        grader_roofs = {"datasheet": datasheet or (mm["tflops"], mem["copy_gbs"]), "measured": (mm["tflops"], mem["copy_gbs"])}
        rates = {"matmul": mm["tflops"], "thin_matmul": thin["tflops"], "elementwise": mem["ew_tflops"], "tiny_ops": tiny["tflops"]}
        for roof, (p, b) in grader_roofs.items():
            mine = {name: bound(intensity[name], p, b, rates[name]) for name in records.KERNELS}
            checks.say(f"  {roof} roofline: yours {placements[roof]}; on the grader's numbers {mine}")

    remeasure.agree(compare, ATTEMPTS)


# -- 4. the monitored training run -----------------------------------------------------------

def _train_step_is_the_given_one(train_step) -> None:
    """``train_step`` must run the code of the locked cell that defines it, on the preset's model."""
    from utils.flops import count_params, non_embedding_params_from_config
    from utils.models import preset_config

    checks.assert_given(train_step, PHASE, "train_setup", "train_step")
    sizes = setting()[0]
    model = getattr(train_step, "__globals__", {}).get("model")
    want = non_embedding_params_from_config(preset_config(sizes.model))
    if model is None or count_params(model) != want:
        raise AssertionError(f"the model train_step trains is not {sizes.model} ({want:,} non-embedding parameters)")


def _step_plausible(tokens_per_s: float, device: str, sizes) -> None:
    """Throughput x FLOPs per token may not beat the fp32 peak (datasheet on a GPU; on a CPU
    twice a matmul the grader times now, as no CPU has a datasheet here)."""
    from utils.flops import flops_per_token_from_config
    from utils.models import preset_config

    with checks.quiet():
        fpt = flops_per_token_from_config(preset_config(sizes.model), sizes.seq_len)
    import torch

    spec = remeasure.gpu_spec()
    if device == "cuda" and spec:
        peak, what = spec.peak_tflops("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"), f"the {spec.name} fp32 peak"
    else:
        import torch as _t

        peak, what = 2 * remeasure.matmul(sizes.matmul_n, _t.float32, device)["tflops"], "twice this CPU's measured matmul"
    checks.assert_not_above(tokens_per_s * fpt / 1e12, peak, "tokens_per_s x FLOPs per token", "TFLOP/s", what)


def check_training(tokens_per_s, train, monitor, train_step, x, y) -> None:
    """Throughput from the learner's Stopwatch, within a band of the grader's timing of the
    given step; the monitor covered the run and reads plausibly."""
    if _begin("the training run") == checks.RECORD:
        return records.training()
    checks.assert_untampered()
    sizes, device, _ = setting()
    _train_step_is_the_given_one(train_step)
    if tuple(x.shape) != (sizes.batch_size, sizes.seq_len):
        raise AssertionError(f"the batch has shape {tuple(x.shape)}, expected {(sizes.batch_size, sizes.seq_len)}")
    tps = checks.assert_positive(tokens_per_s, "tokens_per_s")
    if not isinstance(train, dict) or not {"tokens_per_s", "total_s", "median_ms", "p20_ms", "p80_ms"} <= set(train):
        raise AssertionError("train must be the dict from stopwatch.summary()")
    checks.assert_close(tps, checks.as_number(train["tokens_per_s"], "train['tokens_per_s']"), "tokens_per_s vs stopwatch.summary()")
    _step_plausible(tps, device, sizes)
    summary = monitor.summary()
    if not summary:
        raise AssertionError("the GpuMonitor recorded nothing: run the training loop inside `with GpuMonitor(...)`")
    if monitor.duration_s < 0.8 * checks.as_number(train["total_s"], "train['total_s']"):
        raise AssertionError(f"the monitor ran {monitor.duration_s:.2f} s, shorter than the training "
                             f"({train['total_s']:.2f} s): start it before the loop and stop it after")
    for dev, s in summary.items():
        for key in ("util_gpu_pct", "util_mem_pct", "util_cpu_pct"):
            if isinstance(s.get(key), dict):
                checks.assert_utilization([s[key].get("mean"), s[key].get("max")], f"{dev} {key}")
        if isinstance(s.get("mem_used_gib"), dict):
            checks.assert_memory(s["mem_used_gib"].get("max"), s.get("mem_total_gib"), f"{dev} mem_used_gib max")
    tokens_per_step = sizes.batch_size * sizes.seq_len

    def compare():
        ref = checks.timed(train_step, x, y, warmup=1, max_runs=10, budget_s=5.0)
        ref_tps = tokens_per_step / ref.median_ms * 1e3
        rel = checks.band(ref, checks.Times(train))
        checks.assert_in_band(tps, ref_tps, rel, "tokens_per_s", "tokens/s")
        checks.say_versus("training step", ref_tps, tps, "tokens/s", rel)

    remeasure.agree(compare, ATTEMPTS)


# -- 5. what limits the step ----------------------------------------------------------------

def check_limiter(limiter, batch_scaling, fixed_share, step_tflops, mfu, full_time, small_time, train_step, x, y,
                  small_batch, peak_tflops, step_bytes, step_gbs, bandwidth_share, peak_gbs) -> None:
    """The batch-size experiment, MFU and the step's bandwidth recomputed from the learner's timings,
    the step's bytes counted again by the grader, the scaling (and on a CPU both ceilings) within a
    band of the grader's, the limiter the rule's answer on those numbers."""
    if _begin("the batch-size experiment and MFU") == checks.RECORD:
        return records.limiter()
    checks.assert_untampered()
    from utils.flops import flops_per_token_from_config
    from utils.models import preset_config

    sizes, device, _ = setting()
    _train_step_is_the_given_one(train_step)
    batch = sizes.batch_size
    if small_batch != max(1, batch // 4) or tuple(x.shape) != (batch, sizes.seq_len):
        raise AssertionError(f"expected batches of {batch} and {max(1, batch // 4)} x {sizes.seq_len} tokens")
    with checks.quiet():
        fpt = flops_per_token_from_config(preset_config(sizes.model), sizes.seq_len)
    checks.as_label(limiter, LABELS, "LIMITER")
    full, small = checks.median(full_time, "full_time"), checks.median(small_time, "small_time")
    r = flops.batch_scaling(batch, full, small_batch, small)
    checks.assert_close(batch_scaling, r, "batch_scaling (tokens/s at the full batch over at the small one)", rel=1e-3)
    checks.assert_close(fixed_share, flops.fixed_share(r, batch, small_batch), "fixed_share", rel=1e-3, abs_tol=1e-9)
    checks.assert_close(step_tflops, tflop_per_s(fpt * batch * sizes.seq_len, full), "step_tflops", rel=1e-3)
    peak = checks.assert_positive(peak_tflops, "TRAIN_PEAK_TFLOPS")
    checks.assert_close(mfu, step_tflops / peak, "mfu (step_tflops / TRAIN_PEAK_TFLOPS)", rel=1e-3)
    spec = remeasure.gpu_spec()
    if device == "cuda" and spec and spec.fp32_tflops:
        allowed = [p for p in (spec.fp32_tflops, spec.tf32_tflops) if p]
        if not any(abs(peak - p) <= 1e-6 * p for p in allowed):
            raise AssertionError(f"TRAIN_PEAK_TFLOPS = {peak}, not the {spec.name} fp32/tf32 datasheet peak {allowed}")
        checks.assert_not_above(mfu, 1.0, "mfu", "", "100% of the datasheet peak")
    with checks.quiet():
        counted = count_bytes(train_step, x, y).bytes
    checks.assert_close(step_bytes, counted, "STEP_BYTES (the bytes one step's operations read and write)", rel=1e-3)
    checks.assert_close(step_gbs, gb_per_s(step_bytes, full), "step_gbs (STEP_BYTES over full_time)", rel=1e-3)
    bw = checks.assert_positive(peak_gbs, "TRAIN_PEAK_GBS")
    checks.assert_close(bandwidth_share, step_gbs / bw, "bandwidth_share (step_gbs / TRAIN_PEAK_GBS)", rel=1e-3)
    if device == "cuda" and spec and spec.bandwidth_gbs:
        checks.assert_close(bw, spec.bandwidth_gbs, f"TRAIN_PEAK_GBS (the {spec.name} datasheet bandwidth)")
    expected = flops.step_bound(fixed_share, mfu, bandwidth_share)
    if limiter != expected:
        raise AssertionError(f"LIMITER = {limiter!r}, but your numbers (fixed_share {fixed_share:.2f}, mfu {mfu:.2f}, "
                             f"bandwidth_share {bandwidth_share:.2f}) give {expected!r} by the rule in the text")

    def compare():
        ref_full = checks.timed(train_step, x, y, warmup=1, max_runs=10, budget_s=5.0)
        ref_small = checks.timed(train_step, x[:small_batch], y[:small_batch], warmup=1, max_runs=10, budget_s=5.0)
        ref_r = flops.batch_scaling(batch, ref_full.median_ms, small_batch, ref_small.median_ms)
        rel = checks.band(ref_full, ref_small, full_time, small_time)
        checks.assert_in_band(batch_scaling, ref_r, rel, "batch_scaling", "x")
        if device != "cuda":  # no datasheet on a CPU: the ceilings must be a matmul and a copy measured here
            ref_peak = remeasure.matmul(sizes.matmul_n, setting()[2], device)
            checks.assert_in_band(peak, ref_peak["tflops"], checks.band(ref_peak["time"]), "TRAIN_PEAK_TFLOPS", "TFLOP/s")
            ref_bw = measure_memory(sizes.elementwise_numel, device)
            checks.assert_in_band(bw, ref_bw["copy_gbs"], checks.band(ref_bw["copy_time"]), "TRAIN_PEAK_GBS", "GB/s")
        checks.say_versus("batch scaling", ref_r, batch_scaling, "x", rel)

    remeasure.agree(compare, ATTEMPTS)


# -- 6. the matmul sweep: tiles, waves and the most this device reaches -----------------------

# shapes and SM counts the notebook does not show: cards from 7 to 142 SMs, outputs one wave
# exactly, one tile past it and half a wave; tiles cut by multiples of 64, 8 and odd sizes; useful
# fractions on both sides of the 0.8 threshold; k alone misaligned; fp32 (4 bytes) as well as 16-bit
QUANT_CASES = (
    (128 * 108, 128, 4096, 108, 2), (128 * 109, 128, 4096, 108, 2), (128 * 54, 128, 4096, 108, 2),
    (128 * 114, 256, 2048, 114, 2), (128 * 115, 256, 2048, 114, 2), (128 * 142 * 3, 128, 1024, 142, 2),
    (4096, 4160, 4096, 56, 2), (4096, 4104, 4096, 56, 2), (6000, 6000, 6000, 58, 2), (4096, 4096, 4100, 80, 2),
    (4096, 4096, 4100, 80, 4), (4100, 4096, 4096, 80, 4), (4097, 4096, 4096, 80, 4), (1024, 1024, 1024, 7, 2),
    (1000, 1000, 1000, 7, 2), (896, 1152, 512, 72, 2), (640, 640, 640, 40, 4), (128 * 40 + 64, 128, 512, 40, 2),
    (2048, 9000, 1024, 142, 2), (24, 40, 8, 1, 2),
)


def check_quantization(quantization, predict_slow) -> None:
    """Pure, always live: the learner's ``quantization(m, n, sm_count)`` gives the tiles, waves and
    useful fraction of ``utils.matmul_sweep``, and ``predict_slow(m, n, k, sm_count, dtype_bytes)``
    its rule, on :data:`QUANT_CASES`."""
    from utils import matmul_sweep as ms

    checks.say("quantization and predict_slow against the tile and wave arithmetic on shapes the notebook does not show")
    for m, n, k, sms, nbytes in QUANT_CASES:
        want = ms.quantization(m, n, k, sms, nbytes)
        got = checks.call(quantization, m, n, sms, name="quantization")
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise AssertionError(f"quantization({m}, {n}, {sms}) must return (tiles, waves, useful_fraction), got {got!r:.80}")
        tiles, waves, frac = (checks.as_number(v, f"quantization({m}, {n}, {sms})") for v in got)
        if (tiles, waves) != (want.tiles, want.waves):
            raise AssertionError(f"quantization({m}, {n}, {sms}) gives {tiles:g} tiles in {waves:g} waves, "
                                 f"expected {want.tiles} tiles in {want.waves} waves (128 x 128 tiles)")
        checks.assert_close(frac, want.useful_fraction, f"quantization({m}, {n}, {sms}) useful fraction", rel=1e-9)
        slow = checks.call(predict_slow, m, n, k, sms, nbytes, name="predict_slow")
        if type(slow).__name__ not in ("bool", "bool_") or bool(slow) != want.slow:
            raise AssertionError(f"predict_slow({m}, {n}, {k}, {sms}, {nbytes}) = {slow!r:.40}, expected {want.slow} "
                                 f"(useful fraction {want.useful_fraction:.3f}, aligned {want.aligned})")


def hidden_shapes(shapes: dict) -> list[tuple[int, int, int]]:
    """The shape the learner's ``time_matmul`` is run on again, not among the sweep's: a rectangle
    near the sweep's square side, its three dimensions different (one timing, so that a loaded
    machine has one chance to spoil it, not two)."""
    s = shapes["square, multiple of 128"][0]
    return [(s + 64, s // 2, s)]


def time_shape(m: int, n: int, k: int, dtype, device) -> dict:
    """The grader's own timing of an ``(m x k) @ (k x n)`` matmul and its TFLOP/s."""
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    t = checks.timed(lambda: a @ b)
    return {"time": t, "tflops": tflop_per_s(2 * m * n * k, t.median_ms)}


def check_sweep(time_matmul, sweep_time, sweep_tflops, max_tflops, shapes, sm_count, achieved_tflops) -> None:
    """The setup's shapes and this device's SM count; every rate from its timing through the
    learner's ``achieved_tflops``; ``MAX_ACHIEVABLE_TFLOPS`` the fastest; below the datasheet peak;
    the best shape re-timed by the grader and the learner's ``time_matmul`` run again on a shape
    the notebook does not sweep, each within a band of the grader's timing."""
    if _begin("the matmul sweep") == checks.RECORD:
        return records.sweep(achieved_tflops)
    checks.assert_untampered()
    from utils import matmul_sweep as ms
    from utils.env import device_tier

    _, device, dtype = setting()
    sms = ms.sm_count()
    want = ms.sweep_shapes(sms, device_tier())
    checks.assert_close(sm_count, sms, "SM_COUNT (this device's multi_processor_count)")
    if not isinstance(shapes, dict) or {k: tuple(v) for k, v in shapes.items()} != want:
        raise AssertionError(f"SWEEP_SHAPES is not the setup cell's sweep for {sms} SMs: {want}")
    for name, d in (("sweep_time", sweep_time), ("sweep_tflops", sweep_tflops)):
        if not isinstance(d, dict) or set(d) != set(want):
            raise AssertionError(f"{name} must be a dict with one entry per label of SWEEP_SHAPES")
    rates = {}
    for label, (m, n, k) in want.items():
        med = checks.median(sweep_time[label], f"sweep_time[{label!r}]")
        with checks.quiet():
            mine = achieved_tflops(float(2 * m * n * k), med)
        checks.assert_close(mine, tflop_per_s(2 * m * n * k, med), f"achieved_tflops on {label} ({m} x {n} x {k})", rel=1e-3)
        checks.assert_close(sweep_tflops[label], mine, f"sweep_tflops[{label!r}] (from its sweep_time)", rel=1e-3)
        rates[label] = mine
    best_label, best_tflops = ms.best(rates)
    checks.assert_close(max_tflops, best_tflops, f"MAX_ACHIEVABLE_TFLOPS (the fastest shape, {best_label})", rel=1e-3)
    spec = remeasure.gpu_spec()
    if device == "cuda":
        checks.assert_not_above(max_tflops, spec and spec.peak_tflops(checks.dtype_name(dtype)), "MAX_ACHIEVABLE_TFLOPS",
                                "TFLOP/s", f"the {spec.name if spec else 'GPU'} datasheet peak")
    else:
        checks.assert_not_above(max_tflops, CPU_TFLOPS_CAP, "MAX_ACHIEVABLE_TFLOPS", "TFLOP/s", "what any CPU can do (an estimate)")

    def compare():
        m, n, k = want[best_label]
        ref = time_shape(m, n, k, dtype, device)
        rel = checks.band(ref["time"], sweep_time[best_label])
        checks.assert_in_band(max_tflops, ref["tflops"], rel, "MAX_ACHIEVABLE_TFLOPS", "TFLOP/s")
        checks.say_versus(f"the best shape, {best_label} ({m} x {n} x {k})", ref["tflops"], max_tflops, "TFLOP/s", rel)
        for m, n, k in hidden_shapes(want):
            theirs = checks.call(time_matmul, m, n, k, name="time_matmul")
            yours = tflop_per_s(2 * m * n * k, checks.median(theirs, f"time_matmul({m}, {n}, {k})"))
            ref = time_shape(m, n, k, dtype, device)
            rel = checks.band(ref["time"], theirs)
            checks.assert_in_band(yours, ref["tflops"], rel, f"time_matmul({m}, {n}, {k}) as TFLOP/s", "TFLOP/s")
            checks.say_versus(f"time_matmul({m}, {n}, {k})", ref["tflops"], yours, "TFLOP/s", rel)

    remeasure.agree(compare, ATTEMPTS)
