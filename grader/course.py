"""nbgrader, called in-process on a temporary copy of the course.

Every release and every grading run works on a throw-away course root (``source/`` copied,
a gradebook of its own). The shared ``grader/`` folder never gets a ``gradebook.db``, a
release is a pure function of ``source/``, and parallel grading jobs never share a sqlite
file (nbgrader's gradebook locks the whole database on write).

The nbgrader converters (``GenerateAssignment``, ``Autograde``, ``GenerateFeedback``) are
driven the way ``nbgrader.apps.api.NbGraderAPI`` drives them, without the API object: its
constructor probes the exchange directory, which a grading machine has no use for.

Autograde executes with :func:`guarded_execute`, nbgrader's ``Execute`` plus guards that work
from outside the kernel, where a notebook cannot undo them: an error or stderr message seen
in a test cell counts even if the notebook's hooks clear the output afterwards; a value a test
cell displays is not read as partial credit (the course's tests grade by passing, and any cell
could print a number); processes the notebook left behind are killed when its kernel stops,
before the grades are saved. What runs inside the kernel can still be subverted by a notebook
that reprograms IPython itself (an input transformer that rewrites the tests): nbgrader grades
in the learner's kernel, and a container protects the grading machine, not the grade.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grader import COURSE_ROOT, REPO_ROOT, SOURCE_DIR

CONFIG_FILE = COURSE_ROOT / "nbgrader_config.py"
TIMEOUT_VAR = "GPULAB_CELL_TIMEOUT"  # seconds per cell while grading, overrides the default
SMOKE_TIMEOUT_S = 60  # on the reference 2-core machine; scaled by its speed and load (grader.remeasure.timeout_factor)
GPU_TIMEOUT_S = 600  # GPU sizes train for minutes in one cell on a T4
SERVING_LABS = ("03_inference_serving", "04_benchmarking_production")  # a cell starts an engine
ENGINE_SMOKE_TIMEOUT_S = 900  # vLLM's CPU build starts in 50-110 s on 2 quiet cores, several times that when shared
IOPUB_TIMEOUT_S = 30  # a cell's last output after its reply, or after its timeout's interrupt (nbclient's default: 4)
STARTUP_TIMEOUT_S = 60  # a kernel's start (nbclient's default), scaled like the smoke timeout


class CourseError(Exception):
    """A course problem with a one-line explanation (bad source folder, nbgrader failure)."""


def assignments(source_dir: Path = SOURCE_DIR) -> list[str]:
    """Assignment ids: the folders of ``source/`` that hold a notebook, sorted."""
    if not source_dir.is_dir():
        return []
    return sorted(p.name for p in source_dir.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def notebook_name(assignment: str, source_dir: Path = SOURCE_DIR) -> str:
    """The assignment's one notebook, ``<assignment>.ipynb`` (one notebook per phase)."""
    folder = source_dir / assignment
    if not folder.is_dir():
        known = ", ".join(assignments(source_dir)) or "none"
        raise CourseError(f"no assignment {assignment!r} in {source_dir} (known: {known})")
    nbs = sorted(p.name for p in folder.glob("*.ipynb"))
    if nbs != [f"{assignment}.ipynb"]:
        raise CourseError(f"{folder} must hold exactly one notebook, {assignment}.ipynb (found: {', '.join(nbs) or 'none'})")
    return nbs[0]


@dataclasses.dataclass(frozen=True)
class CellTimeout:
    """A grading run's per-cell limit, why it is that, and the kernel start and output waits that
    scale with it (seconds)."""

    seconds: int
    why: str
    iopub_s: int = IOPUB_TIMEOUT_S
    startup_s: int = STARTUP_TIMEOUT_S


def cell_timeout(assignment: str | None = None, jobs: int = 1, override: int | None = None,
                 smoke: bool | None = None) -> CellTimeout:
    """The per-cell limit of a grading run. ``override`` (``--timeout``) or ``GPULAB_CELL_TIMEOUT``
    when given; else 600 s on a GPU; in smoke mode 60 s (900 s for a serving lab where vLLM is
    installed: its cells start vLLM's CPU build) on the reference 2-core machine, times this
    machine's measured slowness and load (:func:`grader.remeasure.timeout_factor`, measured here,
    once). The kernel start and output waits scale by the same factor in every case. ``smoke``:
    smoke mode where the caller knows it (:class:`grader.gpus.Probe`), else :func:`smoke_mode`."""
    from grader import remeasure
    from utils.course.env import smoke_mode

    override = override or None  # 0 means "not given", as it always did
    factor, why = remeasure.timeout_factor(remeasure.machine_speed(), jobs)
    waits = {"iopub_s": math.ceil(IOPUB_TIMEOUT_S * factor), "startup_s": math.ceil(STARTUP_TIMEOUT_S * factor)}
    source = "--timeout"
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    if override is None and raw:
        try:
            override, source = int(raw), TIMEOUT_VAR
        except ValueError:
            raise CourseError(f"{TIMEOUT_VAR}={raw!r} is not a whole number of seconds") from None
        if override <= 0:
            raise CourseError(f"{TIMEOUT_VAR} must be positive, got {override}")
    if override is not None:
        return CellTimeout(int(override), f"{int(override)} s, as {source} gives (this machine: {why})", **waits)
    if not (smoke_mode() if smoke is None else smoke):
        return CellTimeout(GPU_TIMEOUT_S, f"{GPU_TIMEOUT_S} s, the GPU default (GPU cells are not CPU-bound)", **waits)
    base = SMOKE_TIMEOUT_S
    if assignment in SERVING_LABS:
        from utils.serving import engines

        if engines.available("vllm")[0]:
            base = ENGINE_SMOKE_TIMEOUT_S
    seconds = int(math.ceil(base * factor / 10) * 10)
    return CellTimeout(seconds, f"{seconds} s: the {base} s smoke default {why}", **waits)


def default_timeout_s(assignment: str | None = None) -> int:
    """:func:`cell_timeout`'s seconds for one job."""
    return cell_timeout(assignment).seconds


def load_config(root: Path, timeout_s: int | None = None, iopub_s: int | None = None, startup_s: int | None = None):
    """The course's ``nbgrader_config.py``, pointed at the course copy ``root``, with the per-cell,
    output and kernel start limits given (:class:`CellTimeout`)."""
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()
    extra = Config()
    extra.CourseDirectory.root = str(root)
    extra.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    if timeout_s is not None:
        extra.Execute.timeout = int(timeout_s)
    if iopub_s is not None:
        extra.Execute.iopub_timeout = int(iopub_s)
    if startup_s is not None:
        extra.Execute.startup_timeout = int(startup_s)
    cfg.merge(extra)
    return cfg


KERNEL_DIED = "the kernel died while running the notebook (a crash, os._exit, or out of memory)"


def ensure_scripts_on_path() -> None:
    """nbgrader creates a gradebook by running the ``alembic`` script, found on PATH.

    Put this interpreter's script folder first (``python -m grader`` needs no activated
    venv); where the script is still missing (a ``pip install --user`` keeps scripts
    elsewhere), add a two-line shim that runs ``python -m alembic`` with this interpreter."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        path = bindir + (os.pathsep + path if path else "")
    if shutil.which("alembic", path=path) is None:
        shim_dir = Path(tempfile.gettempdir()) / f"gpulab-alembic-shim-{os.getuid() if hasattr(os, 'getuid') else 0}"
        shim_dir.mkdir(exist_ok=True)
        shim = shim_dir / "alembic"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m alembic "$@"\n')
        shim.chmod(0o755)
        path = str(shim_dir) + os.pathsep + path
    os.environ["PATH"] = path


def prepare_process_env(kernel_home: Path) -> None:
    """Set up this (worker) process so the notebook's kernel is the right one.

    The notebooks run on a ``python3`` kernel; a kernel spec under ``kernel_home`` (made
    the Jupyter data dir) pins it to this interpreter, so a system-wide ``python3`` kernel
    without torch is never picked by mistake. The kernel inherits this environment: it
    imports ``utils`` and ``grader`` from this repository and finds it via ``GPULAB_REPO``.
    """
    ensure_scripts_on_path()
    spec_dir = kernel_home / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (grader)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    os.environ["JUPYTER_DATA_DIR"] = str(kernel_home)
    pp = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + pp if pp else "")
    os.environ["GPULAB_REPO"] = str(REPO_ROOT)
    os.environ["GPULAB_GRADING"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # a debugger warning on stderr otherwise


def _run(app) -> str:
    """Run an nbgrader converter; return its log, raise CourseError with the tail on failure."""
    from nbgrader.utils import capture_log

    result = capture_log(app)
    log = result.get("log", "")
    if not result.get("success"):
        raise CourseError(_failure_reason(log + "\n" + result.get("error", "")))
    return log


def _failure_reason(text: str) -> str:
    """One line saying why nbgrader failed, from its log."""
    if "DeadKernelError" in text or "Kernel died" in text:
        return KERNEL_DIED
    if "UnresponsiveKernelError" in text or "kernel became unresponsive" in text:
        return "the kernel stopped responding (a loop that ignores interrupts?)"
    if "CellTimeoutError" in text or "Timeout waiting for IOPub" in text:
        m = re.search(r"preview of the cell contents:\s*\n\s*-+\s*\n\s*(\S[^\n]*)", text)
        where = f" (the cell starting {m.group(1).strip()[:60]!r})" if m else ""
        return f"a cell was still running or printing after its timeout and an interrupt{where}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    exc = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception): ", ln) and not ln.startswith("nbgrader.converters")]
    if exc:
        return exc[-1][:300]
    errors = [ln.removeprefix("[ERROR]").strip() for ln in lines if ln.startswith("[ERROR]")]
    errors = [e for e in errors if not e.startswith(("Please see", "There was an error", "Traceback"))]
    return (errors[-1] if errors else (lines[-1] if lines else "nbgrader failed without a message"))[:300]


def new_gradebook(root: Path) -> Path:
    """An empty gradebook at ``root/gradebook.db``, the one nbgrader's ``Gradebook`` makes, made in this process.

    For a new file, ``Gradebook.__init__`` (nbgrader/api.py) creates the tables from its models, then
    starts the ``alembic heads`` script in a new process to learn the migration head it stamps the file
    with: 3.7 s of a 38 s ``check`` on the 2-core CI machine (cProfile of ``python -m grader check``,
    lab 00). Here the head comes from alembic's ``ScriptDirectory`` on the same migration scripts
    (``nbgrader.dbutil.ALEMBIC_DIR``) and the tables from the same models (``nbgrader.api.Base``);
    nbgrader then finds the tables and stamps nothing. tests/grader/test_startup_cost.py compares the file
    with the one nbgrader makes itself."""
    from alembic.script import ScriptDirectory
    from nbgrader.api import Base
    from nbgrader.dbutil import ALEMBIC_DIR
    from sqlalchemy import create_engine, text

    db = root / "gradebook.db"
    engine = create_engine(f"sqlite:///{db}", future=True)
    try:
        Base.metadata.create_all(bind=engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            conn.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"),
                         {"v": ScriptDirectory(ALEMBIC_DIR).get_current_head()})
    finally:
        engine.dispose()
    return db


def make_course(dest: Path, assignment: str, source_dir: Path = SOURCE_DIR) -> Path:
    """A fresh course root at ``dest`` holding ``assignment``, generated (released) there.

    Its gradebook records the assignment's cells and checksums, which
    autograde needs (nbgrader's SaveCells writes them even with ``no_database``).
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    notebook_name(assignment, source_dir)  # validates the folder
    ensure_scripts_on_path()
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source_dir / assignment, dest / "source" / assignment, dirs_exist_ok=True)
    if not (dest / "gradebook.db").exists():
        new_gradebook(dest)
    cfg = load_config(dest)
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    app = GenerateAssignment(coursedir=coursedir, config=cfg)
    app.force = True
    app.create_assignment = True
    _run(app)
    return dest


def released_path(root: Path, assignment: str) -> Path:
    return root / "release" / assignment / f"{assignment}.ipynb"


def submitted_dir(root: Path, assignment: str, student: str) -> Path:
    return root / "submitted" / student / assignment


def autograded_path(root: Path, assignment: str, student: str) -> Path:
    return root / "autograded" / student / assignment / f"{assignment}.ipynb"


def feedback_path(root: Path, assignment: str, student: str) -> Path:
    return root / "feedback" / student / assignment / f"{assignment}.html"


def pipeline(sanitize: list, autograde: list) -> tuple[list, list]:
    """nbgrader's Autograde preprocessor lists with the grader's steps in them (``grader/preprocessors.py``):
    the export cells after the sanitizing steps, the guarded execution in place of ``Execute``, the
    judges right after it (before ``SaveAutoGrades`` reads the outputs)."""
    from grader.preprocessors import GuardedExecute, InsertExports, JudgeCells

    sanitize = [p for p in sanitize if p is not InsertExports] + [InsertExports]
    steps = []
    for p in autograde:
        if p is JudgeCells:
            continue
        if p.__name__ in ("Execute", "GuardedExecute"):
            steps += [GuardedExecute, JudgeCells]
        else:
            steps.append(p)
    return sanitize, steps


def autograde(root: Path, assignment: str, student: str, timeout_s: int, iopub_s: int | None = None,
              startup_s: int | None = None, *, verdicts: Path | None = None, count_provisional: bool = False,
              seed: int | None = None) -> str:
    """nbgrader autograde of one submission in the course copy ``root``; returns the log. ``verdicts``:
    where :class:`grader.preprocessors.JudgeCells` writes each cell's verdict."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    cfg = load_config(root, timeout_s, iopub_s, startup_s)
    extra = Config()
    extra.JudgeCells.count_provisional = bool(count_provisional)
    extra.JudgeCells.verdicts_path = str(verdicts or "")
    extra.JudgeCells.seed = -1 if seed is None else int(seed)
    cfg.merge(extra)
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    app = Autograde(coursedir=coursedir, config=cfg)
    app.sanitize_preprocessors, app.autograde_preprocessors = pipeline(app.sanitize_preprocessors,
                                                                       app.autograde_preprocessors)
    app.force = True
    app.create_student = True
    return _run(app)


def generate_feedback(root: Path, assignment: str, student: str) -> str:
    """nbgrader generate_feedback (HTML) for one autograded submission; returns the log."""
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    cfg = load_config(root)
    extra = Config()
    extra.HTMLExporter.template_name = "feedback"  # as NbGraderAPI.generate_feedback sets it
    cfg.merge(extra)
    coursedir = CourseDirectory(config=cfg)
    coursedir.assignment_id = assignment
    coursedir.student_id = student
    app = GenerateFeedback(coursedir=coursedir, config=cfg)
    app.force = True
    return _run(app)


def manual_points(cells: list[dict]) -> float:
    """Points of the written answers that wait for an instructor's grade (answered, not yet graded)."""
    return sum(c["points"] for c in cells if c.get("mode") == "manual" and c.get("needs_manual_grade"))


def read_grades(root: Path, assignment: str, student: str) -> dict:
    """Score, max score, timestamp and per-cell grades from the course copy's gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        a = gb.find_assignment(assignment)
        out = {"max_score": float(a.max_score), "score": 0.0, "timestamp": "", "duedate": a.duedate, "cells": []}
        order = {}
        src = released_path(root, assignment)
        if src.exists():
            cells = json.loads(src.read_text())["cells"]
            order = {c["metadata"].get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(cells)}
        try:
            sub = gb.find_submission(assignment, student)
        except MissingEntry:
            return out
        out["late_submission_penalty"] = float(sub.late_submission_penalty or 0.0)
        out["timestamp"] = sub.timestamp.isoformat() if sub.timestamp else ""
        for nb in sub.notebooks:
            for g in nb.grades:
                if g.cell_type != "code":
                    # a written answer (grader/writeups.py): the instructor's to grade, never scored here; its
                    # note is the automatic check of the numbers it quotes
                    try:
                        note = gb.find_comment(g.name, nb.name, assignment, student).auto_comment or ""
                    except MissingEntry:
                        note = ""
                    out["cells"].append({"cell": g.name, "points": float(g.max_score), "score": 0.0,
                                         # unanswered (as released): nbgrader scores it 0 and needs no reader
                                         "needs_manual_grade": g.auto_score is None, "mode": "manual", "message": note})
                    continue
                out["cells"].append({
                    "cell": g.name,
                    "points": float(g.max_score),
                    # auto_score only: nbgrader's score prefers manual_score and adds extra_credit, and a notebook
                    # can write both into this course copy's gradebook while it runs (nothing here is graded by hand)
                    "score": min(max(float(g.auto_score or 0.0), 0.0), float(g.max_score)),
                    "needs_manual_grade": bool(g.needs_manual_grade and g.auto_score is None),
                })
        out["cells"].sort(key=lambda c: order.get(c["cell"], 1e9))
        out["score"] = out["raw_score"] = sum(c["score"] for c in out["cells"])
        out["auto_max_score"] = sum(c["points"] for c in out["cells"] if c.get("mode") != "manual")
        out["manual_points"] = manual_points(out["cells"])
        return out
