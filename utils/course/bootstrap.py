"""What each lab installs before it starts: the second half of every lab's setup cell.

The first half stays in the cell (``grader/source/<lab>/<lab>.ipynb``, cell 1): it finds the
course repository, or clones or unpacks it on Colab and Kaggle, and puts it on ``sys.path``;
only then can it import this module. :func:`setup` then sets the lab's environment variables,
installs the packages the runtime lacks (one line each), tries the optional ones (one line when
one fails, and what the lab does without it), says which serving engine a serving lab gets and,
under IPython, turns on the one-line hints of ``utils/course/exercise_hints.py`` for cells that fail only
because an exercise above them is not done yet.

A package a lab cannot run without stops the cell with :class:`SetupStopped`: one line in the
notebook, no traceback (IPython prints what an exception's ``_render_traceback_`` returns
instead of a traceback: ``showtraceback`` in IPython/core/interactiveshell.py). Nothing here
imports more than the standard library before the installs.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from utils.course import exercise_hints
from utils.serving import engines

PIP_TIMEOUT_S = 1800  # one package; vLLM's own install goes through utils/serving/engines.py
INSTALL_VLLM_VAR = "GPULAB_INSTALL_VLLM"  # 0: a serving lab on a GPU does not install vLLM
GRADING_VAR = "GPULAB_GRADING"  # "1" while a grader runs the notebook: nothing is installed then (grader/names.py)

# import name -> pip requirement: what every lab imports (the setup cells of grader/source/ before this module)
COMMON = {"torch": "torch", "matplotlib": "matplotlib", "pynvml": "nvidia-ml-py", "psutil": "psutil",
          "transformers": "transformers", "tokenizers": "tokenizers", "tqdm": "tqdm"}
BNB_GPU_ONLY = "bitsandbytes"  # its kernels need a CUDA GPU, so it is only tried on one


class SetupStopped(Exception):
    """A setup step the lab cannot go on without; the notebook shows the message, one line."""

    def _render_traceback_(self) -> list[str]:
        return [f"Setup stopped: {self}"]


@dataclasses.dataclass(frozen=True)
class Extra:
    """A package a lab runs without: ``pip`` requirement, and what the lab does without it."""

    module: str
    pip: str
    without: str
    gpu_only: bool = False


@dataclasses.dataclass(frozen=True)
class LabNeeds:
    needed: dict[str, str]  # import name -> pip requirement, on top of COMMON
    optional: tuple[Extra, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # set unless already set
    serving: bool = False  # transformers serve's extras, and vLLM where it runs
    note: Callable[[], str] | None = None  # one more status line


def lab_needs(lab: str) -> LabNeeds:
    """What ``lab`` installs: its folder's ``setup.py`` (``grader/labs/<lab>/setup.py``), through the
    course's one registry of labs; SetupStopped (one line) for a lab it does not know."""
    from grader import labs

    try:
        return labs.load(lab).part("setup").NEEDS
    except labs.LabError:
        raise SetupStopped(f"no lab {lab!r} (known: {', '.join(labs.assignments())})") from None


@dataclasses.dataclass
class SetupResult:
    lab: str
    repo: str
    installed: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)  # optional packages pip could not install
    lines: list[str] = dataclasses.field(default_factory=list)  # what was printed


def pip_install(requirement: str) -> str | None:
    """``pip install`` one requirement into this interpreter; None on success, else pip's last line."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"pip ran past {PIP_TIMEOUT_S // 60} minutes"
    except OSError as exc:
        return f"pip did not start: {exc}"
    if r.returncode == 0:
        return None
    return pip_error(r.stderr or r.stdout or "", r.returncode)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # pip colours its errors on a terminal-like stream


def pip_error(text: str, returncode: int) -> str:
    """The line of pip's output that says why it failed: its last ``ERROR:`` line (for an offline
    runtime, "No matching distribution found for ..."), colour codes removed; else its last line."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    line = (errors or lines or [f"pip exited {returncode}"])[-1]
    return line.removeprefix("ERROR:").strip()[:200]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is not there, or a half-installed one
        return False


def _cuda() -> bool:
    from utils.course.env import cuda_available

    return cuda_available()


def _serve_extras_missing() -> bool:
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError:
        return False  # a transformers without `transformers serve`: nothing to add
    return not is_serve_available()


def grading() -> bool:
    """Whether a grader runs this notebook: it grades with what the machine has and installs nothing."""
    return os.environ.get(GRADING_VAR) == "1"


def _vllm_line() -> str:
    try:
        return engines.ensure_vllm(install_on_gpu=os.environ.get(INSTALL_VLLM_VAR, "1") != "0" and not grading())
    except engines.EngineError as exc:
        return f"vLLM could not be installed ({exc}): the serving cells use transformers serve"


def _no_install(requirement: str) -> str:
    return "a grader installs nothing; the grading machine lacks it"


def _install_hints(lab: str, repo: str | Path) -> object:
    return exercise_hints.install(lab, repo)


def setup(lab: str, repo: str | Path | None = None, *, install: Callable[[str], str | None] = pip_install,
          has: Callable[[str], bool] = _has, cuda: Callable[[], bool] = _cuda,
          serve_extras_missing: Callable[[], bool] = _serve_extras_missing,
          vllm_line: Callable[[], str] = _vllm_line, out: Callable[[str], None] = print,
          hints: Callable[[str, str | Path], object] = _install_hints) -> SetupResult:
    """Prepare this runtime for ``lab``: environment, missing packages, optional ones, engine, and
    (under IPython, unless a grader runs the notebook) the one-line hints for cells that fail
    because an exercise above is not done yet (``utils/course/exercise_hints.py``).

    Prints one line per install, one per optional package that failed, the lab's status lines,
    and a last line naming the repository and what was installed. Raises :class:`SetupStopped`
    (one line) for an unknown lab or a package the lab needs that pip could not install."""
    spec = lab_needs(lab)
    res = SetupResult(lab, str(repo or ""))
    if grading():
        install = _no_install
    def say(line: str) -> None:
        res.lines.append(line)
        out(line)

    for key, value in spec.env.items():
        os.environ.setdefault(key, value)

    def attempt(requirement: str) -> str | None:
        t0 = time.monotonic()
        why = install(requirement)
        importlib.invalidate_caches()
        if why is None:
            res.installed.append(requirement)
            say(f"installed {requirement} ({time.monotonic() - t0:.0f} s)")
        return why

    for module, requirement in {**COMMON, **spec.needed}.items():
        if not has(module) and (why := attempt(requirement)) is not None:
            hint = "check that this runtime has internet access (Kaggle: Settings > Internet on)"
            raise SetupStopped(f"could not install {requirement}, which this lab needs ({why}): {hint}, then run this cell again")
    if spec.serving and serve_extras_missing():
        import transformers

        requirement = f"transformers[serving]=={transformers.__version__}"
        if (why := attempt(requirement)) is not None:
            res.failed.append(requirement)
            say(f"could not install {requirement} ({why}): `transformers serve` cannot start, so the serving cells need vLLM")
    for opt in spec.optional:
        if has(opt.module) or (opt.gpu_only and not cuda()):
            continue
        if (why := attempt(opt.pip)) is not None:
            res.failed.append(opt.pip)
            say(f"could not install {opt.pip} ({why}): {opt.without}")
    if spec.serving:
        say(vllm_line())
    if spec.note:
        say(spec.note())
    if repo is not None and not grading():
        hints(lab, repo)
    say(f"course repository: {res.repo or '?'} | installed: {', '.join(res.installed) or 'nothing'}")
    return res
