"""What lab 03's ``kv_cache_calculator`` exercise returns, by vLLM's arithmetic: one function.

The exercise (``grader/source/03_inference_serving``, section 3) asks for
``kv_cache_calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib,
block_size=16)`` returning ``bytes_per_token``, ``cache_bytes`` (``batch`` sequences of
``context`` tokens, unpaged), ``num_blocks`` (vLLM's blocks in ``kv_memory_gib`` GiB) and
``max_concurrency`` (requests of ``context`` tokens). :func:`calculator` gives the same dict from
``utils.kvcache`` and ``utils.vllm_kv`` (the v1 engine's counts, full-attention layers): the
grader's judges compare the learner's function with it, on drawn shapes, and nothing else. Where
the course's KV arithmetic changes (vLLM releases, hybrid models), this function changes, not
the judges.
"""
from __future__ import annotations

from utils.kvcache import KVSpec, dtype_bytes
from utils.units import GIB
from utils.vllm_kv import vllm_plan

DTYPES = ("fp32", "bf16", "fp16", "fp8")  # the exercise's dtype names


def calculator(layers: int, kv_heads: int, head_dim: int, dtype: str, batch: int, context: int,
               kv_memory_gib: float, block_size: int = 16) -> dict:
    """``{"bytes_per_token", "cache_bytes", "num_blocks", "max_concurrency"}`` of the exercise, as
    vLLM computes them: ``num_blocks = int(kv_memory_gib x 2^30) // page // layers`` with a page of
    ``2 x block_size x kv_heads x head_dim x bytes``, ``max_concurrency = num_blocks /
    ceil(context / block_size)``."""
    spec = KVSpec(int(layers), int(kv_heads), int(head_dim), dtype_bytes(dtype))
    plan = vllm_plan(spec, int(context), int(kv_memory_gib * GIB), batch=int(batch), block_size=int(block_size),
                     token_formula="blocks", concurrency_formula="blocks")
    return {"bytes_per_token": plan.bytes_per_token, "cache_bytes": plan.batch_kv_bytes_unpaged,
            "num_blocks": plan.num_blocks, "max_concurrency": plan.max_concurrency}
