"""Phase 5's measurement record: what the notebook writes, the reference arithmetic both the
live and the record checks use, and grading from the record.

``save_record`` writes every measured number of ``05_hardware_and_cost`` with the raw fields
it came from (medians, batch sizes, prices, the right-sizing candidates), the machine's
fingerprint and the ``utils`` hash. On a grading machine without a GPU the ``points``,
``costs``, ``right_sizing`` and ``checkpoint_overhead`` checks grade a GPU record instead
of re-measuring (docs/grading.md): fingerprint and hash, every derived number recomputed
from its raw fields, the learner's functions applied to the recorded inputs, nothing above
the card's datasheet. An invented but consistent, plausible record passes: the record
proves the arithmetic, not the run.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from grader import checks
from utils.inference import estimate_tpot_ms
from utils.units import gb_per_s, tflop_per_s

PHASE = "05_hardware_and_cost"
SLO_FACTOR = 1.25  # the latency SLO: 1.25 x your TPOT at the middle batch size (notebook, section 3)
DEMAND_FACTOR = 10  # the demand: 10 x your tokens/s at the largest batch size
FALLBACK_GPU = "T4"  # a device without a price row is priced as a T4 hour (a label, not a measurement)


# -- reference arithmetic ---------------------------------------------------------------------

def priced_gpus() -> dict[str, tuple[Any, float]]:
    """``{spec name: (GpuSpec, cheapest on-demand $/GPU-hour)}`` for every card in both
    ``utils.hardware.SPECS`` and ``utils.cost.PRICES``."""
    from utils import cost
    from utils.hardware import SPECS

    rows = {p.gpu for p in cost.PRICES}
    return {name: (spec, cost.gpu_price_usd_per_hour(name)) for name, spec in SPECS.items() if name in rows}


def device_price(spec) -> tuple[str, float]:
    """``(row, $/GPU-hour)`` for the device: its own row, else the T4's."""
    priced = priced_gpus()
    name = spec.name if spec is not None and spec.name in priced else FALLBACK_GPU
    return name, priced[name][1]


def my_bandwidth_gbs(spec, copy_gbs: float) -> float:
    """The bandwidth the estimate scales from: the datasheet's on a GPU in the table (the
    other cards are datasheet figures too), your measured copy on a device without one."""
    return float(spec.bandwidth_gbs) if spec is not None and spec.bandwidth_gbs else float(copy_gbs)


def slo_and_demand(tpot_ms: dict, tokens_per_s: dict) -> tuple[float, float]:
    """The notebook's SLO and demand, from the learner's own decode numbers (3 significant digits)."""
    batches = sorted(tpot_ms)
    mid = batches[len(batches) // 2]
    return float(f"{SLO_FACTOR * tpot_ms[mid]:.3g}"), float(f"{DEMAND_FACTOR * tokens_per_s[batches[-1]]:.3g}")


def reference_candidates(tpot_ms: dict, my_bw: float, bytes_per_step: float, my_spec) -> list:
    """Every priced card at every measured batch size: TPOT from :func:`utils.inference.estimate_tpot_ms`,
    throughput ``batch / TPOT`` per GPU, "measured" for your own card."""
    from utils.cost import Candidate

    out = []
    for gpu, (spec, usd) in priced_gpus().items():
        for b in sorted(tpot_ms):
            t = estimate_tpot_ms(tpot_ms[b], bytes_per_step, my_bw, spec.bandwidth_gbs)
            basis = "measured" if my_spec is not None and my_spec.name == gpu else "estimated"
            out.append(Candidate(f"{gpu} b{b}", usd, b * 1e3 / t, t, basis))
    return out


def _as_dict(c: Any) -> dict:
    if isinstance(c, dict):
        return c
    return {k: getattr(c, k, None) for k in ("name", "usd_per_gpu_hour", "throughput_per_s", "latency_ms", "basis")}


def same_candidates(candidates: Any, expected: list) -> None:
    if not isinstance(candidates, (list, tuple)):
        raise AssertionError("candidates must be a list of utils.cost.Candidate")
    got = {_as_dict(c).get("name"): _as_dict(c) for c in candidates}
    want = {c.name: _as_dict(c) for c in expected}
    if set(got) != set(want):
        raise AssertionError(f"candidates should be every priced card at every batch size ({len(want)}: "
                             f"{', '.join(sorted(want)[:4])}, ...); yours: {', '.join(sorted(map(str, got))[:6])}")
    for name, w in want.items():
        g = got[name]
        for key in ("usd_per_gpu_hour", "throughput_per_s", "latency_ms"):
            checks.assert_close(g.get(key), w[key], f"candidate {name!r} {key}", rel=1e-9)
        if g.get("basis") != w["basis"]:
            raise AssertionError(f"candidate {name!r} basis = {g.get('basis')!r}, expected {w['basis']!r}")


def same_answer(answer: Any, expected: list, slo: float, demand: float) -> None:
    from utils.cost import right_size

    ref = right_size(expected, latency_slo_ms=slo, demand_per_s=demand)
    choice = getattr(getattr(answer, "choice", None), "name", None)
    if choice != ref.choice.name or getattr(answer, "n_gpus", None) != ref.n_gpus:
        raise AssertionError(f"answer = {getattr(answer, 'n_gpus', '?')} x {choice!r}, but right_size on your "
                             f"candidates gives {ref.n_gpus} x {ref.choice.name!r}")
    checks.assert_close(answer.usd_per_hour, ref.usd_per_hour, "answer.usd_per_hour", rel=1e-9)


def decode_dict_ok(decode, sizes) -> None:
    """``decode`` has every batch size, each TPOT and tokens/s consistent with its two timings."""
    if not isinstance(decode, dict) or set(decode) != set(sizes.decode_batches):
        raise AssertionError(f"decode must map each batch size in {sizes.decode_batches} to its measurements")
    for b, d in decode.items():
        if not isinstance(d, dict) or not {"t1", "tn", "tpot_ms", "tokens_per_s"} <= set(d):
            raise AssertionError(f"decode[{b}] needs t1, tn, tpot_ms and tokens_per_s")
        t1, tn = checks.median(d["t1"], f"decode[{b}]['t1']"), checks.median(d["tn"], f"decode[{b}]['tn']")
        tpot = checks.assert_positive(d["tpot_ms"], f"decode[{b}]['tpot_ms']")
        checks.assert_close(tpot, (tn - t1) / (sizes.new_tokens - 1),
                            f"decode[{b}]['tpot_ms'] ((tn - t1) / (new_tokens - 1) in medians)", rel=1e-6)
        checks.assert_close(d["tokens_per_s"], b * 1e3 / tpot, f"decode[{b}]['tokens_per_s'] (batch / TPOT)", rel=1e-6)


def beyond_gpus_ok(beyond, monthly_tokens, decode, slo_ms, demand_per_s, bytes_per_step, my_bandwidth_gbs, rel: float):
    """BEYOND exactly what :func:`utils.accelerators.cheapest_for_slo` gives on the right-sizing
    numbers: the middle batch's TPOT at that batch, the SLO, the demand over a 730-hour month, the
    weight bytes and the bandwidth the TPOT was measured at, computed from a fresh copy of the
    module's tables."""
    import importlib.util

    import utils.accelerators as live

    spec = importlib.util.spec_from_file_location("_gpulab_fresh_accelerators", live.__file__)
    accelerators = importlib.util.module_from_spec(spec)  # the tables as shipped, whatever the notebook did to them
    sys.modules[spec.name] = accelerators  # dataclasses resolve their annotations through sys.modules
    try:
        spec.loader.exec_module(accelerators)
    finally:
        sys.modules.pop(spec.name, None)
    tpots = {b: checks.as_number(d["tpot_ms"], f"decode[{b}]['tpot_ms']") for b, d in decode.items()}
    mid = sorted(tpots)[len(tpots) // 2]
    want_month = checks.as_number(demand_per_s, "DEMAND_TOKENS_PER_S") * accelerators.HOURS_PER_MONTH * 3600
    checks.assert_close(monthly_tokens, want_month, "MONTHLY_TOKENS (DEMAND_TOKENS_PER_S over a 730-hour month, "
                        "in tokens)", rel=rel)
    if not isinstance(beyond, live.SloChoice):
        raise AssertionError(f"BEYOND must be what accelerators.cheapest_for_slo returns, got {type(beyond).__name__}")
    want = accelerators.cheapest_for_slo(measured_tpot_ms=tpots[mid], batch_size=mid, slo_tpot_ms=slo_ms,
                                         output_tokens_per_month=want_month, model_bytes=bytes_per_step,
                                         measured_bandwidth_gbs=my_bandwidth_gbs)
    checks.assert_close(beyond.measured_bandwidth_gbs, want.measured_bandwidth_gbs,
                        "BEYOND's measured bandwidth (MY_BANDWIDTH_GBS)", rel=rel)
    checks.assert_close(beyond.demand_tokens_per_s, want.demand_tokens_per_s,
                        "BEYOND's demand (MONTHLY_TOKENS over the month)", rel=rel)
    got = [(o.accelerator, o.devices) for o in beyond.options]
    exp = [(o.accelerator, o.devices) for o in want.options]
    if got != exp or {r.accelerator for r in beyond.rejected} != {r.accelerator for r in want.rejected}:
        raise AssertionError(f"BEYOND qualifies {got or 'nothing'}, but cheapest_for_slo on the middle batch "
                             f"(b{mid}: its TPOT at batch {mid}), TPOT_SLO_MS and BYTES_PER_STEP qualifies "
                             f"{exp or 'nothing'} (accelerator, devices)")
    for o, w in zip(beyond.options, want.options, strict=True):
        checks.assert_close(o.scaled_tpot_ms, w.scaled_tpot_ms, f"BEYOND's scaled TPOT on {w.accelerator}", rel=rel)
        checks.assert_close(o.monthly_cost_usd, w.monthly_cost_usd, f"BEYOND's monthly cost on {w.accelerator}", rel=rel)
    pick = want.cheapest
    checks.say("  beyond the GPUs: " + (f"{pick.devices} x {pick.accelerator} at ${pick.monthly_cost_usd:,.0f} a month, "
                                       "as cheapest_for_slo gives from your numbers" if pick else
                                       "no accelerator meets the SLO and holds the model, as cheapest_for_slo says"))


def weight_bytes(model: Any) -> float:
    """Bytes of a module's parameters, each shared tensor counted once."""
    params = {id(p): p for p in model.parameters()}
    return float(sum(p.numel() * p.element_size() for p in params.values()))


def train_plausible(tokens_per_s: float, sizes_or_model: Any, spec, seq_len: int | None = None) -> None:
    """Training tokens/s x FLOPs per token may not beat the card's fp32/tf32 datasheet peak."""
    from utils.flops import flops_per_token_from_config
    from utils.models import preset_config

    model = getattr(sizes_or_model, "model", sizes_or_model)
    seq = seq_len or sizes_or_model.seq_len
    with checks.quiet():
        fpt = flops_per_token_from_config(preset_config(str(model)), int(seq))
    peak = max(p for p in (spec.fp32_tflops, spec.tf32_tflops) if p)
    checks.assert_not_above(tokens_per_s * fpt / 1e12, peak, "training tokens/s x FLOPs per token", "TFLOP/s",
                            f"the {spec.name} fp32/tf32 datasheet peak")


# -- writing --------------------------------------------------------------------------------

_NEEDED = ("MATMUL_DTYPE", "n", "matmul_time", "matmul_tflops", "copy_time", "copy_gbs", "SIZES", "train",
           "samples_per_s", "decode", "WEIGHT_BYTES", "MY_GPU", "PRICE_USD_PER_HOUR", "usd_per_sample",
           "usd_per_million_tokens", "MY_BANDWIDTH_GBS", "TPOT_SLO_MS", "DEMAND_TOKENS_PER_S", "candidates", "answer",
           "overhead", "sync_overhead_pct", "async_overhead_pct", "resume", "compiles_unpadded", "compiles_bucketed",
           "compile_ms", "run_ms", "eager_ms")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (its ``globals()``)."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    g, s = ns, ns["SIZES"]
    rec = Record.new()
    rec.add("matmul_tflops", g["matmul_tflops"], "TFLOP/s", g["matmul_time"].method, checks.spread(g["matmul_time"]),
            n=g["n"], dtype=checks.dtype_name(g["MATMUL_DTYPE"]), flops=2 * g["n"] ** 3, **checks.times_dict(g["matmul_time"]))
    rec.add("copy_gbs", g["copy_gbs"], "GB/s", g["copy_time"].method, checks.spread(g["copy_time"]),
            bytes=8 * s.copy_numel, **checks.times_dict(g["copy_time"]))
    tr = g["train"]
    rec.add("train_samples_per_s", g["samples_per_s"], "samples/s", tr["method"], None, tokens_per_s=tr["tokens_per_s"],
            batch=s.train_batch, seq_len=s.seq_len, model=s.model, steps=tr["steps"], total_s=tr["total_s"],
            median_ms=tr["median_ms"], p20_ms=tr["p20_ms"], p80_ms=tr["p80_ms"])
    for b, d in g["decode"].items():
        rec.add(f"decode_b{b}", d["tokens_per_s"], "tokens/s", d["tn"].method, checks.spread(d["tn"]), batch=b,
                tpot_ms=d["tpot_ms"], new_tokens=s.new_tokens, prompt_len=s.prompt_len, model=s.model,
                weight_bytes=g["WEIGHT_BYTES"], t1=checks.times_dict(d["t1"]), tn=checks.times_dict(d["tn"]))
    best = max(s.decode_batches)
    rec.add("usd_per_sample", g["usd_per_sample"], "USD", "cost_per_sample_usd", None, price_row=g["MY_GPU"],
            usd_per_gpu_hour=g["PRICE_USD_PER_HOUR"], samples_per_s=g["samples_per_s"])
    rec.add("usd_per_million_tokens", g["usd_per_million_tokens"], "USD", "cost_per_million_tokens_usd", None,
            price_row=g["MY_GPU"], usd_per_gpu_hour=g["PRICE_USD_PER_HOUR"], batch=best,
            tokens_per_s=g["decode"][best]["tokens_per_s"])
    ans = g["answer"]
    rec.add("right_sizing_usd_per_hour", ans.usd_per_hour, "USD/h", "utils.cost.right_size", None,
            choice=ans.choice.name, n_gpus=ans.n_gpus, slo_ms=g["TPOT_SLO_MS"], demand_per_s=g["DEMAND_TOKENS_PER_S"],
            my_bandwidth_gbs=g["MY_BANDWIDTH_GBS"], bytes_per_step=g["WEIGHT_BYTES"],
            candidates=[_as_dict(c) for c in g["candidates"]])
    ov = g["overhead"]
    rec.add("checkpoint_sync_save_ms", ov["sync_save"].median_ms, "ms", ov["sync_save"].method,
            checks.spread(ov["sync_save"]), step=checks.times_dict(ov["step"]), sync_save=checks.times_dict(ov["sync_save"]),
            async_blocking=checks.times_dict(ov["async_blocking"]), async_total=checks.times_dict(ov["async_total"]), every=s.ckpt_every,
            model=s.ckpt_model, checkpoint_bytes=ov["checkpoint_bytes"], sync_pct=g["sync_overhead_pct"],
            async_pct=g["async_overhead_pct"])
    rec.add("jax_compile_ms", g["compile_ms"], "ms", "jax.monitoring backend_compile_duration", None,
            run_ms=g["run_ms"], eager_ms=g["eager_ms"], compiles_unpadded=g["compiles_unpadded"],
            compiles_bucketed=g["compiles_bucketed"])
    r = g["resume"]
    rec.add("resume_identical", 1.0 if r.get("identical") else 0.0, "bool", "utils.kill_harness.kill_and_resume", None,
            differing=r.get("differing"), killed_after_step=r.get("killed_after_step"), resumed_from=r.get("resumed_from"))
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


# -- reading --------------------------------------------------------------------------------

def _med(t: Any, name: str) -> float:
    if not isinstance(t, dict):
        raise AssertionError(f"record {name} lacks its timing")
    med = checks.assert_positive(t.get("median_ms"), f"record {name} median_ms")
    p20, p80 = checks.as_number(t.get("p20_ms"), f"record {name} p20_ms"), checks.as_number(t.get("p80_ms"), f"record {name} p80_ms")
    if not 0 < p20 <= med <= p80:
        raise AssertionError(f"record {name}: p20 {p20} <= median {med} <= p80 {p80} does not hold")
    return med


def points() -> None:
    rec, spec = checks.open_record()
    v, n, dtype, fl = checks.recorded(rec, "matmul_tflops", "n", "dtype", "flops")
    ex = rec.measurements["matmul_tflops"].extra
    n = int(checks.as_number(n, "record matmul n"))
    checks.assert_close(fl, 2 * n**3, "record matmul flops (2 n^3)")
    checks.assert_close(v, tflop_per_s(fl, _med(ex, "matmul_tflops")), "record matmul_tflops vs its flops and median", rel=1e-3)
    checks.assert_not_above(v, spec.peak_tflops(checks.dtype_name(dtype)), "recorded matmul_tflops", "TFLOP/s",
                            f"the {spec.name} {dtype} datasheet peak")
    cv, cby = checks.recorded(rec, "copy_gbs", "bytes")
    checks.assert_close(cv, gb_per_s(cby, _med(rec.measurements["copy_gbs"].extra, "copy_gbs")),
                        "record copy_gbs vs its bytes and median", rel=1e-3)
    checks.assert_not_above(cv, spec.bandwidth_gbs, "recorded copy_gbs", "GB/s", f"the {spec.name} datasheet bandwidth")
    checks.record_ok(f"matmul {v:.4g} TFLOP/s, copy {cv:.4g} GB/s")


def _decode(rec, spec) -> tuple[dict, dict, float]:
    """Recorded decode numbers, checked: ``({batch: tpot_ms}, {batch: tokens/s}, weight bytes)``."""
    tpot, tps, wb = {}, {}, None
    for name, m in rec.measurements.items():
        if not name.startswith("decode_b"):
            continue
        _, b, t, n_new, wbytes, t1, tn = checks.recorded(rec, name, "batch", "tpot_ms", "new_tokens", "weight_bytes", "t1", "tn")
        b = int(checks.as_number(b, f"record {name} batch"))
        checks.assert_close(t, (_med(tn, f"{name} tn") - _med(t1, f"{name} t1")) / (checks.as_number(n_new, "new_tokens") - 1),
                            f"record {name} tpot_ms vs its t1 and tn medians", rel=1e-6)
        checks.assert_close(m.value, b * 1e3 / t, f"record {name} tokens/s (batch / TPOT)", rel=1e-6)
        wb = checks.assert_positive(wbytes, f"record {name} weight_bytes")
        checks.assert_not_above(m.value / b * wb / 1e9, spec.bandwidth_gbs, f"recorded weights read per second at batch {b}",
                                "GB/s", f"the {spec.name} datasheet bandwidth")
        tpot[b], tps[b] = float(t), float(m.value)
    if not tpot:
        raise AssertionError("the record has no decode measurements: run the whole notebook before saving it")
    return tpot, tps, wb


def costs(cost_per_sample_usd, cost_per_million_tokens_usd) -> None:
    from utils import cost

    rec, spec = checks.open_record()
    sps, tps_train, seq, model = checks.recorded(rec, "train_samples_per_s", "tokens_per_s", "seq_len", "model")
    checks.assert_close(sps, checks.as_number(tps_train, "record tokens_per_s") / checks.as_number(seq, "seq_len"),
                        "recorded samples/s (tokens/s / seq_len)", rel=1e-6)
    train_plausible(tps_train, str(model), spec, int(seq))
    _, tps, _ = _decode(rec, spec)
    row, price = device_price(spec)
    usd_s, rec_row, rec_price, rec_sps = checks.recorded(rec, "usd_per_sample", "price_row", "usd_per_gpu_hour", "samples_per_s")
    if rec_row != row:
        raise AssertionError(f"the record prices the {spec.name} run as {rec_row!r}, the table's row is {row!r}")
    checks.assert_close(rec_price, price, "recorded usd_per_gpu_hour (the price table's)", rel=1e-9)
    checks.assert_close(rec_sps, sps, "recorded samples_per_s", rel=1e-9)
    usd_t, batch, rec_tps = checks.recorded(rec, "usd_per_million_tokens", "batch", "tokens_per_s")
    checks.assert_close(rec_tps, tps[max(tps)], "recorded tokens/s at the largest batch", rel=1e-9)
    with checks.quiet():
        mine_s, mine_t = cost_per_sample_usd(sps, price), cost_per_million_tokens_usd(rec_tps, price)
    checks.assert_close(mine_s, cost.cost_per_sample_usd(sps, price), "your cost_per_sample_usd on the record", rel=1e-9)
    checks.assert_close(mine_t, cost.cost_per_million_tokens_usd(rec_tps, price), "your cost_per_million_tokens_usd on the record", rel=1e-9)
    checks.assert_close(usd_s, mine_s, "recorded usd_per_sample", rel=1e-6)
    checks.assert_close(usd_t, mine_t, "recorded usd_per_million_tokens", rel=1e-6)
    checks.record_ok(f"${usd_s:.3g} per sample, ${usd_t:.3g} per 1M tokens at batch {batch}")


def right_sizing() -> None:
    rec, spec = checks.open_record()
    tpot, tps, wb = _decode(rec, spec)
    _, choice, n, slo, demand, bw, nbytes, cands = checks.recorded(
        rec, "right_sizing_usd_per_hour", "choice", "n_gpus", "slo_ms", "demand_per_s", "my_bandwidth_gbs",
        "bytes_per_step", "candidates")
    checks.assert_close(bw, my_bandwidth_gbs(spec, 0.0), f"recorded MY_BANDWIDTH_GBS (the {spec.name} datasheet)", rel=1e-9)
    checks.assert_close(nbytes, wb, "recorded BYTES_PER_STEP (the decode model's weight bytes)", rel=1e-9)
    want_slo, want_demand = slo_and_demand(tpot, tps)
    checks.assert_close(slo, want_slo, "recorded TPOT_SLO_MS", rel=1e-9)
    checks.assert_close(demand, want_demand, "recorded DEMAND_TOKENS_PER_S", rel=1e-9)
    expected = reference_candidates(tpot, bw, nbytes, spec)
    same_candidates(cands, expected)

    class _A:
        pass

    a = _A()
    a.choice, a.n_gpus, a.usd_per_hour = _A(), n, rec.measurements["right_sizing_usd_per_hour"].value
    a.choice.name = choice
    same_answer(a, expected, want_slo, want_demand)
    checks.record_ok(f"right-sizing {n} x {choice}")


def checkpoint_overhead() -> None:
    from utils.models import build_model

    rec, _ = checks.open_record()
    sync, step, ss, ab, every, model, nbytes, sync_pct, async_pct = checks.recorded(
        rec, "checkpoint_sync_save_ms", "step", "sync_save", "async_blocking", "every", "model", "checkpoint_bytes",
        "sync_pct", "async_pct")
    step_ms, blocking = _med(step, "checkpoint step"), _med(ab, "checkpoint async_blocking")
    checks.assert_close(sync, _med(ss, "checkpoint sync_save"), "recorded sync save median", rel=1e-9)
    every = checks.as_number(every, "every")
    checks.assert_close(sync_pct, 100 * sync / (every * step_ms), "recorded sync_overhead_pct", rel=1e-6)
    checks.assert_close(async_pct, 100 * blocking / (every * step_ms), "recorded async_overhead_pct", rel=1e-6)
    with checks.quiet():
        weights = weight_bytes(build_model(str(model), device="meta"))
    if checks.as_number(nbytes, "checkpoint_bytes") < 0.99 * 3 * weights:
        raise AssertionError(f"the recorded checkpoint has {nbytes:.4g} bytes, less than weights and AdamW's two "
                             f"moments of {model} ({3 * weights:.4g} bytes)")
    if not math.isfinite(sync_pct):
        raise AssertionError("recorded sync_overhead_pct is not finite")
    checks.record_ok(f"checkpoint {sync:.4g} ms synchronous, {blocking:.4g} ms blocking when asynchronous")
