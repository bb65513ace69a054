"""The clean process's second verdict (grader/clean_room.py; the values handed to it:
grader/clean_values.py): the tests of a graded cell run again on the learner's definitions alone,
in a process no kernel touched. Each lab's reference passes there; a wrong answer fails there
whatever its kernel did; what cannot be checked there is left to the kernel's verdict, never
failed. The grader's batch using it is in test_hostile.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import clean_room, clean_values

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
    monkeypatch.setenv(clean_values.VALUES_ENV, str(path))
    ns = {"a": 1.5, "b": {"x": [1, (2, "3")]}, "c": object(), "d": {"f": print}, "e": "x" * (clean_values.REPR_LIMIT + 1)}
    clean_values.snapshot(ns, "test_x", ("a", "b", "c", "d", "e", "missing"))
    assert json.loads(path.read_text()) == ["test_x", {"a": "1.5", "b": "{'x': [1, (2, '3')]}"}]
    monkeypatch.delenv(clean_values.VALUES_ENV)
    clean_values.snapshot(ns, "test_y", ("a",))  # outside a grading batch: nothing written, nothing raised
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


def _measured_nb(answer: str) -> dict:
    """A cell that re-measures with the grader's timer: it times the learner's ``double`` and
    checks its answer inside ``remeasure.agree``, as the labs' measured cells do."""
    timed = _cell("from grader import remeasure\n"
                  "def compare():\n    checks.timed(double, 2)\n    checks.assert_close(double(21), 42, 'double(21)')\n"
                  "remeasure.agree(compare, 2)", "test_timed", grade=True, locked=True)
    return _nb(answer, timed)


def test_a_measured_cell_is_measured_again_there(tmp_path):
    # a right answer passes whatever the machine's load: its re-measurement ran in the clean process
    found = _verdicts(tmp_path, _measured_nb("def double(x):\n    return 2 * x"))
    assert found["test_timed"] == [True, ""], found


class _Window:
    """A stand-in for ``grader.remeasure.Load`` that reports the load it is told to."""

    loaded_now = False

    def __init__(self):
        self.closed, self.loaded, self.slowdown = False, False, 1.0

    def close(self):
        self.closed, self.loaded = True, _Window.loaded_now
        return self

    def describe(self):
        return "told to be loaded" if self.loaded else "quiet"


@pytest.mark.parametrize("loaded, verdict", [(False, False), (True, None)])
def test_a_miss_measured_there_counts_only_on_a_quiet_machine(monkeypatch, loaded, verdict):
    """A wrong answer in a cell that re-measures fails there on a quiet machine; the same miss on a
    loaded one gives no verdict (the kernel's stands): the grader's own measurement may be the
    machine's. Run in this process with the load window stubbed, so the test needs no idle machine."""
    from grader import remeasure

    monkeypatch.setattr(remeasure, "Load", _Window)
    monkeypatch.setattr(_Window, "loaded_now", loaded)
    monkeypatch.setattr("grader.checks.NOISY_PAUSE_S", 0.0)
    monkeypatch.setenv(remeasure.CLEAN_ROOM_ENV, "")  # restored after the test: run() sets it
    spec = clean_room.job(_measured_nb("def double(x):\n    return x + 2"))
    found = clean_room.run(spec)
    assert found["test_timed"][0] is verdict, found
    assert "double(21)" in found["test_timed"][1]
    if loaded:
        assert "NotMeasuredHere" in found["test_timed"][1] and "told to be loaded" in found["test_timed"][1]


def test_an_answer_that_needs_a_name_this_process_lacks_gets_no_verdict(monkeypatch):
    # grader.checks.call turns the answer's NameError into an AssertionError: still not the answer's fault
    monkeypatch.setenv("GPULAB_CLEAN_ROOM", "")
    nb = _nb("def double(x):\n    return x * SCALE_FROM_A_FILE",
             _cell("checks.call(double, 3, name='double')", "test_call", grade=True, locked=True))
    found = clean_room.run(clean_room.job(nb))
    assert found["test_call"][0] is None and "NameError" in found["test_call"][1], found


def test_the_globals_an_answer_reads_are_handed_over(tmp_path):
    scale = _cell("FACTOR = int('2')", "mine")  # computed by a call: only the kernel knows it
    scale["metadata"] = {}
    nb = _nb("def double(x):\n    return x * FACTOR", scale)
    assert clean_room.job(nb)["globals"] == ["FACTOR"]
    snap = clean_room.with_snapshots(nb, nb)
    assert all("'FACTOR'" in c["source"] for c in snap["cells"] if c["source"].startswith(clean_room.SNAPSHOT_MARK))
    path = tmp_path / "values.jsonl"
    path.write_text(json.dumps(["test_double", {"FACTOR": "2"}]) + "\n")
    assert _verdicts(tmp_path, nb, values=path)["test_double"] == [True, ""]
    path.write_text(json.dumps(["test_double", {"FACTOR": "3"}]) + "\n")  # the kernel's value decides
    assert _verdicts(tmp_path, nb, values=path)["test_double"][0] is False


def test_timings_dtypes_and_devices_are_handed_over_as_their_fields(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from utils.timing import TimingResult

    t = TimingResult.from_times([1.0, 2.0, 4.0], "perf_counter")
    ns = {"sweep": {(64, 64): t}, "dt": torch.bfloat16, "dev": torch.device("cpu"), "x": torch.ones(2),
          "rates": [1.0, float("inf")]}
    path = tmp_path / "v.jsonl"
    monkeypatch.setenv(clean_values.VALUES_ENV, str(path))
    clean_values.snapshot(ns, "test_x", ("sweep", "dt", "dev", "x", "rates"))
    _, values = json.loads(path.read_text())
    assert sorted(values) == ["dev", "dt", "rates", "sweep"]  # a tensor is an object: not handed over
    import ast

    back = {k: clean_values.rebuilt(ast.literal_eval(v)) for k, v in values.items()}
    assert back["sweep"][(64, 64)] == t and back["sweep"][(64, 64)].times_ms == [1.0, 2.0, 4.0]
    assert back["dt"] is torch.bfloat16 and back["dev"] == torch.device("cpu") and back["rates"] == [1.0, float("inf")]
    with pytest.raises(ValueError, match="not a torch dtype"):  # a forged tag builds nothing else
        clean_values.rebuilt({clean_values.COURSE_TAG: "torch:dtype", "name": "save"})


def test_the_course_dataclasses_are_rebuilt_by_their_own_constructors():
    import ast

    from utils.hardware import SPECS

    row = next(iter(SPECS.values()))
    back = clean_values.rebuilt(ast.literal_eval(repr(clean_values.plain({"A100": row}))))
    assert back["A100"] == row and type(back["A100"]) is type(row)
    for forged in ("os:system", "subprocess:Popen", "utils.hardware:current_spec", "utils/../x:Y"):
        with pytest.raises((ValueError, ImportError)):
            clean_values.rebuilt({clean_values.COURSE_TAG: forged, "args": "ls"})


def test_a_check_that_reads_an_answers_source_finds_it_there(tmp_path):
    # lab 02's sync functions and lab 05's RNG hooks are written to a file for other processes:
    # the check reads their cell's source (imports included), as IPython's linecache keeps it
    # (an import the course's cells also make is kept in it: the cell's module needs it)
    answer = "from grader import checks\nimport math\ndef double(x):\n    return 2 * x"
    src = _cell("import inspect\ntext = ''.join(inspect.findsource(double)[0])\n"
                "assert 'from grader import checks' in text and 'import math' in text, text\n"
                "assert 'return 2 * x' in text, text", "test_src", grade=True, locked=True)
    assert _verdicts(tmp_path, _nb(answer, src))["test_src"] == [True, ""]


def test_an_answer_that_failed_on_a_missing_name_in_another_process_gets_no_verdict(monkeypatch):
    # a check that ran the answer as a module elsewhere (lab 02's ranks) reports the answer's error by name
    monkeypatch.setenv("GPULAB_CLEAN_ROOM", "")
    relay = _cell("raise AssertionError('your sync_each(model) raised NameError: name torch is not defined')",
                  "test_relay", grade=True, locked=True)
    found = clean_room.run(clean_room.job(_nb("def double(x):\n    return 2 * x", relay)))
    assert found["test_relay"][0] is None and "raised NameError" in found["test_relay"][1], found


def test_an_import_the_notebook_rebinds_is_handed_over_not_assumed(tmp_path):
    # lab 05 imports utils.decode, then binds decode to the measured rows: the kernel's value is the rows
    imports = _cell("from utils import decode", "setup_decode", locked=True)
    rows = _cell("decode = decode.run_rows()", "rows", locked=True)
    reads = _cell("assert decode == {1: 2.0}, decode", "test_rows", grade=True, locked=True)
    nb = _nb("def double(x):\n    return 2 * x", imports, rows, reads)
    found = _verdicts(tmp_path, nb)
    assert found["test_rows"] == [None, "reads what the notebook computed: decode"], found
    path = tmp_path / "values.jsonl"
    path.write_text(json.dumps(["test_rows", {"decode": "{1: 2.0}"}]) + "\n")
    assert _verdicts(tmp_path, nb, values=path)["test_rows"] == [True, ""]


def test_a_container_filled_in_place_is_handed_over_not_taken_as_written(tmp_path):
    # decode = {} in the answer, then a loop fills it: the literal is not what the kernel held
    fill = _cell("for b in (1, 2):\n    rows[b] = run_the_decode(b)", "fill")
    fill["metadata"] = {}
    reads = _cell("assert set(rows) == {1, 2}, rows", "test_rows", grade=True, locked=True)
    nb = _nb("rows = {}\ndef double(x):\n    return 2 * x", fill, reads)
    assert _verdicts(tmp_path, nb)["test_rows"] == [None, "reads what the notebook computed: rows"]
    path = tmp_path / "values.jsonl"
    path.write_text(json.dumps(["test_rows", {"rows": "{1: 0.5, 2: 0.7}"}]) + "\n")
    assert _verdicts(tmp_path, nb, values=path)["test_rows"] == [True, ""]
