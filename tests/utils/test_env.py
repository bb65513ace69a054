"""Platform detection, smoke mode and size tiers."""
import pytest

from utils.course import env


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
    monkeypatch.setenv(env.TIER_VAR, "tpu")
    with pytest.raises(ValueError, match="not one of"):
        env.device_tier()


def test_repo_root_holds_utils():
    assert (env.repo_root() / "utils" / "course" / "env.py").is_file()
