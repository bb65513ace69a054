"""TPU pods and systolic arrays in numbers, and a pod programmed in miniature: ``jax.sharding``
over several CPU devices.

**Systolic arrays.** A TPU TensorCore multiplies matrices in MXUs: "An MXU is composed of 128 x
128 multiply-accumulators in a systolic array ... capable of performing 16K multiply-accumulate
operations per cycle" (Google Cloud, TPU system architecture,
https://cloud.google.com/tpu/docs/system-architecture-tpu-vm). One multiply-accumulate is two
FLOPs, so a chip's peak is ``MXUs x rows x cols x 2 x clock``. :data:`TPU_CHIPS` holds each
generation's datasheet figures (MXUs, array size, bf16 peak, pod size, ICI topology and
bandwidth) with the page they come from; Google's pages give no clock, so
:func:`implied_clock_ghz` derives the clock the datasheet peak implies: an estimate, labelled so.
The bf16 peaks of v5e and v6e are :data:`utils.capacity.accelerators.ACCELERATORS`'s rows, not copies.

**A pod in miniature.** JAX programs a pod as one program over a ``jax.sharding.Mesh`` of
devices with named axes; ``NamedSharding(mesh, PartitionSpec(...))`` says which array
dimension is split over which mesh axes, and ``jax.jit`` compiles the program for that layout
(XLA's SPMD partitioner inserts the collectives). XLA's host platform can pretend to be N
devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, read once, when JAX starts
its CPU backend (JAX docs, "Introduction to parallel programming"). :func:`request_host_devices`
sets it (``utils/tpu/xla.py`` calls it on import, before any notebook cell starts JAX);
:func:`host_devices` hands out the CPU devices, with a one-line error when JAX started with
fewer. Timing on CPU devices says nothing about a pod: this module reads layouts and bytes.

**Bytes per device.** :func:`jax_shard_bytes` asks JAX itself (each addressable shard's
``data.nbytes``); :func:`jax_shard_bytes_many` does so for many cases, in a fresh Python
process when this one started JAX with too few CPU devices.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from utils.capacity.accelerators import ACCELERATORS

HOST_DEVICES = 8  # CPU devices the lab's mesh uses: a 2 x 4 slice is enough to show every layout
FLAG = "--xla_force_host_platform_device_count"
FLOPS_PER_MAC = 2  # a multiply and an add

_SYSARCH = "https://cloud.google.com/tpu/docs/system-architecture-tpu-vm (128 x 128 MXU, 16K MACs per cycle)"


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation, datasheet figures per chip (per pod where the name says so)."""

    name: str
    tensorcores: int
    mxus_per_core: int
    mxu_rows: int
    mxu_cols: int
    bf16_tflops: float  # datasheet peak per chip, dense
    pod_chips: int
    topology: str  # the ICI topology of a pod
    ici_gbs_bidir: float | None  # bidirectional inter-chip interconnect bandwidth per chip, GB/s
    source: str

    @property
    def mxus(self) -> int:
        return self.tensorcores * self.mxus_per_core

    @property
    def macs_per_cycle(self) -> int:
        return self.mxus * self.mxu_rows * self.mxu_cols


TPU_CHIPS: dict[str, TpuChip] = {c.name: c for c in (
    TpuChip("TPU v4", 2, 4, 128, 128, 275.0, 4096, "3D torus (3D mesh, configurable as a torus)", None,
            "https://cloud.google.com/tpu/docs/v4 (two TensorCores of four MXUs; 275 TFLOP/s bf16; 4096 chips; "
            "3D mesh/torus); Jouppi et al., TPU v4, ISCA 2023, arXiv 2304.01433; " + _SYSARCH),
    TpuChip("TPU v5e", 1, 4, 128, 128, ACCELERATORS["tpu-v5e"].bf16_tflops, 256, "2D torus", 400.0,
            "https://cloud.google.com/tpu/docs/v5e (one TensorCore of four MXUs; 256 chips; 2D torus; "
            "400 GB/s ICI, 4 ports); bf16 peak from utils.capacity.accelerators; " + _SYSARCH),
    TpuChip("TPU v5p", 2, 4, 128, 128, 459.0, 8960, "3D torus", 1200.0,
            "https://cloud.google.com/tpu/docs/v5p (four MXUs per TensorCore, two TensorCores; 459 TFLOP/s bf16; "
            "8960 chips; 3D torus; 1200 GB/s ICI); " + _SYSARCH),
)}


def systolic_peak_tflops(mxus: int, rows: int, cols: int, clock_ghz: float) -> float:
    """Peak TFLOP/s of ``mxus`` systolic arrays of ``rows x cols`` MACs at ``clock_ghz``:
    every MAC does one multiply-add (2 FLOPs) per cycle."""
    for name, v in (("mxus", mxus), ("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(clock_ghz, (int, float)) or not clock_ghz > 0 or math.isinf(clock_ghz):
        raise ValueError(f"clock_ghz must be a positive number, got {clock_ghz!r}")
    return mxus * rows * cols * FLOPS_PER_MAC * clock_ghz * 1e9 / 1e12


def implied_clock_ghz(chip: TpuChip) -> float:
    """The clock at which ``chip``'s MXUs reach its datasheet bf16 peak: an estimate (the pages
    state no clock), and a check that the MXU count and the peak agree."""
    return chip.bf16_tflops * 1e12 / (chip.macs_per_cycle * FLOPS_PER_MAC) / 1e9


# -- CPU devices standing in for a pod's chips -------------------------------------------------

def _backend_started() -> bool:
    """Whether JAX has already created its backends (then XLA_FLAGS is read and fixed)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge  # private (JAX 0.10): where JAX keeps its started backends

        started = getattr(xla_bridge, "backends_are_initialized", None)
        return bool(started()) if started else bool(getattr(xla_bridge, "_backends", True))
    except Exception:  # another JAX layout: assume started, so nothing is promised
        return True


def request_host_devices(n: int = HOST_DEVICES) -> bool:
    """Ask XLA's host platform for ``n`` CPU devices (``XLA_FLAGS``), unless a device count is
    already set there or JAX has started: True if the flag now asks for it. Call before JAX starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    if FLAG in flags:
        return bool(re.search(rf"{FLAG}={n}\b", flags))
    if _backend_started():
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}={n}".strip()
    return True


def host_devices(n: int = HOST_DEVICES) -> list:
    """The first ``n`` of JAX's CPU devices (on a GPU or TPU machine too: the CPU backend sits
    beside the accelerator). RuntimeError in one line when JAX started with fewer."""
    import jax

    devs = jax.devices("cpu")
    if len(devs) < n:
        raise RuntimeError(f"JAX has {len(devs)} CPU device(s), the lab needs {n}: JAX started before "
                           f"XLA_FLAGS asked for them; restart the kernel and run the cells from the top "
                           f"(importing utils.tpu.xla sets {FLAG}={n} before JAX starts)")
    return list(devs[:n])


def mesh(shape: Mapping[str, int]):
    """A ``jax.sharding.Mesh`` of the first CPU devices, axes named and sized by ``shape``."""
    import numpy as np
    from jax.sharding import Mesh

    sizes = tuple(shape.values())
    return Mesh(np.asarray(host_devices(math.prod(sizes)), dtype=object).reshape(sizes), tuple(shape))


def spec_entries(spec: Any) -> tuple:
    """A PartitionSpec (or a sequence of its entries) as a tuple of entries: None, an axis
    name, or a tuple of axis names."""
    return tuple(tuple(e) if isinstance(e, (list, tuple)) else e for e in spec)


def layout(arr) -> list[dict]:
    """How a sharded array is laid out: per device, the slice of the global array it holds
    (as ``(start, stop)`` per dimension), the shard's shape and bytes (``addressable_shards``)."""
    rows = []
    for s in sorted(arr.addressable_shards, key=lambda s: s.device.id):
        index = tuple((sl.start or 0, dim if sl.stop is None else sl.stop) for sl, dim in zip(s.index, arr.shape, strict=True))
        rows.append({"device": s.device.id, "index": index, "shape": tuple(s.data.shape), "bytes": int(s.data.nbytes)})
    return rows


def jax_shard_bytes(shape: Sequence[int], dtype: str, mesh_shape: Mapping[str, int], spec: Any) -> list[int]:
    """Bytes each device holds of a ``dtype`` array of ``shape`` placed by ``spec`` on a mesh
    of ``mesh_shape``: JAX's own answer, from an array it placed (device order)."""
    import numpy as np
    from jax import device_put
    from jax.sharding import NamedSharding, PartitionSpec

    m = mesh(mesh_shape)
    arr = device_put(np.zeros(tuple(shape), dtype=dtype), NamedSharding(m, PartitionSpec(*spec_entries(spec))))
    return [row["bytes"] for row in layout(arr)]


def _as_json(case: tuple) -> list:
    shape, dtype, mesh_shape, spec = case
    return [list(shape), str(dtype), [[k, v] for k, v in mesh_shape.items()],
            [list(e) if isinstance(e, tuple) else e for e in spec_entries(spec)]]


def _from_json(item: list) -> tuple:
    shape, dtype, mesh_pairs, spec = item
    return tuple(shape), dtype, dict(mesh_pairs), tuple(tuple(e) if isinstance(e, list) else e for e in spec)


def jax_shard_bytes_many(cases: Sequence[tuple], timeout_s: float = 120.0) -> list[list[int]]:
    """:func:`jax_shard_bytes` for each ``(shape, dtype, mesh_shape, spec)`` case: here when
    this process has the CPU devices, else in a fresh Python with ``XLA_FLAGS`` set."""
    need = max(math.prod(c[2].values()) for c in cases)
    request_host_devices(max(need, HOST_DEVICES))  # does nothing once JAX has started
    import jax

    if len(jax.devices("cpu")) >= need:
        return [jax_shard_bytes(*c) for c in cases]
    env = {**os.environ, "XLA_FLAGS": f"{FLAG}={max(need, HOST_DEVICES)}", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "utils.tpu.tpu_pod", "--shard-bytes"], input=json.dumps([_as_json(c) for c in cases]),
                          capture_output=True, text=True, timeout=timeout_s, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"python -m utils.tpu.tpu_pod --shard-bytes failed (exit {proc.returncode}): {tail}")
    return json.loads(proc.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m utils.tpu.tpu_pod --shard-bytes`` reads cases as JSON on stdin and prints each
    case's per-device bytes as JSON (what :func:`jax_shard_bytes_many` runs in a fresh process)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--shard-bytes"]:
        print("usage: python -m utils.tpu.tpu_pod --shard-bytes < cases.json", file=sys.stderr)
        return 2
    cases = [_from_json(item) for item in json.loads(sys.stdin.read())]
    print(json.dumps([jax_shard_bytes(*c) for c in cases]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
