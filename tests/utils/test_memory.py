"""utils.measure.memory: exact estimates for known cases, dtype sizes, PeakMemory on the CPU."""
from __future__ import annotations

import pytest

from utils.measure.memory import (
    GIB,
    PeakMemory,
    bytes_per_dtype,
    training_memory_estimate,
    transformer_activation_bytes,
)

# -- bytes_per_dtype -------------------------------------------------------------------------

@pytest.mark.parametrize("name, size", [("bf16", 2), ("bfloat16", 2), ("torch.float16", 2), ("fp32", 4),
                                        ("float64", 8), ("fp8", 1), ("int8", 1), ("nf4", 0.5), ("FP32", 4)])
def test_bytes_per_dtype_by_name(name, size):
    assert bytes_per_dtype(name) == size


def test_bytes_per_dtype_of_torch_dtypes():
    torch = pytest.importorskip("torch")
    assert bytes_per_dtype(torch.bfloat16) == 2
    assert bytes_per_dtype(torch.float32) == 4
    assert bytes_per_dtype(torch.float8_e4m3fn) == 1


def test_unknown_dtype_says_what_to_use():
    with pytest.raises(ValueError, match="unknown dtype 'float13'"):
        bytes_per_dtype("float13")


# -- training_memory_estimate ----------------------------------------------------------------

def test_fp32_adamw_is_16_bytes_per_param():
    # 4 (weights) + 4 (gradients) + 8 (two fp32 moments): accelerate estimate-memory, ZeRO 3.1
    est = training_memory_estimate(10**9, param_dtype="fp32", optimizer="adamw")
    assert est["weights_gib"] == pytest.approx(4e9 / GIB)
    assert est["gradients_gib"] == pytest.approx(4e9 / GIB)
    assert est["optimizer_gib"] == pytest.approx(8e9 / GIB)
    assert est["activations_gib"] == 0
    assert est["total_gib"] == pytest.approx(16e9 / GIB)  # 14.90 GiB
    assert est["bytes_per_param"] == 16


def test_mixed_precision_with_master_weights_is_also_16():
    # ZeRO's 2 + 2 + 12: bf16 weights and grads, fp32 master copy and moments
    est = training_memory_estimate(10**9, param_dtype="bf16", grad_dtype="bf16", optimizer="adamw", master_weights=True)
    assert est["weights_gib"] == pytest.approx(2e9 / GIB)
    assert est["optimizer_gib"] == pytest.approx(12e9 / GIB)
    assert est["bytes_per_param"] == 16


def test_pure_bf16_adamw_keeps_states_in_bf16():
    est = training_memory_estimate(1000, param_dtype="bf16", optimizer="adamw")
    assert est["bytes_per_param"] == 2 + 2 + 4  # torch.optim states take the parameter dtype


def test_other_optimizers_lora_and_activations():
    assert training_memory_estimate(1000, optimizer="sgd")["bytes_per_param"] == 8
    assert training_memory_estimate(1000, optimizer="sgd_momentum")["bytes_per_param"] == 12
    assert training_memory_estimate(1000, optimizer="adamw_8bit")["bytes_per_param"] == 4 + 4 + 2
    # LoRA: 1e9 frozen bf16 weights, 1e7 trainable adapter parameters in bf16 with AdamW
    lora = training_memory_estimate(10**9, param_dtype="bf16", trainable_params=10**7, activation_bytes=3 * GIB)
    assert lora["weights_gib"] == pytest.approx(2e9 / GIB)
    assert lora["gradients_gib"] == pytest.approx(2e7 / GIB)
    assert lora["optimizer_gib"] == pytest.approx(4e7 / GIB)
    assert lora["activations_gib"] == 3
    assert lora["total_gib"] == pytest.approx((2e9 + 2e7 + 4e7) / GIB + 3)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_params": -1}, "n_params"),
    ({"n_params": 10, "trainable_params": 11}, "cannot exceed"),
    ({"n_params": 10, "optimizer": "adagrad-9000"}, "unknown optimizer"),
    ({"n_params": 10, "param_dtype": "fp12"}, "unknown dtype"),
])
def test_estimate_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        training_memory_estimate(**kwargs)


# -- transformer_activation_bytes ------------------------------------------------------------

S, B, H, A, L = 1024, 8, 768, 12, 12  # GPT-2 small, batch 8


def test_activation_formula_of_korthikanti_et_al():
    # eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer with 16-bit activations
    per_layer = S * B * H * (34 + 5 * A * S / H)
    assert per_layer == 717_225_984
    assert transformer_activation_bytes(B, S, H, L, A, 2) == L * per_layer == 8_606_711_808


def test_activation_variants():
    sbh, as2b = S * B * H, A * S * S * B
    assert transformer_activation_bytes(B, S, H, L, A, 2, dropout=False) == L * (32 * sbh + 4 * as2b)
    assert transformer_activation_bytes(B, S, H, L, A, 2, attention_scores=False) == L * 34 * sbh
    assert transformer_activation_bytes(B, S, H, L, A, 4) == L * (66 * sbh + 9 * as2b)  # fp32 values
    # full recomputation: each layer's 16-bit input (2sbh, section 4) plus one layer rebuilt
    full = transformer_activation_bytes(B, S, H, L, A, 2)
    assert transformer_activation_bytes(B, S, H, L, A, 2, checkpointing=True) == L * 2 * sbh + full / L


def test_activation_bad_input():
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        transformer_activation_bytes(1, 8, 64, 2, 0)


# -- PeakMemory on the CPU -------------------------------------------------------------------

def test_peak_memory_on_cpu_reports_rss():
    block = 256 * 2**20
    with PeakMemory(device="cpu", interval_s=3600) as pm:
        before = pm._monitor.samples[0]["rss_gib"]
        buf = bytearray(b"\x01") * block  # written, so resident; alive at exit, so the exit sample sees it
    assert pm.source == "psutil_rss"
    assert pm.peak_allocated_gib is None and pm.peak_reserved_gib is None and pm.device_used_gib is None
    assert pm.peak_rss_gib >= before + 0.9 * block / GIB
    assert pm.peak_gib == pm.peak_rss_gib
    assert "peak RSS" in str(pm) and pm.to_dict()["peak_rss_gib"] == pm.peak_rss_gib
    del buf


def test_peak_memory_cuda_path_with_fakes(monkeypatch):
    """The CUDA branch on a CPU: torch.cuda's memory statistics and NVML are faked."""
    torch = pytest.importorskip("torch")
    from tests.fakes import FakeGpu, FakeNvml, installed
    from utils.measure import memory

    stats = {"allocated": 2 * GIB, "max_allocated": 0, "max_reserved": 0, "resets": []}

    def reset(device=None):
        stats["resets"].append(device)
        stats["max_allocated"] = stats["allocated"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: stats["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: stats["max_allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: stats["max_reserved"])
    monkeypatch.setattr(memory, "_nvml_index", lambda device: 0)
    with installed(FakeNvml([FakeGpu(mem_used_bytes=12 * GIB)])):
        with PeakMemory(interval_s=3600) as pm:
            stats["max_allocated"], stats["max_reserved"] = 7 * GIB, 9 * GIB  # the block's work
    assert stats["resets"] == ["cuda"] and pm.source == "torch.cuda"
    assert pm.baseline_allocated_gib == 2 and pm.peak_allocated_gib == 7 and pm.increase_gib == 5
    assert pm.peak_reserved_gib == 9 and pm.device_used_gib == pytest.approx(12)
    assert pm.peak_gib == 7 and pm.peak_rss_gib is None
    assert "device used 12.00 GiB" in str(pm)


def test_tensor_bytes_counts_each_storage_once_and_saved_bytes():
    import torch

    from utils.measure.memory import count_saved_bytes, tensor_bytes

    a = torch.zeros(256, dtype=torch.float32)
    assert tensor_bytes([a, a[:10], None, a.view(16, 16)]) == 1024  # views share a's storage
    assert tensor_bytes([a, torch.zeros(8, dtype=torch.bfloat16)]) == 1024 + 16
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    out: dict = {}
    with count_saved_bytes(out):
        (x @ w).sum()
    assert out["saved"] == x.nbytes  # w's gradient needs x; x needs none, so w is not saved
