"""The checks the hidden tests of phase 3 (``03_inference_serving``) run.

The KV-cache calculator is compared exactly with ``utils.kvcache`` (vLLM's arithmetic) on
reference cases: MHA, GQA, MQA, fp8 and fp32 caches, block sizes 16 and 32, contexts that
do not fill their last block. The measured cells follow phase 0's rules: with a GPU here,
or no GPU record to grade, the grader re-measures in the same kernel session and compares
within a band ("measured live"): decode TPOT of the three paths (the paths are checked to be
the notebook's, from ``utils.decode``, on the preset's model), the copy bandwidth, the KV
cache's growth during decoding (within :data:`KV_BAND` of the calculator and of the
learner's measurement), and the weight memory of the quantized models (within
:data:`MEMORY_BAND`: loading is deterministic). With no GPU here and a GPU record from the
learner, those cells grade the record: fingerprint and ``utils`` hash, every derived number
recomputed from its raw fields, the learner's functions applied to the recorded inputs,
nothing above the card's datasheet, the model's shape from its shipped config. An invented
but consistent, plausible record passes: the record proves the arithmetic, not the run.

Sizes, device and dtype come from ``utils.env`` here, not from the notebook's variables.
Hidden tests load this file afresh, and it loads ``checks.py`` afresh (see ``grader/phase0.py``).
"""
from __future__ import annotations

import gc
import importlib.util
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _load_fresh(name: str):
    spec = importlib.util.spec_from_file_location(f"_gpulab_fresh_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


checks = _load_fresh("checks")
LIVE, RECORD = checks.LIVE, checks.RECORD
PHASE = "03_inference_serving"
EXTRA_MODULES = ("utils.kvcache",)  # the calculator's reference, beside checks' list
PATHS = ("eager", "static_compiled", "fast")
KV_BAND = 0.02  # measured KV growth within 2% of the calculator (issue 6's goal; a CUDA allocator reads exact)
MEMORY_BAND = 0.03  # weights loaded twice take the same bytes, up to allocator rounding
MIN_SAVING = {"int8": 1.6, "nf4": 2.5}  # llama-1.1b, estimates from the bits per weight (utils/quantize.py): 1.79x, 2.89x
REL = 1e-9  # pure arithmetic
ATTEMPTS = 3
GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

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


def sizes(tier: str | None = None):
    from utils.env import phase_sizes

    return phase_sizes(PHASE, tier)


def device() -> str:
    """Where the notebook runs its model: the CPU in smoke mode (GPULAB_SMOKE=1 included), else CUDA."""
    from utils.env import smoke_mode

    return "cpu" if smoke_mode() else "cuda"


def untampered() -> None:
    checks.assert_untampered(EXTRA_MODULES)


def _median(t: Any, name: str) -> float:
    if isinstance(t, dict):
        med, p20, p80 = t.get("median_ms"), t.get("p20_ms"), t.get("p80_ms")
    else:
        med, p20, p80 = getattr(t, "median_ms", None), getattr(t, "p20_ms", None), getattr(t, "p80_ms", None)
    med = checks.assert_positive(med, f"{name} median_ms")
    if not checks.as_number(p20, f"{name} p20_ms") <= med <= checks.as_number(p80, f"{name} p80_ms"):
        raise AssertionError(f"{name}: p20 <= median <= p80 does not hold")
    return med


def dtype_name(model_or_dtype: Any) -> str:
    """``bf16``/``fp16``/``fp32`` of a model's parameters or a torch dtype."""
    d = model_or_dtype
    if hasattr(d, "parameters"):
        d = next(d.parameters()).dtype
    return TORCH_DTYPES.get(str(d).removeprefix("torch."), str(d))


def tier_of(fingerprint: dict) -> str:
    """The size tier a GPU fingerprint falls in, by the rule of ``utils.env.device_tier``."""
    try:
        major = int(str(fingerprint.get("compute_capability", "0")).split(".")[0])
    except ValueError:
        major = 0
    mem = fingerprint.get("memory_gib") or 0
    return "h100" if major >= 9 else ("a100" if major >= 8 and mem > 20 else "t4")


# -- 1. the calculator ----------------------------------------------------------------------------

def reference_calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib, block_size=16) -> dict:
    """What ``kv_cache_calculator`` must return, from ``utils.kvcache`` (vLLM v1's arithmetic)."""
    from utils.kvcache import KVSpec, dtype_bytes, vllm_plan

    spec = KVSpec(int(layers), int(kv_heads), int(head_dim), dtype_bytes(dtype))
    plan = vllm_plan(spec, int(context), int(kv_memory_gib * GIB), batch=int(batch), block_size=int(block_size),
                     token_formula="blocks", concurrency_formula="blocks")
    return {"bytes_per_token": plan.bytes_per_token, "cache_bytes": plan.batch_kv_bytes_unpaged,
            "num_blocks": plan.num_blocks, "max_concurrency": plan.max_concurrency}


def _same_calc(got: Any, want: dict, label: str) -> None:
    if not isinstance(got, dict):
        raise AssertionError(f"kv_cache_calculator{label} returned {type(got).__name__}, not a dict")
    missing = [k for k in want if k not in got]
    if missing:
        raise AssertionError(f"kv_cache_calculator{label} has no {', '.join(missing)}")
    for key, w in want.items():
        checks.assert_close(got[key], w, f"kv_cache_calculator{label}['{key}']",
                            rel=REL if key == "max_concurrency" else 0.0)


def check_kv_calculator(kv_cache_calculator) -> None:
    """Exact against vLLM's arithmetic (``utils.kvcache``) on every reference case."""
    untampered()
    for name, *args in CASES:
        got = checks.call(kv_cache_calculator, *args, name="kv_cache_calculator")
        _same_calc(got, reference_calculator(*args), f"{tuple(args)!r} ({name})")
    checks.say(f"  kv_cache_calculator matches vLLM's arithmetic on {len(CASES)} cases (MHA, GQA, MQA, fp8, fp32)")


# -- 2. decode bandwidth --------------------------------------------------------------------------

def _model_ok(model: Any, s) -> str:
    """The notebook's model is the preset's, in the dtype this device uses; returns that dtype."""
    from utils.inference import weight_bytes
    from utils.models import build_model
    from utils.quantize import reference_mode

    want = reference_mode(device())
    if model is None or not hasattr(model, "parameters") or dtype_name(model) != want:
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

    if not isinstance(paths, dict) or set(paths) != set(PATHS):
        raise AssertionError(f"paths must be the dict of {', '.join(PATHS)} that decode.decode_paths returned")
    for name, p in paths.items():
        if type(p) is not decode.DecodePath or p.name != name or p.model is not model:
            raise AssertionError(f"paths[{name!r}] is not the utils.decode.DecodePath the locked cell built on model")
        if tuple(p.prompt.shape) != (1, s.prompt_len):
            raise AssertionError(f"paths[{name!r}] decodes a prompt of shape {tuple(p.prompt.shape)}, not (1, {s.prompt_len})")
        run = p.run
        if not checks.function_is_original(run, decode.__file__, f"{FACTORIES[name]}.<lambda>"):
            raise AssertionError(f"paths[{name!r}].run is not the function decode.{FACTORIES[name]} made: do not replace it")
        env = dict(zip(run.__code__.co_freevars, (c.cell_contents for c in run.__closure__ or ()), strict=True))
        dec = env.get("decoder")
        if env.get("prompt") is not p.prompt or env.get("model", model) is not model or (name == "fast" and (
                type(dec) is not decode.FastDecoder or dec is not p.decoder
                or dec.embed.data_ptr() != model.get_input_embeddings().weight.data_ptr())):
            raise AssertionError(f"paths[{name!r}].run does not decode the notebook's prompt with the notebook's model")


def _check_one(name: str, d: Any, bytes_per_step: float, copy_gbs: float, new_tokens: int) -> None:
    """One path's numbers follow from its two timings, the bytes per step and the copy bandwidth."""
    keys = {"t1", "tn", "tpot_ms", "tokens_per_s", "bandwidth_gbs", "copy_fraction"}
    if not isinstance(d, dict) or not keys <= set(d):
        raise AssertionError(f"decode[{name!r}] needs {', '.join(sorted(keys))}")
    tpot = checks.assert_positive(d["tpot_ms"], f"decode[{name!r}]['tpot_ms']")
    t1, tn = _median(d["t1"], f"decode[{name!r}]['t1']"), _median(d["tn"], f"decode[{name!r}]['tn']")
    checks.assert_close(tpot, (tn - t1) / (new_tokens - 1),
                        f"decode[{name!r}]['tpot_ms'] ((tn - t1) / (new_tokens - 1) in medians)", rel=1e-6)
    checks.assert_close(d["tokens_per_s"], 1e3 / tpot, f"decode[{name!r}]['tokens_per_s'] (1000 / TPOT)", rel=1e-6)
    gbs = bytes_per_step * d["tokens_per_s"] / 1e9
    checks.assert_close(d["bandwidth_gbs"], gbs, f"decode[{name!r}]['bandwidth_gbs'] (bytes per step x tokens/s)", rel=1e-6)
    checks.assert_close(d["copy_fraction"], gbs / copy_gbs, f"decode[{name!r}]['copy_fraction'] (over copy_gbs)", rel=1e-6)


def _bytes_grid(bytes_per_decode_step) -> None:
    from utils.inference import decode_bytes_per_step

    for w in (2.069e9, 3574272.0, 0.0):
        for kv in (22528.0, 1024.0, 131072.0):
            for b in (1, 8, 64):
                for ctx in (160.0, 1.0, 4096.5):
                    checks.assert_close(checks.call(bytes_per_decode_step, w, kv, b, ctx, name="bytes_per_decode_step"),
                                        decode_bytes_per_step(w, kv, b, ctx),
                                        f"bytes_per_decode_step({w:g}, {kv:g}, {b}, {ctx})", rel=REL)


def check_decode(bytes_per_decode_step, bytes_per_step, decode, paths, model, copy_gbs) -> None:
    """The bytes-per-step formula exact; the learner's decode numbers consistent; TPOT of the
    three paths and the copy bandwidth re-measured; the fast path at least the tier's speedup
    over eager ``generate``; nothing above the datasheet bandwidth."""
    mode = checks.begin("decode TPOT and bandwidth of the three paths")
    _bytes_grid(bytes_per_decode_step)
    if mode == RECORD:
        return _record_decode(bytes_per_decode_step)
    untampered()
    from utils import inference, kvcache
    from utils.hardware import current_spec

    s = sizes()
    _model_ok(model, s)
    _paths_ok(paths, model, s)
    want = inference.decode_bytes_per_step(inference.weight_bytes_read_per_step(model),
                                           kvcache.bytes_per_token(inference.kv_spec(model)), 1,
                                           inference.mean_context_len(s.prompt_len, s.new_tokens))
    checks.assert_close(bytes_per_step, want, "BYTES_PER_STEP (weights read + the KV cache at the mean context)", rel=REL)
    cg = checks.assert_positive(copy_gbs, "copy_gbs")
    if not isinstance(decode, dict) or set(decode) != set(PATHS):
        raise AssertionError(f"decode must map each of {', '.join(PATHS)} to its measurements")
    for name, d in decode.items():
        _check_one(name, d, want, cg, s.new_tokens)
    spec = current_spec()
    if spec.kind == "gpu" and spec.bandwidth_gbs:
        checks.assert_not_above(cg, spec.bandwidth_gbs, "copy_gbs", "GB/s", f"the {spec.name} datasheet bandwidth")
        for name, d in decode.items():
            checks.assert_not_above(d["bandwidth_gbs"], spec.bandwidth_gbs, f"decode[{name!r}]['bandwidth_gbs']", "GB/s",
                                    f"the {spec.name} datasheet bandwidth")

    def compare():
        with checks.quiet():
            ref = {name: inference.measure_decode(paths[name], s.new_tokens) for name in PATHS}
            cp = inference.measure_copy_bandwidth(s.copy_numel, device())
        for name in PATHS:
            rel = checks.band(ref[name]["t1"], ref[name]["tn"], decode[name]["t1"], decode[name]["tn"])
            checks.assert_in_band(decode[name]["tpot_ms"], ref[name]["tpot_ms"], rel, f"decode[{name!r}]['tpot_ms']", "ms")
            checks.say_versus(f"{name} TPOT", ref[name]["tpot_ms"], decode[name]["tpot_ms"], "ms", rel)
        rel = checks.band(cp["time"])
        checks.assert_in_band(cg, cp["gbs"], rel, "copy_gbs", "GB/s")
        speedup = ref["fast"]["tokens_per_s"] / ref["eager"]["tokens_per_s"]
        checks.say(f"  fast path {speedup:.3g}x eager generate (at least {s.min_fast_speedup}x on this tier); "
                   f"{ref['fast']['tokens_per_s'] * want / 1e9 / cp['gbs']:.1%} of the copy bandwidth")
        if speedup < s.min_fast_speedup:
            raise AssertionError(f"the grader measured the fast path at {speedup:.3g}x eager generate, below the "
                                 f"{s.min_fast_speedup}x this device tier expects")

    checks.agree(compare, ATTEMPTS)


# -- 3. KV-cache growth ---------------------------------------------------------------------------

def _kv_args(model: Any, s) -> tuple:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return (cfg.num_hidden_layers, kv, head_dim, dtype_name(model), s.kv_batch, 1, 0.0)


def _growth_ok(growth: Any, s) -> float:
    if not isinstance(growth, dict) or "bytes_per_step" not in growth:
        raise AssertionError("growth must be the dict inference.measure_kv_growth returned")
    if growth.get("batch") != s.kv_batch:
        raise AssertionError(f"growth was measured at batch {growth.get('batch')}, not SIZES.kv_batch = {s.kv_batch}")
    return checks.assert_positive(growth["bytes_per_step"], "growth['bytes_per_step']")


def _check_growth_numbers(measured: float, predicted: Any, error: Any, want: float) -> None:
    checks.assert_close(predicted, want, "kv_predicted_bytes_per_step (your calculator: one token for each sequence)",
                        rel=REL)
    checks.assert_close(error, measured / want - 1, "kv_growth_error (measured / predicted - 1)", rel=1e-6, abs_tol=1e-12)
    if abs(measured / want - 1) > KV_BAND:
        raise AssertionError(f"the KV cache grew {measured:.6g} bytes per step, {100 * (measured / want - 1):+.2f}% "
                             f"from the calculator's {want:.6g}: more than {100 * KV_BAND:.0f}% apart")


def check_kv_growth(kv_cache_calculator, growth, kv_predicted_bytes_per_step, kv_growth_error, model) -> None:
    """The learner's prediction comes from their calculator on the model's config; the growth
    is re-measured and agrees with the prediction and with the learner's measurement within 2%."""
    mode = checks.begin("KV-cache growth against your calculator")
    if mode == RECORD:
        return _record_kv(kv_cache_calculator)
    untampered()
    from utils import inference
    from utils.models import get_tokenizer, token_batches

    s = sizes()
    _model_ok(model, s)
    measured = _growth_ok(growth, s)
    args = _kv_args(model, s)
    want = reference_calculator(*args)["cache_bytes"]
    mine = checks.call(kv_cache_calculator, *args, name="kv_cache_calculator")
    _same_calc(mine, reference_calculator(*args), f"{args!r}")
    _check_growth_numbers(measured, kv_predicted_bytes_per_step, kv_growth_error, want)
    dev = next(model.parameters()).device
    prompt = next(token_batches(get_tokenizer(None), None, s.kv_batch, s.prompt_len, device=dev,
                                vocab_size=model.config.vocab_size))[0]

    def compare():
        with checks.quiet():
            fresh = inference.measure_kv_growth(model, prompt, s.kv_new_tokens)["bytes_per_step"]
        for label, v in (("growth['bytes_per_step']", measured), ("your calculator's prediction", want)):
            if abs(v / fresh - 1) > KV_BAND:
                raise AssertionError(f"{label} = {v:.6g} bytes per step, but the grader measured {fresh:.6g} "
                                     f"({100 * (v / fresh - 1):+.2f}%, at most {100 * KV_BAND:.0f}%)")
        checks.say(f"  KV growth: grader {fresh:.6g} bytes per step ({growth.get('source')}), yours {measured:.6g}, "
                   f"your calculator {want:.6g}")

    checks.agree(compare, ATTEMPTS)


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


def _min_saving(model_preset: str, savings: dict) -> None:
    if model_preset != "llama-1.1b":
        return
    for m, v in savings.items():
        if m in MIN_SAVING and v < MIN_SAVING[m]:
            raise AssertionError(f"{m} saves {v:.3g}x of the weight memory, below the {MIN_SAVING[m]}x its bits per "
                                 f"weight give {model_preset}")


def check_quantization(quant, memory_saving, perplexity_change) -> None:
    """Savings and perplexity changes follow from the measurements; the weight memory of every
    mode measured is measured again (bitsandbytes needs a CUDA GPU: without one only the
    reference dtype is re-measured, and the feedback says so)."""
    mode = checks.begin("weight memory of the quantized models")
    if mode == RECORD:
        return _record_quant()
    untampered()
    from utils import quantize
    from utils.training import bitsandbytes_usable

    s = sizes()
    ref, others = _savings_ok(quant, memory_saving, perplexity_change)
    if ref != quantize.reference_mode(device()):
        raise AssertionError(f"quant's reference is {ref!r}; on this device it is {quantize.reference_mode(device())!r}")
    ok, why = bitsandbytes_usable()
    if ok and device() != "cuda":
        ok, why = False, "smoke mode runs on the CPU"
    if ok and set(others) != set(quantize.QUANT_MODES):
        raise AssertionError(f"bitsandbytes works here: measure {', '.join(quantize.QUANT_MODES)}, not {sorted(others)}")
    _min_saving(s.model, memory_saving)

    def compare():
        fresh = {}
        for m in [ref, *others]:
            with checks.quiet():
                model, info = quantize.measure_weights(s.model, m, device())
                del model
                gc.collect()
            fresh[m] = info["weight_bytes"]
            checks.assert_in_band(quant["modes"][m]["weight_bytes"], fresh[m], MEMORY_BAND,
                                  f"quant['modes'][{m!r}]['weight_bytes']", "bytes")
        for m in others:
            checks.say_versus(f"{m} memory saving", fresh[ref] / fresh[m], memory_saving[m], "x", MEMORY_BAND)
        if not others:
            checks.say(f"  {ref} weights: grader {fresh[ref]:,} bytes; int8 and nf4 not measured here ({why})")

    checks.agree(compare, ATTEMPTS)


# -- the measurement record -----------------------------------------------------------------------

def record_path(smoke: bool) -> Path:
    return Path(f"{PHASE}.smoke.record.json" if smoke else f"{PHASE}.record.json")


_NEEDED = ("SIZES", "model", "copy", "copy_gbs", "decode", "BYTES_PER_STEP", "WEIGHT_BYTES_READ", "KV_BYTES_PER_TOKEN",
           "CONTEXT_LEN", "growth", "kv_predicted_bytes_per_step", "kv_growth_error", "quant", "memory_saving",
           "perplexity_change", "ttft", "sweep")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (its ``globals()``)."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    g, s = ns, ns["SIZES"]
    dt = dtype_name(g["model"])
    rec = Record.new()
    rec.add("copy_gbs", g["copy_gbs"], "GB/s", g["copy"]["time"].method, checks.spread(g["copy"]["time"]),
            bytes=g["copy"]["bytes"], **checks.times_dict(g["copy"]["time"]))
    common = dict(model=s.model, dtype=dt, prompt_len=s.prompt_len, new_tokens=s.new_tokens,
                  bytes_per_step=g["BYTES_PER_STEP"], weight_bytes_read=g["WEIGHT_BYTES_READ"],
                  kv_bytes_per_token=g["KV_BYTES_PER_TOKEN"], context_len=g["CONTEXT_LEN"], copy_gbs=g["copy_gbs"])
    for name, d in g["decode"].items():
        rec.add(f"decode_{name}", d["tokens_per_s"], "tokens/s", d["tn"].method, checks.spread(d["tn"]),
                tpot_ms=d["tpot_ms"], bandwidth_gbs=d["bandwidth_gbs"], copy_fraction=d["copy_fraction"],
                t1=checks.times_dict(d["t1"]), tn=checks.times_dict(d["tn"]), **common)
    gr = g["growth"]
    rec.add("kv_growth_bytes_per_step", gr["bytes_per_step"], "bytes", gr["source"], None,
            args=list(_kv_args(g["model"], s)), predicted=g["kv_predicted_bytes_per_step"], error=g["kv_growth_error"],
            model=s.model, tokens=gr["tokens"], bytes=gr["bytes"])
    q = g["quant"]
    for m, info in q["modes"].items():
        rec.add(f"quant_{m}_weight_bytes", info["weight_bytes"], "bytes", info["source"], None, mode=m,
                reference=q["reference"], perplexity=info["perplexity"], tokens_per_s=info["tokens_per_s"],
                tpot_ms=info["tpot_ms"], memory_saving=g["memory_saving"].get(m),
                perplexity_change=g["perplexity_change"].get(m), skipped=q["skipped"], model=s.model)
    for n, t in g["ttft"].items():
        rec.add(f"ttft_ms_{n}", t.median_ms, "ms", t.method, checks.spread(t), prompt_len=n, **checks.times_dict(t))
    for row in g["sweep"]:
        if "tokens_per_s" in row:
            rec.add(f"batch_{row['batch']}_tokens_per_s", row["tokens_per_s"], "tokens/s", "utils.inference.batching_sweep",
                    None, **row)
    rec.save(Path(path) if path else record_path(smoke_mode()))
    return rec


# -- grading from the record ----------------------------------------------------------------------

def _record_decode(bytes_per_decode_step) -> None:
    from utils import inference, kvcache
    from utils.models import build_model, preset_config_dict

    rec, spec = checks.open_record()
    cg, cbytes = checks.recorded(rec, "copy_gbs", "bytes")
    checks.assert_close(cg, _rate(cbytes, _median(rec.measurements["copy_gbs"].extra, "record copy_gbs")),
                        "record copy_gbs vs its bytes and median", rel=1e-3)
    checks.assert_not_above(cg, spec.bandwidth_gbs, "recorded copy_gbs", "GB/s", f"the {spec.name} datasheet bandwidth")
    tps = {}
    for name in PATHS:
        v, tpot, gbs, frac, t1, tn, n, model, dt, bps, wbr, kvt, ctx, plen, rcg = checks.recorded(
            rec, f"decode_{name}", "tpot_ms", "bandwidth_gbs", "copy_fraction", "t1", "tn", "new_tokens", "model", "dtype",
            "bytes_per_step", "weight_bytes_read", "kv_bytes_per_token", "context_len", "prompt_len", "copy_gbs")
        with checks.quiet():
            meta = build_model(str(model), dtype=str(dt), device="meta")
        checks.assert_close(wbr, inference.weight_bytes_read_per_step(meta), f"recorded weight_bytes_read of {model}",
                            rel=REL)
        kv = kvcache.bytes_per_token(kvcache.from_hf_config(preset_config_dict(str(model)), kv_dtype=str(dt)))
        checks.assert_close(kvt, kv, f"recorded kv_bytes_per_token of {model}", rel=REL)
        checks.assert_close(ctx, inference.mean_context_len(int(plen), int(n)), "recorded context_len", rel=REL)
        mine = checks.call(bytes_per_decode_step, wbr, kvt, 1, ctx, name="bytes_per_decode_step")
        checks.assert_close(bps, mine, f"recorded bytes_per_step of {name} (your bytes_per_decode_step on its inputs)",
                            rel=1e-9)
        checks.assert_close(rcg, cg, f"recorded copy_gbs beside decode_{name}", rel=1e-9)
        d = {"t1": t1, "tn": tn, "tpot_ms": tpot, "tokens_per_s": v, "bandwidth_gbs": gbs, "copy_fraction": frac}
        _check_one(f"record {name}", d, bps, cg, int(n))
        checks.assert_not_above(gbs, spec.bandwidth_gbs, f"recorded {name} decode bandwidth", "GB/s",
                                f"the {spec.name} datasheet bandwidth")
        tps[name] = v
    need = sizes(tier_of(rec.fingerprint)).min_fast_speedup
    if tps["fast"] / tps["eager"] < need:
        raise AssertionError(f"the record's fast path is {tps['fast'] / tps['eager']:.3g}x eager generate, below {need}x")
    checks.record_ok(f"decode: eager {tps['eager']:.4g}, fast {tps['fast']:.4g} tokens/s")


def _rate(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def _record_kv(kv_cache_calculator) -> None:
    from utils.models import preset_config_dict

    rec, _ = checks.open_record()
    measured, args, predicted, error, model = checks.recorded(rec, "kv_growth_bytes_per_step", "args", "predicted",
                                                              "error", "model")
    cfg = preset_config_dict(str(model))
    heads = cfg["num_attention_heads"]
    shape = (cfg["num_hidden_layers"], cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads)
    if not isinstance(args, list) or len(args) != 7 or tuple(args[:3]) != shape:
        raise AssertionError(f"the record's KV arguments {args!r:.80} are not {model}'s layers, KV heads and head dim {shape}")
    mine = checks.call(kv_cache_calculator, *args, name="kv_cache_calculator")
    want = reference_calculator(*args)
    _same_calc(mine, want, f"{tuple(args)!r}")
    _check_growth_numbers(checks.assert_positive(measured, "recorded growth"), predicted, error, want["cache_bytes"])
    checks.record_ok(f"KV growth {measured:.6g} bytes per step against {want['cache_bytes']:.6g} predicted")


def _record_quant() -> None:
    from utils.inference import weight_bytes
    from utils.models import build_model

    rec, _ = checks.open_record()
    rows = {n: m for n, m in rec.measurements.items() if n.startswith("quant_")}
    if not rows:
        raise AssertionError("the record has no quantization measurements: run the whole notebook before saving it")
    modes = {m.extra.get("mode"): m for m in rows.values()}
    ref = next(iter(rows.values())).extra.get("reference")
    if ref not in modes:
        raise AssertionError(f"the record has no weight memory for its reference dtype {ref!r}")
    model = str(modes[ref].extra.get("model"))
    with checks.quiet():
        want = weight_bytes(build_model(model, dtype=str(ref), device="meta"))
    checks.assert_in_band(modes[ref].value, want, MEMORY_BAND, f"recorded {ref} weight bytes of {model}", "bytes")
    savings = {}
    for m, meas in modes.items():
        if m == ref:
            continue
        savings[m] = modes[ref].value / checks.assert_positive(meas.value, f"recorded {m} weight bytes")
        checks.assert_close(meas.extra.get("memory_saving"), savings[m], f"recorded memory_saving[{m!r}]", rel=1e-9)
        change = meas.extra["perplexity"] / modes[ref].extra["perplexity"] - 1
        checks.assert_close(meas.extra.get("perplexity_change"), change, f"recorded perplexity_change[{m!r}]",
                            rel=1e-9, abs_tol=1e-12)
    _min_saving(model, savings)
    if not savings:
        skipped = modes[ref].extra.get("skipped")
        checks.say(f"  the GPU run measured no quantized model ({skipped}): only its {ref} weights are checked")
    checks.record_ok(", ".join(f"{m} {v:.3g}x smaller" for m, v in savings.items()) or f"{ref} weights")
