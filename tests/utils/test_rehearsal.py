"""utils/device/rehearsal.py: a forced smaller tier on a bigger GPU caps the allocator at that card's
memory, picks its dtype, and caps a serving engine's share; with no tier forced, or on a card no
bigger than the tier's, nothing changes. CUDA is faked: the calls are recorded, not made."""
from __future__ import annotations

import pytest
import torch

from grader import labs
from utils.course import env
from utils.device import rehearsal
from utils.model import model_dir
from utils.serving import engines
from utils.train import training


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA device of ``gpu.gib`` GiB and compute capability ``gpu.cap``."""
    class Gpu:
        gib, cap, fractions = 139.8, (9, 0), []

    monkeypatch.setattr(rehearsal, "_cuda_available", lambda: True)
    monkeypatch.setattr(rehearsal, "_device_gib", lambda i: Gpu.gib)
    monkeypatch.setattr(rehearsal, "_applied", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: Gpu.cap)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: Gpu.fractions.append((f, i)))
    monkeypatch.delenv(env.TIER_VAR, raising=False)
    monkeypatch.delenv(env.SMOKE_VAR, raising=False)
    return Gpu


def test_no_tier_forced_changes_nothing(gpu):
    assert rehearsal.card() is None and rehearsal.apply() is None and gpu.fractions == []
    assert rehearsal.half_dtype() == "bf16" and rehearsal.engine_memory_fraction(0.45) == 0.45
    gpu.cap = (7, 5)  # a real T4
    assert rehearsal.half_dtype() == "fp16"


@pytest.mark.parametrize("tier, name, dtype", [("t4", "T4", "fp16"), ("a100", "L4", "bf16"), ("h100", "H100 80GB", "bf16")])
def test_a_forced_tier_rehearses_its_smallest_card(gpu, monkeypatch, tier, name, dtype):
    monkeypatch.setenv(env.TIER_VAR, tier)
    card = rehearsal.TIER_CARDS[tier]
    assert rehearsal.card().name == name and rehearsal.half_dtype() == dtype
    share = card.memory_gib / gpu.gib
    # an engine's share is of the card: two engines at 0.45 fit on it beside each other, as on the card
    assert rehearsal.engine_memory_fraction(0.45) * gpu.gib == pytest.approx(0.45 * card.memory_gib)
    assert 2 * rehearsal.engine_memory_fraction(0.45) < share
    line = rehearsal.apply()
    assert name in line and dtype in line and gpu.fractions == [(pytest.approx(share), 0)]
    rehearsal.apply()
    assert len(gpu.fractions) == 1  # once per device


def test_the_labs_choose_the_rehearsed_cards_dtype_and_engine_share(gpu, monkeypatch):
    monkeypatch.setenv(env.TIER_VAR, "t4")
    assert model_dir.default_dtype("cuda") == "fp16" and training.best_precision("cuda") == "fp16"
    opts = engines.EngineOptions(host="127.0.0.1", port=8000, device="cuda", gpu_memory_fraction=0.45)
    install = engines.EngineInstall("vllm", "python", "vllm", "0.26.0", "cuda", "test")
    cmd, _ = engines.command(install, "/m", "float16", 2048, opts)
    share = float(cmd[cmd.index("--gpu-memory-utilization") + 1])
    assert share == pytest.approx(0.45 * 15.0 / gpu.gib, rel=1e-3)  # 0.45 of a T4's 15 GiB, as on a T4


def test_a_card_no_bigger_than_the_tiers_is_not_capped(gpu, monkeypatch):
    monkeypatch.setenv(env.TIER_VAR, "t4")
    gpu.gib, gpu.cap = 14.6, (7, 5)  # the T4 itself
    assert rehearsal.card() is None and rehearsal.apply() is None and gpu.fractions == []
    assert rehearsal.half_dtype() == "fp16"  # its own capability


def test_lab_sizes_apply_the_cap_and_say_so_once(gpu, monkeypatch, capsys):
    monkeypatch.setenv(env.TIER_VAR, "t4")
    monkeypatch.setattr(labs, "_SAID", set())
    first = labs.sizes("00_foundations")
    labs.sizes("00_foundations")
    assert first == labs.sizes("00_foundations", "t4")
    out = capsys.readouterr().out
    assert out.count("rehearsing a T4") == 1 and len(gpu.fractions) == 1


def test_the_labs_matmuls_and_the_graders_measurements_take_the_rehearsed_cards_dtype(gpu, monkeypatch):
    from grader import answers, context

    monkeypatch.setattr(env, "cuda_available", lambda: True)
    assert env.matmul_dtype() is torch.bfloat16  # an H200 as itself
    monkeypatch.setenv(env.TIER_VAR, "t4")
    assert env.matmul_dtype() is torch.float16 and rehearsal.half_torch_dtype() is torch.float16
    # the grader's context (what every lab's reference measures in) and the record read the notebook's own choice
    assert context.matmul_dtype is env.matmul_dtype
    assert "matmul_dtype()" in __import__("inspect").getsource(answers.save_record)
    monkeypatch.setenv(env.SMOKE_VAR, "1")
    ctx = context.live("00_foundations")
    assert env.matmul_dtype() is torch.float32 and (ctx.device, ctx.dtype, ctx.smoke) == ("cpu", "float32", True)
