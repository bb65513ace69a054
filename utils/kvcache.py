"""KV-cache bytes per token, and the KV geometry of a Hugging Face config.

Bytes per token, per layer (one token of K and V):

* MHA, GQA, MQA: ``2 x num_kv_heads x head_dim x dtype_bytes`` (K and V; MHA has as many
  KV heads as query heads, GQA fewer, MQA one). Llama-3-8B: 32 layers x 8 x 128 x 2 x 2
  bytes = 131,072 bytes per token.
* MLA (DeepSeek-V2/V3): one latent of ``kv_lora_rank + qk_rope_head_dim`` values, no
  factor 2 and no per-head copy: DeepSeek-V2-Lite (27 layers, 512 + 64) stores 31,104
  bytes per token in bf16.
* Sliding-window layers cost the same per token, but hold at most ``sliding_window``
  tokens; fp8 KV caches use one byte per value.

The rest of the KV-cache calculator lives beside this module: vLLM's paged allocation of
this cache (blocks, groups, tokens, concurrency) in ``utils/vllm_kv.py``, the numbers of a
vLLM startup log in ``utils/vllm_log.py``, and the command line, ``python -m utils.kvcache``,
in ``utils/kvcache_cli.py``.

Written by hand rather than importing vLLM or transformers: a course reader should see the
arithmetic in one file. Not modelled: Mamba and linear-attention layers, layers of different
head shapes in one model (Gemma 4).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from utils import validate

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
FULL, SLIDING = "full", "sliding"
_LAYER_TYPE_NAMES = {"full_attention": FULL, "full": FULL, "global": FULL, "attention": FULL,
                     "sliding_attention": SLIDING, "sliding": SLIDING, "local": SLIDING,
                     "sliding_window": SLIDING, "local_attention": SLIDING}


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
            validate.positive_int(name, getattr(self, name), KVConfigError)
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
    :func:`utils.vllm_kv.vllm_request_bytes` for vLLM's count."""
    validate.non_negatives(KVConfigError, batch=batch, seq_len=seq_len)
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


if __name__ == "__main__":  # python -m utils.kvcache: the calculator's command line
    from utils.kvcache_cli import main

    raise SystemExit(main())
