"""``grader.phase(N)``: each lab's checks loaded afresh, wired to fresh copies of the modules
they use, and every name a phase module, its records module or its notebook's hidden tests
look up on those copies exists (a typo there fails only when that cell is graded, on a GPU
for some)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import grader

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", range(6))
def test_each_phase_is_fresh_and_wired(n):
    a, b = grader.phase(n), grader.phase(n)
    assert a is not b and a.checks is not b.checks  # a fresh copy per hidden test
    assert a.records.checks is a.checks and a.remeasure.checks is a.checks and a.checks.tamper is not None
    assert f"grader.phase{n}" not in sys.modules or sys.modules[f"grader.phase{n}"] is not a


@pytest.mark.parametrize("n", range(6))
def test_every_name_looked_up_on_the_wired_modules_exists(n):
    p = grader.phase(n)
    wired = {"checks": p.checks, "records": p.records, "remeasure": p.remeasure, "tamper": p.checks.tamper, f"_p{n}": p}
    texts = {f"grader/phase{n}.py": (ROOT / "grader" / f"phase{n}.py").read_text(),
             f"grader/phase{n}_records.py": (ROOT / "grader" / f"phase{n}_records.py").read_text()}
    (nb,) = (ROOT / "grader" / "source").glob(f"0{n}_*/*.ipynb")
    texts[str(nb.relative_to(ROOT))] = nb.read_text()
    missing = sorted({f"{where}: {mod}.{attr}" for where, text in texts.items()
                      for mod, attr in re.findall(rf"(?<![\w.])(checks|records|remeasure|tamper|_p{n})\.(\w+)", text)
                      if attr != "py" and not hasattr(wired[mod], attr)})  # "checks.py" is a file name
    assert not missing, missing


def test_phase_numbers_are_checked():
    for bad in (6, -1, "0", 1.0):
        with pytest.raises(ValueError, match="phase must be 0 to 5"):
            grader.phase(bad)
