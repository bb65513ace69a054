"""Phase 3's measurement record, and the checks its live and record grading share.

``save_record`` writes every measured number of ``03_inference_serving`` (copy bandwidth,
decode timings of the three paths, KV-cache growth, quantized weight memory, TTFT, the
batching sweep) with the raw fields each was derived from, the machine's fingerprint and the
``utils`` hash (``utils.record``). On a grading machine without a GPU the measured cells of
:mod:`grader.phase3` grade a GPU record instead (docs/grading.md): fingerprint and ``utils``
hash, every derived number recomputed from its raw fields, the learner's functions applied
to the recorded inputs, nothing above the card's datasheet, the model's shape from its
shipped config. An invented but consistent, plausible record passes: the record proves the
arithmetic, not the run.

The checks both modes apply (the calculator against ``utils.kvcache``, one path's decode
numbers against its timings, the KV growth against the calculator, the minimum quantization
savings) live here so that :mod:`grader.phase3` and the record grading run the same code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grader import checks  # grader.phase(3) rebinds it to a fresh copy
from utils.units import GIB, gb_per_s

PHASE = "03_inference_serving"
PATHS = ("eager", "static_compiled", "fast")
KV_BAND = 0.02  # measured KV growth within 2% of the calculator (a CUDA allocator reads it exactly)
MEMORY_BAND = 0.03  # weights loaded twice take the same bytes, up to allocator rounding
MIN_SAVING = {"int8": 1.6, "nf4": 2.5}  # llama-1.1b, estimates from the bits per weight (utils/quantize.py): 1.79x, 2.89x
REL = 1e-9  # pure arithmetic
TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def sizes(tier: str | None = None):
    from utils.env import phase_sizes

    return phase_sizes(PHASE, tier)


def median_ms(t: Any, name: str) -> float:
    if isinstance(t, dict):
        med, p20, p80 = t.get("median_ms"), t.get("p20_ms"), t.get("p80_ms")
    else:
        med, p20, p80 = getattr(t, "median_ms", None), getattr(t, "p20_ms", None), getattr(t, "p80_ms", None)
    med = checks.assert_positive(med, f"{name} median_ms")
    if not checks.as_number(p20, f"{name} p20_ms") <= med <= checks.as_number(p80, f"{name} p80_ms"):
        raise AssertionError(f"{name}: p20 <= median <= p80 does not hold")
    return med


def precision(model_or_dtype: Any) -> str:
    """``bf16``/``fp16``/``fp32`` of a model's parameters or a torch dtype."""
    d = model_or_dtype
    if hasattr(d, "parameters"):
        d = next(d.parameters()).dtype
    return TORCH_DTYPES.get(checks.dtype_name(d), str(d))


def reference_calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib, block_size=16) -> dict:
    """What ``kv_cache_calculator`` must return, from ``utils.kvcache`` (vLLM v1's arithmetic)."""
    from utils.kvcache import KVSpec, dtype_bytes
    from utils.vllm_kv import vllm_plan

    spec = KVSpec(int(layers), int(kv_heads), int(head_dim), dtype_bytes(dtype))
    plan = vllm_plan(spec, int(context), int(kv_memory_gib * GIB), batch=int(batch), block_size=int(block_size),
                     token_formula="blocks", concurrency_formula="blocks")
    return {"bytes_per_token": plan.bytes_per_token, "cache_bytes": plan.batch_kv_bytes_unpaged,
            "num_blocks": plan.num_blocks, "max_concurrency": plan.max_concurrency}


def same_calc(got: Any, want: dict, label: str) -> None:
    if not isinstance(got, dict):
        raise AssertionError(f"kv_cache_calculator{label} returned {type(got).__name__}, not a dict")
    missing = [k for k in want if k not in got]
    if missing:
        raise AssertionError(f"kv_cache_calculator{label} has no {', '.join(missing)}")
    for key, w in want.items():
        checks.assert_close(got[key], w, f"kv_cache_calculator{label}['{key}']",
                            rel=REL if key == "max_concurrency" else 0.0)


def decode_numbers_ok(name: str, d: Any, bytes_per_step: float, copy_gbs: float, new_tokens: int) -> None:
    """One path's numbers follow from its two timings, the bytes per step and the copy bandwidth."""
    keys = {"t1", "tn", "tpot_ms", "tokens_per_s", "bandwidth_gbs", "copy_fraction"}
    if not isinstance(d, dict) or not keys <= set(d):
        raise AssertionError(f"decode[{name!r}] needs {', '.join(sorted(keys))}")
    tpot = checks.assert_positive(d["tpot_ms"], f"decode[{name!r}]['tpot_ms']")
    t1, tn = median_ms(d["t1"], f"decode[{name!r}]['t1']"), median_ms(d["tn"], f"decode[{name!r}]['tn']")
    checks.assert_close(tpot, (tn - t1) / (new_tokens - 1),
                        f"decode[{name!r}]['tpot_ms'] ((tn - t1) / (new_tokens - 1) in medians)", rel=1e-6)
    checks.assert_close(d["tokens_per_s"], 1e3 / tpot, f"decode[{name!r}]['tokens_per_s'] (1000 / TPOT)", rel=1e-6)
    gbs = bytes_per_step * d["tokens_per_s"] / 1e9
    checks.assert_close(d["bandwidth_gbs"], gbs, f"decode[{name!r}]['bandwidth_gbs'] (bytes per step x tokens/s)", rel=1e-6)
    checks.assert_close(d["copy_fraction"], gbs / copy_gbs, f"decode[{name!r}]['copy_fraction'] (over copy_gbs)", rel=1e-6)


def kv_args(model: Any, s) -> tuple:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return (cfg.num_hidden_layers, kv, head_dim, precision(model), s.kv_batch, 1, 0.0)


def growth_numbers_ok(measured: float, predicted: Any, error: Any, want: float) -> None:
    checks.assert_close(predicted, want, "kv_predicted_bytes_per_step (your calculator: one token for each sequence)",
                        rel=REL)
    checks.assert_close(error, measured / want - 1, "kv_growth_error (measured / predicted - 1)", rel=1e-6, abs_tol=1e-12)
    if abs(measured / want - 1) > KV_BAND:
        raise AssertionError(f"the KV cache grew {measured:.6g} bytes per step, {100 * (measured / want - 1):+.2f}% "
                             f"from the calculator's {want:.6g}: more than {100 * KV_BAND:.0f}% apart")


def min_saving_ok(model_preset: str, savings: dict) -> None:
    if model_preset != "llama-1.1b":
        return
    for m, v in savings.items():
        if m in MIN_SAVING and v < MIN_SAVING[m]:
            raise AssertionError(f"{m} saves {v:.3g}x of the weight memory, below the {MIN_SAVING[m]}x its bits per "
                                 f"weight give {model_preset}")



_NEEDED = ("SIZES", "model", "copy", "copy_gbs", "decode", "BYTES_PER_STEP", "WEIGHT_BYTES_READ", "KV_BYTES_PER_TOKEN",
           "CONTEXT_LEN", "growth", "kv_predicted_bytes_per_step", "kv_growth_error", "quant", "memory_saving",
           "perplexity_change", "ttft", "sweep")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (its ``globals()``)."""
    from utils.env import smoke_mode
    from utils.record import Record

    checks.assert_defined(ns, _NEEDED)
    g, s = ns, ns["SIZES"]
    dt = precision(g["model"])
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
            args=list(kv_args(g["model"], s)), predicted=g["kv_predicted_bytes_per_step"], error=g["kv_growth_error"],
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
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


def decode(bytes_per_decode_step) -> None:
    from utils import inference, kvcache
    from utils.models import build_model, preset_config_dict

    rec, spec = checks.open_record()
    cg, cbytes = checks.recorded(rec, "copy_gbs", "bytes")
    checks.assert_close(cg, gb_per_s(cbytes, median_ms(rec.measurements["copy_gbs"].extra, "record copy_gbs")),
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
        decode_numbers_ok(f"record {name}", d, bps, cg, int(n))
        checks.assert_not_above(gbs, spec.bandwidth_gbs, f"recorded {name} decode bandwidth", "GB/s",
                                f"the {spec.name} datasheet bandwidth")
        tps[name] = v
    from utils.tier_plan import fingerprint_tier

    need = sizes(fingerprint_tier(rec.fingerprint)).min_fast_speedup
    if tps["fast"] / tps["eager"] < need:
        raise AssertionError(f"the record's fast path is {tps['fast'] / tps['eager']:.3g}x eager generate, below {need}x")
    checks.record_ok(f"decode: eager {tps['eager']:.4g}, fast {tps['fast']:.4g} tokens/s")



def kv_growth(kv_cache_calculator) -> None:
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
    same_calc(mine, want, f"{tuple(args)!r}")
    growth_numbers_ok(checks.assert_positive(measured, "recorded growth"), predicted, error, want["cache_bytes"])
    checks.record_ok(f"KV growth {measured:.6g} bytes per step against {want['cache_bytes']:.6g} predicted")


def quantization() -> None:
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
    min_saving_ok(model, savings)
    if not savings:
        skipped = modes[ref].extra.get("skipped")
        checks.say(f"  the GPU run measured no quantized model ({skipped}): only its {ref} weights are checked")
    checks.record_ok(", ".join(f"{m} {v:.3g}x smaller" for m, v in savings.items()) or f"{ref} weights")


# -- continuous batching: the rule the learner's scheduler follows, and traces it has not seen ------

BATCH_TRACE = {"n_requests": 12, "seed": 4}  # the notebook's trace (utils.paged_batching.make_trace)
KV_POOL_BYTES = 132_000  # the notebook's KV memory for the serving exercise: 32 blocks of 4 tokens of llama-tiny in fp32


def reference_continuous(engine) -> None:
    """The notebook's rule: retire after every step, then admit the arrived requests first come
    first served (no skipping) while the batch has room and the free blocks, less those the
    running requests will still take, cover the newcomer's whole cache; blocks on demand."""
    bs, free = engine.block_size, list(range(engine.num_blocks))
    waiting = sorted(engine.trace, key=lambda r: (r.arrival_step, r.rid))
    running: dict = {}

    def need(r) -> int:
        return -(-(r.prompt_len + r.output_len - 1) // bs)

    while waiting or running:
        owed = sum(need(engine.request(rid)) - len(t) for rid, t in running.items())
        while waiting and waiting[0].arrival_step <= engine.now and len(running) < engine.max_batch \
                and len(free) - owed >= need(waiting[0]):
            r = waiting.pop(0)
            running[r.rid] = []
            owed += need(r)
        if not running:
            engine.wait()
            continue
        for rid, t in running.items():
            while len(t) < -(-(engine.request(rid).prompt_len + engine.generated[rid]) // bs):
                t.append(free.pop())
        for rid in engine.step({rid: list(t) for rid, t in running.items()}):
            free.extend(running.pop(rid))


def hidden_traces(seed: int) -> list[tuple[str, list, dict]]:
    """``(name, trace, engine sizes)``: four drawn with ``seed``, and the corners: one-token
    answers, an idle gap before a late arrival, a pool that fits one request at a time, prompts
    that end on a block boundary, more arrivals at once than the batch holds."""
    import random

    from utils.paged_batching import Request, make_trace

    rng = random.Random(seed)
    out = []
    for i in range(4):
        bs = rng.choice((2, 4, 8))
        tr = make_trace(rng.randint(6, 14), rng.randrange(1 << 20), output_lens=(1, rng.randint(8, 40)),
                        per_step=rng.uniform(0.3, 4.0))
        most = max(-(-(r.prompt_len + r.output_len - 1) // bs) for r in tr)
        out.append((f"drawn trace {i + 1} (seed {seed})", tr,
                    {"num_blocks": most + rng.randint(0, 3 * most), "block_size": bs, "max_batch": rng.randint(2, 8)}))
    out += [
        ("one-token answers", [Request(i, i // 3, 5 + i, 1) for i in range(7)], {"num_blocks": 8, "block_size": 4, "max_batch": 4}),
        ("a late arrival after an idle gap", [Request(0, 0, 6, 3), Request(1, 9, 3, 5), Request(2, 9, 9, 2)],
         {"num_blocks": 12, "block_size": 4, "max_batch": 4}),
        ("a pool that holds one request at a time", [Request(i, 0, 8, 9) for i in range(4)],
         {"num_blocks": 4, "block_size": 4, "max_batch": 4}),
        ("prompts that end on a block boundary", [Request(i, i, 8, 6 - i) for i in range(5)],
         {"num_blocks": 9, "block_size": 4, "max_batch": 3}),
        ("more arrivals at once than the batch holds", [Request(i, 0, 3 + i % 5, 2 + (7 * i) % 11) for i in range(12)],
         {"num_blocks": 60, "block_size": 2, "max_batch": 5}),
    ]
    return out
