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
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = COURSE_ROOT.parent
SOURCE_DIR = COURSE_ROOT / "source"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
