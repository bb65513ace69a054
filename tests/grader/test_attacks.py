"""Attacks by a learner who has read the grader, one per class, through the real ``autograde`` and
``check`` on lab 00 (smoke mode, CPU). Each scores no more than the honest part of its work.

The classes (docs/grading.md, "The trust model"): 1. shared interpreter state, 2. reading the grader's
expectation, 3. values that lie, 4. screened bytes that are not the graded bytes, 5. the course's own
implementation as the answer, 6. measurements typed in rather than measured, 7. a forged record. Beside
them, the kernel tricks that fooled the in-kernel grader before (hooks that clear a failing test, a
displayed number read as partial credit, an input transformer that skips every test, scores written
into the course copy's gradebook, a process left running, duplicated cells, the grader edited on disk).

One batch, two jobs: about 4 minutes on the 2-core test machine (12 notebooks of about 35 s each).
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from grader import labs
from grader.judging import Context
from grader.names import RECORD_SCHEMA
from grader.release import reference_submission
from tests.grader.labs import foundations_answers as made
from tests.nbcells import autograde, cell, gid, messages, scores
from utils.device import hardware
from utils.measure.record import utils_hash

ROOT = Path(__file__).resolve().parents[2]
A = "00_foundations"
RELEASE = ROOT / "notebooks" / f"{A}.ipynb"
RULES = {"test_intensity": 1.0, "test_rates": 2.0, "test_bound": 2.0, "test_quantization": 2.0}
MEASURED = {"test_matmul": 2.0, "test_memory": 2.0, "test_roofline": 2.0, "test_training": 2.0, "test_limiter": 2.0,
            "test_sweep": 3.0}
AUTO = sum(RULES.values()) + sum(MEASURED.values())

pytestmark = pytest.mark.slow


def scratch(code: str, cid: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [], "source": code}


def after(nb: dict, grade_id: str, code: str, cid: str = "mine") -> dict:
    i = next(i for i, c in enumerate(nb["cells"]) if gid(c) == grade_id)
    nb["cells"].insert(i + 1, scratch(code, cid))
    return nb


def answer(nb: dict, grade_id: str, code: str) -> dict:
    cell(nb, grade_id)["source"] = code
    return nb


def release() -> dict:
    return json.loads(RELEASE.read_text())


# 1. shared interpreter state: stdlib, course and grader objects patched through plain aliases
SHARED_STATE = """import math as _m, builtins as _b, json as _j
from grader import checks as _c, answers as _a
m = _m; m.isclose = lambda *a, **k: True
c = _c; c.assert_close = lambda *a, **k: None; c.assert_positive = lambda *a, **k: 1.0
b = _b; b.abs = lambda x: 0
t = timing; t.benchmark = lambda *a, **k: None
a = _a; a.encode = lambda value, depth=0: 1.0   # every answer the kernel exports would read 1.0
j = _j; j.dumps = lambda *a, **k: '{"cell": "test_matmul", "values": {}, "missing": [], "errors": {}}'"""

# 2. reading the grader's expectation from the calling frames and the globals
PEEK = """import sys

def _peek(default=0.0):
    f = sys._getframe(2)
    while f is not None:
        for scope in (f.f_locals, f.f_globals):
            for name in ("want", "expected", "expect", "right", "reference"):
                if name in scope:
                    return scope[name]
        f = f.f_back
    return default

def arithmetic_intensity(flops, bytes_moved):
    return _peek()

def achieved_tflops(flops, time_ms):
    return _peek()

def achieved_bandwidth_gbs(bytes_moved, time_ms):
    return _peek()

def classify_bound(intensity, achieved_tflops, peak_tflops, bandwidth_gbs):
    return _peek("memory")"""

# 3. values that lie: a float whose comparisons always agree, functions that return one
LIARS = """class Yes(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    __hash__ = float.__hash__

def arithmetic_intensity(*a): return Yes(1.0)
def achieved_tflops(*a): return Yes(1.0)
def achieved_bandwidth_gbs(*a): return Yes(1.0)
def classify_bound(*a): return Yes(1.0)
matmul_tflops = matmul_flops = matmul_bytes = copy_gbs = ew_gbs = ew_tflops = ew_flops = ew_bytes = Yes(1.0)"""

# 5. the course's own implementation as the answer, on this thread and another
GROUND_TRUTH = """import threading
from utils.measure import matmul_sweep as _ms
from utils.measure.flops import arithmetic_intensity as _ai, bound as _bd
from utils.units import gb_per_s as _gb, tflop_per_s as _tf

def arithmetic_intensity(flops, bytes_moved):
    return _ai(flops, bytes_moved)

def achieved_tflops(flops, time_ms):
    return _tf(flops, time_ms)

def achieved_bandwidth_gbs(bytes_moved, time_ms):
    return _gb(bytes_moved, time_ms)

def classify_bound(intensity, achieved_tflops, peak_tflops, bandwidth_gbs):
    out = []
    t = threading.Thread(target=lambda: out.append(_bd(intensity, peak_tflops, bandwidth_gbs, achieved_tflops)))
    t.start(); t.join()
    return out[0]"""

GROUND_TRUTH_QUANT = """def quantization(m, n, sm_count, tile=128):
    q = _ms.quantization(m, n, 8, sm_count, 2)
    return q.tiles, q.waves, q.useful_fraction

def predict_slow(m, n, k, sm_count, dtype_bytes):
    return _ms.predicted_slow(m, n, k, sm_count, dtype_bytes)"""

# 6. measurements typed in, consistent with their made-up timings, with a huge claimed spread
TYPED = """from dataclasses import dataclass

@dataclass
class T:
    median_ms: float
    p20_ms: float = 1e-9
    p80_ms: float = 1e9
    runs: int = 100
    method: str = "CUDA events, 100 runs"

matmul_flops, matmul_bytes = 2 * n**3, 3 * n * n * a.element_size()
matmul_time = T(matmul_flops / 1e-5 / 1e9)     # 1e-5 TFLOP/s: far below what the grader measures
matmul_tflops = matmul_flops / (matmul_time.median_ms * 1e-3) / 1e12"""

# 4. the submission rewrites its own file in the course copy with full answers, then kills its kernel
REWRITE_AND_DIE = """import os, pathlib
_marker = pathlib.Path({marker!r})
if not _marker.exists():
    _marker.write_text("once")
    _root = next(p for p in pathlib.Path.cwd().parents if (p / "submitted").is_dir())
    for _f in _root.glob("submitted/*/00_foundations/00_foundations.ipynb"):
        _f.write_text({answered!r})
    os._exit(1)"""

KERNEL_TRICKS = """from IPython.display import clear_output
import pathlib, sqlite3
def _hide(result):
    if result.error_in_exec is not None:
        result.error_in_exec = None
        clear_output()
get_ipython().events.register("post_run_cell", _hide)
get_ipython().events.register("pre_run_cell", lambda info: get_ipython().displayhook(1))
get_ipython().input_transformers_cleanup.append(
    lambda lines: ["pass\\n"] if any("assert" in ln or "checks." in ln for ln in lines) else lines)
_db = next(p / "gradebook.db" for p in pathlib.Path.cwd().parents if (p / "gradebook.db").is_file())
with sqlite3.connect(_db) as _c:
    _c.execute("update grade set extra_credit = 5, manual_score = 9, auto_score = 9")"""

DAEMON = """import subprocess
_p = subprocess.Popen(["sleep", "300"], start_new_session=True)
print("daemon pid", _p.pid)"""

EDIT_GRADER = """import grader.labs.foundations.judges as _j, pathlib
pathlib.Path(_j.__file__).write_text("CHECKS = []\\n")"""


def forged_record() -> dict:
    """A T4 record of lab 00 made by hand, consistent and below the datasheet everywhere: nothing in it
    was measured."""
    spec = hardware.spec_for_name("Tesla T4")
    ctx = Context(A, "t4", labs.load(A).sizes("t4"), False, "cuda", "Tesla T4", spec, "float16")
    rates = {"matmul": 40.0, "copy": 250.0, "ew": 240.0, "thin": 20.0, "tiny": 1e-6, "tokens_per_s": 4000.0,
             "sweep": 40.0}
    return {"schema": RECORD_SCHEMA, "assignment": A, "tier": "t4", "smoke": False, "dtype": "float16",
            "fingerprint": {"kind": "gpu", "name": "Tesla T4", "memory_gib": 14.6, "compute_capability": "7.5"},
            "utils_sha256": utils_hash(), "written_unix": 1.7e9, "missing": {},
            "answers": made.answers(ctx, rates, step_bytes=3 * 10**9)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs, out = tmp_path_factory.mktemp("subs"), tmp_path_factory.mktemp("out")
    marker = Path(tmp_path_factory.mktemp("marker")) / f"died-{uuid.uuid4().hex}"
    answered = reference_submission(A)

    def put(name: str, nb: dict) -> None:
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))

    put("reference", answered)
    put("release", release())
    put("a1_shared_state", after(release(), "device", SHARED_STATE))
    put("a2_reads_expectation", answer(release(), "roofline_functions", PEEK))
    put("a3_values_that_lie", after(release(), "roofline_functions", LIARS))
    put("a4_rewrites_and_dies", after(release(), "device", REWRITE_AND_DIE.format(marker=str(marker),
                                                                                  answered=json.dumps(answered))))
    gt = copy.deepcopy(answered)
    answer(gt, "roofline_functions", GROUND_TRUTH)
    answer(gt, "quantization_answer", GROUND_TRUTH_QUANT)
    put("a5_ground_truth", gt)
    put("a6_typed_in", answer(release(), "matmul_answer", TYPED))
    put("a7_forged_record", release())
    (subs / "a7_forged_record.record.json").write_text(json.dumps(forged_record()))
    put("kernel_tricks", after(release(), "device", KERNEL_TRICKS))
    dup = after(copy.deepcopy(answered), "device", DAEMON)
    dup["cells"].append(copy.deepcopy(cell(dup, "test_matmul")))  # Jupyter's copy and paste
    put("daemon_and_duplicates", dup)
    put("edits_grader", after(release(), "device", EDIT_GRADER))
    run = autograde(ROOT, A, subs, out, jobs=2, timeout_s=240, wait_s=2400)
    pids = [int(p) for p in re.findall(r"daemon pid (\d+)", (out / "autograded" / "daemon_and_duplicates" /
                                                             f"{A}.ipynb").read_text())]
    yield run | {"pids": pids, "marker": marker}
    import psutil

    for pid in pids:  # only if the grader failed to
        try:
            p = psutil.Process(pid)
            if p.cmdline()[:2] == ["sleep", "300"]:
                p.kill()
        except psutil.Error:
            pass


def total(graded, student: str) -> float:
    return float(graded["rows"][student]["score"])


def test_controls_reference_full_marks_release_zero(graded):
    r = graded["results"]["reference"]
    assert scores(r) == {**RULES, **MEASURED}, messages(r)
    assert total(graded, "release") == 0


def test_1_shared_interpreter_state_changes_nothing_the_judge_sees(graded):
    r = graded["results"]["a1_shared_state"]
    assert total(graded, "a1_shared_state") == 0, messages(r)


def test_2_the_expectation_is_nowhere_a_learner_can_read(graded):
    r = graded["results"]["a2_reads_expectation"]
    assert total(graded, "a2_reads_expectation") == 0, messages(r)
    assert "hidden cases" in messages(r)


def test_3_values_that_lie_arrive_as_objects_and_earn_nothing(graded):
    r = graded["results"]["a3_values_that_lie"]
    assert total(graded, "a3_values_that_lie") == 0
    assert "Yes object" in messages(r)


def test_4_every_attempt_grades_the_screened_bytes(graded):
    r = graded["results"]["a4_rewrites_and_dies"]
    assert graded["marker"].exists(), "the attack did not run"
    assert total(graded, "a4_rewrites_and_dies") == 0, messages(r)
    assert "graded again from the start" in r["status"] and r.get("needs_review")
    assert graded["rows"]["a4_rewrites_and_dies"]["needs_review"] == "yes"


def test_5_the_courses_implementation_earns_nothing_the_honest_rest_keeps_its_points(graded):
    r = graded["results"]["a5_ground_truth"]
    got = scores(r)
    assert {c: got[c] for c in RULES} == dict.fromkeys(RULES, 0.0), messages(r)
    assert {c: got[c] for c in MEASURED} == MEASURED, messages(r)
    assert "the course's own implementation" in messages(r)


def test_6_typed_in_measurements_fail_whatever_spread_they_claim(graded):
    r = graded["results"]["a6_typed_in"]
    assert total(graded, "a6_typed_in") == 0
    assert "the grader measured" in next(c["message"] for c in r["cells"] if c["cell"] == "test_matmul")


def test_7_a_forged_record_is_provisional_and_counts_only_when_the_instructor_says(graded, tmp_path):
    row = graded["rows"]["a7_forged_record"]
    assert float(row["score"]) == 0 and float(row["verified_score"]) == 0
    assert float(row["provisional_score"]) == sum(MEASURED.values())
    nb = tmp_path / f"{A}.ipynb"
    nb.write_text(json.dumps(release()))
    (tmp_path / f"{A}.record.json").write_text(json.dumps(forged_record()))
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(nb), "--count-provisional", "--json-out",
                           str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["score"] == sum(MEASURED.values()) and res["provisional_score"] == sum(MEASURED.values()), proc.stdout
    assert "provisional" in proc.stdout
    judged = [c for c in res["cells"] if c.get("mode") != "manual"]  # where the time went, per judged cell
    assert res["grading_s"] > 0 and all(c["judge_s"] >= 0 for c in judged) and res["calls_s"] >= 0
    assert sum(c["judge_s"] for c in judged) + res["calls_s"] <= res["grading_s"] and "time: " in proc.stdout


def test_kernel_tricks_earn_nothing(graded):
    assert total(graded, "kernel_tricks") == 0, messages(graded["results"]["kernel_tricks"])


def test_a_process_left_running_is_killed_and_duplicated_cells_are_graded(graded):
    import psutil

    assert graded["pids"], "the notebook did not start its process"
    for pid in graded["pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert total(graded, "daemon_and_duplicates") == AUTO


def test_editing_the_grader_on_disk_changes_no_verdict(graded):
    r = graded["results"]["edits_grader"]
    assert total(graded, "edits_grader") == 0
    assert "changed the course's own files" in r["status"]
    assert (ROOT / "grader" / "labs" / "foundations" / "judges.py").read_text().count("Check(") >= 10
