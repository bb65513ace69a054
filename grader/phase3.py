"""The checks the hidden tests of phase 3 (``03_inference_serving``) run.

The KV-cache calculator is compared exactly with ``utils.kvcache`` (vLLM's arithmetic) on
reference cases: MHA, GQA, MQA, fp8 and fp32 caches, block sizes 16 and 32, contexts that
do not fill their last block. The measured cells follow phase 0's rules: with a GPU here,
or no GPU record to grade, the grader re-measures in the same kernel session and compares
within a band ("measured live"): decode TPOT of the three paths (the paths are checked to be
the notebook's, from ``utils.decode``, on the preset's model), the copy bandwidth, the KV
cache's growth during decoding (within :data:`records.KV_BAND` of the calculator and of the
learner's measurement), and the weight memory of the quantized models (within
:data:`records.MEMORY_BAND`: loading is deterministic). With no GPU here and a GPU record from the
learner, those cells grade the record: fingerprint and ``utils`` hash, every derived number
recomputed from its raw fields, the learner's functions applied to the recorded inputs,
nothing above the card's datasheet, the model's shape from its shipped config. An invented
but consistent, plausible record passes: the record proves the arithmetic, not the run.

The continuous-batching cell is always graded live: its model is two layers, and the notebook
ran again on the grading machine. The learner's scheduler runs on traces the notebook does not
show, on ``utils.paged_batching``'s engine without a model (which checks every step's block
tables), and must make the notebook's rule's admissions (:func:`records.reference_continuous`);
its gain over static batching on the notebook's trace is re-measured within a band.

Sizes, device and dtype come from ``utils.env`` here, not from the notebook's variables.
Hidden tests get this module from ``grader.phase(3)``, with fresh copies of ``checks.py`` and
``phase3_records.py`` (``grader/__init__.py``); the record and the checks both modes share
are in :mod:`grader.phase3_records`.
"""
from __future__ import annotations

import gc
from typing import Any

from grader import checks, remeasure  # grader.phase(3) rebinds these to fresh copies: use them at call time only
from grader import phase3_records as records

PHASE = "03_inference_serving"
EXTRA_MODULES = ("utils.kvcache", "utils.vllm_kv", "utils.paged_batching")  # the calculator's reference, beside checks' list
ATTEMPTS = 3

# (name, layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib, block_size): public configs' shapes
CASES = (
    ("Llama-3-8B (GQA)", 32, 8, 128, "bf16", 1, 8192, 20.0, 16),
    ("Llama-3-8B, fp8 cache", 32, 8, 128, "fp8", 4, 8192, 20.0, 16),
    ("Llama-2-7B (MHA)", 32, 32, 128, "fp16", 8, 4096, 31.37, 16),
    ("Llama-3-70B, one of 8 GPUs", 80, 1, 128, "bf16", 16, 32768, 55.5, 16),
    ("Falcon-7B (MQA)", 32, 1, 64, "bf16", 32, 2048, 10.0, 16),
    ("TinyLlama-1.1B", 22, 4, 64, "bf16", 4, 2048, 3.37, 16),
    ("Qwen2.5-7B, blocks of 32", 28, 4, 128, "bf16", 2, 32768, 40.0, 32),
    ("Mistral-7B, 1000 tokens", 32, 8, 128, "fp8", 3, 1000, 0.25, 16),
    ("tiny, fp32", 2, 2, 32, "fp32", 2, 100, 0.001, 16),
    ("no memory left", 32, 8, 128, "bf16", 1, 4096, 0.0, 16),
)


def device() -> str:
    """Where the notebook runs its model: the CPU in smoke mode (GPULAB_SMOKE=1 included), else CUDA."""
    from utils.env import smoke_mode

    return "cpu" if smoke_mode() else "cuda"


def untampered() -> None:
    checks.assert_untampered(EXTRA_MODULES)


# -- 1. the calculator ----------------------------------------------------------------------------


def check_kv_calculator(kv_cache_calculator) -> None:
    """Exact against vLLM's arithmetic (``utils.kvcache``) on every reference case."""
    untampered()
    for name, *args in CASES:
        got = checks.call(kv_cache_calculator, *args, name="kv_cache_calculator")
        records.same_calc(got, records.reference_calculator(*args), f"{tuple(args)!r} ({name})")
    checks.say(f"  kv_cache_calculator matches vLLM's arithmetic on {len(CASES)} cases (MHA, GQA, MQA, fp8, fp32)")


# -- 2. decode bandwidth --------------------------------------------------------------------------

def _model_ok(model: Any, s) -> str:
    """The notebook's model is the preset's, in the dtype this device uses; returns that dtype."""
    from utils.inference import weight_bytes
    from utils.models import build_model
    from utils.quantize import reference_mode

    want = reference_mode(device())
    if model is None or not hasattr(model, "parameters") or records.precision(model) != want:
        raise AssertionError(f"model must be {s.model} in {want}, as the locked setup cell builds it")
    with checks.quiet():
        ref = build_model(s.model, dtype=want, device="meta")
    if weight_bytes(model) != weight_bytes(ref):
        raise AssertionError(f"model is not {s.model} ({weight_bytes(ref):,} bytes of {want} weights)")
    return want


FACTORIES = {"eager": "eager_path", "static_compiled": "static_path", "fast": "fast_path"}


def _paths_ok(paths: Any, model: Any, s) -> None:
    """Each path is the DecodePath its ``utils.decode`` factory made: its ``run`` is that factory's
    own closure, over the notebook's model (or a FastDecoder sharing its weights) and prompt."""
    from utils import decode

    if not isinstance(paths, dict) or set(paths) != set(records.PATHS):
        raise AssertionError(f"paths must be the dict of {', '.join(records.PATHS)} that decode.decode_paths returned")
    for name, p in paths.items():
        if type(p) is not decode.DecodePath or p.name != name or p.model is not model:
            raise AssertionError(f"paths[{name!r}] is not the utils.decode.DecodePath the locked cell built on model")
        if tuple(p.prompt.shape) != (1, s.prompt_len):
            raise AssertionError(f"paths[{name!r}] decodes a prompt of shape {tuple(p.prompt.shape)}, not (1, {s.prompt_len})")
        run = p.run
        if not checks.tamper.function_is_original(run, decode.__file__, f"{FACTORIES[name]}.<lambda>"):
            raise AssertionError(f"paths[{name!r}].run is not the function decode.{FACTORIES[name]} made: do not replace it")
        env = dict(zip(run.__code__.co_freevars, (c.cell_contents for c in run.__closure__ or ()), strict=True))
        dec = env.get("decoder")
        if env.get("prompt") is not p.prompt or env.get("model", model) is not model or (name == "fast" and (
                type(dec) is not decode.FastDecoder or dec is not p.decoder
                or dec.embed.data_ptr() != model.get_input_embeddings().weight.data_ptr())):
            raise AssertionError(f"paths[{name!r}].run does not decode the notebook's prompt with the notebook's model")


def _bytes_grid(bytes_per_decode_step) -> None:
    from utils.inference import decode_bytes_per_step

    for w in (2.069e9, 3574272.0, 0.0):
        for kv in (22528.0, 1024.0, 131072.0):
            for b in (1, 8, 64):
                for ctx in (160.0, 1.0, 4096.5):
                    checks.assert_close(checks.call(bytes_per_decode_step, w, kv, b, ctx, name="bytes_per_decode_step"),
                                        decode_bytes_per_step(w, kv, b, ctx),
                                        f"bytes_per_decode_step({w:g}, {kv:g}, {b}, {ctx})", rel=records.REL)


def check_decode(bytes_per_decode_step, bytes_per_step, decode, paths, model, copy_gbs) -> None:
    """The bytes-per-step formula exact; the learner's decode numbers consistent; TPOT of the
    three paths and the copy bandwidth re-measured; the fast path at least the tier's speedup
    over eager ``generate``; nothing above the datasheet bandwidth."""
    mode = checks.begin("decode TPOT and bandwidth of the three paths")
    _bytes_grid(bytes_per_decode_step)
    if mode == checks.RECORD:
        return records.decode(bytes_per_decode_step)
    untampered()
    from utils import inference, kvcache
    from utils.hardware import current_spec

    s = records.sizes()
    _model_ok(model, s)
    _paths_ok(paths, model, s)
    want = inference.decode_bytes_per_step(inference.weight_bytes_read_per_step(model),
                                           kvcache.bytes_per_token(inference.kv_spec(model)), 1,
                                           inference.mean_context_len(s.prompt_len, s.new_tokens))
    checks.assert_close(bytes_per_step, want, "BYTES_PER_STEP (weights read + the KV cache at the mean context)", rel=records.REL)
    cg = checks.assert_positive(copy_gbs, "copy_gbs")
    if not isinstance(decode, dict) or set(decode) != set(records.PATHS):
        raise AssertionError(f"decode must map each of {', '.join(records.PATHS)} to its measurements")
    for name, d in decode.items():
        records.decode_numbers_ok(name, d, want, cg, s.new_tokens)
    spec = current_spec()
    if spec.kind == "gpu" and spec.bandwidth_gbs:
        checks.assert_not_above(cg, spec.bandwidth_gbs, "copy_gbs", "GB/s", f"the {spec.name} datasheet bandwidth")
        for name, d in decode.items():
            checks.assert_not_above(d["bandwidth_gbs"], spec.bandwidth_gbs, f"decode[{name!r}]['bandwidth_gbs']", "GB/s",
                                    f"the {spec.name} datasheet bandwidth")

    def compare():
        with checks.quiet():
            ref = {name: inference.measure_decode(paths[name], s.new_tokens) for name in records.PATHS}
            cp = inference.measure_copy_bandwidth(s.copy_numel, device())
        for name in records.PATHS:
            rel = checks.difference_band((ref[name]["tn"], ref[name]["t1"]), (decode[name]["tn"], decode[name]["t1"]))
            checks.assert_in_band(decode[name]["tpot_ms"], ref[name]["tpot_ms"], rel, f"decode[{name!r}]['tpot_ms']", "ms")
            checks.say_versus(f"{name} TPOT", ref[name]["tpot_ms"], decode[name]["tpot_ms"], "ms", rel)
        rel = checks.band(cp["time"])
        checks.assert_in_band(cg, cp["gbs"], rel, "copy_gbs", "GB/s")
        speedup = (checks.usable(ref["fast"]["tokens_per_s"], "fast-path tokens/s", "tokens/s")
                   / checks.usable(ref["eager"]["tokens_per_s"], "eager tokens/s", "tokens/s"))
        checks.say(f"  fast path {speedup:.3g}x eager generate (at least {s.min_fast_speedup}x on this tier); "
                   f"{ref['fast']['tokens_per_s'] * want / 1e9 / cp['gbs']:.1%} of the copy bandwidth")
        if speedup < s.min_fast_speedup:  # both paths are utils.decode's (_paths_ok): the machine's, not yours
            raise checks.Unusable(f"the grader measured the fast path at {speedup:.3g}x eager generate, below the "
                                  f"{s.min_fast_speedup}x this device tier expects")

    remeasure.agree(compare, ATTEMPTS)


# -- 3. KV-cache growth ---------------------------------------------------------------------------


def _growth_ok(growth: Any, s) -> float:
    if not isinstance(growth, dict) or "bytes_per_step" not in growth:
        raise AssertionError("growth must be the dict inference.measure_kv_growth returned")
    if growth.get("batch") != s.kv_batch:
        raise AssertionError(f"growth was measured at batch {growth.get('batch')}, not SIZES.kv_batch = {s.kv_batch}")
    return checks.assert_positive(growth["bytes_per_step"], "growth['bytes_per_step']")


def check_kv_growth(kv_cache_calculator, growth, kv_predicted_bytes_per_step, kv_growth_error, model) -> None:
    """The learner's prediction comes from their calculator on the model's config; the growth
    is re-measured and agrees with the prediction and with the learner's measurement within 2%."""
    mode = checks.begin("KV-cache growth against your calculator")
    if mode == checks.RECORD:
        return records.kv_growth(kv_cache_calculator)
    untampered()
    from utils import inference
    from utils.models import get_tokenizer, token_batches

    s = records.sizes()
    _model_ok(model, s)
    measured = _growth_ok(growth, s)
    args = records.kv_args(model, s)
    want = records.reference_calculator(*args)["cache_bytes"]
    mine = checks.call(kv_cache_calculator, *args, name="kv_cache_calculator")
    records.same_calc(mine, records.reference_calculator(*args), f"{args!r}")
    records.growth_numbers_ok(measured, kv_predicted_bytes_per_step, kv_growth_error, want)
    dev = next(model.parameters()).device
    prompt = next(token_batches(get_tokenizer(None), None, s.kv_batch, s.prompt_len, device=dev,
                                vocab_size=model.config.vocab_size))[0]

    def compare():
        with checks.quiet():
            fresh = inference.measure_kv_growth(model, prompt, s.kv_new_tokens)["bytes_per_step"]
        for label, v in (("growth['bytes_per_step']", measured), ("your calculator's prediction", want)):
            if abs(v / fresh - 1) > records.KV_BAND:
                raise AssertionError(f"{label} = {v:.6g} bytes per step, but the grader measured {fresh:.6g} "
                                     f"({100 * (v / fresh - 1):+.2f}%, at most {100 * records.KV_BAND:.0f}%)")
        checks.say(f"  KV growth: grader {fresh:.6g} bytes per step ({growth.get('source')}), yours {measured:.6g}, "
                   f"your calculator {want:.6g}")

    remeasure.agree(compare, ATTEMPTS)


# -- 4. quantization ------------------------------------------------------------------------------

def _savings_ok(quant: Any, memory_saving: Any, perplexity_change: Any) -> tuple[str, dict]:
    if not isinstance(quant, dict) or not {"reference", "modes"} <= set(quant) or not isinstance(quant["modes"], dict):
        raise AssertionError("quant must be the dict quantize.compare returned")
    ref, modes = quant["reference"], quant["modes"]
    if ref not in modes:
        raise AssertionError(f"quant has no measurement of the reference dtype {ref!r}")
    others = {m: q for m, q in modes.items() if m != ref}
    for name, v in (("memory_saving", memory_saving), ("perplexity_change", perplexity_change)):
        if not isinstance(v, dict) or set(v) != set(others):
            raise AssertionError(f"{name} must have one entry per quantized mode measured: {sorted(others) or 'none here'}")
    base_w = checks.assert_positive(modes[ref]["weight_bytes"], f"quant['modes'][{ref!r}]['weight_bytes']")
    base_p = checks.assert_positive(modes[ref]["perplexity"], f"quant['modes'][{ref!r}]['perplexity']")
    for m, q in others.items():
        checks.assert_close(memory_saving[m], base_w / checks.assert_positive(q["weight_bytes"], f"{m} weight_bytes"),
                            f"memory_saving[{m!r}] ({ref} weight bytes / {m} weight bytes)", rel=1e-9)
        checks.assert_close(perplexity_change[m], checks.assert_positive(q["perplexity"], f"{m} perplexity") / base_p - 1,
                            f"perplexity_change[{m!r}] ({m} perplexity / {ref} perplexity - 1)", rel=1e-9, abs_tol=1e-12)
    return ref, others


def check_quantization(quant, memory_saving, perplexity_change) -> None:
    """Savings and perplexity changes follow from the measurements; the weight memory of every
    mode measured is measured again (bitsandbytes needs a CUDA GPU: without one only the
    reference dtype is re-measured, and the feedback says so)."""
    mode = checks.begin("weight memory of the quantized models")
    if mode == checks.RECORD:
        return records.quantization()
    untampered()
    from utils import quantize
    from utils.training import bitsandbytes_usable

    s = records.sizes()
    ref, others = _savings_ok(quant, memory_saving, perplexity_change)
    if ref != quantize.reference_mode(device()):
        raise AssertionError(f"quant's reference is {ref!r}; on this device it is {quantize.reference_mode(device())!r}")
    ok, why = bitsandbytes_usable()
    if ok and device() != "cuda":
        ok, why = False, "smoke mode runs on the CPU"
    if ok and set(others) != set(quantize.usable_modes(device())):
        raise AssertionError(f"bitsandbytes works here: measure {', '.join(quantize.usable_modes(device()))}, "
                             f"not {sorted(others)}")
    records.min_saving_ok(s.model, memory_saving)

    def compare():
        fresh = {}
        for m in [ref, *others]:
            with checks.quiet():
                model, info = quantize.measure_weights(s.model, m, device())
                del model
                gc.collect()
            fresh[m] = info["weight_bytes"]
            checks.assert_in_band(quant["modes"][m]["weight_bytes"], fresh[m], records.MEMORY_BAND,
                                  f"quant['modes'][{m!r}]['weight_bytes']", "bytes")
        for m in others:
            checks.say_versus(f"{m} memory saving", fresh[ref] / fresh[m], memory_saving[m], "x", records.MEMORY_BAND)
        if not others:
            checks.say(f"  {ref} weights: grader {fresh[ref]:,} bytes; int8 and nf4 not measured here ({why})")

    remeasure.agree(compare, ATTEMPTS)


# -- 5. continuous batching over a paged KV cache --------------------------------------------------

def _allocator_ok(BlockAllocator) -> None:
    """Five blocks: five distinct ids in range, then a refusal; freed blocks come back."""
    a = checks.call(BlockAllocator, 5, name="BlockAllocator")
    if checks.call(a.num_free, name="BlockAllocator(5).num_free") != 5:
        raise AssertionError("BlockAllocator(5).num_free() must be 5 before any allocate()")
    got = [checks.call(a.allocate, name="allocate") for _ in range(5)]
    if sorted(got) != list(range(5)):
        raise AssertionError(f"BlockAllocator(5) handed out {got}: five different blocks of 0 .. 4")
    try:
        with checks.quiet():
            extra = a.allocate()
    except Exception:  # noqa: BLE001 - any exception is a refusal
        pass
    else:
        raise AssertionError(f"allocate() with no free block returned {extra!r}: it must raise (MemoryError)")
    checks.call(a.free, [got[1], got[3]], name="free")
    two = checks.call(a.num_free, name="num_free") == 2
    if not two or sorted(checks.call(a.allocate, name="allocate") for _ in range(2)) != sorted([got[1], got[3]]):
        raise AssertionError("after free([b1, b2]), num_free() must be 2 and the next two allocate() calls b1 and b2")


def _audited(engine, trace) -> dict:
    """The engine's result, after checking its log: each request in consecutive steps from its
    admission, as many steps as its output tokens."""
    from utils.paged_batching import ScheduleError

    try:
        res = engine.result()
    except ScheduleError as exc:
        raise AssertionError(str(exc)) from None
    for r in trace:
        steps = [e["step"] for e in engine.log if r.rid in e["batch"]]
        if len(steps) != r.output_len or steps != list(range(steps[0], steps[0] + len(steps))):
            raise AssertionError(f"request {r.rid} ran in steps {steps[:6]}..., not {r.output_len} consecutive steps")
    return res


def _schedule(BlockAllocator, continuous_batching, trace, sizes: dict, spec) -> dict:
    """The learner's scheduler on a fresh engine without a model and a fresh allocator: the
    engine's result, checked; every block free again at the end."""
    from utils.paged_batching import PagedEngine, ScheduleError

    engine = PagedEngine(None, trace, spec=spec, **sizes)
    alloc = checks.call(BlockAllocator, sizes["num_blocks"], name="BlockAllocator")
    try:
        with checks.quiet():
            continuous_batching(engine, alloc)
    except ScheduleError as exc:
        raise AssertionError(f"the engine refused your schedule: {exc}") from None
    except MemoryError as exc:
        raise AssertionError(f"your allocator ran out of blocks at step {engine.now} ({exc}): admit a request only "
                             "when the pool can finish it") from None
    except Exception as exc:  # noqa: BLE001 - the learner's error, in one line
        raise AssertionError(f"continuous_batching raised {type(exc).__name__} at step {engine.now}: {exc}") from None
    res = _audited(engine, trace)
    left = checks.call(alloc.num_free, name="num_free")
    if left != sizes["num_blocks"]:
        raise AssertionError(f"{sizes['num_blocks'] - left} block(s) not freed at the end: free a request's blocks when "
                             "it finishes")
    return res


def _rule(trace, sizes: dict, spec) -> dict:
    from utils.paged_batching import PagedEngine

    engine = PagedEngine(None, trace, spec=spec, **sizes)
    records.reference_continuous(engine)
    return engine.result()


def _static(trace, sizes: dict, spec) -> dict:
    from utils.paged_batching import PagedEngine, static_batching

    engine = PagedEngine(None, trace, spec=spec, **sizes)
    static_batching(engine)
    return engine.result()


def _same_admissions(mine: dict, want: dict, label: str) -> None:
    if mine["admitted"] != want["admitted"]:
        step = min(s for s in set(mine["admitted"]) | set(want["admitted"])
                   if mine["admitted"].get(s) != want["admitted"].get(s))
        raise AssertionError(f"{label}: at step {step} you admitted requests {mine['admitted'].get(step, [])}, the rule "
                             f"admits {want['admitted'].get(step, [])} (first come first served, while the batch has "
                             "room and the free blocks less those the running requests will still take cover the "
                             "newcomer's whole cache)")


def _serve_model_ok(model) -> None:
    from utils.inference import weight_bytes
    from utils.models import build_model
    from utils.paged_batching import MODEL

    if model is None or not hasattr(model, "parameters") or records.precision(model) != "fp32":
        raise AssertionError(f"SERVE_MODEL must be {MODEL} in fp32, as the locked cell builds it")
    with checks.quiet():
        ref = build_model(MODEL, device="meta")
    if weight_bytes(model) != weight_bytes(ref):
        raise AssertionError(f"SERVE_MODEL is not {MODEL}")


def _runs_ok(cont_run, static_run, throughput_gain, want_c: dict, want_s: dict) -> None:
    """The notebook's two runs are its scheduler's and static batching's on TRACE, and their
    numbers follow from their timings."""
    for label, run, want in (("cont_run", cont_run, want_c), ("static_run", static_run, want_s)):
        if not isinstance(run, dict) or not {"admitted", "tokens", "time", "tokens_per_s", "busy_steps"} <= set(run):
            raise AssertionError(f"{label} must be the dict paged_batching.timed_runs returned")
        _same_admissions(run, want, f"{label} on TRACE")
        checks.assert_close(run["tokens"], want["tokens"], f"{label}['tokens']", rel=0.0)
        checks.assert_close(run["busy_steps"], want["busy_steps"], f"{label}['busy_steps']", rel=0.0)
        med = records.median_ms(run["time"], f"{label}['time']")
        checks.assert_close(run["tokens_per_s"], run["tokens"] / (med / 1e3),
                            f"{label}['tokens_per_s'] (tokens over the median run's time)", rel=1e-6)
    checks.assert_close(throughput_gain, cont_run["tokens_per_s"] / static_run["tokens_per_s"],
                        "throughput_gain (cont_run's tokens/s over static_run's)", rel=1e-6)


def check_batching(BlockAllocator, continuous_batching, pool_blocks, kv_cache_calculator, trace, serve_model,
                   cont_run, static_run, throughput_gain) -> None:
    """Always live (the model is tiny, and the notebook ran again on this machine): the
    allocator; the scheduler on traces the notebook does not show, on an engine without a
    model: every request its exact tokens, blocks on demand (``ceil(tokens / block_size)``, the
    engine's check), never more than the pool, none leaked, the rule's admissions, never more
    steps than static batching; the pool's blocks from the learner's calculator; the
    notebook's runs its scheduler's and static batching's; the gain in tokens/s re-measured."""
    import random

    from utils import paged_batching as pb

    checks.say(f"{checks.LIVE} on {checks.device_name()}: your scheduler on traces it has not seen, and its tokens/s "
               "over static batching re-measured by the grader in this run")
    untampered()
    _allocator_ok(BlockAllocator)
    want_trace = pb.make_trace(**records.BATCH_TRACE)
    if [tuple(r) for r in trace or ()] != [tuple(r) for r in want_trace]:
        raise AssertionError("TRACE is not the locked cell's paged_batching.make_trace"
                             f"({records.BATCH_TRACE['n_requests']}, seed={records.BATCH_TRACE['seed']})")
    _serve_model_ok(serve_model)
    spec = pb.kv_spec(serve_model)
    want_blocks = pb.pool_blocks(serve_model, records.KV_POOL_BYTES)
    args = (spec.num_layers, spec.num_kv_heads, spec.head_dim, "fp32", 1, 1, records.KV_POOL_BYTES / 2**30, pb.BLOCK_SIZE)
    records.same_calc(checks.call(kv_cache_calculator, *args, name="kv_cache_calculator"),
                      records.reference_calculator(*args), f"{args!r}")
    checks.assert_close(pool_blocks, want_blocks, f"POOL_BLOCKS (your calculator on {records.KV_POOL_BYTES:,} bytes)",
                        rel=0.0)
    seed = random.SystemRandom().randrange(1 << 30)
    traces = records.hidden_traces(seed)
    for name, tr, sizes in traces:
        mine = _schedule(BlockAllocator, continuous_batching, tr, sizes, spec)
        _same_admissions(mine, _rule(tr, sizes, spec), name)
        if mine["steps"] > _static(tr, sizes, spec)["steps"]:
            raise AssertionError(f"{name}: continuous batching took {mine['steps']} steps, more than static batching")
    checks.say(f"  your scheduler follows the rule on {len(traces)} unseen traces (drawn with seed {seed}): every "
               "request its exact tokens, blocks on demand within the pool, none leaked")
    nb = {"num_blocks": want_blocks}
    want_c, want_s = _rule(want_trace, nb, spec), _static(want_trace, nb, spec)
    _runs_ok(cont_run, static_run, throughput_gain, want_c, want_s)

    def make_engine():
        return pb.PagedEngine(serve_model, want_trace, num_blocks=want_blocks)

    def compare():
        with checks.quiet():
            c = pb.timed_runs(lambda e: continuous_batching(e, BlockAllocator(e.num_blocks)), make_engine, 3)
            s = pb.timed_runs(pb.static_batching, make_engine, 3)
        gain = checks.usable(c["tokens_per_s"], "continuous tokens/s", "tokens/s") / checks.usable(
            s["tokens_per_s"], "static tokens/s", "tokens/s")
        rel = checks.band(checks.mine(c["time"]), checks.mine(s["time"]), cont_run["time"], static_run["time"])
        checks.assert_in_band(throughput_gain, gain, rel, "throughput_gain", "x")
        checks.say_versus("continuous over static batching, tokens/s", gain, throughput_gain, "x", rel)

    remeasure.agree(compare, ATTEMPTS)
