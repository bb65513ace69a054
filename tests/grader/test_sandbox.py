"""The sandbox: the learner's definitions alone, in a process of their own, answering in plain data
(grader/sandbox.py). The course's implementation of a rule is unreachable from an answer by every
route a learner who read this file would try: a direct call, an alias, a thread, a reload, the source
file, another process, the garbage collector, ctypes, the network."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from grader import definitions
from grader.sandbox import Sandbox, SandboxError

CODE = definitions.read_code()
ARGS = [[1.0, 0.5, 989.0, 3350.0]]  # an intensity far below the ridge: "memory" by the rule

HONEST = """
def honest(i, a, p, b):
    roof = min(p, i * b / 1e3)
    if a < 0.1 * roof:
        return "overhead"
    return "compute" if i >= p * 1e3 / b else "memory"
"""
CHEATS = {
    "direct": "def f(i, a, p, b):\n    from utils.measure.flops import bound\n    return bound(i, p, b, a)",
    "alias": "def f(i, a, p, b):\n    return sys.modules['utils.measure.flops'].__dict__['bound'](i, p, b, a)",
    "thread": textwrap.dedent("""
        def f(i, a, p, b):
            import threading
            out = []
            t = threading.Thread(target=lambda: out.append(flops.bound(i, p, b, a)))
            t.start(); t.join()
            return out[0]"""),
    "reload": "def f(i, a, p, b):\n    import importlib\n    return importlib.reload(flops).bound(i, p, b, a)",
    "fresh_import": textwrap.dedent("""
        def f(i, a, p, b):
            import importlib
            del sys.modules['utils.measure.flops']
            return importlib.import_module('utils.measure.flops').bound(i, p, b, a)"""),
    "source": textwrap.dedent("""
        def f(i, a, p, b):
            ns = {}
            exec(open(flops.__file__).read(), ns)
            return ns['bound'](i, p, b, a)"""),
    "process": textwrap.dedent("""
        def f(i, a, p, b):
            import subprocess
            code = f'from utils.measure.flops import bound; print(bound({i}, {p}, {b}, {a}))'
            return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout.strip()"""),
    "fork": textwrap.dedent("""
        def f(i, a, p, b):
            import multiprocessing as mp
            with mp.get_context('fork').Pool(1) as pool:
                return pool.apply(flops.bound, (i, p, b, a))"""),
    "gc": textwrap.dedent("""
        def f(i, a, p, b):
            import gc
            fs = [o for o in gc.get_objects() if getattr(o, '__name__', '') == 'bound']
            return fs[0](i, p, b, a)"""),
    "ctypes": "def f(i, a, p, b):\n    import ctypes\n    return ctypes.string_at(id(flops), 8)",
    "network": textwrap.dedent("""
        def f(i, a, p, b):
            import urllib.request
            return urllib.request.urlopen('https://raw.githubusercontent.com/x/y/main/utils/flops.py').read()"""),
}


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
    return definitions.write_code(CODE, tmp_path_factory.mktemp("code"))


def start(code_dir, tmp_path, definitions_src, *, prelude="import sys\nfrom utils import flops", forbid=("utils.measure.flops:bound",),
          strict=True, **job):
    return Sandbox({"prelude": [prelude], "definitions": [definitions_src], "policy": {"forbid": list(forbid),
                    "strict": strict}, **job}, code_dir, tmp_path / "sandbox.log")


def test_an_honest_rule_answers_and_every_route_to_the_course_rule_fails(code_dir, tmp_path):
    src = HONEST + "\n".join(c.replace("def f(", f"def {name}(") for name, c in CHEATS.items())
    with start(code_dir, tmp_path, src) as box:
        assert box.started.definition_errors == []
        assert box.call("honest", ARGS) == [{"ok": "memory"}]
        for name in CHEATS:
            (r,) = box.call(name, ARGS, timeout_s=60)
            assert "error" in r, f"{name}: reached the course's rule: {r}"
        # the tripwire reports itself on the reply pipe, whatever the answer did with the exception
        assert {"direct", "alias", "thread"} and len(box.ground_truth) >= 3


def test_only_definitions_load_and_a_class_body_runs_under_the_policy(code_dir, tmp_path):
    marker = tmp_path / "ran"
    src = textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("a statement that computes ran")  # not a definition: never runs here
        LIMIT = 0.5
        class Sneaky:
            import subprocess
            subprocess.run(["true"])  # a class body runs when defined: under the hook, so refused
        def uses_limit(x):
            return x > LIMIT
        """)
    nb = {"cells": [{"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade": False}}, "source": src}]}
    (kept,) = definitions.job(nb)["definitions"]  # what the grader reads of an answer cell
    with start(code_dir, tmp_path, kept) as box:
        assert not marker.exists()
        assert any("PermissionError" in e and "another process" in e for e in box.started.definition_errors)
        assert box.call("uses_limit", [[0.7], [0.2]]) == [{"ok": True}, {"ok": False}]


def test_objects_never_cross(code_dir, tmp_path):
    src = textwrap.dedent("""
        class Yes:
            def __eq__(self, other):
                return True
        def lie(*args):
            return Yes()
        def nan(*args):
            return float("nan")
        """)
    with start(code_dir, tmp_path, src) as box:
        assert box.call("lie", ARGS) == [{"ok": {"__unencodable__": "Yes"}}]
        assert box.call("nan", ARGS) == [{"ok": {"__nonfinite__": "nan"}}]


def test_a_stuck_or_dying_answer_costs_its_own_calls(code_dir, tmp_path):
    src = "import os\ndef stuck(*a):\n    while True:\n        pass\ndef die(*a):\n    os._exit(3)"
    with start(code_dir, tmp_path, src, strict=False) as box:
        assert "took over 1 s" in box.call("stuck", ARGS, per_call_s=1)[0]["error"]
        with pytest.raises(SandboxError, match="stopped"):
            box.call("die", ARGS)


def test_a_harness_is_timed_from_outside_and_its_seed_comes_late(code_dir, tmp_path):
    pkg = Path(code_dir) / "grader" / "labs" / "_timing_probe.py"
    pkg.write_text(textwrap.dedent("""
        def run(ns, params, clock):
            precomputed = ns["work"](0)          # before go: the seed is not known yet
            seed = clock.go("timed")
            clock.done("timed", ns["work"](seed))
            return {"precomputed": precomputed}
        """))
    src = "import time\ndef work(seed):\n    time.sleep(0.2)\n    return seed * 2"
    try:
        with start(code_dir, tmp_path, src, prelude="import sys", forbid=(), strict=False,
                   imports=["grader.labs._timing_probe"]) as box:
            t0 = time.perf_counter()
            result, sections = box.harness("grader.labs._timing_probe:run", {}, seeds={"timed": 21})
            wall = time.perf_counter() - t0
    finally:
        pkg.unlink()
    assert result == {"precomputed": 0} and sections["timed"].outputs == 42
    assert 0.2 <= sections["timed"].seconds < wall  # go to done only: the precomputation is not in it
