"""Lab 03's references: the grader's own measurements on this machine, or a learner's record.

:func:`measure` (live) runs, in the grader's process after the notebook's kernel has gone, the work
the notebook's locked cells set up, on models the grader builds itself: the lab's model and its
three decode paths (``utils.serving.decode``), each path's TPOT timed several times, the copy bandwidth,
the KV cache's growth while decoding, the weight memory and perplexity of every mode
``utils.model.quantize`` can load here (bitsandbytes' int8 and nf4 only on a CUDA GPU: on a CPU the
reference dtype alone), and continuous against static batching on the serving exercise's model,
trace and pool (the rule's schedule, which the judge requires the learner's to be). A band comes
from the spread of the grader's own runs alone (:func:`grader.expect.band`); what is read rather
than timed (bytes of a cache or of weights) has a fixed band. :func:`from_record` (provisional)
measures nothing: its comparisons say so, and only the datasheet and the record's own consistency
are checked. Both hold the counts that follow from the lab's shapes (bytes per decode step,
parameter bytes), computed from the model's shipped config.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import io
import statistics
from typing import Any

import torch

from grader import expect
from grader.measuring import Measured, timed
from utils.kv import kvcache
from utils.kv.kvcache import KVSpec, from_hf_config
from utils.model import quantize
from utils.model.models import (
    build_model,
    checkpoint_dir,
    choice_tokenizer,
    load_model,
    model_tokenizer,
    preset_config_dict,
    token_batches,
)
from utils.serving import decode, inference
from utils.serving import paged_batching as pb
from utils.train.training import bitsandbytes_usable
from utils.units import gb_per_s

KV_BAND = 0.02  # measured KV growth within 2% of the calculator (a CUDA allocator reads it exactly)
MEMORY_BAND = 0.03  # weights loaded twice take the same bytes, up to allocator rounding
PPL_BAND = 0.02  # the same weights on the same text: the same perplexity, up to kernels' summation order
MIN_SAVING = {"int8": 1.6, "nf4": 2.5}  # llama-1.1b, estimates from the bits per weight (utils/model/quantize.py): 1.79x, 2.89x
KV_POOL_BYTES = 132_000  # the notebook's paged_setup cell: 32 blocks of 4 tokens of llama-tiny in fp32
BATCH_TRACE = {"n_requests": 12, "seed": 4}  # the notebook's TRACE (paged_batching.make_trace)
HALF_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
DECODE_REPEATS = 3  # measure_decode runs per path: the band is 3x their spread (and each run's own)
DECODE_BUDGET_S = {True: 0.5, False: 2.0}  # per benchmark, smoke mode and GPU (the notebook's is 3 s, once)
GAIN_RUNS = 3  # timed runs of each scheduler on the serving model, as the notebook's
_HELD: dict = {}  # models and paths the grader built, kept for the retries of this grading (not measurements)


def half(ctx) -> str:
    """The lab's model dtype on ``ctx`` (``quantize.reference_mode``): fp32 on a CPU, else its 16-bit type."""
    return HALF_NAMES.get(ctx.dtype, ctx.dtype)


@functools.cache
def kv_shape(preset: str) -> tuple[int, int, int]:
    """``(layers, KV heads, head dim)`` of a ``utils.model.models`` preset, from its shipped config."""
    spec = from_hf_config(preset_config_dict(preset))
    return spec.num_layers, spec.num_kv_heads, spec.head_dim


@functools.cache
def serve_spec() -> KVSpec:
    """The serving exercise's KV geometry: ``paged_batching.MODEL`` with an fp32 cache."""
    return from_hf_config(preset_config_dict(pb.MODEL), kv_dtype="fp32")


def rule_schedule(engine) -> None:
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


@dataclasses.dataclass
class Reference:
    """What the judges compare against. ``measured``: quantity -> :class:`Measured` (empty from a
    record). The counts: the lab's model's weight bytes read per decode step, KV bytes per token,
    mean context, bytes per step and parameter bytes, from its shipped config in the tier's dtype.
    ``quant_modes``: the quantized modes this machine measures, and why not others (None from a
    record).

    Live, a measurement is taken when a judge first compares with it (``take``): a cell whose
    answers break a rule before any comparison (a schedule the engine refuses, a rate that does not
    follow from its timing) costs no measurement, on the first try nor on the tries after a miss
    (``grader/judging.py``). Its bands are the same either way."""

    ctx: Any
    measured: dict
    weight_bytes_read: int
    kv_bytes_per_token: int
    context_len: float
    bytes_per_step: float
    meta_weight_bytes: int
    live: bool = True
    quant_modes: tuple | None = None
    quant_why: str = ""
    take: Any = None  # live: group -> None, measures that group into ``measured``

    def value(self, key: str) -> Any:
        """The grader's measurement ``key``, measured now if this try has not yet."""
        if key not in self.measured and self.take is not None:
            self.take(group(key))
        return self.measured[key]

    def against(self, key: str, value: float, name: str, unit: str) -> str:
        """The learner's ``value`` against the grader's measurement ``key``; from a record, a note."""
        if not self.live:
            return f"{name}: {value:.6g} {unit} as recorded (not re-measured)"
        return self.value(key).against(value, name, unit)

    def fast_speedup(self) -> str:
        """The grader's fast path at least the tier's speedup over eager ``generate`` (both paths are
        ``utils.serving.decode``'s: below it, the machine is at fault, never the learner)."""
        need = self.ctx.sizes.min_fast_speedup
        v = expect.usable(self.value("speedup"), "fast-path speedup over eager generate", "x")
        if v < need:
            raise expect.Unusable(f"the grader measured the fast path at {v:.3g}x eager generate, below the {need}x this "
                                  "device tier expects")
        return f"the grader's fast path: {v:.3g}x eager generate (at least {need}x on this tier)"


def group(key: str) -> str:
    """The measurement that gives ``key``: ``decode`` (each path's TPOT, the copy, the speedup), ``growth``,
    ``quant`` (each mode's weights and perplexity) or ``gain``."""
    head = key.split(":")[0]
    return {"tpot": "decode", "copy": "decode", "speedup": "decode"}.get(head, head)


@functools.cache
def counts(model: str, dtype: str, prompt_len: int, new_tokens: int) -> tuple:
    """``(weight bytes read per step, KV bytes per token, mean context, bytes per step, parameter
    bytes)`` of ``model`` in ``dtype``, from its shipped config (a meta model: shapes only)."""
    meta = build_model(model, dtype=dtype, device="meta")
    wbr = inference.weight_bytes_read_per_step(meta)
    kvt = kvcache.bytes_per_token(inference.kv_spec(meta))
    ctx_len = inference.mean_context_len(prompt_len, new_tokens)
    return wbr, kvt, ctx_len, inference.decode_bytes_per_step(wbr, kvt, 1, ctx_len), inference.weight_bytes(meta)


def _reference(ctx, measured: dict, live: bool) -> Reference:
    s = ctx.sizes
    return Reference(ctx, measured, *counts(s.model, half(ctx), s.prompt_len, s.new_tokens), live=live)


def _quietly(fn, *args, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def _lab_model(ctx) -> tuple:
    """The locked model_setup cell's model and prompts, built here: ``(model, PROMPTS)``."""
    s, key = ctx.sizes, ("model", ctx.sizes.model, half(ctx), ctx.device)
    if key not in _HELD:
        torch.manual_seed(0)
        model = _quietly(load_model, s.model, dtype=half(ctx), device=ctx.device).eval()
        prompts = next(token_batches(model_tokenizer(model), None, max(s.batches), max(s.ttft_lens), device=ctx.device,
                                     vocab_size=model.config.vocab_size))[0]
        _HELD[key] = (model, prompts)
    return _HELD[key]


def _paths(ctx) -> dict:
    """The locked cells' three decode paths on the lab's model, warmed up (compiled on a GPU) once."""
    key = ("paths", ctx.sizes.model, half(ctx), ctx.device)
    if key not in _HELD:
        model, prompts = _lab_model(ctx)
        n = ctx.sizes.new_tokens
        paths = decode.decode_paths(model, prompts[:1, :ctx.sizes.prompt_len], n, warmup=False)
        for p in paths.values():
            decode.warm(p, n)
        _HELD[key] = paths
    return _HELD[key]


def _difference_spread(tn, t1) -> float:
    """Relative spread of ``tn.median - t1.median``: both p20-p80 widths over the difference."""
    diff = tn.median_ms - t1.median_ms
    return (tn.p80_ms - tn.p20_ms + t1.p80_ms - t1.p20_ms) / diff if diff > 0 else float("inf")


def _decode(ctx, slowdown: float, out: dict) -> None:
    s, smoke = ctx.sizes, ctx.smoke
    paths = _paths(ctx)
    tps = {}
    for name, path in paths.items():
        runs = []
        for _ in range(DECODE_REPEATS):
            try:
                runs.append(inference.measure_decode(path, s.new_tokens, budget_s=DECODE_BUDGET_S[smoke]))
            except RuntimeError as exc:  # t(1) never below t(n): the machine, not the learner
                raise expect.Unusable(f"the grader's own {name} decode could not be timed ({exc})") from None
        tpots = [r["tpot_ms"] for r in runs]
        rel = expect.band([expect.spread(tpots), *(_difference_spread(r["tn"], r["t1"]) for r in runs)], smoke, slowdown)
        why = f"the grader's {len(runs)} runs spread {100 * expect.spread(tpots):.0f}%" + (
            f", widened x{slowdown:.2g} for load" if slowdown > 1 else "")
        out[f"tpot:{name}"] = Measured(statistics.median(tpots), rel, why)
        tps[name] = 1e3 / statistics.median(tpots)
    out["speedup"] = tps["fast"] / tps["eager"]  # a ratio of the medians above: no band of its own
    src = torch.randn(s.copy_numel, device=ctx.device)
    dst = torch.empty_like(src)
    med, rel, why = timed(dst.copy_, src, slowdown=slowdown, smoke=smoke)
    out["copy"] = Measured(gb_per_s(8 * s.copy_numel, med), rel, why)


def _growth(ctx, out: dict) -> None:
    s = ctx.sizes
    model, prompts = _lab_model(ctx)
    g = inference.measure_kv_growth(model, prompts[:s.kv_batch, :s.prompt_len], s.kv_new_tokens)
    out["growth"] = Measured(g["bytes_per_step"], KV_BAND, f"read from {g['source']}, not timed")


def _quant(ctx, out: dict) -> None:
    """Every mode ``quantize.compare`` measures here, loaded again: weight bytes and perplexity."""
    s, dev = ctx.sizes, ctx.device
    base = quantize.reference_mode(dev)
    modes, _ = _quant_modes(ctx)
    _, choice = _quietly(checkpoint_dir, s.model)
    ids = quantize.held_out_ids(tokenizer=choice_tokenizer(choice))
    for mode in (base, *modes):
        model, info = _quietly(quantize.measure_weights, s.model, mode, dev)
        ppl = quantize.perplexity(model, ids[s.prompt_len:], s.ppl_seq_len, s.ppl_blocks)
        out[f"quant:weights:{mode}"] = Measured(info["weight_bytes"], MEMORY_BAND, f"read from {info['source']}")
        out[f"quant:ppl:{mode}"] = Measured(ppl, PPL_BAND, "the same weights on the same text")
        del model
        gc.collect()
        if dev == "cuda":
            torch.cuda.empty_cache()


def _gain(ctx, slowdown: float, out: dict) -> None:
    """Continuous (the rule's schedule) over static batching on the locked cells' model, trace and pool."""
    key = ("serve", ctx.device)
    if key not in _HELD:
        torch.manual_seed(0)
        _HELD[key] = build_model(pb.MODEL, device=ctx.device).eval()
    model, trace = _HELD[key], pb.make_trace(**BATCH_TRACE)
    blocks = pb.pool_blocks(model, KV_POOL_BYTES)

    def make():
        return pb.PagedEngine(model, trace, num_blocks=blocks)

    pb.timed_runs(rule_schedule, make, 1)  # the model's first-call costs, left out
    runs = {name: pb.timed_runs(scheduler, make, GAIN_RUNS)
            for name, scheduler in (("continuous", rule_schedule), ("static", pb.static_batching))}
    c, st = runs["continuous"], runs["static"]
    spread = expect.spread(c["time"].times_ms) + expect.spread(st["time"].times_ms)
    rel = expect.band([spread], ctx.smoke, slowdown)
    why = f"the grader's {GAIN_RUNS} runs of each spread {100 * spread:.0f}% together" + (
        f", widened x{slowdown:.2g} for load" if slowdown > 1 else "")
    out["gain"] = Measured(expect.usable(c["tokens_per_s"], "continuous tokens/s", "tokens/s")
                           / expect.usable(st["tokens_per_s"], "static tokens/s", "tokens/s"), rel, why)


def _quant_modes(ctx) -> tuple[tuple, str]:
    """The quantized modes ``quantize.compare`` measures here, and why not the others ("" when it runs them)."""
    ok, why = bitsandbytes_usable()
    if ok and ctx.device != "cuda":
        ok, why = False, "smoke mode runs on the CPU, and bitsandbytes' 8-bit and 4-bit layers on a CUDA GPU"
    return (tuple(quantize.usable_modes(ctx.device)), "") if ok else ((), why)


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's measurements that ``needs`` names, taken on this machine when a judge first
    compares with them (``cache``: those already taken by this try, shared between cells)."""

    def take(name: str) -> None:
        if name not in needs:
            raise KeyError(f"{name} is not among this cell's measurements ({', '.join(sorted(needs))})")
        if f"done:{name}" not in cache:
            {"decode": lambda: _decode(ctx, slowdown, cache), "growth": lambda: _growth(ctx, cache),
             "quant": lambda: _quant(ctx, cache), "gain": lambda: _gain(ctx, slowdown, cache)}[name]()
            cache[f"done:{name}"] = True

    ref = _reference(ctx, cache, live=True)
    ref.take = take
    if "quant" in needs:
        ref.quant_modes, ref.quant_why = _quant_modes(ctx)
    return ref


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own: the counts of the record's tier and
    dtype, and the record's card (its datasheet row, in ``ctx.spec``) to check against (provisional)."""
    return _reference(ctx, {}, live=False)
