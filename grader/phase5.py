"""The checks the hidden tests of phase 5 (``05_hardware_and_cost``) run.

Pure cells (speedup across the spec table, cost functions, spot cost, the TPOT estimate, the
slowest link of a topology) are compared exactly with the reference implementations in
``utils``. Measured cells follow phase 0's rules: with a GPU here, or with no GPU record to
grade, the grader re-measures the same work in the same kernel session and compares within
a band from the measured spread ("measured live"); with no GPU here and a GPU record from the
learner, it grades the record (:mod:`grader.phase5_records`). Two cells are always live,
because a CPU reproduces them exactly: the resume test (a fresh kill-and-resume run with the
learner's RNG functions, killed after a step the grader picks) and the recompilation counts
(XLA compiles once per distinct input shape on every backend).

Sizes, device and dtype come from ``utils.env`` here, not from the notebook's variables; the
functions the notebook times (``train_step``, ``generate_tokens``) are checked against the
locked cell that defines them. Hidden tests get this module from ``grader.phase(5)``, with
fresh copies of ``checks.py``, ``phase5_records.py`` and ``remeasure.py`` (``grader/__init__.py``);
the topology and sharding cells' checks are in ``grader/phase5_wiring.py``, loaded afresh the same way.
"""
from __future__ import annotations

import math
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

# grader.phase(5) rebinds these to fresh copies: use them at call time only
from grader import checks, remeasure
from grader import phase5_records as records
from utils.inference import estimate_tpot_ms
from utils.units import gb_per_s, tflop_per_s

PHASE = "05_hardware_and_cost"
EXTRA_MODULES = ("utils.cost", "utils.checkpoint", "utils.checkpointed_run", "utils.kill_harness", "utils.xla",
                 "utils.topology", "utils.tpu_pod")  # phase 5's own, beside checks' list
CPU_TFLOPS_CAP = 50.0  # estimate: no CPU socket comes near 50 fp32 TFLOP/s
ATTEMPTS = 3  # a reference that misses the band is measured again
REL = 1e-9  # pure arithmetic: the same formula gives the same float, up to operation order


# -- setting, tampering, reporting ------------------------------------------------------------

def setting() -> tuple[Any, str, Any]:
    """``(sizes, device, matmul dtype)`` as the notebook's setup cells choose them."""
    return remeasure.setting(PHASE)


def untampered() -> None:
    """:func:`checks.assert_untampered` plus phase 5's modules (cost, checkpoint, xla, topology)."""
    checks.assert_untampered(EXTRA_MODULES)


# -- 1. the roofline across the spec table ----------------------------------------------------

def reference_speedup(intensity: float, from_spec, to_spec, dtype: str = "bf16") -> float:
    from utils.flops import attainable_tflops

    a = attainable_tflops(intensity, from_spec.peak_tflops(dtype), from_spec.bandwidth_gbs)
    return attainable_tflops(intensity, to_spec.peak_tflops(dtype), to_spec.bandwidth_gbs) / a


def check_speedup(attainable_speedup) -> None:
    """Exact against utils.flops.attainable_tflops, over every pair of the spec table."""
    from utils.hardware import SPECS

    for dtype in ("bf16", "fp16", "fp32"):
        specs = [s for s in SPECS.values() if s.peak_tflops(dtype) and s.bandwidth_gbs]
        for a in specs:
            for b in specs:
                for i in (0.1, 1.0, 30.0, 206.0, 295.0, 1000.0, 1e4):
                    got = checks.call(attainable_speedup, i, a, b, dtype, name="attainable_speedup")
                    checks.assert_close(got, reference_speedup(i, a, b, dtype),
                                        f"attainable_speedup({i}, {a.name}, {b.name}, {dtype!r})", rel=REL)


def measure_copy(numel: int, device) -> dict:
    import torch

    x = torch.randn(numel, device=device)
    out = torch.empty_like(x)
    t = checks.timed(lambda: out.copy_(x))
    return {"time": t, "gbs": gb_per_s(8 * numel, t.median_ms)}


def check_points(matmul_tflops, matmul_time, copy_gbs, copy_time) -> None:
    """The matmul and copy rates follow from their timings, sit below the datasheet, and
    agree with the grader's re-measurement."""
    if checks.begin("your roofline points (matmul, copy)") == checks.RECORD:
        return records.points()
    untampered()
    sizes, device, dtype = setting()
    n, numel = sizes.matmul_n, sizes.copy_numel
    checks.assert_close(matmul_tflops, tflop_per_s(2 * n**3, checks.median(matmul_time, "matmul_time")),
                        "matmul_tflops (2 n^3 FLOPs over matmul_time.median_ms)", rel=1e-3)
    checks.assert_close(copy_gbs, gb_per_s(8 * numel, checks.median(copy_time, "copy_time")),
                        "copy_gbs (read and write 4 bytes per element over copy_time.median_ms)", rel=1e-3)
    spec = remeasure.gpu_spec()
    if device == "cuda" and spec:
        checks.assert_not_above(matmul_tflops, spec.peak_tflops(checks.dtype_name(dtype)), "matmul_tflops",
                                "TFLOP/s", f"the {spec.name} datasheet peak")
        checks.assert_not_above(copy_gbs, spec.bandwidth_gbs, "copy_gbs", "GB/s", f"the {spec.name} datasheet bandwidth")
    else:
        checks.assert_not_above(matmul_tflops, CPU_TFLOPS_CAP, "matmul_tflops", "TFLOP/s", "what any CPU can do (an estimate)")

    def compare():
        mm, cp = remeasure.matmul(n, dtype, device), measure_copy(numel, device)
        rel_mm = checks.band(mm["time"], matmul_time)
        rel_cp = checks.band(cp["time"], copy_time)
        checks.assert_in_band(matmul_tflops, mm["tflops"], rel_mm, "matmul_tflops", "TFLOP/s")
        checks.assert_in_band(copy_gbs, cp["gbs"], rel_cp, "copy_gbs", "GB/s")
        checks.say_versus(f"{n}^3 matmul", mm["tflops"], matmul_tflops, "TFLOP/s", rel_mm)
        checks.say_versus("copy", cp["gbs"], copy_gbs, "GB/s", rel_cp)

    remeasure.agree(compare, ATTEMPTS)


# -- 2. cost from your own measurements ------------------------------------------------------

def check_cost_functions(cost_per_sample_usd, cost_per_million_tokens_usd) -> None:
    """Exact against utils.cost on a grid (one GPU)."""
    from utils import cost

    for rate_per_s in (0.5, 12.0, 381e3, 1.7e6):
        for usd in (0.1869, 1.0, 3.99, 98.32):
            checks.assert_close(checks.call(cost_per_sample_usd, rate_per_s, usd, name="cost_per_sample_usd"),
                                cost.cost_per_sample_usd(rate_per_s, usd), f"cost_per_sample_usd({rate_per_s}, {usd})",
                                rel=REL)
            checks.assert_close(checks.call(cost_per_million_tokens_usd, rate_per_s, usd, name="cost_per_million_tokens_usd"),
                                cost.cost_per_million_tokens_usd(rate_per_s, usd),
                                f"cost_per_million_tokens_usd({rate_per_s}, {usd})", rel=REL)


def _decode_model_ok(generate_tokens, sizes) -> float:
    """generate_tokens is the locked one, on the preset's model and the given prompt; returns
    the model's weight bytes."""
    from utils.flops import count_params, non_embedding_params_from_config
    from utils.models import preset_config

    checks.assert_given(generate_tokens, PHASE, "throughput_setup", "generate_tokens")
    g = getattr(generate_tokens, "__globals__", {})
    model, prompt = g.get("decode_model"), g.get("PROMPT")
    want = non_embedding_params_from_config(preset_config(sizes.model))
    if model is None or count_params(model) != want:
        raise AssertionError(f"generate_tokens does not run {sizes.model} ({want:,} non-embedding parameters)")
    if prompt is None or tuple(prompt.shape) != (max(sizes.decode_batches), sizes.prompt_len):
        raise AssertionError(f"PROMPT must be {max(sizes.decode_batches)} x {sizes.prompt_len} tokens, as the locked cell makes it")
    return records.weight_bytes(model)


def measure_decode(generate_tokens, batch: int, new_tokens: int) -> dict:
    t1 = checks.timed(generate_tokens, batch, 1, warmup=1, max_runs=10, budget_s=3.0)
    tn = checks.timed(generate_tokens, batch, new_tokens, warmup=1, max_runs=10, budget_s=3.0)
    return {"t1": t1, "tn": tn, "tpot_ms": (tn.median_ms - t1.median_ms) / (new_tokens - 1)}


def check_measured_costs(samples_per_s, train, decode, usd_per_sample, usd_per_million_tokens, cost_per_sample_usd,
                         cost_per_million_tokens_usd, price_usd_per_hour, train_step, generate_tokens, x, y) -> None:
    """Throughputs from the learner's timings, re-measured; costs from their functions."""
    from utils import cost

    if checks.begin("training samples/s, decode tokens/s and what they cost") == checks.RECORD:
        return records.costs(cost_per_sample_usd, cost_per_million_tokens_usd)
    untampered()
    sizes, device, _ = setting()
    checks.assert_given(train_step, PHASE, "throughput_setup", "train_step")
    weights = _decode_model_ok(generate_tokens, sizes)
    if tuple(x.shape) != (sizes.train_batch, sizes.seq_len):
        raise AssertionError(f"the batch has shape {tuple(x.shape)}, expected {(sizes.train_batch, sizes.seq_len)}")
    if not isinstance(train, dict) or not {"tokens_per_s", "median_ms", "p20_ms", "p80_ms"} <= set(train):
        raise AssertionError("train must be the dict from stopwatch.summary()")
    sps = checks.assert_positive(samples_per_s, "samples_per_s")
    checks.assert_close(sps, checks.as_number(train["tokens_per_s"], "train['tokens_per_s']") / sizes.seq_len,
                        "samples_per_s (train['tokens_per_s'] / seq_len)", rel=1e-6)
    records.decode_dict_ok(decode, sizes)
    price = records.device_price(remeasure.gpu_spec())[1]
    checks.assert_close(price_usd_per_hour, price, "PRICE_USD_PER_HOUR (the table's price for your GPU)", rel=REL)
    best = max(sizes.decode_batches)
    checks.assert_close(usd_per_sample, cost.cost_per_sample_usd(sps, price), "usd_per_sample", rel=1e-6)
    checks.assert_close(usd_per_million_tokens, cost.cost_per_million_tokens_usd(decode[best]["tokens_per_s"], price),
                        f"usd_per_million_tokens (at batch {best})", rel=1e-6)
    spec = remeasure.gpu_spec()
    if device == "cuda" and spec:
        for b, d in decode.items():
            gbs = d["tokens_per_s"] / b * weights / 1e9
            checks.assert_not_above(gbs, spec.bandwidth_gbs, f"weights read per second at batch {b}", "GB/s",
                                    f"the {spec.name} datasheet bandwidth")
        records.train_plausible(sps * sizes.seq_len, sizes, spec)

    def compare():
        ref = checks.timed(train_step, x, y, warmup=1, max_runs=10, budget_s=5.0)
        ref_sps = sizes.train_batch / ref.median_ms * 1e3
        rel = checks.band(ref, checks.Times(train))
        checks.assert_in_band(sps, ref_sps, rel, "samples_per_s", "samples/s")
        checks.say_versus("training", ref_sps, sps, "samples/s", rel)
        for b in (min(sizes.decode_batches), best):
            ref_d = measure_decode(generate_tokens, b, sizes.new_tokens)
            rel = checks.difference_band((ref_d["tn"], ref_d["t1"]), (decode[b]["tn"], decode[b]["t1"]))
            checks.assert_in_band(decode[b]["tpot_ms"], ref_d["tpot_ms"], rel, f"decode[{b}]['tpot_ms']", "ms")
            checks.say_versus(f"decode TPOT at batch {b}", ref_d["tpot_ms"], decode[b]["tpot_ms"], "ms", rel)

    remeasure.agree(compare, ATTEMPTS)


def check_spot(spot_expected_cost_usd) -> None:
    """Exact against utils.cost.spot_job, infinite where the job never finishes."""
    from utils import cost

    for work in (1.0, 100.0):
        for tau in (0.25, 1.0, 4.0):
            for lam in (0.0, 0.05, 0.5, 2.0):
                for delta, restart in ((0.0, 0.0), (0.02, 0.1)):
                    args = (work, 2.5, tau, delta, restart, lam)
                    want = cost.spot_job(work, 2.5, checkpoint_interval_h=tau, checkpoint_write_h=delta,
                                         restart_h=restart, preemptions_per_h=lam).cost_usd
                    got = checks.call(spot_expected_cost_usd, *args, name="spot_expected_cost_usd")
                    if math.isinf(want):
                        if not (isinstance(got, (int, float)) and math.isinf(got) and got > 0):
                            raise AssertionError(f"spot_expected_cost_usd{args} = {got!r}: preemptions outpace the "
                                                 "checkpoints, so the job never finishes: return math.inf")
                    else:
                        checks.assert_close(got, want, f"spot_expected_cost_usd{args}", rel=REL)


# -- 3. right-sizing --------------------------------------------------------------------------

def check_right_sizing(estimate_fn, candidates, answer, decode, generate_tokens, my_bandwidth_gbs, bytes_per_step,
                       slo_ms, demand_per_s, copy_gbs) -> None:
    """The TPOT estimate exact; the candidates and the answer exactly what the reference gives
    from the learner's decode measurements and bandwidth, which are re-measured."""
    mode = checks.begin("your right-sizing answer")
    for meas in (0.2, 5.0, 40.0):
        for nbytes in (1e6, 5e8, 2.2e9):
            for mine, other in ((320.0, 4800.0), (4800.0, 300.0), (8.0, 2039.0)):
                checks.assert_close(checks.call(estimate_fn, meas, nbytes, mine, other, name="estimate_tpot_ms"),
                                    estimate_tpot_ms(meas, nbytes, mine, other),
                                    f"utils.inference.estimate_tpot_ms({meas}, {nbytes:g}, {mine}, {other})", rel=REL)
    if mode == checks.RECORD:
        return records.right_sizing()
    untampered()
    sizes, device, _ = setting()
    spec = remeasure.gpu_spec()
    weights = _decode_model_ok(generate_tokens, sizes)
    records.decode_dict_ok(decode, sizes)
    want_bw = records.my_bandwidth_gbs(spec, checks.as_number(copy_gbs, "copy_gbs"))
    checks.assert_close(my_bandwidth_gbs, want_bw, "MY_BANDWIDTH_GBS (the datasheet's on a GPU in the table, "
                        "else your copy_gbs)", rel=REL)
    checks.assert_close(bytes_per_step, weights, "BYTES_PER_STEP (the decode model's weight bytes)", rel=REL)
    tpots = {b: d["tpot_ms"] for b, d in decode.items()}
    want_slo, want_demand = records.slo_and_demand(tpots, {b: d["tokens_per_s"] for b, d in decode.items()})
    checks.assert_close(slo_ms, want_slo, "TPOT_SLO_MS", rel=REL)
    checks.assert_close(demand_per_s, want_demand, "DEMAND_TOKENS_PER_S", rel=REL)
    expected = records.reference_candidates(tpots, want_bw, weights, spec)
    records.same_candidates(candidates, expected)
    records.same_answer(answer, expected, want_slo, want_demand)

    def compare():
        b = min(sizes.decode_batches)
        ref_d = measure_decode(generate_tokens, b, sizes.new_tokens)
        rel = checks.difference_band((ref_d["tn"], ref_d["t1"]), (decode[b]["tn"], decode[b]["t1"]))
        checks.assert_in_band(decode[b]["tpot_ms"], ref_d["tpot_ms"], rel, f"decode[{b}]['tpot_ms']", "ms")
        checks.say_versus(f"decode TPOT at batch {b}", ref_d["tpot_ms"], decode[b]["tpot_ms"], "ms", rel)
        if not (spec and spec.bandwidth_gbs):  # the estimate scaled from your measured copy
            cp = measure_copy(sizes.copy_numel, device)
            rel_cp = checks.band(cp["time"])
            checks.assert_in_band(my_bandwidth_gbs, cp["gbs"], rel_cp, "MY_BANDWIDTH_GBS (your copy_gbs)", "GB/s")
            checks.say_versus("copy", cp["gbs"], my_bandwidth_gbs, "GB/s", rel_cp)

    remeasure.agree(compare, ATTEMPTS)
    checks.say(f"  answer: {answer.n_gpus} x {answer.choice.name}, ${answer.usd_per_hour:.4g}/h, as the reference "
               "gives from your numbers")


def check_beyond_gpus(beyond, monthly_tokens, decode, slo_ms, demand_per_s, bytes_per_step, my_bandwidth_gbs) -> None:
    """BEYOND exactly what :func:`utils.accelerators.cheapest_for_slo` gives on the right-sizing
    numbers (:func:`grader.phase5_records.beyond_gpus_ok`; the numbers: :func:`check_right_sizing`)."""
    checks.assert_untampered(EXTRA_MODULES)
    checks.assert_constants_unchanged(("utils.accelerators",))
    records.beyond_gpus_ok(beyond, monthly_tokens, decode, slo_ms, demand_per_s, bytes_per_step, my_bandwidth_gbs, REL)


# -- 4. fault tolerance -----------------------------------------------------------------------

def run_config(sizes, device: str):
    from utils.checkpointed_run import RunConfig

    return RunConfig(steps=sizes.ckpt_steps, checkpoint_every=sizes.ckpt_every, preset=sizes.ckpt_model,
                     batch_size=sizes.ckpt_batch, seq_len=sizes.ckpt_seq_len, device=device)


def grader_kill_step(sizes) -> int:
    """After the second checkpoint's next step (step 9 of 12 by default): the resume then
    starts a new epoch, so the data order must come back from Python's restored RNG."""
    return min(sizes.ckpt_steps - 1, 2 * sizes.ckpt_every + 1)


def _rng_round_trip(capture, restore) -> None:
    """Draw from every generator after a restore: each must repeat the draws made after the capture."""
    import numpy as np
    import torch

    def draws():
        out = {"torch": torch.rand(4).tolist(), "python": [random.random() for _ in range(4)],
               "numpy": np.random.rand(4).tolist()}
        if torch.cuda.is_available():
            out["cuda"] = torch.rand(4, device="cuda").tolist()
        return out

    state = checks.call(capture, name="capture_rng_state")
    first = draws()
    checks.call(restore, state, name="restore_rng_state")
    again = draws()
    wrong = [k for k in first if first[k] != again[k]]
    if wrong:
        raise AssertionError(f"after restore_rng_state(capture_rng_state()), these generators do not repeat their "
                             f"draws: {', '.join(wrong)}: capture and restore each of them")


def check_resume(capture_rng_state, restore_rng_state) -> None:
    """Always live (a CPU reproduces it exactly): the learner's RNG functions round-trip every
    generator, and a fresh run with them, SIGKILLed after a step the grader picks and resumed,
    ends bit-identical to an uninterrupted run."""
    from utils import checkpointed_run, kill_harness

    sizes, device, _ = setting()
    k = grader_kill_step(sizes)
    checks.say(f"{checks.LIVE} on {'the GPU' if device == 'cuda' else 'the CPU'}: a kill-and-resume run with your RNG "
               f"functions, killed after step {k} of {sizes.ckpt_steps}")
    untampered()
    _rng_round_trip(capture_rng_state, restore_rng_state)
    work = Path(tempfile.mkdtemp(prefix="gpulab-resume-"))
    try:
        with checks.quiet():
            hooks = checkpointed_run.write_hooks(work / "hooks.py", capture_rng_state, restore_rng_state)
    except ValueError as exc:
        raise AssertionError(str(exc)) from None
    try:
        with checks.quiet():
            res = kill_harness.kill_and_resume(work / "run", run_config(sizes, device), k, hooks_file=hooks, timeout_s=540)
    except RuntimeError as exc:  # a training process that failed: say why, in one line
        raise AssertionError(f"the kill-and-resume run failed: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not res["identical"]:
        ops = res.get("nondeterministic_ops") or []
        raise AssertionError(f"killed after step {res['killed_after_step']} and resumed from step {res['resumed_from']}, "
                             f"the run ends different from an uninterrupted one in: {', '.join(res['differing'])}"
                             + (f" (ops without a deterministic kernel ran: {'; '.join(ops)[:200]})" if ops else ""))
    checks.say(f"  killed after step {res['killed_after_step']}, resumed from step {res['resumed_from']}: model, "
               "optimizer, scheduler, loader and every RNG bit-identical to the uninterrupted run")


def check_checkpoint_overhead(checkpoint_overhead_pct, overhead, sync_overhead_pct, async_overhead_pct) -> None:
    """The percentage function exact; the learner's percentages from their measurement; the
    step and save times within a band of the grader's own measurement."""
    from utils import checkpointed_run

    mode = checks.begin("checkpoint time and overhead")
    for save, step, every in ((10.0, 5.0, 4), (1500.0, 300.0, 100), (0.5, 20.0, 1)):
        checks.assert_close(checks.call(checkpoint_overhead_pct, save, step, every, name="checkpoint_overhead_pct"),
                            100 * save / (every * step), f"checkpoint_overhead_pct({save}, {step}, {every})", rel=REL)
    if mode == checks.RECORD:
        return records.checkpoint_overhead()
    untampered()
    sizes, device, _ = setting()
    if not isinstance(overhead, dict) or not {"step", "sync_save", "async_blocking"} <= set(overhead):
        raise AssertionError("overhead must be the dict from checkpointed_run.measure_checkpoint_overhead")
    step = checks.median(overhead["step"], "overhead['step']")
    sync, blocking = checks.median(overhead["sync_save"], "overhead['sync_save']"), checks.median(overhead["async_blocking"], "overhead['async_blocking']")
    checks.assert_close(sync_overhead_pct, 100 * sync / (sizes.ckpt_every * step), "sync_overhead_pct", rel=1e-6)
    checks.assert_close(async_overhead_pct, 100 * blocking / (sizes.ckpt_every * step), "async_overhead_pct", rel=1e-6)

    def compare():
        work = Path(tempfile.mkdtemp(prefix="gpulab-ckpt-"))
        try:
            with checks.quiet():
                ref = checkpointed_run.measure_checkpoint_overhead(run_config(sizes, device), work, steps=4, repeats=2)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rel_step = checks.band(ref["step"], overhead["step"])
        checks.assert_in_band(step, ref["step"].median_ms, rel_step, "overhead['step'] median", "ms")
        rel_save = checks.band(ref["sync_save"], overhead["sync_save"], floor=max(1.0, checks.band(smoke_mode=checks.smoke())))
        checks.assert_in_band(sync, ref["sync_save"].median_ms, rel_save, "overhead['sync_save'] median", "ms")
        checks.say_versus("training step", ref["step"].median_ms, step, "ms", rel_step)
        checks.say_versus("synchronous checkpoint", ref["sync_save"].median_ms, sync, "ms", rel_save)

    remeasure.agree(compare, ATTEMPTS)


# -- 5. XLA recompilation -----------------------------------------------------------------------

def _layer(x, w):
    import jax

    h = jax.nn.gelu(x @ w)
    return (h * h).mean(axis=-1)


def xla_sizes(sizes):
    """The notebook's rule: JAX on a CPU gets the CPU tier's sizes, whatever torch has."""
    import jax

    from utils.env import phase_sizes

    return sizes if jax.default_backend() != "cpu" else phase_sizes(PHASE, "cpu")


def xla_inputs(sizes) -> tuple[list, Any, tuple[int, ...]]:
    """The grader's own inputs for the recompilation experiment, built like the notebook's."""
    import jax.numpy as jnp
    import numpy as np

    from utils import xla

    sizes = xla_sizes(sizes)
    rng = np.random.default_rng(0)
    d = sizes.xla_dim
    w = jnp.asarray(rng.standard_normal((d, d), dtype=np.float32) / math.sqrt(d))
    xs = [jnp.asarray(rng.standard_normal((n, d), dtype=np.float32)) for n in sizes.xla_lengths]
    return xs, w, xla.pow2_buckets(max(sizes.xla_lengths), min(sizes.xla_lengths))


def check_recompiles(bucket_length, compiles_unpadded, compiles_bucketed, compile_ms, run_ms, eager_ms,
                     break_even_calls) -> None:
    """Always live: compile counts are the same on every backend. bucket_length exact; the
    learner's counts equal the grader's fresh count; the compile/run numbers consistent."""
    from utils import xla

    if not xla.available():
        raise AssertionError(f"JAX is not installed here: {xla.INSTALL_HINT}")
    sizes, _, _ = setting()
    checks.say(f"{checks.LIVE} on JAX's {xla.backend()['backend']} backend: compilations counted again by the grader")
    untampered()
    xs, w, buckets = xla_inputs(sizes)
    for n in range(0, max(buckets) + 1):
        checks.assert_close(checks.call(bucket_length, n, buckets, name="bucket_length"), xla.bucket_length(n, buckets),
                            f"bucket_length({n}, {buckets})", rel=0)
    try:
        with checks.quiet():
            got = bucket_length(max(buckets) + 1, buckets)
    except ValueError:
        pass
    else:
        raise AssertionError(f"bucket_length({max(buckets) + 1}, {buckets}) returned {got!r}: no bucket holds it, "
                             "raise ValueError")
    with checks.quiet():
        plain = xla.count_compiles(_layer, [(x, w) for x in xs])
        padded = [xla.pad_to(x, xla.bucket_length(x.shape[0], buckets)) for x in xs]
        bucketed = xla.count_compiles(_layer, [(x, w) for x in padded])
    for name, yours, ref in (("compiles_unpadded", compiles_unpadded, plain), ("compiles_bucketed", compiles_bucketed, bucketed)):
        v = checks.as_number(yours, name)
        if v != ref.compiles:
            raise AssertionError(f"{name} = {v:g}, but the grader counted {ref.compiles} compilations "
                                 f"({ref.distinct_shapes} distinct input shapes in {ref.calls} calls)")
    c, r, e = (checks.assert_positive(v, k) for v, k in ((compile_ms, "compile_ms"), (run_ms, "run_ms"), (eager_ms, "eager_ms")))
    if c <= r:
        raise AssertionError(f"compile_ms ({c:.3g}) <= run_ms ({r:.3g}): an XLA compile takes longer than a run of "
                             "the program it makes; measure the compile of a fresh jit (utils.xla.compile_vs_run)")
    want = xla.break_even_calls(c, e - r)
    if math.isinf(want):
        if not (isinstance(break_even_calls, (int, float)) and math.isinf(break_even_calls)):
            raise AssertionError("break_even_calls: jit saved nothing per call here, so compiling never pays: math.inf")
    else:
        checks.assert_close(break_even_calls, want, "break_even_calls (compile_ms / (eager_ms - run_ms))", rel=1e-6)
    checks.say(f"  compiles: {plain.compiles} unpadded ({plain.distinct_shapes} shapes), {bucketed.compiles} "
               f"bucketed ({len({x.shape[0] for x in padded})} buckets used): match yours")


# -- 6. topology and 7. a pod in miniature: grader/phase5_wiring.py -------------------------------

def _wiring():
    """``grader/phase5_wiring.py``, executed afresh from this module's folder (as ``grader.phase``
    loads this one) with this module's ``checks``: a notebook cannot patch what grades it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpulab_fresh_phase5_wiring", Path(__file__).with_name("phase5_wiring.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.checks = checks
    return mod


def check_topology(slowest_gpu_link) -> None:
    _wiring().check_topology(slowest_gpu_link)


def check_pod_sharding(sharded_matmul, dp_x, dp_w, tp_x, tp_w) -> None:
    _wiring().check_pod_sharding(sharded_matmul, dp_x, dp_w, tp_x, tp_w)


def check_shard_bytes(per_device_bytes) -> None:
    _wiring().check_shard_bytes(per_device_bytes)
