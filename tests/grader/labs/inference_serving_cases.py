"""Lab 03's test helpers: the source notebook's functions, contexts, answers and references built by hand,
and a GPU measurement record of a tier, for tests/grader/labs/test_inference_serving*.py.

Answers go through the lab's real schema (``judging.decode`` of JSON text, as an export line
arrives); the learner's functions run on the judges' own drawn cases; the allocator and the
scheduler run through the lab's harness in this process (the sandbox runs are in the tests that
need one).
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

from grader import labs
from grader.answers import encode
from grader.judging import Answers, Case, Context, decode
from grader.labs import sizes as lab_sizes
from grader.labs.inference_serving import harness, judges
from grader.labs.inference_serving import reference as R
from grader.measuring import Measured
from tests.nbcells import cell, src
from utils.device.hardware import spec_for_name
from utils.serving import paged_batching as pb
from utils.units import gb_per_s

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "03_inference_serving"
SOURCE = ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_decode": 4, "test_kv_calculator": 3, "test_kv_growth": 3, "test_batching": 4, "test_quantization": 2}
MEASURED = ("test_decode", "test_kv_growth", "test_batching", "test_quantization")
GPU = {"t4": ("Tesla T4", "float16", "fp16"), "h100": ("NVIDIA H100 80GB HBM3", "bfloat16", "bf16")}


def solution() -> dict:
    """The source notebook's calculator, formula, allocator and scheduler, compiled from its answer cells."""
    ns = {"math": math, "paged_batching": pb}
    nb = json.loads(SOURCE.read_text())
    exec(compile(src(cell(nb, "kv_calculator_answer")).split("\nEXAMPLES")[0], "calc", "exec"), ns)  # noqa: S102
    exec(compile(src(cell(nb, "decode_answer")).split("\n### BEGIN SOLUTION\nBYTES")[0], "bytes", "exec"), ns)  # noqa: S102
    exec(compile(src(cell(nb, "paged_answer")).split("\n\n\n### BEGIN SOLUTION")[0], "paged", "exec"), ns)  # noqa: S102
    return ns


def context(tier: str = "cpu") -> Context:
    if tier == "cpu":
        return Context(ASSIGNMENT, "cpu", lab_sizes(ASSIGNMENT, "cpu"), True, "cpu", "CPU", None, "float32")
    name, dtype, _ = GPU[tier]
    return Context(ASSIGNMENT, tier, lab_sizes(ASSIGNMENT, tier), False, "cuda", name, spec_for_name(name), dtype,
                   {"kind": "gpu", "name": name})


def timing(ms: float, spread: float = 0.01) -> dict:
    return {"median_ms": ms, "p20_ms": ms * (1 - spread), "p80_ms": ms * (1 + spread), "runs": 10, "method": "perf_counter"}


def plain(values: dict) -> dict:
    """``values`` as the grader receives them: encoded, as JSON text, read back."""
    return json.loads(json.dumps(encode(values)))


def answers(cell_id: str, values: dict, calls: dict | None = None, inputs: dict | None = None) -> Answers:
    """The cell's answers decoded by the lab's schema, with the learner's functions' results on cases."""
    a = decode(labs.load(ASSIGNMENT).answers[cell_id], {"values": plain(values), "missing": [], "errors": {}})
    a.calls, a.inputs = calls or {}, inputs or {}
    return a


def run_cases(fn, inputs: list) -> list[Case]:
    out = []
    for args in inputs:
        try:
            out.append(Case(True, plain({"v": fn(*args)})["v"]))
        except Exception as exc:  # noqa: BLE001
            out.append(Case(False, error=f"{type(exc).__name__}: {exc}"))
    return out


def with_calls(a: Answers, name: str, fn, make, ctx, seed: int = 1) -> Answers:
    inputs = make(random.Random(seed), ctx)
    a.inputs[name], a.calls[name] = inputs, run_cases(fn, inputs)
    return a


def counts(ctx) -> tuple:
    s = ctx.sizes
    return R.counts(s.model, R.half(ctx), s.prompt_len, s.new_tokens)


def reference(ctx, live: bool = True, measured: dict | None = None, speedup: float = 2.5,
              quant_modes: tuple = (), quant_why: str = "no CUDA GPU") -> R.Reference:
    return R.Reference(ctx, {**(measured or {}), "speedup": speedup}, *counts(ctx), live=live, quant_modes=quant_modes,
                       quant_why=quant_why)


def measured(rel: float = 0.5, **values: float) -> dict:
    return {k.replace("__", ":"): Measured(v, rel, "by hand") for k, v in values.items()}


# -- values of each measured cell -------------------------------------------------------------------

def decode_values(ctx, tpot: dict | None = None, copy_gbs: float = 20.0) -> dict:
    s = ctx.sizes
    bps = counts(ctx)[3]
    n = s.new_tokens
    nbytes = 8 * s.copy_numel
    copy_ms = nbytes / (copy_gbs * 1e9) * 1e3
    cp = {"gbs": gb_per_s(nbytes, copy_ms), "bytes": nbytes, "time": timing(copy_ms), "numel": s.copy_numel}
    out = {}
    for name, tp in (tpot or {"eager": 10.0, "static_compiled": 8.0, "fast": 4.0}).items():
        t1, tn = timing(12.0), timing(12.0 + tp * (n - 1))
        tp = (tn["median_ms"] - t1["median_ms"]) / (n - 1)
        bw = bps * (1e3 / tp) / 1e9
        out[name] = {"t1": t1, "tn": tn, "tpot_ms": tp, "tokens_per_s": 1e3 / tp, "bandwidth_gbs": bw,
                     "copy_fraction": bw / cp["gbs"]}
    return {"BYTES_PER_STEP": bps, "decode": out, "copy": cp, "copy_gbs": cp["gbs"]}


def growth_values(ctx, scale: float = 1.0) -> dict:
    s = ctx.sizes
    layers, kv, hd = R.kv_shape(s.model)
    per_step = 2 * layers * kv * hd * {"fp32": 4, "bf16": 2, "fp16": 2}[R.half(ctx)] * s.kv_batch
    measured_step = per_step * scale
    tokens = list(range(s.prompt_len + 1, s.prompt_len + s.kv_new_tokens + 1))
    return {"growth": {"batch": s.kv_batch, "prompt_len": s.prompt_len, "tokens": tokens,
                       "bytes": [measured_step * (t - tokens[0]) for t in tokens], "bytes_per_step": measured_step,
                       "source": "cache tensor bytes (CPU: no allocator to read)"},
            "kv_predicted_bytes_per_step": per_step, "kv_growth_error": measured_step / per_step - 1}


def quant_values(ctx, weight_bytes: dict | None = None, ppl: dict | None = None) -> dict:
    base = R.half(ctx)
    wb = weight_bytes or {base: counts(ctx)[4] + 4096}
    ppl = ppl or {m: 4000.0 + 10 * i for i, m in enumerate(wb)}
    modes = {m: {"weight_bytes": wb[m], "perplexity": ppl[m], "tokens_per_s": 16.0, "tpot_ms": 62.5, "source": "?"}
             for m in wb}
    others = [m for m in wb if m != base]
    return {"quant": {"reference": base, "skipped": None if others else "no CUDA GPU", "modes": modes},
            "memory_saving": {m: wb[base] / wb[m] for m in others},
            "perplexity_change": {m: ppl[m] / ppl[base] - 1 for m in others}}


def _dry_run(scheduler, blocks: int, ms_per_step: float = 1.0) -> dict:
    """``paged_batching.timed_runs`` on the notebook's TRACE without a model, each step taken to last ``ms_per_step``."""
    def make():
        return pb.PagedEngine(None, pb.make_trace(**R.BATCH_TRACE), num_blocks=blocks, spec=R.serve_spec())

    run = pb.timed_runs(scheduler, make, 3)
    ms = run["busy_steps"] * ms_per_step
    run["time"] = timing(ms)
    run["tokens_per_s"] = run["tokens"] / (ms / 1e3)
    return run


def batching_values(blocks: int | None = None, cont_ms: float = 1.0) -> dict:
    blocks = blocks or judges.public_trace()["sizes"]["num_blocks"]
    sol = solution()
    cont = _dry_run(lambda e: sol["continuous_batching"](e, sol["BlockAllocator"](e.num_blocks)), blocks, cont_ms)
    static = _dry_run(pb.static_batching, blocks)
    return {"POOL_BLOCKS": blocks, "cont_run": cont, "static_run": static,
            "throughput_gain": cont["tokens_per_s"] / static["tokens_per_s"]}


def run_harness(a: Answers, allocator=None, scheduler=None, ctx=None) -> Answers:
    """The lab's harness in this process on the traces ``judges.batching_params`` draws, its result as JSON."""
    sol = solution()
    ns = {"BlockAllocator": allocator or sol["BlockAllocator"], "continuous_batching": scheduler or sol["continuous_batching"]}
    params = json.loads(json.dumps(judges.batching_params(ctx or context(), a)))
    a.harness = plain({"r": harness.schedules(ns, params, None)})["r"]
    return a


# -- a GPU record -----------------------------------------------------------------------------------

def gpu_answers(tier: str = "t4") -> dict:
    """Every graded cell's answers as a run of the reference on ``tier``'s GPU would record them, plausible."""
    ctx = context(tier)
    _, _, half = GPU[tier]
    wb = counts(ctx)[4]
    cells = {"test_decode": decode_values(ctx, {"eager": 50.0, "static_compiled": 15.0, "fast": 8.0}, copy_gbs=250.0),
             "test_kv_calculator": {}, "test_kv_growth": growth_values(ctx),
             "test_batching": batching_values(cont_ms=0.8),
             "test_quantization": quant_values(ctx, {half: wb + 16384, "int8": int(wb / 1.79), "nf4": int(wb / 2.89)},
                                               {half: 32100.0, "int8": 32150.0, "nf4": 32400.0})}
    return {c: plain(v) for c, v in cells.items()}


def gpu_record(tier: str = "t4", answers: dict | None = None) -> dict:
    """A measurement record of ``tier``'s GPU, as ``checks.save_record`` writes it there."""
    from grader.names import RECORD_SCHEMA
    from utils.measure.record import utils_hash

    name, dtype, _ = GPU[tier]
    return {"schema": RECORD_SCHEMA, "assignment": ASSIGNMENT, "tier": tier, "smoke": False, "dtype": dtype,
            "fingerprint": {"kind": "gpu", "name": name, "memory_gib": 15.0 if tier == "t4" else 79.1,
                            "compute_capability": "7.5" if tier == "t4" else "9.0", "torch": "2.11.0"},
            "utils_sha256": utils_hash(), "written_unix": 0.0, "answers": answers or gpu_answers(tier), "missing": {}}
