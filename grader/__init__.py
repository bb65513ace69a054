"""grader: the course's nbgrader root and the code that grades on measured numbers.

``python -m grader release [--check]`` writes ``notebooks/`` from ``grader/source/``;
``python -m grader check NOTEBOOK`` grades one notebook for self-study;
``python -m grader autograde --assignment ID --submissions DIR --out DIR`` grades a class.
Hidden tests import :mod:`grader.checks` (measurement checks, plausibility, tamper
detection). Importing this package stays cheap and never imports nbgrader: the notebooks
import ``grader.checks`` on Colab, where nbgrader is not installed.

Layout: ``grader/nbgrader_config.py`` and ``grader/source/<assignment>/`` make this folder
an nbgrader course root; ``course.py`` (temporary course copies, nbgrader calls),
``submissions.py`` (reading and repairing submitted notebooks), ``batch.py`` (parallel
grading, grades.csv), ``worker.py`` (one submission in its own process), ``release.py``,
``selfcheck.py``.
"""
import sys
import types
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = COURSE_ROOT.parent
SOURCE_DIR = COURSE_ROOT / "source"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
_PATHS = {"COURSE_ROOT": COURSE_ROOT, "REPO_ROOT": REPO_ROOT, "SOURCE_DIR": SOURCE_DIR, "NOTEBOOKS_DIR": NOTEBOOKS_DIR}


class _FixedPaths(types.ModuleType):
    """This package as a module whose path constants cannot be rebound. Hidden tests load the
    phase modules from ``grader.COURSE_ROOT``; a notebook that pointed it at a folder of its own
    would have them load its fakes. A speed bump, not a wall: the kernel is the learner's."""

    def __setattr__(self, name, value):
        if name in _PATHS:
            raise AttributeError(f"grader.{name} cannot be changed: the grader loads its tests from it")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in _PATHS:
            raise AttributeError(f"grader.{name} cannot be deleted")
        super().__delattr__(name)


for _name, _path in _PATHS.items():  # properties win over the module's __dict__, which a notebook can write
    setattr(_FixedPaths, _name, property(lambda self, _p=_path: _p))
sys.modules[__name__].__class__ = _FixedPaths
