"""How GPUs are wired: ``nvidia-smi topo -m``, NCCL's view of it, and what InfiniBand adds.

``nvidia-smi topo -m`` prints a matrix of the path between every pair of devices (GPUs and
NICs). Its legend, fastest first: ``NV#`` (a bonded set of # NVLinks), ``PIX`` (at most one
PCIe bridge), ``PXB`` (several PCIe bridges, no host bridge), ``PHB`` (through a PCIe host
bridge, typically the CPU), ``NODE`` (between host bridges inside one NUMA node), ``SYS``
(across the SMP interconnect between NUMA nodes, QPI/UPI; older drivers printed ``SOC``). A
ring all-reduce moves every byte over every hop, so it runs at the speed of its slowest hop:
one ``SYS`` pair in an otherwise NVLinked ring sets the pace.

NCCL builds its own graph of the same machine and, with ``NCCL_DEBUG=INFO`` (and
``NCCL_DEBUG_SUBSYS=INIT,GRAPH``), logs it with a bandwidth per link in GB/s
(``NVL[370.8]``, ``PCI[24.0]``, ``NET[25.0]``) and the channels it picked.

Off one machine, traffic leaves through the NICs: one 400 Gb/s NDR InfiniBand port moves
50 GB/s each way, against 450 GB/s per direction of NVLink 4 inside an H100/H200 node, so
the inter-node hop becomes the slowest link of any collective that spans nodes
(:data:`NETWORK_LINKS`).

Real outputs ship here (:data:`TOPO_EXAMPLES`, :data:`NCCL_EXAMPLE`) for machines without
GPUs, each with the page it was copied from; more, as users pasted them, are the test fixtures
in ``tests/data/topo/``. Hand-written parsing: the format is a whitespace table with no
machine-readable variant.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# Fastest first; NV# ranks above all of these, more links faster.
PATH_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = {
    "X": "self",
    "NV#": "a bonded set of # NVLinks",
    "PIX": "at most a single PCIe bridge",
    "PXB": "multiple PCIe bridges, without the PCIe host bridge",
    "PHB": "PCIe and a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between PCIe host bridges within a NUMA node",
    "SYS": "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI)",
    "SOC": "older drivers' name for SYS (their legend: 'the SMP link between CPU sockets')",
}
# Codes that older drivers printed for a path PATH_ORDER names differently.
ALIASES = {"SOC": "SYS"}


@dataclass(frozen=True)
class NetworkLink:
    name: str
    per_direction_gbs: float
    source: str


NETWORK_LINKS = {
    "ib-hdr": NetworkLink("InfiniBand HDR, one 4x port (200 Gb/s)", 25.0,
                          "InfiniBand Trade Association roadmap: HDR 200 Gb/s per 4x port; / 8 bits per byte"),
    "ib-ndr": NetworkLink("InfiniBand NDR, one 4x port (400 Gb/s)", 50.0,
                          "InfiniBand Trade Association roadmap: NDR 400 Gb/s per 4x port; NVIDIA ConnectX-7 "
                          "datasheet (up to 400 Gb/s); / 8 bits per byte"),
}

_HF_DOC = ("huggingface/transformers docs/source/performance.md (commit 04e9ffa9), 'Multi-GPU Connectivity': "
           "'On a machine with dual-GPU and which are connected with NVLink'")
_NCCL_1453 = ("NVIDIA/nccl issue #1453 'Poor NCCL allreduce performance', comment by twichell, 2024-09-19 "
              "(8x NVIDIA H100 80GB HBM3); the GPU rows only, the NIC rows omitted")
TOPO_EXAMPLES: dict[str, tuple[str, str]] = {
    "2x NVLink (NV2)": (textwrap.dedent("""\
                GPU0    GPU1    CPU Affinity    NUMA Affinity
        GPU0     X      NV2     0-23            N/A
        GPU1    NV2      X      0-23            N/A
        """), _HF_DOC),
    "2x PCIe (PHB)": (textwrap.dedent("""\
                GPU0    GPU1    CPU Affinity    NUMA Affinity
        GPU0     X      PHB     0-11            N/A
        GPU1    PHB      X      0-11            N/A
        """), _HF_DOC.replace("'On a machine with dual-GPU and which are connected with NVLink'",
                              "'on a different machine w/o NVLink'")),
    "8x H100 SXM (NV18) + 9 NICs": ("\n".join([
        "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tNIC4\tNIC5\tNIC6\tNIC7\tNIC8"
        "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tPIX\t0-79\t0\t\tN/A",
        "GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\tNODE\t0-79\t0\t\tN/A",
        "GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tNODE\tPIX\tNODE\tNODE\t0-79\t0\t\tN/A",
        "GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\tSYS\tPIX\tNODE\tNODE\tNODE\t0-79\t0\t\tN/A",
        "GPU4\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tSYS\tNODE\tNODE\tNODE\tPIX\tSYS\tSYS\tSYS\tSYS\t80-159\t1\t\tN/A",
        "GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tSYS\tNODE\tNODE\tPIX\tNODE\tSYS\tSYS\tSYS\tSYS\t80-159\t1\t\tN/A",
        "GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tSYS\tNODE\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t80-159\t1\t\tN/A",
        "GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tSYS\tPIX\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t80-159\t1\t\tN/A",
        ""]), _NCCL_1453),
}

NCCL_EXAMPLE = ("\n".join([
    "nathan-h100-1:11902:11975 [7] NCCL INFO CPU/1 (1/1/2)",
    "nathan-h100-1:11902:11975 [7] NCCL INFO + PCI[24.0] - PCI/82000 (10b5879610b58796)",
    "nathan-h100-1:11902:11975 [7] NCCL INFO               + PCI[24.0] - GPU/84000 (4)",
    "nathan-h100-1:11902:11975 [7] NCCL INFO                             + NVL[370.8] - NVS/0",
    "nathan-h100-1:11902:11975 [7] NCCL INFO               + PCI[24.0] - GPU/85000 (5)",
    "nathan-h100-1:11902:11975 [7] NCCL INFO                             + NVL[370.8] - NVS/0",
    "nathan-h100-1:11902:11975 [7] NCCL INFO               + PCI[24.0] - NIC/86000",
    "nathan-h100-1:11902:11975 [7] NCCL INFO                             + NET[25.0] - NET/5 (5/0/25.000000)",
]), "NVIDIA/nccl issue #1519 'Unable to use multiple NICs' (an 8x H100 node), an excerpt of its NCCL_DEBUG=INFO log")

# Device names as nvidia-smi prints them in the header: GPUs, NICs (newer drivers, with a "NIC Legend"
# mapping NIC# to mlx5_#), or the RDMA device names older drivers used as column names.
_DEVICE = re.compile(r"GPU\d+|NIC\d+|mlx\d+_\d+|NVME\d+|CPU\d+")
_GPU = re.compile(r"GPU\d+")
# Path codes of a topo -m cell. SOC is what older drivers printed for SYS.
_CODE = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC")
# Underline codes around the header when nvidia-smi writes to a terminal (ESC[4m ... ESC[0m); pasted
# from a terminal the ESC byte is often lost and "[4m" stays in the text.
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[\d+(?:;\d+)*m")
_AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


@dataclass
class Topology:
    """A parsed ``nvidia-smi topo -m``: device names in column order, the path code of every
    ordered pair (``links[("GPU0", "GPU1")] == "NV18"``), and each GPU row's CPU/NUMA affinity
    (a GPU whose field nvidia-smi left blank is absent, as in vllm-project/vllm issue #19607)."""

    devices: list[str]
    links: dict[tuple[str, str], str]
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        try:
            return self.links[(a, b)]
        except KeyError:
            raise KeyError(f"no link {a} -> {b} in the matrix; devices: {', '.join(self.devices)}") from None


def _unglue(token: str, pattern: re.Pattern) -> list[str] | None:
    """``["NODE", "NODE"]`` for ``"NODENODE"``: a token that is wholly a run of ``pattern``, else None.
    Real pastes have a column printed without its separator (``NIC8NIC9`` in the header, ``NODEPXB``
    in the rows: vllm-project/vllm issue #13855) and a header that lost its tabs
    (``GPU0GPU1...GPU7mlx5_0``: a DGX-1 lab page of RSE-Sheffield)."""
    parts = pattern.findall(token)
    return parts if parts and "".join(parts) == token else None


def _header_devices(line: str) -> tuple[list[str], list[str]] | None:
    """(device names, affinity column labels) if ``line`` is the matrix header, else None."""
    cut = line.find("CPU Affinity")
    head = line.split() if cut < 0 else line[:cut].split()
    devices: list[str] = []
    for tok in head:
        parts = [tok] if _DEVICE.fullmatch(tok) else _unglue(tok, _DEVICE)
        if parts is None:
            if cut < 0:  # without "CPU Affinity" only known device names make a header
                return None
            parts = [tok]  # another NIC name an old driver used as a column (hfi1_0, bnxt_re0, ...)
        devices += parts
    if not devices or not _GPU.fullmatch(devices[0]):
        return None
    return devices, [label for label in _AFFINITY if cut >= 0 and label in line[cut:]]


def _items(line: str) -> tuple[list[str], bool]:
    """The cells of a row. Tab-separated rows keep a blank field as ``""`` (a blank affinity);
    text inside a field that has spaces (mixed separators) is split further."""
    if "\t" not in line:
        return line.split(), False
    items = []
    for f in line.split("\t"):
        items += f.split() or [""]
    while items and not items[0]:
        items.pop(0)
    return items, True


def _affinity(tail: list[str], labels: list[str], tabbed: bool) -> dict[str, str]:
    """Map the fields after the path codes to the header's affinity labels. nvidia-smi leaves a field
    blank when it has no value; with tabs the blank is seen, with spaces only the count is known:
    then the GPU NUMA ID (always printed, N/A when unknown) is the last value, the rest go in order."""
    values = [v for v in tail if v]
    if len(values) >= len(labels):
        return dict(zip(labels, values, strict=False))  # extra text after the last column is ignored
    out = {}
    rest = list(labels)
    if values and "GPU NUMA ID" in rest:
        rest.remove("GPU NUMA ID")
        out["GPU NUMA ID"] = values.pop()
    if tabbed and tail and not tail[0] and rest and rest[0] == "CPU Affinity":
        rest.pop(0)
    out.update(zip(rest, values, strict=False))
    return out


def parse_topo(text: str) -> Topology:
    """Parse the matrix part of ``nvidia-smi topo -m`` as users paste it; raise a one-line ValueError
    saying what is wrong when the text holds no complete matrix.

    The header is the first line that names devices (``GPU0``, ``NIC3``, ``mlx5_0`` ...) before
    ``CPU Affinity``; each device row then has one path code per column and GPU rows end with their
    CPU affinity, NUMA affinity and, on newer drivers, GPU NUMA ID. Tolerated, because real pastes
    have them: tabs, spaces or both; indentation; shell prompts and other text around the matrix;
    terminal underline codes; a column printed without its separator; ``SOC`` (older drivers' SYS);
    blank affinity fields. The matrix ends at the first line that is not a row (``Legend:``), so a
    ``topo -p2p`` matrix pasted after it is not read. Every GPU named in the header needs its row; NIC
    rows may be left out. Hand-written: the format is a whitespace table with no machine-readable
    variant."""
    lines = [_ANSI.sub("", ln) for ln in str(text).splitlines()]
    shown = next((ln.strip() for ln in lines if ln.strip()), "")
    if not shown:
        raise ValueError("the topology text is empty: pass what `nvidia-smi topo -m` prints on the GPU machine")
    start = next(((i, h) for i, ln in enumerate(lines) if (h := _header_devices(ln))), None)
    if start is None:
        raise ValueError(f"no nvidia-smi topo -m header (a line naming GPU0 GPU1 ... before CPU Affinity) in text "
                         f"that begins {shown[:70]!r}: pass the full output of `nvidia-smi topo -m` run on a "
                         f"machine with NVIDIA GPUs")
    index, (devices, labels) = start
    links: dict[tuple[str, str], str] = {}
    cpu, numa = {}, {}
    for ln in lines[index + 1:]:
        items, tabbed = _items(ln)
        if not items:
            continue
        row = items[0]
        if row not in devices or (row, row) in links:
            break  # end of the matrix: the legend, or a second matrix (topo -p2p) with the same names
        codes: list[str] = []
        rest = items[1:]
        while rest and len(codes) < len(devices):
            cell = rest.pop(0)
            if cell:
                codes += _unglue(cell, _CODE) or [cell]
        if len(codes) != len(devices):
            raise ValueError(f"row {row} has {len(codes)} entries for {len(devices)} devices: {ln.strip()[:80]!r}; "
                             f"the row is cut off or merged: paste the output of `nvidia-smi topo -m` unchanged")
        for col, code in zip(devices, codes, strict=True):
            if not _CODE.fullmatch(code):
                raise ValueError(f"row {row}, column {col} holds {code!r}, not a path code (X, NV#, PIX, PXB, PHB, "
                                 f"NODE, SYS): the row is cut or shifted, or this is not `nvidia-smi topo -m` output")
            links[(row, col)] = code
        if links[(row, row)] != "X":
            raise ValueError(f"row {row} has {links[(row, row)]!r} on its diagonal where X belongs: the columns "
                             f"are shifted; paste the output of `nvidia-smi topo -m` unchanged")
        values = _affinity(rest, labels, tabbed)
        if "CPU Affinity" in values:
            cpu[row] = values["CPU Affinity"]
        if "NUMA Affinity" in values:
            numa[row] = values["NUMA Affinity"]
    missing = [g for g in devices if _GPU.fullmatch(g) and (g, g) not in links]
    if missing:
        what = "no device rows" if not links else f"no row for {', '.join(missing)}"
        raise ValueError(f"the topology text has a header but {what}: the matrix is cut off; paste the whole "
                         f"output of `nvidia-smi topo -m`")
    return Topology(devices, links, cpu, numa)


def nvlinks(code: str) -> int:
    """Number of NVLinks in a path code (``NV18`` -> 18), 0 for any PCIe path."""
    m = re.fullmatch(r"NV(\d+)", code.strip())
    return int(m.group(1)) if m else 0


def path_rank(code: str) -> float:
    """A sortable speed rank: higher is faster (``NV#`` by link count above every PCIe path);
    ``SOC`` ranks as ``SYS``, the name newer drivers give the same path."""
    code = code.strip()
    if code == "X":
        return float("inf")
    n = nvlinks(code)
    if n:
        return 100.0 + n
    code = ALIASES.get(code, code)
    if code not in PATH_ORDER:
        raise ValueError(f"unknown path code {code!r}; known: NV#, {', '.join(PATH_ORDER)}, X (and SOC, old SYS)")
    return float(len(PATH_ORDER) - PATH_ORDER.index(code))


def slowest_gpu_link(topo: Topology) -> str:
    """The slowest path between any two GPUs: what a ring over all of them runs at."""
    gpus = topo.gpus
    if len(gpus) < 2:
        raise ValueError("fewer than two GPUs: there is no GPU-to-GPU link")
    return min((topo.link(a, b) for a in gpus for b in gpus if a != b), key=path_rank)


def nvlink_pairs(topo: Topology) -> dict[tuple[int, int], int]:
    """``{(i, j): links}`` for every GPU pair ``i < j`` joined by NVLink."""
    out = {}
    for a in topo.gpus:
        for b in topo.gpus:
            i, j = int(a[3:]), int(b[3:])
            if i < j and nvlinks(topo.link(a, b)):
                out[(i, j)] = nvlinks(topo.link(a, b))
    return out


def nvidia_smi_topo(timeout_s: float = 20.0) -> str | None:
    """This machine's ``nvidia-smi topo -m``, or None where there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


_NCCL_PROBE = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def nccl_info_lines(timeout_s: float = 120.0) -> list[str] | None:
    """NCCL's ``INFO`` lines from a one-rank all-reduce on GPU 0 (``NCCL_DEBUG=INFO``,
    ``NCCL_DEBUG_SUBSYS=INIT,GRAPH``), in a child process; None without CUDA or on failure.

    NVLink multicast (NVLS) is switched off, as on any shared host (docs/reference.md)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    env = {**os.environ, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH", "NCCL_NVLS_ENABLE": "0",
           "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1", "CUDA_VISIBLE_DEVICES":
           os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([sys.executable, "-c", _NCCL_PROBE, str(Path(tmp) / "store")], env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "NCCL INFO" in ln]
    return lines if proc.returncode == 0 and lines else None
