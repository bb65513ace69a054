"""Each lab's sizes per tier, in its own folder (grader/labs/<lab>/sizes.py), picked by grader.labs.sizes."""
from __future__ import annotations

import dataclasses

import pytest

from grader import labs
from utils.course import env
from utils.tpu import xla


@pytest.mark.parametrize("lab", labs.assignments())
def test_every_lab_has_frozen_sizes_for_every_tier(lab):
    table = labs.load(lab).part("sizes").BY_TIER
    assert tuple(table) == env.TIERS
    assert len({type(s) for s in table.values()}) == 1
    s = labs.sizes(lab, "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.__setattr__(dataclasses.fields(s)[0].name, None)
    assert labs.load(lab).sizes("t4") is table["t4"] is labs.sizes(lab, "t4")
    assert str(s).startswith(f"Plan for {lab}")  # sizes print as their plan (utils.course.tier_plan)


def test_the_device_picks_the_tier_and_a_forced_one_wins(monkeypatch):
    monkeypatch.setenv(env.TIER_VAR, "t4")
    assert labs.sizes("00_foundations").matmul_n == 4096
    monkeypatch.delenv(env.TIER_VAR)
    monkeypatch.setattr(env, "device_tier", lambda: "a100")
    assert labs.sizes("00_foundations") == labs.sizes("00_foundations", "a100")


def test_unknown_labs_and_tiers_are_named():
    with pytest.raises(labs.LabError, match="no lab '99_nothing'; the labs are 00_foundations"):
        labs.sizes("99_nothing")
    with pytest.raises(ValueError, match="no 'tpu' sizes for 00_foundations; the tiers are cpu, t4, a100, h100"):
        labs.sizes("00_foundations", "tpu")


def test_sizes_grow_with_tier():
    sizes = [labs.sizes("00_foundations", t) for t in env.TIERS]
    assert [s.matmul_n for s in sizes] == sorted(s.matmul_n for s in sizes)
    assert sizes[0].model.endswith("tiny")


def test_lab05_sizes_are_consistent_per_tier():
    for tier in env.TIERS:
        s = labs.sizes("05_hardware_and_cost", tier)
        assert s.ckpt_every <= s.kill_after < s.ckpt_steps  # the notebook's kill leaves a checkpoint behind
        assert s.kill_after != min(s.ckpt_steps - 1, 2 * s.ckpt_every + 1)  # the grader kills elsewhere
        assert len(s.decode_batches) >= 3 and s.new_tokens >= 2 and s.prompt_len + s.new_tokens <= 1024
        assert len(set(s.xla_lengths)) > len(xla.pow2_buckets(max(s.xla_lengths), min(s.xla_lengths)))
