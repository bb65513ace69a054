"""The labs, registered once: assignment id -> the folder that holds everything of that lab.

A lab's folder (``grader/labs/<name>/``) holds its sizes per tier (``sizes``), its plan and memory
model with its measured peaks (``plan``), what its setup installs (``setup``), its answers schema
(``answers``, which the portfolio, ``grader/portfolio/``, also reads), its judges and the grader's
reference measurements. Adding a seventh lab is one folder and one line in :data:`REGISTRY`.

The folder's public modules (``sizes``, ``answers``, ``plan``, ``setup``) ship in the
student edition; the grading ones (``judges``, ``reference``, ``harness``) do not, and are
imported only when a lab is graded (:attr:`Lab.judges`).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from types import ModuleType
from typing import Any

from grader.schema import Spec

REGISTRY = {
    "00_foundations": "foundations",
    "01_single_gpu": "single_gpu",
    "02_multi_gpu": "multi_gpu",
    "03_inference_serving": "inference_serving",
    "04_benchmarking_production": "benchmarking_production",
    "05_hardware_and_cost": "hardware_and_cost",
}
PRIVATE = ("judges", "reference", "harness", "rules")  # modules of a lab folder the student edition leaves out


@dataclasses.dataclass(frozen=True)
class Answer:
    """One answer a graded cell hands to the grader: its spec and the expression the notebook's
    kernel evaluates for it (its name, or a projection such as ``monitor.summary()``)."""

    spec: Spec
    expr: str = ""


def answers(**specs: Spec | Answer) -> dict[str, Answer]:
    """A graded cell's answers, by name: ``answers(matmul_tflops=Number("TFLOP/s"), ...)``."""
    out = {}
    for name, value in specs.items():
        a = value if isinstance(value, Answer) else Answer(value)
        out[name] = a if a.expr else dataclasses.replace(a, expr=name)
    return out


class LabError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class Lab:
    """One registered lab: its public modules on attribute access, its grading modules on demand."""

    def __init__(self, assignment: str, package: str):
        self.assignment, self.package = assignment, package
        self.module = importlib.import_module(package)

    def part(self, name: str) -> ModuleType | None:
        """``grader.labs.<lab>.<name>``, or None where it is not shipped (the student edition)."""
        try:
            return importlib.import_module(f"{self.package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{self.package}.{name}":
                return None
            raise

    @functools.cached_property
    def answers(self) -> dict[str, dict[str, Answer]]:
        return self.part("answers").ANSWERS

    @property
    def judges(self) -> ModuleType:
        mod = self.part("judges")
        if mod is None:
            raise LabError(f"{self.assignment}'s judges are not in this copy of the course (the student edition "
                           "has the visible tests only)")
        return mod

    def sizes(self, tier: str | None = None) -> Any:
        """This lab's sizes for ``tier`` (default: this device's): :func:`sizes`."""
        return sizes(self.assignment, tier)

    def __repr__(self) -> str:
        return f"Lab({self.assignment!r})"


@functools.cache
def load(assignment: str) -> Lab:
    """The lab registered as ``assignment`` (``"00_foundations"``); LabError naming the known ones."""
    if assignment not in REGISTRY:
        raise LabError(f"no lab {assignment!r}; the labs are {', '.join(REGISTRY)}")
    return Lab(assignment, f"{__name__}.{REGISTRY[assignment]}")


def sizes(assignment: str, tier: str | None = None) -> Any:
    """The sizes of ``assignment`` (``"00_foundations"``) for ``tier``: one of ``utils.course.env.TIERS``, default
    this device's (``utils.course.env.device_tier``). With no tier given, a smaller tier forced on a bigger GPU
    (``GPULAB_TIER``) also caps this process to the rehearsed card's memory and dtype, and says so once
    (``utils.device.rehearsal.apply``). LabError for an unknown lab, ValueError for an unknown tier."""
    from utils.course import env
    from utils.device import rehearsal

    table = load(assignment).part("sizes").BY_TIER
    if tier is None:
        line = rehearsal.apply()
        if line and line not in _SAID:
            _SAID.add(line)
            print(line)
        tier = env.device_tier()
    if tier not in table:
        raise ValueError(f"no {tier!r} sizes for {assignment}; the tiers are {', '.join(table)}")
    return table[tier]


_SAID: set[str] = set()


class PrintsPlan:
    """A lab's sizes (a frozen dataclass in its ``sizes.py``) print (``str``, what ``print(SIZES)``
    shows) as their tier plan, ``utils.course.tier_plan``: the card, dtype, ``torch.compile``, what runs,
    what is skipped and why, and whether it fits the card's memory. ``repr``, fields, ``==`` and
    ``dataclasses.asdict`` stay the dataclass's."""

    def __str__(self) -> str:
        try:
            import sys

            from utils.course import env, tier_plan

            own = sys.modules[type(self).__module__]  # the lab's sizes.py: its ASSIGNMENT and BY_TIER
            tier = next((t for t, s in own.BY_TIER.items() if s is self), None) or next(  # two tiers may hold equal sizes
                (t for t, s in own.BY_TIER.items() if s == self), env.device_tier())
            return tier_plan.describe(self, plan(own.ASSIGNMENT), tier, env.smoke_mode(), plans_on)
        except Exception as exc:  # the sizes still print when the plan cannot be made
            return f"{self!r}\n(no plan: {type(exc).__name__}: {exc})"


def plan(assignment: str) -> ModuleType:
    """The lab's plan (``grader/labs/<lab>/plan.py``): what it runs and skips on a card, where its memory
    peaks, its measured peaks; ``utils.course.tier_plan`` makes a printed plan of it."""
    return load(assignment).part("plan")


def plan_for(assignment: str, card: Any, lab_sizes: Any = None, tier: str | None = None) -> Any:
    """``utils.course.tier_plan.plan_for`` of ``assignment`` on ``card`` (a ``utils.course.tier_plan.Card``), at
    ``lab_sizes`` (default: the lab's sizes of the tier the card gets)."""
    from utils.course import tier_plan

    p = plan(assignment)
    tier = tier or tier_plan.sizes_tier(p, card)
    return tier_plan.plan_for(p, card, sizes(assignment, tier) if lab_sizes is None else lab_sizes, tier)


def plans_on(card: Any) -> list:
    """Every lab's plan on ``card``, in the labs' order."""
    return [plan_for(a, card) for a in REGISTRY]


def measured_peaks() -> tuple:
    """Every lab's measured peaks (``MEASURED_PEAKS`` in its ``plan.py``), in the labs' order."""
    return tuple(r for a in REGISTRY for r in plan(a).MEASURED_PEAKS)


def has(assignment: str, part: str) -> bool:
    """Whether ``assignment`` is a registered lab whose folder holds the module ``part`` here."""
    return assignment in REGISTRY and load(assignment).part(part) is not None


def assignments() -> tuple[str, ...]:
    return tuple(REGISTRY)
