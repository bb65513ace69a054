"""benchmarks/post_train_trl.py: TRL SFT, DPO and GRPO in two real processes over gloo, the data, the reward,
bad input."""
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
    (`--cpu --num_processes 2` would start only one process): SFT, DPO and GRPO in one run."""
    out = tmp_path_factory.mktemp("trl") / "trl.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "GPULAB_SMOKE": "1"}
    cmd = [*LAUNCH, "--config_file", str(ROOT / "benchmarks" / "accelerate" / "ddp.yaml"), "--num_processes", "2",
           "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
           str(SCRIPT), "--out", str(out), "--smoke"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
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
        assert s["seconds_per_step"] == pytest.approx(s["seconds_measured"] / steps)
        assert s["tokens_per_s_per_device"] == pytest.approx(s["tokens_per_s"] / 2)
        # TRL counts real tokens (attention mask): at most batch x max_length per rank per step,
        # twice that for DPO (chosen and rejected)
        per_step = 2 * r["config"]["batch_per_device"] * r["config"]["max_length"] * (2 if stage == "dpo" else 1)
        assert 0 < s["tokens_measured"] <= steps * per_step
        assert s["peak_mem_gib"] is None and s["peak_mem_gib_per_rank"] == [None, None]  # CPU: no CUDA counter
    assert 0.0 <= r["dpo"]["rewards_accuracy"] <= 1.0
    assert "rewards_accuracy" not in r["sft"] and "generation_share" not in r["dpo"]
    # a fresh policy equals its reference, so the first DPO loss is log 2; a few steps at lr 1e-6 barely move it
    assert r["dpo"]["train_loss"] == pytest.approx(math.log(2), abs=0.05)


def test_grpo_on_two_ranks(two_ranks):
    r, _ = two_ranks
    c, g = r["config"], r["grpo"]
    steps, warmup, batch = c["steps"], c["warmup"], c["batch_per_device"]
    assert c["grpo"] is True and c["num_generations"] == 2 and c["reward"] == "overlap_reward"
    assert 0 < c["completion_length"] < c["max_length"] and c["examples_grpo"] == c["examples_sft"]
    assert g["world_size"] == 2 and g["steps"] == steps and g["warmup_steps"] == warmup
    # on-policy with one pass per generation, the ratio is 1 and the loss is minus the token-weighted mean of
    # group-normalised advantages (at most 1/sqrt(2) in size for groups of 2): near 0, never large
    assert math.isfinite(g["train_loss"]) and abs(g["train_loss"]) < 1.0
    assert g["seconds_per_step"] == pytest.approx(g["seconds_measured"] / steps) and g["seconds_measured"] > 0
    assert g["tokens_per_s"] == pytest.approx(g["tokens_measured"] / g["seconds_measured"])
    assert g["tokens_per_s_per_device"] == pytest.approx(g["tokens_per_s"] / 2)
    # TRL counts each sampled sequence's prompt and completion tokens, over both ranks; the completion length
    # leaves room for the longest prompt, so a sequence holds at most max_length tokens
    assert 0 < g["tokens_measured"] <= steps * 2 * batch * c["max_length"]
    assert 0 < g["completion_mean_length"] <= c["completion_length"]
    assert 0.0 <= g["reward_mean"] <= 1.0
    # one generation batch per step, all of it inside the measured window
    assert g["generation_calls"] == steps
    assert 0.0 < g["generation_share"] < 1.0
    assert g["generation_share"] == pytest.approx(g["generation_s"] / g["seconds_measured"])
    assert g["generation_s_per_step"] == pytest.approx(g["generation_s"] / steps)
    assert g["generation_s_per_step"] + g["other_s_per_step"] == pytest.approx(g["seconds_per_step"])
    assert len(g["generation_share_per_rank"]) == 2 and all(0 < x < 1 for x in g["generation_share_per_rank"])
    assert g["generation_share_per_rank"][0] == g["generation_share"]
    # rank 0 samples batch_per_device sequences per call, at most completion_length new positions each
    assert 0 < g["generated_tokens"] <= steps * batch * c["completion_length"] and g["generated_tokens"] % batch == 0
    assert g["generated_tokens_per_s_per_device"] == pytest.approx(g["generated_tokens"] / g["generation_s"])
    assert g["trl_step_time_s"] > 0
    assert g["peak_mem_gib"] is None and g["peak_mem_gib_per_rank"] == [None, None]  # CPU: no CUDA counter
    assert "rewards_accuracy" not in g


def test_quiet_stderr(two_ranks):
    """nbgrader scores a cell with any stderr output 0: no warnings, progress bars or logs."""
    _, p = two_ranks
    assert p.stderr.strip() == ""
    assert len(p.stdout.strip().splitlines()) == 1
    line = json.loads(p.stdout)
    assert line["world_size"] == 2 and set(line) >= {"sft", "dpo", "grpo"}
    assert 0 < line["grpo"]["generation_share"] < 1


def test_prompt_tokens_are_a_prefix():
    """Cuts fall on word starts, so TRL's prompt tokens are a prefix of prompt+completion's."""
    from utils.model.models import encode, shipped_tokenizer

    tok = shipped_tokenizer()
    sft, dpo, grpo = ptt.make_datasets(tok, 64, 10)
    assert len(sft) == len(dpo) == len(grpo) == 64  # at least 64 kept
    for row in sft.select(range(20)):
        p, pc = encode(tok, row["prompt"]), encode(tok, row["prompt"] + row["completion"])
        assert pc[:len(p)] == p and row["completion"].startswith(" ")
    row = dpo[0]
    assert row["chosen"] == sft[0]["completion"] and row["rejected"] != row["chosen"]
    assert grpo.column_names == ["prompt", "reference"]  # TRL keeps a "completion" column from reward functions
    assert grpo[0] == {"prompt": sft[0]["prompt"], "reference": sft[0]["completion"]}
    # GRPO's completion length leaves room for the longest prompt, tokenised as TRL does
    prompts = list(grpo["prompt"])
    n = ptt._completion_length(tok, prompts, 64)
    assert 0 < n < 64 and max(len(tok(text=p)["input_ids"]) for p in prompts) + n == 64


def test_overlap_reward():
    """GRPO's reward: deterministic, in [0, 1], one per completion, and it tells texts apart."""
    ref = " the boy was sent to the country school"
    got = ptt.overlap_reward(completions=[ref, "", "zzqq", " the boys", "xq the"], reference=[ref] * 5,
                             trainer_state=None)
    assert got[:3] == [1.0, 0.0, 0.0] and 0 < got[4] < got[3] <= 1.0
    assert ptt.overlap_reward([" the boys"], [ref]) == ptt.overlap_reward([" THE BOYS"], [ref])  # case-blind
    with pytest.raises(ValueError):  # one reference per completion
        ptt.overlap_reward(["a", "b"], [ref])


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
    (["--num-generations", "1"], "--num-generations must be >= 2"),
    (["--num-generations", "3", "--batch-per-device", "2"], "--num-generations 3 must divide the completions per step"),
    (["--batch-per-device", "1"], "GRPO needs an even number of completions per step"),
])
def test_bad_input(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process
    out = ["--out", str(tmp_path / "x.json")] if argv else []
    _one_line_error(capsys, ptt.main([*out, *argv]), needle)


def test_group_size(tmp_path, monkeypatch):
    """GRPO's default group size shrinks to divide the completions per step; --no-grpo skips the check."""
    out = ["--out", str(tmp_path / "x.json"), "--smoke"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ptt.resolve(ptt.parse_args([*out, "--batch-per-device", "3"])).num_generations == 2
    assert ptt.resolve(ptt.parse_args([*out, "--batch-per-device", "3", "--num-generations", "6"])).num_generations == 6
    args = ptt.resolve(ptt.parse_args([*out, "--batch-per-device", "1", "--no-grpo", "--num-generations", "5"]))
    assert args.grpo is False


def test_missing_out_folder(capsys, tmp_path):
    _one_line_error(capsys, ptt.main(["--out", str(tmp_path / "no" / "x.json")]), "does not exist")


def test_trl_not_installed(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError(name="trl")
    _one_line_error(capsys, ptt.main(["--out", str(tmp_path / "x.json"), "--smoke"]), "pip install trl")
