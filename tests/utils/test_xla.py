"""utils.tpu.xla: JAX compile counting, compile against run time, bucketing. JAX runs on the CPU here."""
from __future__ import annotations

import math

import pytest

from utils.tpu import xla

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
