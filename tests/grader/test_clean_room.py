"""The clean process's second verdict (grader/clean_room.py): the tests of a graded cell run again
on the learner's definitions alone, in a process no kernel touched. Each lab's reference passes
there; a wrong answer fails there whatever its kernel did; what cannot be checked there is left
to the kernel's verdict, never failed. The grader's batch using it is in test_hostile.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import clean_room

ROOT = Path(__file__).resolve().parents[2]
LABS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving", "04_benchmarking_production",
        "05_hardware_and_cost")


def _cell(source: str, grade_id: str, *, grade=False, solution=False, locked=False) -> dict:
    md = {"grade_id": grade_id, "grade": grade, "solution": solution, "locked": locked, "schema_version": 3}
    return {"cell_type": "code", "execution_count": None, "id": grade_id, "metadata": {"nbgrader": md}, "outputs": [],
            "source": source}


def _nb(answer: str, *extra: dict) -> dict:
    return {"cells": [_cell("from grader import checks\nLIMIT = 3", "setup", locked=True),
                      _cell(answer, "answer", solution=True), *extra,
                      _cell("assert double(2) == 4\n### BEGIN HIDDEN TESTS\n"
                            "checks.assert_close(double(21), 42, 'double(21)')\nassert all([double(LIMIT) == 6])\n"
                            "### END HIDDEN TESTS", "test_double", grade=True, locked=True),
                      _cell("assert measured > 0", "test_measured", grade=True, locked=True)]}


def _verdicts(tmp_path: Path, nb: dict, **kw) -> dict:
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    return clean_room.verdicts(path, cwd=ROOT, **kw)


@pytest.mark.parametrize("lab", LABS)
def test_every_reference_passes_each_cell_it_can_check(lab):
    found = clean_room.verdicts(ROOT / "grader" / "source" / lab / f"{lab}.ipynb", cwd=ROOT)
    checked = {k: v for k, v in found.items() if v[0] is not None}
    assert checked, f"{lab}: no graded cell could be checked in the clean process"
    assert all(ok for ok, _ in checked.values()), checked


def test_a_wrong_answer_fails_there_and_what_ran_around_it_does_not(tmp_path):
    # the statements that would change the interpreter never run; a definition shadowing a builtin
    # (``all``) or a course name (``checks``) is left out, so the tests read what they were written for
    answer = ("import builtins\nbuiltins.AssertionError = Warning\nall = lambda xs: True\n"
              "class checks:\n    assert_close = staticmethod(lambda *a, **k: None)\n"
              "def double(x):\n    return x + 2")
    found = _verdicts(tmp_path, _nb(answer))
    assert found["test_double"][0] is False and "double(21)" in found["test_double"][1], found
    assert found["test_measured"] == [None, "reads what the notebook computed: measured"]


def test_the_right_answer_passes_from_a_cell_the_learner_added(tmp_path):
    helper = _cell("def double(x):\n    return x * 2\nmeasured = run_the_benchmark()", "mine")
    helper["metadata"] = {}  # a cell the learner added: no nbgrader metadata
    found = _verdicts(tmp_path, _nb("raise NotImplementedError()", helper))
    assert found["test_double"] == [True, ""], found
    assert found["test_measured"][0] is None  # computed by a call: not run here, left to the kernel


def test_a_constant_the_notebook_also_computes_is_not_guessed(tmp_path):
    # FACTOR = 2 here, but a later cell rebinds it from a measurement: the kernel's double used that
    later = _cell("FACTOR = measure_the_factor()", "mine")
    later["metadata"] = {}
    found = _verdicts(tmp_path, _nb("FACTOR = 2\ndef double(x):\n    return x * FACTOR", later))
    assert found["test_double"][0] is None and "FACTOR" in found["test_double"][1], found


@pytest.mark.parametrize("answer, why", [
    ("def double(x):\n    return x * FACTOR", "NameError"),  # reads a notebook global: not the answer's fault
    ("def double(x):\n    while True:\n        pass", "took over 2 s"),
    ("def double(x):\n    raise SystemExit(0)", "SystemExit"),
])
def test_what_cannot_be_checked_there_keeps_the_kernel_verdict(tmp_path, answer, why, monkeypatch):
    monkeypatch.setattr(clean_room, "CELL_TIMEOUT_S", 2)
    found = _verdicts(tmp_path, _nb(answer))
    assert found["test_double"][0] is None and why in found["test_double"][1], found


def test_a_run_that_stops_early_fails_nothing(tmp_path):
    found = _verdicts(tmp_path, _nb("import os\ndef double(x):\n    os._exit(0)"))
    assert found["test_double"][0] is None, found


def test_apply_holds_only_cells_that_passed_in_the_kernel():
    cells = [{"cell": "a", "points": 2, "score": 2.0, "mode": "-"}, {"cell": "b", "points": 1, "score": 0.0},
             {"cell": "c", "points": 1, "score": 1.0}, {"cell": "w", "points": 2, "score": 0.0, "mode": "manual"}]
    notes = clean_room.apply(cells, {"a": [False, "AssertionError: x"], "b": [False, "AssertionError: y"],
                                     "c": [None, "NameError: n"], "w": [False, ""]})
    assert [c["score"] for c in cells] == [0.0, 0.0, 1.0, 0.0] and cells[0]["kernel_score"] == 2.0
    assert "clean process" in cells[0]["message"] and "kernel_score" not in cells[1] and len(notes) == 1


def test_the_docs_name_how_many_cells_the_clean_process_checks():
    checked = total = 0
    for lab in LABS:
        nb = json.loads((ROOT / "grader" / "source" / lab / f"{lab}.ipynb").read_text())
        checked += len(clean_room.job(nb)["cells"])
        total += sum(1 for c in nb["cells"] if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade"))
    text = " ".join((ROOT / "docs" / "grading.md").read_text().split())
    assert f"{checked} of the {total} graded code cells" in text


def _values(tmp_path: Path, gid: str, **values: str) -> Path:
    path = tmp_path / "values.jsonl"
    path.write_text(json.dumps([gid, values]) + "\n")
    return path


@pytest.mark.parametrize("measured, ok", [("5.0", True), ("-1", False)])
def test_a_value_the_notebook_computed_is_handed_over_as_data(tmp_path, measured, ok):
    found = _verdicts(tmp_path, _nb("def double(x):\n    return 2 * x"), values=_values(tmp_path, "test_measured",
                                                                                        measured=measured))
    assert found["test_measured"][0] is ok, found


def test_snapshots_hand_over_plain_data_only(tmp_path, monkeypatch):
    path = tmp_path / "v.jsonl"
    monkeypatch.setenv(clean_room.VALUES_ENV, str(path))
    ns = {"a": 1.5, "b": {"x": [1, (2, "3")]}, "c": object(), "d": float("nan"), "e": "x" * (clean_room.REPR_LIMIT + 1)}
    clean_room.snapshot(ns, "test_x", ("a", "b", "c", "d", "e", "missing"))
    assert json.loads(path.read_text()) == ["test_x", {"a": "1.5", "b": "{'x': [1, (2, '3')]}"}]
    monkeypatch.delenv(clean_room.VALUES_ENV)
    clean_room.snapshot(ns, "test_y", ("a",))  # outside a grading batch: nothing written, nothing raised
    assert path.read_text().count("\n") == 1


def test_an_object_is_not_handed_over_and_the_cell_keeps_its_kernel_verdict(tmp_path):
    path = tmp_path / "values.jsonl"
    path.write_text(json.dumps(["test_measured", {}]) + "\n")  # what snapshot wrote for an object
    found = _verdicts(tmp_path, _nb("def double(x):\n    return 2 * x"), values=path)
    assert found["test_measured"][0] is None, found


def test_snapshot_cells_go_before_each_graded_cell_that_reads_something():
    nb = _nb("def double(x):\n    return 2 * x")
    out = clean_room.with_snapshots(nb, nb)
    marks = [i for i, c in enumerate(out["cells"]) if c["source"].startswith(clean_room.SNAPSHOT_MARK)]
    after = [out["cells"][i + 1]["metadata"]["nbgrader"]["grade_id"] for i in marks]
    assert after == ["test_double", "test_measured"] and len(out["cells"]) == len(nb["cells"]) + 2
    assert "('measured',)" in out["cells"][marks[1]]["source"]
    # the inserted cells are the grader's: the clean process does not read them as definitions
    assert clean_room.job(out)["definitions"] == clean_room.job(nb)["definitions"]


def test_through_the_batch_a_computed_value_is_judged_outside_the_kernel(tmp_path):
    """A tiny assignment graded by the real batch, screen off: its test reads a value the notebook
    computes. The transformer cheat passes it in the kernel; the snapshot hands the wrong value to
    the clean process, which holds the cell. The honest answer keeps its point."""
    from grader import batch
    from grader import course as C
    from grader.submissions import find_submissions

    a = "cv"
    source = _cell("import math\n### BEGIN SOLUTION\nroot = math.sqrt(16.0)\n### END SOLUTION", "answer", solution=True)
    test = _cell("assert isinstance(root, float)\n### BEGIN HIDDEN TESTS\nassert root == 4.0, f'root = {root}'\n"
                 "### END HIDDEN TESTS", "test_root", grade=True, locked=True)
    test["metadata"]["nbgrader"]["points"] = 1
    nb = {"cells": [_cell("import os", "setup", locked=True), source, test], "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}}
    (tmp_path / "src" / a).mkdir(parents=True)
    (tmp_path / "src" / a / f"{a}.ipynb").write_text(json.dumps(nb))
    root = C.make_course(tmp_path / "course", a, tmp_path / "src")
    rel = json.loads(C.released_path(root, a).read_text())
    subs = tmp_path / "subs"
    subs.mkdir()
    honest, cheat = json.loads(json.dumps(rel)), json.loads(json.dumps(rel))
    honest["cells"][1]["source"] = "import math\nroot = math.sqrt(16.0)"
    cheat["cells"][1]["source"] = ("get_ipython().input_transformers_cleanup.append(\n"
                                   "    lambda lines: ['pass\\n'] if any('assert' in ln for ln in lines) else lines)\n"
                                   "root = float(3)")
    (subs / "honest.ipynb").write_text(json.dumps(honest))
    (subs / "cheat.ipynb").write_text(json.dumps(cheat))
    results = {r["student_id"]: r for r in batch.grade_batch(a, find_submissions(subs, a), tmp_path / "out", jobs=2,
                                                             timeout_s=30, progress=False, source_dir=tmp_path / "src",
                                                             screen=False)}
    assert results["honest"]["score"] == 1 and results["honest"]["clean_room"]["checked"] == ["test_root"]
    c = results["cheat"]
    assert c["score"] == 0 and c["cells"][0]["kernel_score"] == 1 and "root = 3.0" in c["cells"][0]["message"], c


def test_a_cell_that_would_measure_again_gets_no_verdict_there(tmp_path):
    # a re-measurement differs by noise: whatever the cell announces, it is judged in the kernel only
    timed = _cell("from grader import remeasure\nremeasure.agree(lambda: None, 1)\nassert double(2) == 5",
                  "test_timed", grade=True, locked=True)
    found = _verdicts(tmp_path, _nb("def double(x):\n    return 2 * x", timed))
    assert found["test_timed"][0] is None and "NotMeasuredHere" in found["test_timed"][1], found
