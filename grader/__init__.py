"""grader: the course's nbgrader root and the code that grades on measured numbers.

``python -m grader release [--check]`` writes ``notebooks/`` from ``grader/source/``;
``python -m grader check NOTEBOOK`` grades one notebook for self-study;
``python -m grader autograde --assignment ID --submissions DIR --out DIR`` grades a class.
Notebooks import :mod:`grader.checks` (measurement checks, plausibility, the record file)
and ``utils``; hidden tests get their checks from :func:`phase`. Importing this package stays
cheap and never imports nbgrader: the notebooks import ``grader.checks`` on Colab, where
nbgrader is not installed.

Each phase N has two modules: ``phaseN.py`` (the live checks, re-measured in the learner's
kernel) and ``phaseN_records.py`` (writing the measurement record, and grading it where no
GPU is at hand). ``phase(N)`` executes ``tamper.py``, ``checks.py``, ``remeasure.py``,
``phaseN_records.py`` and ``phaseN.py`` anew from this folder, registered nowhere in ``sys.modules``, and points
each at the others' fresh copies: a notebook that rebinds ``grader.checks`` or patches a
function of an imported grader module cannot change what grades it. ``phase`` and the path
constants cannot be rebound on this package either (:class:`_FixedPaths`).

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
    """This package as a module whose path constants and :func:`phase` cannot be rebound. Hidden
    tests load their checks through ``grader.phase``; a notebook that pointed it (or the paths)
    at code of its own would have them load its fakes. A speed bump, not a wall: the kernel is
    the learner's."""

    def __setattr__(self, name, value):
        if name in _FIXED:
            raise AttributeError(f"grader.{name} cannot be changed: the grader loads its tests from it")
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in _FIXED:
            raise AttributeError(f"grader.{name} cannot be deleted")
        super().__delattr__(name)


# Checks of a phase kept in a file of their own, loaded with it: phase(2).kernels is phase2_kernels.py
EXTRA_MODULES = {2: {"kernels": "phase2_kernels"}, 4: {"containers": "phase4_containers"}}


def _fresh_loader(root: Path):
    """:func:`phase`, reading its files from ``root`` (held in the closure: a notebook can
    write this package's ``__dict__``, not a closure cell)."""
    import importlib.util

    extra = {n: dict(m) for n, m in EXTRA_MODULES.items()}  # copied into the closure, as root is

    def fresh(name: str, **wiring: types.ModuleType) -> types.ModuleType:
        spec = importlib.util.spec_from_file_location(f"_gpulab_fresh_{name}", root / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for attr, dep in wiring.items():  # the modules look these names up at call time
            setattr(mod, attr, dep)
        return mod

    def phase(number: int) -> types.ModuleType:
        """Phase ``number``'s checks (``grader/phaseN.py``), freshly loaded with fresh copies
        of ``checks``, ``phaseN_records`` and ``remeasure`` as its ``checks``, ``records``
        and ``remeasure``, and the phase's further check files (:data:`EXTRA_MODULES`) as attributes."""
        if type(number) is not int or not 0 <= number <= 5:
            raise ValueError(f"phase must be 0 to 5, got {number!r}")
        tamper = fresh("tamper")
        checks = fresh("checks", tamper=tamper)
        remeasure = fresh("remeasure", checks=checks)
        records = fresh(f"phase{number}_records", checks=checks)
        mod = fresh(f"phase{number}", checks=checks, records=records, remeasure=remeasure)
        for attr, name in extra.get(number, {}).items():  # a phase's further checks, as phase(N).<attr>
            setattr(mod, attr, fresh(name, checks=checks, remeasure=remeasure))
        return mod

    return phase


phase = _fresh_loader(COURSE_ROOT)
_FIXED = {**_PATHS, "phase": phase}

for _name, _value in _FIXED.items():  # properties win over the module's __dict__, which a notebook can write
    setattr(_FixedPaths, _name, property(lambda self, _v=_value: _v))
sys.modules[__name__].__class__ = _FixedPaths
