"""utils.device.topology.parse_topo against `nvidia-smi topo -m` outputs that people posted (tests/data/topo/).

Each fixture's first line is ``# source: <url>``; the rest is the text as stored in the public copy
(where that copy is cut, the fixture ends at the last whole line). The facts asserted below were read
off each matrix by eye, not produced by the parser. Bad input must fail with a one-line ValueError.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from utils.device import topology

DATA = Path(__file__).parent.parent / "data" / "topo"


def _load(name: str) -> str:
    first, text = (DATA / name).read_text(encoding="utf-8").split("\n", 1)
    assert first.startswith("# source: https://github.com/"), f"{name}: first line must name its source"
    return text


def _gpus(n: int) -> list[str]:
    return [f"GPU{i}" for i in range(n)]


def _nics(n: int, prefix: str = "NIC") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


# name -> devices (header order), links ((row, column, code) read off the matrix), CPU and NUMA
# affinity of some GPUs (None: the field is blank and must be absent), slowest GPU-GPU path, NVLink
# pairs (a dict, or (count, {links per pair}) for big machines).
CASES: dict[str, dict] = {
    # 8x RTX 4090, tabs, GPU NUMA ID column, two NICs behind GPU6: every GPU pair crosses sockets.
    "go_gpuallocator_17_8x4090_sys.txt": dict(
        devices=_gpus(8) + _nics(2),
        links=[("GPU0", "GPU7", "SYS"), ("GPU6", "NIC0", "PHB"), ("GPU6", "NIC1", "PHB"), ("GPU7", "NIC0", "SYS"),
               ("NIC0", "NIC1", "PIX"), ("NIC1", "GPU6", "PHB")],
        cpu={"GPU3": "0-55,112-167", "GPU4": "56-111,168-223"}, numa={"GPU0": "0", "GPU7": "1"},
        slowest="SYS", pairs={}),
    # 4x H100 NV6 with a NIC per GPU, tabs expanded to spaces, CPU affinity lists of single cores.
    "nccl_1617_4xh100_nv6_nics.txt": dict(
        devices=_gpus(4) + _nics(4),
        links=[("GPU0", "GPU3", "NV6"), ("GPU2", "NIC2", "PIX"), ("GPU2", "NIC0", "SYS"), ("NIC3", "GPU3", "PIX"),
               ("NIC0", "NIC1", "SYS")],
        cpu={"GPU1": "4,12,20,28"}, numa={"GPU2": "7", "GPU3": "5"},
        slowest="NV6", pairs=(6, {6})),
    # 2x RTX 3090 across sockets; GPU0's NUMA affinity is N/A.
    "club3090_178_2x3090_sys_numa_na.txt": dict(
        devices=_gpus(2), links=[("GPU0", "GPU1", "SYS"), ("GPU1", "GPU0", "SYS")],
        cpu={"GPU0": "0-7,16-23", "GPU1": "8-15,24-31"}, numa={"GPU0": "N/A", "GPU1": "1"},
        slowest="SYS", pairs={}),
    # 2x RTX 5090 under one host bridge; a `topo -p2p rw` matrix (GNS) follows in the same paste.
    "club3090_1229_2x5090_phb_then_p2p.txt": dict(
        devices=_gpus(2), links=[("GPU0", "GPU1", "PHB"), ("GPU1", "GPU0", "PHB")],
        cpu={"GPU0": "0-63", "GPU1": "0-63"}, numa={"GPU1": "0"}, slowest="PHB", pairs={}),
    # 5 consumer GPUs: PHB pairs, NODE between them, GPU0 alone on the other socket.
    "club3090_46_5gpu_sys_phb_node.txt": dict(
        devices=_gpus(5),
        links=[("GPU0", "GPU4", "SYS"), ("GPU1", "GPU2", "PHB"), ("GPU1", "GPU3", "NODE"), ("GPU3", "GPU4", "PHB"),
               ("GPU2", "GPU4", "NODE")],
        cpu={"GPU0": "8-15,24-31", "GPU2": "0-7,16-23"}, numa={"GPU0": "1", "GPU4": "0"},
        slowest="SYS", pairs={}),
    # Indented paste, legend lines wrapped, then a `topo -p2p` matrix (NS) with the same device names.
    "club3090_1125_indented_wrapped_then_p2p.txt": dict(
        devices=_gpus(2), links=[("GPU0", "GPU1", "NODE"), ("GPU1", "GPU0", "NODE")],
        cpu={"GPU0": "0-15", "GPU1": "0-15"}, numa={"GPU0": "0"}, slowest="NODE", pairs={}),
    # 4x RTX 3090 as two NVLink-bridged pairs (NV4), PCIe between the pairs.
    "open_gpu_kernel_modules_pr18_4x3090_nv4_pairs.txt": dict(
        devices=_gpus(4),
        links=[("GPU0", "GPU2", "NV4"), ("GPU1", "GPU3", "NV4"), ("GPU0", "GPU1", "PHB"), ("GPU0", "GPU3", "NODE"),
               ("GPU2", "GPU3", "PHB")],
        cpu={"GPU3": "0-23"}, numa={"GPU0": "0"}, slowest="NODE", pairs={(0, 2): 4, (1, 3): 4}),
    # 8x H100 NV18 with 12 NICs; the NIC8 column has no separator ("NIC8NIC9", "NODENODE", "NODEPXB").
    "vllm_13855_8xh100_nv18_glued_nic8.txt": dict(
        devices=_gpus(8) + _nics(12),
        links=[("GPU0", "NIC0", "PXB"), ("GPU1", "NIC3", "PXB"), ("GPU4", "NIC6", "PXB"), ("GPU4", "NIC8", "NODE"),
               ("GPU4", "NIC9", "NODE"), ("GPU5", "NIC8", "NODE"), ("GPU5", "NIC9", "PXB"), ("GPU6", "NIC10", "PXB"),
               ("GPU7", "NIC11", "PXB"), ("GPU0", "NIC11", "SYS"), ("GPU3", "GPU7", "NV18")],
        cpu={"GPU0": "0-55,112-167", "GPU4": "56-111,168-223", "GPU7": "56-111,168-223"},
        numa={"GPU3": "0", "GPU5": "1"}, slowest="NV18", pairs=(28, {18})),
    # 4x Tesla K40m, an old driver: SOC for the cross-socket path, mlx4_0 as a column, no NUMA column.
    "tensorflow_gdr_readme_4xk40m_soc.txt": dict(
        devices=_gpus(4) + ["mlx4_0"],
        links=[("GPU0", "GPU1", "PHB"), ("GPU0", "GPU2", "SOC"), ("GPU3", "mlx4_0", "PHB"), ("mlx4_0", "GPU0", "SOC")],
        cpu={"GPU1": "0-5", "GPU2": "6-11"}, numa={}, slowest="SOC", pairs={}),
    # DGX-1 (P100): hybrid cube mesh of single NVLinks, SOC elsewhere; the header lost its tabs.
    "sheffield_dgx1_8xp100_nv1_glued_header.txt": dict(
        devices=_gpus(8) + ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"],
        links=[("GPU0", "GPU4", "NV1"), ("GPU0", "GPU5", "SOC"), ("GPU1", "GPU5", "NV1"), ("GPU0", "mlx5_0", "PIX"),
               ("GPU0", "mlx5_1", "PHB"), ("GPU4", "mlx5_2", "PIX"), ("mlx5_3", "GPU7", "PIX")],
        cpu={"GPU7": "1-1"}, numa={}, slowest="SOC", pairs=(16, {1})),
    # Polaris A100 node: header not indented, its last separators are spaces; mlx5_* columns.
    "polaris_4xa100_nv4_mixed_separators.txt": dict(
        devices=_gpus(4) + ["mlx5_0", "mlx5_1"],
        links=[("GPU1", "mlx5_1", "PHB"), ("GPU3", "mlx5_0", "PHB"), ("GPU0", "mlx5_0", "SYS"),
               ("mlx5_1", "GPU1", "PHB"), ("GPU0", "GPU3", "NV4")],
        cpu={"GPU0": "24-31,56-63", "GPU3": "0-7,32-39"}, numa={"GPU0": "3", "GPU1": "2", "GPU3": "0"},
        slowest="NV4", pairs=(6, {4})),
    # 3x RTX A6000: one NVLink-bridged pair, the third card on PCIe (NODE).
    "siboehm_bench_3xa6000_nv4_node.txt": dict(
        devices=_gpus(3), links=[("GPU0", "GPU1", "NV4"), ("GPU0", "GPU2", "NODE"), ("GPU2", "GPU1", "NODE")],
        cpu={"GPU2": "0-31,64-95"}, numa={"GPU1": "0"}, slowest="NODE", pairs={(0, 1): 4}),
    # One V100 in a VM, an old driver: CPU Affinity only.
    "cifar_testbed_1xv100_single_gpu.txt": dict(
        devices=_gpus(1), links=[("GPU0", "GPU0", "X")], cpu={"GPU0": "0-5"}, numa={}, slowest=None, pairs={}),
    # vLLM collect_env: 2 GPUs NV12 + 8 NICs; CPU and NUMA affinity blank, only the GPU NUMA ID (N/A).
    "vllm_19607_2xgpu_nv12_blank_affinity.txt": dict(
        devices=_gpus(2) + _nics(8),
        links=[("GPU0", "GPU1", "NV12"), ("GPU0", "NIC6", "PXB"), ("GPU1", "NIC7", "PXB"), ("GPU0", "NIC0", "SYS"),
               ("NIC0", "NIC1", "PIX"), ("NIC6", "NIC7", "PIX"), ("NIC7", "GPU1", "PXB")],
        cpu={"GPU0": None, "GPU1": None}, numa={"GPU0": None}, slowest="NV12", pairs={(0, 1): 12}),
    # DGX A100 without NVLink in the matrix (PXB pairs), an older driver naming mlx5_* columns, NUMA "6-7".
    "ucx_py_749_dgxa100_mlx5_columns_no_nvlink.txt": dict(
        devices=_gpus(8) + _nics(12, "mlx5_"),
        links=[("GPU0", "GPU1", "PXB"), ("GPU0", "GPU2", "SYS"), ("GPU6", "GPU7", "PXB"), ("GPU0", "mlx5_0", "PXB"),
               ("GPU2", "mlx5_2", "PXB"), ("GPU4", "mlx5_6", "PXB"), ("GPU7", "mlx5_9", "PXB"),
               ("GPU7", "mlx5_11", "SYS"), ("mlx5_0", "mlx5_1", "PXB")],
        cpu={"GPU5": "112-127,240-255"}, numa={"GPU0": "6-7"}, slowest="SYS", pairs={}),
    # Slurm allocation of 2 A100s with 10 NICs (rows of NIC3.. cut in the stored copy).
    "dask_cuda_1358_2xa100_nv12_10nics.txt": dict(
        devices=_gpus(2) + _nics(10),
        links=[("GPU0", "GPU1", "NV12"), ("GPU0", "NIC0", "PXB"), ("GPU1", "NIC1", "PXB"), ("GPU0", "NIC2", "SYS"),
               ("NIC2", "NIC3", "PXB"), ("NIC0", "NIC1", "PXB")],
        cpu={"GPU1": "48-63,176-191"}, numa={"GPU0": "3"}, slowest="NV12", pairs={(0, 1): 12}),
}


def test_every_fixture_has_facts():
    assert sorted(p.name for p in DATA.glob("*.txt")) == sorted(CASES)
    assert len(CASES) >= 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_output(name):
    case = CASES[name]
    topo = topology.parse_topo(_load(name))
    assert topo.devices == case["devices"]
    assert topo.gpus == [d for d in case["devices"] if d.startswith("GPU")]
    for a, b, code in case["links"]:
        assert topo.link(a, b) == code, (a, b)
    for table, want in ((topo.cpu_affinity, case["cpu"]), (topo.numa_affinity, case["numa"])):
        for gpu, value in want.items():
            assert table.get(gpu) == value, gpu
        assert set(table) <= set(topo.gpus)  # NIC rows carry no affinity
    if not case["numa"]:
        assert topo.numa_affinity == {}
    for g in topo.gpus:  # every GPU has its row, X on the diagonal, and the matrix is symmetric
        assert topo.link(g, g) == "X"
        assert all(topo.link(g, h) == topo.link(h, g) for h in topo.gpus)
    pairs = topology.nvlink_pairs(topo)
    if isinstance(case["pairs"], tuple):
        count, links = case["pairs"]
        assert len(pairs) == count and set(pairs.values()) == links
    else:
        assert pairs == case["pairs"]
    if case["slowest"] is None:
        with pytest.raises(ValueError, match="fewer than two GPUs"):
            topology.slowest_gpu_link(topo)
    else:
        slowest = topology.slowest_gpu_link(topo)
        assert slowest == case["slowest"]
        # NVLink vs PCIe vs across sockets, as the course ranks them
        assert (topology.nvlinks(slowest) > 0) == slowest.startswith("NV")
        assert (topology.path_rank(slowest) == topology.path_rank("SYS")) == (slowest in ("SYS", "SOC"))


def test_soc_is_the_old_name_of_sys():
    order = ["NV18", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert sorted(order, key=topology.path_rank, reverse=True) == order
    assert topology.path_rank("SOC") == topology.path_rank("SYS") < topology.path_rank("NODE")


def test_terminal_codes_and_windows_line_ends_change_nothing():
    """On a terminal nvidia-smi underlines the header (ESC[4m ... ESC[0m); pasted, the ESC byte is
    often lost. Built from a real fixture by adding what a terminal adds (no stored capture with the
    codes was found): the parse must equal the plain one. CRLF is what a Windows editor saves."""
    text = _load("go_gpuallocator_17_8x4090_sys.txt")
    header, rest = text.split("\n", 1)
    plain = topology.parse_topo(text)
    for variant in ("\t\x1b[4m" + header.lstrip("\t") + "\x1b[0m\n" + rest,
                    "\t[4m" + header.lstrip("\t") + "[0m\n" + rest,
                    text.replace("\n", "\r\n")):
        assert topology.parse_topo(variant) == plain


def _matrix_of(name: str) -> str:
    """The fixture up to the line before 'Legend:'."""
    return _load(name).split("\nLegend:")[0] + "\n"


BAD = {
    "empty": ("", "empty"),
    "blank lines": ("  \n\t\n", "empty"),
    "command not found": ("bash: nvidia-smi: command not found", "command not found"),
    "no devices": ("No devices were found", "No devices were found"),
    "no driver": ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                  "the latest NVIDIA driver is installed and running.", "no nvidia-smi topo -m header"),
    "legend only": ("Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect "
                    "between NUMA nodes (e.g., QPI/UPI)\n  NV#  = Connection traversing a bonded set of # NVLinks\n",
                    "no nvidia-smi topo -m header"),
    # vLLM's collect_env has been seen to print the GPU rows without their header
    "rows without header": ("GPU0\t X \tNV4\t0-23\t0\t\tN/A\nGPU1\tNV4\t X \t0-23\t0\t\tN/A\n",
                            "no nvidia-smi topo -m header"),
    "header only": (_matrix_of("siboehm_bench_3xa6000_nv4_node.txt").split("\n")[1], "no device rows"),
    "truncated matrix": ("\n".join(_matrix_of("go_gpuallocator_17_8x4090_sys.txt").split("\n")[:6]),
                         "no row for GPU5, GPU6, GPU7"),
    "row cut mid-line": (_matrix_of("nccl_1617_4xh100_nv6_nics.txt").replace(
        "GPU3    NV6     NV6     NV6      X      SYS     SYS     SYS     PIX     5,13,21,29      5               N/A",
        "GPU3    NV6     NV6     NV6   "), "row GPU3 has 3 entries for 8 devices"),
    "p2p matrix only": (" \tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n", "'GNS', not a path code"),
    "shifted row": (_matrix_of("siboehm_bench_3xa6000_nv4_node.txt").replace(
        "GPU1\tNV4\t X \tNODE", "GPU1\tNV4\tNODE\t X "), "diagonal"),
    "row lost a cell": (_matrix_of("siboehm_bench_3xa6000_nv4_node.txt").replace(
        "GPU1\tNV4\t X \tNODE", "GPU1\tNV4\tNODE"), "'0-31,64-95', not a path code"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_value_error(case):
    text, match = BAD[case]
    with pytest.raises(ValueError, match=match) as err:
        topology.parse_topo(text)
    message = str(err.value)
    assert "\n" not in message and "nvidia-smi" in message and len(message) < 300


def test_shipped_examples_still_parse_the_same():
    for name, (text, _) in topology.TOPO_EXAMPLES.items():
        topo = topology.parse_topo(text)
        assert topo.link("GPU0", "GPU1") == {"2x NVLink (NV2)": "NV2", "2x PCIe (PHB)": "PHB"}.get(name, "NV18")
        assert set(topo.cpu_affinity) == set(topo.gpus)


# -- the shipped examples, path ranking and NCCL's lines ------------------------------------------

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
