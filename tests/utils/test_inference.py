"""utils.serving.decode, utils.serving.inference and utils.model.quantize on a CPU (llama-tiny, fp32), plus GPU-marked checks.

The fast decode path must produce eager ``generate``'s greedy tokens (the same code runs on a
GPU, compiled); the bytes and KV arithmetic are exact; the KV growth a CPU measures (the cache
tensors' bytes) equals the calculator's; the serving helpers are exercised without vLLM
(a stand-in process for ``vllm serve``, a synthetic startup log); transformers' continuous
batching gives the same greedy tokens. No timed assertions.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from utils.kv import kvcache, vllm_kv, vllm_log
from utils.model import quantize
from utils.model.models import build_model
from utils.serving import decode, inference
from utils.units import GIB

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return build_model("llama-tiny").eval()


def _prompt(batch: int, length: int, seed: int = 1):
    return torch.randint(1, 4000, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- decode paths -----------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 3])
def test_fast_and_static_paths_give_eager_generates_tokens(tiny, batch):
    prompt = _prompt(batch, 12)
    paths = decode.decode_paths(tiny, prompt, 10)
    assert set(paths) == set(decode.PATHS) and not any(p.compiled for p in paths.values())  # a CPU compiles nothing
    eager = paths["eager"](10)
    assert eager.shape == (batch, 10)
    for name in ("static_compiled", "fast"):
        assert decode.first_mismatch(eager, paths[name](10)) is None, name
    assert torch.equal(paths["fast"](1), eager[:, :1])  # n = 1 is the prefill's token alone
    assert all(p.warmup_s > 0 for p in paths.values())


def test_fast_decoder_reuses_its_weights_across_batch_sizes(tiny):
    d = decode.FastDecoder(tiny, batch=1, max_seq_len=64, suppress_token_ids=decode.eos_ids(tiny))
    fused = d.layers[0].wqkv
    for b in (2, 1, 4):
        prompt = _prompt(b, 9, seed=b)
        assert decode.first_mismatch(decode.hf_generate(tiny, prompt, 7), d.generate(prompt, 7)) is None
        assert d.batch == b and d.layers[0].k_cache.shape == (b, 2, 64, 32)
    assert d.layers[0].wqkv is fused
    assert d.embed.data_ptr() == tiny.model.embed_tokens.weight.data_ptr()  # shared, not copied
    assert d.cache_bytes() == 2 * 2 * 4 * 2 * 64 * 32 * 4  # layers x (K, V) x batch x heads x len x dim x fp32


def test_fast_decoder_matches_a_model_with_qkv_biases():
    torch.manual_seed(0)
    qwen = build_model("qwen-tiny").eval()
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    prompt = _prompt(2, 10)
    fast = decode.fast_path(qwen, prompt, 6)
    assert fast.decoder.layers[0].bqkv is not None
    assert decode.first_mismatch(decode.hf_generate(qwen, prompt, 6), fast(6)) is None


def test_fast_decoder_refuses_what_it_cannot_do(tiny):
    with pytest.raises(ValueError, match="supports llama"):
        decode.FastDecoder(build_model("gpt2-tiny"))
    d = decode.FastDecoder(tiny, max_seq_len=16)
    with pytest.raises(ValueError, match="exceed the cache's 16 positions"):
        d.generate(_prompt(1, 10), 7)
    with pytest.raises(ValueError, match="positive number of tokens"):
        d.generate(_prompt(1, 4), 0)
    with pytest.raises(ValueError, match="batch must be"):
        d.setup_caches(0)
    with pytest.raises(ValueError, match="at least 2"):
        decode.decode_paths(tiny, _prompt(1, 4), 1)
    with pytest.raises(ValueError, match="different shapes"):
        decode.first_mismatch(torch.zeros(1, 3), torch.zeros(1, 4))
    assert decode.first_mismatch(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2, 4]])) == 2


def test_fast_decoder_options_are_checked_and_named(tiny):
    for bad in ({"compile_mode": "default"}, {"decode_attention": "flash"}, {"decode_attention": None}):
        with pytest.raises(ValueError, match="compile_mode must be|decode_attention must be"):
            decode.FastDecoder(tiny, max_seq_len=16, **bad)
    d = decode.FastDecoder(tiny, max_seq_len=16, compile_mode="max-autotune")
    assert (d.compile_mode, d.decode_attention, d.compiled) == ("max-autotune", "matmul", False)
    assert all(layer.decode_attention == "matmul" for layer in d.layers)
    with pytest.raises(ValueError, match="not both"):
        decode.fast_path(tiny, _prompt(1, 4), 4, decoder=d, compile_mode="reduce-overhead")
    path = decode.fast_path(tiny, _prompt(1, 4), 4, compile_mode="max-autotune")
    assert path.decoder.compile_mode == "max-autotune" and "not compiled" in path.note  # a CPU compiles nothing


@pytest.mark.parametrize("how", ["reduce", "sdpa"])
@pytest.mark.parametrize("batch", [1, 3])
def test_each_decode_attention_gives_generates_tokens(tiny, how, batch):
    prompt = _prompt(batch, 11, seed=batch)
    fast = decode.fast_path(tiny, prompt, 12, decode_attention=how)
    assert fast.decoder.layers[0].decode_attention == how
    assert decode.first_mismatch(decode.hf_generate(tiny, prompt, 12), fast(12)) is None


def test_cache_argument_name_follows_the_installed_transformers(tiny):
    import inspect

    assert decode.cache_kwarg(tiny) in inspect.signature(tiny.forward).parameters


# -- bytes and measurements -----------------------------------------------------------------------

def test_bytes_read_per_step_and_context():
    llama = build_model("llama-1.1b", dtype="bf16", device="meta")
    emb = 32000 * 2048 * 2
    assert inference.weight_bytes(llama) == 2_200_096_768
    assert inference.weight_bytes_read_per_step(llama) == 2_200_096_768 - emb  # the table: only b rows are read
    gpt2 = build_model("gpt2-tiny", device="meta")
    assert inference.weight_bytes_read_per_step(gpt2) == inference.weight_bytes(gpt2)  # tied: the head reads it whole
    assert inference.decode_bytes_per_step(1e9, 22528, 4, 160.0) == 1e9 + 4 * 160 * 22528
    assert inference.mean_context_len(128, 64) == 160.0
    assert kvcache.bytes_per_token(inference.kv_spec(build_model("llama-1.1b", dtype="bf16", device="meta"))) == 22528


def test_estimate_tpot_ms_fixed_part_plus_bytes_at_the_other_bandwidth():
    """Phase 5's two-term model: the same card gives the measurement back, a card twice as fast
    halves only the memory part, a measurement shorter than the bytes allow has no fixed part."""
    assert inference.estimate_tpot_ms(10.0, 4.8e9, 4800.0, 4800.0) == pytest.approx(10.0)
    assert inference.estimate_tpot_ms(3.0, 4.8e9, 4800.0, 9600.0) == pytest.approx(2.0 + 0.5)
    assert inference.estimate_tpot_ms(0.5, 4.8e9, 4800.0, 2400.0) == pytest.approx(2.0)


def test_measure_decode_and_copy_report_consistent_numbers(tiny):
    path = decode.eager_path(tiny, _prompt(1, 8))
    d = inference.measure_decode(path, 5, max_runs=3, budget_s=0.5)
    assert d["tpot_ms"] == (d["tn"].median_ms - d["t1"].median_ms) / 4
    assert d["tokens_per_s"] == pytest.approx(1e3 / d["tpot_ms"]) and d["batch"] == 1
    c = inference.measure_copy_bandwidth(1 << 16, "cpu", max_runs=5, budget_s=0.5)
    assert c["bytes"] == 8 * (1 << 16) and c["gbs"] == pytest.approx(c["bytes"] / (c["time"].median_ms * 1e-3) / 1e9)
    pre = inference.measure_prefill(tiny, _prompt(1, 32), (8, 32), max_runs=3, budget_s=0.5)
    assert set(pre) == {8, 32} and all(t.median_ms > 0 for t in pre.values())
    with pytest.raises(ValueError, match="fewer than the longest"):
        inference.measure_prefill(tiny, _prompt(1, 8), (16,))


def test_kv_growth_on_a_cpu_equals_the_calculator(tiny):
    g = inference.measure_kv_growth(tiny, _prompt(3, 10), 6)
    per_token = kvcache.bytes_per_token(inference.kv_spec(tiny))
    assert per_token == 2 * 2 * 2 * 32 * 4  # K and V x 2 layers x 2 KV heads x 32 x fp32
    assert g["bytes_per_step"] == 3 * per_token and g["tokens"] == list(range(11, 17))
    assert g["cache_bytes_final"] == 3 * 16 * per_token and g["source"].startswith("cache tensor bytes")


def test_batching_sweep_plumbing(tiny):
    prompt = _prompt(4, 8)
    rows = inference.batching_sweep(tiny, prompt, (1, 4), 4, max_runs=3, budget_s=0.3)
    assert [r["batch"] for r in rows] == [1, 4] and all(r["tokens_per_s"] > 0 for r in rows)
    assert all(r["skipped"] == "time budget spent" for r in inference.batching_sweep(tiny, prompt, (1, 2), 4, deadline=0.0))
    with pytest.raises(ValueError, match="fewer than the largest batch"):
        inference.batching_sweep(tiny, prompt, (8,), 4)


def test_continuous_batching_gives_greedy_tokens(tiny):
    reqs = [_prompt(1, n, seed=n)[0].tolist() for n in (5, 19, 11)]
    cb = inference.continuous_batching(tiny, reqs, 6)
    assert cb["requests"] == 3 and cb["tokens"] == 18 and cb["tokens_per_s"] > 0 and cb["ttft_ms_max"] >= cb["ttft_ms_p50"]
    assert tiny.config._attn_implementation == "sdpa"  # the model is left as it was
    from transformers import ContinuousBatchingConfig, GenerationConfig

    out = tiny.generate_batch([reqs[1]], generation_config=GenerationConfig(max_new_tokens=6, do_sample=False,
                                                                              eos_token_id=-1, pad_token_id=0),
                              continuous_batching_config=ContinuousBatchingConfig(num_blocks=4, max_batch_tokens=64),
                              warmup=False)
    eager = decode.hf_generate(tiny, torch.tensor([reqs[1]]), 6)[0].tolist()
    assert list(next(iter(out.values())).generated_tokens) == eager


# -- a served engine's allocation beside the calculator (a stand-in server; tests/integration/test_vllm.py has the real one) --

def _reference_calculator():
    import json as _json
    import math

    from tests.nbcells import cell, src

    nb = _json.loads((ROOT / "grader/source/03_inference_serving/03_inference_serving.ipynb").read_text())
    ns = {"math": math}
    exec(compile(src(cell(nb, "kv_calculator_answer")).split("\nEXAMPLES")[0], "calc", "exec"), ns)  # noqa: S102
    return ns["kv_cache_calculator"]


def _served(tmp_path, facts, kv_dtype=None):
    import types

    from utils.serving.engines import EngineFacts, EngineOptions

    (tmp_path / "config.json").write_text((ROOT / "utils" / "configs" / "llama-tiny.json").read_text())
    return types.SimpleNamespace(facts=EngineFacts(**facts), model_dir=tmp_path, marker={"dtype": "bf16"},
                                 options=EngineOptions(kv_cache_dtype=kv_dtype))


# vLLM 0.32's CPU build on llama-tiny, 1 GiB, max_model_len 500 (tests/data/vllm_logs/vllm_cpu_0320_*)
CPU_FACTS = dict(engine="vllm", version="0.32.0", device="cpu", kv_cache_gib=1.0, kv_cache_bytes=2**30,
                 kv_cache_tokens=2_048_000,
                 max_concurrency=4096.0, max_model_len=500, block_size=128, num_blocks=16384, kv_cache_dtype=None,
                 source="log and /metrics")


def test_served_kv_check_against_the_reference_calculator(tmp_path):
    calc = _reference_calculator()
    ok = inference.served_kv_check(_served(tmp_path, CPU_FACTS), calc)
    assert ok["compared"] and ok["agrees"] and ok["calculator_kv_tokens"] == 2_048_000
    old = inference.served_kv_check(_served(tmp_path, {**CPU_FACTS, "version": "0.15.1", "kv_cache_tokens": 2_097_152}), calc)
    assert old["agrees"] and old["calculator_kv_tokens"] == 16384 * 128  # blocks x block size before 0.20.1
    fp8 = inference.served_kv_check(_served(tmp_path, {**CPU_FACTS, "kv_cache_tokens": 4_096_000, "num_blocks": 32768,
                                                       "max_concurrency": 8192.0}, "fp8"), calc)
    assert fp8["agrees"]
    wrong = inference.served_kv_check(_served(tmp_path, {**CPU_FACTS, "num_blocks": 16000}), calc)
    assert wrong["compared"] and not wrong["agrees"]
    # a GPU's profiled memory, known only as printed (%.2f GiB): the engine's numbers in the calculator's range
    gpu = {**CPU_FACTS, "device": "cuda", "kv_cache_gib": 61.53, "kv_cache_bytes": None, "block_size": 16,
           "max_model_len": 2048}
    plan = vllm_kv.vllm_plan(kvcache.from_hf_config(ROOT / "utils/configs/llama-tiny.json"), 2048,
                             int(61.5312 * GIB), block_size=16, token_formula="concurrency")
    ranged = inference.served_kv_check(_served(tmp_path, {**gpu, "num_blocks": plan.num_blocks,
                                                          "kv_cache_tokens": plan.kv_tokens,
                                                          "max_concurrency": plan.max_concurrency}), calc)
    assert ranged["compared"] and not ranged["exact"] and ranged["agrees"]
    lo, hi = ranged["calculator_num_blocks_range"]
    assert lo < plan.num_blocks < hi
    off = inference.served_kv_check(_served(tmp_path, {**gpu, "num_blocks": hi + 1, "kv_cache_tokens": None}), calc)
    assert not off["agrees"]
    none = inference.served_kv_check(_served(tmp_path, {**CPU_FACTS, "kv_cache_gib": None, "source": "log"}), calc)
    assert none == {**{k: v for k, v in none.items() if k not in ("compared", "why")}, "compared": False,
                    "why": "the engine did not report its cache (log)"}


# -- quantization ---------------------------------------------------------------------------------

def test_quantize_on_a_cpu_measures_the_reference_and_says_why_not_more():
    assert quantize.reference_mode("cpu") == "fp32"
    with pytest.raises(RuntimeError, match="nf4 needs bitsandbytes on a CUDA GPU"):
        quantize.load("llama-tiny", "nf4", "cpu")
    with pytest.raises(ValueError, match="unknown mode"):
        quantize.load("llama-tiny", "int3", "cpu")
    ids = quantize.held_out_ids()
    assert 1000 < ids.numel() and int(ids.max()) < 4096
    q = quantize.compare("llama-tiny", prompt_len=8, new_tokens=3, ppl_seq_len=32, ppl_blocks=2, device="cpu",
                         max_runs=3, budget_s=0.3)
    assert q["reference"] == "fp32" and list(q["modes"]) == ["fp32"] and "GPU" in q["skipped"]
    m = q["modes"]["fp32"]
    model = quantize.load("llama-tiny", "fp32", "cpu")
    assert m["weight_bytes"] == sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
    assert m["perplexity"] == pytest.approx(quantize.perplexity(model, ids[8:], 32, 2), rel=1e-6)
    assert 1000 < m["perplexity"] < 20000  # random weights: about the vocabulary size (4096), not language
    with pytest.raises(ValueError, match="hold no block"):
        quantize.perplexity(model, ids[:10], 32, 2)


# -- the GPU benchmark script, in smoke mode ----------------------------------------------------------

@pytest.mark.slow
def test_benchmark_script_smoke(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import phase3_inference
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "p3.json"
    assert phase3_inference.main(["--smoke", "--out", str(out), "--budget-s", "15"]) == 0
    res = json.loads(out.read_text())
    paths = res["sections"]["decode"]["paths"]
    assert set(paths) == set(decode.PATHS) and all(p["first_mismatch_vs_eager"] is None for p in paths.values())
    assert res["sections"]["kv_growth"]["within_2pct"] and res["sections"]["copy"]["gbs"] > 0
    assert "skipped" in res["sections"]["quantization"]  # the budget ran out: later sections say so


def test_decode_tuning_script_refuses_without_a_gpu_and_profiles_a_path(tiny, tmp_path, capsys, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import decode_tuning
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert set(decode_tuning.VARIANTS) >= {"default", "cd_matmul", "matmul"}
    assert all(set(kw) <= {"decode_attention", "compile_mode"} for _, kw in decode_tuning.VARIANTS.values())
    with pytest.raises(SystemExit):
        decode_tuning.main([str(tmp_path / "x.json"), "--variants", "cd_flash"])
    assert "unknown variant(s) cd_flash" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decode_tuning.main([str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    prof = decode_tuning.kernel_profile(decode.fast_path(tiny, _prompt(1, 6), 5), 5, steps=2)
    assert prof["kernels_per_token"] == 0 and prof["wall_ms_per_generation"] > 0  # a CPU runs no kernels
    assert prof["top_kernels"] and all(k["calls_per_token"] > 0 for k in prof["top_kernels"])  # its ops instead


# -- on a GPU (python -m pytest -m gpu) ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_fast_path_on_cuda_matches_eager_and_uses_cuda_graphs():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = build_model("llama-tiny", device="cuda").eval()
    prompt = _prompt(2, 12).cuda()
    fast = decode.warm(decode.fast_path(model, prompt, 16), 16)
    assert fast.compiled
    assert decode.first_mismatch(decode.hf_generate(model, prompt, 16), fast(16)) is None  # fp32: no near-ties
    assert counters["inductor"]["cudagraph_skips"] == 0
    for how in ("reduce", "sdpa"):  # fast's is matmul
        mine = decode.warm(decode.fast_path(model, prompt, 16, decode_attention=how), 16)
        assert decode.first_mismatch(fast(16), mine(16)) is None, how
    assert counters["inductor"]["cudagraph_skips"] == 0
    g = inference.measure_kv_growth(model, prompt, 8)
    assert g["source"] == "torch.cuda.memory_allocated"
    assert g["bytes_per_step"] == 2 * kvcache.bytes_per_token(inference.kv_spec(model))


def test_served_kv_check_on_a_real_h200_log(tmp_path):
    """vLLM 0.26.0 on an H200 (benchmarks/results/vllm-gpu-h200/): the profiled memory is only
    logged as %.2f GiB, so the calculator gives a range and vLLM's blocks and tokens fall in it."""
    from utils.serving.engines import EngineFacts, EngineOptions

    res = ROOT / "benchmarks" / "results" / "vllm-gpu-h200"
    log = vllm_log.parse_vllm_log((res / "vllm-llama-1.1b.log").read_text())
    row = json.loads((res / "vllm_kv_check.json").read_text())["rows"][0]
    assert log.min_available_kv_gib == 67.18 and log.kv_tokens == 3_183_349 and log.concurrency_text == ("1563.53",)
    (tmp_path / "config.json").write_text((ROOT / "utils" / "configs" / "llama-1.1b.json").read_text())
    import types

    server = types.SimpleNamespace(facts=EngineFacts(**row["facts"]), model_dir=tmp_path, marker={"dtype": "bf16"},
                                   options=EngineOptions())
    kv = inference.served_kv_check(server, _reference_calculator())
    assert kv["compared"] and not kv["exact"] and kv["agrees"], kv
