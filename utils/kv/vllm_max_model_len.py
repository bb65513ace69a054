"""The context length vLLM takes from a Hugging Face config when ``--max-model-len`` is left out, and
the longest one it accepts: :func:`vllm_max_model_len`.

vLLM derives both in ``_get_and_verify_max_len`` (``vllm/config/model.py``; ``vllm/config.py`` before
0.10; ``docs/reference.md`` gives the lines of the 0.32.0 wheel) from the decoder's config
(``hf_text_config``: a multimodal config's ``text_config``):

1. the smallest length key the config gives (``max_position_embeddings``, ``n_positions``,
   ``max_seq_len``, ``seq_length``, ``model_max_length``, ``max_target_positions``,
   ``max_sequence_length``, ``max_seq_length``, ``seq_len``), ``model_max_length`` winning whenever it
   is set (Command-R; ``derive_max_model_len_and_key``,
   ``vllm/transformers_utils/model_arch_config_convertor.py``), transformers' defaults filled in for
   keys the file leaves out (:func:`utils.kv.kvcache.decoder_config`); with none of them vLLM takes a given
   length as it is (and the calculator knows no default);
2. times the RoPE scaling ``factor`` for every RoPE type but ``su``, ``longrope`` and ``llama3``
   (``linear``, ``dynamic``, ...); before 0.30 a YaRN model's length is first reset to its
   ``original_max_position_embeddings`` and then scaled, from 0.30 YaRN, ``deepseek_yarn`` and
   ``deepseek_llama_scaling`` leave the length as the config gives it; Gemma 3 is never scaled;
3. left out, ``--max-model-len`` is that length, or for a LongRoPE model (Phi-3.5, Phi-4-mini) its
   ``original_max_position_embeddings`` (from 0.11.1).

A longer ``--max-model-len`` stops vLLM at start-up ("User-specified max_model_len (N) is greater than
the derived max_model_len ...") unless the config's ``model_max_length`` allows it or
``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` is set. The tokenizer's ``model_max_length`` caps the length of
pooling models only, which the calculator does not model. Which release does what:
:data:`utils.kv.vllm_releases.RELEASE_RULES` (``longrope_default_len``, ``yarn_scales_len``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from utils.kv.kvcache import decoder_config
from utils.kv.vllm_releases import VllmRelease, vllm_release
from utils.validate import KVConfigError

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_UNSCALED = ("su", "longrope", "llama3")  # RoPE types whose factor never lengthens the context
_UNSCALED_FROM_030 = _UNSCALED + ("yarn", "deepseek_yarn", "deepseek_llama_scaling")
# transformers' layer types (configuration_utils.ALLOWED_LAYER_TYPES, 5.19): a RoPE dict keyed by them alone holds
# one dict per layer type (vLLM's is_rope_parameters_nested)
_LAYER_TYPE_KEYS = frozenset({
    "full_attention", "sliding_attention", "chunked_attention", "window_attention", "indexed_attention",
    "compressed_sparse_attention", "heavily_compressed_attention", "minimax_m3_sparse", "conv", "moe", "hybrid",
    "hybrid_sliding", "linear_attention", "sparse", "dense"})


@dataclass(frozen=True)
class VllmMaxModelLen:
    """``default``: the ``max_model_len`` vLLM uses when it is left out; ``limit``: the longest it
    accepts without ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``; ``how``: one line on where they came from."""

    default: int | None  # None: the config gives no length key, and its class's default is not known here
    limit: float
    how: str

    def check(self, max_model_len: int, *, allow_long: bool = False) -> None:
        """One-line :class:`KVConfigError` when vLLM would refuse ``max_model_len`` at start-up."""
        if max_model_len > self.limit and not allow_long:
            raise KVConfigError(f"max_model_len {max_model_len:,} is longer than the {_num(self.limit)} tokens vLLM "
                                f"derives from the config ({self.how}): vLLM refuses it unless "
                                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set (--allow-long-max-model-len here)")


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,}"


def _rope_dicts(cfg: dict) -> list[dict]:
    """The config's RoPE parameter dicts (one, or one per layer type), as transformers reads
    ``rope_scaling`` (it wins over ``rope_parameters``) and vLLM's ``patch_legacy_rope_type``
    renames ``su`` to ``longrope``."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict) or not rope:
        return []
    nested = set(rope) <= _LAYER_TYPE_KEYS
    out = []
    for params in (rope.values() if nested else [rope]):
        if isinstance(params, dict) and params:
            kind = params.get("rope_type") or params.get("type") or "default"
            out.append({**params, "rope_type": "longrope" if kind == "su" else kind})
    return out


def vllm_max_model_len(config: dict | str | Path, *, vllm_version: str | VllmRelease | None = None) -> VllmMaxModelLen:
    """vLLM's default and longest ``max_model_len`` for a Hugging Face ``config.json`` (a dict or a
    path; a multimodal config's ``text_config`` is read), as release ``vllm_version`` derives them (see the
    module docstring)."""
    release = vllm_release(vllm_version)
    cfg = decoder_config(config)
    derived, key = float("inf"), None
    for name in LENGTH_KEYS:
        value = cfg.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise KVConfigError(f"config field {name} must be a positive number of tokens, got {value!r}")
            if value < derived:
                derived, key = value, name
    if cfg.get("model_max_length"):
        derived, key = cfg["model_max_length"], "model_max_length"
    if key is None:  # vLLM: a given length as it is; left out, 2048 or the config class's own default
        return VllmMaxModelLen(None, float("inf"), "the config gives no length key (max_position_embeddings, ...): "
                                                   "its transformers class's default applies")
    how = f"{key} {_num(derived)}"
    ropes = _rope_dicts(cfg)
    if ropes and "gemma3" not in str(cfg.get("model_type")):
        factor = 1.0
        unscaled = _UNSCALED if release.yarn_scales_len else _UNSCALED_FROM_030
        for rp in ropes:
            if rp["rope_type"] not in unscaled:
                factor = rp.get("factor", factor)
                if rp["rope_type"] == "yarn":  # before 0.30 only: _UNSCALED_FROM_030 holds yarn
                    derived = cfg.get("original_max_position_embeddings") or rp.get(
                        "original_max_position_embeddings") or cfg.get("max_position_embeddings", derived)
                    how = f"YaRN's original_max_position_embeddings {_num(derived)}"
        factor = 1.0 if factor is None else factor
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
            raise KVConfigError(f"RoPE scaling factor must be a positive number, got {factor!r}")
        if factor != 1:
            derived *= factor
            how += f" x RoPE factor {factor:g} ({', '.join(sorted({rp['rope_type'] for rp in ropes}))})"
    limit = derived if not cfg.get("model_max_length") else max(derived, cfg["model_max_length"])
    default = int(derived)
    if release.longrope_default_len and any(rp["rope_type"] == "longrope" for rp in ropes):
        default = int(cfg.get("original_max_position_embeddings") or derived)
        how += f"; LongRoPE: default original_max_position_embeddings {default:,} (vLLM 0.11.1 on)"
    return VllmMaxModelLen(default, limit, how)

