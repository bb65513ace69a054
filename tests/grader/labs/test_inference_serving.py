"""Lab 03's judges on answers built by hand (grader/labs/inference_serving): each passes the right
answer and fails each wrong one with a message that names the rule; hidden cases drawn from the seed
catch wrong rules and fixed tables; the allocator and the scheduler through the harness and the
replay; GPU records judged for consistency. Seconds, no notebook (the sandboxes and the whole
grading are in test_inference_serving_grading.py)."""
from __future__ import annotations

import math
import random

import pytest

from grader.expect import Fail, Unusable
from grader.labs.inference_serving import judges
from grader.labs.inference_serving import reference as R
from tests.grader.labs import inference_serving_cases as C
from utils.serving import paged_batching as pb


@pytest.fixture(scope="module")
def sol():
    return C.solution()


def fails(judge, a, ref, match):
    with pytest.raises(Fail, match=match):
        judge(a, ref)


# -- test_kv_calculator -----------------------------------------------------------------------------

def calc_answers(fn, seed=1):
    return C.with_calls(C.answers("test_kv_calculator", {}), "kv_cache_calculator", fn, judges.kv_cases, C.context(),
                        seed)


def test_the_calculator_passes_on_drawn_shapes(sol):
    for seed in range(20):
        assert "right on 16 hidden shapes" in judges.kv_calculator(calc_answers(sol["kv_cache_calculator"], seed), None)[0]


def test_drawn_shapes_cover_every_dtype_default_blocks_and_partial_blocks():
    cases = [c for seed in range(10) for c in judges.kv_cases(random.Random(seed), None)]
    assert {c[3] for c in cases} == set(judges.DTYPES)
    assert any(len(c) == 7 for c in cases) and {c[7] for c in cases if len(c) == 8} >= {16, 32, 128}
    assert any(len(c) == 8 and c[5] % c[7] for c in cases) and any(c[6] == 0.0 for c in cases)
    assert judges.kv_cases(random.Random(1), None) != judges.kv_cases(random.Random(2), None)


def test_wrong_calculators_fail(sol):
    calc = sol["kv_cache_calculator"]

    def per_query_head(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size=16):
        return calc(layers, kv_heads * 4, head_dim, dtype, batch, context, gib, block_size)

    def token_concurrency(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size=16):
        r = dict(calc(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size))
        r["max_concurrency"] = r["num_blocks"] * block_size / context  # vLLM's old formula
        return r

    def fp8_in_two_bytes(layers, kv_heads, head_dim, dtype, *rest):
        return calc(layers, kv_heads, head_dim, "fp16" if dtype == "fp8" else dtype, *rest)

    def partial_blocks(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size=16):
        r = dict(calc(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size))
        r["max_concurrency"] = r["num_blocks"] / (context / block_size)  # a request's last block counted in part
        return r

    for wrong, match in ((per_query_head, "'bytes_per_token'"), (token_concurrency, "'max_concurrency'"),
                         (fp8_in_two_bytes, "'bytes_per_token'"), (lambda *a: 1 / 0, "it raised ZeroDivisionError"),
                         (lambda *a: [1, 2], "not a dict")):
        fails(judges.kv_calculator, calc_answers(wrong), None, f"disagreed with vLLM's arithmetic.*{match}")
    hits = 0
    for seed in range(30):  # needs a context off a block boundary with memory for a block: most draws have one
        try:
            judges.kv_calculator(calc_answers(partial_blocks, seed), None)
        except Fail:
            hits += 1
    assert hits >= 25


def test_a_table_of_answers_for_fixed_inputs_fails(sol):
    """Answers looked up by their inputs, for the cases of one seed: the grading run's seed is another."""
    table = {repr(c): sol["kv_cache_calculator"](*c) for c in judges.kv_cases(random.Random(7), None)}

    def lookup(*args):
        return table.get(repr(list(args)), {"bytes_per_token": 0, "cache_bytes": 0, "num_blocks": 0, "max_concurrency": 0.0})

    judges.kv_calculator(calc_answers(lookup, 7), None)
    fails(judges.kv_calculator, calc_answers(lookup, 8), None, "16 of 16 wrong")


def test_the_messages_never_name_a_hidden_shape(sol):
    a = calc_answers(lambda *args: sol["kv_cache_calculator"](*args[:4], args[4] + 1, *args[5:]))
    with pytest.raises(Fail) as exc:
        judges.kv_calculator(a, None)
    for args in a.inputs["kv_cache_calculator"]:
        assert repr(args) not in str(exc.value) and f"{args[5]}" not in str(exc.value).split("got")[0].split("(")[-1]


# -- test_decode ------------------------------------------------------------------------------------

def decode_case(sol, ctx=None, values=None, fn=None, ref=None, **edits):
    ctx = ctx or C.context()
    v = values or C.decode_values(ctx)
    for k, val in edits.items():
        v[k] = val
    a = C.with_calls(C.answers("test_decode", v), "bytes_per_decode_step", fn or sol["bytes_per_decode_step"],
                     judges.bytes_cases, ctx)
    return a, ref or C.reference(ctx, measured=C.measured(tpot__eager=10.0, tpot__static_compiled=8.0, tpot__fast=4.0,
                                                            copy=20.0))


def test_decode_passes_and_compares_with_the_graders_runs(sol):
    notes = judges.decode(*decode_case(sol))
    assert notes[0] == "bytes_per_decode_step: right on all 12 hidden cases"
    assert any("decode['fast']['tpot_ms']: grader 4 ms" in n for n in notes) and "2.5x eager" in notes[-1]


def test_decode_rules(sol):
    ctx = C.context()
    fails(judges.decode, *decode_case(sol, fn=lambda w, kv, b, c: w + c * kv), "bytes_per_decode_step disagreed")
    fails(judges.decode, *decode_case(sol, BYTES_PER_STEP=C.counts(ctx)[3] + C.counts(ctx)[1]), "BYTES_PER_STEP")
    for path, key, factor, match in (("fast", "tpot_ms", 1.1, r"\(tn - t1\)"), ("eager", "tokens_per_s", 2, "1000 / TPOT"),
                                     ("static_compiled", "bandwidth_gbs", 2, "BYTES_PER_STEP x tokens/s"),
                                     ("fast", "copy_fraction", 2, "bandwidth over copy_gbs")):
        v = C.decode_values(ctx)
        v["decode"][path][key] *= factor
        fails(judges.decode, *decode_case(sol, values=v), match)
    v = C.decode_values(ctx)
    v["copy"]["gbs"] *= 3
    fails(judges.decode, *decode_case(sol, values=v), r"copy\['gbs'\]")
    v = C.decode_values(ctx)
    v["decode"]["eager"]["t1"]["p20_ms"] = 99.0
    fails(judges.decode, *decode_case(sol, values=v), "not a timing from utils.measure.timing.benchmark")
    # numbers made up consistently, twenty times faster than the grader's runs
    fast = C.decode_values(ctx, {"eager": 0.5, "static_compiled": 0.4, "fast": 0.2})
    fails(judges.decode, *decode_case(sol, values=fast), r"decode\['eager'\]\['tpot_ms'\] = .* but the grader measured")
    with pytest.raises(Unusable, match="below the 0.5x"):
        a, ref = decode_case(sol)
        ref.measured["speedup"] = 0.3
        judges.decode(a, ref)


def test_decode_from_a_gpu_record(sol):
    ctx = C.context("t4")
    ok = C.decode_values(ctx, {"eager": 50.0, "static_compiled": 15.0, "fast": 8.0}, copy_gbs=250.0)
    notes = judges.decode(*decode_case(sol, ctx, ok, ref=C.reference(ctx, live=False)))
    assert "as recorded (not re-measured)" in notes[-1]
    impossible = C.decode_values(ctx, {"eager": 50.0, "static_compiled": 15.0, "fast": 2.0}, copy_gbs=250.0)
    fails(judges.decode, *decode_case(sol, ctx, impossible, ref=C.reference(ctx, live=False)),
          "above the T4 datasheet bandwidth")
    slow = C.decode_values(ctx, {"eager": 50.0, "static_compiled": 40.0, "fast": 30.0}, copy_gbs=250.0)
    fails(judges.decode, *decode_case(sol, ctx, slow, ref=C.reference(ctx, live=False)), "below the 2.0x")


# -- test_kv_growth ---------------------------------------------------------------------------------

def growth_case(sol, ctx=None, values=None, fn=None, ref=None):
    ctx = ctx or C.context()
    a = C.with_calls(C.answers("test_kv_growth", values or C.growth_values(ctx)), "kv_cache_calculator",
                     fn or sol["kv_cache_calculator"], judges.growth_cases, ctx)
    return a, ref or C.reference(ctx, measured={"growth": R.Measured(2048.0, R.KV_BAND, "read")})


def test_kv_growth(sol):
    notes = judges.kv_growth(*growth_case(sol))
    assert notes[0] == "kv_cache_calculator: right on llama-tiny's shape in fp32"
    assert "grader 2048 bytes, yours 2048 bytes" in notes[1]
    ctx = C.context()
    v = C.growth_values(ctx)
    v["kv_predicted_bytes_per_step"] /= 2  # one sequence, not SIZES.kv_batch
    fails(judges.kv_growth, *growth_case(sol, values=v), "kv_predicted_bytes_per_step")
    v = C.growth_values(ctx)
    v["kv_growth_error"] = 0.01
    fails(judges.kv_growth, *growth_case(sol, values=v), "measured / predicted - 1")
    v = C.growth_values(ctx)
    v["growth"]["batch"] = 1
    fails(judges.kv_growth, *growth_case(sol, values=v), "SIZES.kv_batch")
    fails(judges.kv_growth, *growth_case(sol, values=C.growth_values(ctx, 1.05)), "more than 2% apart")
    fails(judges.kv_growth, *growth_case(sol, ref=C.reference(ctx, measured={"growth": R.Measured(2200.0, 0.02, "r")})),
          "but the grader measured 2200")
    calc = sol["kv_cache_calculator"]
    fails(judges.kv_growth, *growth_case(sol, fn=lambda L, h, d, dt, *r: calc(L, h, d, "bf16", *r)),
          "disagreed with vLLM's arithmetic on llama-tiny's shape")


def test_kv_growth_from_a_gpu_record_uses_the_records_tier(sol):
    ctx = C.context("h100")
    notes = judges.kv_growth(*growth_case(sol, ctx, ref=C.reference(ctx, live=False)))
    assert notes[0] == "kv_cache_calculator: right on llama-1.1b's shape in bf16" and "as recorded" in notes[-1]


# -- test_quantization ------------------------------------------------------------------------------

def quant_ref(ctx, values, live=True, quant_modes=(), **scale):
    q = values["quant"]["modes"]
    ms = {}
    for m, d in q.items():
        ms[f"quant:weights:{m}"] = R.Measured(d["weight_bytes"] * scale.get("weights", 1.0), R.MEMORY_BAND, "read")
        ms[f"quant:ppl:{m}"] = R.Measured(d["perplexity"] * scale.get("ppl", 1.0), R.PPL_BAND, "same")
    return C.reference(ctx, live=live, measured=ms, quant_modes=quant_modes)


def test_quantization_on_a_cpu():
    ctx = C.context()
    v = C.quant_values(ctx)
    notes = judges.quantization(C.answers("test_quantization", v), quant_ref(ctx, v))
    assert "int8 and nf4 not measured here" in notes[-1]
    fails(judges.quantization, C.answers("test_quantization", v), quant_ref(ctx, v, weights=1.1), "but the grader measured")
    fails(judges.quantization, C.answers("test_quantization", v), quant_ref(ctx, v, ppl=1.1), "perplexity")
    wrong = C.quant_values(ctx)
    wrong["quant"]["reference"] = "bf16"
    fails(judges.quantization, C.answers("test_quantization", wrong), quant_ref(ctx, v), r"quant\['reference'\]")
    gpu_like = C.quant_values(ctx, {"fp32": 5_700_000, "nf4": 2_000_000})
    fails(judges.quantization, C.answers("test_quantization", gpu_like), quant_ref(ctx, gpu_like),
          "the modes this machine measures: none")


def test_quantization_on_a_gpu_and_from_its_record():
    ctx = C.context("t4")
    wb = C.counts(ctx)[4]
    ok = C.quant_values(ctx, {"fp16": wb, "int8": int(wb / 1.79), "nf4": int(wb / 2.89)})
    judges.quantization(C.answers("test_quantization", ok), quant_ref(ctx, ok, quant_modes=("int8", "nf4")))
    fails(judges.quantization, C.answers("test_quantization", ok), quant_ref(ctx, ok, quant_modes=("nf4",)),
          "the modes this machine measures: nf4")
    assert "as recorded" in judges.quantization(C.answers("test_quantization", ok), quant_ref(ctx, ok, live=False))[0]
    for edit, match in ((lambda v: v["memory_saving"].update(int8=2.0), r"memory_saving\['int8'\]"),
                        (lambda v: v["perplexity_change"].update(nf4=0.0), r"perplexity_change\['nf4'\]"),
                        (lambda v: v["memory_saving"].pop("nf4"), "one entry per quantized mode")):
        v = C.quant_values(ctx, {"fp16": wb, "int8": int(wb / 1.79), "nf4": int(wb / 2.89)})
        edit(v)
        fails(judges.quantization, C.answers("test_quantization", v), quant_ref(ctx, v, live=False), match)
    half_size = C.quant_values(ctx, {"fp16": wb // 2, "int8": int(wb / 2 / 1.79), "nf4": int(wb / 2 / 2.89)})
    fails(judges.quantization, C.answers("test_quantization", half_size), quant_ref(ctx, half_size, live=False),
          "parameters take")
    weak = C.quant_values(ctx, {"fp16": wb, "int8": int(wb / 1.79), "nf4": int(wb / 1.5)})
    fails(judges.quantization, C.answers("test_quantization", weak), quant_ref(ctx, weak, live=False), "below the 2.5x")


# -- test_batching ----------------------------------------------------------------------------------

def batching_case(sol, allocator=None, scheduler=None, values=None, calc=None, gain=None):
    v = values or C.batching_values()
    a = C.with_calls(C.answers("test_batching", v), "kv_cache_calculator", calc or sol["kv_cache_calculator"],
                     judges.pool_case, C.context())
    C.run_harness(a, allocator, scheduler)
    want = v["throughput_gain"] if gain is None else gain
    return a, C.reference(C.context(), measured={"gain": R.Measured(want, 0.5, "by hand")})


def test_the_reference_allocator_and_scheduler_pass(sol):
    for _ in range(5):  # fresh traces each time
        notes = judges.batching(*batching_case(sol))
        assert "follow the rule on 10 traces" in notes[1] and notes[-1].startswith("throughput_gain: grader")


class _Base:
    def __init__(self, n):
        self.ids = list(range(n))

    def num_free(self):
        return len(self.ids)

    def free(self, blocks):
        self.ids.extend(blocks)

    def allocate(self):
        if not self.ids:
            raise MemoryError("none")
        return self.ids.pop()


class SameBlock(_Base):  # hands out the lowest id without taking it off the list
    def allocate(self):
        return self.ids[0]


class NoneWhenEmpty(_Base):  # a silent None instead of a refusal
    def allocate(self):
        return self.ids.pop() if self.ids else None


class ForgetsFreed(_Base):  # free() does not put blocks back
    def free(self, blocks):
        pass


class CountsWrong(_Base):  # num_free counts what was ever there
    def __init__(self, n):
        super().__init__(n)
        self.n = n

    def num_free(self):
        return self.n


@pytest.mark.parametrize("alloc, match", [
    (SameBlock, "different int blocks"), (NoneWhenEmpty, "must raise"), (ForgetsFreed, r"allocate\(\) after free\(\) of 2 blocks raised MemoryError"),
    (CountsWrong, r"num_free\(\) = \d+, expected|must raise|num_free\(\) must be"),
])
def test_wrong_allocators_fail(sol, alloc, match):
    fails(judges.batching, *batching_case(sol, allocator=alloc), match)


def scheduler(*, reserve=False, leak=False, owed=True, static=False, skip=False, block_size=None, batch_cap=True,
              free_late=False):
    """The rule with one mistake switched on."""
    def run(engine, allocator):
        bs = block_size or engine.block_size

        def whole(r):
            return math.ceil((r.prompt_len + r.output_len - 1) / bs)

        waiting = sorted(engine.trace, key=lambda r: (r.arrival_step, r.rid))
        running, tables, late = {}, {}, []
        while waiting or running:
            debt = sum(whole(r) - len(tables[rid]) for rid, r in running.items()) if owed else 0
            if not (static and running):
                i = 0
                while i < len(waiting) and waiting[i].arrival_step <= engine.now and (
                        len(running) < engine.max_batch or not batch_cap):
                    r = waiting[i]
                    need = whole(r) if owed else math.ceil(r.prompt_len / bs)
                    if allocator.num_free() + len(late) - debt < need:
                        if skip:
                            i += 1
                            continue
                        break
                    waiting.pop(i)
                    running[r.rid], tables[r.rid] = r, []
                    debt += whole(r) if owed else 0
            if not running:
                engine.wait()
                continue
            for rid, r in running.items():
                want = whole(r) if reserve else math.ceil((r.prompt_len + engine.generated[rid]) / bs)
                while len(tables[rid]) < want:
                    if late and free_late:
                        allocator.free(late)
                        late = []
                    tables[rid].append(allocator.allocate())
            for rid in engine.step({rid: tables[rid] for rid in running}):
                blocks = tables.pop(rid)
                if free_late:
                    late += blocks
                elif not leak:
                    allocator.free(blocks)
                del running[rid]
    return run


@pytest.mark.parametrize("mistake, match", [
    ({"reserve": True}, r"holds \d+ blocks; after this step it caches"),
    ({"leak": True}, "finished holding blocks|does not finish"),
    ({"free_late": True}, "finished holding blocks"),
    ({"owed": False}, "leaves too few blocks|you admitted|ran out|MemoryError"),
    ({"static": True}, "you admitted requests"),
    ({"skip": True}, "you admitted requests"),
    ({"block_size": 4}, r"holds \d+ blocks|you admitted|does not finish"),
    ({"batch_cap": False}, "more than max_batch"),
])
def test_wrong_schedulers_fail_on_the_drawn_traces(sol, mistake, match):
    """Each mistake on traces the notebook does not show (its own may not exercise it: a block size of 4 is right there)."""
    fails(judges.batching, *batching_case(sol, scheduler=scheduler(**mistake)), match)


def test_the_rule_written_another_way_passes(sol):
    judges.batching(*batching_case(sol, scheduler=scheduler()))


def test_a_scheduler_right_on_the_notebooks_trace_only_fails(sol):
    """The rule where the notebook shows its trace and pool, static batching anywhere else: the drawn traces catch it."""
    notebook = [tuple(r) for r in pb.make_trace(**R.BATCH_TRACE)]

    def special(engine, allocator):
        if [tuple(r) for r in engine.trace] == notebook and engine.num_blocks == 32:
            return sol["continuous_batching"](engine, allocator)
        return pb.static_batching(engine)

    a, ref = batching_case(sol, scheduler=special)
    with pytest.raises(Fail, match="(drawn trace|one-token|late arrival|one request|block boundary|more arrivals)") as exc:
        judges.batching(a, ref)
    assert "the notebook's TRACE" not in str(exc.value)


@pytest.mark.parametrize("edit, match", [
    (lambda v: v.update(POOL_BLOCKS=v["POOL_BLOCKS"] * 2), "POOL_BLOCKS"),
    (lambda v: v.update(cont_run=v["static_run"]), "cont_run on TRACE"),
    (lambda v: v.update(throughput_gain=1 / v["throughput_gain"]), "throughput_gain"),
    (lambda v: v["cont_run"].update(tokens_per_s=3 * v["cont_run"]["tokens_per_s"]), r"cont_run\['tokens_per_s'\]"),
    (lambda v: v["static_run"].update(busy_steps=v["static_run"]["busy_steps"] - 1), r"static_run\['busy_steps'\]"),
])
def test_numbers_that_do_not_follow_from_the_runs_fail(sol, edit, match):
    v = C.batching_values()
    edit(v)
    fails(judges.batching, *batching_case(sol, values=v), match)


def test_a_made_up_gain_fails_and_a_calculator_off_the_pool_fails(sol):
    v = C.batching_values(cont_ms=1 / 20)  # runs consistent with themselves, twenty times the gain
    fails(judges.batching, *batching_case(sol, values=v, gain=C.batching_values()["throughput_gain"]),
          "throughput_gain = .* but the grader measured")
    calc = sol["kv_cache_calculator"]
    fails(judges.batching, *batching_case(sol, calc=lambda *a: {**calc(*a), "num_blocks": 7}), "the pool of 132,000 bytes")


def test_gpu_record_answers_pass_every_judge_from_the_record(sol):
    """The record the end-to-end test submits: consistent for the T4 tier, judged without measuring."""
    rec = C.gpu_record("t4")
    ctx = C.context("t4")
    ref = C.reference(ctx, live=False)
    for cell_id, judge in (("test_decode", judges.decode), ("test_kv_growth", judges.kv_growth),
                           ("test_batching", judges.batching), ("test_quantization", judges.quantization)):
        a = C.answers(cell_id, rec["answers"][cell_id])
        for name, make in {c.cell: c.calls for c in judges.CHECKS}[cell_id].items():
            fn = sol[name]
            C.with_calls(a, name, fn, make, ctx)
        if cell_id == "test_batching":
            C.run_harness(a, ctx=ctx)
        judge(a, ref)
