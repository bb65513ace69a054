"""grader.checks, grader.tamper and phase 0 record helpers, and the grader's input handling: fast, no kernels."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import pytest

from grader import checks, tamper
from grader.submissions import SubmissionError, find_submissions, read_notebook, restore_deleted_cells

ROOT = Path(__file__).resolve().parents[2]


class Times:
    def __init__(self, median, p20, p80):
        self.median_ms, self.p20_ms, self.p80_ms = median, p20, p80


# -- tamper detection -------------------------------------------------------------------------

def test_clean_environment_reports_nothing():
    import torch  # noqa: F401  (the CUDA timing calls are checked once torch is imported)

    assert tamper.tamper_report() == []


@pytest.mark.parametrize("var, value", [("GPULAB_TIER", "t4"), ("GPULAB_WEIGHTS", "random"),
                                        ("GPULAB_VLLM_PYTHON", "/tmp/not-vllm/python"),
                                        ("GPULAB_CLEAN_VALUES", "/tmp/elsewhere.jsonl")])
def test_a_notebook_that_changes_how_it_is_graded_is_caught(var, value):
    # a process started as the grader starts a kernel (GPULAB_GRADING=1): changing the tier, the
    # weights, the engine's interpreter or where the clean process's values go fails the check,
    # and the same process with nothing changed passes it
    code = ("import os, sys; from grader import tamper; tamper.assert_environment_unchanged(); print('unchanged ok')\n"
            f"os.environ[{var!r}] = {value!r}\n"
            "try:\n    tamper.assert_environment_unchanged()\nexcept AssertionError as e:\n    print(e)\n"
            "else:\n    print('not caught')")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "GPULAB_GRADING": "1", "GPULAB_VLLM_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert first == "unchanged ok"
    assert second.startswith(f"the notebook changed {var} while it was graded"), second


def test_patched_utils_function_is_caught(monkeypatch):
    import utils.timing

    monkeypatch.setattr(utils.timing, "benchmark", lambda *a, **k: None)
    assert "utils.timing.benchmark" in tamper.tamper_report()
    with pytest.raises(AssertionError, match="utils.timing.benchmark"):
        checks.assert_untampered()


def test_extra_modules_are_checked_too(monkeypatch):
    import utils.kvcache

    checks.assert_untampered(("utils.kvcache",))
    monkeypatch.setattr(utils.kvcache, "bytes_per_token", lambda *a, **k: 0)
    checks.assert_untampered()  # not among checks' own modules
    with pytest.raises(AssertionError, match="utils.kvcache.bytes_per_token"):
        checks.assert_untampered(("utils.kvcache",))
    with pytest.raises(AssertionError, match="utils.no_such_module .cannot import"):
        checks.assert_untampered(("utils.no_such_module",))


def test_agree_retries_a_miss_and_call_gives_one_line(capsys):
    misses = []

    def compare():
        if len(misses) < 2:
            misses.append(1)
            raise AssertionError("outside the band")
        return "ok"

    assert checks.agree(compare, 3) == "ok" and len(misses) == 2
    misses.clear()
    with pytest.raises(AssertionError, match="outside the band"):
        checks.agree(compare, 2)
    with pytest.raises(AssertionError, match=r"^f\(1, 'x'\) raised ZeroDivisionError: division by zero$"):
        checks.call(lambda a, b: 1 / 0, 1, "x", name="f")
    assert checks.call(lambda a: a + 1, 1, name="g") == 2


def test_patched_method_and_swapped_module_are_caught(monkeypatch):
    import utils.timing

    monkeypatch.setattr(utils.timing.TimingResult, "__str__", lambda self: "fast")
    monkeypatch.setattr(utils.timing, "time", types.SimpleNamespace(perf_counter=time.perf_counter))
    bad = tamper.tamper_report()
    assert "utils.timing.TimingResult.__str__" in bad
    assert "utils.timing.time (a module swapped for a fake)" in bad
    monkeypatch.setattr(utils.timing, "time", types.ModuleType("time"))
    assert "utils.timing.time (a module swapped for a fake)" in tamper.tamper_report()


def test_patched_clocks_are_caught(monkeypatch):
    import torch

    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() * 0.5)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", lambda self, end: 0.001)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    bad = tamper.patched_timers()
    assert {"time.perf_counter", "torch.cuda.Event.elapsed_time", "torch.cuda.synchronize"} <= set(bad)
    monkeypatch.setattr(time, "perf_counter", time.monotonic)  # another real clock under the same name
    assert "time.perf_counter" in tamper.patched_timers()


def test_rebound_constant_is_caught(monkeypatch):
    import utils.operating_point

    checks.assert_constants_unchanged(("utils.operating_point",))
    monkeypatch.setattr(utils.operating_point, "HEADROOM", 0.01)
    with pytest.raises(AssertionError, match="utils.operating_point.HEADROOM"):
        checks.assert_constants_unchanged(("utils.operating_point",))


def test_phase_loader_is_fresh_and_cannot_be_rebound():
    import sys

    import grader

    p0 = grader.phase(0)
    assert p0.checks is not checks and p0.records.checks is p0.checks and p0.checks.tamper is not tamper
    assert not any(name.startswith("_gpulab_fresh_") for name in sys.modules)
    with pytest.raises(AttributeError, match="cannot be changed"):
        grader.phase = lambda n: None


def test_a_decorated_original_is_not_a_false_alarm():
    import utils.timing

    # Stopwatch.step is a @contextmanager: the check unwraps it and finds the original code
    assert tamper.function_is_original(utils.timing.Stopwatch.__dict__["step"], utils.timing.__file__, "Stopwatch.step")


# -- numbers and bands ----------------------------------------------------------------------

def test_as_number_refuses_objects_that_compare_equal_to_anything():
    class Liar(float):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

    import numpy as np

    assert checks.as_number(np.float64(2.5), "x") == 2.5
    with pytest.raises(AssertionError, match="must be a number"):
        checks.as_number(Anything(), "x")
    with pytest.raises(AssertionError, match="must be a number"):
        checks.as_number(Liar(1.0), "x")
    with pytest.raises(AssertionError, match="finite"):
        checks.as_number(math.inf, "x")
    with pytest.raises(AssertionError):
        checks.as_label(Anything(), ("compute",), "x")


def test_band_has_a_floor_grows_with_spread_and_is_capped():
    steady, noisy, wild = Times(1.0, 0.99, 1.01), Times(1.0, 0.9, 1.1), Times(1.0, 0.5, 50.0)
    assert checks.band(steady, smoke_mode=False) == checks.GPU_BAND_FLOOR
    assert checks.band(noisy, smoke_mode=False) == pytest.approx(3 * 0.2)
    assert checks.band(wild, smoke_mode=False) == checks.GPU_BAND_CAP
    assert checks.band(wild, smoke_mode=True) == checks.SMOKE_BAND_CAP
    # smoke mode is lenient, and still fails a CPU matmul claiming 500 TFLOP/s
    rel = checks.band(wild, smoke_mode=True)
    checks.assert_in_band(0.5, 0.2, rel, "matmul_tflops", "TFLOP/s")
    with pytest.raises(AssertionError, match="re-measured"):
        checks.assert_in_band(500.0, 0.2, rel, "matmul_tflops", "TFLOP/s")


def test_plausibility_limits():
    checks.assert_not_above(790.0, 989.0, "x", "TFLOP/s", "datasheet")
    with pytest.raises(AssertionError, match="not physically possible"):
        checks.assert_not_above(1200.0, 989.0, "x", "TFLOP/s", "datasheet")
    with pytest.raises(AssertionError, match="between 0 and 100"):
        checks.assert_utilization([50.0, 101.0], "util")
    with pytest.raises(AssertionError, match="the device has"):
        checks.assert_memory(90.0, 79.1, "mem")


def test_quiet_keeps_stderr_and_warnings_out(capsys):
    with checks.quiet() as buf:
        print("to stderr", file=sys.stderr)
        warnings.warn("a warning", stacklevel=1)
        checks.say("for the learner")
    out = capsys.readouterr()
    assert out.err == "" and "to stderr" in buf.getvalue()
    assert out.out == "grader: for the learner\n"


# -- records --------------------------------------------------------------------------------

def _record(tmp_path, **fp):
    from utils.record import Record, utils_hash

    rec = Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, **fp},
                 utils_sha256=utils_hash())
    rec.add("matmul_tflops", 700.0, "TFLOP/s")
    return rec


def test_submitted_record_modes(tmp_path, monkeypatch):
    from utils.record import Record

    monkeypatch.delenv(checks.RECORD_VAR, raising=False)
    assert checks.submitted_record() is None and checks.grading_mode() == checks.LIVE
    path = tmp_path / "r.json"
    _record(tmp_path).save(path)
    monkeypatch.setenv(checks.RECORD_VAR, str(path))
    assert checks.submitted_record() is not None
    assert checks.grading_mode() == checks.RECORD  # this machine has no GPU
    Record(fingerprint={"kind": "cpu"}).save(path)
    assert checks.submitted_record() is None  # a smoke record is never graded as a GPU run
    path.write_text("{ not json")
    with pytest.raises(AssertionError, match="cannot be used"):
        checks.submitted_record()


def test_record_from_other_utils_or_unknown_gpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("GPULAB_UTILS_SHA256", raising=False)
    rec = _record(tmp_path)
    assert checks.record_spec(rec).name == "H100-SXM"
    rec.utils_sha256 = "0" * 64
    with pytest.raises(AssertionError, match="different utils"):
        checks.record_spec(rec)
    with pytest.raises(AssertionError, match="not in utils/hardware.py"):
        checks.record_spec(_record(tmp_path, name="Mystery GPU 9000"))
    with pytest.raises(AssertionError, match="more than its datasheet"):
        checks.record_spec(_record(tmp_path, memory_gib=400.0))


# -- submissions ----------------------------------------------------------------------------

def _nb(ids):
    return {"cells": [{"cell_type": "code", "source": "", "metadata": {"nbgrader": {"grade_id": i}}, "outputs": [],
                       "execution_count": None} for i in ids], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_restore_deleted_cells_keeps_released_order(tmp_path):
    import nbformat

    released = nbformat.from_dict(_nb(["a", "b", "c", "d"]))
    sub = nbformat.from_dict(_nb(["a", "c"]))
    sub.cells.insert(1, nbformat.v4.new_code_cell("scratch"))
    assert restore_deleted_cells(sub, released) == ["b", "d"]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "scratch") for c in sub.cells]
    assert ids == ["a", "b", "scratch", "c", "d"] or ids == ["a", "scratch", "b", "c", "d"]
    with pytest.raises(SubmissionError, match="no nbgrader cells"):
        restore_deleted_cells(nbformat.from_dict({**_nb([]), "cells": [{"cell_type": "markdown", "source": "", "metadata": {}}]}), released)


@pytest.mark.parametrize("text, reason", [("", "empty"), ("{oops", "not valid JSON"), ('{"a": 1}', "not a Jupyter notebook")])
def test_unreadable_notebooks_get_one_line(tmp_path, text, reason):
    p = tmp_path / "x.ipynb"
    p.write_text(text)
    with pytest.raises(SubmissionError, match=reason) as exc:
        read_notebook(p)
    assert "\n" not in str(exc.value)


def test_find_submissions_in_both_layouts(tmp_path):
    (tmp_path / "alice.ipynb").write_text("{}")
    (tmp_path / "alice.record.json").write_text("{}")
    (tmp_path / "bad name.ipynb").write_text("{}")
    nbg = tmp_path / "submitted" / "bob" / "00_foundations"
    nbg.mkdir(parents=True)
    (nbg / "00_foundations.ipynb").write_text("{}")
    (tmp_path / "submitted" / "carol" / "00_foundations").mkdir(parents=True)
    subs = {s.student_id: s for s in find_submissions(tmp_path, "00_foundations")}
    assert set(subs) == {"alice", "bad name", "bob", "carol"}
    assert subs["alice"].record is not None and subs["bob"].record is None and not subs["bob"].problem
    assert "letters, digits" in subs["bad name"].problem
    assert "expected 00_foundations.ipynb" in subs["carol"].problem


def test_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "autograde", "--assignment", "99_nope", "--submissions",
                           str(tmp_path), "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no assignment '99_nope'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(tmp_path / "missing.ipynb")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no notebook at" in proc.stderr


def test_worker_reads_modes_and_messages_from_test_cell_output(tmp_path):
    from grader.worker import cell_reports

    nb = _nb(["t1", "t2", "t3"])
    for c in nb["cells"]:
        c["metadata"]["nbgrader"]["grade"] = True
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "grader: graded from record: x\n"}]
    nb["cells"][1]["outputs"] = [{"output_type": "error", "ename": "AssertionError", "evalue": "too fast\nmore", "traceback": []}]
    nb["cells"][2]["outputs"] = [{"output_type": "stream", "name": "stderr", "text": "\nWarning: loud\n"}]
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    rep = cell_reports(p)
    assert rep["t1"]["mode"] == "graded from record"
    assert rep["t2"]["message"] == "AssertionError: too fast"
    assert rep["t3"]["message"] == "wrote to stderr: Warning: loud"
