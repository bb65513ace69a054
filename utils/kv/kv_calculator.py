"""What lab 03's ``kv_cache_calculator`` exercise returns, by vLLM's arithmetic: one function.

The exercise (``grader/source/03_inference_serving``, section 3) asks for
``kv_cache_calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib,
block_size=16)`` returning ``bytes_per_token``, ``cache_bytes`` (``batch`` sequences of
``context`` tokens, unpaged), ``num_blocks`` (vLLM's blocks in ``kv_memory_gib`` GiB) and
``max_concurrency`` (requests of ``context`` tokens). :func:`calculator` gives the same dict from
the code path ``python -m utils.kv.kvcache`` runs (``utils.kv.kvcache.KVSpec`` and
``utils.kv.vllm_kv.vllm_plan`` for a vLLM release): the grader's judges compare the learner's
function with it, on drawn shapes, and nothing else. Where the course's KV arithmetic changes
(vLLM releases, hybrid models), this function changes, not the judges.

Which release: ``vllm_version=None`` is the newest release the calculator knows
(``utils.kv.vllm_releases.NEWEST_KNOWN``), whose rule for these plain full-attention shapes is the
lab's (blocks / ceil(context / block_size), every release from 0.9.1 on); it never depends
on what is installed where the grader runs, so a grade cannot change with the grading machine.
``vllm_version="installed"`` models the vLLM ``utils.serving.engines`` finds (else the newest known),
as the command line does; any version string models that release.
"""
from __future__ import annotations

from utils.kv.kvcache import KVSpec, dtype_bytes
from utils.kv.vllm_kv import vllm_plan
from utils.kv.vllm_releases import vllm_release
from utils.serving import engines
from utils.units import GIB

DTYPES = ("fp32", "bf16", "fp16", "fp8")  # the exercise's dtype names


def calculator(layers: int, kv_heads: int, head_dim: int, dtype: str, batch: int, context: int,
               kv_memory_gib: float, block_size: int = 16, *, vllm_version: str | None = None) -> dict:
    """``{"bytes_per_token", "cache_bytes", "num_blocks", "max_concurrency"}`` of the exercise, as
    vLLM computes them: ``num_blocks = int(kv_memory_gib x 2^30) // page // layers`` with a page of
    ``2 x block_size x kv_heads x head_dim x bytes``, ``max_concurrency = num_blocks /
    ceil(context / block_size)`` (releases before 0.9.1: ``num_blocks x block_size / context``)."""
    release = engines.vllm_release_here()[0] if vllm_version == "installed" else vllm_release(vllm_version)
    spec = KVSpec(int(layers), int(kv_heads), int(head_dim), dtype_bytes(dtype))
    plan = vllm_plan(spec, int(context), int(kv_memory_gib * GIB), batch=int(batch), block_size=int(block_size),
                     release=release)
    return {"bytes_per_token": plan.bytes_per_token, "cache_bytes": plan.batch_kv_bytes_unpaged,
            "num_blocks": plan.num_blocks, "max_concurrency": plan.max_concurrency}
