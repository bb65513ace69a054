"""Lab 05's judges: each graded cell's answers against the rule, the grader's measurement or a record.

Each judge is pure (``grader/judging.py``); the rules it computes expected values with, and the hidden
cases each check draws, are in ``rules.py``. The learner's formula functions (speedup, the two costs,
the TPOT estimate, the checkpoint overhead, the spot cost, the bucket, the slowest link, the bytes
per device) are run by the grader on cases drawn from the grading run's secret seed, in a sandbox
where the course's own implementations of those rules are unavailable (``forbid``). The sharded
matmul runs there too, on drawn arrays, meshes and specs over JAX CPU devices; its values and the
slice each device holds come back as plain data (``harness.py``) and are checked against the
judge's own product and layout. The RNG functions run in the kill-and-resume experiment: an
interrupted run in the hidden-cases sandbox, stopped after a step drawn from the seed and killed
with that process, and a resumed run in a fresh sandbox, whose final state must equal the grader's
uninterrupted run of the course's loop bit for bit. The measured cells are checked for consistency
first (every derived number from its raw fields, every count exact for the lab's sizes, nothing
above the datasheet), then against the grader's own measurement (``reference.py``); the right-sizing
and beyond-GPU answers are recomputed here with the course's functions from the learner's numbers.
"""
from __future__ import annotations

import math

import numpy as np

from grader.expect import Fail, approx, cases, close, equal, not_above, positive
from grader.judging import Check
from grader.labs.hardware_and_cost.rules import (
    HARNESS,
    bucket_cases,
    device_price,
    estimate_cases,
    expected_layout,
    expected_shard_bytes,
    layout_of,
    my_bandwidth_gbs,
    overhead_cases,
    rate_cases,
    reference_candidates,
    roof,
    shard_bytes_cases,
    sharded_cases,
    slo_and_demand,
    speedup_cases,
    spot_cases,
    topology_cases,
    victim_cases,
)
from utils.capacity import accelerators, cost
from utils.device import topology
from utils.measure.flops import flops_per_token_from_config
from utils.model.models import preset_config
from utils.serving.inference import estimate_tpot_ms
from utils.tpu import xla
from utils.train.checkpoint import COMPONENTS
from utils.units import gb_per_s, tflop_per_s

VICTIM = "_gpulab_resume_victim"  # the interrupted run, defined by SETUP in the hidden-cases sandbox
SHARDED = "_gpulab_sharded_matmul"  # the learner's sharded_matmul on the grader's arrays, reported as data
SETUP = f'''
import os as _gpulab_os
_gpulab_os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
from {HARNESS.rsplit(".", 1)[0]} import harness as _gpulab_harness

def {VICTIM}(kill_after_step, run_dir, config):
    return _gpulab_harness.victim(globals(), kill_after_step, run_dir, config)

def {SHARDED}(x, w, mesh_shape, x_spec, w_spec):
    return _gpulab_harness.sharded_case(globals(), x, w, mesh_shape, x_spec, w_spec)
'''
RNG = ("utils.train.checkpoint:capture_rng_state", "utils.train.checkpoint:restore_rng_state")


# -- shared arithmetic -------------------------------------------------------------------------------

def _timing(t: dict, name: str) -> float:
    if not t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]:
        raise Fail(f"{name}: p20 {t['p20_ms']:.4g} <= median {t['median_ms']:.4g} <= p80 {t['p80_ms']:.4g} ms does not "
                   "hold: not a timing from utils.measure.timing")
    return positive(t["median_ms"], f"{name} median_ms")


def _decode_ok(decode: dict, sizes) -> None:
    """Every batch size of the lab, each TPOT and tokens/s consistent with its two timings."""
    want = sorted(sizes.decode_batches)
    if sorted(decode) != want:
        raise Fail(f"decode has the batch sizes {sorted(decode)}, expected one entry per batch size of "
                   f"SIZES.decode_batches ({want})")
    for b, d in decode.items():
        t1, tn = _timing(d["t1"], f"decode[{b}]['t1']"), _timing(d["tn"], f"decode[{b}]['tn']")
        tpot = positive(d["tpot_ms"], f"decode[{b}]['tpot_ms']")
        close(tpot, (tn - t1) / (sizes.new_tokens - 1), f"decode[{b}]['tpot_ms']",
              f"(tn.median_ms - t1.median_ms) / (new_tokens - 1), new_tokens = {sizes.new_tokens}", rel=1e-6)
        close(d["tokens_per_s"], b * 1e3 / tpot, f"decode[{b}]['tokens_per_s']", "batch x 1000 / tpot_ms", rel=1e-6)


def _decode_plausible(decode: dict, ref) -> None:
    """On a GPU, decode reads every weight once per step: the weights read per second at each batch
    (tokens/s / batch x weight bytes) may not pass the card's datasheet bandwidth."""
    ctx = ref.ctx
    if ctx.device == "cuda" and ctx.spec is not None and ctx.spec.bandwidth_gbs:
        for b, d in decode.items():
            not_above(d["tokens_per_s"] / b * ref.weight_bytes / 1e9, ctx.spec.bandwidth_gbs,
                      f"the weights read per second at batch {b} (decode[{b}]['tokens_per_s'] / batch x weight bytes)",
                      "GB/s", f"the {ctx.spec.name} datasheet bandwidth")


def _numbers_ok(a, ref) -> tuple[float, float]:
    """The right-sizing inputs the locked cell derives: SLO and demand from ``decode``, the weight
    bytes the grader counted, the bandwidth of the device; returns ``(slo, demand)``."""
    ctx = ref.ctx
    _decode_ok(a.decode, ctx.sizes)
    _decode_plausible(a.decode, ref)
    equal(a.BYTES_PER_STEP, ref.weight_bytes, "BYTES_PER_STEP", f"the {ctx.sizes.model} decode model's parameters in "
          "bytes (WEIGHT_BYTES), as the grader counts them")
    slo, demand = slo_and_demand(a.decode)
    close(a.TPOT_SLO_MS, slo, "TPOT_SLO_MS", "1.25 x the TPOT at the middle batch size, 3 significant digits", rel=1e-9)
    close(a.DEMAND_TOKENS_PER_S, demand, "DEMAND_TOKENS_PER_S", "10 x the tokens/s at the largest batch size, 3 "
          "significant digits", rel=1e-9)
    return slo, demand


# -- 1. the roofline across the spec table ------------------------------------------------------------

def speedup(a, ref):
    want = [roof(t["kwargs"], i, d) / roof(f["kwargs"], i, d) for i, f, t, d in a.inputs["attainable_speedup"]]
    return [cases(a.calls["attainable_speedup"], want, "attainable_speedup",
                  "min(peak, intensity x bandwidth) on to_spec over the same on from_spec, peaks in TFLOP/s at dtype "
                  "and bandwidths in GB/s (so intensity x bandwidth / 1000 in TFLOP/s)", approx(1e-9))]


def points(a, ref):
    ctx = ref.ctx
    n, numel = ctx.sizes.matmul_n, ctx.sizes.copy_numel
    close(a.matmul_tflops, tflop_per_s(2 * n**3, _timing(a.matmul_time, "matmul_time")), "matmul_tflops",
          f"2 n^3 FLOPs (n = {n}) over matmul_time's median", rel=1e-3)
    close(a.copy_gbs, gb_per_s(8 * numel, _timing(a.copy_time, "copy_time")), "copy_gbs",
          f"read and write 4 bytes per element ({numel} fp32 elements) over copy_time's median", rel=1e-3)
    ceiling, what = ref.peak_tflops()
    not_above(a.matmul_tflops, ceiling, "matmul_tflops", "TFLOP/s", what)
    if ctx.device == "cuda" and ctx.spec is not None:
        not_above(a.copy_gbs, ctx.spec.bandwidth_gbs, "copy_gbs", "GB/s", f"the {ctx.spec.name} datasheet bandwidth")
    return [ref.against("matmul", a.matmul_tflops, "matmul_tflops", "TFLOP/s"),
            ref.against("copy", a.copy_gbs, "copy_gbs", "GB/s")]


# -- 2. cost from your own measurements -------------------------------------------------------------

def cost_functions(a, ref):
    return [cases(a.calls["cost_per_sample_usd"], [cost.cost_per_sample_usd(r, u) for r, u in a.inputs["cost_per_sample_usd"]],
                  "cost_per_sample_usd", "usd_per_gpu_hour / (samples_per_s x 3600)", approx(1e-9)),
            cases(a.calls["cost_per_million_tokens_usd"],
                  [cost.cost_per_million_tokens_usd(r, u) for r, u in a.inputs["cost_per_million_tokens_usd"]],
                  "cost_per_million_tokens_usd", "usd_per_gpu_hour x 1e6 / (tokens_per_s x 3600)", approx(1e-9))]


def measured_costs(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    tr = a.train
    _timing(tr, "train")
    if tr["tokens_per_s"] is None:
        raise Fail("train['tokens_per_s'] is None: give the Stopwatch tokens_per_step=TOKENS_PER_STEP")
    per_step = s.train_batch * s.seq_len
    close(tr["tokens_per_s"], per_step * tr["steps"] / tr["total_s"], "train['tokens_per_s']",
          f"{per_step} tokens per step x its steps over its total_s", rel=1e-3)
    sps = positive(a.samples_per_s, "samples_per_s")
    close(sps, tr["tokens_per_s"] / s.seq_len, "samples_per_s", f"train['tokens_per_s'] / seq_len ({s.seq_len})", rel=1e-6)
    _decode_ok(a.decode, s)
    row, price = device_price(ctx)
    close(a.PRICE_USD_PER_HOUR, price, "PRICE_USD_PER_HOUR", f"the price table's cheapest on-demand {row} GPU-hour",
          rel=1e-9)
    best = max(a.decode)
    close(a.usd_per_sample, price / (sps * 3600), "usd_per_sample", "cost_per_sample_usd(samples_per_s, "
          "PRICE_USD_PER_HOUR)", rel=1e-6)
    close(a.usd_per_million_tokens, price * 1e6 / (a.decode[best]["tokens_per_s"] * 3600), "usd_per_million_tokens",
          f"cost_per_million_tokens_usd at the largest batch ({best}) and PRICE_USD_PER_HOUR", rel=1e-6)
    _decode_plausible(a.decode, ref)
    spec = ctx.spec
    if ctx.device == "cuda" and spec is not None:
        peaks = [p for p in (spec.fp32_tflops, spec.tf32_tflops) if p]
        if peaks:
            fpt = flops_per_token_from_config(preset_config(s.model), s.seq_len)
            not_above(tr["tokens_per_s"] * fpt / 1e12, max(peaks), "training tokens/s x FLOPs per token", "TFLOP/s",
                      f"the {spec.name} fp32/tf32 datasheet peak")
    small = min(a.decode)
    return [ref.against("samples_per_s", sps, "samples_per_s", "samples/s"),
            *(ref.against(f"tpot:{b}", a.decode[b]["tpot_ms"], f"decode[{b}]['tpot_ms']", "ms")
              for b in sorted({small, best}))]


def spot(a, ref):
    want = [cost.spot_job(w, p, checkpoint_interval_h=t, checkpoint_write_h=d, restart_h=r, preemptions_per_h=lam).cost_usd
            for w, p, t, d, r, lam in a.inputs["spot_expected_cost_usd"]]
    return [cases(a.calls["spot_expected_cost_usd"], want, "spot_expected_cost_usd",
                  "work x (1 + delta / tau) / (1 - lambda x (tau / 2 + R)) x price, and math.inf when "
                  "lambda x (tau / 2 + R) >= 1 (the job never finishes)", approx(1e-9))]


# -- 3. right-sizing and beyond GPUs ------------------------------------------------------------------

def right_sizing(a, ref):
    notes = [cases(a.calls["estimate_tpot_ms"], [estimate_tpot_ms(*x) for x in a.inputs["estimate_tpot_ms"]],
                   "estimate_tpot_ms", "max(measured - bytes / my bandwidth, 0) + bytes / other bandwidth, in ms "
                   "(bytes / (GB/s x 1e9) x 1000)", approx(1e-9))]
    ctx = ref.ctx
    slo, demand = _numbers_ok(a, ref)
    bw = my_bandwidth_gbs(ctx, a.copy_gbs)
    close(a.MY_BANDWIDTH_GBS, bw, "MY_BANDWIDTH_GBS", f"the {ctx.spec.name} datasheet bandwidth" if bw != a.copy_gbs
          else "your measured copy_gbs (no datasheet row for this device)", rel=1e-9)
    want = reference_candidates(a.decode, bw, a.BYTES_PER_STEP, ctx)
    got = {c["name"]: c for c in a.candidates}
    if len(got) != len(a.candidates) or set(got) != {c.name for c in want}:
        names = sorted(c.name for c in want)
        raise Fail(f"candidates should be every priced card at every batch size, one each ({len(want)}: "
                   f"{', '.join(names[:4])}, ...); yours has {len(a.candidates)}: {', '.join(sorted(got)[:6])}")
    for w in want:
        g = got[w.name]
        for key in ("usd_per_gpu_hour", "throughput_per_s", "latency_ms"):
            close(g[key], getattr(w, key), f"candidate {w.name!r} {key}", "the card's price, batch x 1000 / TPOT and "
                  "the TPOT your estimate gives from your decode[batch]['tpot_ms'], BYTES_PER_STEP, MY_BANDWIDTH_GBS "
                  "and the card's datasheet bandwidth", rel=1e-9)
        equal(g["basis"], w.basis, f"candidate {w.name!r} basis", '"measured" for your own card, "estimated" for the others')
    try:
        best = cost.right_size(want, latency_slo_ms=slo, demand_per_s=demand)
    except ValueError as exc:
        raise Fail(f"no candidate meets the SLO: {exc}") from None
    if a.answer["choice"]["name"] != best.choice.name or a.answer["n_gpus"] != best.n_gpus:
        raise Fail(f"answer = {a.answer['n_gpus']} x {a.answer['choice']['name']!r}, but right_size on your candidates "
                   f"gives {best.n_gpus} x {best.choice.name!r}")
    for key in ("usd_per_gpu_hour", "throughput_per_s", "latency_ms"):
        close(a.answer["choice"][key], getattr(best.choice, key), f"answer.choice.{key}", "the chosen candidate's",
              rel=1e-9)
    close(a.answer["usd_per_hour"], best.usd_per_hour, "answer.usd_per_hour", "n_gpus x the chosen card's price", rel=1e-9)
    notes.append(f"answer: {best.n_gpus} x {best.choice.name}, ${best.usd_per_hour:.4g}/h, as right_size gives from your "
                 "numbers")
    notes.append(ref.against(f"tpot:{min(a.decode)}", a.decode[min(a.decode)]["tpot_ms"],
                             f"decode[{min(a.decode)}]['tpot_ms']", "ms"))
    if bw == a.copy_gbs:
        notes.append(ref.against("copy", a.MY_BANDWIDTH_GBS, "MY_BANDWIDTH_GBS (your copy_gbs)", "GB/s"))
    return notes


def beyond_gpus(a, ref):
    slo, demand = _numbers_ok(a, ref)
    month = demand * accelerators.HOURS_PER_MONTH * 3600
    close(a.MONTHLY_TOKENS, month, "MONTHLY_TOKENS", f"DEMAND_TOKENS_PER_S over a {accelerators.HOURS_PER_MONTH:g}-hour "
          "month, in tokens", rel=1e-9)
    mid = sorted(a.decode)[len(a.decode) // 2]
    want = accelerators.cheapest_for_slo(measured_tpot_ms=a.decode[mid]["tpot_ms"], batch_size=mid, slo_tpot_ms=slo,
                                         output_tokens_per_month=month, model_bytes=a.BYTES_PER_STEP,
                                         measured_bandwidth_gbs=a.MY_BANDWIDTH_GBS)
    got = a.BEYOND
    close(got["measured_bandwidth_gbs"], want.measured_bandwidth_gbs, "BEYOND's measured bandwidth", "MY_BANDWIDTH_GBS",
          rel=1e-9)
    close(got["demand_tokens_per_s"], want.demand_tokens_per_s, "BEYOND's demand", "MONTHLY_TOKENS over the month",
          rel=1e-9)
    mine = [(o["accelerator"], o["devices"]) for o in got["options"]]
    exp = [(o.accelerator, o.devices) for o in want.options]
    if mine != exp or {r["accelerator"] for r in got["rejected"]} != {r.accelerator for r in want.rejected}:
        raise Fail(f"BEYOND qualifies {mine or 'nothing'}, but cheapest_for_slo on the middle batch (b{mid}: its TPOT "
                   f"at batch {mid}), TPOT_SLO_MS, MONTHLY_TOKENS, BYTES_PER_STEP and MY_BANDWIDTH_GBS qualifies "
                   f"{exp or 'nothing'} (accelerator, devices)")
    for o, w in zip(got["options"], want.options, strict=True):
        close(o["scaled_tpot_ms"], w.scaled_tpot_ms, f"BEYOND's scaled TPOT on {w.accelerator}", "the middle batch's TPOT "
              "x MY_BANDWIDTH_GBS / the chip's bandwidth", rel=1e-9)
        close(o["monthly_cost_usd"], w.monthly_cost_usd, f"BEYOND's monthly cost on {w.accelerator}", "devices x price "
              "x hours a month", rel=1e-9)
    pick = want.cheapest
    if (got["cheapest"] or {}).get("accelerator") != (pick.accelerator if pick else None):
        raise Fail(f"BEYOND.cheapest is {(got['cheapest'] or {}).get('accelerator')!r}, expected "
                   f"{pick.accelerator if pick else None!r}: the first of its options")
    return [("beyond the GPUs: " + (f"{pick.devices} x {pick.accelerator} at ${pick.monthly_cost_usd:,.0f} a month, as "
                                    "cheapest_for_slo gives from your numbers" if pick else
                                    "no accelerator meets the SLO and holds the model, as cheapest_for_slo says")),
            ref.against(f"tpot:{mid}", a.decode[mid]["tpot_ms"], f"decode[{mid}]['tpot_ms']", "ms")]


# -- 4. fault tolerance ------------------------------------------------------------------------------

def resume_params(ctx, a) -> dict:
    """The resumed run's parameters: the interrupted run's folder and config (its case). Fails here
    when the interrupted run itself failed."""
    got = a.calls.get(VICTIM) or []
    if not got or not got[0].ok:
        err = got[0].error if got else "it did not run"
        raise Fail(f"the training run with your capture_rng_state failed before the grader stopped it: {err}")
    _, run_dir, config = a.inputs[VICTIM][0]
    return {"run_dir": run_dir, "config": config}


def resume(a, ref):
    kill_after, _, config = a.inputs[VICTIM][0]
    every = config["checkpoint_every"]
    res = a.harness if isinstance(a.harness, dict) else {}
    digests, start, round_trip = res.get("digests"), res.get("resumed_from"), res.get("round_trip")
    if not isinstance(digests, dict) or type(start) is not int or not isinstance(round_trip, list):
        raise Fail("the resumed run did not report its final state: not the grader's harness result")
    want_start = (kill_after // every) * every
    if start != want_start:
        raise Fail(f"the resumed run started from step {start}, not from the newest checkpoint the interrupted run "
                   f"wrote (step {want_start})")
    want = ref.resume_digests(config)
    if want is None:
        raise Fail("the grader has no uninterrupted run for this configuration: a fault of the course")
    differing = [c for c in COMPONENTS if digests.get(c) != want.get(c)]
    if round_trip:
        what = "raised " + round_trip[0] if any(":" in str(r) for r in round_trip) else \
            "these generators did not repeat their draws: " + ", ".join(map(str, round_trip))
        raise Fail(f"after restore_rng_state(capture_rng_state()), {what}: capture and restore every generator (torch, "
                   "CUDA when it is initialised, Python's random, NumPy)" + (
                       f"; the resumed run also ends different from an uninterrupted one in: {', '.join(differing)}"
                       if differing else ""))
    if differing:
        ops = [str(op) for op in res.get("nondeterministic_ops") or []]
        raise Fail(f"killed after a step the grader drew and resumed in a fresh process from the checkpoint of step "
                   f"{start}, the run ends different from an uninterrupted one in: {', '.join(differing)}"
                   + (f" (ops without a deterministic kernel ran: {'; '.join(ops)[:200]})" if ops else ""))
    return [f"killed after a step the grader drew, resumed in a fresh process from step {start} of {config['steps']}: "
            "model, optimizer, scheduler, loader and every RNG bit-identical to the grader's uninterrupted run"]


def checkpoint_overhead(a, ref):
    notes = [cases(a.calls["checkpoint_overhead_pct"], [100 * s / (e * t) for s, t, e in a.inputs["checkpoint_overhead_pct"]],
                   "checkpoint_overhead_pct", "100 x save_ms / (every_steps x step_ms)", approx(1e-9))]
    ctx = ref.ctx
    every = ctx.sizes.ckpt_every
    ov = a.overhead
    step = _timing(ov["step"], "overhead['step']")
    sync = _timing(ov["sync_save"], "overhead['sync_save']")
    blocking = _timing(ov["async_blocking"], "overhead['async_blocking']")
    _timing(ov["async_total"], "overhead['async_total']")
    close(a.sync_overhead_pct, 100 * sync / (every * step), "sync_overhead_pct", f"checkpoint_overhead_pct of the "
          f"sync_save and step medians, every {every} steps", rel=1e-6)
    close(a.async_overhead_pct, 100 * blocking / (every * step), "async_overhead_pct", f"checkpoint_overhead_pct of the "
          f"async_blocking and step medians, every {every} steps", rel=1e-6)
    least = 3 * ref.ckpt_weight_bytes
    if ov["checkpoint_bytes"] < 0.99 * least:
        raise Fail(f"overhead['checkpoint_bytes'] = {ov['checkpoint_bytes']:,}, less than the weights and AdamW's two "
                   f"moments of {ctx.sizes.ckpt_model} ({least:,} bytes): not a checkpoint of this run")
    return notes + [ref.against("ckpt:step", step, "overhead['step'] median", "ms"),
                    ref.against("ckpt:sync_save", sync, "overhead['sync_save'] median", "ms")]


# -- 5. XLA recompilation ------------------------------------------------------------------------------

def recompiles(a, ref):
    results, wrong, first = a.calls["bucket_length"], 0, None
    for r, (n, b) in zip(results, a.inputs["bucket_length"], strict=True):
        buckets = b["__tuple__"]
        if n > max(buckets):
            if r.ok or not r.error.startswith("ValueError"):
                wrong += 1
                first = first or f"expected ValueError (no bucket holds the length), got {r.value if r.ok else r.error!r:.80}"
        else:
            want = xla.bucket_length(n, buckets)
            if not r.ok or r.value != want or type(r.value) is bool:
                wrong += 1
                first = first or f"expected {want}, got {r.value if r.ok else 'it raised ' + r.error!r:.80}"
    if wrong:
        raise Fail(f"bucket_length disagreed with the rule on {wrong} of {len(results)} hidden cases (first: {first}). "
                   "The rule: the smallest bucket >= n; ValueError when no bucket holds n")
    notes = [f"bucket_length: right on all {len(results)} hidden cases"]
    got = (a.compiles_unpadded, a.compiles_bucketed)
    if got not in ref.compiles:
        counted = " or ".join(f"{u} unpadded and {b} bucketed" for u, b in ref.compiles)
        raise Fail(f"compiles_unpadded = {got[0]}, compiles_bucketed = {got[1]}, but the grader counted {counted} "
                   "(one XLA compile per distinct input shape)")
    c, r, e = (positive(v, k) for v, k in ((a.compile_ms, "compile_ms"), (a.run_ms, "run_ms"), (a.eager_ms, "eager_ms")))
    if c <= r:
        raise Fail(f"compile_ms ({c:.3g}) <= run_ms ({r:.3g}): an XLA compile takes longer than a run of the program it "
                   "makes; measure the compile of a fresh jit (utils.tpu.xla.compile_vs_run)")
    want = xla.break_even_calls(c, e - r)
    if math.isinf(want) != math.isinf(a.break_even_calls) or (math.isfinite(want) and not math.isclose(
            a.break_even_calls, want, rel_tol=1e-6)):
        raise Fail(f"break_even_calls = {a.break_even_calls:.6g}, expected {want:.6g}: compile_ms / (eager_ms - run_ms), "
                   "math.inf when jit saves nothing per call")
    notes.append(f"compiles: {got[0]} unpadded, {got[1]} bucketed, as the grader counted")
    return notes + [ref.against("xla:compile", c, "compile_ms", "ms"), ref.against("xla:run", r, "run_ms", "ms"),
                    ref.against("xla:eager", e, "eager_ms", "ms")]


# -- 6. topology ---------------------------------------------------------------------------------------

def slowest(a, ref):
    want = [topology.slowest_gpu_link(topology.parse_topo(arg["args"][0])) for (arg,) in a.inputs["slowest_gpu_link"]]
    return [cases(a.calls["slowest_gpu_link"], want, "slowest_gpu_link", "the path code of the slowest link between any "
                  "two GPUs (the lowest topology.path_rank among GPU pairs; NIC links do not count)")]


# -- 7. a pod in miniature ------------------------------------------------------------------------------

NOTEBOOK_MESHES = {"MESH_DP": {"data": 8}, "MESH_2D": {"data": 4, "model": 2}}
WANT_SPECS = {"DP_X": ("MESH_DP", ("data", None)), "DP_W": ("MESH_DP", (None, None)),
              "TP_X": ("MESH_2D", ("data", None)), "TP_W": ("MESH_2D", (None, "model"))}


def pod_sharding(a, ref):
    for name, want in NOTEBOOK_MESHES.items():
        got = getattr(a, name)
        if list(got.items()) != list(want.items()):
            raise Fail(f"{name} has the axes {got}, expected {want}: Mesh(np.array(DEVICES).reshape(...), axis names)")
    for name, (mesh_name, want) in WANT_SPECS.items():
        is_spec, entries = getattr(a, name)
        if not is_spec:
            raise Fail(f"{name} is not a jax.sharding.PartitionSpec: write P(...) with the mesh axis (or None) for each "
                       "dimension")
        mesh = NOTEBOOK_MESHES[mesh_name]
        if layout_of(entries, mesh, 2) != layout_of(want, mesh, 2):
            raise Fail(f"{name} = P{entries} does not lay its array out as P{want} does on {mesh_name} ({mesh})")
    wrong, first = 0, None
    for r, (x, w, mesh, x_spec, w_spec) in zip(a.calls[SHARDED], a.inputs[SHARDED], strict=True):
        why = _sharded_wrong(r, x, w, mesh, x_spec, w_spec)
        if why:
            wrong += 1
            first = first or why
    if wrong:
        raise Fail(f"sharded_matmul was wrong on {wrong} of {len(a.inputs[SHARDED])} hidden meshes, arrays and specs "
                   f"(first: {first}). The rule: place x and w with jax.device_put(array, NamedSharding(mesh, spec)) and "
                   "return jax.jit(jnp.matmul) of the two: x @ w, laid out over the mesh as the specs imply")
    return [f"sharded_matmul: x @ w on all {len(a.inputs[SHARDED])} hidden meshes, each laid out as its specs imply; "
            "DP_X, DP_W, TP_X and TP_W lay out as asked"]


def _sharded_wrong(r, x, w, mesh, x_spec, w_spec) -> str:
    """Why one sharded case is wrong ("" when it is right)."""
    if not r.ok:
        return f"it raised {r.error}"
    v = r.value if isinstance(r.value, dict) else {}
    want = np.asarray(x, dtype=np.float64) @ np.asarray(w, dtype=np.float64)
    try:
        values = np.asarray(v.get("values"), dtype=np.float64)
    except (TypeError, ValueError):
        return "its result's values could not be read"
    if values.shape != want.shape or not np.allclose(values, want, rtol=1e-5, atol=1e-4):
        return f"the result is not x @ w (shape {list(values.shape)}, expected {list(want.shape)})"
    kind = str(v.get("type", ""))
    if v.get("shards") is None or "jax" not in kind.lower():
        return f"it returned a {kind.rsplit('.', 1)[-1] or 'value'}, not a JAX array placed on the mesh"
    devices = list(range(math.prod(mesh.values())))
    if v.get("devices") != devices:
        return (f"the result lives on devices {v.get('devices')}, not on the mesh's {devices}: place x and w with "
                "NamedSharding on the mesh it is given and run the matmul under jax.jit")
    out_spec = [x_spec[0], w_spec[1]]
    if v.get("shards") != expected_layout(mesh, want.shape, out_spec):
        return f"the result is not laid out as P{tuple(out_spec)}, which x and w placed by their specs give"
    return ""


def shard_bytes(a, ref):
    want = [expected_shard_bytes(s["__tuple__"], i, m, spec["args"]) for s, i, m, spec in a.inputs["per_device_bytes"]]
    return [cases(a.calls["per_device_bytes"], want, "per_device_bytes", "itemsize x the product over dimensions of "
                  "dim / (the product of the sizes of the mesh axes its spec entry names; 1 for None or a dimension "
                  "past the spec's end); axes the spec does not name copy the array",
                  lambda got, want: type(got) in (int, float) and got == want)]


# -- the checks: every hidden case in one strict sandbox (one process start), the resumed run in its own ---

_SANDBOXED = dict(setup=SETUP, imports=(HARNESS,))

CHECKS = [
    Check("test_speedup", speedup, calls={"attainable_speedup": speedup_cases}, forbid=("utils.measure.flops:attainable_tflops",)),
    Check("test_points", points, measures=("points",)),
    Check("test_cost_functions", cost_functions, calls={"cost_per_sample_usd": rate_cases,
                                                       "cost_per_million_tokens_usd": rate_cases},
          forbid=("utils.capacity.cost:cost_per_sample_usd", "utils.capacity.cost:cost_per_million_tokens_usd")),
    Check("test_measured_costs", measured_costs, measures=("train", "decode")),
    Check("test_right_sizing", right_sizing, calls={"estimate_tpot_ms": estimate_cases},
          forbid=("utils.serving.inference:estimate_tpot_ms",), measures=("decode", "points")),
    Check("test_beyond_gpus", beyond_gpus, measures=("decode",)),
    Check("test_resume", resume, calls={VICTIM: victim_cases}, forbid=RNG, measures=("resume",),
          harness=f"{HARNESS}:resume", harness_params=resume_params, timeout_s=600.0, **_SANDBOXED),
    Check("test_checkpoint_overhead", checkpoint_overhead, calls={"checkpoint_overhead_pct": overhead_cases},
          measures=("checkpoint",), strict=True),
    Check("test_spot", spot, calls={"spot_expected_cost_usd": spot_cases},
          forbid=tuple(f"utils.capacity.cost:{f}" for f in ("spot_job", "on_demand_job", "compare_spot_on_demand",
                                                    "break_even_preemptions_per_h"))),
    Check("test_recompiles", recompiles, calls={"bucket_length": bucket_cases},
          forbid=("utils.tpu.xla:bucket_length", "utils.tpu.xla:padded_fraction"), measures=("xla",)),
    Check("test_topology", slowest, calls={"slowest_gpu_link": topology_cases}, forbid=("utils.device.topology:slowest_gpu_link",)),
    Check("test_pod_sharding", pod_sharding, calls={SHARDED: sharded_cases}, strict=True, **_SANDBOXED),
    Check("test_shard_bytes", shard_bytes, calls={"per_device_bytes": shard_bytes_cases},
          forbid=tuple(f"utils.tpu.tpu_pod:{f}" for f in ("jax_shard_bytes", "jax_shard_bytes_many", "layout")),
          imports=(HARNESS,)),
]
