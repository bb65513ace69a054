"""utils.flops: FLOPs per token, MFU, roofline and bound classification."""
import math

import pytest
import torch

from utils import flops as F

# GPT-2 small (openai-community/gpt2 config: 12 layers, 12 heads, width 768, 1024 positions,
# vocab 50257). nanoGPT's get_num_params() prints "number of parameters: 123.65M" for it:
# all 124,439,808 parameters less the 1024 x 768 position embedding (the token embedding is
# tied to the LM head and stays). Its estimate_mfu then uses T = block_size = 1024.
GPT2_TOTAL = 124_439_808
GPT2_N = GPT2_TOTAL - 1024 * 768  # 123,653,376
GPT2_FLOPS_PER_TOKEN_T1024 = 6 * GPT2_N + 12 * 12 * 12 * 64 * 1024  # 855,166,464


def test_flops_per_token_hand_computed():
    # 6 * 1e6 = 6,000,000; 12 * 2 * 4 * 16 * 128 = 196,608
    assert F.transformer_flops_per_token(1_000_000, 2, 4, 16, 128) == 6_196_608
    assert F.transformer_flops_per_token(1_000_000, 2, 4, 16, 128, training=False) == pytest.approx(2_065_536)


def test_flops_per_token_gpt2_small_nanogpt():
    assert GPT2_N == 123_653_376
    assert GPT2_FLOPS_PER_TOKEN_T1024 == 855_166_464
    assert F.transformer_flops_per_token(GPT2_N, 12, 12, 64, 1024) == GPT2_FLOPS_PER_TOKEN_T1024


def test_flops_per_token_from_config_gpt2_matches_nanogpt():
    from utils.models import preset_config, preset_config_dict

    assert F.flops_per_token_from_config(preset_config_dict("gpt2-small"), 1024) == GPT2_FLOPS_PER_TOKEN_T1024
    assert F.flops_per_token_from_config(preset_config("gpt2-small"), 1024) == GPT2_FLOPS_PER_TOKEN_T1024


def test_count_params_gpt2_small_on_meta_is_nanogpt_n():
    from utils.models import build_model

    model = build_model("gpt2-small", device="meta")
    assert F.count_params(model, exclude_embeddings=False) == GPT2_TOTAL
    assert F.count_params(model) == GPT2_N


class _Toy(torch.nn.Module):
    def __init__(self, tied: bool):
        super().__init__()
        self.tok = torch.nn.Embedding(10, 4)  # 40
        self.pos = torch.nn.Embedding(5, 4)  # 20
        self.lin = torch.nn.Linear(4, 4)  # 20
        self.head = torch.nn.Linear(4, 10, bias=False)  # 40
        if tied:
            self.head.weight = self.tok.weight


def test_count_params_tied_keeps_token_embedding_untied_drops_it():
    tied, untied = _Toy(tied=True), _Toy(tied=False)
    assert F.count_params(tied, exclude_embeddings=False) == 40 + 20 + 20  # shared tensor once
    assert F.count_params(tied) == 40 + 20  # position embedding subtracted, tied head kept
    assert F.count_params(untied, exclude_embeddings=False) == 120
    assert F.count_params(untied) == 20 + 40  # both lookups subtracted, head kept


def test_meta_fallback_for_other_model_types():
    cfg = {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "pad_token_id": 0,
           "eos_token_id": 0, "bos_token_id": 0}
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(data.pop("model_type"), **data))
    assert F.non_embedding_params_from_config(cfg) == F.count_params(model)
    per_token = F.flops_per_token_from_config(cfg, 32)
    assert per_token == 6 * F.count_params(model) + 12 * 2 * 4 * 16 * 32


def test_from_config_rejects_configs_without_model_type():
    with pytest.raises(ValueError, match="model_type"):
        F.flops_per_token_from_config({"hidden_size": 8}, 16)


def test_mfu():
    assert F.mfu(494.5e12, 989) == pytest.approx(0.5)
    # 1000 tokens/s at 1 GFLOP per token is 1 TFLOP/s: all of a 1 TFLOP/s peak
    assert F.mfu_from_throughput(1000, 1e9, 1.0) == pytest.approx(1.0)
    # GPT-2 small at 100k tokens/s on an H200 (989 TFLOP/s bf16, datasheet)
    assert F.mfu_from_throughput(100_000, GPT2_FLOPS_PER_TOKEN_T1024, 989) == pytest.approx(0.08647, rel=1e-3)


def test_ridge_points_match_reference():
    assert F.ridge_point(989, 4800) == pytest.approx(206.04, abs=0.01)  # H200
    assert F.ridge_point(989, 3350) == pytest.approx(295.2, abs=0.1)  # H100 SXM
    assert F.ridge_point(65, 320) == pytest.approx(203.1, abs=0.1)  # T4 fp16


def test_attainable_both_sides_of_the_ridge():
    peak, bw = 989.0, 4800.0
    ridge = F.ridge_point(peak, bw)
    assert F.attainable_tflops(10, peak, bw) == pytest.approx(48.0)  # 10 FLOP/B x 4.8 TB/s
    assert F.attainable_tflops(ridge / 2, peak, bw) == pytest.approx(peak / 2)
    assert F.attainable_tflops(ridge, peak, bw) == pytest.approx(peak)
    assert F.attainable_tflops(ridge * 10, peak, bw) == peak
    assert F.attainable_tflops(0, peak, bw) == 0


def test_bound_placement_without_measurement():
    peak, bw = 989.0, 4800.0
    ridge = F.ridge_point(peak, bw)
    assert F.bound(ridge * 0.99, peak, bw) == "memory"
    assert F.bound(ridge, peak, bw) == "compute"
    assert F.bound(ridge * 1.01, peak, bw) == "compute"


def test_bound_overhead_rule():
    peak, bw = 989.0, 4800.0
    # a big bf16 matmul: high intensity, 80% of peak -> compute
    ai = F.arithmetic_intensity(F.matmul_flops(8192, 8192, 8192), F.matmul_bytes(8192, 8192, 8192, 2))
    assert F.bound(ai, peak, bw, achieved_tflops=793) == "compute"
    # a large fp32 add: 1/12 FLOP/B, ceiling 0.4 TFLOP/s; at 90% of it -> memory
    ai_add = F.arithmetic_intensity(F.elementwise_flops(1 << 28), F.elementwise_bytes(1 << 28, 4, 2, 1))
    assert ai_add == pytest.approx(1 / 12)
    assert F.bound(ai_add, peak, bw, achieved_tflops=0.36) == "memory"
    # the same add reaching 1% of its ceiling: the time goes elsewhere -> overhead
    assert F.bound(ai_add, peak, bw, achieved_tflops=0.004) == "overhead"
    # the threshold is exactly overhead_fraction x ceiling: just below is overhead, at it is not
    ceiling = F.attainable_tflops(ai, peak, bw)
    assert F.bound(ai, peak, bw, achieved_tflops=0.0999 * ceiling) == "overhead"
    assert F.bound(ai, peak, bw, achieved_tflops=0.1 * ceiling) == "compute"
    assert F.bound(ai, peak, bw, achieved_tflops=0.3 * ceiling, overhead_fraction=0.5) == "overhead"
    assert F.bound(ai, peak, bw, achieved_tflops=0.0, overhead_fraction=0) == "compute"


def test_roofline_fraction():
    assert F.roofline_fraction(48.0, 10, 989, 4800) == pytest.approx(1.0)
    assert F.roofline_fraction(494.5, 1000, 989, 4800) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="intensity is 0"):
        F.roofline_fraction(1.0, 0, 989, 4800)


def test_kernel_helpers():
    assert F.matmul_flops(2, 3, 4) == 48
    assert F.matmul_bytes(2, 3, 4, 2) == 2 * (2 * 4 + 4 * 3 + 2 * 3)
    assert F.elementwise_bytes(1000, 4) == 8000  # one read, one write
    assert F.elementwise_bytes(1000, 2, n_inputs=2, n_outputs=1) == 6000
    assert F.matmul_flops(0, 3, 4) == 0
    # square matmul intensity grows as n/3 for 2-byte dtypes: 8192 -> 2730.7 FLOP/B
    ai = F.arithmetic_intensity(F.matmul_flops(8192, 8192, 8192), F.matmul_bytes(8192, 8192, 8192, 2))
    assert ai == pytest.approx(8192 / 3)


@pytest.mark.parametrize("call, match", [
    (lambda: F.matmul_flops(-1, 2, 3), "m must be >= 0"),
    (lambda: F.matmul_bytes(2, 2, 2, 0), "dtype_bytes must be > 0"),
    (lambda: F.elementwise_bytes(-5, 4), "numel must be >= 0"),
    (lambda: F.ridge_point(989, 0), "bandwidth_gbs must be > 0"),
    (lambda: F.attainable_tflops(1.0, 989, 0), "bandwidth_gbs must be > 0"),
    (lambda: F.attainable_tflops(-1.0, 989, 4800), "intensity must be >= 0"),
    (lambda: F.arithmetic_intensity(10, 0), "bytes_moved must be > 0"),
    (lambda: F.mfu(1e12, 0), "peak_tflops must be > 0"),
    (lambda: F.mfu_from_throughput(-1, 1e9, 989), "tokens_per_s must be >= 0"),
    (lambda: F.transformer_flops_per_token(1e6, -2, 4, 16, 128), "n_layers must be >= 0"),
    (lambda: F.transformer_flops_per_token(math.nan, 2, 4, 16, 128), "must be a number"),
    (lambda: F.bound(1.0, 989, 4800, achieved_tflops=-1), "achieved_tflops must be >= 0"),
    (lambda: F.bound(1.0, 989, 4800, overhead_fraction=1.0), "overhead_fraction must be below 1"),
    (lambda: F.flops_per_token_from_config({"model_type": "gpt2"}, 0), "seq_len must be > 0"),
    (lambda: F.matmul_flops(True, 2, 2), "must be a number"),
])
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
