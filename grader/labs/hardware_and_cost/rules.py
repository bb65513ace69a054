"""Lab 05's rules and hidden cases: what the judges compute expected values with, and the cases each
check draws from the grading run's secret seed (``Check.calls``: ``cases(rng, ctx)``).

The draws cover each rule's edges: intensities far either side of every ridge, jobs that finish and
jobs that never do, measurements mostly fixed cost or mostly memory time, bucket sets with lengths on,
past and beyond their buckets, ``nvidia-smi topo -m`` matrices with NICs slower than every GPU link,
meshes with axis names and orders the notebook does not use, specs with tuple entries, short specs
and replication. The rules are the notebook's (the price the table gives a device, the SLO and
demand, the candidates, a sharded array's layout and bytes per device), computed here with the
course's functions where it has them. Nothing here runs learner code.
"""
from __future__ import annotations

import atexit
import math
import shutil
import tempfile
from dataclasses import asdict

import numpy as np

from grader.labs.hardware_and_cost.reference import run_config
from utils.capacity import cost
from utils.device import topology
from utils.device.hardware import SPECS, GpuSpec
from utils.serving.inference import estimate_tpot_ms

HARNESS = "grader.labs.hardware_and_cost.harness"
FALLBACK_GPU = "T4"  # a device without a price row is priced as a T4 hour (a label, not a measurement)
SLO_FACTOR, DEMAND_FACTOR = 1.25, 10  # the notebook's SLO and demand (rightsize_setup)
DTYPES = ("bf16", "fp16", "tf32", "fp32")
PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nvidia-smi topo -m's PCIe and SMP path codes
AXIS_NAMES = (("data", "model"), ("batch", "tensor"), ("rows", "cols"), ("x", "y"), ("dp", "tp"), ("a", "b"))
_RUN_DIRS: list[str] = []  # the interrupted runs' folders, removed when the grading process ends
atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in _RUN_DIRS])


def _log_uniform(rng, lo: float, hi: float) -> float:
    return 10 ** rng.uniform(math.log10(lo), math.log10(hi))


# -- the notebook's rules ----------------------------------------------------------------------------------

def priced_gpus() -> dict:
    """``{spec name: (GpuSpec, cheapest on-demand $/GPU-hour)}`` for every card in both tables: the
    notebook's ``PRICED``."""
    rows = {p.gpu for p in cost.PRICES}
    return {name: (spec, cost.gpu_price_usd_per_hour(name)) for name, spec in SPECS.items() if name in rows}


def device_price(ctx) -> tuple[str, float]:
    """``(row, $/GPU-hour)`` for the device: its own row, else the T4's (the notebook's ``MY_GPU``)."""
    priced = priced_gpus()
    name = ctx.spec.name if ctx.spec is not None and ctx.spec.name in priced else FALLBACK_GPU
    return name, priced[name][1]


def my_bandwidth_gbs(ctx, copy_gbs: float) -> float:
    """The bandwidth the estimate scales from: the datasheet's on a GPU in the table, else the
    learner's measured copy."""
    spec = ctx.spec
    return float(spec.bandwidth_gbs) if ctx.device == "cuda" and spec is not None and spec.bandwidth_gbs \
        else float(copy_gbs)


def slo_and_demand(decode: dict) -> tuple[float, float]:
    """The notebook's SLO and demand from the learner's decode numbers (3 significant digits)."""
    batches = sorted(decode)
    mid = batches[len(batches) // 2]
    return (float(f"{SLO_FACTOR * decode[mid]['tpot_ms']:.3g}"),
            float(f"{DEMAND_FACTOR * decode[batches[-1]]['tokens_per_s']:.3g}"))


def reference_candidates(decode: dict, my_bw: float, nbytes: float, ctx) -> list:
    """Every priced card at every measured batch size: TPOT from the course's estimate, throughput
    ``batch / TPOT``, ``"measured"`` for the learner's own card."""
    mine = ctx.spec.name if ctx.device == "cuda" and ctx.spec is not None else None
    out = []
    for gpu, (spec, usd) in priced_gpus().items():
        for b in sorted(decode):
            t = estimate_tpot_ms(decode[b]["tpot_ms"], nbytes, my_bw, spec.bandwidth_gbs)
            out.append(cost.Candidate(f"{gpu} b{b}", usd, b * 1e3 / t, t, "measured" if gpu == mine else "estimated"))
    return out


def roof(spec: dict, intensity: float, dtype: str) -> float:
    """The roofline of a spec's fields (``asdict(GpuSpec)``): min(peak, intensity x bandwidth), TFLOP/s."""
    return min(spec[f"{dtype}_tflops"], intensity * spec["bandwidth_gbs"] / 1e3)


def expected_layout(mesh: dict, shape: tuple, out_spec: list) -> list:
    """Per device of the mesh (the first CPU devices, in mesh order), the ``[start, stop)`` of each
    dimension it holds of an array of ``shape`` laid out by ``out_spec`` (None or one axis per dimension)."""
    sizes = list(mesh.values())
    rows = []
    for dev, coords in enumerate(np.ndindex(*sizes)):
        where = dict(zip(mesh, coords, strict=True))
        index = []
        for dim, axis in zip(shape, out_spec, strict=True):
            if axis is None:
                index.append([0, dim])
            else:
                block = dim // mesh[axis]
                index.append([where[axis] * block, (where[axis] + 1) * block])
        rows.append({"device": dev, "index": index})
    return rows


def layout_of(spec: tuple, mesh: dict, ndim: int) -> tuple | None:
    """A spec's layout on ``mesh``, comparable between specs: per dimension the mesh axes of size > 1
    that split it (None for an axis the mesh does not have, or a spec longer than the array)."""
    if len(spec) > ndim:
        return None
    out = []
    for e in tuple(spec) + (None,) * (ndim - len(spec)):
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        if any(x not in mesh for x in axes):
            return None
        out.append(tuple(x for x in axes if mesh[x] > 1))
    return tuple(out)


def expected_shard_bytes(shape, itemsize: int, mesh: dict, entries) -> int:
    """Bytes one device holds: each dimension split by the product of the axes its entry names (whole
    for None and past the spec's end); the axes the spec does not name copy the array."""
    total = itemsize
    for d, dim in enumerate(shape):
        e = entries[d] if d < len(entries) else None
        axes = [] if e is None else [e] if isinstance(e, str) else e
        total *= dim // math.prod(mesh[a] for a in axes)
    return total


# -- the hidden cases, drawn from the grading run's secret seed ---------------------------------------

def _spec_arg(spec: GpuSpec) -> dict:
    return {"__build__": "utils.device.hardware:GpuSpec", "kwargs": asdict(spec)}


def _drawn_spec(rng) -> GpuSpec:
    peaks = {d: round(_log_uniform(rng, 5.0, 3000.0), 1) for d in DTYPES}
    return GpuSpec(f"card-{rng.randrange(10**6)}", "gpu", peaks["bf16"], peaks["fp16"], peaks["tf32"], peaks["fp32"],
                   round(rng.uniform(8, 192)), round(_log_uniform(rng, 100.0, 10000.0)), "", "drawn by the grader")


def speedup_cases(rng, ctx) -> list:
    """Specs from the course's table and drawn ones, intensities from far left of every ridge to far right."""
    table = list(SPECS.values())
    out = []
    while len(out) < 24:
        dtype = rng.choice(DTYPES)
        a, b = (rng.choice(table) if rng.random() < 0.4 else _drawn_spec(rng) for _ in range(2))
        if not (a.peak_tflops(dtype) and b.peak_tflops(dtype) and a.bandwidth_gbs and b.bandwidth_gbs):
            continue
        out.append([_log_uniform(rng, 0.05, 1e5), _spec_arg(a), _spec_arg(b), dtype])
    return out


def rate_cases(rng, ctx) -> list:
    return [[_log_uniform(rng, 0.01, 1e7), round(rng.uniform(0.05, 120.0), 4)] for _ in range(12)]


def spot_cases(rng, ctx) -> list:
    """Jobs that finish and jobs that never do (preemptions outpace the checkpoints), none within a
    hair of the boundary except one exactly on it (which never finishes)."""
    out = [[rng.uniform(1, 200), round(rng.uniform(0.5, 8), 3), 1.0, 0.0, 0.5, 1.0]]
    while len(out) < 30:
        tau = _log_uniform(rng, 0.05, 20.0)
        delta = rng.choice([0.0, _log_uniform(rng, 1e-4, 0.5)])
        restart = rng.choice([0.0, rng.uniform(0.0, 1.0)])
        lam = rng.choice([0.0, _log_uniform(rng, 1e-3, 5.0)])
        if abs(1 - lam * (tau / 2 + restart)) < 1e-3:
            continue
        out.append([rng.uniform(0.5, 1000.0), round(rng.uniform(0.1, 100.0), 4), tau, delta, restart, lam])
    return out


def estimate_cases(rng, ctx) -> list:
    """Measurements mostly fixed cost, mostly memory time, and below the memory time (the fixed part is 0)."""
    out = []
    for _ in range(24):
        nbytes, mine = _log_uniform(rng, 1e5, 1e11), _log_uniform(rng, 5.0, 10000.0)
        memory_ms = nbytes / (mine * 1e9) * 1e3
        measured = memory_ms * rng.choice([_log_uniform(rng, 0.1, 0.99), _log_uniform(rng, 1.01, 1000.0)])
        out.append([measured, nbytes, mine, _log_uniform(rng, 5.0, 10000.0)])
    return out


def victim_cases(rng, ctx) -> list:
    """The interrupted run: the notebook's run config, stopped after a step drawn here (any step from
    the first checkpoint to the one before the last), writing to a folder of the grader's that the
    resumed run is then given (each sandbox works in a folder of its own)."""
    cfg = run_config(ctx.sizes, ctx.device)
    run_dir = tempfile.mkdtemp(prefix="gpulab-resume-")
    _RUN_DIRS.append(run_dir)
    return [[rng.randint(cfg.checkpoint_every, cfg.steps - 1), run_dir, asdict(cfg)]]


def overhead_cases(rng, ctx) -> list:
    return [[_log_uniform(rng, 0.01, 1e5), _log_uniform(rng, 0.1, 1e4), rng.randint(1, 1000)] for _ in range(12)]


def bucket_cases(rng, ctx) -> list:
    """Sorted bucket sets of 2 to 7 lengths; each bucket, one past it, lengths between, 0, and one
    past the largest (no bucket holds it: ValueError)."""
    out = []
    for _ in range(5):
        buckets = sorted(rng.sample(range(1, 5000), rng.randint(2, 7)))
        ns = {0, buckets[-1] + rng.randint(1, 100)} | set(buckets) | {b + 1 for b in buckets[:-1]}
        ns |= {rng.randint(1, buckets[-1]) for _ in range(3)}
        out += [[n, {"__tuple__": buckets}] for n in sorted(ns)]
    return out


def topo_text(rng) -> str:
    """An ``nvidia-smi topo -m`` matrix: 2 to 8 GPUs joined by NVLink bonds and PCIe paths (SOC for SYS
    as older drivers print it, in some), NICs beside them whose own links may be the slowest of all."""
    n, nics = rng.randint(2, 8), rng.choice([0, 0, 1, 2, 4])
    devices = [f"GPU{i}" for i in range(n)] + [f"NIC{j}" for j in range(nics)]
    nv = [f"NV{k}" for k in rng.sample(range(1, 19), rng.randint(1, 3))]
    pcie = rng.sample(PATHS, rng.randint(0, 3))
    soc = rng.random() < 0.2
    links = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            if b.startswith("NIC"):
                code = rng.choice(PATHS)
            else:
                code = rng.choice(nv + pcie) if pcie and rng.random() < 0.5 else rng.choice(nv)
            links[a, b] = links[b, a] = "SOC" if soc and code == "SYS" else code
    head = "\t" + "\t".join(devices) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [head]
    for a in devices:
        codes = "\t".join(" X " if a == b else links[a, b] for b in devices)
        rows.append(f"{a}\t{codes}" + ("\t0-31\t0\t\tN/A" if a.startswith("GPU") else ""))
    rows += ["", "Legend:", "", "  X    = Self", "  SYS  = Connection traversing PCIe as well as the SMP interconnect"]
    if nics:
        rows += ["", "NIC Legend:", ""] + [f"  NIC{j}: mlx5_{j}" for j in range(nics)]
    return "\n".join(rows) + "\n"


def topology_cases(rng, ctx) -> list:
    """Matrices drawn here, and the real ones the course ships (``topology.TOPO_EXAMPLES``), in drawn order."""
    texts = [topo_text(rng) for _ in range(16)] + [t for t, _ in topology.TOPO_EXAMPLES.values()
                                                   if len(topology.parse_topo(t).gpus) > 1]
    rng.shuffle(texts)
    return [[{"__build__": "utils.device.topology:parse_topo", "args": [t]}] for t in texts]


def _mesh_sizes(rng) -> tuple[int, int]:
    return rng.choice([(2, 1), (1, 2), (2, 2), (4, 2), (2, 4), (8, 1), (1, 8), (4, 1), (2, 3), (3, 2)])


def sharded_cases(rng, ctx) -> list:
    """Data-parallel and 2D layouts on meshes of 2 to 8 CPU devices with axis names and order drawn
    here, arrays of small whole numbers (exact float32 products) whose split dimensions divide."""
    out = []
    for i in range(8):
        first, second = rng.choice(AXIS_NAMES)
        two_d = i % 2 == 1
        if two_d:
            sa, sb = _mesh_sizes(rng)
            mesh = {first: sa, second: sb} if rng.random() < 0.6 else {second: sb, first: sa}
            x_spec, w_spec = [first, None], [None, second]
        else:
            sa = rng.choice([2, 4, 8])
            mesh = {first: sa} if rng.random() < 0.6 else {first: sa, second: rng.choice([1, 2]) if sa < 8 else 1}
            x_spec, w_spec = [first, None], [None, None]
        rows = mesh[first] * rng.randint(1, 4)
        inner = rng.randint(1, 12)
        cols = (mesh.get(second, 1) if two_d else 1) * rng.randint(1, 4) * rng.choice([1, 2])
        x = [[rng.randint(-4, 4) for _ in range(inner)] for _ in range(rows)]
        w = [[rng.randint(-4, 4) for _ in range(cols)] for _ in range(inner)]
        out.append([x, w, mesh, x_spec, w_spec])
    return out


def shard_bytes_cases(rng, ctx) -> list:
    """Meshes of 1 to 3 axes (up to 8 devices, axes of size 1 included), arrays of 1 to 3 dimensions and
    1 to 8 bytes per element, specs that split a dimension over one axis or a tuple of axes, leave
    dimensions whole (None or past a short spec) and copy the array over the axes they do not name."""
    pool = ["data", "model", "x", "y", "z", "pipe", "expert", "seq"]
    out = []
    while len(out) < 24:
        names = rng.sample(pool, rng.randint(1, 3))
        sizes = [rng.choice([1, 2, 2, 4, 8]) for _ in names]
        if math.prod(sizes) > 8:
            continue
        mesh = dict(zip(names, sizes, strict=True))
        ndim = rng.randint(1, 3)
        free = list(names)
        rng.shuffle(free)
        entries = []
        for _ in range(rng.randint(0, ndim)):
            kind = rng.random()
            if kind < 0.3 or not free:
                entries.append(None)
            elif kind < 0.75 or len(free) < 2:
                entries.append(free.pop())
            else:
                entries.append([free.pop(), free.pop()])
        shape = []
        for d in range(ndim):
            e = entries[d] if d < len(entries) else None
            axes = [] if e is None else [e] if isinstance(e, str) else e
            shape.append(math.prod(mesh[a] for a in axes) * rng.randint(1, 6))
        out.append([{"__tuple__": shape}, rng.choice([1, 2, 4, 8]), mesh,
                    {"__build__": f"{HARNESS}:partition_spec", "args": entries}])
    return out

