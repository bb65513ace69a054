"""The grader against the phase-2 notebook, on CPU (smoke mode: two gloo processes per run).

One batch (``python -m grader autograde``): the reference solution scores full marks with its
measured cells re-measured live, and the untouched release scores zero. The hostile cases run
in this process against ``grader/phase2.py`` loaded as a hidden test loads it, and fail before
any launch: wrong memory and bandwidth arithmetic, a fabricated efficiency above 1, an edited
run, an explanation that contradicts the measured numbers, and breaks that are not their
scenario. Record mode (no GPU here, a GPU record submitted) is checked with a plausible and an
invented two-H200 record. About two and a half minutes on two cores, nearly all in the batch.
"""
from __future__ import annotations

import functools
import importlib.util
import json
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
POINTS = {"test_memory": 2, "test_busbw": 1, "test_allreduce": 3, "test_scaling": 3, "test_breaks": 2,
          "test_explanation": 2, "test_parallelism": 2}
MEASURED = ("test_allreduce", "test_scaling")
# per cell: a bound for a stuck cell, not a budget. The scaling check launches two training runs (twice, if
# the first misses the band), and a loaded CI machine makes that several times longer
# (docs/grading.md#cell-timeouts-from-the-machines-speed)
TIMEOUT_S = 600


# -- the batch: reference and release, graded for real ----------------------------------------------

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    from grader.release import reference_submission

    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")
    (subs / "reference.ipynb").write_text(json.dumps(reference_submission(ASSIGNMENT), indent=1))
    (subs / "release.ipynb").write_text(RELEASE.read_text())
    # one at a time: the reference's timed launches would otherwise share the two cores with the release's TRL run
    return autograde(ROOT, ASSIGNMENT, subs, out, jobs=1, timeout_s=TIMEOUT_S)


@pytest.mark.slow
def test_reference_scores_full_marks_measured_live(batch):
    r = batch["results"]["reference"]
    assert r["status"] == "ok"
    assert _scores(r) == POINTS, _messages(r)
    assert r["score"] == r["auto_max_score"] == sum(POINTS.values()) and r["max_score"] == r["auto_max_score"] + 2
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "measured live" for c in MEASURED), modes
    html = (batch["out"] / "feedback" / "reference" / f"{ASSIGNMENT}.html").read_text()
    assert "re-measured by the grader" in html and "2 CPU processes over gloo" in html


@pytest.mark.slow
def test_release_scores_zero(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 for c in r["cells"])
    assert float(batch["rows"]["reference"]["max_score"]) == sum(POINTS.values()) + 2  # + the written answer


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
    ns = {"PLAN": plan, "allreduce": allreduce, "BUSBW_GBS": busbw, "one": one, "many": many, "scaling_efficiency": eff,
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
    out = capsys.readouterr().out
    assert out.count("graded from record") == 4 and "NVIDIA H200" in out and "no GPU" in out


@pytest.mark.parametrize("check, match", [("allreduce", "NVLink 4"), ("scaling", "not physically possible")])
def test_invented_record_is_caught(phase2, tmp_path, check, match):
    p2 = phase2(h200_record(tmp_path, invented=True))
    calls = {"allreduce": lambda: p2.check_allreduce(None, None), "scaling": lambda: p2.check_scaling(None, None, None, None)}
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
