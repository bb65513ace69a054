"""utils.train.checkpoint (RNG capture, DCP save/load, digests), utils.train.checkpointed_run (the resumable
loader, the loop) and utils.train.kill_harness (a real SIGKILL + resume).

The kill-and-resume tests run real processes (``python -m utils.train.checkpointed_run run``) on the CPU:
the uninterrupted reference and a run SIGKILLed after a step this test picks, then its
resume. One experiment with the module's own RNG functions must end bit-identical; one with a
restore that forgets Python's ``random`` must be caught. About 30 s on two cores.
"""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.train import checkpoint as ck
from utils.train import checkpointed_run as cr
from utils.train import kill_harness as kh

ROOT = Path(__file__).resolve().parents[2]
CFG = cr.RunConfig()  # gpt2-tiny, 12 steps, a checkpoint every 4, epochs of 4 steps


def _draws():
    return torch.rand(3).tolist(), [random.random() for _ in range(3)], np.random.rand(3).tolist()


def test_rng_capture_restore_round_trips_every_generator():
    state = ck.capture_rng_state()
    first = _draws()
    ck.restore_rng_state(state)
    assert _draws() == first
    assert set(state) == {"torch", "cuda", "python", "numpy"}


def test_loader_resumes_mid_epoch_and_across_epochs():
    blocks = torch.arange(6 * 10).reshape(6, 10)
    random.seed(1)
    np.random.seed(1)
    a = cr.ShuffledBlocks(blocks, batch_size=2, seq_len=8)
    for _ in range(2):
        a.next_batch()
    saved, rng = a.state_dict(), ck.capture_rng_state()
    rest = [a.next_batch() for _ in range(5)]  # the rest of epoch 0 and into epochs 1 and 2
    assert a.epoch == 2
    b = cr.ShuffledBlocks(blocks, batch_size=2, seq_len=8)
    b.load_state_dict(saved)
    ck.restore_rng_state(rng)
    assert all(torch.equal(x, y) for x, y in zip(rest, (b.next_batch() for _ in range(5)), strict=True))
    with pytest.raises(ValueError, match="batch_size"):
        cr.ShuffledBlocks(blocks, batch_size=7, seq_len=8)


def _trained(cfg: cr.RunConfig, steps: int = 3):
    model, opt, sched, loader = cr.build(cfg)
    for _ in range(steps):
        cr.train_step(model, opt, sched, loader.next_batch())
    return model, opt, sched, loader


@pytest.mark.parametrize("mode", ["sync", "async", "thread-fallback"])
def test_save_then_load_is_bit_identical_and_a_snapshot(tmp_path, monkeypatch, mode):
    if mode == "thread-fallback":
        monkeypatch.setattr(ck, "has_async_save", lambda: False)
    model, opt, sched, loader = _trained(CFG)
    before = ck.digest(model.state_dict()), ck.digest(opt.state_dict())
    saver = ck.Checkpointer(tmp_path, async_save=mode != "sync")
    saver.save(3, model, opt, {"step": 3, "note": "x"})
    with torch.no_grad():  # training goes on while an asynchronous write is in flight
        for p in model.parameters():
            p.add_(1.0)
    saver.wait()
    fresh, fresh_opt, _, _ = cr.build(CFG)
    extra = saver.load(saver.latest(), fresh, fresh_opt)
    assert extra == {"step": 3, "note": "x"}
    assert (ck.digest(fresh.state_dict()), ck.digest(fresh_opt.state_dict())) == before


def test_incomplete_checkpoints_are_skipped_and_old_ones_pruned(tmp_path):
    import shutil

    model, opt, _, _ = _trained(CFG, steps=1)
    saver = ck.Checkpointer(tmp_path, async_save=False, keep_last=2)
    for step in (4, 8, 12):
        saver.save(step, model, opt)
    assert [p.name for p in saver.complete()] == ["step_00000008", "step_00000012"]
    torn = tmp_path / "step_00000016"  # a write killed before DCP renamed its .metadata into place
    shutil.copytree(saver.latest(), torn)
    (torn / ck.METADATA_FILE).unlink()
    assert saver.latest().name == "step_00000012"


def test_digests_tell_every_component_apart():
    model, opt, sched, loader = _trained(CFG, steps=1)
    rng = ck.capture_rng_state()
    base = ck.state_digests(model, opt, sched, loader, rng)
    assert set(base) == set(ck.COMPONENTS)
    random.random()
    assert [k for k, v in ck.state_digests(model, opt, sched, loader, ck.capture_rng_state()).items()
            if v != base[k]] == ["rng.python"]
    ck.restore_rng_state(rng)
    assert ck.state_digests(model, opt, sched, loader, ck.capture_rng_state()) == base


def test_config_and_hooks_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="GPT-2 preset"):
        cr.RunConfig(preset="llama-tiny")
    with pytest.raises(ValueError, match="positive integer"):
        cr.RunConfig(steps=0)
    with pytest.raises(ValueError, match="unknown RunConfig fields: stepz"):
        cr.RunConfig.from_json('{"stepz": 3}')
    with pytest.raises(ValueError, match="cannot read the source"):
        cr.write_hooks(tmp_path / "h.py", len)
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ValueError, match="must define capture_rng_state"):
        cr.load_hooks(bad)
    with pytest.raises(ValueError, match="kill_after_step must be between"):
        kh.kill_and_resume(tmp_path / "k", CFG, 2)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(ValueError, match="not empty"):
        kh.kill_and_resume(tmp_path / "busy", CFG, 6)
    proc = subprocess.run([sys.executable, "-m", "utils.train.checkpointed_run", "run", "--out", str(tmp_path / "r"), "--config",
                           '{"steps": -1}'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: RunConfig.steps")


def test_write_hooks_ships_notebook_style_functions(tmp_path):
    path = cr.write_hooks(tmp_path / "hooks.py", ck.capture_rng_state, ck.restore_rng_state)
    capture, restore = cr.load_hooks(path)
    state = capture()
    first = _draws()
    restore(state)
    assert _draws() == first


def test_checkpoint_overhead_is_measured(tmp_path):
    res = cr.measure_checkpoint_overhead(CFG, tmp_path, steps=3, repeats=2)
    for key in ("step", "sync_save", "async_blocking", "async_total"):
        assert res[key].median_ms > 0 and res[key].runs >= 1
    model, *_ = cr.build(CFG)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert res["checkpoint_bytes"] >= 3 * weights  # weights and AdamW's two moments
    assert res["async_native"] is True


# -- real processes, a real SIGKILL ------------------------------------------------------------

FORGETS_PYTHON_RNG = textwrap.dedent('''
    import random
    import numpy as np
    import torch

    def capture_rng_state():
        return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}

    def restore_rng_state(state):
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
''')


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    return kh.kill_and_resume(tmp_path_factory.mktemp("resume"), CFG, kill_after_step=6, timeout_s=240)


@pytest.mark.slow
def test_sigkill_and_resume_ends_bit_identical(experiment):
    r = experiment
    assert r["killed_after_step"] == 6 and r["resumed_from"] == 4 and r["steps_after_resume"] == 8
    assert r["identical"] and r["differing"] == [] and r["losses_match"], r["differing"]
    assert r["reference_digests"] == r["resumed_digests"]
    assert r["async_save"] is True and r["nondeterministic_ops"] == []


@pytest.mark.slow
def test_a_restore_that_forgets_an_rng_is_caught(experiment, tmp_path):
    hooks = tmp_path / "hooks.py"
    hooks.write_text(FORGETS_PYTHON_RNG)
    r = kh.kill_and_resume(tmp_path / "run", CFG, 9, hooks_file=hooks, reference=experiment["reference"], timeout_s=240)
    assert r["resumed_from"] == 8
    assert not r["identical"]
    # step 9 starts a new epoch, whose order comes from Python's random: the data and so the model drift
    assert {"rng.python", "model", "optimizer"} <= set(r["differing"]), r["differing"]
    assert "rng.numpy" not in r["differing"] and "scheduler" not in r["differing"]


@pytest.mark.slow
def test_a_crashing_restore_gives_a_one_line_reason(tmp_path):
    hooks = tmp_path / "hooks.py"
    hooks.write_text("def capture_rng_state():\n    return {}\n\ndef restore_rng_state(state):\n    state['torch']\n")
    cfg = replace(CFG, steps=6)
    with pytest.raises(RuntimeError, match=r"exited \(1\) before 'done': KeyError: 'torch'"):
        kh.kill_and_resume(tmp_path / "run", cfg, 4, hooks_file=hooks, reference={"config": asdict(cfg)}, timeout_s=240)
