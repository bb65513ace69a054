"""utils.parallel.distributed: scaling efficiency, nccl-tests bandwidth factors, ZeRO/FSDP/TP/PP memory
(the ZeRO paper's own example), and benchmarks/allreduce.py run for real with two processes
over gloo on the loopback interface."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import free_port
from utils.parallel.distributed import (
    algbw_gbs,
    allreduce_benchmark,
    allreduce_time_s,
    bus_factor,
    busbw_fraction_of_link,
    busbw_gbs,
    communication_share,
    exposed_communication_s,
    link_peak,
    memory_per_gpu,
    parallel_weight_bytes_per_gpu,
    parse_size_bytes,
    pipeline_layers_per_stage,
    scaling_efficiency,
    tensor_parallel_weight_bytes,
)

EXACT = {"rel": 1e-12}
ROOT = Path(__file__).resolve().parents[2]

# -- scaling ----------------------------------------------------------------------------------


def test_scaling_efficiency_per_device_and_total():
    # docs/reference.md: 194.0k tokens/s on one H200, 192.1k per GPU on two -> 99.0%
    assert scaling_efficiency(192.1e3, 194.0e3, 2, per_device=True) == pytest.approx(192.1 / 194.0, **EXACT)
    assert scaling_efficiency(2 * 192.1e3, 194.0e3, 2) == pytest.approx(192.1 / 194.0, **EXACT)
    assert scaling_efficiency(700, 100, 8) == pytest.approx(0.875, **EXACT)
    with pytest.raises(ValueError, match="n_devices must be a positive integer"):
        scaling_efficiency(1.0, 1.0, 0)


def test_communication_share_and_exposed_time():
    assert communication_share(0.025, 0.1) == pytest.approx(0.25, **EXACT)
    assert exposed_communication_s(0.105, 0.1) == pytest.approx(0.005, rel=1e-9)
    assert exposed_communication_s(0.099, 0.1) == 0.0
    with pytest.raises(ValueError, match="exceeds the step time"):
        communication_share(0.2, 0.1)


# -- bandwidth ----------------------------------------------------------------------------------

@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("allreduce", 4, 1.5),
    ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
])
def test_bus_factors_follow_nccl_tests(collective, n, factor):
    assert bus_factor(collective, n) == factor


def test_algbw_busbw_and_time_round_trip():
    # 1 GiB in 3.283 ms on two GPUs: algbw = busbw = 327 GB/s (the H200 pair's figure)
    alg = algbw_gbs(2**30, 3.2836e-3)
    assert alg == pytest.approx(2**30 / 3.2836e-3 / 1e9, **EXACT)
    assert busbw_gbs(alg, 2) == alg
    assert busbw_gbs(100.0, 8) == pytest.approx(175.0, **EXACT)
    assert busbw_gbs(100.0, 8, "all_gather") == pytest.approx(87.5, **EXACT)
    assert allreduce_time_s(2**30, busbw_gbs(alg, 2), 2) == pytest.approx(3.2836e-3, **EXACT)
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        bus_factor("gather", 2)


def test_link_peaks_are_per_direction():
    assert link_peak("H200").per_direction_gbs == 450.0 and link_peak("H200").bidirectional_gbs == 900.0
    assert link_peak("NVIDIA H100 80GB HBM3") is link_peak("nvlink4")
    assert link_peak("NVIDIA A100-SXM4-40GB").per_direction_gbs == 300.0
    assert link_peak("Tesla T4") is link_peak("pcie3")
    assert busbw_fraction_of_link(327, "H200") == pytest.approx(327 / 450, **EXACT)
    with pytest.raises(ValueError, match="no link peak for 'TPU v5e'"):
        link_peak("TPU v5e")


# -- memory per GPU ------------------------------------------------------------------------------

@pytest.mark.parametrize("stage, total_bytes, paper_gb", [
    ("ddp", 120_000_000_000, 120.0),
    (1, 31_406_250_000, 31.4),
    (2, 16_640_625_000, 16.6),
    (3, 1_875_000_000, 1.9),
])
def test_zero_paper_example_7_5b_on_64_gpus(stage, total_bytes, paper_gb):
    # Rajbhandari et al. 2020, figure 1: Psi = 7.5B, K = 12, N_d = 64
    m = memory_per_gpu(7_500_000_000, 64, stage)
    assert m["total_bytes"] == total_bytes
    assert round(m["total_gb"], 1) == paper_gb
    assert m["weights_bytes"] + m["gradients_bytes"] + m["optimizer_bytes"] == m["total_bytes"]


def test_zero_formulas_term_by_term():
    psi, nd = 1_000_000, 8
    assert memory_per_gpu(psi, nd, 0)["total_bytes"] == 16 * psi
    assert memory_per_gpu(psi, nd, 1)["total_bytes"] == 4 * psi + 12 * psi / nd
    assert memory_per_gpu(psi, nd, 2)["total_bytes"] == 2 * psi + 14 * psi / nd
    assert memory_per_gpu(psi, nd, 3)["total_bytes"] == 16 * psi / nd
    assert memory_per_gpu(psi, nd, "fsdp_full_shard") == memory_per_gpu(psi, nd, 3)
    assert memory_per_gpu(psi, nd, "SHARD_GRAD_OP") == memory_per_gpu(psi, nd, 2)
    assert memory_per_gpu(psi, 1, 3)["total_bytes"] == memory_per_gpu(psi, 1, "ddp")["total_bytes"]
    # fp32 training with plain Adam: 4 + 4 + 8 bytes per parameter
    assert memory_per_gpu(psi, nd, "ddp", optimizer_bytes_per_param=8, param_bytes=4, grad_bytes=4)["total_bytes"] == 16 * psi
    with pytest.raises(ValueError, match="unknown stage 'zero4'"):
        memory_per_gpu(psi, nd, "zero4")


def test_tensor_and_pipeline_parallel_weights():
    assert tensor_parallel_weight_bytes(140e9, 8) == 17.5e9
    assert pipeline_layers_per_stage(30, 4) == [8, 8, 7, 7]
    assert pipeline_layers_per_stage(80, 2) == [40, 40]
    # 70B bf16 over 80 layers: tp=8 and tp=4 x pp=2 both leave 17.5 GB of weights per GPU
    assert parallel_weight_bytes_per_gpu(70_000_000_000, 80, tp=8) == 17.5e9
    assert parallel_weight_bytes_per_gpu(70_000_000_000, 80, tp=4, pp=2) == 17.5e9
    assert parallel_weight_bytes_per_gpu(70_000_000_000, 80, pp=3) == 140e9 * 27 / 80  # stages of 27, 27, 26
    with pytest.raises(ValueError, match="pipeline degree 5 exceeds the 4 layers"):
        pipeline_layers_per_stage(4, 5)


# -- the benchmark -----------------------------------------------------------------------------

@pytest.mark.parametrize("text, n", [("1MiB", 2**20), ("16MiB", 16 * 2**20), ("1GiB", 2**30), ("4KiB", 4096),
                                     ("1MB", 10**6), ("4096", 4096), (" 256 mib ", 256 * 2**20), ("1M", 2**20)])
def test_parse_size_bytes(text, n):
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "1 TiB", "MiB", "0.5", "-1MiB"])
def test_parse_size_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_size_bytes(bad)


def test_allreduce_benchmark_needs_a_process_group():
    pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="needs an initialised process group"):
        allreduce_benchmark([1024])


def test_allreduce_benchmark_in_a_one_process_gloo_group():
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        rows = allreduce_benchmark([1024, 4096], iters=3, warmup=1, dtype="bf16")
        with pytest.raises(ValueError, match="not a positive multiple of the torch.float32 element size"):
            allreduce_benchmark([6], iters=1, warmup=0)
        with pytest.raises(ValueError, match="rank_reduce must be 'max' or 'mean'"):
            allreduce_benchmark([1024], rank_reduce="median")
    finally:
        dist.destroy_process_group()
    assert [r["bytes"] for r in rows] == [1024, 4096]
    for r in rows:  # one rank: nothing crosses a link, so the bus factor 2(n-1)/n is 0
        assert r["n_ranks"] == 1 and r["time_us"] > 0 and r["algbw_gbs"] > 0 and r["busbw_gbs"] == 0


@pytest.mark.timeout(120)
def test_benchmark_script_two_processes_over_gloo(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "allreduce.json"
    sizes = [4096, 65536]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        env.pop(var, None)  # the script must set these itself
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           str(ROOT / "benchmarks" / "allreduce.py"), "--smoke", "--out", str(out),
           "--sizes", "4KiB,64KiB", "--iters", "3", "--warmup", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["smoke"] is True
    assert data["env"]["NCCL_NVLS_ENABLE"] == "0" and data["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert data["env"]["NVSHMEM_DISABLE_NVLS"] == "1"
    assert data["fingerprint"]["kind"] == "cpu" and len(data["utils_sha256"]) == 64
    rows = data["results"]
    assert [r["bytes"] for r in rows] == sizes
    for r in rows:
        assert r["n_ranks"] == 2 and r["iters"] == 3
        assert 0 < r["time_us_rank_min"] <= r["time_us_rank_max"] == r["time_us"]
        assert r["algbw_gbs"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9, rel=1e-12)
        assert r["busbw_gbs"] == r["algbw_gbs"] * (2 * (2 - 1) / 2)  # exactly: the factor is 1.0 for n = 2


def test_benchmark_script_refuses_to_run_without_torchrun(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "allreduce.py"), "--out", str(tmp_path / "x.json")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "launch with torchrun" in proc.stderr
