"""benchmarks/post_train_trl.py: TRL SFT then DPO in two real processes over gloo, the data, bad input."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import ACCELERATE_LAUNCH, free_port, load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "post_train_trl.py"
LAUNCH = ACCELERATE_LAUNCH


ptt = load_script(SCRIPT)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One real `accelerate launch` of the DDP config with 2 CPU processes in smoke mode
    (`--cpu --num_processes 2` would start only one process)."""
    out = tmp_path_factory.mktemp("trl") / "trl.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "GPULAB_SMOKE": "1"}
    cmd = [*LAUNCH, "--config_file", str(ROOT / "benchmarks" / "accelerate" / "ddp.yaml"), "--num_processes", "2",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
           str(SCRIPT), "--out", str(out), "--smoke"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text()), p


def test_sft_then_dpo_on_two_ranks(two_ranks):
    r, _ = two_ranks
    assert r["world_size"] == 2 and r["distributed_type"] == "MULTI_CPU" and r["device"].startswith("cpu")
    assert r["config"]["preset"] == "gpt2-tiny" and r["config"]["weights"] == "random"
    steps, warmup = r["config"]["steps"], r["config"]["warmup"]
    for stage in ("sft", "dpo"):
        s = r[stage]
        assert s["world_size"] == 2 and s["steps"] == steps and s["warmup_steps"] == warmup
        assert math.isfinite(s["train_loss"]) and s["train_loss"] > 0
        assert s["tokens_per_s"] > 0 and s["seconds_measured"] > 0
        assert s["tokens_per_s"] == pytest.approx(s["tokens_measured"] / s["seconds_measured"])
        assert s["tokens_per_s_per_device"] == pytest.approx(s["tokens_per_s"] / 2)
        # TRL counts real tokens (attention mask): at most batch x max_length per rank per step,
        # twice that for DPO (chosen and rejected)
        per_step = 2 * r["config"]["batch_per_device"] * r["config"]["max_length"] * (2 if stage == "dpo" else 1)
        assert 0 < s["tokens_measured"] <= steps * per_step
        assert s["peak_mem_gib"] is None and s["peak_mem_gib_per_rank"] == [None, None]  # CPU: no CUDA counter
    assert 0.0 <= r["dpo"]["rewards_accuracy"] <= 1.0
    assert "rewards_accuracy" not in r["sft"]
    # a fresh policy equals its reference, so the first DPO loss is log 2; a few steps at lr 1e-6 barely move it
    assert r["dpo"]["train_loss"] == pytest.approx(math.log(2), abs=0.05)


def test_quiet_stderr(two_ranks):
    """nbgrader scores a cell with any stderr output 0: no warnings, progress bars or logs."""
    _, p = two_ranks
    assert p.stderr.strip() == ""
    assert len(p.stdout.strip().splitlines()) == 1 and json.loads(p.stdout)["world_size"] == 2


def test_prompt_tokens_are_a_prefix():
    """Cuts fall on word starts, so TRL's prompt tokens are a prefix of prompt+completion's."""
    from utils.models import encode, shipped_tokenizer

    tok = shipped_tokenizer()
    sft, dpo = ptt.make_datasets(tok, 64, 10)
    assert len(sft) == len(dpo) == 64  # at least 64 kept
    for row in sft.select(range(20)):
        p, pc = encode(tok, row["prompt"]), encode(tok, row["prompt"] + row["completion"])
        assert pc[:len(p)] == p and row["completion"].startswith(" ")
    row = dpo[0]
    assert row["chosen"] == sft[0]["completion"] and row["rejected"] != row["chosen"]


def _one_line_error(capsys, rc: int, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("post_train_trl.py: error:") and needle in err, err


@pytest.mark.parametrize("argv, needle", [
    ([], "--out FILE.json is required"),
    (["--preset", "gpt9"], "unknown preset 'gpt9'"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--max-length", "4096", "--preset", "gpt2-small"], "exceeds gpt2-small's 1024 positions"),
])
def test_bad_input(capsys, tmp_path, argv, needle):
    out = ["--out", str(tmp_path / "x.json")] if argv else []
    _one_line_error(capsys, ptt.main([*out, *argv]), needle)


def test_missing_out_folder(capsys, tmp_path):
    _one_line_error(capsys, ptt.main(["--out", str(tmp_path / "no" / "x.json")]), "does not exist")


def test_trl_not_installed(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError(name="trl")
    _one_line_error(capsys, ptt.main(["--out", str(tmp_path / "x.json"), "--smoke"]), "pip install trl")
