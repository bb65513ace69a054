"""utils.train.training on CPU: loop configs, the naive and optimized loops, LoRA recipes and their memory account."""
from __future__ import annotations

import shutil

import pytest
import torch

from utils.train import training


def test_config_validation_and_tokens():
    cfg = training.naive_config(2, 64)
    assert cfg.precision == "fp32" and cfg.num_workers == 0 and cfg.sync_every_step and not cfg.pin_memory
    assert training.with_changes(cfg, grad_accum=4).tokens_per_step == 2 * 64 * 4
    with pytest.raises(ValueError, match="precision"):
        training.LoopConfig(precision="fp8")
    with pytest.raises(ValueError, match="batch_size"):
        training.LoopConfig(batch_size=0)
    with pytest.raises(ValueError, match="quant"):
        training.FinetuneRecipe(quant="int3")


def test_padded_vocab_and_cpu_precision():
    assert training.padded_vocab(50257, 64) == 50304
    assert training.padded_vocab(4096, 64) == 4096
    assert training.best_precision("cpu") == "fp32"


def test_naive_and_optimized_loops_train_on_cpu():
    naive = training.build_loop("gpt2-tiny", training.naive_config(2, 32))
    loss = naive.step()
    assert isinstance(loss, float) and loss > 0  # the host sync returns a Python float
    fast_cfg = training.LoopConfig(batch_size=4, seq_len=32, precision="bf16", sync_every_step=False, pad_vocab_to=64,
                                   grad_accum=2, checkpointing=True)
    fast = training.build_loop("gpt2-tiny", fast_cfg)
    before = [p.detach().clone() for p in fast.model.parameters()]
    out = fast.step()
    assert torch.is_tensor(out) and torch.isfinite(out)
    assert any(not torch.equal(a, b) for a, b in zip(before, fast.model.parameters(), strict=True))
    assert fast.flops_per_token == naive.flops_per_token  # padding adds no useful FLOPs
    row = training.measure_loop(naive, steps=2, warmup_steps=1, monitor=False)
    assert row["tokens_per_s"] > 0 and row["mfu"] is None  # no datasheet peak for a CPU
    assert row["achieved_tflops"] == pytest.approx(row["tokens_per_s"] * naive.flops_per_token / 1e12)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_loop_compiles_the_loss_not_the_model():
    """compile_mode compiles a function of the batch that returns only the loss (so the logits
    never leave the graph, RESULTS.md); it trains exactly like the eager loop."""
    cfg = training.LoopConfig(batch_size=2, seq_len=32, precision="fp32", sync_every_step=True)
    eager = training.build_loop("gpt2-tiny", cfg)
    compiled = training.build_loop("gpt2-tiny", training.with_changes(cfg, compile_mode="default"))
    x, y = next(iter(compiled.loader))
    out = compiled.loss_fn(x, y)
    assert torch.is_tensor(out) and out.dim() == 0  # the loss alone, not the model's output object
    assert [compiled.step() for _ in range(2)] == pytest.approx([eager.step() for _ in range(2)], rel=1e-5)


def test_lora_account_on_cpu_shows_checkpointing_and_eval_mode():
    lean = training.measure_finetune("llama-tiny", training.RECIPES["lora_bf16_lean"], 2, 64, steps=1)
    no_ckpt = training.measure_finetune("llama-tiny", training.RECIPES["lora_bf16_no_ckpt"], 2, 64, steps=1)
    evalm = training.measure_finetune("llama-tiny", training.RECIPES["lora_bf16_autocast_eval"], 2, 64, steps=1)
    assert lean["lora_grads_ok"] and evalm["lora_grads_ok"]
    assert lean["trainable_params"] < lean["total_params"] / 5
    assert no_ckpt["saved_activations_gib"] > 1.5 * lean["saved_activations_gib"]
    assert evalm["peak_gib"] > 1.2 * lean["peak_gib"]  # eval mode switches checkpointing off
    assert lean["peak_gib"] == pytest.approx(lean["weights_gib"] + lean["optimizer_gib"] + lean["gradients_gib"]
                                             + lean["saved_activations_gib"])


def test_qlora_falls_back_to_lora_without_a_gpu_and_says_so():
    r = training.measure_finetune("llama-tiny", training.RECIPES["qlora_lean"], 1, 32, steps=1)
    assert r["quant"] == "none" and "fell back to bf16 LoRA" in r["note"]


def test_full_finetune_estimate_is_16_bytes_per_param_plus_activations():
    from utils.model.models import preset_config

    est = training.full_finetune_estimate(1_000_000, 1, 8, preset_config("llama-tiny"))
    states = est["weights_gib"] + est["gradients_gib"] + est["optimizer_gib"]
    assert states * 2**30 == pytest.approx(16 * 1_000_000)
    assert est["activations_gib"] > 0
