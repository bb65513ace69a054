"""The grader against hostile and broken submissions: each loses its own points only, with a
one-line reason, and changes nothing outside its own grading folder.

One grading batch (``grade_batch``, two jobs) of a tiny nbgrader assignment built here, so that
kernels start fast; the tricks are the ones that fooled the grader before it was hardened: hooks
that clear a failing test's error, a displayed number read as partial credit, scores written
into the course copy's gradebook, a rebound ``grader.COURSE_ROOT``, a grading variable set in
``os.environ``, the grader's own file rewritten on disk and then put back, a process left
running, duplicated cells, a record that vanished before grading, and an input transformer that
turns every test into ``pass`` (which the clean process, grader/clean_room.py, catches). The
rest needs no kernel: unreadable files, links out of the submissions folder, pipes and devices,
malformed metadata, a killed worker's process tree. About 40 s on two idle cores.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grader import batch, checks
from grader import course as C
from grader.submissions import (
    Submission,
    SubmissionError,
    canonical_metadata,
    find_submissions,
    read_notebook,
)
from tests.nbcells import gid, messages, scores

ROOT = Path(__file__).resolve().parents[2]
A = "hx"  # the tiny assignment
TIMEOUT_S = 20


# -- a tiny assignment ----------------------------------------------------------------------

def _code(source: str, grade_id: str, *, grade=False, solution=False, locked=False, points=0) -> dict:
    md = {"grade_id": grade_id, "grade": grade, "solution": solution, "locked": locked, "schema_version": 3}
    if grade:
        md["points"] = points
    return {"cell_type": "code", "execution_count": None, "id": grade_id, "metadata": {"nbgrader": md},
            "outputs": [], "source": source}


HIDDEN_VALUE = """assert value > 0
### BEGIN HIDDEN TESTS
import importlib.util as _iu, grader as _g
_s = _iu.spec_from_file_location("_gpulab_checks", _g.COURSE_ROOT / "checks.py")
_c = _iu.module_from_spec(_s); _s.loader.exec_module(_c)
if _c.submitted_record() is None:  # as the phases do: no GPU record, so check the number itself
    _c.assert_close(value, 42, "value")
### END HIDDEN TESTS"""


def _source_nb() -> dict:
    cells = [
        _code("import os, sys\nfrom grader import checks", "setup", locked=True),
        _code("### BEGIN SOLUTION\nvalue = 42\n### END SOLUTION", "answer", solution=True),
        _code(HIDDEN_VALUE, "test_value", grade=True, locked=True, points=1),
        _code("### BEGIN SOLUTION\ndef double(x):\n    return 2 * x\n### END SOLUTION", "answer2", solution=True),
        _code("assert double(1) == 2\n### BEGIN HIDDEN TESTS\nassert double(21) == 42\n### END HIDDEN TESTS",
              "test_double", grade=True, locked=True, points=2),
    ]
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}}


def _scratch(code: str, cid: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [], "source": code}


def _after(nb: dict, grade_id: str, code: str, cid: str = "mine") -> dict:
    i = next(i for i, c in enumerate(nb["cells"]) if gid(c) == grade_id)
    nb["cells"].insert(i + 1, _scratch(code, cid))
    return nb


def _touched(path: Path) -> tuple[int, int]:
    """Inode and ctime: a write changes them even if the old content is put back."""
    st = path.stat()
    return st.st_ino, st.st_ctime_ns


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> tuple[Path, dict]:
    """``(source_dir, released notebook)`` of the tiny assignment."""
    source = tmp_path_factory.mktemp("source")
    (source / A).mkdir()
    (source / A / f"{A}.ipynb").write_text(json.dumps(_source_nb()))
    root = C.make_course(tmp_path_factory.mktemp("course"), A, source)
    return source, json.loads(C.released_path(root, A).read_text())


def _answered(released_nb: dict) -> dict:
    nb = copy.deepcopy(released_nb)
    answers = {gid(c): c["source"] for c in _source_nb()["cells"] if c["metadata"]["nbgrader"]["solution"]}
    for c in nb["cells"]:
        if gid(c) in answers:
            c["source"] = answers[gid(c)].replace("### BEGIN SOLUTION\n", "").replace("\n### END SOLUTION", "")
    return nb


# -- the batch ------------------------------------------------------------------------------

CLEAR_ERRORS = """from IPython.display import clear_output
def _hide(result):
    if result.error_in_exec is not None:
        result.error_in_exec = None
        clear_output()
get_ipython().events.register("post_run_cell", _hide)"""

PARTIAL_CREDIT = "get_ipython().events.register('pre_run_cell', lambda info: get_ipython().displayhook(1))"

REBIND_ROOT = """import grader, pathlib, tempfile
_d = pathlib.Path(tempfile.mkdtemp())
(_d / "checks.py").write_text("def assert_close(*a, **k):\\n    pass\\ndef submitted_record():\\n    return None\\n")
try:
    grader.COURSE_ROOT = _d
except AttributeError:
    pass
value = 1"""

OWN_RECORD = """import os, tempfile
from utils.record import Record
_p = tempfile.mktemp(suffix=".json")
Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"}).save(_p)
os.environ["GPULAB_SUBMITTED_RECORD"] = _p
value = 1"""

EDIT_ON_DISK = """import grader
_f = grader.COURSE_ROOT / "checks.py"
_orig = _f.read_text()
_f.write_text("def assert_close(*a, **k):\\n    pass\\ndef submitted_record():\\n    return None\\n")
value = 1"""

WRITE_GRADEBOOK = """import pathlib, sqlite3
_db = next(p / "gradebook.db" for p in pathlib.Path.cwd().parents if (p / "gradebook.db").is_file())
with sqlite3.connect(_db) as _c:  # the course copy's gradebook, while it is being graded
    _c.execute("update grade set extra_credit = 5, manual_score = 9")
    _c.execute("update grade_cells set max_score = 0")"""

# the five-line cheat: every later cell that mentions a check becomes ``pass``; with wrong answers
TRANSFORMER = """def _skip(lines):
    return ["pass\\n"] if any("assert" in ln or "checks." in ln for ln in lines) else lines
get_ipython().input_transformers_cleanup.append(_skip)
def double(x):
    return x + 1
value = 7"""

DAEMON = """import subprocess
_p = subprocess.Popen(["sleep", "300"], start_new_session=True)
print("daemon pid", _p.pid)"""


@pytest.fixture(scope="module")
def graded(released, tmp_path_factory):
    source, rel = released
    subs = tmp_path_factory.mktemp("subs")
    out = tmp_path_factory.mktemp("out")

    def put(name: str, nb: dict) -> None:
        (subs / f"{name}.ipynb").write_text(json.dumps(nb))

    put("zz_reference", _answered(rel))
    put("clears_errors", _after(copy.deepcopy(rel), "setup", CLEAR_ERRORS))
    put("partial_credit", _after(copy.deepcopy(rel), "setup", PARTIAL_CREDIT))
    put("rebinds_root", _after(copy.deepcopy(rel), "setup", REBIND_ROOT))
    put("own_record", _after(copy.deepcopy(rel), "setup", OWN_RECORD))
    edits = _after(copy.deepcopy(rel), "setup", EDIT_ON_DISK)
    edits["cells"].append(_scratch("_f.write_text(_orig)  # put it back", "undo"))  # after every test
    put("edits_grader", edits)
    put("writes_gradebook", _after(copy.deepcopy(rel), "setup", WRITE_GRADEBOOK))
    put("daemon", _after(_answered(rel), "setup", DAEMON))
    put("transformer", _after(copy.deepcopy(rel), "setup", TRANSFORMER))
    dup = _answered(rel)
    dup["cells"].append(copy.deepcopy(next(c for c in dup["cells"] if gid(c) == "test_double")))  # Jupyter copy-paste
    renamed = copy.deepcopy(next(c for c in dup["cells"] if gid(c) == "test_value"))
    renamed["metadata"]["nbgrader"]["grade_id"] = "my_test"
    dup["cells"].append(renamed)
    put("duplicated_cells", dup)

    found = find_submissions(subs, A)
    gone = Submission("record_gone", subs / "zz_reference.ipynb", subs / "no_such.record.json")
    crash = Submission("prepare_crash", subs / "zz_reference.ipynb")
    real_checks = ROOT / "grader" / "checks.py"
    before = _touched(real_checks)
    prepare = batch.prepare

    def crashes_once(sub, *args):  # an error nobody foresaw, while preparing one submission
        if sub.student_id == "prepare_crash":
            raise RuntimeError("unforeseen\nsecond line")
        return prepare(sub, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch, "prepare", crashes_once)
        # screen=False: these are the defences inside the kernel, behind the static screen
        # (tests/grader/test_screen.py), for an instructor who grades a flagged notebook anyway
        results = batch.grade_batch(A, found + [gone, crash], out, jobs=2, timeout_s=TIMEOUT_S, progress=False,
                                    source_dir=source, screen=False)
    pids = []
    ag = out / "autograded" / "daemon" / f"{A}.ipynb"
    if ag.is_file():
        pids = [int(p) for p in re.findall(r"daemon pid (\d+)", ag.read_text())]
    yield {"results": {r["student_id"]: r for r in results}, "pids": pids, "real_checks": (before, _touched(real_checks))}
    import psutil

    for pid in pids:  # only if the grader failed to: the sleep this test's notebook started
        try:
            p = psutil.Process(pid)
            if p.cmdline()[:2] == ["sleep", "300"]:
                p.kill()
        except psutil.Error:
            pass


def test_reference_keeps_full_marks(graded):
    r = graded["results"]["zz_reference"]
    assert r["status"] == "ok" and r["score"] == r["max_score"] == 3, messages(r)


@pytest.mark.parametrize("student", ["clears_errors", "partial_credit"])
def test_kernel_hooks_do_not_turn_failing_tests_into_points(graded, student):
    # a post_run_cell hook that clears the error, or a number displayed before the test runs
    # (nbgrader's partial credit): the untouched release must still score 0
    r = graded["results"][student]
    assert r["score"] == 0, messages(r)
    assert "NameError" in messages(r)


def test_a_transformer_that_skips_every_test_passes_the_kernel_and_fails_the_clean_process(graded):
    # in the kernel every test cell became ``pass``; the clean process ran the same tests on the
    # answers' definitions (double(21) = 22, value = 7) and both cells are held at 0
    r = graded["results"]["transformer"]
    assert r["score"] == 0 and r["clean_room"]["disagreed"] == ["test_double", "test_value"], messages(r)
    assert all(c["kernel_score"] == c["points"] for c in r["cells"]), "the kernel was not fooled: no test of this"
    assert "failed when the grader ran them on your definitions in a clean process" in messages(r)
    assert "double(21)" in messages(r) or "AssertionError" in messages(r)
    assert graded["results"]["zz_reference"]["clean_room"] == {"checked": ["test_double", "test_value"],
                                                               "unchecked": {}, "disagreed": []}


def test_scores_written_into_the_gradebook_by_the_notebook_do_not_count(graded):
    # nbgrader's score prefers manual_score and adds extra_credit: the release scored 10 of 3 this way
    r = graded["results"]["writes_gradebook"]
    assert r["score"] == 0 and r["max_score"] == 3 and [c["points"] for c in r["cells"]] == [1, 2], messages(r)


def test_rebinding_course_root_does_not_load_fake_tests(graded):
    r = graded["results"]["rebinds_root"]
    assert scores(r)["test_value"] == 0 and "value = 1, expected 42" in messages(r), messages(r)


def test_setting_the_record_variable_in_the_notebook_is_caught(graded):
    r = graded["results"]["own_record"]
    assert scores(r)["test_value"] == 0 and "changed GPULAB_SUBMITTED_RECORD" in messages(r), messages(r)


def test_editing_the_grader_on_disk_scores_zero_and_leaves_the_repository_alone(graded):
    r = graded["results"]["edits_grader"]
    assert r["score"] == 0 and "changed the course's own files" in r["status"] and "grader/checks.py" in r["status"]
    assert "\n" not in r["status"]
    before, after = graded["real_checks"]
    assert before == after, "the repository's grader/checks.py was written to"


def test_processes_a_notebook_starts_do_not_outlive_its_grading(graded):
    import psutil

    assert graded["results"]["daemon"]["score"] == 3
    assert graded["pids"], "the daemon cell printed no pid"
    for pid in graded["pids"]:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"sleep {pid} started by the notebook is still running"


def test_duplicated_and_renamed_cells_are_graded_not_crashed(graded):
    r = graded["results"]["duplicated_cells"]
    assert r["score"] == 3, r["status"] + " | " + messages(r)
    assert "duplicated or unknown nbgrader id" in r["status"]


def test_an_error_while_preparing_costs_that_submission_only(graded):
    r = graded["results"]["record_gone"]
    assert r["score"] == 0 and "no_such.record.json cannot be read" in r["status"], r["status"]
    r = graded["results"]["prepare_crash"]
    assert r["score"] == 0 and r["status"].endswith("could not be prepared for grading (RuntimeError: unforeseen)")
    assert graded["results"]["zz_reference"]["score"] == 3  # the batch went on


# -- no kernel needed -------------------------------------------------------------------------

def test_files_that_are_no_notebooks_get_one_line_and_never_block(tmp_path, monkeypatch, released):
    subs = tmp_path / "subs"
    subs.mkdir()
    good = json.dumps(_answered(released[1]))
    (tmp_path / "elsewhere.ipynb").write_text(good)
    os.symlink(tmp_path / "elsewhere.ipynb", subs / "link_out.ipynb")
    os.symlink("/dev/zero", subs / "zeros.ipynb")  # reading it never ends
    os.mkfifo(subs / "pipe.ipynb")  # opening it blocks until a writer comes
    (subs / "folder.ipynb").mkdir()
    (subs / "José.ipynb").write_text(good)
    (subs / "with space.ipynb").write_text(good)
    found = {s.student_id: s.problem for s in find_submissions(subs, A)}
    assert "outside the submissions folder" in found["link_out"] and "outside" in found["zeros"]
    assert "not a regular file" in found["pipe"] and "is a folder" in found["folder"]
    assert found["José"] == "" and "letters, digits" in found["with space"]
    assert all("\n" not in p for p in found.values())
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_notebook(subs / "pipe.ipynb")
    monkeypatch.setattr("grader.submissions.MAX_FILE_MB", 0)
    with pytest.raises(SubmissionError, match="over the 0 MB limit"):
        read_notebook(subs / "José.ipynb")


def test_nbformat_3_is_read_and_malformed_cells_are_refused(tmp_path, released):
    import nbformat

    v3 = nbformat.convert(nbformat.from_dict(_answered(released[1])), 3)
    (tmp_path / "v3.ipynb").write_text(nbformat.writes(v3, version=3))
    assert {gid(c) for c in read_notebook(tmp_path / "v3.ipynb").cells} >= {"answer", "test_value", "test_double"}
    for name, edit, reason in (("meta", lambda c: c.update(metadata=[]), "metadata is not a JSON object"),
                               ("src", lambda c: c.update(source=[1, 2]), "source is not text")):
        nb = _answered(released[1])
        edit(nb["cells"][1])
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(nb))
        with pytest.raises(SubmissionError, match=reason):
            read_notebook(tmp_path / f"{name}.ipynb")


def test_edited_nbgrader_metadata_is_put_back_from_the_release(released):
    import nbformat

    rel = nbformat.from_dict(released[1])
    nb = nbformat.from_dict(_answered(released[1]))
    test = next(c for c in nb.cells if gid(c) == "test_double")
    test.metadata.nbgrader.update(points=100, grade=False, solution=True, locked=False)  # worth more, not a test
    answer = next(c for c in nb.cells if gid(c) == "answer")
    answer.metadata.nbgrader.update(grade=True, points=50)
    nb.cells.append(copy.deepcopy(answer))  # a duplicate: the last copy keeps the id
    assert canonical_metadata(nb, rel) == 1
    assert test.metadata.nbgrader == next(c for c in rel.cells if gid(c) == "test_double").metadata.nbgrader
    assert "nbgrader" not in answer.metadata and gid(nb.cells[-1]) == "answer"
    assert not nb.cells[-1].metadata.nbgrader.get("grade")


def test_edits_to_the_repository_itself_are_reported(tmp_path):
    # a notebook that finds the real repository (beside sys.executable, say) cannot be named,
    # but the batch grades everyone on the code it read at the start and says what changed
    for d in batch.CODE_DIRS:
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.py").write_text("x = 1\n")
    code = batch.read_code(tmp_path)
    assert batch.repo_changes(code, tmp_path) == []
    (tmp_path / "grader" / "a.py").write_text("x = 2\n")
    (tmp_path / "utils" / "new.py").write_text("")
    assert batch.repo_changes(code, tmp_path) == ["grader/a.py", "utils/new.py"]


def test_a_timed_out_worker_takes_its_kernel_and_children_with_it():
    # the kernel runs in a session of its own: killing the worker's process group left it running
    import psutil

    code = ("import subprocess, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
            "print(p.pid, flush=True); time.sleep(300)")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(worker.stdout.readline())
    try:
        batch._kill_tree(worker.pid)
        worker.wait(timeout=30)
        gone = not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert gone, "the worker's child survived"
    finally:
        for pid in (child, worker.pid):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def test_grader_paths_cannot_be_rebound_and_a_patched_gpu_probe_is_caught(monkeypatch):
    import grader

    with pytest.raises(AttributeError, match="cannot be changed"):
        grader.COURSE_ROOT = Path("/tmp")
    saved = grader.__dict__["COURSE_ROOT"]
    try:
        grader.__dict__["COURSE_ROOT"] = Path("/tmp")  # the module's dict is writable; the attribute is not
        assert grader.COURSE_ROOT == ROOT / "grader"
    finally:
        grader.__dict__["COURSE_ROOT"] = saved
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(AssertionError, match="is_available was patched"):
        checks.gpu_here()


@pytest.mark.parametrize("code", [CLEAR_ERRORS, PARTIAL_CREDIT, REBIND_ROOT, OWN_RECORD, EDIT_ON_DISK, WRITE_GRADEBOOK,
                                  DAEMON], ids=["clears_errors", "partial_credit", "rebinds_root", "own_record",
                                                "edits_grader", "writes_gradebook", "daemon"])
def test_the_screen_holds_each_of_these_before_it_runs(code, released):
    from grader.screen import screen_notebook

    _, rel = released
    assert screen_notebook(_after(copy.deepcopy(rel), "setup", code), rel), code
