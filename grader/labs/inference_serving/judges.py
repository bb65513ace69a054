"""Lab 03's judges: each graded cell's answers against the rule, the grader's measurement or a record.

Each judge is pure (``grader/judging.py``). ``bytes_per_decode_step`` and ``kv_cache_calculator``
are run by the grader on cases drawn from the grading run's secret seed, in a sandbox where the
course's own arithmetic is unavailable (``forbid``); the expected values come from one course
function each (``utils.serving.inference.decode_bytes_per_step``, ``utils.kv.kv_calculator.calculator``). The
allocator and the scheduler run in a sandbox of their own on traces drawn after the kernel has gone
(``harness.py``); their schedules are replayed here on the course's engine without a model, every
step checked, and compared with the notebook's rule (``reference.rule_schedule``). The measured cells are
checked for consistency first (every derived number from its raw fields, every count exact for
the lab's sizes), then against the grader's own measurement (``reference.py``).
"""
from __future__ import annotations

import random
import secrets

from grader.expect import Fail, approx, cases, close, equal, not_above, positive
from grader.judging import Check
from grader.labs.inference_serving.answers import PATHS, QUANT_MODES
from grader.labs.inference_serving.reference import (
    BATCH_TRACE,
    KV_BAND,
    KV_POOL_BYTES,
    MEMORY_BAND,
    MIN_SAVING,
    half,
    kv_shape,
    rule_schedule,
    serve_spec,
)
from grader.labs.inference_serving.sizes import BY_TIER
from grader.schema import AnswerError, Count, Fields, Flag, ListOf, Nullable, Text, TupleOf
from utils.kv.kv_calculator import DTYPES, calculator
from utils.kv.vllm_kv import vllm_num_blocks
from utils.serving import paged_batching as pb
from utils.serving.inference import decode_bytes_per_step
from utils.units import GIB, gb_per_s

ASSIGNMENT = "03_inference_serving"
DECODE_FORMULA = ("utils.serving.inference:decode_bytes_per_step",)
KV_ARITHMETIC = ("utils.kv.kv_calculator:calculator", "utils.kv.kvcache:dtype_bytes", "utils.kv.kvcache:bytes_per_token",
                 "utils.kv.kvcache:kv_cache_bytes", "utils.kv.kvcache:KVSpec.layer_bytes_per_token") + tuple(
    f"utils.kv.vllm_kv:{f}" for f in ("vllm_layout", "vllm_num_blocks", "vllm_blocks_per_request", "vllm_request_bytes",
                                   "vllm_max_concurrency", "vllm_kv_tokens", "vllm_plan", "vllm_estimate_max_model_len"))
RULE = ("grader.labs.inference_serving.reference:rule_schedule",)
CALC_RULE = ("2 x layers x KV heads x head dim x bytes per token; batch x context of those unpaged; "
             "int(GiB x 2^30) // (2 x block_size x KV heads x head dim x bytes) // layers blocks; "
             "blocks / ceil(context / block_size) requests")


# -- hidden cases, drawn from the run's secret seed ------------------------------------------------

SHAPES = ((32, 8, 128), (32, 32, 128), (80, 8, 128), (32, 1, 64), (22, 4, 64), (28, 4, 128), (2, 2, 32), (40, 40, 128))


def bytes_cases(rng, ctx) -> list:
    """``(weight bytes, KV bytes per token, batch, mean context)``: 1 kB to 100 GB of weights, any batch."""
    out = [[float(rng.randint(1, 10**11)), rng.randint(64, 10**6), rng.randint(1, 256),
            rng.randint(1, 65536) + rng.choice([0.0, 0.5])] for _ in range(11)]
    return out + [[0.0, rng.randint(64, 4096), rng.randint(1, 8), float(rng.randint(1, 512))]]


def kv_cases(rng, ctx) -> list:
    """Public configs' shapes and random ones, every dtype, blocks of 1 to 128 tokens, contexts on and
    off a block boundary, memory from none to 80 GiB; a few leave block_size to its default."""
    out = []
    for i in range(16):
        layers, kv, hd = rng.choice(SHAPES) if i < 8 else (
            rng.randint(1, 128), rng.choice([1, 2, 4, 8, 16, rng.randint(1, 128)]), rng.choice([64, 80, 128, 8 * rng.randint(1, 64)]))
        bs = rng.choice([16, 16, 32, 128, rng.choice([1, 2, 4, 8, 64])])
        context = rng.choice([rng.randint(1, 131072), bs * rng.randint(1, 2048), bs * rng.randint(0, 2048) + rng.randint(1, bs)])
        mem = rng.choice([0.0, round(rng.uniform(0.0, 80.0), rng.randint(0, 3)), rng.uniform(0.001, 2.0),
                          rng.uniform(1.0, 80.0)])
        case = [layers, kv, hd, DTYPES[i % len(DTYPES)], rng.randint(1, 64), context, mem]
        out.append(case if i % 5 == 4 and bs == 16 else case + [bs])
    return out


def growth_cases(rng, ctx) -> list:
    """The lab's model's KV shape on every tier and dtype (the cell is judged on the tier that measured it)."""
    out = []
    for tier in ("cpu", "t4", "a100", "h100"):
        s = _sizes(tier)
        for dtype in ("fp32", "bf16", "fp16"):
            case = [*kv_shape(s.model), dtype, s.kv_batch, 1, 0.0]
            if case not in out:
                out.append(case)
    return out


def pool_case(rng, ctx) -> list:
    s = serve_spec()
    return [[s.num_layers, s.num_kv_heads, s.head_dim, "fp32", 1, 1, KV_POOL_BYTES / GIB, pb.BLOCK_SIZE]]


def _sizes(tier):
    return BY_TIER[tier]


def _same_calc(got, want) -> str | None:
    """None when ``got`` is ``want``'s dict (counts exact, concurrency to 1e-9), else what differs."""
    if not isinstance(got, dict):
        return f"returned {type(got).__name__}, not a dict"
    for key, w in want.items():
        if key not in got:
            return f"has no {key!r}"
        if not approx(1e-9 if key == "max_concurrency" else 0.0)(got[key], w):
            return f"{key!r} expected {w!r:.40}, got {got[key]!r:.40}"
    return None


def calc_cases(results: list, inputs: list, what: str) -> str:
    """The learner's calculator on ``inputs`` against :func:`utils.kv.kv_calculator.calculator`."""
    wrong, first = 0, None
    for r, args in zip(results, inputs, strict=True):
        why = f"it raised {r.error}" if not r.ok else _same_calc(r.value, calculator(*args))
        if why:
            wrong, first = wrong + 1, first or why
    if wrong:
        raise Fail(f"kv_cache_calculator disagreed with vLLM's arithmetic on {what} ({wrong} of {len(results)} wrong; "
                   f"first: {first}). The rule: {CALC_RULE}")
    return f"kv_cache_calculator: right on {what}"


# -- the formula cells ------------------------------------------------------------------------------

def kv_calculator(a, ref):
    return [calc_cases(a.calls["kv_cache_calculator"], a.inputs["kv_cache_calculator"],
                       f"{len(a.inputs['kv_cache_calculator'])} hidden shapes")]


def _timing(t: dict, name: str) -> float:
    if not t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]:
        raise Fail(f"{name}: p20 {t['p20_ms']:.4g} <= median {t['median_ms']:.4g} <= p80 {t['p80_ms']:.4g} ms does not "
                   "hold: not a timing from utils.measure.timing.benchmark")
    return t["median_ms"]


def decode(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    notes = [cases(a.calls["bytes_per_decode_step"], [decode_bytes_per_step(*c) for c in a.inputs["bytes_per_decode_step"]],
                   "bytes_per_decode_step", "weight bytes + batch x context_len x KV bytes per token", approx(1e-9))]
    close(a.BYTES_PER_STEP, ref.bytes_per_step, "BYTES_PER_STEP", f"WEIGHT_BYTES_READ {ref.weight_bytes_read:,} + 1 x "
          f"CONTEXT_LEN {ref.context_len:g} x KV_BYTES_PER_TOKEN {ref.kv_bytes_per_token:,} of {s.model} in {half(ctx)}",
          rel=1e-9)
    cp = a.copy
    equal(cp["numel"], s.copy_numel, "copy['numel']", "SIZES.copy_numel")
    equal(cp["bytes"], 8 * s.copy_numel, "copy['bytes']", "the copy reads and writes 4 bytes per fp32 element")
    close(cp["gbs"], gb_per_s(cp["bytes"], _timing(cp["time"], "copy['time']")), "copy['gbs']",
          "copy['bytes'] over copy['time']'s median", rel=1e-3)
    close(a.copy_gbs, cp["gbs"], "copy_gbs", "copy['gbs']", rel=1e-9)
    n = s.new_tokens
    for name in PATHS:
        d, k = a.decode[name], f"decode[{name!r}]"
        t1, tn = _timing(d["t1"], f"{k}['t1']"), _timing(d["tn"], f"{k}['tn']")
        close(d["tpot_ms"], (tn - t1) / (n - 1), f"{k}['tpot_ms']", f"(tn - t1) / (SIZES.new_tokens - 1) = (tn - t1) / "
              f"{n - 1} in medians", rel=1e-6)
        tpot = positive(d["tpot_ms"], f"{k}['tpot_ms']")
        close(d["tokens_per_s"], 1e3 / tpot, f"{k}['tokens_per_s']", "1000 / TPOT", rel=1e-6)
        close(d["bandwidth_gbs"], a.BYTES_PER_STEP * d["tokens_per_s"] / 1e9, f"{k}['bandwidth_gbs']",
              "BYTES_PER_STEP x tokens/s / 1e9", rel=1e-6)
        close(d["copy_fraction"], d["bandwidth_gbs"] / a.copy_gbs, f"{k}['copy_fraction']", "bandwidth over copy_gbs",
              rel=1e-6)
    if ctx.device == "cuda" and ctx.spec and ctx.spec.bandwidth_gbs:
        sheet = f"the {ctx.spec.name} datasheet bandwidth"
        not_above(a.copy_gbs, ctx.spec.bandwidth_gbs, "copy_gbs", "GB/s", sheet)
        for name in PATHS:
            not_above(a.decode[name]["bandwidth_gbs"], ctx.spec.bandwidth_gbs, f"decode[{name!r}]['bandwidth_gbs']", "GB/s",
                      sheet)
    if not ref.live:
        speedup = a.decode["fast"]["tokens_per_s"] / a.decode["eager"]["tokens_per_s"]
        if speedup < s.min_fast_speedup:
            raise Fail(f"the fast path is {speedup:.3g}x eager generate in your record, below the {s.min_fast_speedup}x "
                       f"the {ctx.tier} tier expects")
    notes += [ref.against(f"tpot:{name}", a.decode[name]["tpot_ms"], f"decode[{name!r}]['tpot_ms']", "ms")
              for name in PATHS]
    notes.append(ref.against("copy", a.copy_gbs, "copy_gbs", "GB/s"))
    if ref.live:
        notes.append(ref.fast_speedup())
    return notes


def kv_growth(a, ref):
    ctx = ref.ctx
    s = ctx.sizes
    g = a.growth
    equal(g["batch"], s.kv_batch, "growth['batch']", "SIZES.kv_batch sequences")
    equal(g["prompt_len"], s.prompt_len, "growth['prompt_len']", "SIZES.prompt_len")
    want_tokens = list(range(s.prompt_len + 1, s.prompt_len + s.kv_new_tokens + 1))
    if g["tokens"] != want_tokens or len(g["bytes"]) != len(want_tokens):
        raise Fail(f"growth['tokens'] and growth['bytes'] must have one entry per step, the cache lengths "
                   f"{want_tokens[0]} to {want_tokens[-1]}: not what inference.measure_kv_growth returns for SIZES")
    measured = positive(g["bytes_per_step"], "growth['bytes_per_step']")
    close(measured, (g["bytes"][-1] - g["bytes"][0]) / (want_tokens[-1] - want_tokens[0]), "growth['bytes_per_step']",
          "the growth from the first to the last step over the steps between", rel=1e-9)
    args = [*kv_shape(s.model), half(ctx), s.kv_batch, 1, 0.0]
    inputs = a.inputs["kv_cache_calculator"]
    if args not in inputs:
        raise Fail(f"the grader has no case of your calculator for {s.model} in {half(ctx)}: a fault of the course")
    i = inputs.index(args)
    notes = [calc_cases([a.calls["kv_cache_calculator"][i]], [args], f"{s.model}'s shape in {half(ctx)}")]
    want = calculator(*args)["cache_bytes"]
    close(a.kv_predicted_bytes_per_step, want, "kv_predicted_bytes_per_step", f"your calculator's cache_bytes for one "
          f"token of each of the {s.kv_batch} sequences of {s.model} in {half(ctx)}", rel=1e-9)
    close(a.kv_growth_error, measured / want - 1, "kv_growth_error", "measured / predicted - 1", rel=1e-6, abs_tol=1e-12)
    if abs(measured / want - 1) > KV_BAND:
        raise Fail(f"the KV cache grew {measured:.6g} bytes per step, {100 * (measured / want - 1):+.2f}% from the "
                   f"calculator's {want:.6g}: more than {100 * KV_BAND:.0f}% apart")
    notes.append(ref.against("growth", measured, "growth['bytes_per_step']", "bytes"))
    notes.append(ref.against("growth", want, "your calculator's prediction", "bytes"))
    return notes


def quantization(a, ref):
    ctx = ref.ctx
    q = a.quant
    base = q["reference"]
    equal(base, half(ctx), "quant['reference']", f"the 16-bit dtype of this {ctx.device} (fp32 on a CPU)")
    if base not in q["modes"]:
        raise Fail(f"quant has no measurement of its reference dtype {base!r}")
    others = sorted(m for m in q["modes"] if m != base)
    if any(m not in QUANT_MODES for m in others):
        raise Fail(f"quant['modes'] has {others}: besides {base!r}, only {', '.join(QUANT_MODES)}")
    for name, v in (("memory_saving", a.memory_saving), ("perplexity_change", a.perplexity_change)):
        if sorted(v) != others:
            raise Fail(f"{name} must have one entry per quantized mode measured: {others or 'none here'}, got {sorted(v)}")
    bw, bp = q["modes"][base]["weight_bytes"], q["modes"][base]["perplexity"]
    for m in others:
        close(a.memory_saving[m], bw / q["modes"][m]["weight_bytes"], f"memory_saving[{m!r}]",
              f"{base} weight bytes / {m} weight bytes", rel=1e-9)
        close(a.perplexity_change[m], q["modes"][m]["perplexity"] / bp - 1, f"perplexity_change[{m!r}]",
              f"{m} perplexity / {base} perplexity - 1", rel=1e-9, abs_tol=1e-12)
        if ctx.sizes.model == "llama-1.1b" and m in MIN_SAVING and a.memory_saving[m] < MIN_SAVING[m]:
            raise Fail(f"{m} saves {a.memory_saving[m]:.3g}x of the weight memory, below the {MIN_SAVING[m]}x its bits "
                       f"per weight give {ctx.sizes.model}")
    lo, hi = ref.meta_weight_bytes / (1 + MEMORY_BAND), ref.meta_weight_bytes * (1 + MEMORY_BAND)
    if not lo <= bw <= hi:
        raise Fail(f"quant['modes'][{base!r}]['weight_bytes'] = {bw:,}, but {ctx.sizes.model}'s parameters take "
                   f"{ref.meta_weight_bytes:,} bytes in {base} (within {100 * MEMORY_BAND:.0f}%)")
    if not ref.live:
        return [f"{base} weights and perplexity, and {', '.join(others) or 'no quantized mode'}, as recorded (not "
                "re-measured)"]
    if others != sorted(ref.quant_modes):
        usable = ", ".join(ref.quant_modes) or f"none ({ref.quant_why})"
        raise Fail(f"quant measured {others or 'no quantized mode'} besides {base}; the modes this machine measures: "
                   f"{usable}")
    notes = []
    for m in [base, *others]:
        k = f"quant['modes'][{m!r}]"
        notes.append(ref.against(f"quant:weights:{m}", q["modes"][m]["weight_bytes"], f"{k}['weight_bytes']", "bytes"))
        notes.append(ref.against(f"quant:ppl:{m}", q["modes"][m]["perplexity"], f"{k}['perplexity']", ""))
    if not others:
        notes.append(f"int8 and nf4 not measured here ({ref.quant_why})")
    return notes


# -- continuous batching ----------------------------------------------------------------------------

def draw_traces(rng: random.Random) -> list[dict]:
    """``{"name", "trace", "sizes"}``: four drawn traces, and drawn corners: one-token answers, an idle gap
    before late arrivals, a pool that fits one request at a time, prompts that end on a block boundary,
    more arrivals at once than the batch holds."""
    out = []
    for i in range(4):
        bs = rng.choice((2, 4, 8))
        tr = pb.make_trace(rng.randint(6, 14), rng.randrange(1 << 30), output_lens=(1, rng.randint(8, 40)),
                           per_step=rng.uniform(0.3, 4.0))
        most = max(-(-pb.final_len(r) // bs) for r in tr)
        out.append((f"drawn trace {i + 1}", tr, {"num_blocks": most + rng.randint(0, 3 * most), "block_size": bs,
                                                  "max_batch": rng.randint(2, 8)}))
    bs, n = rng.choice((2, 4)), rng.randint(5, 9)
    out.append(("one-token answers", [pb.Request(i, i // rng.randint(1, 3), rng.randint(3, 12), 1) for i in range(n)],
                {"num_blocks": rng.randint(6, 9), "block_size": bs, "max_batch": rng.randint(2, 5)}))
    gap = rng.randint(4, 12)
    late = [pb.Request(0, 0, rng.randint(3, 9), rng.randint(2, 5))] + [
        pb.Request(i, gap, rng.randint(2, 10), rng.randint(1, 6)) for i in (1, 2)]
    out.append(("a late arrival after an idle gap", late, {"num_blocks": 12, "block_size": 4, "max_batch": 4}))
    p = rng.randint(5, 10)
    one = [pb.Request(i, 0, p, rng.randint(2, 8)) for i in range(rng.randint(3, 5))]
    out.append(("a pool that holds one request at a time", one,
                {"num_blocks": max(-(-pb.final_len(r) // 4) for r in one), "block_size": 4, "max_batch": 4}))
    bs = rng.choice((2, 4, 8))
    edge = [pb.Request(i, i, bs * rng.randint(1, 3), rng.randint(1, 7)) for i in range(5)]
    out.append(("prompts that end on a block boundary", edge,
                {"num_blocks": 2 * max(-(-pb.final_len(r) // bs) for r in edge), "block_size": bs, "max_batch": 3}))
    rush = [pb.Request(i, 0, rng.randint(3, 8), rng.randint(2, 12)) for i in range(rng.randint(10, 14))]
    out.append(("more arrivals at once than the batch holds", rush,
                {"num_blocks": rng.randint(40, 70), "block_size": 2, "max_batch": rng.randint(3, 6)}))
    return [{"name": name, "trace": [list(r) for r in tr], "sizes": sizes} for name, tr, sizes in out]


def public_trace() -> dict:
    """The notebook's TRACE in the notebook's pool (``POOL_BLOCKS`` by the course's arithmetic)."""
    return {"name": "the notebook's TRACE", "trace": [list(r) for r in pb.make_trace(**BATCH_TRACE)],
            "sizes": {"num_blocks": vllm_num_blocks(KV_POOL_BYTES, serve_spec(), block_size=pb.BLOCK_SIZE)}}


def batching_params(ctx, a) -> dict:
    """The harness's inputs, drawn now (after the kernel has gone): kept in ``a.inputs`` for the judge."""
    rng = random.Random(secrets.randbits(64))
    a.inputs["traces"] = draw_traces(rng) + [public_trace()]
    a.inputs["probe"] = rng.randint(3, 12)
    s = serve_spec()
    return {"probe": a.inputs["probe"], "traces": a.inputs["traces"],
            "spec": {"num_layers": s.num_layers, "num_kv_heads": s.num_kv_heads, "head_dim": s.head_dim,
                     "dtype_bytes": s.dtype_bytes}}


BUCKET = {"allocated": ListOf(Count()), "freed": ListOf(Count())}
CALL = Fields({"tables": Nullable(ListOf(TupleOf((Count(), ListOf(Count()))))), "finished": Nullable(ListOf(Count())),
               "wait": Flag(), **BUCKET}, optional=("tables", "finished", "wait"))
RUN_LOG = Fields({"error": Nullable(Text()), "num_free_end": Nullable(Count()), "before": Fields(BUCKET),
                  "calls": ListOf(CALL), "cut": Flag()})


def _read(spec, value, name: str):
    try:
        return spec.decode(value, name)
    except AnswerError as exc:
        raise Fail(f"your allocator or scheduler gave the grader something it cannot read: {exc}") from None


def _ints(v) -> bool:
    return isinstance(v, list) and all(type(b) is int for b in v)


def probe_ok(p, n: int) -> None:
    """``BlockAllocator(n)``: n free, n different blocks of 0 .. n-1, then a refusal; freed blocks come back."""
    if not isinstance(p, dict) or p.get("n") != n:
        raise Fail("the grader could not run BlockAllocator on its own")
    if p.get("error"):
        raise Fail(f"BlockAllocator({n}) on its own: {p['error']}")
    if p.get("free0") != n:
        raise Fail(f"BlockAllocator({n}).num_free() = {p.get('free0')!r:.40}, expected {n} before any allocate()")
    got, extra, freed, again = p.get("got"), p.get("extra") or {}, p.get("freed"), p.get("again")
    if not _ints(got) or sorted(got) != list(range(n)):
        raise Fail(f"BlockAllocator({n}) handed out {got!r:.80}: {n} different int blocks of 0 .. {n - 1}")
    if "raised" not in extra:
        raise Fail(f"allocate() with no free block returned {extra.get('returned')}: it must raise (MemoryError)")
    if p.get("free_after") != len(freed) or not _ints(again) or sorted(again) != sorted(freed):
        raise Fail(f"after free() of {len(freed)} blocks, num_free() must be {len(freed)} and the next allocate() "
                   f"calls must hand those blocks out again (got {p.get('free_after')!r:.20}, {again!r:.60})")


def replay(t: dict, run: dict, spec) -> dict:
    """The learner's schedule of ``t`` replayed on the course's engine, every claim of the harness checked:
    the engine's own checks at every step, the allocator's blocks exactly the tables' new ones, the blocks of
    every finished request freed after its last step and no others, every request complete, nothing held at
    the end. Returns the engine's result."""
    name, sizes = t["name"], t["sizes"]
    if run["error"]:
        raise Fail(f"{name}: your scheduler stopped {run['error']}")
    if run["cut"]:
        raise Fail(f"{name}: your scheduler made more engine calls than the grader records: it does not finish")
    engine = pb.PagedEngine(None, [pb.Request(*r) for r in t["trace"]], spec=spec, **sizes)
    if run["before"]["freed"]:
        raise Fail(f"{name}: free() was called before the first step, with nothing to free")
    pending = run["before"]["allocated"]
    for call in run["calls"]:
        try:
            if call["wait"]:
                new = []
                engine.wait()
                done = []
            else:
                tables = dict(call["tables"] or [])
                new = [b for rid, tb in tables.items() for b in tb[len(engine.tables.get(rid, [])):]]
                done = engine.step(tables)
        except pb.ScheduleError as exc:
            raise Fail(f"{name}: the engine refuses your schedule: {exc}") from None
        step = engine.now - 1
        if sorted(new) != sorted(pending):
            raise Fail(f"{name}, step {step}: the tables hold the new blocks {sorted(new)[:8]}, but your allocator "
                       f"handed out {sorted(pending)[:8]} before it: every new block comes from allocate(), only when used")
        if not call["wait"] and sorted(call["finished"] or []) != done:
            raise Fail(f"{name}: your run and the grader's replay of it disagree at step {step}")
        want = sorted(b for rid in done for b in tables[rid])
        if sorted(call["freed"]) != want:
            raise Fail(f"{name}, step {step}: requests {done} finished holding blocks {want[:8]}, and your scheduler "
                       f"freed {sorted(call['freed'])[:8]} after it: free exactly a finished request's blocks, when it finishes")
        pending = call["allocated"]
    if pending:
        raise Fail(f"{name}: blocks {pending[:8]} were allocated after the last step and never used")
    try:
        res = engine.result()
    except pb.ScheduleError as exc:
        raise Fail(f"{name}: {exc}") from None
    if run["num_free_end"] != sizes["num_blocks"]:
        raise Fail(f"{name}: your allocator has {run['num_free_end']} of {sizes['num_blocks']} blocks free at the end: "
                   "free a request's blocks when it finishes")
    return res


def by_rule(t: dict, spec, scheduler=rule_schedule) -> dict:
    engine = pb.PagedEngine(None, [pb.Request(*r) for r in t["trace"]], spec=spec, **t["sizes"])
    scheduler(engine)
    return engine.result()


def same_admissions(mine: dict, want: dict, label: str) -> None:
    if mine != want:
        step = min(s for s in set(mine) | set(want) if mine.get(s) != want.get(s))
        raise Fail(f"{label}: at step {step} you admitted requests {mine.get(step, [])}, the rule admits "
                   f"{want.get(step, [])} (first come first served, while the batch has room and the free blocks less "
                   "those the running requests will still take cover the newcomer's whole cache)")


def batching(a, ref):
    spec = serve_spec()
    notes = [calc_cases(a.calls["kv_cache_calculator"], a.inputs["kv_cache_calculator"],
                        f"the pool of {KV_POOL_BYTES:,} bytes")]
    pool = public_trace()
    equal(a.POOL_BLOCKS, pool["sizes"]["num_blocks"], "POOL_BLOCKS", f"your calculator's num_blocks for {KV_POOL_BYTES:,} "
          f"bytes of {pb.MODEL}'s fp32 cache in blocks of {pb.BLOCK_SIZE}")
    h = a.harness if isinstance(a.harness, dict) else {}
    if h.get("missing"):
        raise Fail(f"{', '.join(h['missing'])} not defined by your definitions")
    traces, runs = a.inputs["traces"], h.get("runs")
    if not isinstance(runs, list) or len(runs) != len(traces):
        raise Fail("the grader could not run your scheduler on its traces")
    probe_ok(h.get("probe"), a.inputs["probe"])
    for t, raw in zip(traces, runs, strict=True):
        mine = replay(t, _read(RUN_LOG, raw, t["name"]), spec)
        want = by_rule(t, spec)
        same_admissions(mine["admitted"], want["admitted"], t["name"])
        if mine["steps"] > by_rule(t, spec, pb.static_batching)["steps"]:
            raise Fail(f"{t['name']}: continuous batching took {mine['steps']} steps, more than static batching")
    notes.append(f"your allocator and scheduler follow the rule on {len(traces)} traces drawn for this grading: every "
                 "step replayed on the course's engine, no block shared or leaked, every request complete")
    want_c, want_s = by_rule(pool, spec), by_rule(pool, spec, pb.static_batching)
    for label, run, want in (("cont_run", a.cont_run, want_c), ("static_run", a.static_run, want_s)):
        same_admissions(run["admitted"], want["admitted"], f"{label} on TRACE")
        for key in ("requests", "tokens", "steps", "busy_steps", "num_blocks"):
            equal(run[key], want[key], f"{label}[{key!r}]", f"what the run on TRACE with POOL_BLOCKS = "
                  f"{pool['sizes']['num_blocks']} does")
        med = _timing(run["time"], f"{label}['time']")
        close(run["tokens_per_s"], run["tokens"] / (med / 1e3), f"{label}['tokens_per_s']",
              "tokens over the median run's time", rel=1e-6)
    close(a.throughput_gain, a.cont_run["tokens_per_s"] / a.static_run["tokens_per_s"], "throughput_gain",
          "cont_run's tokens/s over static_run's", rel=1e-6)
    notes.append(ref.against("gain", a.throughput_gain, "throughput_gain", "x"))
    return notes


CHECKS = [
    Check("test_decode", decode, calls={"bytes_per_decode_step": bytes_cases}, forbid=DECODE_FORMULA,
          measures=("decode",)),
    Check("test_kv_calculator", kv_calculator, calls={"kv_cache_calculator": kv_cases}, forbid=KV_ARITHMETIC),
    Check("test_kv_growth", kv_growth, calls={"kv_cache_calculator": growth_cases}, forbid=KV_ARITHMETIC,
          measures=("growth",)),
    Check("test_batching", batching, calls={"kv_cache_calculator": pool_case}, forbid=RULE, measures=("gain",),
          harness="grader.labs.inference_serving.harness:schedules", harness_params=batching_params,
          imports=("grader.labs.inference_serving.harness",)),
    Check("test_quantization", quantization, measures=("quant",)),
]
