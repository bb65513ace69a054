"""Inference and serving: prefill and decode, paged batching, engines started from Python, and a load generator for
OpenAI-compatible servers.

- ``inference``: inference measurements for phase 3: prefill vs decode, decode bandwidth, KV-cache growth, batching,
  and the serving engines (vLLM where it runs, transformers' continuous batching where it does not).
- ``decode``: decoding one token at a time, three ways, from overhead-bound to memory-bound.
- ``paged_batching``: lab 03's serving exercise: a paged KV cache that a scheduler written by the learner drives.
- ``serve``: serve a model with an existing engine (``transformers serve``, vLLM, SGLang), started and stopped from
  Python.
- ``engines``: serving engines: where each is installed, the command line that starts it, and the facts it reports
  at start-up (the KV memory and tokens it allocated, its block size and concurrency).
- ``loadgen``: a load generator for any OpenAI-compatible server (vLLM, SGLang, TGI, ``transformers serve``).
"""
