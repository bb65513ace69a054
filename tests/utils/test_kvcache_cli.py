"""utils.kvcache_cli: ``python -m utils.kvcache``, the KV-cache calculator on the command line
(numbers or a config in, a table or JSON out, one-line errors with exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils.test_kvcache import LLAMA3_CFG
from utils import kvcache_cli
from utils.units import GIB

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv):
    code = kvcache_cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_from_numbers(capsys):
    code, out, _ = run_cli(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "8192",
                           "--kv-memory-gib", "10", "--batch", "4", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["bytes_per_token"], data["num_blocks"], data["kv_tokens"], data["max_concurrency"]) == (131072, 5120, 81920, 10.0)
    assert data["batch_kv_bytes_needed"] == 4 * GIB and data["fits"] is True


def test_cli_config_fp8_and_batch_that_does_not_fit(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3_CFG))
    code, out, _ = run_cli(capsys, "--config", str(cfg), "--kv-dtype", "fp8", "--kv-memory-gib", "1", "--batch", "3", "--json")
    data = json.loads(out)
    assert code == 0 and data["bytes_per_token"] == 65536 and data["max_model_len"] == 8192
    assert data["num_blocks"] == 1024 and data["fits"] is False  # 3 x 512 blocks > 1024


def test_cli_hybrid_switch_and_tensor_parallel(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 4, "num_attention_heads": 64,
                               "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880, "sliding_window": 128,
                               "layer_types": ["sliding_attention", "full_attention"] * 2, "max_position_embeddings": 4096}))
    base = ["--config", str(cfg), "--kv-memory-gib", "1", "--json"]
    hybrid = json.loads(run_cli(capsys, *base)[1])
    unified = json.loads(run_cli(capsys, *base, "--disable-hybrid-kv-cache-manager")[1])
    assert (hybrid["num_groups"], hybrid["group_size"], unified["num_groups"], unified["group_size"]) == (2, 2, 1, 4)
    # 4096 tokens: full cdiv(4096, 16) = 256 blocks, sliding cdiv(127 + 8192 -> 4096, 16) + 1 = 257
    assert hybrid["blocks_per_request"] == 256 + 257 and unified["blocks_per_request"] == 256
    tp = json.loads(run_cli(capsys, *base, "--tensor-parallel-size", "4")[1])
    assert tp["bytes_per_token_per_gpu"] * 4 == tp["bytes_per_token"] == 4 * 2 * 8 * 64 * 2


def test_cli_table_labels_the_estimate(capsys):
    code, out, _ = run_cli(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "8192",
                           "--gpu-memory-gib", "80", "--weights-gib", "15")
    assert code == 0 and "ESTIMATE" in out and "upper bound" in out and "131,072" in out
    code, out, _ = run_cli(capsys, "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--max-model-len", "8192",
                           "--gpu-memory-gib", "80", "--weights-gib", "15", "--activation-gib", "4", "--json")
    data = json.loads(out)
    assert data["available_kv_bytes"] == int(80 * GIB * 0.9 - 19 * GIB) and "ESTIMATE" in data["available_kv_source"]


@pytest.mark.parametrize("argv, message", [
    (["--config", "MISSING"], "not found"),
    (["--config", "BAD"], "not valid JSON"),
    (["--config", "EMPTY"], "num_hidden_layers"),
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
    (["--config", "STRING_FIELD"], "whole number"),
    (["--config", "EMPTY", "--layers", "32"], "not both"),
])
def test_cli_errors_are_one_line_exit_2(capsys, tmp_path, argv, message):
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "string.json").write_text(json.dumps(dict(LLAMA3_CFG, num_hidden_layers="thirty-two")))
    files = {"MISSING": str(tmp_path / "missing.json"), "BAD": str(tmp_path / "bad.json"),
             "EMPTY": str(tmp_path / "empty.json"), "STRING_FIELD": str(tmp_path / "string.json")}
    argv = [files.get(a, a) for a in argv]
    with pytest.raises(SystemExit) as exc:
        kvcache_cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "error:" in err and message in err and "Traceback" not in err


def test_cli_runs_as_module():
    r = subprocess.run([sys.executable, "-m", "utils.kvcache", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                        "--max-model-len", "8192", "--kv-memory-gib", "10", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kv_tokens"] == 81920
    r = subprocess.run([sys.executable, "-m", "utils.kvcache", "--config", "/nonexistent/config.json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not found" in r.stderr
