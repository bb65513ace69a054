"""Lab 05's grading paths that only a GPU exercises; skipped without CUDA.

- the grader's own measurements on the GPU (``reference.measure`` on this machine's context: the
  tensor-core matmul, the copy, gpt2-small's training step and decode, a checkpoint of 1.5 GB, JAX on
  whatever backend it has, and the uninterrupted checkpointed run on CUDA with deterministic cuBLAS),
  each below the datasheet and banded by the GPU floors;
- the kill-and-resume experiment on CUDA through ``judge_all``: the interrupted run in the hidden-cases
  sandbox (within the sandbox's 30 s per call, a 1.5 GB checkpoint included), the resumed run in a fresh
  sandbox, both with CUDA's generator in the learner's RNG state, bit-identical to the grader's run; a
  restore that forgets CUDA's generator fails.

On a GPU machine, from the repository root::

    python -m pytest -m gpu tests/grader/labs/test_hardware_and_cost_gpu.py -v -p no:cacheprovider

(then ``python -m grader check grader/source/05_hardware_and_cost/05_hardware_and_cost.ipynb`` for the
whole lab).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from grader import context, expect
from grader.labs.hardware_and_cost import reference
from tests.grader.labs.test_hardware_and_cost_sandbox import ASSIGNMENT, SOURCE, changed, grade

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_graders_own_measurements_on_this_gpu():
    ctx = context.live(ASSIGNMENT)
    assert ctx.device == "cuda" and ctx.spec is not None, ctx
    r = reference.measure(ctx, frozenset(("points", "train", "decode", "checkpoint", "xla", "resume")), 1.0, {})
    for key, m in r.measured.items():
        assert m.value > 0 and expect.GPU_FLOOR <= m.rel <= max(expect.GPU_CAP, reference.SAVE_FLOOR), (key, m)
    assert r.measured["matmul"].value <= ctx.spec.peak_tflops(ctx.dtype) * expect.DATASHEET_SLACK
    assert r.measured["copy"].value <= ctx.spec.bandwidth_gbs * expect.DATASHEET_SLACK
    for b in reference.decode_batches(ctx.sizes):  # decode reads every weight once per step: not above the bandwidth
        assert r.weight_bytes / (r.measured[f"tpot:{b}"].value * 1e-3) / 1e9 <= ctx.spec.bandwidth_gbs
    config = dataclasses.asdict(reference.run_config(ctx.sizes, "cuda"))
    assert r.resume_digests(config) and len(r.compiles) == 1


@pytest.mark.parametrize("forgets_cuda", [False, True], ids=["right", "forgets-cuda"])
def test_the_kill_and_resume_on_this_gpu(forgets_cuda, tmp_path):
    nb = changed(rng_answer=("        torch.cuda.set_rng_state_all(state[\"cuda\"])\n", "        pass\n")) \
        if forgets_cuda else SOURCE
    v = grade(nb, ("test_resume",), tmp_path, seed=3)["test_resume"]
    if forgets_cuda:
        assert v.points == 0 and "cuda" in v.message, v
    else:
        assert v.points == 1 and "bit-identical" in " ".join(v.notes), v
