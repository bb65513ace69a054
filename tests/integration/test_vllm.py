"""vLLM for real: its CPU build started by ``utils.serve.start`` on the course's tiny models.

What is checked against what vLLM itself reports:

* **the KV-cache calculator** (``utils.kvcache`` and lab 03's reference solution) against the
  blocks vLLM allocated (``vllm:cache_config_info`` on ``/metrics``) and the tokens and
  concurrency it logged, exactly, for GQA, MHA, another head dim, a ``max_model_len`` that is
  not a multiple of the block size, a non-default block size, more KV memory and an fp8 cache;
* **the load generator** against vLLM's server-side histograms on ``/metrics``;
* **the starter's errors**: a server that dies at start-up reports vLLM's own error in one
  line; a port in use; a directory without a config.

The shared compiled server comes from ``tests/conftest.py``. The other shapes only need the
allocation, which does not depend on compilation, so they start with ``enforce_eager=True``
and ``warm_up=False`` (about 35 s each instead of 50 to 110 s); they send no request, since
vLLM 0.32's CPU worker dies at the first request in eager mode (seen on this project's CI
machine). About 5 minutes on two cores.
"""
from __future__ import annotations

import json
import math
import re
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import VLLM_MAX_MODEL_LEN
from tests.nbcells import cell, src
from utils import engines, kvcache, loadgen, serve, vllm_kv, vllm_log
from utils.units import GIB

pytestmark = pytest.mark.slow
LAB03 = "grader/source/03_inference_serving/03_inference_serving.ipynb"


@pytest.fixture(scope="module")
def lab03_calculator():
    """Lab 03's reference ``kv_cache_calculator``, from the source notebook's solution cell."""
    nb = json.loads(open(LAB03).read())
    ns: dict = {"math": math}
    exec(compile(src(cell(nb, "kv_calculator_answer")).split("\nEXAMPLES")[0], "calc", "exec"), ns)  # noqa: S102
    return ns["kv_cache_calculator"]


def _formulas(version: str) -> dict:
    token, conc = vllm_kv.vllm_formulas(version)
    return {"token_formula": token, "concurrency_formula": conc}


def _check_allocation(server: serve.Server, calc, dtype: str = "bf16") -> None:
    """The calculator and lab 03's reference against what this server allocated and logged."""
    f = server.facts
    spec = kvcache.from_hf_config(server.model_dir / "config.json",
                                  kv_dtype="fp8" if server.options.kv_cache_dtype else None)
    log = vllm_log.parse_vllm_log(server.log_text())
    assert f.block_size and f.num_blocks and f.kv_cache_gib, f
    plan = vllm_kv.vllm_plan(spec, f.max_model_len, round(f.kv_cache_gib * GIB), block_size=f.block_size,
                             **_formulas(f.version))
    assert plan.num_blocks == f.num_blocks
    assert plan.kv_tokens == f.kv_cache_tokens == log.kv_tokens
    assert f"{plan.max_concurrency:.2f}" == log.concurrency_text[0]
    kv_dtype = "fp8" if server.options.kv_cache_dtype else dtype
    mine = calc(spec.num_layers, spec.num_kv_heads, spec.head_dim, kv_dtype, 1, f.max_model_len, f.kv_cache_gib,
                block_size=f.block_size)
    assert mine["num_blocks"] == f.num_blocks
    assert f"{mine['max_concurrency']:.2f}" == log.concurrency_text[0]
    assert int(mine["max_concurrency"] * f.max_model_len) == f.kv_cache_tokens  # vLLM 0.2x-0.3x: tokens = C x M


def test_shared_server_allocation_equals_the_calculator(vllm_server, lab03_calculator):
    f = vllm_server.facts
    assert f.engine == "vllm" and f.device == "cpu" and f.source == "log and /metrics"
    assert f.max_model_len == VLLM_MAX_MODEL_LEN and f.max_model_len % f.block_size  # 500 is not a multiple of 128
    assert f.block_size == 128 and f.kv_cache_gib == 1.0  # the CPU build's defaults (vllm/platforms/cpu.py)
    _check_allocation(vllm_server, lab03_calculator)


SHAPES = {
    # name: (how the model directory is made, start options)
    "mha-gpt2": ({"preset": "gpt2-tiny"}, {}),
    "head-dim-64": ({"config": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}}, {}),
    # two settings on one start (each changes the block count the calculator must reproduce)
    "qwen-block-64-kv-2gib": ({"preset": "qwen-tiny"}, {"block_size": 64, "max_model_len": 200, "kv_cache_gib": 2}),
    "fp8-kv": ({"preset": "llama-tiny"}, {"kv_cache_dtype": "fp8"}),
}


def _custom_llama(root, overrides: dict):
    """A Llama checkpoint of the tiny preset's shape with ``overrides``, written as the hub
    would lay it out (no utils.serve marker): the starter reads its config.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from utils.models import preset_config_dict, shipped_tokenizer

    cfg = {**preset_config_dict("llama-tiny"), **overrides, "torch_dtype": "bfloat16"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    out = root / "llama-custom"
    model.save_pretrained(out)
    shipped_tokenizer().save_pretrained(out)
    return out


@pytest.mark.parametrize("name", list(SHAPES))
def test_allocation_of_other_shapes_equals_the_calculator(name, vllm_install, lab03_calculator, tmp_path, monkeypatch):
    how, opts = SHAPES[name]
    if "preset" in how:
        d = serve.build_model_dir(how["preset"], "bf16", root=tmp_path, device="cpu")
    else:
        d = _custom_llama(tmp_path, how["config"])
    opts = {"max_model_len": VLLM_MAX_MODEL_LEN, **opts}
    why = engines.cpu_fp8_kv_cache_absent() if "kv_cache_dtype" in opts else None
    if why:  # this CPU has neither AVX-512 nor AMX: the starter says so at once, as vLLM itself does
        with pytest.raises(serve.ServeError, match="only on x86 with AVX-512 or AMX"):
            serve.start(d, engine="vllm", enforce_eager=True, warm_up=False, log_dir=tmp_path, **opts)
        with monkeypatch.context() as m:  # and vLLM, started past that check, refuses for the same reason
            m.setattr(engines, "cpu_fp8_kv_cache_absent", lambda: None)
            with pytest.raises(serve.ServeError, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
                serve.start(d, engine="vllm", enforce_eager=True, warm_up=False, log_dir=tmp_path, **opts)
        return
    with serve.start(d, engine="vllm", enforce_eager=True, warm_up=False, log_dir=tmp_path, **opts) as s:
        spec = kvcache.from_hf_config(d / "config.json")
        if name == "mha-gpt2":
            assert spec.num_kv_heads == json.loads((d / "config.json").read_text())["n_head"]  # multi-head attention
        if name == "head-dim-64":
            assert spec.head_dim == 64
        _check_allocation(s, lab03_calculator)
        if name == "fp8-kv":
            assert s.facts.kv_cache_dtype == "fp8" and s.facts.num_blocks == 2 * 16384  # twice the bf16 blocks


def _histograms(metrics_text: str) -> dict[str, tuple[float, float]]:
    """``{name: (sum, count)}`` of vLLM's latency histograms."""
    out = {}
    for fam in text_string_to_metric_families(metrics_text):
        if not fam.name.startswith("vllm:"):
            continue
        s = sum(x.value for x in fam.samples if x.name.endswith("_sum"))
        c = sum(x.value for x in fam.samples if x.name.endswith("_count"))
        if c:
            out[fam.name] = (s, c)
    return out


def test_load_generator_agrees_with_vllms_own_histograms(vllm_server):
    """Every request completes, and the client's TTFT, TPOT and E2E agree with vLLM's own
    server-side histograms over the same requests. Means from ``_sum``/``_count`` deltas are
    exact; a histogram's median is only known to within its bucket.

    Why these bounds. vLLM stamps a request's arrival after its API server has parsed and
    tokenized it, and its first and last token when the engine core's step emits them
    (``vllm/v1/metrics/stats.py``, ``iteration_timestamp - arrival_time``). The client's clock
    starts before the request leaves and stops when the chunk arrives, so it adds the front
    end's path (HTTP, tokenizing, the engine's IPC, detokenizing, SSE): it can only add time,
    and TTFT and E2E are at least the server's (1 ms slack for two clocks). That added time is
    about 2 to 3.5 ms on a quiet machine (benchmarks/RESULTS.md) and grows with CPU contention; above
    500 ms the client would be mis-timing, not waiting. TPOT, (E2E - TTFT) / (n - 1) on both
    sides, differs per request by (last chunk's path - first chunk's path) / (n - 1), which is
    at most (added TTFT + added E2E) / (n - 1); so do the means (0.5 ms slack)."""
    before = _histograms(vllm_server.metrics_text())
    n_out = 16
    w = loadgen.Workload(**vllm_server.workload_fields(), num_requests=24, input_len=32, output_len=n_out,
                         concurrency=2, probe=False)
    r = loadgen.run(w, progress=False)
    assert r["completed"] == 24 and r["failed"] == 0, r["failure_examples"]
    assert all(req["output_tokens"] == n_out for req in r["requests"])
    after = _histograms(vllm_server.metrics_text())

    def server_mean_ms(name):
        s0, c0 = before.get(name, (0.0, 0.0))
        s1, c1 = after[name]
        assert c1 - c0 == 24, f"{name}: {c1 - c0} requests counted by vLLM"
        return (s1 - s0) / (c1 - c0) * 1e3

    ttft, e2e = server_mean_ms("vllm:time_to_first_token_seconds"), server_mean_ms("vllm:e2e_request_latency_seconds")
    tpot = server_mean_ms("vllm:request_time_per_output_token_seconds")
    c_ttft, c_e2e, c_tpot = r["ttft_ms"]["mean"], r["e2el_ms"]["mean"], r["tpot_ms"]["mean"]
    seen = f"client TTFT {c_ttft:.2f} / E2E {c_e2e:.2f} / TPOT {c_tpot:.3f} ms; vLLM {ttft:.2f} / {e2e:.2f} / {tpot:.3f} ms"
    added_ttft, added_e2e = c_ttft - ttft, c_e2e - e2e
    assert -1.0 <= added_ttft <= 500.0 and -1.0 <= added_e2e <= 500.0, seen
    assert abs(c_tpot - tpot) <= (max(added_ttft, 0) + max(added_e2e, 0)) / (n_out - 1) + 0.5, seen


def test_resident_memory_holds_the_kv_cache(vllm_server):
    """On a CPU the memory the server really holds is its processes' resident memory: at least
    the 1 GiB KV cache it allocated (its pages are touched at allocation)."""
    rss = vllm_server.resident_gib()
    assert rss is not None and rss >= vllm_server.facts.kv_cache_gib, rss


def test_a_server_that_dies_at_start_up_reports_vllms_own_error(vllm_install, tmp_path):
    d = serve.build_model_dir("llama-tiny", "bf16", root=tmp_path, device="cpu")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in d.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(serve.ServeError) as e:
        serve.start(broken, engine="vllm", log_dir=tmp_path, timeout_s=600)
    msg = str(e.value)
    assert "\n" not in msg and "vLLM exited with status" in msg and "NoSuchModelForCausalLM" in msg, msg


def test_port_in_use_and_missing_config_are_one_line_errors(vllm_install, tmp_path):
    d = serve.build_model_dir("llama-tiny", "bf16", root=tmp_path, device="cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(serve.ServeError, match=r"port \d+ on 127.0.0.1 is already in use"):
            serve.start(d, engine="vllm", port=s.getsockname()[1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(serve.ServeError, match="has no config.json"):
        serve.start(tmp_path / "empty", engine="vllm")
    with pytest.raises(serve.ServeError, match="multiples of 32"):
        serve.start(d, engine="vllm", block_size=16)
    with pytest.raises(serve.ServeError, match=re.escape("no fp8 kernels")):
        serve.start(d, engine="vllm", quantization="fp8")


def test_int8_w8a8_checkpoint_serves_with_vllms_int8_kernel(vllm_model_dir, tmp_path):
    """Quantized against 16-bit on vLLM's CPU build: online fp8 has no CPU kernel (``_C::
    static_scaled_fp8_quant`` is not built there), so the quantized model is an int8 W8A8
    checkpoint written offline (``serve.quantized_model_dir``); vLLM picks its CPU int8 matmul
    for it and serves exact output lengths. Memory and TPOT at the 1.1B shape are a benchmark
    (benchmarks/RESULTS.md), not a test."""
    q = serve.quantized_model_dir(vllm_model_dir, "w8a8")
    marker = serve.read_marker(q)
    assert marker["quantization"]["format"] == "w8a8"
    assert marker["weight_bytes"] < serve.read_marker(vllm_model_dir)["weight_bytes"]
    with serve.start(q, engine="vllm", max_model_len=VLLM_MAX_MODEL_LEN, log_dir=tmp_path) as s:
        assert s.label == "vllm continuous batching, w8a8"
        assert "CompressedTensorsW8A8Int8" in s.log_text()  # vLLM's scheme for int8 weights and activations
        r = loadgen.run(loadgen.Workload(**s.workload_fields(), num_requests=4, input_len=16, output_len=8,
                                         concurrency=2), progress=False)
        assert r["completed"] == 4 and all(req["output_tokens"] == 8 for req in r["requests"])
