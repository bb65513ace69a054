"""utils.kv.sglang_log: SGLang start-up logs from GitHub (tests/data/sglang_logs, each citing its
source in its header and in README.md) parsed to the numbers printed in them, and the
calculator against the logged #tokens and K/V sizes where the model's config is known."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from utils.kv.kvcache import KVSpec, from_hf_config
from utils.kv.sglang_log import (
    GB,
    KVAllocation,
    SglangLogError,
    SglangLogSummary,
    cell_size_bytes,
    kv_buffer_bytes,
    max_total_num_tokens,
    parse_sglang_log,
    pre_load_avail_gb,
    profile_max_num_token,
    sglang_kv_check,
    spec_cell_size,
    spec_kv_sizes,
    tokens_range,
)

LOGS = Path(__file__).parent.parent / "data" / "sglang_logs"
VLLM_LOGS = Path(__file__).parent.parent / "data" / "vllm_logs"
S, A = SglangLogSummary, KVAllocation

# Qwen/Qwen3-235B-A22B config.json (the -FP8 checkpoint has the same attention): 94 layers,
# 64 query heads, 4 KV heads, head_dim 128, bfloat16.
QWEN3_235B_CFG = {"model_type": "qwen3_moe", "num_hidden_layers": 94, "num_attention_heads": 64,
                  "num_key_value_heads": 4, "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16"}
# deepseek-ai/DeepSeek-R1 config.json: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64 (MLA).
DEEPSEEK_R1_CFG = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
                   "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168, "torch_dtype": "bfloat16"}


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def ranks(prefix: str, n: int, order: str) -> tuple:
    return tuple(f"{prefix}{i}" for i in order.split())[:n]


MUSA_KV = A("TP0", 1106304, 25.32, 25.32, None, "torch.bfloat16", "25.32")
REAL = {
    "vllm_21348_qwen3_235b_fp8_tp4.log": S(kv_allocations=(A(None, 367404, 8.23, 8.23, None, None, "8.23"),)),
    "sglang_11716_tp8_h200_mha.log": S(
        kv_allocations=tuple(A(r, 2795207, 53.31, 53.31, None, None, "53.31") for r in ("TP5", "TP1", "TP3", "TP6")),
        load_begin_avail_gb=(("TP5", 137.29), ("TP4", 137.29), ("TP6", 137.29), ("TP2", 137.29), ("TP0", 137.34),
                             ("TP7", 137.52), ("TP3", 137.29), ("TP1", 137.29)),
        memory_pool_end_avail_gb=tuple((r, 11.87) for r in ("TP5", "TP1", "TP3", "TP6"))),
    "sglang_15464_mimo_v2_flash_tp4_swa.log": S(
        kv_allocations=(A("TP2", 1496958, 41.76, 27.84, None, None, "41.76"),
                        A("TP1", 1496958, 41.76, 27.84, None, None, "41.76"))
        + tuple(A(r, 1496958, 4.82, 3.21, None, None, "4.82") for r in ("TP2", "TP0", "TP1", "TP3")),
        memory_pool_end_avail_gb=(("TP2", 22.56), ("TP0", 22.59), ("TP1", 22.56), ("TP3", 22.71))),
    "sglang_27537_musa_tp2_dtype_field.log": S(kv_allocations=(MUSA_KV,), memory_pool_end_avail_gb=(("TP0", 12.05),),
                                               kv_cache_dtype=(("TP0", "torch.bfloat16"),)),
    "sglang_13075_qwen25vl_pp2_tp2.log": S(
        max_total_num_tokens=(("PP1 TP0", 2524524), ("PP0 TP0", 2524524)),
        chunked_prefill_size=(("PP1 TP0", 8192), ("PP0 TP0", 8192)),
        max_prefill_tokens=(("PP1 TP0", 16384), ("PP0 TP0", 16384)),
        max_running_requests=(("PP1 TP0", 4096), ("PP0 TP0", 4096)),
        context_len=(("PP1 TP0", 128000), ("PP0 TP0", 128000)),
        available_gpu_mem_gb=(("PP1 TP0", 17.83), ("PP0 TP0", 17.90))),
    "sglang_29575_scheduler_line.log": S(
        max_total_num_tokens=((None, 2086558),), chunked_prefill_size=((None, 8192),), max_prefill_tokens=((None, 16384),),
        max_running_requests=((None, 33),), context_len=((None, 256000),), available_gpu_mem_gb=((None, 17.22),)),
    "ktransformers_1870_qwen35_moe_tp2_hybrid.log": S(
        kv_allocations=(A("TP0", 580364, 4.15, 4.15, None, None, "4.15"), A("TP1", 580364, 4.15, 4.15, None, None, "4.15")),
        load_end_avail_gb=(("TP0", 19.08), ("TP1", 19.08)), load_end_mem_usage_gb=(("TP0", 3.76), ("TP1", 3.76)),
        memory_pool_end_avail_gb=(("TP0", 4.02), ("TP1", 4.02)),
        max_total_num_tokens=(("TP0", 580364),), chunked_prefill_size=(("TP0", 2048),),
        max_prefill_tokens=(("TP0", 16384),), max_running_requests=(("TP0", 1),), context_len=(("TP0", 8192),),
        available_gpu_mem_gb=(("TP0", 3.63),), kv_cache_dtype=(("TP0", "torch.bfloat16"),)),
    "sglang_7691_deepseek_r1_rocm_dp8_negative.log": S(
        load_end_avail_gb=(("DP0 TP0", 21.73),), load_end_mem_usage_gb=(("DP0 TP0", 166.59),),
        profiled_max_total_tokens=tuple((f"DP{i} TP{i}", -561981) for i in (0, 7, 6, 4, 5, 3, 1, 2)),
        errors=tuple((f"DP{i} TP{i}", "negative_profile") for i in (0, 7, 6, 4, 5, 3, 1, 2))),
    "inferencex_2128_deepseek_v4_pro_tp8_error.log": S(
        load_end_avail_gb=((None, 12.25),), load_end_mem_usage_gb=((None, 125.65),),
        mem_fraction_static=((None, 0.88),), errors=((None, "no_memory_for_kv"),)),
    "sglang_11830_b200_kv_dtype_line.log": S(
        kv_allocations=(A(None, 2243474, 59.91, 59.91, None, None, "59.91"),),
        memory_pool_end_avail_gb=((None, 40.03),), kv_cache_dtype=((None, "torch.bfloat16"),)),
    "sglang_4127_qwq32b_v043post3_tp4_load.log": S(
        load_begin_avail_gb=(("TP1", 21.63), ("TP2", 21.63), ("TP0", 21.63), ("TP3", 21.63))),
    "sglang_jax_564_deepseek_v2_lite_server_args.log": S(
        chunked_prefill_size=((None, 4096),), max_prefill_tokens=((None, 8192),), mem_fraction_static=((None, 0.8),),
        page_size=((None, 64),), kv_cache_dtype=((None, "auto"),)),
}


def test_every_fixture_is_listed_cites_its_source_and_is_tested():
    files = sorted(p.name for p in LOGS.glob("*.log"))
    assert len(files) >= 8 and files == sorted(REAL)
    readme = (LOGS / "README.md").read_text(encoding="utf-8")
    for name in files:
        head = read(name).splitlines()[:3]
        assert head[0].startswith("@source: https://github.com/") and head[1].startswith("@model: "), name
        assert name in readme and head[0].split()[1] in readme, name


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_log_parses_to_exactly_the_logged_numbers(name):
    """The whole summary must match: a missed line and a spurious extra match both fail."""
    assert parse_sglang_log(read(name)) == REAL[name]


def test_ranks_and_accessors():
    s = parse_sglang_log(read("sglang_11716_tp8_h200_mha.log"))
    assert s.kv_tokens == 2795207 and s.ranks == ("TP5", "TP1", "TP3", "TP6")
    assert pre_load_avail_gb(s) == 137.29  # the minimum over ranks, as SGLang sizes with it
    assert S().kv_tokens is None and S().ranks == ()


def test_line_ends_colours_docker_and_k8s_prefixes_do_not_change_the_numbers():
    text = read("ktransformers_1870_qwen35_moe_tp2_hybrid.log")
    want = REAL["ktransformers_1870_qwen35_moe_tp2_hybrid.log"]
    assert parse_sglang_log(text.replace("\n", "\r\n")) == want
    assert parse_sglang_log(text.replace("\n", "\r")) == want
    assert parse_sglang_log(text.replace("\n", "\r\n").encode("utf-8")) == want
    docker = "\n".join(json.dumps({"log": line + "\n", "stream": "stderr", "time": "2026-02-27T17:10:28Z"})
                       for line in text.splitlines())
    assert parse_sglang_log(docker) == want
    k8s = "\n".join("2026-02-27T17:10:28.123456789Z stderr F " + line for line in text.splitlines())
    assert parse_sglang_log(k8s) == want
    coloured = "\n".join("\x1b[32m" + line.replace("] ", "]\x1b[0m ", 1) for line in text.splitlines())
    assert parse_sglang_log(coloured) == want


def test_wrapped_lines_are_joined_once():
    wrapped = ("[2025-10-16 09:06:22 TP1] KV Cache is allocated. #tokens: 2795207, K size: 53.3\n1 GB, V size: 53.31 GB\n"
               "[2025-11-11 20:29:30 PP0 TP0] max_total_num_tokens=2524524, chunked_prefill_size=8192, max_prefill_to\n"
               "kens=16384, max_running_requests=4096, context_len=128000, available_gpu_mem=17.90 GB\n")
    s = parse_sglang_log(wrapped)
    assert s.kv_allocations == (A("TP1", 2795207, 53.31, 53.31, None, None, "53.31"),)
    assert s.max_prefill_tokens == (("PP0 TP0", 16384),) and s.max_running_requests == (("PP0 TP0", 4096),)
    assert s.context_len == (("PP0 TP0", 128000),) and s.available_gpu_mem_gb == (("PP0 TP0", 17.9),)


def test_line_formats_not_found_in_a_posted_log():
    """The MLA line and an fp8 dtype, from the f-strings in memory_pool.py (MLATokenToKVPool,
    and the 2026 ``dtype:`` field); the old "Not enough memory" error (model_runner.py)."""
    mla = parse_sglang_log("[2025-11-04 05:27:13 DP0 TP0 EP0] KV Cache is allocated. #tokens: 524288, KV size: 17.16 GB")
    assert mla.kv_allocations == (A("DP0 TP0 EP0", 524288, None, None, 17.16, None, "17.16"),)
    fp8 = parse_sglang_log("KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 262144, K size: 2.00 GB, "
                           "V size: 2.00 GB")
    assert fp8.kv_cache_dtype == ((None, "torch.float8_e4m3fn"),) and fp8.kv_allocations[0].decimals == 2
    err = parse_sglang_log("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                           "Current value: self.server_args.mem_fraction_static=0.84")
    assert err.errors == ((None, "not_enough_memory"),) and err.mem_fraction_static == ((None, 0.84),)


def test_text_without_sglang_lines_gives_an_empty_summary():
    for junk in ("", "\n\r\n", bytes(range(256)) * 8, "KV Cache is allocated. #tokens: lots",
                 "max_total_num_tokens=None, context_length=None, max_running_requests=None"):
        assert parse_sglang_log(junk) == S(), junk[:40]
    for p in sorted(VLLM_LOGS.glob("*.log")):  # vLLM's lines are not SGLang's
        assert parse_sglang_log(p.read_text(encoding="utf-8")) == S(), p.name


def test_wrong_type_raises_one_line():
    for bad in (None, 42, LOGS / "sglang_29575_scheduler_line.log", ["KV Cache is allocated."]):
        with pytest.raises(SglangLogError, match="needs the log's text") as exc:
            parse_sglang_log(bad)
        assert isinstance(exc.value, ValueError) and "\n" not in str(exc.value)


# ---------------------------------------------------------------- the calculator
def test_cell_size_mha_and_mla():
    assert cell_size_bytes(32, 8, 128, 2) == 131_072  # Llama-3-8B, one GPU
    assert cell_size_bytes(61, 1, 576, 2, mla=True) == 70_272  # DeepSeek-V3/R1 latent
    assert cell_size_bytes(2, 1, 192, 1, v_head_dim=128) == 640  # K and V heads of different width
    qwen = from_hf_config(QWEN3_235B_CFG)
    assert spec_cell_size(qwen, 4) == 94 * 1 * 256 * 2 == 48_128  # 4 KV heads / TP4 = 1 per rank
    assert spec_cell_size(qwen, 8) == 48_128  # at least one head per rank
    assert spec_cell_size(from_hf_config(DEEPSEEK_R1_CFG), 8) == 70_272  # MLA is not split by TP


def test_profile_page_rounding_and_range():
    # 40 GB free after load, 80 before, fraction 0.9: 32 GB for the pool
    assert profile_max_num_token(40.0, 80.0, 0.9, 131_072) == 32 * GB // 131_072 == 262_144
    assert max_total_num_tokens(262_143, page_size=64) == 262_080
    assert max_total_num_tokens(262_144, max_total_tokens=100_000) == 100_000
    lo, hi = tokens_range(40.0, 80.0, 0.9, 131_072)
    assert lo < 262_144 < hi and hi - lo < 200  # +-0.005 GB on each printed value
    assert kv_buffer_bytes(10, 1, 2, 100) == 11 * 2 * 100  # the padded slot 0


def test_qwen3_235b_tp4_sizes_agree_with_the_logged_line():
    """vLLM issue 21348: #tokens 367404 on TP4 -> (367404 + 1) x 1 head x 128 x 2 B x 94 layers
    = 8,841,233,920 B = 8.234 GB per K and per V, printed 8.23."""
    qwen = from_hf_config(QWEN3_235B_CFG)
    assert spec_kv_sizes(qwen, 367404, 4) == (8_841_233_920, 8_841_233_920)
    r = sglang_kv_check(read("vllm_21348_qwen3_235b_fp8_tp4.log"), qwen, tp_size=4)
    assert r["agrees"] and [c["check"] for c in r["checks"]] == ["size"]
    assert not sglang_kv_check(read("vllm_21348_qwen3_235b_fp8_tp4.log"), qwen, tp_size=2)["agrees"]


def test_tp8_sizes_fit_an_80_layer_one_head_per_rank_geometry():
    """PR 11716 names no model; 53.31 GB for 2795207 tokens is (N + 1) x 80 layers x 1 KV head
    x 128 x 2 B = 53.314 GB, the geometry of an 80-layer, 8-KV-head model (Llama-3-70B's
    shape) at TP8. Only the arithmetic is checked, not the model."""
    spec = KVSpec(80, 8, 128, 2)
    r = sglang_kv_check(read("sglang_11716_tp8_h200_mha.log"), spec, tp_size=8)
    assert r["agrees"] and len(r["checks"]) == 4  # no Load weight end line: sizes only


def test_tokens_check_from_load_lines_and_scheduler_line():
    """A log built from the documented line formats: the calculator's tokens must land in
    the range the printed avail mem allows, and the scheduler line must repeat the pool."""
    spec = KVSpec(32, 8, 128, 2)
    tokens = max_total_num_tokens(profile_max_num_token(40.0, 80.0, 0.9, 131_072))
    k = spec_kv_sizes(spec, tokens)[0] / GB
    log = ("[TP0] Load weight begin. avail mem=80.00 GB\n"
           "[TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=40.00 GB, mem usage=40.00 GB.\n"
           f"[TP0] KV Cache is allocated. #tokens: {tokens}, K size: {k:.2f} GB, V size: {k:.2f} GB\n"
           f"[TP0] max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
           "max_running_requests=2048, context_len=8192, available_gpu_mem=7.5 GB\n")
    r = sglang_kv_check(log, spec, mem_fraction_static=0.9)
    assert r["agrees"] and [c["check"] for c in r["checks"]] == ["size", "tokens", "scheduler"]
    assert not sglang_kv_check(log, spec, mem_fraction_static=0.8)["agrees"]  # 0.8 would give fewer tokens
    assert not sglang_kv_check(log.replace("max_total_num_tokens=", "max_total_num_tokens=1"), spec,
                               mem_fraction_static=0.9)["agrees"]


def test_error_logs_and_the_calculator():
    """InferenceX 2128: pre-load memory = avail + mem usage = 137.90 GB; 12.25 - 137.90 x 0.12
    < 0, so the pool is negative, as the ValueError says. sglang 7691 (DeepSeek-R1, DP8 x TP8,
    "even with 0.95"): with 0.95 the same arithmetic gives a positive pool, but the log's
    profiled value is -561981 tokens (-39.5 GB at 70,272 B/token): the excerpt does not show the
    fraction or memory that produced it, so the calculator disagrees with this log."""
    s = parse_sglang_log(read("inferencex_2128_deepseek_v4_pro_tp8_error.log"))
    assert pre_load_avail_gb(s) == pytest.approx(137.90)
    assert profile_max_num_token(12.25, pre_load_avail_gb(s), 0.88, 1) < 0
    r7691 = parse_sglang_log(read("sglang_7691_deepseek_r1_rocm_dp8_negative.log"))
    cell = spec_cell_size(from_hf_config(DEEPSEEK_R1_CFG), 8)
    assert profile_max_num_token(21.73, pre_load_avail_gb(r7691), 0.95, cell) > 0
    assert r7691.profiled_max_total_tokens[0][1] < 0
    assert not sglang_kv_check(read("inferencex_2128_deepseek_v4_pro_tp8_error.log"), KVSpec(61, 1, 576, 1, mla=True),
                               tp_size=8)["agrees"]  # no pool line: nothing to agree with


def test_mla_line_against_the_calculator():
    """DeepSeek-R1 at TP8, 100,000 tokens: (100,000 + 1) x 576 x 2 B x 61 layers = 6.54 GB."""
    spec = from_hf_config(DEEPSEEK_R1_CFG)
    kv, v = spec_kv_sizes(spec, 100_000, 8)
    assert v is None and kv == 100_001 * 576 * 2 * 61
    assert sglang_kv_check(f"[TP3] KV Cache is allocated. #tokens: 100000, KV size: {kv / GB:.2f} GB", spec,
                           tp_size=8)["agrees"]
