"""Consistent lab-05 answers for any sizes and card, as the notebook's export sends them: for the
judges' tests (tests/grader/labs/test_hardware_and_cost.py) and to forge a GPU record
(tests/grader/labs/test_hardware_and_cost_grading.py).

Every derived number is computed here the way the notebook's cells compute it (not with the judges'
helpers), from chosen rates: a matmul and copy rate, training samples/s, a TPOT per decode batch, a
training step, a checkpoint write and the XLA times.
"""
from __future__ import annotations

import math
import time

from grader.answers import encode
from grader.labs.hardware_and_cost import reference
from grader.labs.hardware_and_cost.answers import ANSWERS
from grader.measuring import Measured
from grader.names import RECORD_SCHEMA
from utils.capacity import accelerators, cost
from utils.device.hardware import SPECS
from utils.measure.record import utils_hash
from utils.serving.inference import estimate_tpot_ms

# what a CPU might measure in smoke mode
CPU_RATES = {"matmul": 0.1, "copy": 20.0, "samples_per_s": 40.0, "tpot": (3.0, 5.0, 8.0), "step_ms": 25.0,
             "sync_ms": 120.0, "async_ms": 30.0, "compile_ms": 80.0, "run_ms": 0.1, "eager_ms": 0.4}
# what a T4 might measure at its tier's sizes (below every datasheet ceiling: 65 fp16 TFLOP/s, 320 GB/s)
T4_RATES = {"matmul": 40.0, "copy": 250.0, "samples_per_s": 20.0, "tpot": (9.0, 10.0, 14.0), "step_ms": 300.0,
            "sync_ms": 1500.0, "async_ms": 200.0, "compile_ms": 180.0, "run_ms": 0.2, "eager_ms": 0.9}
T1_MS = 6.0  # generate_tokens(batch, 1): the prompt and the first token


def timing(ms: float) -> dict:
    return {"median_ms": ms, "p20_ms": 0.9 * ms, "p80_ms": 1.1 * ms, "runs": 10, "method": "perf_counter"}


def tpots(ctx, rates: dict) -> dict:
    """TPOT per decode batch: the rates' values in order of batch size (the last repeated for a fourth)."""
    batches = sorted(ctx.sizes.decode_batches)
    return {b: rates["tpot"][min(i, len(rates["tpot"]) - 1)] for i, b in enumerate(batches)}


def decode(ctx, rates: dict) -> dict:
    n = ctx.sizes.new_tokens
    return {b: {"t1": timing(T1_MS), "tn": timing(T1_MS + t * (n - 1)), "tpot_ms": (T1_MS + t * (n - 1) - T1_MS) / (n - 1),
                "tokens_per_s": b * 1e3 / ((T1_MS + t * (n - 1) - T1_MS) / (n - 1))}
            for b, t in tpots(ctx, rates).items()}


def priced() -> dict:
    """The notebook's PRICED."""
    return {name: (s, cost.gpu_price_usd_per_hour(name)) for name, s in SPECS.items() if name in {p.gpu for p in cost.PRICES}}


def weight_bytes(ctx) -> int:
    return reference.params_bytes(ctx.sizes.model)


def answers(ctx, rates: dict = CPU_RATES) -> dict[str, dict]:
    """The right answers of every graded cell that reads answers, for ``ctx``'s sizes and card."""
    s = ctx.sizes
    n, numel = s.matmul_n, s.copy_numel
    mm_ms, copy_ms = 2 * n**3 / (rates["matmul"] * 1e9), 8 * numel / (rates["copy"] * 1e6)
    matmul_tflops = 2 * n**3 / (mm_ms * 1e-3) / 1e12
    copy_gbs = 2 * numel * 4 / (copy_ms * 1e-3) / 1e9
    out = {"test_points": dict(matmul_tflops=matmul_tflops, matmul_time=timing(mm_ms), copy_gbs=copy_gbs,
                               copy_time=timing(copy_ms))}

    steps, per_step = s.train_steps - 2, s.train_batch * s.seq_len
    step_ms = s.train_batch / rates["samples_per_s"] * 1e3
    total_s = steps * step_ms / 1e3
    train = {"method": "perf_counter", "steps": steps, "median_ms": step_ms, "p20_ms": 0.95 * step_ms,
             "p80_ms": 1.05 * step_ms, "total_s": total_s, "tokens_per_s": per_step * steps / total_s}
    sps = train["tokens_per_s"] / s.seq_len
    dec = decode(ctx, rates)
    spec = ctx.spec if ctx.device == "cuda" else None
    my_gpu = spec.name if spec is not None and spec.name in priced() else "T4"
    price = priced()[my_gpu][1]
    best = max(s.decode_batches)
    out["test_measured_costs"] = dict(samples_per_s=sps, train=train, decode=dec,
                                      usd_per_sample=price / (sps * 3600),
                                      usd_per_million_tokens=price * 1e6 / (dec[best]["tokens_per_s"] * 3600),
                                      PRICE_USD_PER_HOUR=price)

    bw = spec.bandwidth_gbs if spec is not None and spec.bandwidth_gbs else copy_gbs
    nbytes = weight_bytes(ctx)
    mid = sorted(dec)[len(dec) // 2]
    slo = float(f"{1.25 * dec[mid]['tpot_ms']:.3g}")
    demand = float(f"{10 * dec[max(dec)]['tokens_per_s']:.3g}")
    cands = []
    for gpu, (gs, usd) in priced().items():
        for b, d in sorted(dec.items()):
            t = estimate_tpot_ms(d["tpot_ms"], nbytes, bw, gs.bandwidth_gbs)
            cands.append(cost.Candidate(f"{gpu} b{b}", usd, b * 1e3 / t, t, "measured" if spec and gpu == spec.name
                                        else "estimated"))
    answer = cost.right_size(cands, latency_slo_ms=slo, demand_per_s=demand)
    numbers = dict(decode=dec, MY_BANDWIDTH_GBS=bw, BYTES_PER_STEP=nbytes, TPOT_SLO_MS=slo, DEMAND_TOKENS_PER_S=demand)
    out["test_right_sizing"] = dict(candidates=cands, answer=answer, copy_gbs=copy_gbs, **numbers)
    month = demand * accelerators.HOURS_PER_MONTH * 3600
    beyond = accelerators.cheapest_for_slo(measured_tpot_ms=dec[mid]["tpot_ms"], batch_size=mid, slo_tpot_ms=slo,
                                           output_tokens_per_month=month, model_bytes=nbytes,
                                           measured_bandwidth_gbs=bw)
    out["test_beyond_gpus"] = dict(BEYOND=beyond, MONTHLY_TOKENS=month, **numbers)

    every = s.ckpt_every
    overhead = {"step": timing(rates["step_ms"]), "sync_save": timing(rates["sync_ms"]),
                "async_blocking": timing(rates["async_ms"]), "async_total": timing(rates["sync_ms"] * 1.1),
                "checkpoint_bytes": int(3.02 * reference.params_bytes(s.ckpt_model)), "async_native": True}
    out["test_checkpoint_overhead"] = dict(
        overhead=overhead, sync_overhead_pct=100 * rates["sync_ms"] / (every * rates["step_ms"]),
        async_overhead_pct=100 * rates["async_ms"] / (every * rates["step_ms"]))

    lengths = s.xla_lengths if ctx.device == "cuda" else reference.BY_TIER["cpu"].xla_lengths
    unpadded, bucketed = reference.expected_compiles(lengths)
    c, r, e = rates["compile_ms"], rates["run_ms"], rates["eager_ms"]
    out["test_recompiles"] = dict(compiles_unpadded=unpadded, compiles_bucketed=bucketed, compile_ms=c, run_ms=r,
                                  eager_ms=e, break_even_calls=c / (e - r) if e > r else math.inf)
    out["test_pod_sharding"] = dict(DP_X=(True, ("data", None)), DP_W=(True, (None, None)), TP_X=(True, ("data", None)),
                                    TP_W=(True, (None, "model")), MESH_DP={"data": 8}, MESH_2D={"data": 4, "model": 2})
    return out


def ref(ctx, rates: dict = CPU_RATES, live: bool = True, resume: dict | None = None) -> reference.Reference:
    """The grader's measurement equal to ``rates`` (band +-150%, the smoke floor); from a record, none."""
    m = {"matmul": rates["matmul"], "copy": rates["copy"], "samples_per_s": rates["samples_per_s"],
         "ckpt:step": rates["step_ms"], "ckpt:sync_save": rates["sync_ms"], "xla:compile": rates["compile_ms"],
         "xla:run": rates["run_ms"], "xla:eager": rates["eager_ms"]}
    m.update({f"tpot:{b}": t for b, t in tpots(ctx, rates).items()})
    lengths = ctx.sizes.xla_lengths if ctx.device == "cuda" else reference.BY_TIER["cpu"].xla_lengths
    return reference.Reference(ctx, {k: Measured(v, 1.5, "test") for k, v in m.items()} if live else {},
                               weight_bytes(ctx), reference.params_bytes(ctx.sizes.ckpt_model),
                               (reference.expected_compiles(lengths),), dict(resume or {}), live=live)


def record(ctx, rates: dict = T4_RATES, fingerprint_name: str = "Tesla T4", **change) -> dict:
    """A measurement record as a GPU run of the notebook writes it (``grader.answers.save_record``):
    every graded cell's answers for ``ctx`` (a GPU context), ``change`` applied to them by name."""
    values = answers(ctx, rates)
    cells = {cell: {name: encode(v) for name, v in values.get(cell, {}).items()} for cell in ANSWERS}
    for name, v in change.items():
        for cell, names in ANSWERS.items():
            if name in names:
                cells[cell][name] = encode(v)
    return {"schema": RECORD_SCHEMA, "assignment": reference.ASSIGNMENT, "tier": ctx.tier, "smoke": False,
            "dtype": ctx.dtype, "fingerprint": {"kind": "gpu", "name": fingerprint_name, "memory_gib": 14.6,
                                                "compute_capability": "7.5", "torch": "2.11.0"},
            "utils_sha256": utils_hash(), "written_unix": time.time(), "answers": cells, "missing": {}}


def gpu_context(tier: str = "t4", spec: str = "T4", dtype: str = "float16", name: str = "Tesla T4"):
    from grader.judging import Context
    from grader.labs import load

    return Context(reference.ASSIGNMENT, tier, load(reference.ASSIGNMENT).sizes(tier), False, "cuda", name, SPECS[spec],
                   dtype, {"kind": "gpu", "name": name})


def cpu_context():
    from grader.judging import Context
    from grader.labs import load

    return Context(reference.ASSIGNMENT, "cpu", load(reference.ASSIGNMENT).sizes("cpu"), True, "cpu",
                   "CPU (smoke mode)", None, "float32", {})

