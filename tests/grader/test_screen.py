"""The static screen of a submission's own code (grader/screen.py): each way known to reach
into the kernel or the grader is found, whatever it is called, and no reference answer of any
lab is flagged."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.screen import screen_notebook, screen_source

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENTS = ("00_foundations", "01_single_gpu", "02_multi_gpu", "03_inference_serving",
               "04_benchmarking_production", "05_hardware_and_cost")

# The input transformer that, appended in the first answer cell, turned every later test cell
# into `pass` and scored full marks on the unsolved release.
FIVE_LINES = '''ip = get_ipython()
def _t(lines):
    text = "".join(lines)
    return ["pass\\n"] if ("checks." in text or "assert" in text) else lines
ip.input_transformers_cleanup.append(_t)
'''

HOSTILE = {
    "five-line transformer": FIVE_LINES,
    "the kernel under another name": "k = __builtins__['get_' + 'ipython']()\n",
    "an AST transformer": "import IPython\nIPython.get_ipython().ast_transformers.append(object())\n",
    "an event callback": "sh = get_ipython()\nsh.events.register('pre_run_cell', lambda info: None)\n",
    "a display hook": "import sys\nsys.displayhook = lambda v: None\n",
    "a patched builtin": "import builtins\nbuiltins.abs = lambda x: 0\n",
    "a builtin patched through the module dict": "__builtins__.__dict__['abs'] = lambda x: 0\n",
    "an obfuscated import": "m = __import__('bui' + 'ltins')\n",
    "importlib": "import importlib\nm = importlib.import_module('builtins')\n",
    "an aliased importlib": "from importlib import import_module as im\n",
    "a replaced check": "from grader import checks\nchecks.assert_close = lambda *a, **k: None\n",
    "a replaced check by setattr": "import grader.checks as c\nsetattr(c, 'assert_close', print)\n",
    "a utils function replaced": "from utils import timing\ntiming.benchmark = lambda *a, **k: 1.0\n",
    "a module attribute by a computed name": "import utils\nf = getattr(utils, 'tim' + 'ing')\n",
    "a caller's frame": "import sys\ng = sys._getframe(1).f_globals\n",
    "a tracer": "import sys\nsys.settrace(lambda *a: None)\n",
    "the module table": "import sys\nsys.modules['grader.checks'] = None\n",
    "the import path": "import sys\nsys.path.insert(0, '/tmp/evil')\n",
    "a function's code": "def f():\n    pass\nf.__code__ = (lambda: 1).__code__\n",
    "a value equal to anything": "class Any:\n    def __eq__(self, other):\n        return True\nBOTTLENECK = Any()\n",
    "a float that lies": "class F(float):\n    def __float__(self):\n        return 1.0\n",
    "exec": "exec('x = 1')\n",
    "eval": "y = eval('1 + 1')\n",
    "globals": "globals()['checks'] = None\n",
    "ctypes": "import ctypes\n",
    "gc": "import gc\nobjs = gc.get_objects()\n",
    "a grader file rewritten": "open('grader/checks.py', 'w').write('')\n",
    "a file rewritten through pathlib": "from pathlib import Path\nPath('grader/checks.py').write_text('')\n",
    "a shell command": "!rm -rf grader\n",
    "a shell command through os": "import os\nos.system('true')\n",
    "the grader's environment": "import os\nos.environ['GPULAB_SMOKE'] = '1'\n",
    "an unsafe magic": "%load_ext evil\n",
    "a hostile body under %%time": "%%time\nimport builtins\nbuiltins.len = None\n",
    "a signal handler": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n",
    "an exit hook": "import atexit\natexit.register(print)\n",
    "a class swapped under a value": "x = 1.0\nclass G: pass\ng = G()\ng.__class__ = G\n",
}

HONEST = {
    "arithmetic": "def mfu(tps, flops_per_token, peak_tflops):\n    return tps * flops_per_token / (peak_tflops * 1e12)\n",
    "numpy and torch": "import numpy as np\nimport torch\nx = np.median([1.0, 2.0])\nt = torch.ones(3).sum().item()\n",
    "os.path": "import os\np = os.path.join('a', 'b')\nv = os.environ.get('HOME')\n",
    "str.replace and a path attribute": "s = 'a-b'.replace('-', '_')\nclass C:\n    path = 'x'\nc = C()\nq = c.path\n",
    "a constant getattr": "import torch\ndt = getattr(torch, 'float16')\n",
    "getattr on an object": "class C:\n    a = 1\nv = getattr(C(), name)\n" .replace("name", "'a'"),
    "reading a file": "with open('data.txt') as f:\n    pass\n",
    "a dataclass": "from dataclasses import dataclass\n@dataclass\nclass Row:\n    ms: float\n",
    "timeit and time": "%timeit sum(range(10))\n%time y = 1\n",
    "a time cell": "%%time\nz = [i * i for i in range(100)]\n",
    "a comprehension and f-string": "rows = {k: v for k, v in [('a', 1)]}\nprint(f\"{rows['a']:.2f}\")\n",
    "sys for printing": "import sys\nprint('x', file=sys.stderr)\n",
    "a crash costs only the learner": "import os\nos._exit(1)\n",
    "a typo (it fails when graded, it is no cheat)": "def broken(:\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_way_in_is_found(name):
    found = screen_source(HOSTILE[name], "answer")
    assert found, f"{name}: not found in\n{HOSTILE[name]}"
    assert all(f.cell == "answer" and f.line >= 1 and f.reason for f in found)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_everyday_code_is_not_flagged(name):
    assert screen_source(HONEST[name], "answer") == [], HONEST[name]


def test_the_five_lines_are_named_with_their_lines():
    found = {(f.line, f.reason) for f in screen_source(FIVE_LINES, "matmul_answer")}
    assert (1, "reaches into the IPython kernel") in found
    assert (5, "rewrites later cells") in found


def _release(assignment: str) -> dict:
    return json.loads((ROOT / "notebooks" / f"{assignment}.ipynb").read_text())


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_reference_answer_is_flagged(assignment):
    from grader.release import reference_submission

    ref = reference_submission(assignment)
    assert screen_notebook(ref, _release(assignment)) == []
    # and the screen did read the answers: every solution cell differs from the release's
    changed = [c for c in ref["cells"] if c["cell_type"] == "code"
               and c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    assert changed


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_cheat_in_an_answer_or_a_new_cell_is_found(assignment):
    from grader.release import reference_submission

    ref = reference_submission(assignment)
    answer = next(c for c in ref["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")
                  and c["cell_type"] == "code")
    answer["source"] = FIVE_LINES + "".join(answer["source"])
    ref["cells"].append({"cell_type": "code", "metadata": {"nbgrader": {"locked": True}}, "source": "import gc\n",
                         "outputs": [], "execution_count": None})
    found = screen_notebook(ref, _release(assignment))
    cells = {f.cell for f in found}
    assert answer["metadata"]["nbgrader"]["grade_id"] in cells
    assert f"cell {len(ref['cells'])}" in cells, "a cell claiming to be locked is still the learner's"


def test_a_cell_restored_from_the_release_is_not_read():
    rel = {"cells": [{"cell_type": "code", "source": "import importlib\n",
                      "metadata": {"nbgrader": {"grade_id": "t", "grade": True, "solution": False, "points": 1}}}]}
    sub = {"cells": [{"cell_type": "code", "source": "import gc\n",
                      "metadata": {"nbgrader": {"grade_id": "t", "grade": True, "solution": False, "points": 1}}}]}
    assert screen_notebook(sub, rel) == []  # nbgrader puts the test cell back before it runs
