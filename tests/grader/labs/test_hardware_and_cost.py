"""Lab 05's judges (grader/labs/hardware_and_cost/judges.py), pure: each passes the right answers and
fails each wrong one with a message that names the mistake; the hidden cases come from the seed, and
a wrong rule, or a table of answers for fixed inputs, fails them without the message naming an input.

The answers are built as the notebook's export sends them (tests/grader/labs/hardware_and_cost_answers.py),
for the smoke sizes and for a T4; a Reference stands for the grader's measurement. The learner's
functions are run here in this process on the drawn cases (the sandbox's part, minus the sandbox: that
is tests/grader/labs/test_hardware_and_cost_sandbox.py); the sharded matmul on this process's JAX CPU
devices. Graded through the real commands: tests/grader/labs/test_hardware_and_cost_grading.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import re

import numpy as np
import pytest

from grader.answers import encode
from grader.expect import Fail
from grader.judging import Answers, Case, cell_seed, plain
from grader.labs.hardware_and_cost import harness, judges, reference, rules
from grader.labs.hardware_and_cost.answers import ANSWERS
from grader.sandbox import _build
from grader.schema import loads
from tests.grader.labs import hardware_and_cost_answers as made
from utils.capacity import cost
from utils.device import topology
from utils.tpu import (
    tpu_pod,
    xla,  # noqa: F401  (asks XLA for 8 CPU devices before anything starts JAX)
)

CPU, T4 = made.cpu_context(), made.gpu_context()
JUDGE = {c.cell: c for c in judges.CHECKS}


def decoded(cell: str, values: dict) -> dict:
    specs = ANSWERS[cell]
    return {name: specs[name].spec.decode(loads(json.dumps(encode(v))), name) for name, v in values.items()}


def judge(cell: str, values: dict, ref=None, ctx=CPU, **extra):
    return JUDGE[cell].judge(Answers(decoded(cell, values), **extra), ref or made.ref(ctx))


def answers(ctx=CPU, rates=None) -> dict:
    return made.answers(ctx, rates or (made.CPU_RATES if ctx is CPU else made.T4_RATES))


# -- the learner's functions on the drawn cases, in this process ----------------------------------------

def run_calls(cell: str, impls: dict, seed: int = 11, ctx=CPU) -> Answers:
    """The check's hidden cases drawn from ``seed``, each function of ``impls`` called on them as the
    sandbox calls it (arguments built, results encoded and decoded as JSON)."""
    a = Answers({})
    for name, make in JUDGE[cell].calls.items():
        cases = make(cell_seed(seed, cell, name), ctx)
        a.inputs[name] = cases
        results = []
        for args in cases:
            try:
                results.append(Case(True, plain(loads(json.dumps(encode(impls[name](*_build(args))))))))
            except Exception as exc:
                results.append(Case(False, error=f"{type(exc).__name__}: {exc}"))
        a.calls[name] = results
    return a


def attainable_speedup(intensity, from_spec, to_spec, dtype="bf16"):
    def roof(spec):
        return min(spec.peak_tflops(dtype), intensity * spec.bandwidth_gbs / 1e3)
    return roof(to_spec) / roof(from_spec)


def spot_expected_cost_usd(work_h, usd_per_hour, tau, delta, restart, lam):
    useful = 1 - lam * (tau / 2 + restart)
    if useful <= 0:
        return math.inf
    return work_h * (1 + delta / tau) / useful * usd_per_hour


def estimate(measured, nbytes, mine, other):
    return max(measured - nbytes / (mine * 1e9) * 1e3, 0.0) + nbytes / (other * 1e9) * 1e3


def bucket_length(n, buckets):
    fits = [b for b in buckets if b >= n]
    if not fits:
        raise ValueError(f"no bucket holds length {n}")
    return min(fits)


def slowest_gpu_link(topo):
    return min((topo.link(a, b) for a in topo.gpus for b in topo.gpus if a != b), key=topology.path_rank)


def per_device_bytes(shape, itemsize, mesh_shape, spec):
    total = itemsize
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        total *= dim // math.prod(mesh_shape[a] for a in axes)
    return total


RIGHT = {
    "test_speedup": {"attainable_speedup": attainable_speedup},
    "test_cost_functions": {"cost_per_sample_usd": lambda r, u: u / (r * 3600),
                            "cost_per_million_tokens_usd": lambda r, u: u * 1e6 / (r * 3600)},
    "test_spot": {"spot_expected_cost_usd": spot_expected_cost_usd},
    "test_right_sizing": {"estimate_tpot_ms": estimate},
    "test_checkpoint_overhead": {"checkpoint_overhead_pct": lambda s, t, e: 100 * s / (e * t)},
    "test_recompiles": {"bucket_length": bucket_length},
    "test_topology": {"slowest_gpu_link": slowest_gpu_link},
    "test_shard_bytes": {"per_device_bytes": per_device_bytes},
}


def judged(cell: str, impls: dict, values: dict | None = None, seed: int = 11):
    a = run_calls(cell, impls, seed)
    a.values = decoded(cell, values) if values else {}
    return JUDGE[cell].judge(a, made.ref(CPU) if JUDGE[cell].measures else None)


@pytest.mark.parametrize("cell", sorted(RIGHT))
def test_the_right_functions_pass_every_drawn_case(cell):
    lines = judged(cell, RIGHT[cell], answers().get(cell))
    assert any("right on all" in ln for ln in lines), lines


def _per_device_zip(shape, itemsize, mesh_shape, spec):
    """zip(shape, spec) stops at the spec's end: the dimensions it does not reach are dropped."""
    total = itemsize
    for dim, entry in zip(shape, spec, strict=False):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        total *= dim // math.prod(mesh_shape[a] for a in axes)
    return total


def _per_device_first_axis(shape, itemsize, mesh_shape, spec):
    total = itemsize
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axis = entry if entry is None or isinstance(entry, str) else entry[0]
        total *= dim // (1 if axis is None else mesh_shape[axis])
    return total


NOTEBOOK_ONLY = {  # answers for the inputs the notebook shows, typed in: the drawn cases are other inputs
    (64, 32, 4, "data"): 1024, (32, 48, 4, "model"): 3072}

WRONG = [  # cell, function, wrong implementation, what the message names
    ("test_speedup", "attainable_speedup", lambda i, a, b, d="bf16": b.peak_tflops(d) / a.peak_tflops(d), r"min\(peak"),
    ("test_speedup", "attainable_speedup",
     lambda i, a, b, d="bf16": min(b.peak_tflops(d), i * b.bandwidth_gbs) / min(a.peak_tflops(d), i * a.bandwidth_gbs),
     "/ 1000"),
    ("test_cost_functions", "cost_per_million_tokens_usd", lambda r, u: u * 1e6 / (r * 60), "3600"),
    ("test_spot", "spot_expected_cost_usd",
     lambda w, u, t, d, r, lam: w * (1 + d / t) / max(1e-9, 1 - lam * (t / 2 + r)) * u, "math.inf"),
    ("test_spot", "spot_expected_cost_usd", lambda w, u, t, d, r, lam: w * (1 + d / t) * u, "lambda"),
    ("test_right_sizing", "estimate_tpot_ms",
     lambda m, n, a, b: m - n / (a * 1e9) * 1e3 + n / (b * 1e9) * 1e3, "max\\(measured"),
    ("test_checkpoint_overhead", "checkpoint_overhead_pct", lambda s, t, e: s / (e * t), "100 x"),
    ("test_recompiles", "bucket_length", lambda n, b: min([x for x in b if x >= n], default=None), "ValueError"),
    ("test_recompiles", "bucket_length", lambda n, b: min(x for x in b if x > n), "smallest bucket >= n"),
    ("test_recompiles", "bucket_length", lambda n, b: min([x for x in b if x >= n] or [max(b)]), "ValueError"),
    ("test_topology", "slowest_gpu_link", lambda t: t.link("GPU0", "GPU1"), "slowest link"),
    ("test_topology", "slowest_gpu_link",
     lambda t: min((t.link(a, b) for a in t.gpus for b in t.devices if a != b), key=topology.path_rank), "NIC"),
    ("test_shard_bytes", "per_device_bytes", _per_device_zip, "past the spec's end"),
    ("test_shard_bytes", "per_device_bytes", _per_device_first_axis, "per_device_bytes"),
    ("test_shard_bytes", "per_device_bytes",
     lambda s, i, m, p: math.prod(s) * i // math.prod(m.values()), "copy the array"),
    ("test_shard_bytes", "per_device_bytes",
     lambda s, i, m, p: NOTEBOOK_ONLY.get((s[0], s[1], i, next(e for e in p if e)) if len(s) == 2 and any(p) else None, 0),
     "per_device_bytes"),
]


@pytest.mark.parametrize("cell, name, wrong, named", WRONG)
def test_a_wrong_rule_fails_the_drawn_cases_without_naming_them(cell, name, wrong, named):
    impls = dict(RIGHT[cell], **{name: wrong})
    with pytest.raises(Fail, match=r"disagreed with the rule on \d+ of \d+ hidden cases") as exc:
        judged(cell, impls, answers().get(cell))
    assert re.search(named, str(exc.value)), str(exc.value)
    a = run_calls(cell, impls)
    shown = str(exc.value)
    for args in a.inputs[name]:  # no drawn input of a case is in the message
        for x in (f"{v:.6g}" for v in args if isinstance(v, float)):
            assert len(x) < 6 or x not in shown


@pytest.mark.parametrize("cell", sorted(RIGHT))
def test_hidden_cases_come_from_the_seed(cell):
    for name, make in JUDGE[cell].calls.items():
        one, again, other = (make(cell_seed(s, cell, name), CPU) for s in (1, 1, 2))
        assert one == again and one != other, name


def test_a_table_of_answers_for_one_seed_fails_another():
    """Answers recorded for the cases of one grading run are wrong for the next run's."""
    cell, name = "test_spot", "spot_expected_cost_usd"
    seen = run_calls(cell, RIGHT[cell], seed=1)
    table = {json.dumps(args): r.value for args, r in zip(seen.inputs[name], seen.calls[name], strict=True)}
    with pytest.raises(Fail, match="disagreed"):
        judged(cell, {name: lambda *args: table.get(json.dumps(list(args)), 0.0)}, seed=2)


def test_drawn_topologies_parse_and_have_a_nic_slower_than_every_gpu_link_somewhere():
    rng = random.Random(5)
    texts = [rules.topo_text(rng) for _ in range(60)]
    topos = [topology.parse_topo(t) for t in texts]
    assert all(2 <= len(t.gpus) <= 8 for t in topos)
    nic_slowest = [t for t in topos if len(t.devices) > len(t.gpus) and min(
        (t.link(a, b) for a in t.gpus for b in t.devices if a != b), key=topology.path_rank) != slowest_gpu_link(t)]
    assert nic_slowest, "no drawn matrix tells a GPU-only answer from one that counts NICs"
    assert any("SOC" in t for t in texts) and any("NV" in slowest_gpu_link(t) for t in topos)


def test_the_expected_bytes_per_device_are_what_jax_places():
    rows = rules.shard_bytes_cases(random.Random(3), CPU)
    dtypes = {1: "int8", 2: "float16", 4: "float32", 8: "float32"}  # JAX without x64 keeps 8-byte types in 4 bytes
    jax_cases = [(tuple(s["__tuple__"]), dtypes[i], m, tuple(tuple(e) if isinstance(e, list) else e for e in spec["args"]))
                 for s, i, m, spec in rows]
    truth = tpu_pod.jax_shard_bytes_many(jax_cases)
    for (s, i, m, spec), per_device in zip(rows, truth, strict=True):
        want = rules.expected_shard_bytes(s["__tuple__"], i, m, spec["args"]) * min(i, 4) // i
        assert set(per_device) == {want}, (s, m, spec)


# -- the measured cells: consistency, the datasheet, the grader's measurement ----------------------------

MEASURED = ["test_points", "test_measured_costs", "test_right_sizing", "test_beyond_gpus", "test_checkpoint_overhead",
            "test_recompiles"]


def _with_calls(cell: str, values: dict, ctx=CPU) -> dict:
    """The answers plus the right functions' results on the drawn cases, for cells that have both."""
    if cell not in RIGHT:
        return {}
    a = run_calls(cell, RIGHT[cell], ctx=ctx)
    return {"calls": a.calls, "inputs": a.inputs}


@pytest.mark.parametrize("cell", MEASURED)
@pytest.mark.parametrize("where", ["cpu", "t4", "t4 record"])
def test_right_answers_pass_and_say_how_they_compare(cell, where):
    ctx = CPU if where == "cpu" else T4
    rates = made.CPU_RATES if ctx is CPU else made.T4_RATES
    ref = made.ref(ctx, rates, live=where != "t4 record")
    lines = judge(cell, answers(ctx)[cell], ref, ctx, **_with_calls(cell, answers(ctx)[cell], ctx))
    compared = [ln for ln in lines if "grader" in ln and "band" in ln]
    assert (compared if ref.live else [ln for ln in lines if "as recorded (not re-measured)" in ln]), lines


def _change(cell: str, ctx=CPU, **change) -> dict:
    return dict(answers(ctx)[cell], **change)


def _decode_changed(ctx=CPU, **fields) -> dict:
    dec = {b: dict(d) for b, d in answers(ctx)["test_measured_costs"]["decode"].items()}
    b = min(dec)
    dec[b].update(fields)
    return dec


WRONG_ANSWERS = [  # cell, the change, what the message names
    ("test_points", dict(matmul_tflops=0.2), "matmul_tflops"),
    ("test_points", dict(copy_gbs=10.0), "read and write 4 bytes"),
    ("test_points", dict(matmul_time=dict(made.timing(1.0), p20_ms=2.0)), "not a timing"),
    ("test_measured_costs", dict(samples_per_s=made.CPU_RATES["samples_per_s"] * 1.1), "samples_per_s"),
    ("test_measured_costs", dict(PRICE_USD_PER_HOUR=1.0), "PRICE_USD_PER_HOUR"),
    ("test_measured_costs", dict(usd_per_million_tokens=1.0), "largest batch"),
    ("test_measured_costs", dict(decode=_decode_changed(tpot_ms=1.0)), r"decode\[1\]\['tpot_ms'\]"),
    ("test_right_sizing", dict(MY_BANDWIDTH_GBS=300.0), "MY_BANDWIDTH_GBS"),
    ("test_right_sizing", dict(BYTES_PER_STEP=1000), "BYTES_PER_STEP"),
    ("test_right_sizing", dict(TPOT_SLO_MS=99.0), "TPOT_SLO_MS"),
    ("test_beyond_gpus", dict(MONTHLY_TOKENS=1.0), "MONTHLY_TOKENS"),
    ("test_checkpoint_overhead", dict(sync_overhead_pct=1.0), "sync_overhead_pct"),
    ("test_recompiles", dict(compiles_unpadded=10), "the grader counted"),  # one per call, repeated lengths too
    ("test_recompiles", dict(compile_ms=0.05), "compile_ms"),
    ("test_recompiles", dict(break_even_calls=3.0), "break_even_calls"),
    ("test_recompiles", dict(eager_ms=0.05, break_even_calls=5.0), "math.inf"),
]


@pytest.mark.parametrize("cell, change, named", WRONG_ANSWERS)
def test_a_wrong_answer_fails_naming_it(cell, change, named):
    with pytest.raises(Fail, match=named):
        judge(cell, _change(cell, **change), **_with_calls(cell, {}))


def test_an_inconsistent_candidate_list_or_answer_fails():
    base = answers()["test_right_sizing"]
    calls = _with_calls("test_right_sizing", base)
    cands = list(base["candidates"])
    for change, named in ((cands[:-1], "every priced card at every batch size"),
                          (cands + cands[:1], "one each"),
                          ([dataclasses.replace(cands[0], latency_ms=cands[0].latency_ms * 2), *cands[1:]], "latency_ms"),
                          ([dataclasses.replace(cands[0], basis="measured"), *cands[1:]], "basis")):
        with pytest.raises(Fail, match=named):
            judge("test_right_sizing", dict(base, candidates=change), **calls)
    other = next(c for c in cands if c.name != base["answer"].choice.name)
    with pytest.raises(Fail, match="right_size on your candidates gives"):
        judge("test_right_sizing", dict(base, answer=dataclasses.replace(base["answer"], choice=other)), **calls)


def test_beyond_gpus_must_come_from_the_middle_batch_and_the_right_numbers():
    from utils.capacity import accelerators

    base = answers()["test_beyond_gpus"]
    dec, slo, month = base["decode"], base["TPOT_SLO_MS"], base["MONTHLY_TOKENS"]

    def beyond(batch, tokens=month, nbytes=base["BYTES_PER_STEP"], bw=base["MY_BANDWIDTH_GBS"]):
        return accelerators.cheapest_for_slo(measured_tpot_ms=dec[batch]["tpot_ms"], batch_size=batch, slo_tpot_ms=slo,
                                             output_tokens_per_month=tokens, model_bytes=nbytes, measured_bandwidth_gbs=bw)

    judge("test_beyond_gpus", base)
    for wrong, named in ((beyond(max(dec)), "qualifies|scaled TPOT|monthly cost"),
                         (beyond(sorted(dec)[1], tokens=month / 730 * 720), "demand"),
                         (beyond(sorted(dec)[1], bw=2 * base["MY_BANDWIDTH_GBS"]), "measured bandwidth"),
                         (beyond(sorted(dec)[1], nbytes=1e12), "qualifies")):
        with pytest.raises(Fail, match=named):
            judge("test_beyond_gpus", dict(base, BEYOND=wrong))


def test_a_number_far_from_the_graders_measurement_fails_whatever_spread_it_claims():
    s = CPU.sizes
    values = answers()["test_measured_costs"]
    fast = 10 * made.CPU_RATES["samples_per_s"]  # ten times the grader's rate, consistent with its own train dict
    tr = dict(values["train"], tokens_per_s=fast * s.seq_len, p20_ms=1e-6, p80_ms=1e6)
    tr["total_s"] = s.train_batch * s.seq_len * tr["steps"] / tr["tokens_per_s"]
    tr["median_ms"] = tr["total_s"] * 1e3 / tr["steps"]
    values.update(train=tr, samples_per_s=fast, usd_per_sample=values["PRICE_USD_PER_HOUR"] / (fast * 3600))
    with pytest.raises(Fail, match="the grader measured"):
        judge("test_measured_costs", values)


def test_a_gpu_answer_above_the_datasheet_fails_live_and_from_a_record():
    for live in (True, False):
        ref = made.ref(T4, made.T4_RATES, live=live)
        fast = dict(made.T4_RATES, matmul=200.0)  # above the T4's 65 fp16 TFLOP/s
        with pytest.raises(Fail, match="not physically possible"):
            judge("test_points", answers(T4, fast)["test_points"], ref, T4)
        quick = dict(made.T4_RATES, tpot=(0.5, 0.6, 0.8))  # the weights read faster than 320 GB/s
        for cell in ("test_measured_costs", "test_right_sizing", "test_beyond_gpus"):
            with pytest.raises(Fail, match="not physically possible"):
                judge(cell, answers(T4, quick)[cell], ref, T4, **_with_calls(cell, {}, T4))
    small = answers(T4)["test_checkpoint_overhead"]
    small["overhead"] = dict(small["overhead"], checkpoint_bytes=10**6)
    with pytest.raises(Fail, match="less than the weights and AdamW"):
        judge("test_checkpoint_overhead", small, made.ref(T4, made.T4_RATES, live=False), T4,
              **_with_calls("test_checkpoint_overhead", small, T4))


def test_a_record_may_report_the_compile_counts_of_either_set_of_lengths():
    ref = reference.from_record(T4, {})
    assert set(ref.compiles) == {reference.expected_compiles(T4.sizes.xla_lengths),
                                 reference.expected_compiles(CPU.sizes.xla_lengths)}
    assert ref.weight_bytes == reference.params_bytes("gpt2-small") and not ref.measured


# -- test_resume -----------------------------------------------------------------------------------------

DIGESTS = {c: f"{i:064x}" for i, c in enumerate(("model", "optimizer", "scheduler", "loader", "rng.torch", "rng.cuda",
                                                 "rng.python", "rng.numpy"))}


def _resume_answers(kill_after: int, harness_result) -> tuple[Answers, reference.Reference]:
    config = dataclasses.asdict(reference.run_config(CPU.sizes, "cpu"))
    a = Answers({}, calls={judges.VICTIM: [Case(True, {"steps_run": kill_after})]},
                inputs={judges.VICTIM: [[kill_after, "/tmp/x", config]]}, harness=harness_result)
    return a, made.ref(CPU, resume={reference.config_key(config): DIGESTS})


def test_resume_passes_a_bit_identical_run_from_the_newest_checkpoint():
    a, ref = _resume_answers(9, {"resumed_from": 8, "digests": DIGESTS, "round_trip": []})
    assert "bit-identical" in judges.resume(a, ref)[0]


@pytest.mark.parametrize("result, named", [
    ({"resumed_from": 8, "digests": dict(DIGESTS, **{"rng.python": "0", "model": "1"}), "round_trip": []},
     "ends different from an uninterrupted one in: model, rng.python"),
    ({"resumed_from": 8, "digests": dict(DIGESTS, model="1"), "round_trip": [],
      "nondeterministic_ops": ["index_add_cuda_ does not have a deterministic implementation"]},
     "in: model \\(ops without a deterministic kernel ran: index_add_cuda_"),
    ({"resumed_from": 8, "digests": dict(DIGESTS, **{"rng.python": "0"}), "round_trip": ["python"]},
     "did not repeat their draws: python"),
    ({"resumed_from": 8, "digests": DIGESTS, "round_trip": ["KeyError: 'numpy'"]}, "raised KeyError"),
    ({"resumed_from": 4, "digests": DIGESTS, "round_trip": []}, "not from the newest checkpoint"),
    ({"digests": DIGESTS}, "did not report its final state"),
    ("the right digests, trust me", "did not report its final state"),
])
def test_resume_fails_a_run_that_is_not_the_uninterrupted_one(result, named):
    a, ref = _resume_answers(9, result)
    with pytest.raises(Fail, match=named):
        judges.resume(a, ref)


def test_the_interrupted_run_failing_is_said_before_the_resume_runs():
    a = Answers({}, calls={judges.VICTIM: [Case(False, error="NameError: name 'np' is not defined")]},
                inputs={judges.VICTIM: [[9, "/tmp/x", {}]]})
    with pytest.raises(Fail, match="capture_rng_state failed before the grader stopped it: NameError"):
        judges.resume_params(CPU, a)


def test_the_kill_step_and_the_folder_are_drawn_per_run():
    steps = {rules.victim_cases(random.Random(s), CPU)[0][0] for s in range(40)}
    cfg = reference.run_config(CPU.sizes, "cpu")
    assert steps == set(range(cfg.checkpoint_every, cfg.steps))
    one, two = (rules.victim_cases(random.Random(1), CPU)[0] for _ in range(2))
    assert one[0] == two[0] and one[1] != two[1]


# -- test_pod_sharding -----------------------------------------------------------------------------------

def sharded_matmul(x, w, mesh, x_spec, w_spec):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    return jax.jit(jnp.matmul)(jax.device_put(x, NamedSharding(mesh, x_spec)), jax.device_put(w, NamedSharding(mesh, w_spec)))


def _sharded(fn, seed: int = 4) -> Answers:
    cases = rules.sharded_cases(random.Random(seed), CPU)
    results = []
    for x, w, mesh, xs, ws in cases:
        try:
            results.append(Case(True, plain(loads(json.dumps(encode(harness.sharded_case(
                {"sharded_matmul": fn}, x, w, mesh, xs, ws)))))))
        except Exception as exc:
            results.append(Case(False, error=f"{type(exc).__name__}: {exc}"))
    return Answers(decoded("test_pod_sharding", answers()["test_pod_sharding"]), calls={judges.SHARDED: results},
                   inputs={judges.SHARDED: cases})


@pytest.fixture(scope="module")
def cpu_devices():
    import jax

    if len(jax.devices("cpu")) < 8:
        pytest.skip("JAX started before utils.tpu.xla asked for 8 CPU devices: run this file in a fresh process")


def test_the_sharded_matmul_passes_on_drawn_meshes_and_layouts(cpu_devices):
    assert "all 8 hidden meshes" in judges.pod_sharding(_sharded(sharded_matmul), None)[0]
    drawn = [c[2] for c in rules.sharded_cases(random.Random(4), CPU)]
    assert any(list(m)[0] not in ("data",) for m in drawn)  # axis names and order other than the notebook's


def _fixed_mesh(x, w, mesh, x_spec, w_spec):
    """Places on all 8 devices as a 4 x 2 mesh whatever mesh it is given (the notebook's MESH_2D)."""
    from jax.sharding import PartitionSpec as P

    return sharded_matmul(x, w, tpu_pod.mesh({"data": 4, "model": 2}), P("data", None), P(None, "model"))


@pytest.mark.parametrize("wrong, named", [
    (lambda x, w, mesh, xs, ws: np.asarray(x) @ np.asarray(w), "not a JAX array placed on the mesh"),
    (lambda x, w, mesh, xs, ws: __import__("jax.numpy").numpy.matmul(x, w), "lives on devices \\[0\\]"),
    (lambda x, w, mesh, xs, ws: sharded_matmul(x, w, mesh, ws, xs), "raised|not laid out|not x @ w"),
    (_fixed_mesh, "raised|lives on devices|not laid out"),
    (lambda x, w, mesh, xs, ws: sharded_matmul(x, w + 1, mesh, xs, ws), "not x @ w"),
])
def test_a_wrong_sharded_matmul_fails(cpu_devices, wrong, named):
    with pytest.raises(Fail, match=named):
        judges.pod_sharding(_sharded(wrong), None)


@pytest.mark.parametrize("name, spec, named", [
    ("DP_W", (True, ("data", None)), "DP_W = P\\('data', None\\) does not lay"),
    ("TP_W", (True, ("model", None)), "TP_W"),
    ("TP_X", (True, ("data", "model")), "TP_X"),
    ("DP_X", (False, ("data", None)), "not a jax.sharding.PartitionSpec"),
    ("MESH_2D", {"model": 2, "data": 4}, "MESH_2D has the axes"),
])
def test_wrong_specs_or_meshes_fail(name, spec, named):
    values = dict(answers()["test_pod_sharding"], **{name: spec})
    a = Answers(decoded("test_pod_sharding", values), calls={judges.SHARDED: []}, inputs={judges.SHARDED: []})
    with pytest.raises(Fail, match=named):
        judges.pod_sharding(a, None)


def test_equivalent_specs_pass():
    """A trailing None may be left out, and an axis of size 1 splits nothing."""
    values = dict(answers()["test_pod_sharding"], DP_X=(True, ("data",)), DP_W=(True, ()), TP_W=(True, (None, ("model",))))
    a = Answers(decoded("test_pod_sharding", values), calls={judges.SHARDED: []}, inputs={judges.SHARDED: []})
    judges.pod_sharding(a, None)


def test_every_check_judges_a_graded_cell_of_the_notebook():
    from grader.labs import load

    nb = json.loads((reference.definitions.REPO_ROOT / "grader" / "source" / reference.ASSIGNMENT /
                     f"{reference.ASSIGNMENT}.ipynb").read_text())
    graded = {c["metadata"]["nbgrader"]["grade_id"] for c in nb["cells"]
              if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade")}
    assert {c.cell for c in judges.CHECKS} == graded == set(ANSWERS) == set(load(reference.ASSIGNMENT).answers)
    assert cost.PRICES  # the price table the cost cells read
