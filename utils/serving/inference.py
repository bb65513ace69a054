"""Inference measurements for phase 3: prefill vs decode, decode bandwidth, KV-cache growth,
batching, and the serving engines (vLLM where it runs, transformers' continuous batching
where it does not).

Decode reads, per step, every weight the step uses and the KV cache of every sequence in the
batch, so its achieved bandwidth is

    bytes per step = weights read + batch x context x KV bytes per token
    achieved GB/s  = bytes per step x steps per second / 1e9

compared with the copy bandwidth measured on the same device (:func:`measure_copy_bandwidth`:
a device-to-device copy reads and writes every byte; 4.2 TB/s for 1 GiB on one H200,
benchmarks/RESULTS.md). "Weights read" leaves out the input embedding table, of which a step
reads only ``batch`` rows (:func:`weight_bytes_read_per_step`); the KV count is the useful
context, not the padding a static cache also reads, so the achieved figure is a lower bound.
Time per output token follows vLLM's definition (docs/reference.md): ``(t(n) - t(1)) / (n - 1)``
for exactly ``n`` greedy tokens (:func:`measure_decode`), so the prefill and the fixed costs
of a call cancel.

The serving helpers measure an existing engine started by :func:`utils.serving.serve.start` (vLLM,
its GPU or CPU build, where installed; its start-up facts come from its own log and
``/metrics``); where none is installed, transformers' continuous batching
(``generate_batch``, :func:`continuous_batching`).
"""
from __future__ import annotations

import gc
import json
import random
import time
import urllib.request
from typing import Any

from utils.device import nvml
from utils.kv.kvcache import from_hf_config
from utils.kv.vllm_releases import vllm_formulas
from utils.units import GIB, gb_per_s, gib_print_range, transfer_ms

# -- bytes ----------------------------------------------------------------------------------------

def weight_bytes(model: Any) -> int:
    """Bytes of a module's parameters, each shared tensor counted once."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())


def weight_bytes_read_per_step(model: Any) -> int:
    """Weight bytes one decode step reads: every parameter except the input embedding table,
    unless the output head shares it (GPT-2), in which case the head reads it whole."""
    total = weight_bytes(model)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is not None and head.weight is emb:  # tied (HF ties by sharing the Parameter; meta tensors have no address)
        return total
    return total - emb.numel() * emb.element_size()


def kv_spec(model: Any):
    """:class:`utils.kv.kvcache.KVSpec` of a loaded model, its KV cache in the model's dtype."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return from_hf_config(model.config.to_dict(), kv_dtype=dtype)


def decode_bytes_per_step(weight_bytes_read: float, kv_bytes_per_token: float, batch: int, context_len: float) -> float:
    """Bytes one decode step reads: the weights once, and the cache of ``batch`` sequences of
    ``context_len`` tokens each."""
    return float(weight_bytes_read + batch * context_len * kv_bytes_per_token)


def mean_context_len(prompt_len: int, new_tokens: int) -> float:
    """Mean cache length over the decode steps of an ``n``-token generation: the steps after the
    first token see ``prompt_len + 1`` to ``prompt_len + n - 1`` tokens."""
    return prompt_len + new_tokens / 2


def estimate_tpot_ms(measured_tpot_ms: float, bytes_per_step: float, my_bandwidth_gbs: float,
                     other_bandwidth_gbs: float) -> float:
    """TPOT on another card, from one measured here: a two-term model of a decode step.

    A step is a fixed part (launches, Python, the host), which a faster card does not shorten,
    plus reading ``bytes_per_step`` (:func:`decode_bytes_per_step`) at the card's bandwidth:
    ``fixed = max(measured - bytes / my_bandwidth, 0)`` and the estimate is ``fixed + bytes /
    other_bandwidth`` (phase 5, ``grader/source/05_hardware_and_cost/05_hardware_and_cost.ipynb``)."""
    fixed_ms = max(measured_tpot_ms - transfer_ms(bytes_per_step, my_bandwidth_gbs), 0.0)
    return fixed_ms + transfer_ms(bytes_per_step, other_bandwidth_gbs)


# -- measuring -----------------------------------------------------------------------------------

def measure_copy_bandwidth(numel: int | None = None, device: Any = None, max_runs: int = 30,
                           budget_s: float = 2.0, dtype: Any = None) -> dict:
    """Copy bandwidth in GB/s: ``dst.copy_(src)`` of ``numel`` elements of ``dtype`` (default
    fp32; default size 1 GiB on CUDA, 4 MiB on a CPU), timed with :func:`utils.measure.timing.benchmark`,
    counting the read and the write (2 x the tensor's bytes), as phase 5 and docs/reference.md count it."""
    import torch

    from utils.measure.timing import benchmark

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    numel = int(numel or (1 << 28 if device.type == "cuda" else 1 << 20))
    src = torch.randn(numel, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    t = benchmark(lambda: dst.copy_(src), max_runs=max_runs, budget_s=budget_s, device=device)
    nbytes = 2 * numel * src.element_size()
    return {"gbs": gb_per_s(nbytes, t.median_ms), "bytes": nbytes, "time": t, "numel": numel}


def measure_prefill(model: Any, prompt: Any, lengths: tuple[int, ...] | list[int], max_runs: int = 10,
                    budget_s: float = 2.0) -> dict[int, Any]:
    """Time to first token (TTFT) for each prompt length: one forward over ``prompt[:, :L]``
    that fills a fresh KV cache and computes the last position's logits (``logits_to_keep=1``,
    as ``generate`` does). ``{L: TimingResult}``."""
    import torch

    from utils.measure.timing import benchmark

    if max(lengths) > prompt.shape[1]:
        raise ValueError(f"the prompt has {prompt.shape[1]} tokens, fewer than the longest length {max(lengths)}")

    def prefill(length: int):
        with torch.no_grad():
            return model(input_ids=prompt[:, :length], use_cache=True, logits_to_keep=1).logits

    return {int(n): benchmark(prefill, int(n), warmup=1, max_runs=max_runs, budget_s=budget_s, device=prompt.device)
            for n in lengths}


def measure_decode(path: Any, new_tokens: int, max_runs: int = 10, budget_s: float = 3.0) -> dict:
    """Time ``path(1)`` and ``path(new_tokens)`` (a :class:`utils.serving.decode.DecodePath`) with
    :func:`utils.measure.timing.benchmark`; TPOT = ``(t(n) - t(1)) / (n - 1)`` in medians, tokens/s =
    ``batch x 1000 / TPOT``.

    On a busy CPU a slow ``t(1)`` can come out above ``t(n)`` (seen on a shared 2-core machine
    with tiny smoke models), which no TPOT explains: both are then timed again, at most
    :data:`DECODE_ATTEMPTS` times, and a pair that never orders itself is a ``RuntimeError``
    that says so, not an infinite rate."""
    from utils.measure.timing import benchmark

    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2, got {new_tokens}")
    dev = path.prompt.device
    for _ in range(DECODE_ATTEMPTS):
        t1 = benchmark(path, 1, warmup=1, max_runs=max_runs, budget_s=budget_s, device=dev)
        tn = benchmark(path, new_tokens, warmup=1, max_runs=max_runs, budget_s=budget_s, device=dev)
        tpot = (tn.median_ms - t1.median_ms) / (new_tokens - 1)
        if tpot > 0:
            return {"t1": t1, "tn": tn, "tpot_ms": tpot, "tokens_per_s": path.batch * 1e3 / tpot,
                    "batch": path.batch, "new_tokens": new_tokens}
    raise RuntimeError(f"decoding {new_tokens} tokens took no longer than decoding 1 ({tn.median_ms:.3g} ms vs "
                       f"{t1.median_ms:.3g} ms) in {DECODE_ATTEMPTS} tries: the machine is too busy to time this; "
                       "close other programs and run the cell again")


DECODE_ATTEMPTS = 3


def _cache_tensors(cache: Any) -> list:
    if hasattr(cache, "layers"):  # transformers 5: one DynamicLayer per layer
        return [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if t is not None]
    return list(getattr(cache, "key_cache", [])) + list(getattr(cache, "value_cache", []))


def measure_kv_growth(model: Any, prompt: Any, new_tokens: int) -> dict:
    """KV-cache bytes as greedy decoding grows the cache one token per sequence per step.

    A prefill, then ``new_tokens`` single-token forwards through a ``DynamicCache``; after each
    step, on CUDA, ``torch.cuda.memory_allocated()`` minus its value before the prefill (the
    cache is the only thing that grows: each step's activations are freed), on a CPU the
    bytes of the cache's tensors (there is no allocator to read; ``source`` says which).
    ``bytes_per_step`` is the growth from the first to the last step over the steps between:
    one token's K and V in every layer for each of the ``batch`` sequences."""
    import torch
    from transformers import DynamicCache

    from utils.serving.decode import cache_kwarg

    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2, got {new_tokens}")
    cuda = prompt.device.type == "cuda"
    name = cache_kwarg(model)
    gc.collect()
    if cuda:
        torch.cuda.synchronize(prompt.device)
        base = torch.cuda.memory_allocated(prompt.device)
    cache = DynamicCache(config=model.config)
    lengths, used = [], []
    with torch.no_grad():
        tok = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{name: cache}).logits[:, -1:].argmax(-1)
        for _ in range(new_tokens):
            tok = model(input_ids=tok, use_cache=True, **{name: cache}).logits[:, -1:].argmax(-1)
            if cuda:
                torch.cuda.synchronize(prompt.device)
                used.append(torch.cuda.memory_allocated(prompt.device) - base)
            else:
                used.append(sum(t.nbytes for t in _cache_tensors(cache)))
            lengths.append(int(cache.get_seq_length()))
    final = sum(t.nbytes for t in _cache_tensors(cache))
    del cache, tok
    return {"batch": int(prompt.shape[0]), "prompt_len": int(prompt.shape[1]), "tokens": lengths, "bytes": used,
            "bytes_per_step": (used[-1] - used[0]) / (lengths[-1] - lengths[0]), "cache_bytes_final": final,
            "source": "torch.cuda.memory_allocated" if cuda else "cache tensor bytes (CPU: no allocator to read)"}


def batching_sweep(model: Any, prompt: Any, batches: tuple[int, ...] | list[int], new_tokens: int, *,
                   compile: bool | None = None, decoder: Any = None, max_runs: int = 10, budget_s: float = 2.0,
                   deadline: float | None = None) -> list[dict]:
    """Decode TPOT and tokens/s of the fast path (:class:`utils.serving.decode.FastDecoder`) at each
    batch size, on the first ``batch`` rows of ``prompt``. Each new batch size is a new cache
    shape (one recompile on CUDA). A batch size reached after ``deadline``
    (``time.perf_counter()``) is skipped and marked so."""
    from utils.serving.decode import fast_path, warm

    if max(batches) > prompt.shape[0]:
        raise ValueError(f"the prompt has {prompt.shape[0]} rows, fewer than the largest batch {max(batches)}")
    rows = []
    for b in batches:
        if deadline is not None and time.perf_counter() > deadline:
            rows.append({"batch": int(b), "skipped": "time budget spent"})
            continue
        path = warm(fast_path(model, prompt[:b], new_tokens, compile=compile, decoder=decoder), new_tokens)
        decoder = path.decoder
        d = measure_decode(path, new_tokens, max_runs=max_runs, budget_s=budget_s)
        rows.append({"batch": int(b), "tpot_ms": d["tpot_ms"], "tokens_per_s": d["tokens_per_s"],
                     "ttft_ms": d["t1"].median_ms, "warmup_s": path.warmup_s})
    return rows


# -- transformers' continuous batching -------------------------------------------------------------

def continuous_batching(model: Any, prompts: list[list[int]], new_tokens: int) -> dict:
    """Serve ``prompts`` (token-id lists of different lengths) with transformers' continuous
    batching (``model.generate_batch``: a paged KV cache, requests joining and leaving the
    running batch at every step), ``new_tokens`` greedy tokens each, without CUDA graphs (their
    capture time per batch shape would land inside this short run). Throughput counts the
    generated tokens from the first request's arrival to the last token; TTFT per request is
    its first token's timestamp minus its arrival."""
    try:
        from transformers import ContinuousBatchingConfig, GenerationConfig
    except ImportError:
        import transformers

        raise RuntimeError(f"transformers {transformers.__version__} has no continuous batching "
                           "(ContinuousBatchingConfig); pip install -U 'transformers>=5.17'") from None

    page = 256  # transformers' default page (block) size in tokens
    longest = max(len(p) for p in prompts)
    blocks = len(prompts) * -(-(longest + new_tokens) // page) + 8
    cfg = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=max(256, min(8192, sum(map(len, prompts)))),
                                   use_cuda_graph=False)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    out = model.generate_batch([list(map(int, p)) for p in prompts], generation_config=gen,
                               continuous_batching_config=cfg, record_timestamps=True, warmup=False)
    res = list(out.values())
    start = min(r.created_time for r in res)
    end = max(r.timestamps[-1] for r in res)
    tokens = sum(len(r.generated_tokens) for r in res)
    ttft = sorted((r.timestamps[0] - r.created_time) * 1e3 for r in res)
    return {"requests": len(res), "tokens": tokens, "wall_s": end - start, "tokens_per_s": tokens / (end - start),
            "ttft_ms_p50": ttft[len(ttft) // 2], "ttft_ms_max": ttft[-1], "num_blocks": blocks, "page_tokens": page}


# -- a served engine (utils.serving.serve.start) ---------------------------------------------------------

def completion_ms(url: str, model: str, prompt_ids: list[int], max_tokens: int = 1) -> float:
    """Wall time of one non-streamed ``/v1/completions`` request (token ids in, ``max_tokens``
    out): with one output token, the time to first token as the client sees it."""
    body = json.dumps({"model": model, "prompt": [int(i) for i in prompt_ids], "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 (the local server serve.start returned)
        r.read()
    return (time.perf_counter() - t0) * 1e3


def prefix_caching_ttft(url: str, model: str, token_ids: list[int], prefix_len: int, suffix_len: int = 16,
                        requests: int = 8, seed: int = 0) -> dict:
    """Median TTFT of prompts that share a ``prefix_len``-token prefix (after the first, their
    prefix is in vLLM's prefix cache) against prompts of the same length that share nothing.
    Prompts are drawn from ``token_ids`` (ids the model's tokenizer can stream)."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.choice(token_ids) for _ in range(n)]

    prefix = tokens(prefix_len)
    completion_ms(url, model, tokens(prefix_len + suffix_len))  # the server's first request pays one-off costs
    completion_ms(url, model, prefix + tokens(suffix_len))  # puts the shared prefix in the cache
    shared = sorted(completion_ms(url, model, prefix + tokens(suffix_len)) for _ in range(requests))
    distinct = sorted(completion_ms(url, model, tokens(prefix_len + suffix_len)) for _ in range(requests))
    return {"prefix_len": prefix_len, "suffix_len": suffix_len, "requests": requests,
            "shared_prefix_ttft_ms": shared[len(shared) // 2], "no_shared_prefix_ttft_ms": distinct[len(distinct) // 2]}


def nvml_used_gib(device_index: int = 0) -> float | None:
    """Device memory in use (all processes), in GiB, as ``nvidia-smi`` shows it; None without NVML."""
    if not nvml.status().available:
        return None
    info = nvml.query("nvmlDeviceGetMemoryInfo", nvml.handle(device_index))
    return None if info is nvml.NA else info.used / GIB


def held_memory_gib(server: Any, used_before_gib: float | None = None) -> tuple[float | None, str]:
    """The memory a running engine really holds, and how it was read. On a GPU: what NVML
    accounts to the engine's processes where it lists them, else the device memory in use minus
    ``used_before_gib`` (read before the engine started), which is wrong by whatever other
    processes took or gave back meanwhile. On an H200 an engine left over from an earlier run
    exited while the next started, and the difference read 0.07 GiB for an engine holding about
    60 GiB (``benchmarks/results/vllm-gpu-h200/loadgen-vs-vllm-bench-llama-1.1b-n64-in256-out64-c8.json``).
    On a CPU: the resident memory of the engine's processes (it counts their libraries too)."""
    if server.device == "cpu":
        return server.resident_gib(), "resident memory of the engine's processes"

    own = nvml.process_used_gib(server.process_ids()) if nvml.status().available else None
    if own is not None:
        return own, "GPU memory NVML accounts to the engine's processes"
    used = nvml_used_gib()
    if used is None:
        return None, "NVML is not available"
    return used - (used_before_gib or 0.0), "GPU memory in use (NVML), minus what was in use before it started"


def served_kv_check(server: Any, calculator: Any) -> dict:
    """The engine's own KV-cache allocation (``server.facts``, from its log and ``/metrics``)
    beside ``calculator(layers, kv_heads, head_dim, dtype, batch, context, kv_memory_gib,
    block_size)`` (lab 03's exercise) fed the same memory, block size and context.

    Where the engine gave its KV memory in bytes (vLLM's ``/metrics``, its CPU build's
    ``VLLM_CPU_KVCACHE_SPACE``) the numbers must be equal. Where only its log's ``%.2f`` GiB
    is known (a GPU's profiled memory), the calculator gives a range over what that print
    can hide (:func:`utils.units.gib_print_range`) and the engine's numbers must fall in it.
    vLLM from 0.20.1 logs the tokens as ``int(max_concurrency x max_model_len)``, earlier
    releases as blocks x block size (:func:`utils.kv.vllm_releases.vllm_formulas`)."""
    f = server.facts
    kv_dtype = "fp8" if getattr(server.options, "kv_cache_dtype", None) else server.marker.get("dtype", "bf16")
    spec = from_hf_config(server.model_dir / "config.json", kv_dtype="fp8" if kv_dtype == "fp8" else None)
    out = {"engine": f.engine, "version": f.version, "kv_cache_gib": f.kv_cache_gib, "kv_cache_bytes": f.kv_cache_bytes,
           "block_size": f.block_size, "max_model_len": f.max_model_len, "engine_num_blocks": f.num_blocks,
           "engine_kv_tokens": f.kv_cache_tokens, "engine_max_concurrency": f.max_concurrency}
    if not (f.kv_cache_gib and f.block_size and f.max_model_len and f.num_blocks):
        return {**out, "compared": False, "why": f"the engine did not report its cache ({f.source})"}
    token_formula = vllm_formulas(f.version)[0] if f.engine == "vllm" else "blocks"

    def run(nbytes: int) -> dict:
        mine = calculator(spec.num_layers, spec.num_kv_heads, spec.head_dim, kv_dtype, 1, f.max_model_len,
                          nbytes / GIB, block_size=f.block_size)
        tokens = (int(mine["max_concurrency"] * f.max_model_len) if token_formula == "concurrency"
                  else mine["num_blocks"] * f.block_size)
        return {"num_blocks": mine["num_blocks"], "kv_tokens": tokens, "max_concurrency": mine["max_concurrency"]}

    if f.kv_cache_bytes:
        mine = run(f.kv_cache_bytes)
        agrees = (mine["num_blocks"] == f.num_blocks and mine["kv_tokens"] == f.kv_cache_tokens
                  and f"{mine['max_concurrency']:.2f}" == f"{f.max_concurrency:.2f}")
        return {**out, "compared": True, "exact": True, "calculator_num_blocks": mine["num_blocks"],
                "calculator_kv_tokens": mine["kv_tokens"], "calculator_max_concurrency": mine["max_concurrency"],
                "agrees": agrees}
    lo, hi = (run(b) for b in gib_print_range(f.kv_cache_gib))
    mid = run(round(f.kv_cache_gib * GIB))
    agrees = (lo["num_blocks"] <= f.num_blocks <= hi["num_blocks"]
              and (f.kv_cache_tokens is None or lo["kv_tokens"] <= f.kv_cache_tokens <= hi["kv_tokens"]))
    return {**out, "compared": True, "exact": False, "calculator_num_blocks": mid["num_blocks"],
            "calculator_kv_tokens": mid["kv_tokens"], "calculator_max_concurrency": mid["max_concurrency"],
            "calculator_num_blocks_range": (lo["num_blocks"], hi["num_blocks"]),
            "calculator_kv_tokens_range": (lo["kv_tokens"], hi["kv_tokens"]), "agrees": agrees}
