"""Platform detection, smoke mode and size tiers."""
import pytest

from utils import env, xla


def test_platform_detection(monkeypatch):
    for var in ("COLAB_RELEASE_TAG", "COLAB_GPU", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"):
        monkeypatch.delenv(var, raising=False)
    assert env.platform_name() == "local"
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert env.platform_name() == "kaggle"
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20261101")
    assert env.platform_name() == "colab"


def test_smoke_flag_forces_smoke(monkeypatch):
    monkeypatch.setenv(env.SMOKE_VAR, "1")
    assert env.smoke_mode() and env.device_tier() == "cpu"


def test_no_gpu_means_smoke(monkeypatch):
    monkeypatch.delenv(env.SMOKE_VAR, raising=False)
    monkeypatch.setattr(env, "cuda_available", lambda: False)
    assert env.smoke_mode()
    monkeypatch.setenv(env.SMOKE_VAR, "0")  # asking for no smoke without a GPU still gives smoke
    assert env.smoke_mode()


def test_forced_tier(monkeypatch):
    monkeypatch.setenv(env.TIER_VAR, "t4")
    assert env.device_tier() == "t4"
    assert env.phase_sizes("00_foundations").matmul_n == 4096
    monkeypatch.setenv(env.TIER_VAR, "tpu")
    with pytest.raises(ValueError, match="not one of"):
        env.device_tier()


def test_phase_sizes_grow_with_tier_and_unknown_phase_is_named():
    sizes = [env.phase_sizes("00_foundations", t) for t in env.TIERS]
    assert [s.matmul_n for s in sizes] == sorted(s.matmul_n for s in sizes)
    assert sizes[0].model.endswith("tiny")
    with pytest.raises(KeyError, match="no sizes for phase"):
        env.phase_sizes("99_nothing")


def test_repo_root_holds_utils():
    assert (env.repo_root() / "utils" / "env.py").is_file()


def test_phase5_sizes_are_consistent_per_tier():
    for tier in env.TIERS:
        s = env.phase_sizes("05_hardware_and_cost", tier)
        assert s.ckpt_every <= s.kill_after < s.ckpt_steps  # the notebook's kill leaves a checkpoint behind
        assert s.kill_after != min(s.ckpt_steps - 1, 2 * s.ckpt_every + 1)  # the grader kills elsewhere
        assert len(s.decode_batches) >= 3 and s.new_tokens >= 2 and s.prompt_len + s.new_tokens <= 1024
        assert len(set(s.xla_lengths)) > len(xla.pow2_buckets(max(s.xla_lengths), min(s.xla_lengths)))
