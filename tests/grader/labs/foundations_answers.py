"""Consistent lab-00 answers for any sizes and card, as the notebook's export sends them: for the
judges' tests (tests/grader/labs/test_foundations.py) and to forge a record (tests/grader/test_attacks.py)."""
from __future__ import annotations

from grader.labs.foundations import judges, reference
from grader.labs.foundations.answers import KERNELS, ROOFS
from grader.measuring import Measured
from utils.measure import matmul_sweep
from utils.measure.flops import bound, step_bound
from utils.units import gb_per_s, tflop_per_s

# rates a CPU might measure in smoke mode (TFLOP/s, GB/s, tokens/s)
CPU_RATES = {"matmul": 0.1, "copy": 20.0, "ew": 18.0, "thin": 0.05, "tiny": 1e-7, "tokens_per_s": 5000.0, "sweep": 0.1}


def timing(ms: float) -> dict:
    return {"median_ms": ms, "p20_ms": 0.9 * ms, "p80_ms": 1.1 * ms, "runs": 10, "method": "perf_counter"}


def sm_count(ctx) -> int:
    return matmul_sweep.SM_COUNTS[ctx.spec.name] if ctx.spec else matmul_sweep.CPU_STAND_IN_SMS


def ref(ctx, rates: dict = CPU_RATES, step_bytes: int = 10**7) -> reference.Reference:
    """The grader's measurement equal to ``rates`` (band +-150%, the smoke floor)."""
    m = {"matmul": rates["matmul"], "copy": rates["copy"], "ew_gbs": rates["ew"], "ew_tflops": rates["ew"] / 8e3,
         "thin": rates["thin"], "tiny": rates["tiny"], "tokens_per_s": rates["tokens_per_s"], "batch_scaling": 1.5}
    measured = {k: Measured(v, 1.5, "test") for k, v in m.items()}
    shapes = matmul_sweep.sweep_shapes(sm_count(ctx), ctx.tier)
    measured.update({f"sweep:{k}": Measured(rates["sweep"], 1.5, "test") for k in shapes})
    return reference.Reference(ctx, measured, step_bytes=step_bytes, sm_count=sm_count(ctx))


def answers(ctx, rates: dict = CPU_RATES, step_bytes: int = 10**7) -> dict[str, dict]:
    """Consistent right answers of every measured cell for ``ctx``'s sizes, card and ``rates``."""
    s = ctx.sizes
    n, numel, ops = s.matmul_n, s.elementwise_numel, s.tiny_ops
    nbytes = 2 if ctx.dtype in ("float16", "bfloat16") else 4
    k = n // 32
    mm_ms = 2 * n**3 / (rates["matmul"] * 1e9)
    copy_ms, ew_ms = 8 * numel / (rates["copy"] * 1e6), 8 * numel / (rates["ew"] * 1e6)
    thin_ms, tiny_ms = 2 * n * k * n / (rates["thin"] * 1e9), ops / (rates["tiny"] * 1e9)
    out = {
        "test_matmul": dict(matmul_tflops=tflop_per_s(2 * n**3, mm_ms), matmul_time=timing(mm_ms), matmul_flops=2 * n**3,
                            matmul_bytes=3 * n * n * nbytes),
        "test_memory": dict(copy_gbs=gb_per_s(8 * numel, copy_ms), copy_time=timing(copy_ms),
                            ew_gbs=gb_per_s(8 * numel, ew_ms), ew_tflops=tflop_per_s(numel, ew_ms), ew_time=timing(ew_ms),
                            ew_flops=numel, ew_bytes=8 * numel),
    }
    intensity = judges.intensities(n, nbytes)
    achieved = {"matmul": out["test_matmul"]["matmul_tflops"], "thin_matmul": tflop_per_s(2 * n * k * n, thin_ms),
                "elementwise": out["test_memory"]["ew_tflops"], "tiny_ops": tflop_per_s(ops, tiny_ms)}
    measured_roof = (out["test_matmul"]["matmul_tflops"], out["test_memory"]["copy_gbs"])
    roofs = {"datasheet": judges.datasheet_ceilings(ctx) or measured_roof, "measured": measured_roof}
    out["test_roofline"] = dict(
        placements={r: {kk: bound(intensity[kk], *roofs[r], achieved[kk]) for kk in KERNELS} for r in ROOFS},
        kernels={kk: (intensity[kk], achieved[kk]) for kk in KERNELS}, CEILINGS=roofs,
        tiny_tflops=achieved["tiny_ops"], tiny_time=timing(tiny_ms), tiny_flops=ops, tiny_bytes=8 * ops,
        thin_tflops=achieved["thin_matmul"], thin_time=timing(thin_ms), thin_flops=2 * n * k * n,
        thin_bytes=(2 * n * k + n * n) * nbytes)
    steps, per_step = 6, s.batch_size * s.seq_len
    total_s = steps * per_step / rates["tokens_per_s"]
    out["test_training"] = dict(
        tokens_per_s=rates["tokens_per_s"], monitor_s=total_s * 1.2,
        train={"method": "perf_counter", "steps": steps, "median_ms": 1e3 * total_s / steps, "p20_ms": 1.0,
               "p80_ms": 1e4, "total_s": total_s, "tokens_per_s": rates["tokens_per_s"]},
        monitor={"cpu": {"duration_s": total_s * 1.2, "samples": 5, "util_cpu_pct": {"mean": 50.0, "max": 99.0},
                         "mem_used_gib": {"mean": 1.0, "max": 1.5}, "mem_total_gib": 24.0}})
    full_ms, small = 1e3 * total_s / steps, max(1, s.batch_size // 4)
    small_ms = full_ms * small / s.batch_size * 1.5
    r = (s.batch_size / full_ms) / (small / small_ms)
    share = (r - 1) / (s.batch_size / small - 1)
    peak = ctx.spec.fp32_tflops if ctx.spec else measured_roof[0]
    peak_gbs = ctx.spec.bandwidth_gbs if ctx.spec else measured_roof[1]
    step_tflops = tflop_per_s(judges._flops_per_token(s) * per_step, full_ms)
    step_gbs = gb_per_s(step_bytes, full_ms)
    out["test_limiter"] = dict(LIMITER=step_bound(share, step_tflops / peak, step_gbs / peak_gbs), batch_scaling=r,
                               fixed_share=share, step_tflops=step_tflops, mfu=step_tflops / peak,
                               full_time=timing(full_ms), small_time=timing(small_ms), small_batch=small,
                               TRAIN_PEAK_TFLOPS=peak, STEP_BYTES=step_bytes, step_gbs=step_gbs,
                               bandwidth_share=step_gbs / peak_gbs, TRAIN_PEAK_GBS=peak_gbs)
    shapes = matmul_sweep.sweep_shapes(sm_count(ctx), ctx.tier)
    ms = {lab: 2 * m * nn * kk / (rates["sweep"] * 1e9) for lab, (m, nn, kk) in shapes.items()}
    out["test_sweep"] = dict(sweep_time={lab: timing(v) for lab, v in ms.items()},
                             sweep_tflops={lab: tflop_per_s(2 * m * nn * kk, ms[lab]) for lab, (m, nn, kk) in shapes.items()},
                             SWEEP_SHAPES=dict(shapes), SM_COUNT=sm_count(ctx))
    out["test_sweep"]["MAX_ACHIEVABLE_TFLOPS"] = max(out["test_sweep"]["sweep_tflops"].values())
    return out
