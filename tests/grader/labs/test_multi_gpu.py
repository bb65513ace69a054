"""Lab 02's judges (grader/labs/multi_gpu/judges.py), pure: each passes the right answers and fails each
wrong one with a message that names the mistake; the harnesses and the grader's own runs on this CPU.

The answers are built here as the notebook's export would send them (tests/grader/labs/multi_gpu_answers.py);
a Reference with its launches already in its cache stands for the grader's runs. The formula cells and
the Triton kernels are also run through a real sandbox: a call to the course's implementation gets no
points, and a table of answers for one seed's cases fails another seed's. Graded through the real
commands: tests/grader/labs/test_multi_gpu_grading.py.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from grader import definitions
from grader.expect import Fail
from grader.judging import Answers, Case
from grader.labs.multi_gpu import harness, judges, reference
from grader.labs.multi_gpu.answers import ANSWERS
from grader.sandbox import Sandbox, Section
from tests.grader.labs import multi_gpu_answers as made
from tests.nbcells import cell, points, src
from utils.parallel import grad_sync, zero_memory
from utils.parallel.distributed import memory_per_gpu
from utils.train.fused import INTERPRETED, bias_gelu_reference

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "grader" / "source" / made.A / f"{made.A}.ipynb"
S = made.CPU_PLAN.sizes
JUDGE = {c.cell: c.judge for c in judges.CHECKS}


def _results(values: list) -> list[Case]:
    return [Case(True, v) for v in values]


def solution(*grade_ids: str) -> dict:
    """The source notebook's solution cells, run here (the course's own answers)."""
    ns: dict = {}
    nb = json.loads(SOURCE.read_text())
    for gid in grade_ids:
        text = src(cell(nb, gid))
        if gid == "parallel_answer":
            text = text.split("\n\n\n### BEGIN SOLUTION\nMIN_TP")[0]
        exec(compile(text, gid, "exec"), ns)  # noqa: S102 - the course's own solution cells
    return ns


def test_every_graded_cell_has_a_judge_and_answers():
    nb = json.loads(SOURCE.read_text())
    assert set(points(nb)) == {c.cell for c in judges.CHECKS} == set(ANSWERS)
    assert not any("BEGIN HIDDEN TESTS" in src(c) for c in nb["cells"])
    assert src(cell(nb, "record")) == 'print(checks.save_record("02_multi_gpu", globals()))'


# -- the formula cells on the cases the grader draws ---------------------------------------------

def _formula(name: str, fn, seed: int = 11):
    check = next(c for c in judges.CHECKS if name in c.calls)
    inputs = {name: check.calls[name](random.Random(seed), None)}
    calls = {name: _results([fn(*args) for args in inputs[name]])}
    return check, Answers({"MIN_TP": 4} if check.cell == "test_parallelism" else {}, calls=calls, inputs=inputs)


def test_the_solution_functions_pass_the_drawn_cases():
    f = solution("memory_answer", "busbw_answer", "parallel_answer")
    for name in ("memory_per_gpu_gb", "bus_bandwidth_gbs", "weights_per_gpu_gb"):
        check, a = _formula(name, f[name])
        assert "right on all" in check.judge(a, None)[0]


WRONG_RULES = [
    ("memory_per_gpu_gb", lambda n, d, s, w=2, g=2, o=12: (w * n + g * n / (d if s == "zero3" else 1) + o * n
                                                           / (1 if s == "ddp" else d)) / 1e9, "ZeRO-2 keeps whole gradients"),
    ("memory_per_gpu_gb", lambda n, d, s, w=2, g=2, o=12: memory_per_gpu(n, d, s)["total_gb"], "the widths passed, ignored"),
    ("memory_per_gpu_gb", lambda n, d, s, w=2, g=2, o=12: memory_per_gpu(n, d, s, param_bytes=w, grad_bytes=g,
                                                                         optimizer_bytes_per_param=o)["total_bytes"] / 2**30,
     "GiB for GB"),
    ("bus_bandwidth_gbs", lambda b, t, n: b / (t * 1e-6) / 1e9, "the algorithm bandwidth"),
    ("bus_bandwidth_gbs", lambda b, t, n: b / (t * 1e-6) / 1e9 * (n - 1) / n, "the all-gather's factor"),
    ("weights_per_gpu_gb", lambda n, layers, tp, pp, b=2: n * b / pp / tp / 1e9, "stages as if the layers split evenly"),
    ("weights_per_gpu_gb", lambda n, layers, tp, pp, b=2: n * b * (layers // pp) / layers / tp / 1e9, "floor of the layers"),
]


@pytest.mark.parametrize("name, wrong, kind", WRONG_RULES, ids=[w[2] for w in WRONG_RULES])
def test_a_wrong_rule_fails_on_the_drawn_cases(name, wrong, kind):
    check, a = _formula(name, wrong)
    with pytest.raises(Fail, match=f"{name} disagreed with the rule"):
        check.judge(a, None)


def test_min_tp_and_the_70b_count():
    from utils.model.model_shapes import llama_70b_params

    assert judges.llama_params() == llama_70b_params() == 70_553_706_496
    assert judges.min_tp() == 4
    f = solution("parallel_answer")
    check, a = _formula("weights_per_gpu_gb", f["weights_per_gpu_gb"])
    a.values["MIN_TP"] = 2  # 70.6 GB of weights fit an 80 GB card, not the 80% rule
    with pytest.raises(Fail, match="MIN_TP = 2, but 4"):
        check.judge(a, None)


def test_hidden_cases_come_from_the_seed():
    for make in (judges.memory_cases, judges.busbw_cases, judges.parallel_cases):
        assert make(random.Random(1), None) == make(random.Random(1), None) != make(random.Random(2), None)
    for make in (judges.memory_cases, judges.parallel_cases):  # every stage and both signatures are drawn
        got = make(random.Random(3), None)
        assert {len(c) for c in got} == ({3, 6} if make is judges.memory_cases else {4, 5})


# -- test_zero_memory against a sharded run ----------------------------------------------------------

def fake_zero_run(layers=(71, 97, 95, 93, 91, 11), world: int = 2) -> dict:
    """A sharded run whose ranks hold exactly the even split (the arithmetic), ZeRO-1's rank 0 the largest
    tensor's optimizer state over it."""
    shapes = zero_memory.param_shapes(layers)
    n = zero_memory.n_params(layers)
    w = {"weights": 4, "grads": 4, "optimizer": 8}
    stages = {}
    for stage in zero_memory.STAGES:
        even = memory_per_gpu(n, world, stage, param_bytes=4, grad_bytes=4, optimizer_bytes_per_param=8)["total_bytes"]
        off = zero_memory.remainder_bytes(shapes, world, stage, w)
        stages[stage] = [{"rank": r, "total_bytes": int(even + (off if r == 0 else -off)), "weights_bytes": 0,
                          "grads_bytes": 0, "optimizer_bytes": 0} for r in range(world)]
    return {"n_params": n, "world_size": world, "backend": "gloo", "bytes_per_param": w, "stages": stages,
            "param_shapes": [list(s) for s in shapes], "layers": list(layers)}


def _zero_answers(fn, res) -> Answers:
    w = res["bytes_per_param"]
    cases_ = [[res["n_params"], res["world_size"], s, w["weights"], w["grads"], w["optimizer"]] for s in zero_memory.STAGES]
    out = []
    for c in cases_:
        try:
            out.append({"ok": fn(*c)})
        except Exception as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return Answers({}, inputs={"zero_run": res, "zero_cases": cases_, "zero_layers": tuple(res["layers"])}, harness=out)


def _no_optimizer_shard(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    shards = {"ddp": (1, 1), "zero1": (1, 1), "zero2": (1, d), "zero3": (d, d)}[stage]
    return (weight_bytes * n / shards[0] + grad_bytes * n / shards[1] + optim_bytes * n) / 1e9


def _widths_ignored(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    return solution("memory_answer")["memory_per_gpu_gb"](n, d, stage)


def _zero1_shards_gradients(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    return solution("memory_answer")["memory_per_gpu_gb"](n, d, "zero2" if stage == "zero1" else stage, weight_bytes,
                                                          grad_bytes, optim_bytes)


@pytest.mark.parametrize("wrong, match", [
    (_no_optimizer_shard, r"'zero1', 4, 4, 8\) = .* GB .* but rank 0 of the grader's zero1 run held"),
    (_widths_ignored, r"'zero1', 4, 4, 8\) = .* its shards allow"),
    (_zero1_shards_gradients, r"'zero1', 4, 4, 8\) = .* its shards allow"),
    (lambda *a: 1 / 0, "raised ZeroDivisionError"),
    (lambda *a: "16 GB", "not a number of GB"),
])
def test_zero_memory_meets_every_rank_within_the_shards(wrong, match):
    res = fake_zero_run()
    lines = judges.zero(_zero_answers(solution("memory_answer")["memory_per_gpu_gb"], res), None)
    assert "does not show" in lines[0] and "zero3: predicted" in lines[1]
    with pytest.raises(Fail, match=match):
        judges.zero(_zero_answers(wrong, res), None)


def test_a_prediction_that_is_no_number_fails_before_the_grader_launches_its_run():
    a = _zero_answers(lambda *a: 1 / 0, fake_zero_run())
    del a.inputs["zero_run"]  # the judge would launch it: it must not get that far
    with pytest.raises(Fail, match="raised ZeroDivisionError"):
        judges.zero(a, None)


def test_the_drawn_stacks_keep_the_shard_remainder_below_a_wrong_answer():
    for seed in range(20):
        layers = reference.draw_layers(random.Random(seed))
        res = fake_zero_run(layers)
        for wrong in (_no_optimizer_shard, _widths_ignored, _zero1_shards_gradients):
            with pytest.raises(Fail):
                judges.zero(_zero_answers(wrong, res), None)
    assert reference.draw_layers(random.Random(1)) != reference.draw_layers(random.Random(2))


# -- the all-reduce -----------------------------------------------------------------------------------

def _allreduce(values: dict, ref):
    return judges.allreduce(Answers(made.decoded("test_allreduce", values)), ref)


def _grader_allreduce(bw: float) -> dict:
    return {f"allreduce:{i}": made.allreduce_table(busbw=bw * (1 + 0.02 * i)) for i in range(reference.REPEATS)}


def test_the_allreduce_passes_near_the_graders_and_fails_far_from_it():
    table = made.allreduce_table(busbw=0.45)
    big = table["results"][-1]["busbw_gbs"]
    line = _allreduce({"allreduce": table, "BUSBW_GBS": big}, made.live_ref(_grader_allreduce(0.5)))[0]
    assert "BUSBW_GBS: grader" in line and "band" in line
    with pytest.raises(Fail, match="but the grader measured"):
        _allreduce({"allreduce": table, "BUSBW_GBS": big}, made.live_ref(_grader_allreduce(5.0)))


@pytest.mark.parametrize("change, match", [
    (lambda t: {"BUSBW_GBS": 0.5}, "BUSBW_GBS = 0.5, expected"),  # a number typed in near the grader's
    (lambda t: {"allreduce": {**t, "world_size": 4}}, "ran on 4 ranks"),
    (lambda t: {"allreduce": {**t, "backend": "nccl"}}, "over 'nccl'"),
    (lambda t: {"allreduce": {**t, "results": t["results"][:-1]}}, "for the plan's sizes"),
    (lambda t: {"allreduce": {**t, "results": [{**t["results"][0], "busbw_gbs": 9.0}] + t["results"][1:]}},
     "busbw_gbs at 4,096 bytes"),
])
def test_an_allreduce_that_is_not_the_plans_or_not_consistent_fails(change, match):
    table = made.allreduce_table(busbw=0.45)
    values = {"allreduce": table, "BUSBW_GBS": table["results"][-1]["busbw_gbs"], **change(table)}
    with pytest.raises(Fail, match=match):
        _allreduce(values, made.live_ref(_grader_allreduce(0.45)))


def test_a_gpu_allreduce_from_a_record_is_checked_against_the_link():
    ref = made.record_ref()
    table = made.allreduce_table(backend="nccl", sizes=ref.plan.sizes.allreduce_sizes, busbw=327.0)
    line = _allreduce({"allreduce": table, "BUSBW_GBS": table["results"][-1]["busbw_gbs"]}, ref)[0]
    assert "as recorded (not re-measured)" in line and "450" in line
    fast = made.allreduce_table(backend="nccl", sizes=ref.plan.sizes.allreduce_sizes, busbw=600.0)
    with pytest.raises(Fail, match="NVLink 4"):
        _allreduce({"allreduce": fast, "BUSBW_GBS": fast["results"][-1]["busbw_gbs"]}, ref)


# -- scaling, breaks and the explanation ----------------------------------------------------------

def _train_cache(eff: float = 0.9, share: float = 0.2, breaks: dict | None = None) -> dict:
    out = {"train:1": made.fake_run(S, 1, 1000.0), "train:n": made.fake_run(S, 2, 1000.0 * eff, share)}
    for name, sh in (breaks or {"small_batch": 0.3}).items():
        out[f"break:{name}"] = made.fake_run(S, 2, 600.0, sh, **judges.scenario_config(name, S))
    return out


def _scaling(one, many, eff=None, share=None, ref=None):
    eff = many["tokens_per_s_per_device"] / one["tokens_per_s_per_device"] if eff is None else eff
    share = many.get("exposed_comm_share") if share is None else share
    values = {"one": one, "many": many, "scaling_efficiency": eff, "comm_share": share}
    return judges.scaling(Answers(made.decoded("test_scaling", values)), ref or made.live_ref(_train_cache()))


def test_scaling_passes_near_the_graders_runs():
    lines = _scaling(made.fake_run(S, 1, 1000.0), made.fake_run(S, 2, 850.0, 0.25))
    assert "scaling_efficiency: grader 0.900, yours 0.850" in lines[0] and "comm_share" in lines[1]


@pytest.mark.parametrize("many, eff, match", [
    (made.fake_run(S, 2, 800.0, 0.15), 1.3, "expected 0.8"),  # a number that does not follow from the runs
    (made.fake_run(S, 2, 1300.0, 0.15), None, "not physically possible"),  # runs edited consistently to beat linear
    (made.fake_run(S, 2, 800.0, 0.15, seq=32), None, "seq=32"),  # a smaller run than the plan's
    (made.fake_run(S, 2, 800.0), None, "nosync_median_ms"),  # measure_comm left out
    (made.fake_run(S, 2, 50.0, 0.15), None, "below the 0.1"),
    (made.fake_run(S, 3, 800.0, 0.15), None, "ran on 3 process"),
])
def test_fabricated_or_edited_scaling_fails(many, eff, match):
    with pytest.raises(Fail, match=match):
        _scaling(made.fake_run(S, 1, 1000.0), many, eff, 0.15 if many.get("exposed_comm_share") is None else None)


def test_an_edited_rank_or_numbers_far_from_the_graders_fail():
    edited = made.fake_run(S, 2, 800.0, 0.15)
    edited["per_rank"][1]["tokens_per_s"] = 1300.0
    with pytest.raises(Fail, match="its tokens over its measured time"):
        _scaling(made.fake_run(S, 1, 1000.0), edited, 0.8)
    far = made.live_ref(_train_cache(eff=0.3, share=0.7))
    with pytest.raises(Fail, match="but the grader measured 0.300"):
        _scaling(made.fake_run(S, 1, 1000.0), made.fake_run(S, 2, 950.0, 0.05), ref=far)


def test_scaling_from_a_gpu_record_checks_the_datasheet():
    ref = made.record_ref()
    s = ref.plan.sizes
    one, many = made.fake_run(s, 1, 194e3, backend="nccl"), made.fake_run(s, 2, 192e3, 0.01, backend="nccl")
    assert "as recorded" in _scaling(one, many, ref=ref)[0]
    fast = made.fake_run(s, 1, 5e6, backend="nccl")  # 5M tokens/s of GPT-2 small: above the H200's bf16 peak
    with pytest.raises(Fail, match="datasheet peak"):
        _scaling(fast, made.fake_run(s, 2, 5e6, 0.01, backend="nccl"), ref=ref)


def test_a_record_whose_sizes_are_not_its_gpus_is_refused():
    t4 = made.ctx(made.H200_PLAN, gpu=True)
    t4 = t4.__class__(**{**t4.__dict__, "tier": "t4"})  # an H200 pair claiming the T4 tier's runs
    ref = reference.from_record(t4, {})
    with pytest.raises(Fail, match="'t4' sizes"):
        _scaling(made.fake_run(S, 1, 1000.0), made.fake_run(S, 2, 900.0, 0.1), ref=ref)


def _breaks(values: dict, ref=None):
    return judges.breaks(Answers(made.decoded("test_breaks", {"BREAKS": values})), ref or made.live_ref(_train_cache()))


def test_breaks_must_be_their_scenario_and_near_the_graders():
    good = {"small_batch": made.fake_run(S, 2, 500.0, 0.35, batch_per_device=S.small_batch)}
    assert "BREAKS['small_batch'] exposed_comm_share: grader 0.300" in _breaks(good)[0]
    with pytest.raises(Fail, match="batch_per_device=2"):  # the reference batch, not a small one
        _breaks({"small_batch": made.fake_run(S, 2, 500.0, 0.4)})
    with pytest.raises(Fail, match="no_sync_accum=False"):  # accumulation done right is not the break
        _breaks({"accum_without_no_sync": made.fake_run(S, 2, 500.0, 0.4, batch_per_device=S.accum_batch,
                                                        grad_accum=S.grad_accum)})
    with pytest.raises(Fail, match="changes nothing over gloo"):
        _breaks({"p2p_disabled": made.fake_run(S, 2, 500.0, 0.4, env={"NCCL_P2P_DISABLE": "1"})})
    with pytest.raises(Fail, match="at least one scenario"):
        _breaks({})
    far = made.live_ref(_train_cache(breaks={"small_batch": 0.95}))
    with pytest.raises(Fail, match="the grader measured 0.950 in its own small_batch run"):
        _breaks({"small_batch": made.fake_run(S, 2, 500.0, 0.05, batch_per_device=S.small_batch)}, far)


@pytest.mark.parametrize("eff, share, cause", [(0.99, 0.0, "near_linear"), (0.96, 0.3, "near_linear"),
                                               (0.7, 0.3, "exposed_communication"), (0.7, 0.16, "exposed_communication"),
                                               (0.6, 0.05, "other_overhead")])
def test_reference_cause(eff, share, cause):
    assert judges.reference_cause(eff, share) == cause


def test_the_explanation_follows_the_rule_on_numbers_the_grader_measured_too():
    breaks = {"small_batch": made.fake_run(S, 2, 500.0, 0.4, batch_per_device=S.small_batch),
              "accum_without_no_sync": made.fake_run(S, 2, 400.0, 0.55, batch_per_device=S.accum_batch,
                                                     grad_accum=S.grad_accum, no_sync_accum=True)}
    good = {"efficiency": 0.7, "exposed_comm_share": 0.3, "dominant_cause": "exposed_communication",
            "worst_break": "accum_without_no_sync"}
    cache = _train_cache(eff=0.75, share=0.35, breaks={"small_batch": 0.45, "accum_without_no_sync": 0.5})

    def judge(e, eff=0.7, share=0.3, ref=None):
        values = {"EXPLANATION": e, "scaling_efficiency": eff, "comm_share": share, "BREAKS": breaks}
        return judges.explanation(Answers(made.decoded("test_explanation", values)), ref or made.live_ref(cache))

    assert "as the rule gives" in judge(good)[0]
    with pytest.raises(Fail, match="your measurements say 'exposed_communication'"):
        judge({**good, "dominant_cause": "near_linear"})
    with pytest.raises(Fail, match="your measurements say 'other_overhead'"):
        judge({**good, "efficiency": 0.4, "exposed_comm_share": 0.05}, 0.4, 0.05)
    with pytest.raises(Fail, match="'accum_without_no_sync' exposed the most"):
        judge({**good, "worst_break": "small_batch"})
    with pytest.raises(Fail, match=r"EXPLANATION\['efficiency'\]"):  # numbers other than the measured ones
        judge({**good, "efficiency": 0.99, "dominant_cause": "near_linear"})
    far = made.live_ref(_train_cache(eff=0.99, share=0.01, breaks={"small_batch": 0.45, "accum_without_no_sync": 0.5}))
    with pytest.raises(Fail, match="scaling_efficiency = 0.400, but the grader measured 0.990"):  # not the grader's
        judge({**good, "efficiency": 0.4, "exposed_comm_share": 0.05, "dominant_cause": "other_overhead"}, 0.4, 0.05,
              ref=far)
    assert "as recorded" in judge(good, ref=made.record_ref().__class__(made.ctx(), made.CPU_PLAN, False))[0]


# -- the gradient synchronization ---------------------------------------------------------------

@pytest.fixture(scope="module")
def check_run():
    cfg = judges._sync_cfg(made.CPU_PLAN, "check", 1234)
    return cfg, reference.sync_expected(cfg)


@pytest.fixture(scope="module")
def time_run():
    cfg = judges._sync_cfg(made.CPU_PLAN, "time", 99)
    return cfg, reference.sync_expected(cfg)


def test_the_expected_gradients_are_the_ranks_mean(check_run):
    cfg, exp = check_run
    assert len(exp["mean"]) == cfg["steps"] and len(exp["local"][0]) == cfg["world"] == 2
    for p, (l0, l1) in enumerate(zip(exp["local"][0][0], exp["local"][0][1], strict=True)):
        assert math.isclose(exp["mean"][0][p][0], (l0[0] + l1[0]) / 2, rel_tol=1e-4, abs_tol=1e-9)


def test_grad_sync_passes_with_every_rank_right(check_run):
    cfg, exp = check_run
    a = made.sync_answers("test_grad_sync", {"SYNC": made.fake_sync()}, cfg, made.sync_sections(cfg, exp))
    lines = judges.grad_sync_check(a, None)
    assert "equal the mean of the ranks' own" in lines[1]


@pytest.mark.parametrize("scale, calls, match", [
    ({"each": 2.0}, None, "each: .* off by"),  # a sum not divided by the world size
    ({"bucketed_check": 1.5}, None, "bucketed_check: .* off by"),  # the second bucket size breaks it
    ({"overlapped": 0.0}, None, "overlapped: .* off by"),  # finish() that does not wait: zeros
    (None, {"each": {"calls": 1, "bytes": 3_946_496, "max_call_bytes": 3_946_496, "in_backward": 0}}, "each: 1 all-reduce"),
    (None, {"overlapped": {"calls": 28, "bytes": 3_946_496, "max_call_bytes": 2_097_152, "in_backward": 0}},
     "no all-reduce started during the backward"),
    (None, {"bucketed": {"calls": 28, "bytes": 3_946_496, "max_call_bytes": 2_097_152, "in_backward": 0}},
     "bucketed: 28 all-reduce calls"),
])
def test_a_wrong_version_fails_the_graders_run(check_run, scale, calls, match):
    cfg, exp = check_run
    a = made.sync_answers("test_grad_sync", {"SYNC": made.fake_sync()}, cfg,
                          made.sync_sections(cfg, exp, scale=scale, calls=calls))
    with pytest.raises(Fail, match=match):
        judges.grad_sync_check(a, None)


def test_a_sync_run_that_is_not_the_plans_or_shows_a_wrong_version_fails(check_run):
    cfg, exp = check_run
    sections = made.sync_sections(cfg, exp)
    edited = made.fake_sync()
    edited["grads"]["bucketed"].update(match=False, worst_param="transformer.wte.weight", worst_rel_err=0.5)
    with pytest.raises(Fail, match="bucketed: gradients differ"):
        judges.grad_sync_check(made.sync_answers("test_grad_sync", {"SYNC": edited}, cfg, sections), None)
    small = made.fake_sync()
    small["config"]["bucket_mb"] = 2.0
    with pytest.raises(Fail, match="bucket_mb=2.0"):
        judges.grad_sync_check(made.sync_answers("test_grad_sync", {"SYNC": small}, cfg, sections), None)


def _speed(values: dict, cfg, sections, ref=None, cell="test_sync_speed"):
    return JUDGE[cell](made.sync_answers(cell, values, cfg, sections), ref or made.live_ref())


T = {"none": 100.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 140.0}


def test_sync_speed_against_the_graders_timing(time_run):
    cfg, exp = time_run
    run = made.fake_sync(t=T)
    lines = _speed({"SYNC": run, "SYNC_VS_DDP": run["vs_ddp"]}, cfg, made.sync_sections(cfg, exp, T))
    assert len(lines) == 4 and "SYNC_VS_DDP['each']: grader 0.6" in lines[0]
    with pytest.raises(Fail, match=r"SYNC_VS_DDP\['each'\]"):  # DDP's speed over each's, inverted
        _speed({"SYNC": run, "SYNC_VS_DDP": {**run["vs_ddp"], "each": 1 / run["vs_ddp"]["each"]}}, cfg,
               made.sync_sections(cfg, exp, T))
    # a run edited to make the per-parameter version ten times slower against DDP than the grader times it
    slow = made.fake_sync(t={**T, "each": 2400.0})
    with pytest.raises(Fail, match=r"SYNC_VS_DDP\['each'\] = 0.05"):
        _speed({"SYNC": slow, "SYNC_VS_DDP": slow["vs_ddp"]}, cfg, made.sync_sections(cfg, exp, T))
    # the grader's timed sections must hold the right gradients: a version that skips its work while timed fails
    with pytest.raises(Fail, match="while the grader timed it"):
        _speed({"SYNC": run, "SYNC_VS_DDP": run["vs_ddp"]}, cfg, made.sync_sections(cfg, exp, T, scale={"each": 0.5}))
    assert "as recorded" in _speed({"SYNC": made.fake_sync("h100", T, backend="nccl"),
                                    "SYNC_VS_DDP": made.fake_sync("h100", T, backend="nccl")["vs_ddp"]},
                                   {"skip": "record"}, {}, made.record_ref())[0]


@pytest.mark.parametrize("t, cause", [(T, "exposed_communication"),
                                      ({**T, "none": 190.0, "overlapped": 160.0}, "other_overhead"),
                                      ({**T, "each": 123.0, "bucketed": 126.0, "overlapped": 130.0}, "as_fast_as_ddp")])
def test_sync_explanation_must_follow_the_medians(time_run, t, cause):
    cfg, exp = time_run
    run = made.fake_sync(t=t)
    good = grad_sync.explanation(run)
    assert good["cause"] == cause
    sections = made.sync_sections(cfg, exp, t)

    def judge(e):
        return _speed({"SYNC": run, "SYNC_EXPLANATION": e}, cfg, sections, cell="test_sync_explanation")

    assert "follows from your medians" in judge(good)[0]
    for wrong in set(grad_sync.GAP_CAUSES) - {cause}:
        with pytest.raises(Fail, match=f"your medians say '{cause}'"):
            judge({**good, "cause": wrong})
    slowest = max(grad_sync.LEARNER_VERSIONS, key=lambda v: t[v])
    with pytest.raises(Fail, match="has the shortest median step"):
        judge({**good, "fastest": slowest})
    with pytest.raises(Fail, match=r"each_comm_share"):  # the share of DDP's step, not each's
        judge({**good, "each_comm_share": 1 - t["none"] / t["ddp"]})


def test_a_sync_explanation_of_medians_the_grader_did_not_time_fails(time_run):
    cfg, exp = time_run
    timed = {**T, "none": 195.0}  # the grader's timing: synchronizing adds little to the per-parameter step
    run = made.fake_sync(t={**T, "none": 10.0})  # typed-in medians where it is nearly all of it
    e = grad_sync.explanation(run)
    assert e["cause"] == "exposed_communication" != grad_sync.explanation(made.fake_sync(t=timed))["cause"]
    with pytest.raises(Fail, match="but the grader timed"):
        _speed({"SYNC": run, "SYNC_EXPLANATION": e}, cfg, made.sync_sections(cfg, exp, timed),
               cell="test_sync_explanation")


# -- the Triton kernels ------------------------------------------------------------------------------

@pytest.fixture()
def on_cpu(monkeypatch):
    """The kernels' cases as on a CPU (fp32, no timed sections), whatever this machine has."""
    monkeypatch.setattr(judges, "_kernel_device", lambda: ("cpu", ["float32"]))


def _fused_case(fn, rows, cols, dtype, seed, **extra):
    x, b = harness.inputs(seed, rows, cols, torch.device("cpu"), getattr(torch, dtype))
    out = fn(x, b)
    return {"launches": 1, "torch_ops": [], "out_launched": True, "is_input": False, "shape": list(out.shape),
            "dtype": str(out.dtype).removeprefix("torch."), "values": out.float().reshape(-1).tolist(), **extra}


def _fused(fn=bias_gelu_reference, kind="interpreted", **extra):
    params = judges.fused_params(None, Answers({}))
    r = {"kind": kind, "defined": True, "cases": [_fused_case(fn, *c, **extra) for c in params["cases"]]}
    return Answers({}, inputs={"fused": params}, harness=r)


def test_a_right_kernel_passes(on_cpu):
    assert "under Triton's interpreter" in judges.fused_kernel_judge(_fused(), None)[0]


@pytest.mark.parametrize("answers, match", [
    (lambda: _fused(lambda x, b: torch.nn.functional.gelu(x + b)), "differs from PyTorch"),  # the erf GELU
    (lambda: _fused(lambda x, b: x * torch.sigmoid(1.702 * (x + b))), "differs from PyTorch"),
    (lambda: _fused(kind="function"), "not a Triton kernel"),
    (lambda: _fused(launches=0), "did not launch BIAS_GELU_KERNEL"),
    (lambda: _fused(torch_ops=["gelu"]), "called PyTorch's gelu"),
    (lambda: _fused(out_launched=False), "was not given"),
])
def test_a_wrong_kernel_or_launcher_fails(on_cpu, answers, match):
    with pytest.raises(Fail, match=match):
        judges.fused_kernel_judge(answers(), None)


def test_a_launcher_that_raises_is_one_line(on_cpu):
    a = _fused()
    for c in a.harness["cases"]:
        c.clear()
        c["error"] = "IndexError: list index out of range"
    with pytest.raises(Fail, match=r"^fused_bias_gelu on a \d+ x \d+ float32 input the grader drew raised IndexError: "
                                   r"list index out of range$"):
        judges.fused_kernel_judge(a, None)


def test_a_timed_section_is_checked_against_the_seed_the_grader_sent():
    """On a GPU a timed section's weighted sum must be the grader's for the seed it sent with go; the seed the
    harness reports is not read."""
    with pytest.raises(Fail, match="returned no result the grader could check"):
        judges._section_seed(Section(0.1, {"seed": 5, "checksum": 1.0}))
    assert judges._section_seed(Section(0.1, {"seed": 5}, 7)) == 7


def _second(**over):
    params = judges.second_params(None, Answers({}))
    cases_ = []
    for rows, cols, dtype, seed in params["cases"]:
        x, b, r = harness.inputs(seed, rows, cols, torch.device("cpu"), getattr(torch, dtype), extra=1)
        want = torch.relu(x + b) + r
        fused = {"launches": 1, "torch_ops": [], "out_launched": True, "is_input": False, "shape": list(want.shape),
                 "dtype": dtype, "values": want.reshape(-1).tolist()}
        cases_.append({"unfused_ops": ["add", "relu", "add"], "unfused_copies_input": False,
                       "unfused": want.reshape(-1).tolist(), "unfused_dtype": dtype, "fused": fused})
    r = {"kind": "interpreted", "missing": [], "same_kernel": False, "cases": cases_, "bytes": {"unfused": 7, "fused": 3}}
    for k, v in over.items():
        if k.startswith("case_"):
            for c in r["cases"]:
                c[k[5:]] = v
        elif k.startswith("fused_"):
            for c in r["cases"]:
                c["fused"][k[6:]] = v
        else:
            r[k] = v
    return Answers({}, inputs={"second": params}, harness=r)


def test_a_second_fusion_passes_and_each_kind_of_no_fusion_fails(on_cpu):
    assert "3 ops fused" in judges.second_fusion_judge(_second(), None)[0]
    for over, match in [({"same_kernel": True}, "the bias-GELU kernel again"),
                        ({"case_unfused_ops": ["relu"]}, "a fusion joins two or more"),
                        ({"case_unfused_copies_input": True}, "returns one of its inputs unchanged"),
                        ({"fused_launches": 0}, "did not launch SECOND_KERNEL"),
                        ({"fused_values": None}, ""),
                        ({"bytes": {"unfused": 1, "fused": 1}}, "fused < unfused"),
                        ({"missing": ["second_inputs"]}, "second_inputs is not defined")]:
        if over.get("fused_values", 0) is None:
            a = _second()
            for c in a.harness["cases"]:
                c["fused"]["values"] = [v + 1.0 for v in c["fused"]["values"]]  # the residual never reaches the kernel
            match = "differs from PyTorch"
        else:
            a = _second(**over)
        with pytest.raises(Fail, match=match):
            judges.second_fusion_judge(a, None)


# -- through a real sandbox ------------------------------------------------------------------------

def _box(tmp_path: Path, defs: str, forbid: tuple, strict: bool = True, imports=("grader.labs.multi_gpu.harness",)):
    nb = json.loads(SOURCE.read_text())
    prelude = definitions.job(nb)["prelude"]
    job = {"prelude": prelude, "definitions": [defs], "setup": "", "imports": list(imports),
           "policy": {"forbid": list(forbid), "strict": strict}}
    code = definitions.write_code(definitions.read_code(ROOT), tmp_path / "code")
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return Sandbox(job, code, tmp_path / "log", cwd=cwd)


HOSTILE = '''
from utils.parallel import distributed
def memory_per_gpu_gb(n_params, n_devices, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    return distributed.memory_per_gpu(n_params, n_devices, stage, param_bytes=weight_bytes, grad_bytes=grad_bytes,
                                      optimizer_bytes_per_param=optim_bytes)["total_gb"]
def bus_bandwidth_gbs(n_bytes, time_us, n_ranks):
    return distributed.busbw_gbs(distributed.algbw_gbs(n_bytes, time_us * 1e-6), n_ranks)
def weights_per_gpu_gb(n_params, n_layers, tp, pp, bytes_per_param=2):
    return distributed.parallel_weight_bytes_per_gpu(n_params, n_layers, tp=tp, pp=pp, bytes_per_param=bytes_per_param) / 1e9
'''


@pytest.mark.slow
def test_in_a_sandbox_calling_the_course_or_a_table_of_answers_fails(tmp_path):
    forbid = judges.MEMORY_RULES + judges.BUSBW_RULES + judges.PARALLEL_RULES
    rng = random.Random(5)
    drawn = {n: make(random.Random(rng.random()), None) for n, make in (
        ("memory_per_gpu_gb", judges.memory_cases), ("bus_bandwidth_gbs", judges.busbw_cases),
        ("weights_per_gpu_gb", judges.parallel_cases))}
    with _box(tmp_path, HOSTILE, forbid) as box:
        for name, cases_ in drawn.items():
            got = box.call(name, cases_)
            assert all("GroundTruthError" in r["error"] for r in got), got[:2]
        assert box.ground_truth[0].startswith("utils.parallel.distributed:")
    # a table: the right answers for seed 5's cases, looked up by their inputs; another seed draws others
    good = solution("memory_answer")["memory_per_gpu_gb"]
    table = {json.dumps(c): good(*c) for c in drawn["memory_per_gpu_gb"]}
    tabled = f"TABLE = {table!r}\ndef memory_per_gpu_gb(*case):\n    return TABLE.get(__import__('json').dumps(list(case)), 0.0)\n"
    other = judges.memory_cases(random.Random(6), None)
    with _box(tmp_path / "t", tabled, forbid) as box:
        same = box.call("memory_per_gpu_gb", drawn["memory_per_gpu_gb"])
        moved = box.call("memory_per_gpu_gb", other)
    judges.memory(Answers({}, calls={"memory_per_gpu_gb": [Case(True, r["ok"]) for r in same]},
                          inputs={"memory_per_gpu_gb": drawn["memory_per_gpu_gb"]}), None)
    with pytest.raises(Fail, match="memory_per_gpu_gb disagreed with the rule on 32 of 32"):
        judges.memory(Answers({}, calls={"memory_per_gpu_gb": [Case(True, r["ok"]) for r in moved]},
                              inputs={"memory_per_gpu_gb": other}), None)


@pytest.mark.slow
def test_the_kernels_run_in_a_sandbox_and_the_course_kernel_is_a_tripwire(tmp_path):
    """Strict under Triton's interpreter; on a GPU Triton's compiler starts processes, so the sandbox allows them
    (``Check.strict``), and the course's kernel is a tripwire all the same."""
    nb = json.loads(SOURCE.read_text())
    answer = src(cell(nb, "fused_answer")).split("### END SOLUTION")[0]
    fused = Answers({})
    params = judges.fused_params(None, fused)  # on a GPU: the grader's timing of the unfused ops too
    fused_inputs = fused.inputs
    strict = next(c for c in judges.CHECKS if c.cell == "test_fused_kernel").strict_sandbox
    assert strict == INTERPRETED
    with _box(tmp_path, answer, judges.FUSED_RULES, strict) as box:
        r, sections = box.harness("grader.labs.multi_gpu.harness:fused_kernel", params)
        a = Answers({}, inputs=dict(fused_inputs), harness=r, sections=sections)
        assert "matches PyTorch" in judges.fused_kernel_judge(a, None)[0]
        second = Answers({})
        sp = judges.second_params(None, second)
        r2, sections2 = box.harness("grader.labs.multi_gpu.harness:second_fusion", sp)
        second.harness, second.sections = r2, sections2
        assert "3 ops fused" in judges.second_fusion_judge(second, None)[0]
    cheat = answer + '''
def fused_bias_gelu(x, bias, block=1024):
    out = torch.empty_like(x)
    BIAS_GELU_KERNEL[(triton.cdiv(x.numel(), block),)](x, bias, out, x.numel(), x.shape[-1], BLOCK=block)
    return bias_gelu_reference(x, bias)   # the kernel launched, PyTorch's result returned
'''
    untimed = {k: v for k, v in params.items() if k != "time"}  # on a GPU its timed sections would stop the harness
    with _box(tmp_path / "c", cheat, judges.FUSED_RULES, strict) as box:
        r, _ = box.harness("grader.labs.multi_gpu.harness:fused_kernel", untimed)
        assert set(box.ground_truth) == {"utils.train.fused:bias_gelu_reference"}
    with pytest.raises(Fail, match="GroundTruthError"):
        judges.fused_kernel_judge(Answers({}, inputs={"fused": untimed}, harness=r), None)


@pytest.mark.slow
def test_the_graders_own_runs_on_this_cpu():
    """The grader's launches of the course code on two gloo processes: every one usable."""
    ref = reference.measure(made.ctx(), frozenset(("allreduce", "train", "breaks")), 1.0, {})
    assert ref.plan.backend == "gloo" and ref.plan.nproc == 2
    bws = [r["results"][-1]["busbw_gbs"] for r in ref.allreduce()]
    assert len(bws) == reference.REPEATS and all(b > 0 for b in bws)
    one, many = ref.training()
    assert one["world_size"] == 1 and many["world_size"] == 2 and 0 <= many["exposed_comm_share"] < 1
    sb = ref.scenario("small_batch")
    assert sb["config"]["batch_per_device"] == S.small_batch and 0 <= sb["exposed_comm_share"] < 1
    res = reference.zero_run(made.ctx(), reference.draw_layers(random.Random(4)))
    assert set(res["stages"]) == set(zero_memory.STAGES) and res["world_size"] == 2


@pytest.mark.slow
def test_the_grad_sync_harness_on_two_cpu_processes(tmp_path):
    """The learner's versions on two ranks (rank 0 in the sandbox), against the grader's own gradients:
    the solution passes, and a sum not divided, a forgotten last bucket, hooks on the matrices only fail."""
    nb = json.loads(SOURCE.read_text())
    answer = src(cell(nb, "grad_sync_answer"))
    cfg = judges._sync_cfg(made.CPU_PLAN, "check", 4321)
    exp = reference.sync_expected(cfg)
    wrong = answer
    for old, new in (("            p.grad.div_(ranks)\n", ""), ("    if current:\n        buckets.append(current)\n", ""),
                     ("            if p.requires_grad:", "            if p.requires_grad and p.dim() > 1:")):
        assert wrong.count(old) == 1, old
        wrong = wrong.replace(old, new)
    verdicts = {}
    for name, text in (("right", answer), ("wrong", wrong)):
        with _box(tmp_path / name, text, (), strict=False) as box:
            result, sections = box.harness("grader.labs.multi_gpu.harness:grad_sync", cfg, timeout_s=600)
        a = Answers(made.decoded("test_grad_sync", {"SYNC": made.fake_sync()}), inputs={"sync": cfg}, harness=result,
                    sections=sections)
        try:
            verdicts[name] = judges.grad_sync_check(a, None)
        except Fail as exc:
            verdicts[name] = str(exc)
    assert isinstance(verdicts["right"], list), verdicts["right"]
    msg = verdicts["wrong"]
    assert "each:" in msg and "bucketed:" in msg and "bucketed_check:" in msg and "overlapped:" in msg, msg
    assert exp["params"] == result["params"]


def test_sections_are_the_harness_labels():
    cfg = judges._sync_cfg(made.CPU_PLAN, "time", 1)
    labels = {f"{v}/{s}" for s in range(cfg["steps"]) for v in cfg["versions"]}
    assert len(labels) == cfg["steps"] * 5 and cfg["warmup"] < cfg["steps"]
    assert isinstance(Section(1.0, {}), Section)
