"""Run under a vLLM interpreter: start vLLM's engine on several model directories, one after the
other, in this one process, and print what each allocated. For tests/integration/test_vllm.py.

    <vllm python> tests/integration/vllm_kv_batch.py JOBS.json

``JOBS.json``: ``[{"name": ..., "model": DIR, "args": {...}}]``, ``args`` passed to
``vllm.LLM`` (``max_model_len``, ``kv_cache_memory_bytes``, ``max_num_batched_tokens``,
``block_size``, ``kv_cache_dtype``). Each engine is built as ``vllm serve`` builds one (the same
config, KV-cache sizing and start-up log), without compilation (``enforce_eager``), in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor): vLLM is imported once, not
three times per start as ``vllm serve`` does, so a start costs seconds instead of a minute.
vLLM logs some lines once per process (``logger.info_once``); that memo is cleared before each
job so every job logs its own ``KV cache size`` line. After each job the engine's parallel groups
and process group are torn down (``cleanup_dist_env_and_memory``, as vLLM's own tests do between
engines): vLLM creates the expert-parallel group only when the first model of a process is a MoE
one, so without this a MoE model after a dense one fails ("expert parallel group is not
initialized"). vLLM inspects each architecture's class in a fresh interpreter (``registry.py``
``_run_in_subprocess``, about 10 s each on a 2-core machine, cached in ``VLLM_CACHE_ROOT``
under one file name for every release, so two releases evict each other's entries); this
process has no GPU to keep uninitialized, so it inspects them in place, and keeps its cache
beside ``JOBS.json``. Neither changes what is allocated.

Stdout and stderr carry vLLM's log; each job's part lies between ``@@BEGIN name`` and ``@@END
name SECONDS``, with ``@@FACTS {json}`` (the engine's resolved block size and block count) or
``@@ERROR type: message`` before the end.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the CPU build would let it override kv_cache_memory_bytes


def _clear_once_memo() -> None:
    import vllm.logger as vllm_logger

    for name in dir(vllm_logger):
        fn = getattr(vllm_logger, name)
        if name.startswith("_print_") and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def main(jobs_path: str) -> int:
    t0 = time.monotonic()
    os.environ["VLLM_CACHE_ROOT"] = os.path.join(os.path.dirname(os.path.abspath(jobs_path)), "vllm-cache")
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # inspect model classes here, not in a fresh interpreter each

    print(f"@@IMPORT {time.monotonic() - t0:.1f}", flush=True)
    for job in json.loads(open(jobs_path, encoding="utf-8").read()):
        _clear_once_memo()
        t = time.monotonic()
        print(f"@@BEGIN {job['name']}", flush=True)
        try:
            llm = LLM(model=job["model"], enforce_eager=True, dtype="bfloat16", distributed_executor_backend="uni",
                      **job.get("args", {}))
            cache = llm.llm_engine.vllm_config.cache_config
            print("@@FACTS " + json.dumps({"block_size": cache.block_size, "num_gpu_blocks": cache.num_gpu_blocks}),
                  flush=True)
            del llm
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            print(f"@@ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
        gc.collect()
        cleanup_dist_env_and_memory()
        print(f"@@END {job['name']} {time.monotonic() - t:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
