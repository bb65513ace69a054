"""utils.xla (JAX compile counting, bucketing), utils.topology (nvidia-smi topo -m, NCCL lines)
and phase 5's sizes. JAX runs on the CPU here."""
from __future__ import annotations

import math

import pytest

from utils import env, topology, xla

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _layer(x, w):
    return jnp.tanh(x @ w).sum(axis=-1)


def test_compiles_are_counted_once_per_shape_and_fresh_each_time():
    w = jnp.ones((8, 8))
    xs = [jnp.ones((n, 8)) for n in (3, 5, 3, 7, 5)]
    first = xla.count_compiles(_layer, [(x, w) for x in xs])
    assert (first.compiles, first.distinct_shapes, first.calls) == (3, 3, 5)
    assert first.cache_size in (None, 3)
    assert first.compile_s > 0 and len(first.first_call_ms) == 5
    # a second count of the same function starts from an empty cache (plain jax.jit would share it)
    assert xla.count_compiles(_layer, [(x, w) for x in xs]).compiles == 3
    with xla.CompileLog() as log:
        jax.jit(_layer)(xs[0], w)
        jax.jit(_layer)(xs[0], w)  # same function, same shape: cached
    assert log.count("jit(_layer)") == 1
    log2_before = len(log.events)
    jax.jit(_layer)(jnp.ones((11, 8)), w)  # outside the block: not recorded
    assert len(log.events) == log2_before


def test_bucketing_bounds_compiles():
    lengths = (37, 50, 64, 100, 128, 129, 200, 256, 37, 64)
    buckets = xla.pow2_buckets(max(lengths), min(lengths))
    assert buckets == (64, 128, 256)
    assert [xla.bucket_length(n, buckets) for n in (0, 64, 65, 256)] == [64, 64, 128, 256]
    with pytest.raises(ValueError, match="no bucket holds length 257"):
        xla.bucket_length(257, buckets)
    w = jnp.ones((4, 4))
    padded = [xla.pad_to(jnp.ones((n, 4)), xla.bucket_length(n, buckets)) for n in lengths]
    assert {p.shape[0] for p in padded} == {64, 128, 256}
    assert xla.count_compiles(_layer, [(p, w) for p in padded]).compiles == 3
    assert xla.padded_fraction([64, 64], buckets) == 0 and 0 < xla.padded_fraction(lengths, buckets) < 1
    with pytest.raises(ValueError, match="cannot pad"):
        xla.pad_to(jnp.ones((5, 2)), 4)


def test_compile_vs_run_and_break_even():
    res = xla.compile_vs_run(_layer, jnp.ones((64, 32)), jnp.ones((32, 32)), budget_s=0.5, max_runs=20)
    assert res["compiles"] == 1 and res["compile_ms"] > res["run"].median_ms > 0
    assert res["first_call_ms"] >= res["compile_ms"] * 0.5 and res["eager"].median_ms > 0
    assert xla.break_even_calls(10.0, 0.5) == 20 and math.isinf(xla.break_even_calls(10.0, -1.0))
    assert set(xla.backend()) == {"jax", "backend", "device_kind", "devices"}


@pytest.mark.parametrize("name", list(topology.TOPO_EXAMPLES))
def test_shipped_topologies_parse(name):
    text, source = topology.TOPO_EXAMPLES[name]
    assert "issue" in source or "docs" in source
    topo = topology.parse_topo(text)
    n = len(topo.gpus)
    assert all(topo.link(g, g) == "X" for g in topo.gpus)
    assert all(topo.link(a, b) == topo.link(b, a) for a in topo.gpus for b in topo.gpus)
    assert set(topo.cpu_affinity) == set(topo.gpus)
    pairs = topology.nvlink_pairs(topo)
    if name.startswith("8x"):
        assert n == 8 and len(topo.devices) == 17 and len(pairs) == 28 and set(pairs.values()) == {18}
        assert topo.link("GPU0", "NIC8") == "PIX" and topo.numa_affinity["GPU4"] == "1"
        assert topology.slowest_gpu_link(topo) == "NV18"
    elif "PHB" in name:
        assert pairs == {} and topology.slowest_gpu_link(topo) == "PHB"
    else:
        assert pairs == {(0, 1): 2} and topology.slowest_gpu_link(topo) == "NV2"


def test_path_ranking_and_errors():
    order = ["NV18", "NV2", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert sorted(order, key=topology.path_rank, reverse=True) == order
    assert topology.nvlinks("NV12") == 12 and topology.nvlinks("SYS") == 0
    with pytest.raises(ValueError, match="unknown path code"):
        topology.path_rank("QPI")
    with pytest.raises(ValueError, match="no nvidia-smi topo -m header"):
        topology.parse_topo("nvidia-smi: command not found")
    one = topology.parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\t0\n")
    assert one.gpus == ["GPU0"]
    with pytest.raises(ValueError, match="fewer than two GPUs"):
        topology.slowest_gpu_link(one)
    with pytest.raises(ValueError, match="row GPU1 has 1 entries"):
        topology.parse_topo("        GPU0    GPU1    CPU Affinity\nGPU0     X      NV2     0-7\nGPU1    NV2\n")


def test_nccl_example_and_probe_without_gpu():
    text, source = topology.NCCL_EXAMPLE
    assert "NVL[370.8]" in text and "NET[25.0]" in text and "nccl" in source
    assert topology.NETWORK_LINKS["ib-ndr"].per_direction_gbs == 400 / 8
    import torch

    if not torch.cuda.is_available():
        assert topology.nccl_info_lines() is None


def test_phase5_sizes_are_consistent_per_tier():
    for tier in env.TIERS:
        s = env.phase_sizes("05_hardware_and_cost", tier)
        assert s.ckpt_every <= s.kill_after < s.ckpt_steps  # the notebook's kill leaves a checkpoint behind
        assert s.kill_after != min(s.ckpt_steps - 1, 2 * s.ckpt_every + 1)  # the grader kills elsewhere
        assert len(s.decode_batches) >= 3 and s.new_tokens >= 2 and s.prompt_len + s.new_tokens <= 1024
        assert len(set(s.xla_lengths)) > len(xla.pow2_buckets(max(s.xla_lengths), min(s.xla_lengths)))
