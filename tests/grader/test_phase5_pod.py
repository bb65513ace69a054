"""Lab 05's pod cells through the grader's own functions: ``test_pod_sharding`` and
``test_shard_bytes`` (``grader/phase5_wiring.py``, reached as ``grader.phase(5)`` reaches it).

The reference answers pass; wrong answers, built from what each mistake is, fail with a message
that names it: a matmul that never leaves one device, the weight split along the wrong
dimension, specs written as tuples, a function that only handles the notebook's own mesh, and
byte counts that drop the dimensions a short spec does not reach or the axes a tuple entry
names. Several of them pass the notebook's visible test, which is why the hidden cases use
meshes and specs the notebook does not. Runs in this process on 8 CPU devices (importing
``utils.xla`` asks for them before JAX starts); a few seconds of JAX compiles.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.grader.test_graded_cells import run_part, solution
from utils import xla  # noqa: F401  (asks XLA for 8 CPU devices before anything starts JAX)

LAB5 = "05_hardware_and_cost"
jax = pytest.importorskip("jax")


@pytest.fixture(scope="module")
def pod() -> dict:
    """The reference answers of the pod cells, run after the locked cells before them."""
    import jax.numpy as jnp

    from grader import checks
    from utils import tpu_pod

    devs = jax.devices("cpu")
    assert len(devs) >= tpu_pod.HOST_DEVICES, (f"JAX started with {len(devs)} CPU devices before utils.xla set "
                                               "XLA_FLAGS: run these tests in a fresh process")
    ns = {"np": np, "math": math, "jax": jax, "jnp": jnp, "checks": checks}
    for gid in ("tpu_numbers", "pod_setup"):
        solution(LAB5, gid, ns)
    return solution(LAB5, "pod_answer", ns)


def sharding_args(g: dict, **change) -> dict:
    keys = ("sharded_matmul", "DP_X", "DP_W", "TP_X", "TP_W")
    return {**{k: g[k] for k in keys}, **change}


def call_sharding(p5, args: dict) -> None:
    p5.check_pod_sharding(args["sharded_matmul"], args["DP_X"], args["DP_W"], args["TP_X"], args["TP_W"])


def test_reference_passes_both_cells(phase, pod, capsys):
    p5 = phase(5)
    for gid in ("test_pod_sharding", "test_shard_bytes"):
        run_part(LAB5, gid, "visible", pod)
        run_part(LAB5, gid, "hidden", pod)
    out = capsys.readouterr().out
    assert "sharded matmul: 3 data-parallel and 4 2D meshes" in out and "bytes per device: 11 arrays" in out
    call_sharding(p5, sharding_args(pod))
    p5.check_shard_bytes(pod["per_device_bytes"])


def test_a_matmul_that_stays_on_one_device_fails(phase, pod):
    """``jnp.matmul`` of the unplaced arrays equals x @ w, on device 0 alone."""
    import jax.numpy as jnp

    with pytest.raises(AssertionError, match=r"the result lives on devices \[0\], not on the mesh's"):
        call_sharding(phase(5), sharding_args(pod, sharded_matmul=lambda x, w, mesh, xs, ws: jnp.matmul(x, w)))


def test_a_function_tied_to_the_notebooks_mesh_passes_the_visible_test_only(phase, pod):
    """A ``sharded_matmul`` that places on ``MESH_2D`` whatever mesh it is given passes the
    visible test (which uses ``MESH_2D``) and fails on the hidden meshes."""
    from jax.sharding import NamedSharding

    mesh_2d, ref = pod["MESH_2D"], pod["sharded_matmul"]

    def notebook_mesh_only(x, w, mesh, x_spec, w_spec):
        return ref(x, w, mesh_2d, x_spec, w_spec)

    run_part(LAB5, "test_pod_sharding", "visible", {**pod, "sharded_matmul": notebook_mesh_only})
    with pytest.raises(AssertionError, match=r"lives on devices \[0, 1, 2, 3, 4, 5, 6, 7\], not on the mesh's \[0, 1, 2, 3\]"):
        call_sharding(phase(5), sharding_args(pod, sharded_matmul=notebook_mesh_only))
    assert NamedSharding  # the import the check relies on exists in this JAX


def test_wrong_specs_fail(phase, pod):
    """w split by rows instead of columns in the 2D layout (the product is still right: XLA
    gathers what it needs, so only the layout shows it); w split in data parallelism; a spec
    given as a tuple."""
    from jax.sharding import PartitionSpec as P

    p5 = phase(5)
    with pytest.raises(AssertionError, match=r"2D: the spec for w, P\('model', None\), does not lay w out as "
                                             r"P\(None, 'model'\)"):
        call_sharding(p5, sharding_args(pod, TP_W=P("model", None)))
    with pytest.raises(AssertionError, match=r"data parallel: the spec for w, P\('data', None\)"):
        call_sharding(p5, sharding_args(pod, DP_W=P("data", None)))
    with pytest.raises(AssertionError, match=r"data parallel x spec = \('data', None\) is not a jax.sharding.PartitionSpec"):
        call_sharding(p5, sharding_args(pod, DP_X=("data", None)))


def test_swapped_placement_fails(phase, pod):
    """x placed with w's spec and w with x's: the specs are right, the function is not."""
    ref = pod["sharded_matmul"]

    def swapped(x, w, mesh, x_spec, w_spec):
        return ref(x, w, mesh, w_spec, x_spec)

    with pytest.raises(AssertionError, match=r"sharded_matmul on a \{'data': 4\} mesh.*(not laid out|laid out as)"):
        call_sharding(phase(5), sharding_args(pod, sharded_matmul=swapped))


def bytes_zip(shape, itemsize, mesh_shape, spec):
    """zip(shape, spec) stops at the spec's end: the dimensions it does not reach are dropped."""
    total = itemsize
    for dim, entry in zip(shape, spec, strict=False):  # the mistake: stops at the shorter
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        total *= dim // math.prod(mesh_shape[a] for a in axes)
    return total


def bytes_first_axis(shape, itemsize, mesh_shape, spec):
    """A tuple entry split by its first axis alone."""
    total = itemsize
    for i, dim in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axis = entry if entry is None or isinstance(entry, str) else entry[0]
        total *= dim // (1 if axis is None else mesh_shape[axis])
    return total


def bytes_all_devices(shape, itemsize, mesh_shape, spec):
    """Every array split over every device, replication forgotten."""
    return math.prod(shape) * itemsize // math.prod(mesh_shape.values())


@pytest.mark.parametrize(("wrong", "visible_passes", "match"), [
    (bytes_zip, True, r"per_device_bytes\(\(32, 16\), 1, \{'x': 2, 'y': 2, 'z': 2\}, P\('z',\)\) = 16, but JAX puts 256"),
    (bytes_first_axis, True, r"per_device_bytes\(\(64, 32\), 4, \{'x': 2, 'y': 2, 'z': 2\}, P\(\('x', 'y'\), 'z'\)\) = "
                             r"2048, but JAX puts 1024"),
    (bytes_all_devices, False, r"per_device_bytes\(\(32, 16\), 1, \{'x': 2, 'y': 2, 'z': 2\}, P\('z',\)\) = 64, "
                               r"but JAX puts 256"),
])
def test_wrong_byte_counts_fail(phase, pod, wrong, visible_passes, match):
    if visible_passes:
        run_part(LAB5, "test_shard_bytes", "visible", {**pod, "per_device_bytes": wrong})
    else:
        with pytest.raises(AssertionError):
            run_part(LAB5, "test_shard_bytes", "visible", {**pod, "per_device_bytes": wrong})
    with pytest.raises(AssertionError, match=match):
        phase(5).check_shard_bytes(wrong)


def test_shard_bytes_truth_comes_from_jax_in_a_fresh_process_when_this_one_lacks_devices(monkeypatch):
    """With more devices needed than this process has, the truth is JAX's in a fresh Python."""
    from utils import tpu_pod

    case = ((16, 12), "int8", {"a": 2, "b": 4}, ("b", "a"))
    here = tpu_pod.jax_shard_bytes(*case)
    monkeypatch.setattr(jax, "devices", lambda *a: [object()])  # as if JAX had started with one CPU device
    assert tpu_pod.jax_shard_bytes_many([case]) == [here] == [[24] * 8]
