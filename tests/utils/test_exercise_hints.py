"""The one-line hints of utils/course/exercise_hints.py: which exercise defines each name, and a released
notebook run top to bottom before its exercises are done.

The map is checked against the source notebooks (grader/source/, where the solutions are typed in):
every name a lab's answers spec reads belongs to the cell that binds it there. The notebook runs
are the released lab 00 (two of its exercises solved, from the source) and lab 04, in smoke mode on
this machine's CPU, each cell run even after one fails (nbclient ``allow_errors``), with a learner's
typo and a learner's own NotImplementedError appended.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

from grader import labs
from tests.nbcells import gid, src
from utils.course import bootstrap
from utils.course import exercise_hints as H

ROOT = Path(__file__).resolve().parents[2]
LABS = tuple(labs.REGISTRY)
CELL_TIMEOUT_S = 300
SOLVED = ("roofline_functions", "matmul_answer")  # lab 00's exercises the run types in from the source
TYPO = "print(matmul_tflopz)"  # a name no exercise defines
OWN_RAISE = 'raise NotImplementedError("my own")'  # a learner's scratch cell


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def released(lab: str) -> dict:
    return _nb(ROOT / "notebooks" / f"{lab}.ipynb")


def source(lab: str) -> dict:
    return _nb(ROOT / "grader" / "source" / lab / f"{lab}.ipynb")


def solution(c: dict) -> bool:
    return bool(c.get("metadata", {}).get("nbgrader", {}).get("solution"))


# -- the map -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("lab", LABS)
def test_every_answer_name_maps_to_the_cell_that_binds_it(lab):
    m = H.load(lab, ROOT)
    first, kind = {}, {}
    for c in source(lab)["cells"]:
        if c["cell_type"] == "code":
            kind[gid(c)] = "exercise" if solution(c) else "course"
            for name in H.scan(src(c))[0]:
                first.setdefault(name, gid(c))
    checked = 0
    for cell, specs in labs.load(lab).answers.items():
        for name, answer in specs.items():
            if answer.expr != name:  # a projection (monitor.summary()): its name is no variable
                continue
            assert name in first, f"{lab} {cell}: no cell of the source binds {name}"
            if kind[first[name]] == "exercise":
                assert m.owner.get(name) == first[name], (lab, cell, name, m.owner.get(name))
            else:
                assert m.course_defs.get(name) == first[name], (lab, cell, name, m.course_defs.get(name))
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("lab", LABS)
def test_each_exercise_is_found_and_its_stubs_are_what_the_source_fills_in(lab):
    m = H.load(lab, ROOT)
    rel = [c for c in released(lab)["cells"] if c["cell_type"] == "code" and solution(c)]
    assert [gid(c) for c in rel] == list(m.exercises)
    by_id = {gid(c): c for c in source(lab)["cells"]}
    for c in rel:
        g = gid(c)
        answer = src(by_id[g])
        binds = H.scan(answer)[0]
        assert m.exercises[g].stubs <= binds, (g, m.exercises[g].stubs - binds)
        assert m.exercises[g].heading, g
        # the released cell, the answered one, and the cell Jupyter names by id are told apart from course cells
        assert m.which_cell(src(c)) == ("exercise", g)
        assert m.which_cell(answer) == ("exercise", g)
        assert m.which_cell("x = 1", cell_id=g) == ("exercise", g)
    for c in released(lab)["cells"]:
        if c["cell_type"] == "code" and not solution(c) and src(c).strip():
            assert m.which_cell(src(c))[0] == "course", gid(c)
    assert m.which_cell("print('scratch')") == ("other", None)


def test_a_stub_is_told_from_a_body():
    ns: dict = {}
    exec('def stub(x):\n    """doc"""\n    # YOUR CODE HERE\n    raise NotImplementedError()\n'  # noqa: S102
         "def body(x):\n    return x + 1\n"
         "def guarded(x):\n    if x < 0:\n        raise NotImplementedError('negative')\n    return abs(x)\n", ns)
    assert H.is_stub(ns["stub"])
    assert not H.is_stub(ns["body"]) and not H.is_stub(ns["guarded"])


def test_the_line_for_each_case():
    m = H.load("00_foundations", ROOT)
    hints = H.Hints(m)
    matmul = m.exercises["matmul_answer"]
    course = ("course", "test_matmul")

    hints.cell = course
    assert hints.line(NameError("x", name="matmul_tflopz"), None, {}) is None  # a typo: the traceback
    line = hints.line(NameError("x", name="matmul_tflops"), None, {})
    assert line and matmul.label in line and "matmul_tflops" in line
    hints.cell = ("exercise", "matmul_answer")
    assert hints.line(NameError("x", name="matmul_tflops"), None, {}) is None  # the learner's own cell
    hints.cell = ("other", None)
    assert matmul.label in hints.line(NameError("x", name="matmul_tflops"), None, {})

    # a name a course cell binds: named by the open exercise it waits for, or the traceback once all are done
    hints.cell = ("course", "roofline_plot")
    line = hints.line(NameError("x", name="PEAK_TFLOPS"), None, {})
    assert line and m.exercises["roofline_functions"].label in line
    finished = {n: 1.0 for g in m.needs[m.course_defs["PEAK_TFLOPS"]] for n in m.exercises[g].names}
    finished.update({n: (lambda *a: 1.0) for n in m.exercises["roofline_functions"].stubs})
    assert hints.line(NameError("x", name="PEAK_TFLOPS"), None, finished) is None


@pytest.mark.parametrize("lab, course_cell, exercise, error", [
    ("01_single_gpu", "report", "optimized_answer", KeyError("optimized (yours)")),  # a row the exercise's cell adds
    ("02_multi_gpu", "grad_sync_run", "grad_sync_answer", RuntimeError("rank 0 exited with code 1")),  # a child ran the stub
    ("05_hardware_and_cost", "resume_run", "rng_answer", RuntimeError("the resumed run failed")),
])
def test_any_error_in_a_course_cell_waiting_on_an_open_exercise_names_it(lab, course_cell, exercise, error):
    m = H.load(lab, ROOT)
    assert exercise in m.needs[course_cell]
    hints = H.Hints(m)
    hints.cell = ("course", course_cell)
    line = hints.line(error, None, {})
    assert line and m.exercises[exercise].label in line and type(error).__name__ in line and str(error).strip("'") in line
    finished = {n: 1.0 for g in m.needs[course_cell] for n in m.exercises[g].names}
    finished.update({n: (lambda *a: 1.0) for g in m.needs[course_cell] for n in m.exercises[g].stubs})
    assert hints.line(error, None, finished) is None  # every exercise it needs is done: a real error, its traceback
    hints.cell = ("other", None)
    assert hints.line(error, None, {}) is None  # a learner's own cell: their own error


def test_a_cell_that_fills_in_a_name_is_needed_by_the_cells_that_read_it():
    assert H._changed('rows["x"] = 1\ncfg.a.b = 2\nd[k][j] += 3\ndel cache["old"]\n'
                      "def f():\n    local[0] = 1\nplain = 4\n") == {"rows", "cfg", "d", "cache"}
    nb = {"cells": [
        {"cell_type": "code", "source": "rows = {}", "metadata": {}, "id": "c0"},
        {"cell_type": "markdown", "source": "## Exercise: fill the row", "metadata": {}},
        {"cell_type": "code", "source": "# YOUR CODE HERE\nraise NotImplementedError()\nrows['mine'] = row",
         "metadata": {"nbgrader": {"solution": True, "grade_id": "row_answer"}}, "id": "c1"},
        {"cell_type": "code", "source": "print(rows['mine'])", "metadata": {}, "id": "c2"},
        {"cell_type": "code", "source": "print(len(rows))", "metadata": {}, "id": "c3"},
    ]}
    m = H.build(nb)
    assert m.needs["c2"] == m.needs["c3"] == ("row_answer",) and m.needs["c0"] == ()


def test_setup_turns_the_hints_on_except_under_a_grader(monkeypatch):
    calls = []
    kw = dict(install=lambda r: None, has=lambda m: True, cuda=lambda: False, serve_extras_missing=lambda: False,
              vllm_line=lambda: "", out=lambda line: None, hints=lambda lab, repo: calls.append((lab, repo)))
    monkeypatch.delenv(bootstrap.GRADING_VAR, raising=False)
    bootstrap.setup("00_foundations", ROOT, **kw)
    assert calls == [("00_foundations", ROOT)]
    monkeypatch.setenv(bootstrap.GRADING_VAR, "1")
    bootstrap.setup("00_foundations", ROOT, **kw)
    assert calls == [("00_foundations", ROOT)]


def test_install_outside_ipython_does_nothing():
    assert H.install("00_foundations", ROOT) is None


# -- a released notebook, run top to bottom --------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory) -> str:
    """A kernel spec for this interpreter, found first (as tests/integration/test_colab_kaggle.py)."""
    home = tmp_path_factory.mktemp("jupyter")
    spec = home / "kernels" / "gpulab-hints"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "hints", "language": "python"}))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(home)
    yield "gpulab-hints"
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


def run(lab: str, tmp: Path, kernel: str, solved: tuple[str, ...] = ()) -> tuple[nbformat.NotebookNode, dict]:
    """The released ``lab`` (``solved`` exercises typed in from the source), a typo cell and a scratch cell
    appended, run in ``tmp`` in smoke mode with every cell run: ``(notebook, {cell index: reply status})``."""
    from nbclient import NotebookClient

    nb = nbformat.reads(json.dumps(released(lab)), as_version=4)
    answers = {gid(c): src(c) for c in source(lab)["cells"]}
    for c in nb.cells:
        if gid(c) in solved:
            c.source = answers[gid(c)]
    nb.cells += [nbformat.v4.new_code_cell(TYPO), nbformat.v4.new_code_cell(OWN_RAISE)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "JPY_")) and k != "PYTHONPATH"}
    env.update(GPULAB_REPO=str(ROOT), GPULAB_SMOKE="1", HF_HUB_OFFLINE="1")
    status = {}
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=kernel, allow_errors=True,
                            resources={"metadata": {"path": str(tmp)}},
                            on_cell_executed=lambda cell, cell_index, execute_reply: status.__setitem__(
                                cell_index, execute_reply["content"]["status"]))
    client.execute(env=env)
    return nb, status


def errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def check_run(lab: str, nb, status: dict, solved: tuple[str, ...]) -> dict[str, str]:
    """Every error output of the released cells is one line: the exercise's own "not done yet", or
    a hint naming an open exercise that cell depends on. ``{grade id: line}``."""
    m = H.load(lab, ROOT)
    lines = {}
    for i, c in enumerate(nb.cells[:-2]):
        errs = errors(c)
        if not errs:
            continue
        g = gid(c)
        assert len(errs) == 1 and status[i] == "error", (g, status.get(i))  # the cell still fails: Run All stops
        e = errs[0]
        assert len(e["traceback"]) == 1, f"{lab} {g}: a traceback, not one line: {e['ename']}: {e['evalue']}"
        line = e["traceback"][0]
        assert line.startswith(f"{e['ename']}: "), line
        if solution(c) and line.startswith(f"NotImplementedError: exercise {m.exercises[g].label}: not done yet"):
            assert g not in solved, line
        else:
            named = [x for x in m.exercises.values() if x.label in line]
            assert len(named) == 1, line
            assert named[0].grade_id in m.needs[g] and named[0].grade_id not in solved, (g, line)
        lines[g] = line
    typo, own = nb.cells[-2], nb.cells[-1]
    for cell, ename in ((typo, "NameError"), (own, "NotImplementedError")):
        (e,) = errors(cell)
        assert e["ename"] == ename and len(e["traceback"]) > 1, e  # IPython's own traceback
    assert status[len(nb.cells) - 2] == "error"
    return lines


@pytest.fixture(scope="module")
def runs(kernel_name, tmp_path_factory) -> dict:
    """Lab 00 (two exercises solved) and lab 04, run at once in two kernels: lab 04 spends most of its
    time starting its serving engine, which does not wait on lab 00."""
    jobs = {"00_foundations": SOLVED, "04_benchmarking_production": ()}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {lab: pool.submit(run, lab, tmp_path_factory.mktemp(lab), kernel_name, solved)
                   for lab, solved in jobs.items()}
        return {lab: f.result() for lab, f in futures.items()}


@pytest.mark.timeout(300)
def test_lab00_top_to_bottom_shows_open_exercises_only(runs):
    lab = "00_foundations"
    nb, status = runs[lab]
    lines = check_run(lab, nb, status, SOLVED)
    m = H.load(lab, ROOT)
    by_id = {gid(c): c for c in nb.cells}
    for g in ("test_intensity", "test_rates", "test_bound", "test_matmul"):  # the solved exercises' tests pass
        assert not errors(by_id[g]), errors(by_id[g])
    for g in ("memory_answer", "roofline_answer", "placement_answer", "train_answer", "limiter_answer",
              "quantization_answer", "sweep_answer"):
        assert lines[g].startswith("NotImplementedError: exercise"), lines[g]
    assert "NameError" in lines["test_memory"] and m.exercises["memory_answer"].label in lines["test_memory"]
    assert m.exercises["memory_answer"].label in lines["roofline_kernels"]  # the first open exercise it needs
    record = "".join(o.get("text", "") for o in by_id["record"].outputs if o.get("output_type") == "stream")
    assert "exercises not done yet:" in record and "not answered yet" not in record, record
    for g, ex in m.exercises.items():
        assert (ex.label in record) == (g not in SOLVED), (g, record)


@pytest.mark.timeout(300)
def test_lab04_top_to_bottom_shows_open_exercises_only(runs):
    lab = "04_benchmarking_production"
    nb, status = runs[lab]
    lines = check_run(lab, nb, status, ())
    m = H.load(lab, ROOT)
    assert {g for g in lines if g in m.exercises} == set(m.exercises) - {"percentile_answer"}  # its cell only defines
    assert any(ln.startswith("NameError") for ln in lines.values())


def test_the_record_line_names_the_open_exercises_not_their_names(tmp_path, monkeypatch):
    from grader import answers

    monkeypatch.setenv("GPULAB_SMOKE", "1")
    saved = answers.save_record("00_foundations", {}, tmp_path / "r.json")
    text = str(saved)
    m = H.load("00_foundations", ROOT)
    assert all(ex.label in text for ex in m.exercises.values()), text
    assert "matmul_tflops" not in text and "placements" not in text, text  # grouped under their exercises
    assert "not answered yet: test_sweep (SWEEP_SHAPES, SM_COUNT)" in text  # a course cell not run: its names
    rec = json.loads((tmp_path / "r.json").read_text())
    assert "matmul_tflops" in rec["missing"]["test_matmul"]  # the record itself keeps every missing name
