"""utils.measure.flops: FLOPs per token, MFU, roofline and bound classification, and phase 0's
batch-size experiment and step limiter (the same verdicts as the notebook and the grader)."""
import json
import math
from pathlib import Path

import pytest
import torch

from tests.nbcells import cell, src
from utils.measure import flops as F

PHASE0 = Path(__file__).resolve().parents[2] / "grader/source/00_foundations/00_foundations.ipynb"

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
    from utils.model.models import preset_config, preset_config_dict

    assert F.flops_per_token_from_config(preset_config_dict("gpt2-small"), 1024) == GPT2_FLOPS_PER_TOKEN_T1024
    assert F.flops_per_token_from_config(preset_config("gpt2-small"), 1024) == GPT2_FLOPS_PER_TOKEN_T1024


def test_count_params_gpt2_small_on_meta_is_nanogpt_n():
    from utils.model.models import build_model

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
    (lambda: F.matmul_flops(-1, 2, 3), "m must be a non-negative number"),
    (lambda: F.matmul_bytes(2, 2, 2, 0), "dtype_bytes must be a positive number"),
    (lambda: F.elementwise_bytes(-5, 4), "numel must be a non-negative number"),
    (lambda: F.ridge_point(989, 0), "bandwidth_gbs must be a positive number"),
    (lambda: F.attainable_tflops(1.0, 989, 0), "bandwidth_gbs must be a positive number"),
    (lambda: F.attainable_tflops(-1.0, 989, 4800), "intensity must be a non-negative number"),
    (lambda: F.arithmetic_intensity(10, 0), "bytes_moved must be a positive number"),
    (lambda: F.mfu(1e12, 0), "peak_tflops must be a positive number"),
    (lambda: F.mfu_from_throughput(-1, 1e9, 989), "tokens_per_s must be a non-negative number"),
    (lambda: F.transformer_flops_per_token(1e6, -2, 4, 16, 128), "n_layers must be a non-negative number"),
    (lambda: F.transformer_flops_per_token(math.nan, 2, 4, 16, 128), "n_params_non_embedding must be a non-negative number, got nan"),
    (lambda: F.bound(1.0, 989, 4800, achieved_tflops=-1), "achieved_tflops must be a non-negative number"),
    (lambda: F.bound(1.0, 989, 4800, overhead_fraction=1.0), "overhead_fraction must be below 1"),
    (lambda: F.flops_per_token_from_config({"model_type": "gpt2"}, 0), "seq_len must be a positive number"),
    (lambda: F.matmul_flops(True, 2, 2), "m must be a non-negative number, got True"),
    (lambda: F.mfu(math.inf, 989), "achieved_flops_per_s must be a non-negative number, got inf"),
    (lambda: F.fixed_share(1.5, 8, 8), "full_batch .8. must be larger than small_batch"),
    (lambda: F.batch_scaling(8, 0.0, 2, 1.0), "full_ms must be a positive number"),
])
def test_bad_input_is_a_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)


def _solution(grade_id: str) -> str:
    return src(cell(json.loads(PHASE0.read_text()), grade_id))


def test_bound_is_the_notebooks_classify_bound_on_a_grid():
    """The phase 0 solution's ``classify_bound`` and :func:`utils.measure.flops.bound` place every
    kernel of a grid of intensities, roof fractions and machines alike."""
    ns: dict = {}
    exec(compile(_solution("roofline_functions"), "roofline_functions", "exec"), ns)  # noqa: S102
    for i in (0.01, 0.125, 1.0, 50.0, 204.0, 206.0, 295.2, 1e4):
        for frac in (0.0, 0.01, 0.0999, 0.1, 0.11, 0.5, 1.0, 1.2):
            for peak, bw in ((989.0, 4800.0), (989.0, 3350.0), (65.0, 320.0), (0.1, 20.0)):
                achieved = frac * min(peak, i * bw / 1e3)
                assert F.bound(i, peak, bw, achieved) == ns["classify_bound"](i, achieved, peak, bw), (i, frac, peak, bw)


SHARES = (-0.2, 0.0, 0.25, 0.4999, 0.5, 0.5001, 0.75, 1.0, 1.3)
MFUS = (0.0, 0.1, 0.3999, 0.4, 0.4001, 0.62, 1.0)


BANDWIDTHS = (0.0, 0.1, 0.3999, 0.4, 0.62, 1.3)


def test_step_bound_follows_the_documented_order_on_a_grid():
    """Overhead first (more than half the step is fixed cost), then the busier unit if it reaches
    40% of its ceiling (MFU against the bandwidth share), overhead when neither does: phase 0's
    rule, which the grader applies through this function. Memory is never the default."""
    verdicts = {F.step_bound(s, m, b) for s in SHARES for m in MFUS for b in BANDWIDTHS}
    assert verdicts == {"overhead", "compute", "memory"}
    for s in SHARES:
        for m in MFUS:
            for b in BANDWIDTHS:
                want = "overhead" if s > 0.5 or max(m, b) < 0.4 else ("compute" if m >= b else "memory")
                assert F.step_bound(s, m, b) == want, (s, m, b)
    assert F.step_bound(0.5, 0.4, 0.0) == "compute" and F.step_bound(0.5001, 0.9, 0.0) == "overhead"
    assert F.step_bound(0.2, 0.3999, 0.1) == "overhead"  # the old default bucket: nothing says memory
    assert F.step_bound(0.2, 0.1, 0.4) == "memory" and F.step_bound(0.2, 0.5, 0.5) == "compute"


class _Time:
    def __init__(self, median_ms: float):
        self.median_ms = median_ms


def test_batch_experiment_is_the_notebooks_solution_on_a_grid():
    """The phase 0 solution cell run on a grid of step times and peaks: its batch_scaling,
    fixed_share, bandwidth share and LIMITER are exactly :func:`batch_scaling`, :func:`fixed_share`,
    the step's bytes over its time and :func:`step_bound` of the same numbers."""
    code = compile(_solution("limiter_answer"), "limiter_answer", "exec")
    batch, seq, fpt = 16, 256, 1.2e9
    for small in (1, 4):
        for full_ms in (10.0, 40.0, 160.0):
            for small_ms in (3.0, 9.0, 10.0, 40.0, 80.0):
                for peak in (1.0, 19.5, 67.0, 989.0):
                    times = iter((full_ms, small_ms))
                    ns = {"timing": type("T", (), {"benchmark": staticmethod(lambda *a, _t=times, **k: _Time(next(_t)))}),
                          "train_step": None, "xb": list(range(batch)), "yb": list(range(batch)),
                          "SIZES": type("S", (), {"batch_size": batch}), "small_batch": small,
                          "FLOPS_PER_TOKEN": fpt, "TOKENS_PER_STEP": batch * seq, "TRAIN_PEAK_TFLOPS": peak,
                          "STEP_BYTES": 2e10, "TRAIN_PEAK_GBS": 2000.0,
                          "achieved_tflops": lambda fl, ms: fl / (ms * 1e-3) / 1e12,
                          "achieved_bandwidth_gbs": lambda by, ms: by / (ms * 1e-3) / 1e9}
                    exec(code, ns)  # noqa: S102
                    r = F.batch_scaling(batch, full_ms, small, small_ms)
                    share = F.fixed_share(r, batch, small)
                    mfu = F.mfu_from_throughput(batch * seq / (full_ms * 1e-3), fpt, peak)
                    assert ns["batch_scaling"] == r and ns["fixed_share"] == share
                    assert ns["mfu"] == pytest.approx(mfu, rel=1e-12)
                    bw_share = 2e10 / (full_ms * 1e-3) / 1e9 / 2000.0
                    assert ns["bandwidth_share"] == pytest.approx(bw_share, rel=1e-12)
                    assert ns["LIMITER"] == F.step_bound(share, ns["mfu"], ns["bandwidth_share"])


def test_fixed_share_of_a_fixed_plus_linear_step():
    """A step of c + w x batch: the share is c over the full step's time."""
    c, w, big, small = 6.0, 0.5, 32, 4
    r = F.batch_scaling(big, c + w * big, small, c + w * small)
    assert F.fixed_share(r, big, small) == pytest.approx(c / (c + w * big))
    assert F.fixed_share(F.batch_scaling(big, w * big, small, w * small), big, small) == pytest.approx(0.0, abs=1e-12)
