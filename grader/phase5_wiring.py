"""Phase 5's checks on how chips are wired and programmed: the slowest link of a GPU topology
(section 6) and a pod in miniature, a matmul sharded with ``jax.sharding`` over CPU devices
(section 7).

All pure or exact: the topology against :mod:`utils.topology`; the sharded matmul against the
unsharded product and the layout its specs imply, on meshes and shapes the notebook does not
show; the learner's bytes per device against what JAX itself reports for arrays it placed
(:func:`utils.tpu_pod.jax_shard_bytes_many`). Nothing is timed: CPU devices say nothing about
a pod's speed. :mod:`grader.phase5` loads this module afresh from its file and sets its
``checks`` to the fresh copy it was given (``grader/__init__.py``), so the hidden tests call
it as ``grader.phase(5).check_...``.
"""
from __future__ import annotations

from typing import Any

from grader import checks  # grader.phase5 rebinds it to its fresh copy: use it at call time only

POD_MODULES = ("utils.tpu_pod",)

# -- 6. topology --------------------------------------------------------------------------------


def _ring(codes: list[str]) -> str:
    """A topo -m matrix of len(codes)+1 GPUs: pair (i, i+1) gets codes[i], other pairs NV12."""
    n = len(codes) + 1

    def link(i: int, j: int) -> str:
        return " X " if i == j else (codes[min(i, j)] if abs(i - j) == 1 else "NV12")
    rows = ["\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity\tNUMA Affinity"]
    rows += [f"GPU{i}\t" + "\t".join(link(i, j) for j in range(n)) + "\t0-15\t0" for i in range(n)]
    return "\n".join(rows) + "\n"


def check_topology(slowest_gpu_link) -> None:
    """Exact against utils.topology on the shipped examples and built matrices."""
    from utils import topology

    texts = [t for t, _ in topology.TOPO_EXAMPLES.values()]
    texts += [_ring(["NV12", "SYS", "NV12"]), _ring(["PIX", "PXB"]), _ring(["NODE", "PHB", "NV4"]), _ring(["NV2", "NV4"])]
    for text in texts:
        topo = topology.parse_topo(text)
        got = checks.call(slowest_gpu_link, topo, name="slowest_gpu_link")
        want = topology.slowest_gpu_link(topo)
        if got != want:
            raise AssertionError(f"slowest_gpu_link on {len(topo.gpus)} GPUs linked by "
                                 f"{sorted({topo.link(a, b) for a in topo.gpus for b in topo.gpus if a != b})} = {got!r}, "
                                 f"expected {want!r}")


# -- 7. a pod in miniature ----------------------------------------------------------------------

# (x rows, inner, w columns, mesh) for each layout: shapes and meshes the notebook does not use
DP_CASES = ((20, 12, 10, {"data": 4}), (24, 6, 5, {"data": 8}), (16, 9, 3, {"data": 2}))
TWO_D_CASES = ((6, 10, 12, {"data": 2, "model": 4}), (16, 4, 6, {"data": 8, "model": 1}),
               (3, 5, 16, {"data": 1, "model": 8}), (8, 7, 4, {"data": 4, "model": 2}))
# (shape, dtype, mesh, spec entries): multi-axis entries, reversed axes, replication, short specs
BYTES_CASES = (
    ((64, 32), "float32", {"x": 2, "y": 2, "z": 2}, (("x", "y"), "z")),
    ((32, 16), "uint8", {"x": 2, "y": 2, "z": 2}, ("z",)),
    ((24, 16, 8), "bfloat16", {"data": 2, "model": 4}, (None, "model")),
    ((40, 8), "int8", {"data": 2, "model": 4}, ()),
    ((16, 64), "float32", {"data": 2, "model": 4}, ("model", "data")),
    ((32, 48), "float16", {"a": 4, "b": 2}, (None, ("b", "a"))),
    ((128,), "float32", {"data": 8}, ("data",)),
    ((6, 8, 10), "float32", {"p": 1, "q": 8}, ("p", "q")),
    ((12, 20), "int32", {"data": 4, "model": 2}, ("data",)),
    ((8, 8), "float32", {"data": 4}, ("data", None)),
    ((4, 6, 16), "bfloat16", {"data": 2, "model": 4}, (None, None, ("data", "model"))),
)


def _partition_spec(value: Any, name: str):
    from jax.sharding import PartitionSpec

    if not isinstance(value, PartitionSpec):
        raise AssertionError(f"{name} = {value!r:.80} is not a jax.sharding.PartitionSpec: write P(...) with the "
                             "mesh axis (or None) for each dimension")
    return value


def _same_layout(mesh, got, want, ndim: int) -> bool:
    from jax.sharding import NamedSharding, PartitionSpec

    try:
        return NamedSharding(mesh, got).is_equivalent_to(NamedSharding(mesh, PartitionSpec(*want)), ndim)
    except Exception:  # an axis the mesh does not have: not the layout asked for
        return False


def check_pod_sharding(sharded_matmul, dp_x, dp_w, tp_x, tp_w) -> None:
    """The specs are the layouts asked for (data parallel: rows of x over "data", w whole on
    every device; 2D: rows of x over "data", columns of w over "model"), and
    ``sharded_matmul(x, w, mesh, x_spec, w_spec)`` gives the unsharded product laid out as
    those specs imply, on every device of the mesh, for meshes and shapes the notebook does
    not use."""
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from utils import tpu_pod

    checks.assert_untampered(POD_MODULES)
    rng = np.random.default_rng(5)
    layouts = (("data parallel", dp_x, dp_w, ("data", None), (None, None), ("data", None), DP_CASES),
               ("2D", tp_x, tp_w, ("data", None), (None, "model"), ("data", "model"), TWO_D_CASES))
    for label, xs, ws, want_x, want_w, want_out, cases in layouts:
        _partition_spec(xs, f"{label} x spec")
        _partition_spec(ws, f"{label} w spec")
        for rows, inner, cols, mesh_shape in cases:
            try:
                mesh = tpu_pod.mesh(mesh_shape)
            except RuntimeError as exc:
                raise AssertionError(str(exc)) from None
            for spec, want, what in ((xs, want_x, "x"), (ws, want_w, "w")):
                if not _same_layout(mesh, spec, want, 2):
                    raise AssertionError(f"{label}: the spec for {what}, {spec}, does not lay {what} out as "
                                         f"{PartitionSpec(*want)} does on a {dict(mesh_shape)} mesh")
            x = rng.standard_normal((rows, inner), dtype=np.float32)
            w = rng.standard_normal((inner, cols), dtype=np.float32)
            out = checks.call(sharded_matmul, x, w, mesh, xs, ws, name="sharded_matmul", show_args=False)
            where = f"sharded_matmul on a {dict(mesh_shape)} mesh, x {x.shape} @ w {w.shape} ({label})"
            if not hasattr(out, "sharding") or not hasattr(out, "addressable_shards"):
                raise AssertionError(f"{where} returned {type(out).__name__}, not a JAX array")
            if tuple(out.shape) != (rows, cols) or not np.allclose(np.asarray(out), x @ w, rtol=1e-4, atol=1e-4):
                raise AssertionError(f"{where}: the result is not x @ w")
            devices = {d.id for d in out.sharding.device_set}
            if devices != {d.id for d in mesh.devices.flat}:
                raise AssertionError(f"{where}: the result lives on devices {sorted(devices)}, not on the mesh's "
                                     f"{sorted(d.id for d in mesh.devices.flat)}: place x and w with NamedSharding "
                                     "and run the matmul under jax.jit")
            if not out.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(*want_out)), 2):
                raise AssertionError(f"{where}: the result is laid out as {out.sharding}, not as "
                                     f"{PartitionSpec(*want_out)}, which x and w placed by their specs give")
    checks.say(f"  sharded matmul: {len(DP_CASES)} data-parallel and {len(TWO_D_CASES)} 2D meshes, each equal to "
               "x @ w and laid out as its specs imply")


def check_shard_bytes(per_device_bytes) -> None:
    """``per_device_bytes(shape, itemsize, mesh_shape, spec)`` equals, exactly, the bytes JAX
    puts on each device for arrays it placed, on :data:`BYTES_CASES`."""
    import numpy as np
    from jax.sharding import PartitionSpec

    from utils import tpu_pod

    checks.assert_untampered(POD_MODULES)
    truth = tpu_pod.jax_shard_bytes_many(BYTES_CASES)
    for (shape, dtype, mesh_shape, entries), per_device in zip(BYTES_CASES, truth, strict=True):
        if len(set(per_device)) != 1:  # every case divides evenly: each device holds the same
            raise AssertionError(f"JAX placed unequal shards for {shape} on {mesh_shape}: {per_device}")
        spec = PartitionSpec(*entries)
        itemsize = np.dtype(dtype).itemsize
        got = checks.call(per_device_bytes, tuple(shape), itemsize, dict(mesh_shape), spec, name="per_device_bytes")
        value = checks.as_number(got, f"per_device_bytes({shape}, {itemsize}, {mesh_shape}, {spec})")
        if value != per_device[0]:
            raise AssertionError(f"per_device_bytes({shape}, {itemsize}, {mesh_shape}, {spec}) = {value:g}, but JAX "
                                 f"puts {per_device[0]} bytes on each of the {len(per_device)} devices")
    checks.say(f"  bytes per device: {len(BYTES_CASES)} arrays, meshes and specs, each as JAX placed them")
