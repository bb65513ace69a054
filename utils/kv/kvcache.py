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
this cache (blocks, groups, tokens, concurrency) in ``utils/kv/vllm_kv.py``, the numbers of a
vLLM startup log in ``utils/kv/vllm_log.py``, and the command line, ``python -m utils.kv.kvcache``,
in ``utils/kv/kvcache_cli.py``.

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
from utils.kv.vllm_releases import vllm_release
from utils.validate import KVConfigError

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
FULL, SLIDING, CHUNKED = "full", "sliding", "chunked"
KINDS = (FULL, SLIDING, CHUNKED)


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
    ``layer_types`` lists ``"full"``/``"sliding"``/``"chunked"`` per layer (chunked: Llama 4's
    chunked local attention over ``attention_chunk_size`` tokens); ``None`` means every layer
    is full attention, or every layer sliding when ``sliding_window`` is set. ``notes``: lines
    the calculator prints about how the config was read.
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
    attention_chunk_size: int | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
            validate.positive_int(name, getattr(self, name), KVConfigError)
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise KVConfigError(f"sliding_window must be a positive integer or None, got {self.sliding_window!r}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise KVConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
            if any(t not in KINDS for t in self.layer_types):
                raise KVConfigError(f"layer_types must be 'full', 'sliding' or 'chunked', got {sorted(set(self.layer_types))}")
            if SLIDING in self.layer_types and self.sliding_window is None:
                raise KVConfigError("layer_types has sliding layers but sliding_window is not set")
            if CHUNKED in self.layer_types and not self.attention_chunk_size:
                raise KVConfigError("layer_types has chunked layers but attention_chunk_size is not set")
        if self.attention_chunk_size is not None and (not isinstance(self.attention_chunk_size, int)
                                                      or self.attention_chunk_size <= 0):
            raise KVConfigError(f"attention_chunk_size must be a positive integer or None, got {self.attention_chunk_size!r}")

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
        """``"full"``, ``"sliding"`` or ``"chunked"`` for each layer."""
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
    :func:`utils.kv.vllm_kv.vllm_request_bytes` for vLLM's count."""
    validate.non_negatives(KVConfigError, batch=batch, seq_len=seq_len)
    per_layer = spec.layer_bytes_per_token()
    tokens = sum(min(seq_len, spec.sliding_window) if k == SLIDING else
                 min(seq_len, spec.attention_chunk_size) if k == CHUNKED else seq_len for k in spec.kinds())
    return batch * per_layer * tokens


# ---------------------------------------------------------------- Hugging Face configs
# How a config.json becomes per-layer KV specs in vLLM, in three steps, each read from source:
# 1. transformers fills layer_types (and a few fields) the file leaves out, in the config class
#    vLLM loads it with (transformers/models/<type>/configuration_<type>.py, 5.19 in vLLM 0.32's
#    environment): _default_layer_types below.
# 2. each vLLM model file passes a per-layer window for the layers it makes sliding
#    (vllm/model_executor/models/<file>.py): _VLLM_LAYER_RULE below.
# 3. layers given none take CacheConfig.sliding_window, the model-level window
#    (vllm/engine/arg_utils.py, create_engine_config), by the release's rule (utils.kv.vllm_kv).

_LAYER_TYPE_NAMES = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING,
                     "chunked_attention": CHUNKED}
# types whose layers keep a recurrent state, not a KV cache per token (vLLM's MambaSpec and kin)
_STATE_MODEL_TYPES = frozenset({
    "mamba", "mamba2", "falcon_mamba", "jamba", "falcon_h1", "zamba", "zamba2", "bamba", "nemotron_h",
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "lfm2", "lfm2_moe", "plamo2", "hymba", "olmo_hybrid",
    "rwkv", "rwkv5", "rwkv6", "rwkv7", "recurrent_gemma", "minimax", "minimax_m1", "kimi_linear", "granitemoehybrid",
    "bailing_moe_linear", "xlstm"})
# layers of different KV shapes or shared KV: vLLM packs or skips them (kv_cache_utils.py
# _get_packed_kv_cache_groups; gpu_model_runner.py kv_sharing_target_layer_name)
_UNEVEN_MODEL_TYPES = {"gemma3n": "shares one layer's KV cache among later layers (num_kv_shared_layers)",
                       "gemma3n_text": "shares one layer's KV cache among later layers (num_kv_shared_layers)",
                       "gemma4": "has layers of different KV head shapes", "gemma4_text": "has layers of different KV head shapes",
                       "deepseek_v4": "mixes compressed, sliding and indexer caches of different page sizes",
                       "mimo_v2_flash": "has sliding and full layers of different KV head shapes"}
_UNEVEN_KEYS = ("global_head_dim", "num_global_key_value_heads", "swa_head_dim", "swa_num_key_value_heads",
                "swa_v_head_dim", "num_kv_shared_layers")
# vLLM model files that pass no per-layer window (their layers take the model-level one only)
_MODEL_WINDOW_ONLY = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mixtral", "qwen2_vl", "qwen2_5_vl"})
_QWEN_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})


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
                                "sliding_window": 4096, "max_position_embeddings": 131072}}


def decoder_config(config: dict | str | Path) -> dict:
    """The decoder's fields of a ``config.json`` (a dict or a path), as vLLM's ``hf_text_config`` holds
    them: a multimodal config's ``text_config`` (``llm_config``, ``language_config``) over the top
    level, and the defaults transformers fills in for keys the file leaves out (:data:`_HF_DEFAULTS`;
    an explicit null stays null, as transformers reads it). One-line :class:`KVConfigError` without
    a ``model_type``, which neither transformers nor vLLM can load."""
    raw = _load_config(config)
    cfg = dict(raw)
    for nest in ("text_config", "llm_config", "language_config"):
        if isinstance(raw.get(nest), dict):
            cfg = {**raw, **raw[nest]}
            break
    if not cfg.get("model_type"):
        raise KVConfigError("config has no model_type: neither transformers nor vLLM can tell its architecture "
                            "(pass a model's config.json, or --layers --kv-heads --head-dim instead)")
    for key, value in _HF_DEFAULTS.get(cfg["model_type"], {}).items():
        cfg.setdefault(key, value)
    return cfg


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


def from_hf_config(config: dict | str | Path, *, kv_dtype: str | None = None, vllm_version: Any = None) -> KVSpec:
    """The KV geometry vLLM builds for a Hugging Face ``config.json`` (a dict or a path), as
    release ``vllm_version`` (a version string or :class:`utils.kv.vllm_releases.VllmRelease`; default
    the newest the calculator knows) reads it.

    Heads: ``num_key_value_heads`` and the other spellings vLLM's
    ``ModelConfig.get_total_num_kv_heads`` reads (``multi_query``, ``n_head_kv``,
    ``num_kv_heads``, ``multi_query_group_num``, MPT/DBRX ``attn_config.kv_n_heads``), else
    the attention heads. ``head_dim`` (``kv_channels``), else ``hidden_size //
    num_attention_heads`` (always the latter for cohere2, as its transformers config sets it, and for
    chatglm, whose vLLM model file counts ``multi_query_group_num`` KV heads only with
    ``multi_query_attention``).
    MLA (``kv_lora_rank``): one latent of ``kv_lora_rank + qk_rope_head_dim``. Multimodal
    configs nest the decoder under ``text_config``.

    Layers: ``layer_types`` as given, else transformers' default for the model type (gemma2
    alternate; gemma3 ``sliding_window_pattern``, default 6; cohere2 pattern 4; olmo3, exaone4
    every fourth full; gpt_oss alternate; qwen2/qwen3 from ``max_window_layers``; smollm3 and
    llama4 from ``no_rope_layers``); then vLLM's model file (gpt_oss slides its even layers;
    cohere2 passes ``sliding_window + 1`` from 0.29; granite honours ``layer_types`` from 0.29;
    qwen2/qwen3/mixtral pass no per-layer window, and Qwen2Model refuses a window on only some of its
    layers) and the release's model-level window rule.
    qwen2/qwen3 count ``sliding_window`` only with ``use_sliding_window: true``; a window of 0
    is no window (``ModelConfig``).

    One-line :class:`KVConfigError`, nothing guessed: no ``model_type``; a missing or zero layer,
    head or head-dim count; attention heads that are not a multiple of the KV heads; a layer type
    other than full, sliding or chunked attention (Mamba, linear attention, sparse attention's
    indexer cache); KV shared across layers or layers of different KV shapes; a config vLLM itself
    refuses. ``kv_dtype`` (``bf16``, ``fp16``,
    ``fp32``, ``fp8``) overrides the checkpoint dtype."""
    release = vllm_release(vllm_version)
    cfg = decoder_config(config)
    model_type = cfg["model_type"]
    _refuse_unmodelled(cfg, model_type)
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    heads = _first(cfg, "num_attention_heads", "n_head", "n_heads")
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    missing = [n for n, v in (("num_hidden_layers", layers), ("num_attention_heads", heads)) if v is None]
    if missing:
        raise KVConfigError(f"config has no {' or '.join(missing)} (model_type {model_type!r}); "
                            "pass --layers --kv-heads --head-dim instead")
    layers, heads = _as_int("num_hidden_layers", layers), _as_int("num_attention_heads", heads)
    for name, value in (("num_hidden_layers", layers), ("num_attention_heads", heads)):
        if value <= 0:
            raise KVConfigError(f"config field {name} is {value}: a decoder needs at least one")
    nbytes = dtype_bytes(kv_dtype) if kv_dtype else _hf_dtype_bytes(cfg)
    max_pos = _first(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")
    common = dict(num_layers=layers, dtype_bytes=nbytes, num_attention_heads=heads,
                  max_position_embeddings=_as_int("max_position_embeddings", max_pos) if max_pos else None,
                  model_type=model_type)

    if cfg.get("kv_lora_rank") is not None:  # DeepSeek MLA
        if cfg.get("qk_rope_head_dim") is None:
            raise KVConfigError("MLA config has kv_lora_rank but no qk_rope_head_dim")
        rank, rope = _as_int("kv_lora_rank", cfg["kv_lora_rank"]), _as_int("qk_rope_head_dim", cfg["qk_rope_head_dim"])
        if rank + rope <= 0:
            raise KVConfigError(f"MLA latent width kv_lora_rank + qk_rope_head_dim is {rank + rope}: must be positive")
        window, _, types, _ = _layer_kinds(cfg, layers, model_type, release)
        if window or (types and set(types) != {FULL}):
            raise KVConfigError("MLA with sliding-window or chunked layers is not modelled (vLLM's SlidingWindowMLASpec)")
        return KVSpec(num_kv_heads=1, head_dim=rank + rope, mla=True, kv_lora_rank=rank, qk_rope_head_dim=rope, **common)

    # cohere2's transformers config and chatglm's vLLM model file (chatglm.py) take hidden / heads, whatever
    # head_dim or kv_channels say
    head_dim = None if model_type in ("cohere2", "chatglm") else _first(cfg, "head_dim", "kv_channels")
    if head_dim is None:
        if hidden is None:
            raise KVConfigError(f"config has neither head_dim nor hidden_size (model_type {model_type!r})")
        head_dim = _as_int("hidden_size", hidden) // heads
    head_dim = _as_int("head_dim", head_dim)
    if head_dim <= 0:
        raise KVConfigError(f"head dimension is {head_dim} (model_type {model_type!r}): must be positive")
    kv_heads = _kv_heads(cfg, heads)
    if kv_heads <= 0:
        raise KVConfigError(f"config gives {kv_heads} KV heads (num_key_value_heads): a layer needs at least one")
    if heads % kv_heads:  # vLLM's Attention asserts it (model_executor/layers/attention/attention.py)
        raise KVConfigError(f"config gives {heads} attention heads and {kv_heads} KV heads: each KV head serves a whole "
                            "group of query heads, so num_attention_heads must be a multiple of num_key_value_heads")
    window, chunk, types, notes = _layer_kinds(cfg, layers, model_type, release)
    return KVSpec(num_kv_heads=kv_heads, head_dim=head_dim, sliding_window=window, layer_types=types,
                  attention_chunk_size=chunk, notes=notes, **common)


def _refuse_unmodelled(cfg: dict, model_type: str | None) -> None:
    types = cfg.get("layer_types")
    all_attention = isinstance(types, list) and types and all(t in _LAYER_TYPE_NAMES for t in types)
    if model_type in _STATE_MODEL_TYPES and not all_attention:
        raise KVConfigError(f"model type {model_type!r} has Mamba or linear-attention layers (a fixed state per "
                            "request, not a KV cache per token): not modelled")
    if model_type in _UNEVEN_MODEL_TYPES:
        raise KVConfigError(f"model type {model_type!r} {_UNEVEN_MODEL_TYPES[model_type]}: not modelled")
    if cfg.get("param_sink_number"):  # vLLM static_sink_attention.py, SinkFullAttentionSpec (openPangu)
        raise KVConfigError(f"config field param_sink_number ({cfg['param_sink_number']!r}) asks for static sink "
                            "attention, whose sink keys and values take blocks of their own: not modelled")
    for key in _UNEVEN_KEYS:
        if cfg.get(key):
            raise KVConfigError(f"config field {key} ({cfg[key]!r}) means layers of different KV shapes or shared KV: "
                                "not modelled")
    # a config per layer: Nemotron-NAS's block_configs (some layers without attention, KV heads per layer,
    # vLLM's NemotronNasModelArchConfigConvertor), vLLM's is_heterogeneous per_layer_config, OpenELM's head lists
    for key in ("block_configs", "is_heterogeneous", "per_layer_config"):
        if cfg.get(key):
            raise KVConfigError(f"config field {key} gives each layer its own attention shape (layers without "
                                "attention, KV heads per layer): not modelled")
    for key in ("num_key_value_heads", "num_kv_heads", "num_attention_heads", "num_query_heads", "head_dim"):
        if isinstance(cfg.get(key), list):
            raise KVConfigError(f"config field {key} is a list, one value per layer: layers of different KV shapes "
                                "are not modelled")


def _kv_heads(cfg: dict, heads: int) -> int:
    """KV heads of the whole model, in the order of vLLM's ``get_total_num_kv_heads``."""
    falcon_new_arch = cfg.get("model_type") in ("falcon", "RefinedWeb", "RefinedWebModel") and cfg.get(
        "new_decoder_architecture")
    if cfg.get("multi_query") and not falcon_new_arch:
        return 1
    if cfg.get("model_type") == "chatglm":  # vLLM chatglm.py: groups only with multi_query_attention
        return _as_int("multi_query_group_num", cfg.get("multi_query_group_num", 1)) \
            if cfg.get("multi_query_attention") else heads
    attn = cfg.get("attn_config")
    if cfg.get("model_type") in ("mpt", "dbrx") and isinstance(attn, dict):
        return _as_int("attn_config.kv_n_heads", attn.get("kv_n_heads") or heads)
    kv = _first(cfg, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    return heads if kv is None else _as_int("num_key_value_heads", kv)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise KVConfigError(f"config field {name} must be a whole number, got {value!r}")
    return int(value)


def _window(cfg: dict, model_type: str | None) -> int | None:
    """The model's ``sliding_window`` as transformers and vLLM's ``ModelConfig`` leave it."""
    window = cfg.get("sliding_window")
    if model_type in _QWEN_TYPES and not cfg.get("use_sliding_window", False):
        return None  # Qwen2Config & co.: sliding_window if use_sliding_window else None (qwen2_moe: 0)
    if window is None or window == 0:
        return None  # vLLM ModelConfig: "Some checkpoints set sliding_window to 0" -> disabled
    if isinstance(window, list):
        raise KVConfigError(f"sliding_window is a list {window!r}: a window per layer is not modelled")
    window = _as_int("sliding_window", window)
    if window < 0:
        raise KVConfigError(f"sliding_window is {window}: must be a positive number of tokens (or null)")
    if model_type in ("gemma3_text", "gemma3") and cfg.get("use_bidirectional_attention"):
        window = window // 2 + 1  # Gemma3TextConfig.__post_init__
    return window


def _no_rope_layers(cfg: dict, layers: int) -> list[int]:
    given = cfg.get("no_rope_layers")
    if given:
        return [int(x) for x in given]
    interval = _as_int("no_rope_layer_interval", cfg.get("no_rope_layer_interval", 4))
    return [int((i + 1) % interval != 0) for i in range(layers)]


def _default_layer_types(cfg: dict, layers: int, model_type: str | None, window: int | None) -> tuple[list | None, str]:
    """transformers' ``layer_types`` for a config that gives none, and how it was made."""
    def pattern(n: int) -> list[str]:
        return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]

    if model_type == "gemma2":
        return pattern(2), "transformers' Gemma2Config default: even layers sliding"
    if model_type in ("gemma3_text", "gemma3"):
        n = _as_int("sliding_window_pattern", _first(cfg, "sliding_window_pattern", "_sliding_window_pattern") or 6)
        return pattern(n), f"sliding_window_pattern {n}: every {n}th layer full (Gemma3TextConfig)"
    if model_type == "cohere2":
        n = _as_int("sliding_window_pattern", cfg.get("sliding_window_pattern") or 4)
        return pattern(n), f"sliding_window_pattern {n}: every {n}th layer full (Cohere2Config)"
    if model_type == "olmo3":
        return pattern(4), "transformers' Olmo3Config default: every 4th layer full"
    if model_type == "exaone4":
        n = cfg.get("sliding_window_pattern", 4)
        if window is None or not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise KVConfigError(f"exaone4 config without layer_types has sliding_window {window!r} and "
                                f"sliding_window_pattern {n!r}: transformers cannot build its layer types; give layer_types")
        return pattern(n), f"sliding_window_pattern {n}: every {n}th layer full (Exaone4Config)"
    if model_type == "gpt_oss":
        return pattern(2), "transformers' GptOssConfig default: even layers sliding"
    if model_type in ("qwen2", "qwen3"):
        mwl = _as_int("max_window_layers", cfg.get("max_window_layers", 28))
        return (["sliding_attention" if window is not None and i >= mwl else "full_attention" for i in range(layers)],
                f"max_window_layers {mwl} (Qwen config default)")
    if model_type == "qwen2_moe":
        mwl = _as_int("max_window_layers", cfg.get("max_window_layers", 28))
        on = bool(cfg.get("use_sliding_window"))
        return (["sliding_attention" if (i + 1) % 2 and i < mwl and on else "full_attention" for i in range(layers)],
                f"max_window_layers {mwl} (Qwen2MoeConfig default)")
    if model_type == "smollm3":
        rope = _no_rope_layers(cfg, layers)
        on = bool(cfg.get("use_sliding_window")) and window is not None
        return (["sliding_attention" if on and not rope[i] else "full_attention" for i in range(layers)],
                "SmolLM3Config default from use_sliding_window and no_rope_layers")
    if model_type == "ministral":
        return (["sliding_attention" if window is not None else "full_attention"] * layers,
                "MinistralConfig default: every layer sliding when sliding_window is set")
    if model_type in ("llama4", "llama4_text"):
        rope = _no_rope_layers(cfg, layers)
        return (["chunked_attention" if r else "full_attention" for r in rope],
                "Llama4TextConfig default: RoPE layers chunked, every 4th (NoPE) full")
    return None, ""


def _layer_kinds(cfg: dict, layers: int, model_type: str | None, release) -> tuple:
    """``(sliding_window, attention_chunk_size, layer kinds or None, notes)`` as ``release``
    allocates them (see the three steps above)."""
    window = _window(cfg, model_type)
    notes: list[str] = []
    given = cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list):
            raise KVConfigError(f"layer_types must be a list, got {given!r}")
        for i, t in enumerate(given):
            if t not in _LAYER_TYPE_NAMES:
                why = ("Mamba or linear attention keeps a state, not a KV cache per token"
                       if "linear" in str(t) or "mamba" in str(t) or "conv" in str(t) else
                       "sparse attention adds an indexer cache" if "sparse" in str(t) or "indexed" in str(t) else
                       "only full, sliding and chunked attention are modelled")
                raise KVConfigError(f"layer type {t!r} (layer {i}) is not modelled: {why}")
        if len(given) != layers:
            raise KVConfigError(f"layer_types has {len(given)} entries for {layers} layers")
        types, how = list(given), "layer_types as the config gives them"
    else:
        types, how = _default_layer_types(cfg, layers, model_type, window)
    chunk = None
    if types and "chunked_attention" in types:
        chunk = _as_int("attention_chunk_size", cfg.get("attention_chunk_size", 8192)) or None
        if model_type in ("llama4", "llama4_text") and not cfg.get("attention_chunk_size", 8192):
            types = ["full_attention" for _ in types]  # vLLM Llama4Attention: chunked only with a chunk size
    if SLIDING in {_LAYER_TYPE_NAMES[t] for t in types or []} and window is None:
        raise KVConfigError("layer_types has sliding layers but the config has no sliding_window")
    interleaved = types is not None and len(set(types)) > 1
    if model_type in ("qwen2", "qwen3") and interleaved:
        raise KVConfigError(f"vLLM refuses {model_type} with a sliding window on some layers only (max_window_layers < "
                            "num_hidden_layers; Qwen2Model asserts)")
    if interleaved and release.model_window == "always":
        raise KVConfigError(f"{release.describe()}: interleaved sliding and full layers are modelled from vLLM 0.10.1 "
                            "on (before, each model file decided its windows)")

    # step 2: the window each layer's own code passes
    if model_type == "gpt_oss":
        per_layer = [window if i % 2 == 0 else None for i in range(layers)]
        how = "vLLM's gpt_oss.py: even layers sliding (layer_types not read)"
    elif model_type in _MODEL_WINDOW_ONLY or (model_type == "granite" and not release.granite_layer_types):
        per_layer = [None] * layers
    else:
        per_layer = [window if types and types[i] == "sliding_attention" else None for i in range(layers)]
        if model_type == "cohere2" and release.cohere2_window_plus_one and window:
            per_layer = [w + 1 if w else None for w in per_layer]
            notes.append(f"cohere2: vLLM {release.version} passes sliding_window + 1 = {window + 1} "
                         "(commandr.py: a Cohere sliding layer sees window + 1 tokens)")
    # step 3: the model-level window for layers given none
    if release.model_window == "layer_types absent or all sliding":
        model_level = window if types is None or all(t == "sliding_attention" for t in types) else None
    elif release.model_window == "not interleaved":
        model_level = window if not interleaved else None
    else:
        model_level = window
    kinds, windows = [], set()
    for i in range(layers):
        if types and types[i] == "chunked_attention" and chunk:
            kinds.append(CHUNKED)
        elif per_layer[i] or model_level:
            kinds.append(SLIDING)
            windows.add(per_layer[i] or model_level)
        else:
            kinds.append(FULL)
    if len(windows) > 1:
        raise KVConfigError(f"layers slide over different windows {sorted(windows)}: not modelled")
    if model_type == "gpt_oss" or cfg.get("attention_sinks"):
        notes.append("attention sinks: learned per-head logits kept with the weights, not in the KV cache "
                     "(vLLM keeps the layer's full or sliding spec)")
    if set(kinds) != {FULL}:
        notes.insert(0, f"layers: {kinds.count(FULL)} full, {kinds.count(SLIDING)} sliding"
                        + (f", {kinds.count(CHUNKED)} chunked" if CHUNKED in kinds else "") + f" ({how or 'model-level sliding_window'})")
    elif window and types is not None:
        notes.insert(0, f"sliding_window {window} set, but vLLM {release.version} allocates every layer as full "
                        f"attention ({how})")
    final_window = windows.pop() if windows else None
    if set(kinds) == {FULL}:
        return None, None, None, tuple(notes)
    if len(set(kinds)) == 1:
        return final_window, chunk if CHUNKED in kinds else None, (None if kinds[0] == SLIDING else tuple(kinds)), tuple(notes)
    return final_window, chunk if CHUNKED in kinds else None, tuple(kinds), tuple(notes)


if __name__ == "__main__":  # python -m utils.kv.kvcache: the calculator's command line
    from utils.kv.kvcache_cli import main

    raise SystemExit(main())
