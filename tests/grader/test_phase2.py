"""The grader against the phase-2 notebook, on CPU (smoke mode: two gloo processes per run).

One batch (``python -m grader autograde``): the reference solution scores full marks with its
measured cells re-measured live, and the untouched release scores zero. The hostile cases run
in this process against ``grader/phase2.py`` loaded as a hidden test loads it, and fail before
any launch: wrong memory and bandwidth arithmetic, a fabricated efficiency above 1, an edited
run, an explanation that contradicts the measured numbers, and breaks that are not their
scenario. The hand-written gradient synchronization: wrong versions (a sum not divided, a
forgotten bucket, hooks on the matrices only) fail the grader's own launch; speeds, ratios and
explanations that do not follow from the run fail, before a launch or against the grader's.
The memory arithmetic against the grader's own sharded run (DDP, ZeRO-1, FSDP2 on two gloo
processes): the reference passes, and a function that forgets to divide the optimizer state,
ignores the byte widths it is passed or shards ZeRO-1's gradients fails, on the grader's run.
Record mode (no GPU here, a GPU record submitted) is checked with a plausible and an invented
two-H200 record. The batch and the two tests marked slow launch processes: minutes each on two
cores, more when other work shares them.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import linecache
from pathlib import Path

import pytest

from tests.nbcells import assert_release_clean, autograde
from tests.nbcells import cell as _cell
from tests.nbcells import messages as _messages
from tests.nbcells import scores as _scores
from tests.nbcells import src as _src
from utils import launch

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "02_multi_gpu"
SOURCE = ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_memory": 2, "test_zero_memory": 2, "test_busbw": 1, "test_allreduce": 3, "test_grad_sync": 3, "test_sync_speed": 2,
          "test_sync_explanation": 2, "test_scaling": 3, "test_breaks": 2,
          "test_explanation": 2, "test_parallelism": 2, "test_fused_kernel": 2, "test_second_fusion": 1}
MEASURED = ("test_allreduce", "test_grad_sync", "test_sync_speed", "test_scaling")
# per cell: a bound for a stuck cell, not a budget. The scaling check launches two training runs (twice, if
# the first misses the band), and a loaded CI machine makes that several times longer
# (docs/grading.md#cell-timeouts-from-the-machines-speed)
TIMEOUT_S = 600


# -- the batch: reference and release, graded for real ----------------------------------------------

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")
    (subs / "release.ipynb").write_text(RELEASE.read_text())  # the reference: graded_reference (tests/conftest.py)
    return autograde(ROOT, ASSIGNMENT, subs, out, jobs=1, timeout_s=TIMEOUT_S)


@pytest.mark.slow
def test_reference_scores_full_marks_measured_live(graded_reference):
    g = graded_reference(ASSIGNMENT)  # graded once per session, beside a busy core
    r = g["result"]
    assert r["status"] == "ok"
    assert _scores(r) == POINTS, _messages(r)
    assert r["score"] == r["auto_max_score"] == sum(POINTS.values()) and r["max_score"] == r["auto_max_score"] + 2
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "measured live" for c in MEASURED), modes
    html = g["html"]
    assert "re-measured by the grader" in html and "2 CPU processes over gloo" in html


@pytest.mark.slow
def test_release_scores_zero(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 for c in r["cells"])
    assert float(batch["rows"]["release"]["max_score"]) == sum(POINTS.values()) + 2  # + the written answer


# -- the checks, called directly --------------------------------------------------------------------

@pytest.fixture()
def phase2(phase):
    return functools.partial(phase, 2)


def fake_run(sizes, world: int, tps: float, share: float | None = None, *, backend: str = "gloo", env: dict | None = None,
             **config) -> dict:
    """A train_multi_gpu.py result at ``sizes``, internally consistent: every rank at ``tps``
    tokens/s, ``share`` of the step exposed communication."""
    cfg = {"preset": sizes.model, "batch_per_device": sizes.batch_per_device, "seq": sizes.seq_len, "steps": sizes.steps,
           "warmup": sizes.warmup, "compile": sizes.compile, "bf16": sizes.bf16, "grad_accum": 1, "no_sync_accum": False,
           **config}
    per_step = cfg["batch_per_device"] * cfg["seq"] * cfg["grad_accum"]
    ranks = []
    for r in range(world):
        med = per_step / tps * 1e3
        rank = {"rank": r, "tokens_per_s": tps, "steps": sizes.steps, "total_s": sizes.steps * per_step / tps,
                "median_ms": med, "p20_ms": med, "p80_ms": med, "peak_allocated_gib": None}
        if share is not None:
            rank["nosync_median_ms"] = med * (1 - share)
            rank["exposed_comm_share"] = max(0.0, 1 - rank["nosync_median_ms"] / med)
        ranks.append(rank)
    run = {"world_size": world, "distributed_type": ("MULTI_GPU" if backend == "nccl" else "MULTI_CPU") if world > 1 else "NO",
           "config": cfg, "tokens_per_step_per_device": per_step, "per_rank": ranks, "tokens_per_s_per_device": tps,
           "total_tokens_per_s": world * tps, "env": dict(env or {}), "peak_allocated_gib_per_rank": [None] * world}
    if share is not None:
        run["exposed_comm_share"] = max(r["exposed_comm_share"] for r in ranks)
    return run


def _reference_functions() -> dict:
    """The solution's functions, compiled from the source notebook's answer cells."""
    ns: dict = {}
    src = json.loads(SOURCE.read_text())
    for gid in ("memory_answer", "busbw_answer"):
        exec(compile(_src(_cell(src, gid)), gid, "exec"), ns)  # noqa: S102 (the course's own solution cells)
    text = _src(_cell(src, "parallel_answer")).split("\n\n\n### BEGIN SOLUTION\nMIN_TP")[0]
    exec(compile(text, "parallel_answer", "exec"), ns)  # noqa: S102
    return ns


def test_solution_functions_pass_and_wrong_arithmetic_fails(phase2):
    p2, f = phase2(), _reference_functions()
    p2.check_memory(f["memory_per_gpu_gb"])
    p2.check_busbw(f["bus_bandwidth_gbs"])
    p2.check_parallelism(f["weights_per_gpu_gb"], 4)

    def no_grad_shard(n, d, stage):  # ZeRO-2 without sharding the gradients: stage 1's numbers
        return (4 * n + 12 * n / (1 if stage == "ddp" else d)) / 1e9 if stage != "zero3" else f["memory_per_gpu_gb"](n, d, stage)
    with pytest.raises(AssertionError, match=r"memory_per_gpu_gb\(\d+, 2, 'zero2'\)"):
        p2.check_memory(no_grad_shard)
    with pytest.raises(AssertionError, match="bus_bandwidth_gbs"):
        p2.check_busbw(lambda b, t, n: b / (t * 1e-6) / 1e9)  # the algorithm bandwidth
    with pytest.raises(AssertionError, match=r"pp=3"):
        p2.check_parallelism(lambda n, layers, tp, pp, b=2: n * b / pp / tp / 1e9, 4)  # stages as if layers split evenly
    with pytest.raises(AssertionError, match="MIN_TP = 2, but 4"):
        p2.check_parallelism(f["weights_per_gpu_gb"], 2)  # 70.6 GB fits 80 GB, not the 80% rule
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        p2.check_busbw(lambda b, t, n: 1 / 0)

    def mixed_precision_only(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):  # the widths passed, ignored
        return f["memory_per_gpu_gb"](n, d, stage)
    with pytest.raises(AssertionError, match=r"memory_per_gpu_gb\(1, 2, 'zero1', 4, 4, 8\)"):
        p2.check_memory(mixed_precision_only)


# -- the memory arithmetic against the grader's own sharded run ------------------------------------

@pytest.fixture(scope="module")
def zero_run() -> dict:
    """``check_zero_memory`` on the reference function, as the hidden test calls it: one launch
    (DDP, ZeRO-1 and FSDP2 on two gloo processes) that passes, and returns the grader's run."""
    res = __import__("grader").phase(2).check_zero_memory(_reference_functions()["memory_per_gpu_gb"])
    assert res is not None, "the grader's sharded run came back unusable"
    return res


def _no_optimizer_shard(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    shards = {"ddp": (1, 1), "zero1": (1, 1), "zero2": (1, d), "zero3": (d, d)}[stage]
    return (weight_bytes * n / shards[0] + grad_bytes * n / shards[1] + optim_bytes * n) / 1e9


def _widths_ignored(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    return _reference_functions()["memory_per_gpu_gb"](n, d, stage)


def _zero1_shards_gradients(n, d, stage, weight_bytes=2, grad_bytes=2, optim_bytes=12):
    return _reference_functions()["memory_per_gpu_gb"](n, d, "zero2" if stage == "zero1" else stage, weight_bytes,
                                                       grad_bytes, optim_bytes)


@pytest.mark.slow
def test_the_reference_meets_every_rank_of_the_graders_sharded_run(zero_run):
    from utils import zero_memory

    assert zero_run["layers"] == list(__import__("grader").phase(2).ZERO_LAYERS) != list(zero_memory.LAYERS)
    assert set(zero_run["stages"]) == set(zero_memory.STAGES) and zero_run["world_size"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("wrong, match", [
    (_no_optimizer_shard, r"memory_per_gpu_gb\(34885, 2, 'zero1', 4, 4, 8\) = 0.00055816 GB"),
    (_widths_ignored, r"'zero1', 4, 4, 8\) = 0.00034885 GB \(348,850 bytes\), but rank 0 .* held 418,304 bytes"),
    (_zero1_shards_gradients, r"'zero1', 4, 4, 8\) = 0.00034885 GB .* allow 36,860 bytes either way"),
])
def test_wrong_memory_answers_fail_on_the_graders_sharded_run(zero_run, wrong, match):
    with pytest.raises(AssertionError, match=match):
        __import__("grader").phase(2).zero_memory_ok(wrong, zero_run)


@pytest.mark.slow
def test_a_wrong_answer_fails_the_hidden_tests_own_launch():
    """The whole path of the hidden test, launch included, on a function that forgets to divide the optimizer state."""
    p2 = __import__("grader").phase(2)
    with pytest.raises(AssertionError, match=r"'zero1', 4, 4, 8\) = 0.00055816 GB .* held 418,304 bytes"):
        p2.check_zero_memory(_no_optimizer_shard)


def test_fabricated_or_edited_scaling_fails_before_any_launch(phase2):
    p2 = phase2()
    s = launch.plan().sizes
    one, many = fake_run(s, 1, 1000.0), fake_run(s, 2, 800.0, 0.15)
    with pytest.raises(AssertionError, match="expected 0.8"):  # a number that does not follow from the runs
        p2.check_scaling(one, many, 1.3, 0.15)
    with pytest.raises(AssertionError, match="not physically possible"):  # runs edited consistently to beat linear
        p2.check_scaling(one, fake_run(s, 2, 1300.0, 0.15), 1.3, 0.15)
    edited = fake_run(s, 2, 800.0, 0.15)
    edited["per_rank"][1]["tokens_per_s"] = 1300.0
    with pytest.raises(AssertionError, match="its tokens over its measured time"):
        p2.check_scaling(one, edited, 0.8, 0.15)
    with pytest.raises(AssertionError, match="seq=32"):  # a smaller run than the plan's
        p2.check_scaling(one, fake_run(s, 2, 800.0, 0.15, seq=32), 0.8, 0.15)
    with pytest.raises(AssertionError, match="nosync_median_ms"):  # measure_comm left out
        p2.check_scaling(one, fake_run(s, 2, 800.0), 0.8, 0.15)
    with pytest.raises(AssertionError, match="below the 0.1"):
        p2.check_scaling(one, fake_run(s, 2, 50.0, 0.15), 0.05, 0.15)


@pytest.mark.parametrize("eff, share, cause", [(0.99, 0.0, "near_linear"), (0.96, 0.3, "near_linear"),
                                               (0.7, 0.3, "exposed_communication"), (0.7, 0.16, "exposed_communication"),
                                               (0.6, 0.05, "other_overhead")])
def test_reference_cause(phase2, eff, share, cause):
    assert phase2().records.reference_cause(eff, share) == cause


def test_explanation_must_follow_the_measurements(phase2):
    p2 = phase2()
    s = launch.plan().sizes
    breaks = {"small_batch": fake_run(s, 2, 500.0, 0.4, batch_per_device=s.small_batch),
              "accum_without_no_sync": fake_run(s, 2, 400.0, 0.55, batch_per_device=s.accum_batch,
                                                grad_accum=s.grad_accum, no_sync_accum=True)}
    good = {"efficiency": 0.7, "exposed_comm_share": 0.3, "dominant_cause": "exposed_communication",
            "worst_break": "accum_without_no_sync"}
    p2.check_explanation(good, 0.7, 0.3, breaks)
    with pytest.raises(AssertionError, match="your measurements say 'exposed_communication'"):
        p2.check_explanation({**good, "dominant_cause": "near_linear"}, 0.7, 0.3, breaks)
    with pytest.raises(AssertionError, match="your measurements say 'other_overhead'"):
        p2.check_explanation({**good, "efficiency": 0.6, "exposed_comm_share": 0.05}, 0.6, 0.05, breaks)
    with pytest.raises(AssertionError, match="'accum_without_no_sync' exposed the most"):
        p2.check_explanation({**good, "worst_break": "small_batch"}, 0.7, 0.3, breaks)
    with pytest.raises(AssertionError, match=r"EXPLANATION\['efficiency'\]"):  # numbers other than the measured ones
        p2.check_explanation({**good, "efficiency": 0.99, "dominant_cause": "near_linear"}, 0.7, 0.3, breaks)
    with pytest.raises(AssertionError, match="must be one of"):
        p2.check_explanation({**good, "dominant_cause": "the network"}, 0.7, 0.3, breaks)


def test_breaks_must_be_their_scenario(phase2):
    p2 = phase2()
    s = launch.plan().sizes
    p2.check_breaks({"small_batch": fake_run(s, 2, 500.0, 0.4, batch_per_device=s.small_batch)})
    with pytest.raises(AssertionError, match="batch_per_device=2"):  # the reference batch, not a small one
        p2.check_breaks({"small_batch": fake_run(s, 2, 500.0, 0.4)})
    with pytest.raises(AssertionError, match="no_sync_accum=False"):  # accumulation done right is not the break
        p2.check_breaks({"accum_without_no_sync": fake_run(s, 2, 500.0, 0.4, batch_per_device=s.accum_batch,
                                                           grad_accum=s.grad_accum)})
    with pytest.raises(AssertionError, match="changes nothing over gloo"):
        p2.check_breaks({"p2p_disabled": fake_run(s, 2, 500.0, 0.4, env={"NCCL_P2P_DISABLE": "1"})})
    with pytest.raises(AssertionError, match="at least one scenario"):
        p2.check_breaks({})


def test_plans(phase2, monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    phase2()
    none, one, two = launch.plan_for(0, True, "cpu"), launch.plan_for(1, False, "h100"), launch.plan_for(2, False, "h100")
    assert (none.backend, none.nproc, none.tier) == ("gloo", 2, "cpu") and "smoke" in none.note
    assert (one.backend, one.nproc, one.tier) == ("gloo", 2, "cpu") and "cannot be measured" in one.note
    assert (two.backend, two.nproc, two.tier, two.sizes.model) == ("nccl", 2, "h100", "gpt2-small")
    env = launch.launch_env(one)  # CPU processes even where a GPU is visible, multicast off everywhere
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NCCL_NVLS_ENABLE"] == "0" and env["OMP_NUM_THREADS"] >= "1"
    gpu_env = launch.launch_env(two, {"NCCL_P2P_DISABLE": 1})
    assert gpu_env["NCCL_P2P_DISABLE"] == "1" and gpu_env.get("CUDA_VISIBLE_DEVICES") != ""
    with pytest.raises(ValueError, match="nproc must be between 1 and 2"):
        launch.run_training(none, 3, "x")
    with pytest.raises(ValueError, match="unknown config"):
        launch.run_training(none, 2, "x", config="deepspeed")
    log = "Traceback (most recent call last):\n  File x\ntrain_multi_gpu.py: error: FSDP needs CUDA GPUs here\n" \
          "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \nroot cause: see above"
    assert launch.why_failed(log) == "train_multi_gpu.py: error: FSDP needs CUDA GPUs here"


def test_the_70b_count():
    from utils.model_shapes import llama_70b_params

    mod = __import__("grader").phase(2)
    assert llama_70b_params() == 70_553_706_496
    assert mod.reference_min_tp(70_553_706_496, 80) == 4


# -- record mode ------------------------------------------------------------------------------------

def h200_record(tmp_path, *, invented: bool = False) -> dict:
    """The record a two-H200 run of the notebook writes (save_record on the notebook's names),
    with plausible numbers, or invented ones (a bus bandwidth above NVLink's 450 GB/s per
    direction, per-device throughput 1.3x one GPU's)."""
    from grader import phase2_records as R
    from utils.env import phase_sizes

    grader_phase2 = importlib.util.spec_from_file_location("_p2_rec", ROOT / "grader" / "phase2.py")
    p2 = importlib.util.module_from_spec(grader_phase2)
    grader_phase2.loader.exec_module(p2)
    plan = launch.plan_for(2, False, "h100", str(tmp_path))
    s = phase_sizes(ASSIGNMENT, "h100")
    busbw = 600.0 if invented else 327.0
    rows = []
    for size, bw in ((2**20, 25.0), (2**24, 207.0), (2**28, 298.0), (2**30, busbw)):
        t_us = size / (bw * 1e9) * 1e6
        rows.append({"bytes": size, "time_us": t_us, "algbw_gbs": size / (t_us * 1e-6) / 1e9,
                     "busbw_gbs": size / (t_us * 1e-6) / 1e9})
    allreduce = {"results": rows, "world_size": 2, "backend": "nccl", "link": None, "dtype": "float32"}
    one = fake_run(s, 1, 194.0e3, backend="nccl")
    many = fake_run(s, 2, 252.2e3 if invented else 192.1e3, 0.01, backend="nccl")
    breaks = {"small_batch": fake_run(s, 2, 150e3, 0.04, backend="nccl", batch_per_device=s.small_batch),
              "p2p_disabled": fake_run(s, 2, 170e3, 0.09, backend="nccl", env={"NCCL_P2P_DISABLE": "1"})}
    eff = many["tokens_per_s_per_device"] / one["tokens_per_s_per_device"]
    from utils import grad_sync as G

    sync = fake_sync("h100", {"none": 150.0, "ddp": 155.0, "each": 190.0, "bucketed": 160.0, "overlapped": 158.0},
                     backend="nccl")
    sync_vs = G.vs_ddp(sync)
    ns = {"PLAN": plan, "allreduce": allreduce, "BUSBW_GBS": busbw, "one": one, "many": many, "scaling_efficiency": eff,
          "SYNC": sync, "SYNC_VS_DDP": {**sync_vs, "each": 3.0} if invented else sync_vs,
          "SYNC_EXPLANATION": G.explanation(sync),
          "comm_share": 0.01, "BREAKS": breaks,
          "EXPLANATION": {"efficiency": eff, "exposed_comm_share": 0.01, "dominant_cause": R.reference_cause(eff, 0.01),
                          "worst_break": "p2p_disabled"}}
    rec = R.save_record(ns, tmp_path / "r.json").to_dict()
    rec["fingerprint"] = {"kind": "gpu", "name": "NVIDIA H200", "memory_gib": 139.8, "compute_capability": "9.0",
                          "device_count": 2}
    return rec


def test_plausible_record_passes_every_record_check(phase2, tmp_path, capsys):
    p2 = phase2(h200_record(tmp_path))
    assert p2.checks.grading_mode() == p2.checks.RECORD
    p2.check_allreduce(None, None)
    p2.check_scaling(None, None, None, None)
    p2.check_breaks(None)
    p2.check_explanation(None, None, None, None)
    p2.check_sync_speed(None, None, None, None, None)
    p2.check_sync_explanation(None, None)
    out = capsys.readouterr().out
    assert out.count("graded from record") == 6 and "NVIDIA H200" in out and "no GPU" in out


@pytest.mark.parametrize("check, match", [("allreduce", "NVLink 4"), ("scaling", "not physically possible"),
                                          ("sync", r"SYNC_VS_DDP\['each'\] .*= 3, expected 0.8")])
def test_invented_record_is_caught(phase2, tmp_path, check, match):
    p2 = phase2(h200_record(tmp_path, invented=True))
    calls = {"allreduce": lambda: p2.check_allreduce(None, None), "scaling": lambda: p2.check_scaling(None, None, None, None),
             "sync": lambda: p2.check_sync_speed(None, None, None, None, None)}
    with pytest.raises(AssertionError, match=match):
        calls[check]()


def test_record_from_another_utils_or_tier_is_refused(phase2, tmp_path):
    rec = h200_record(tmp_path)
    rec["utils_sha256"] = "0" * 64
    with pytest.raises(AssertionError, match="different utils/"):
        phase2(rec).check_scaling(None, None, None, None)
    rec = h200_record(tmp_path)
    rec["fingerprint"]["compute_capability"] = "7.5"  # a T4 pair claiming the H100 tier's runs
    rec["fingerprint"].update(name="Tesla T4", memory_gib=14.6)
    with pytest.raises(AssertionError, match="uses 't4'"):
        phase2(rec).check_scaling(None, None, None, None)


# -- release ----------------------------------------------------------------------------------------

def test_release_is_current_and_leaks_nothing():
    markers = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "_p2.check_", "busiest_stage_layers")
    assert_release_clean(ASSIGNMENT, RELEASE, SOURCE, markers, POINTS)


# -- gradient synchronization by hand ---------------------------------------------------------------

def _as_cell(src: str, name: str) -> dict:
    """``src`` defined as IPython defines a cell: its lines kept in linecache under the code's file name."""
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns: dict = {}
    exec(compile(src, name, "exec"), ns)  # noqa: S102 (the course's own solution cell, or a wrong version of it)
    return ns


def _sync_cell() -> str:
    return _src(_cell(json.loads(SOURCE.read_text()), "grad_sync_answer"))


def _fns(ns: dict) -> tuple:
    return ns["sync_each"], ns["sync_bucketed"], ns["OverlappedSync"]


def fake_sync(tier: str = "cpu", t: dict | None = None, world: int = 2, backend: str = "gloo") -> dict:
    """A benchmarks/grad_sync.py result at the tier's sizes, consistent with its medians ``t``, every version right."""
    from utils import grad_sync as G

    s = G.sizes(tier)
    t = t or {"none": 100.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 140.0}
    # gradient tensors, bytes, the largest, bucketed calls: GPT-2 tiny at 0.5 MB buckets, GPT-2 small at 25 MB
    n, total, largest, buckets = (28, 3_946_496, 2_097_152, 6) if s.preset == "gpt2-tiny" else (148, 497_759_232, 154_389_504, 22)
    run = {"benchmark": "grad_sync", "world_size": world, "backend": backend,
           "config": {"preset": s.preset, "batch": s.batch, "seq": s.seq, "steps": s.steps, "warmup": s.warmup, "seed": 0,
                      "bucket_mb": s.bucket_mb, "check_bucket_mb": None, "dtype": "float32"},
           "grad_tensors": n, "grad_bytes": total, "largest_grad_bytes": largest,
           "versions": {v: {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "runs": s.steps, "per_rank_median_ms": [ms] * world}
                        for v, ms in t.items()},
           "grads": {v: {"match": True, "worst_rel_err": 0.0, "worst_param": "", "rank": 0, "steps_checked": 10}
                     for v in G.LEARNER_VERSIONS},
           "calls": {"each": {"calls": n, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "bucketed": {"calls": buckets, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "overlapped": {"calls": n, "bytes": total, "max_call_bytes": largest, "in_backward": n}},
           "learner_versions": list(G.LEARNER_VERSIONS)}
    run["vs_ddp"] = G.vs_ddp(run)
    run["exposed_comm_share"] = {v: G.exposed_share(run, v) for v in G.LEARNER_VERSIONS}
    return run


# each a kind of wrong synchronization, made from the solution: a sum not divided by the world size, a
# bucketing that forgets its last (partial) bucket, hooks only on the weight matrices (biases and norms left local)
WRONG_SYNC = (("            p.grad.div_(ranks)\n", ""),
              ("    if current:\n        buckets.append(current)\n", ""),
              ("            if p.requires_grad:", "            if p.requires_grad and p.dim() > 1:"))


@pytest.mark.slow
def test_wrong_gradient_syncs_fail_the_graders_own_run(phase2):
    src = _sync_cell()
    for old, new in WRONG_SYNC:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    p2 = phase2()
    # the learner's own run made to look right: the grader's run with other weights, batches and buckets still fails
    with pytest.raises(AssertionError) as err:
        p2.check_grad_sync(*_fns(_as_cell(src, "<wrong-sync-cell>")), fake_sync())
    msg = str(err.value)
    assert "each: gradients differ from DDP's" in msg and "bucketed: gradients differ" in msg, msg
    assert "bucketed_check: gradients differ" in msg and "overlapped: gradients differ" in msg, msg


def test_sync_answers_that_do_not_follow_from_the_run_fail_before_any_launch(phase2):
    p2, ref = phase2(), _as_cell(_sync_cell(), "<grad_sync_answer-1>")
    run = fake_sync()
    vs = dict(run["vs_ddp"])
    with pytest.raises(AssertionError, match=r"SYNC_VS_DDP\['each'\]"):  # DDP's speed over each's, inverted
        p2.check_sync_speed(*_fns(ref), run, {**vs, "each": 1 / vs["each"]})
    with pytest.raises(AssertionError, match="exactly the keys"):
        p2.check_sync_speed(*_fns(ref), run, {"each": vs["each"]})
    edited = fake_sync()
    edited["grads"]["bucketed"].update(match=False, worst_param="transformer.wte.weight", worst_rel_err=0.5)
    with pytest.raises(AssertionError, match="bucketed: gradients differ"):  # the learner's own run shows a wrong version
        p2.check_grad_sync(*_fns(ref), edited)
    with pytest.raises(AssertionError, match="bucket_mb=2.0"):  # a run at another bucket than the plan's
        small = fake_sync()
        small["config"]["bucket_mb"] = 2.0
        p2.check_grad_sync(*_fns(ref), small)
    with pytest.raises(AssertionError, match="the sync functions cannot be run: pass sync_bucketed itself"):
        p2.check_grad_sync(ref["sync_each"], ref["sync_each"], ref["OverlappedSync"], run)


@pytest.mark.parametrize("t, cause", [({"none": 100.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 140.0},
                                       "exposed_communication"),
                                      ({"none": 190.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 160.0},
                                       "other_overhead"),
                                      ({"none": 100.0, "ddp": 120.0, "each": 123.0, "bucketed": 126.0, "overlapped": 130.0},
                                       "as_fast_as_ddp")])
def test_sync_explanation_must_follow_the_medians(phase2, t, cause):
    from utils import grad_sync as G

    p2, run = phase2(), fake_sync(t=t)
    good = G.explanation(run)
    assert good["cause"] == cause
    p2.check_sync_explanation(good, run)
    for wrong in set(G.GAP_CAUSES) - {cause}:
        with pytest.raises(AssertionError, match=f"your medians say '{cause}'"):
            p2.check_sync_explanation({**good, "cause": wrong}, run)
    slowest = max(G.LEARNER_VERSIONS, key=lambda v: t[v])
    with pytest.raises(AssertionError, match="has the shortest median step"):
        p2.check_sync_explanation({**good, "fastest": slowest}, run)
    with pytest.raises(AssertionError, match=r"each_comm_share"):  # the share of DDP's step, not each's
        p2.check_sync_explanation({**good, "each_comm_share": 1 - t["none"] / t["ddp"]}, run)
    with pytest.raises(AssertionError, match="must be one of"):
        p2.check_sync_explanation({**good, "cause": "the network"}, run)


@pytest.mark.slow
def test_sync_speeds_far_from_the_graders_fail(phase2):
    p2, ref = phase2(), _as_cell(_sync_cell(), "<grad_sync_answer-2>")
    # a run edited to make the per-parameter version ten times slower against DDP than it is, consistent with itself
    run = fake_sync(t={"none": 100.0, "ddp": 120.0, "each": 2400.0, "bucketed": 150.0, "overlapped": 140.0})
    with pytest.raises(AssertionError, match=r"SYNC_VS_DDP\['each'\] = 0.05"):
        p2.check_sync_speed(*_fns(ref), run, run["vs_ddp"])
