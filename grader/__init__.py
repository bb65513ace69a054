"""grader: the course's nbgrader root and the code that grades, outside the learner's kernel.

``python -m grader release [--check]`` writes ``notebooks/`` from ``grader/source/``;
``python -m grader check NOTEBOOK`` grades one notebook for self-study;
``python -m grader autograde --assignment ID --submissions DIR --out DIR`` grades a class.
The notebooks import :mod:`grader.checks` (their visible tests' helpers and the record cell) and
``utils``; each graded cell is decided by its lab's judge (``grader/labs/<lab>/judges.py``) in the
grader's own process, after the kernel is gone (docs/grading.md, docs/architecture.md). Importing
this package stays cheap and never imports nbgrader: the notebooks import ``grader.checks`` on
Colab, where nbgrader is not installed.

Layout: ``grader/nbgrader_config.py`` and ``grader/source/<assignment>/`` make this folder
an nbgrader course root; ``course.py`` (temporary course copies, nbgrader calls),
``preprocessors.py`` (the grader's steps in nbgrader's pipeline), ``submissions.py`` (reading and
repairing submitted notebooks), ``batch.py`` (parallel grading, grades.csv), ``worker.py`` (one
submission in its own process), ``release.py``, ``selfcheck.py``.
"""
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = COURSE_ROOT.parent
SOURCE_DIR = COURSE_ROOT / "source"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
