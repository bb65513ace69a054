"""Lab 02 graded through the real command (``python -m grader autograde``), on CPU (smoke mode: every
multi-process run is two gloo processes), one batch of four notebooks:

- the reference answers (``grader.release.reference_submission`` over a release made here): full
  automatic marks, the measured cells compared with the grader's own launches;
- the untouched release (``grader.release.released_text``, made in a temporary folder): 0, each cell
  saying why;
- hostile submissions written as a learner who read the grader would: formula functions that call the
  course's implementations (with honest Triton kernels: only those points); a wrong gradient
  synchronization hidden behind a forged, self-consistent ``SYNC`` and a bus bandwidth typed in near what
  the grader measures (with an honest memory function: only those points);
- a two-H200 record beside the course-calling notebook (whose measured cells are the release's): those
  cells judged from the record, provisional, listed apart and not counted (``--count-provisional``
  counts them: ``grader/preprocessors.py``).
  An invented record (bus bandwidth above NVLink's, throughput above the datasheet) is judged in
  tests/grader/labs/test_multi_gpu.py.

Every submission runs its own notebook first (the reference launches a dozen runs), then the grader's
launches: about four minutes on two quiet cores, more when other work shares them.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from grader.labs import sizes as lab_sizes
from grader.names import RECORD_SCHEMA
from tests.grader.labs import multi_gpu_answers as made
from tests.nbcells import autograde, cell, src
from utils.measure.record import utils_hash
from utils.parallel import grad_sync

ROOT = Path(__file__).resolve().parents[3]
A = made.A
SOURCE = ROOT / "grader" / "source" / A / f"{A}.ipynb"
POINTS = {"test_memory": 2, "test_zero_memory": 2, "test_busbw": 1, "test_allreduce": 3, "test_grad_sync": 3,
          "test_sync_speed": 2, "test_sync_explanation": 2, "test_scaling": 3, "test_breaks": 2, "test_explanation": 2,
          "test_parallelism": 2, "test_fused_kernel": 2, "test_second_fusion": 1}
MEASURED = ("test_allreduce", "test_sync_speed", "test_sync_explanation", "test_scaling", "test_breaks",
            "test_explanation")
TIMEOUT_S = 900  # per cell: a bound for a stuck cell; the reference's launches take minutes on a loaded machine


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A folder holding this lab's release, made from the source by the release code (notebooks/ untouched)."""
    from grader.release import released_text

    d = tmp_path_factory.mktemp("release")
    (d / f"{A}.ipynb").write_text(released_text(A))
    return d


def _solution(gid: str) -> str:
    return src(cell(json.loads(SOURCE.read_text()), gid))


def _with(nb: dict, answers: dict) -> dict:
    for c in nb["cells"]:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers:
            c["source"] = answers[gid]
    return nb


COURSE_CALLS = {
    "memory_answer": "from utils import distributed\n\ndef memory_per_gpu_gb(n_params, n_devices, stage, weight_bytes=2, "
                     "grad_bytes=2, optim_bytes=12):\n    return distributed.memory_per_gpu(n_params, n_devices, stage, "
                     "param_bytes=weight_bytes, grad_bytes=grad_bytes, optimizer_bytes_per_param=optim_bytes)['total_gb']\n",
    "busbw_answer": "from utils.parallel.distributed import algbw_gbs, busbw_gbs\n\ndef bus_bandwidth_gbs(n_bytes, time_us, n_ranks):\n"
                    "    return busbw_gbs(algbw_gbs(n_bytes, time_us * 1e-6), n_ranks)\n",
    "parallel_answer": "import utils.parallel.distributed as D\n\ndef weights_per_gpu_gb(n_params, n_layers, tp, pp, bytes_per_param=2):\n"
                       "    return D.parallel_weight_bytes_per_gpu(n_params, n_layers, tp=tp, pp=pp, "
                       "bytes_per_param=bytes_per_param) / 1e9\n\nMIN_TP = 4\n",
}


def _forged_sync() -> str:
    """A SYNC typed in: consistent with itself, every version 'equal to DDP's', medians made up."""
    run = made.fake_sync(t={"none": 100.0, "ddp": 120.0, "each": 200.0, "bucketed": 150.0, "overlapped": 140.0})
    return (f"SYNC = {run!r}\n"
            "SYNC_VS_DDP = {v: SYNC['versions']['ddp']['median_ms'] / SYNC['versions'][v]['median_ms'] "
            "for v in ('each', 'bucketed', 'overlapped')}\n"
            "SYNC_EXPLANATION = {'fastest': 'overlapped', 'each_comm_share': 0.5, 'each_vs_ddp': SYNC_VS_DDP['each'], "
            "'cause': 'exposed_communication'}\n")


def _wrong_sync() -> str:
    text = _solution("grad_sync_answer")
    old = "            p.grad.div_(ranks)\n"
    assert text.count(old) == 1
    return text.replace(old, "")  # a sum, not a mean


def _record(invented: bool = False) -> dict:
    """What a two-H200 run of the notebook writes, measured cells only (the rest of the notebook is the release)."""
    s = lab_sizes(A, "h100")
    one = made.fake_run(s, 1, 194.0e3, backend="nccl")
    many = made.fake_run(s, 2, (252.2e3 if invented else 192.1e3), 0.01, backend="nccl")
    eff = many["tokens_per_s_per_device"] / one["tokens_per_s_per_device"]
    breaks = {"small_batch": made.fake_run(s, 2, 150e3, 0.04, backend="nccl", batch_per_device=s.small_batch),
              "p2p_disabled": made.fake_run(s, 2, 170e3, 0.09, backend="nccl", env={"NCCL_P2P_DISABLE": "1"})}
    table = made.allreduce_table(2, "nccl", s.allreduce_sizes, busbw=600.0 if invented else 327.0)
    sync = made.fake_sync("h100", {"none": 150.0, "ddp": 155.0, "each": 190.0, "bucketed": 160.0, "overlapped": 158.0},
                          backend="nccl")
    explanation = {"efficiency": eff, "exposed_comm_share": 0.01,
                   "dominant_cause": "near_linear" if eff > 0.95 else "other_overhead", "worst_break": "p2p_disabled"}
    answers = {"test_allreduce": {"allreduce": table, "BUSBW_GBS": table["results"][-1]["busbw_gbs"]},
               "test_sync_speed": {"SYNC": sync, "SYNC_VS_DDP": sync["vs_ddp"]},
               "test_sync_explanation": {"SYNC": sync, "SYNC_EXPLANATION": grad_sync.explanation(sync)},
               "test_scaling": {"one": one, "many": many, "scaling_efficiency": eff, "comm_share": 0.01},
               "test_breaks": {"BREAKS": breaks},
               "test_explanation": {"EXPLANATION": explanation, "scaling_efficiency": eff, "comm_share": 0.01,
                                    "BREAKS": breaks}}
    return {"schema": RECORD_SCHEMA, "assignment": A, "tier": "h100", "smoke": False, "dtype": "bfloat16",
            "fingerprint": {"kind": "gpu", "name": "NVIDIA H200", "memory_gib": 139.8, "compute_capability": "9.0",
                            "device_count": 2},
            "utils_sha256": utils_hash(), "written_unix": 0.0, "answers": answers, "missing": {}}


@pytest.fixture(scope="module")
def batch(tmp_path_factory, released):
    from grader.release import reference_submission

    release = json.loads((released / f"{A}.ipynb").read_text())
    subs = tmp_path_factory.mktemp("submissions")
    (subs / "reference.ipynb").write_text(json.dumps(reference_submission(A, notebooks_dir=released)))
    (subs / "release.ipynb").write_text(json.dumps(release))
    (subs / "course_calls.ipynb").write_text(json.dumps(_with(copy.deepcopy(release), {
        **COURSE_CALLS, "fused_answer": _solution("fused_answer")})))
    (subs / "forged_sync.ipynb").write_text(json.dumps(_with(copy.deepcopy(release), {
        "memory_answer": _solution("memory_answer"), "grad_sync_answer": _wrong_sync(),
        "sync_speed_answer": _forged_sync(),
        "busbw_answer": _solution("busbw_answer"),
        "allreduce_answer": "allreduce = launch.run_allreduce(PLAN)\nBUSBW_GBS = 0.45   # about what two gloo "
                            "processes reach here\n"})))
    (subs / "course_calls.record.json").write_text(json.dumps(_record()))
    out = tmp_path_factory.mktemp("graded")
    return autograde(ROOT, A, subs, out, jobs=2, timeout_s=TIMEOUT_S, wait_s=3600)


def _scores(result: dict) -> dict:
    return {c["cell"]: c["score"] for c in result["cells"] if c.get("mode") != "manual"}


def _messages(result: dict) -> dict:
    return {c["cell"]: c.get("message", "") for c in result["cells"]}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_reference_scores_full_marks_measured_live(batch):
    r = batch["results"]["reference"]
    assert r["status"] == "ok", r
    assert _scores(r) == POINTS, _messages(r)
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "measured live" for c in MEASURED), modes
    assert float(batch["rows"]["reference"]["verified_score"]) == sum(POINTS.values())


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_release_scores_zero_saying_why(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    msgs = _messages(r)
    assert all(msgs[c] for c in POINTS), msgs


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_answers_that_call_the_course_earn_only_their_honest_kernels(batch):
    r = batch["results"]["course_calls"]
    cells = {c["cell"]: c for c in r["cells"]}
    got, msgs = _scores(r), _messages(r)
    verified = {c: got[c] for c in POINTS if not cells[c].get("provisional")}
    assert verified["test_fused_kernel"] == 2 and verified["test_second_fusion"] == 1, msgs
    assert sum(verified.values()) == 3 == r["verified_score"], msgs
    for c in ("test_memory", "test_busbw", "test_parallelism", "test_zero_memory"):
        assert "course's own implementation" in msgs[c] or "GroundTruthError" in msgs[c], msgs[c]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_forged_sync_and_a_typed_bandwidth_earn_only_the_honest_memory_answer(batch):
    r = batch["results"]["forged_sync"]
    got, msgs = _scores(r), _messages(r)
    assert got["test_memory"] == 2 and got["test_zero_memory"] == 2 and got["test_busbw"] == 1, msgs
    assert sum(got.values()) == 5, msgs
    assert "BUSBW_GBS = 0.45, expected" in msgs["test_allreduce"], msgs["test_allreduce"]
    assert "each:" in msgs["test_grad_sync"] and "off by" in msgs["test_grad_sync"], msgs["test_grad_sync"]
    for c in ("test_sync_speed", "test_sync_explanation"):
        assert "while the grader timed it" in msgs[c], msgs[c]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_gpu_record_is_provisional_and_not_counted(batch):
    """The H200 record beside the course-calling notebook: its measured cells judged from the record,
    provisional, listed apart and not counted; the cells computed here stay verified."""
    measured = sum(POINTS[c] for c in MEASURED)
    row = batch["rows"]["course_calls"]
    assert float(row["provisional_score"]) == measured and float(row["verified_score"]) == 3
    assert float(row["score"]) == 3
    r = batch["results"]["course_calls"]
    cells = {c["cell"]: c for c in r["cells"]}
    assert all(cells[c].get("provisional") and cells[c]["mode"] == "graded from record" for c in MEASURED), cells
    assert not any(cells[c].get("provisional") for c in POINTS if c not in MEASURED)
