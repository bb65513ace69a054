"""A module's bare name under ``utils`` (``utils/__init__.py``): the same module object as its home
in a subpackage, on import and with ``python -m``."""
from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import utils

ROOT = Path(utils.__file__).resolve().parent


def test_every_subpackage_module_has_its_bare_name_and_no_two_share_one():
    seen: dict[str, str] = {}
    for pkg in (m.name for m in pkgutil.iter_modules([str(ROOT)]) if m.ispkg):
        for mod in pkgutil.iter_modules([str(ROOT / pkg)]):
            assert mod.name not in seen, f"utils.{mod.name} is both utils.{seen[mod.name]} and utils.{pkg}"
            seen[mod.name] = pkg
    assert seen == utils.HOME
    assert "kvcache" in seen and "plots" not in seen and "kv" not in seen  # top-level names keep their meaning


def test_a_bare_name_is_the_same_module_object():
    assert importlib.import_module("utils.kvcache") is importlib.import_module("utils.kv.kvcache")
    from utils import flops
    from utils.measure import flops as real

    assert flops is real
    # a module below a bare-named package, imported through the bare name, is not imported twice
    assert importlib.import_module("utils.loadgen.metrics") is importlib.import_module("utils.serving.loadgen.metrics")


def test_an_unknown_name_is_still_an_import_error():
    try:
        importlib.import_module("utils.no_such_module")
    except ModuleNotFoundError as e:
        assert e.name == "utils.no_such_module"
    else:
        raise AssertionError("utils.no_such_module imported")


def test_python_dash_m_runs_a_module_by_its_bare_name():
    args = ["--layers", "2", "--kv-heads", "1", "--head-dim", "8", "--max-model-len", "128", "--vllm-version", "0.32.0",
            "--json"]
    bare, real = (subprocess.run([sys.executable, "-m", name, *args], capture_output=True, text=True, timeout=120,
                                 cwd=ROOT.parent) for name in ("utils.kvcache", "utils.kv.kvcache"))
    assert bare.returncode == 0, bare.stderr
    assert json.loads(bare.stdout) == json.loads(real.stdout)
