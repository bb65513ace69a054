"""Several GPUs: scaling efficiency, collective bandwidth as nccl-tests defines it, an
all-reduce benchmark, and the memory arithmetic of DDP, ZeRO/FSDP, tensor and pipeline
parallelism.

Bandwidth follows NVIDIA/nccl-tests ``doc/PERFORMANCE.md``: algorithm bandwidth is
``algbw = S / t`` (S bytes, t seconds, GB = 1e9 bytes as nccl-tests prints it) and bus
bandwidth multiplies it by a factor that makes it independent of the rank count n:
all-reduce ``2(n-1)/n``, reduce-scatter and all-gather ``(n-1)/n`` (S is then the total,
n times the per-rank chunk), all-to-all ``(n-1)/n``, broadcast and reduce ``1``. Bus
bandwidth is what to compare with the link: the derivation gives each rank a bandwidth
``B`` "to the outside world", i.e. what it can send in one direction, so the comparison
is with the per-direction link bandwidth (NVLink 4: 900 GB/s bidirectional per GPU, 450
GB/s each way), not the bidirectional total.

Measured here on two H200 joined by NV18 NVLink (docs/reference.md): all-reduce bus bandwidth
25 GB/s at 1 MiB, 207 at 16 MiB, 298 at 256 MiB, 327 at 1 GiB (73% of 450).
"""
from __future__ import annotations

import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NoReturn

from utils import validate

# -- scaling ------------------------------------------------------------------------------


def scaling_efficiency(throughput_n: float, throughput_1: float, n_devices: int, *, per_device: bool = False) -> float:
    """``throughput_N / (N * throughput_1)``: 1.0 is linear scaling.

    ``throughput_n`` is the total over N devices, or, with ``per_device=True``, each
    device's own throughput (torchtitan logs tokens/s per device), in which case the
    efficiency is simply ``per-device_N / throughput_1``. Example measured here (two H200,
    eager DDP, GPT-2-small shape): 194.0k tokens/s on one GPU, 192.1k per GPU on two:
    ``scaling_efficiency(192.1e3, 194.0e3, 2, per_device=True)`` = 0.990.
    """
    n = _count("n_devices", n_devices)
    t_n = _positive("throughput_n", throughput_n)
    t_1 = _positive("throughput_1", throughput_1)
    return t_n / t_1 if per_device else t_n / (n * t_1)


def communication_share(comm_time_s: float, step_time_s: float) -> float:
    """Fraction of a step spent in (exposed) communication: ``comm / step``.

    Use exposed time (what the profiler shows the GPU waiting on NCCL, or
    ``step_time_N - step_time_1`` at a fixed per-GPU batch), not the total collective time,
    which overlaps with the backward pass under DDP's bucketing."""
    comm = _non_negative("comm_time_s", comm_time_s)
    step = _positive("step_time_s", step_time_s)
    if comm > step:
        raise ValueError(f"communication time {comm:g} s exceeds the step time {step:g} s: "
                         "measure both over the same steps")
    return comm / step


def exposed_communication_s(step_time_n_s: float, step_time_1_s: float) -> float:
    """Time a step gained by going distributed at the same per-GPU batch: ``t_N - t_1``
    (clipped at zero). ``1 - scaling_efficiency`` is about this over ``t_N``."""
    return max(0.0, _positive("step_time_n_s", step_time_n_s) - _positive("step_time_1_s", step_time_1_s))


# -- bandwidth (nccl-tests) ----------------------------------------------------------------

def bus_factor(collective: str, n_ranks: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth (doc/PERFORMANCE.md)."""
    n = _count("n_ranks", n_ranks)
    key = collective.lower().replace("_", "").replace("-", "")
    if key == "allreduce":
        return 2 * (n - 1) / n
    if key in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    if key in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; use all_reduce, all_gather, reduce_scatter, "
                     "all_to_all, broadcast, reduce or sendrecv")


def algbw_gbs(n_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth ``S / t`` in GB/s (1e9 bytes/s, as nccl-tests prints)."""
    return _positive("n_bytes", n_bytes) / _positive("time_s", time_s) / 1e9


def busbw_gbs(algbw: float, n_ranks: int, collective: str = "all_reduce") -> float:
    """Bus bandwidth: ``algbw * factor`` (all-reduce: ``2(n-1)/n``)."""
    return _non_negative("algbw", algbw) * bus_factor(collective, n_ranks)


def allreduce_time_s(n_bytes: float, busbw: float, n_ranks: int) -> float:
    """Time to all-reduce ``n_bytes`` at a bus bandwidth of ``busbw`` GB/s:
    ``S * 2(n-1)/n / busbw`` (the nccl-tests relation run backwards). DDP all-reduces the
    gradients once per step: 124M bf16 gradients (248 MB) on 2 GPUs at 300 GB/s take 0.83 ms
    (arithmetic, not a measurement)."""
    return _positive("n_bytes", n_bytes) * bus_factor("all_reduce", n_ranks) / (_positive("busbw", busbw) * 1e9)


@dataclass(frozen=True)
class LinkPeak:
    name: str
    per_direction_gbs: float  # what busbw is compared with
    bidirectional_gbs: float
    source: str


# Per GPU. PCIe: per lane 8/16/32 GT/s with 128b/130b encoding, x16 (PCI-SIG specifications).
LINK_PEAKS: dict[str, LinkPeak] = {
    "nvlink4": LinkPeak("NVLink 4 (H100/H200 SXM, 18 links)", 450.0, 900.0,
                        "NVIDIA H100/H200 datasheets and NVLink page: 900 GB/s bidirectional per GPU "
                        "(the H200 pair measured here showed NV18, 18 links x 26.6 GB/s: docs/reference.md)"),
    "nvlink3": LinkPeak("NVLink 3 (A100 SXM, 12 links)", 300.0, 600.0,
                        "NVIDIA A100 datasheet: 600 GB/s bidirectional per GPU"),
    "nvlink2": LinkPeak("NVLink 2 (V100 SXM2, 6 links)", 150.0, 300.0,
                        "NVIDIA V100 datasheet: 300 GB/s bidirectional per GPU"),
    "pcie5": LinkPeak("PCIe Gen5 x16", 63.0, 126.0, "32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s each way"),
    "pcie4": LinkPeak("PCIe Gen4 x16", 31.5, 63.0, "16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s each way"),
    "pcie3": LinkPeak("PCIe Gen3 x16", 15.75, 31.5, "8 GT/s x 16 lanes x 128/130 / 8 = 15.75 GB/s each way"),
}
_LINK_BY_SPEC = {"H100-SXM": "nvlink4", "H200": "nvlink4", "A100-40GB": "nvlink3", "A100-80GB": "nvlink3",
                 "V100": "nvlink2", "H100-PCIe": "pcie5", "A100-80GB-PCIe": "pcie4", "L40S": "pcie4",
                 "L4": "pcie4", "A10": "pcie4", "T4": "pcie3", "P100": "pcie3"}


def link_peak(name: str) -> LinkPeak:
    """A link by key (``"nvlink4"``, ``"pcie4"``) or by GPU (``"H200"``, ``"NVIDIA H100 80GB
    HBM3"``): the GPU's usual GPU-to-GPU link. Whether two cards really use it (SXM boards
    do; PCIe cards may have a bridge or none) is for ``nvidia-smi topo -m`` to say."""
    if name in LINK_PEAKS:
        return LINK_PEAKS[name]
    key = _LINK_BY_SPEC.get(name)
    if key is None:
        from utils.device.hardware import spec_for_name

        spec = spec_for_name(name)
        key = _LINK_BY_SPEC.get(spec.name) if spec else None
    if key is None:
        raise ValueError(f"no link peak for {name!r}; links: {', '.join(LINK_PEAKS)}")
    return LINK_PEAKS[key]


def busbw_fraction_of_link(busbw: float, link: str) -> float:
    """Measured bus bandwidth over the link's per-direction peak."""
    return _non_negative("busbw", busbw) / link_peak(link).per_direction_gbs


# -- memory per GPU: DDP, ZeRO, FSDP, TP, PP -----------------------------------------------

_STAGES = {"ddp": 0, "no_shard": 0, "0": 0, "1": 1, "2": 2, "3": 3, "zero1": 1, "zero2": 2, "zero3": 3,
           "fsdp_shard_grad_op": 2, "shard_grad_op": 2, "fsdp_full_shard": 3, "full_shard": 3}


def memory_per_gpu(n_params: int, n_devices: int, stage: int | str = "ddp", *, optimizer_bytes_per_param: float = 12,
                   param_bytes: float = 2, grad_bytes: float = 2) -> dict[str, float]:
    """Model-state memory per GPU (weights, gradients, optimizer state; no activations),
    exactly as the ZeRO paper counts it (Rajbhandari et al. 2020, "ZeRO: Memory
    Optimizations Toward Training Trillion Parameter Models", arXiv 1910.02054, section 5
    and figure 1). With ``Psi`` parameters, ``K`` optimizer bytes per parameter (12 for
    mixed-precision Adam: fp32 master weights, momentum, variance) and ``N_d`` devices:

    - DDP (stage 0): ``2 Psi + 2 Psi + K Psi`` = 16 Psi
    - stage 1 (optimizer states sharded): ``4 Psi + K Psi / N_d``
    - stage 2 (+ gradients sharded): ``2 Psi + (2 + K) Psi / N_d``
    - stage 3 (+ parameters sharded): ``(4 + K) Psi / N_d``

    The paper's example, 7.5B parameters on 64 GPUs: 120, 31.4, 16.6 and 1.9 GB. PyTorch
    FSDP's ``SHARD_GRAD_OP`` and ``FULL_SHARD`` are accepted as stages 2 and 3: the same
    asymptotic sharding, though FSDP also holds the unsharded parameters of the unit it is
    computing (not counted here). Returns bytes (``weights_bytes``, ``gradients_bytes``,
    ``optimizer_bytes``, ``total_bytes``) and ``total_gb`` (1e9 bytes, as the paper).
    """
    psi = Fraction(_count("n_params", n_params))
    nd = Fraction(_count("n_devices", n_devices))
    key = str(stage).lower()
    if key not in _STAGES:
        raise ValueError(f"unknown stage {stage!r}; use ddp, 1, 2, 3, fsdp_shard_grad_op or fsdp_full_shard")
    s = _STAGES[key]
    k = Fraction(str(_non_negative("optimizer_bytes_per_param", optimizer_bytes_per_param)))
    p = Fraction(str(_non_negative("param_bytes", param_bytes)))
    g = Fraction(str(_non_negative("grad_bytes", grad_bytes)))
    weights = p * psi / (nd if s >= 3 else 1)
    grads = g * psi / (nd if s >= 2 else 1)
    opt = k * psi / (nd if s >= 1 else 1)
    total = weights + grads + opt
    return {"weights_bytes": float(weights), "gradients_bytes": float(grads), "optimizer_bytes": float(opt),
            "total_bytes": float(total), "total_gb": float(total / 10**9), "stage": s}


def tensor_parallel_weight_bytes(weight_bytes: float, tp: int) -> float:
    """Weights per GPU under tensor parallelism of degree ``tp``: ``weights / tp`` (Megatron
    splits each linear layer's matrix; the small replicated norms and biases are ignored)."""
    return _non_negative("weight_bytes", weight_bytes) / _count("tp", tp)


def pipeline_layers_per_stage(n_layers: int, pp: int) -> list[int]:
    """Layers on each of ``pp`` pipeline stages, as even as possible (the first stages take
    the remainder): 30 layers on 4 stages -> [8, 8, 7, 7]."""
    layers, stages = _count("n_layers", n_layers), _count("pp", pp)
    if stages > layers:
        raise ValueError(f"pipeline degree {stages} exceeds the {layers} layers: each stage needs a layer")
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def parallel_weight_bytes_per_gpu(n_params: int, n_layers: int, *, tp: int = 1, pp: int = 1,
                                  bytes_per_param: float = 2) -> float:
    """Weights on the busiest GPU with tensor degree ``tp`` and pipeline degree ``pp``,
    assuming equal layers that hold all parameters: ``n_params * bytes * (max layers per
    stage / n_layers) / tp``. 70B in bf16 (140 GB), 80 layers, tp=8: 17.5 GB per GPU;
    tp=4, pp=2: also 17.5 GB, over 40 layers per stage."""
    per_stage = max(pipeline_layers_per_stage(n_layers, pp))
    total = Fraction(_count("n_params", n_params)) * Fraction(str(_positive("bytes_per_param", bytes_per_param)))
    return float(total * per_stage / n_layers / _count("tp", tp))


# -- the all-reduce benchmark --------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "k": 2**10, "m": 2**20, "g": 2**30}


def parse_size_bytes(text: str) -> int:
    """``"16MiB"`` -> 16777216; ``"1GiB"``, ``"4KiB"``, ``"1MB"`` (10**6), ``"4096"``.
    Bare K/M/G are binary, as in nccl-tests' ``-b 1M``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read the size {text!r}: write e.g. 1MiB, 256MiB, 1GiB or a number of bytes")
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if n < 1 or n != int(n):
        raise ValueError(f"size {text!r} is not a whole, positive number of bytes")
    return int(n)


def _torch_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = names.get(str(dtype).lower().removeprefix("torch."), str(dtype).lower().removeprefix("torch."))
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return dt


def allreduce_benchmark(sizes_bytes, iters: int = 20, warmup: int = 5, dtype: Any = "float32", device: Any = None, *,
                        group: Any = None, rank_reduce: str = "max") -> list[dict]:
    """Time ``torch.distributed.all_reduce`` at each size; call it on every rank of an
    initialised process group (NCCL on GPUs, gloo on CPU). Returns, on every rank, one row
    per size: ``bytes``, ``time_us``, ``algbw_gbs``, ``busbw_gbs`` (nccl-tests' definitions,
    GB = 1e9 bytes), plus ``time_us_rank_min``/``time_us_rank_max``, ``iters``, ``n_ranks``.

    Each rank times every iteration and takes its median; ``time_us`` is the maximum of
    the ranks' medians (``rank_reduce="max"``: a collective is done when its slowest rank
    is) or their mean (``"mean"``). nccl-tests itself times the whole loop with a host
    clock and by default averages over ranks (``-a 1``; ``-a 3`` takes the maximum).

    On CUDA each iteration is bracketed by CUDA events on the current stream (which waits
    for NCCL's stream), launched back to back so the ranks stay in step; on CPU gloo's
    all_reduce blocks, and a barrier before each timed call lines the ranks up for
    ``time.perf_counter``. Hand-written rather than ``utils.measure.timing.benchmark`` because a
    collective needs the same number of calls on every rank, so adaptive stopping cannot
    be decided per rank.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("allreduce_benchmark needs an initialised process group: run it under torchrun "
                           "after torch.distributed.init_process_group (see benchmarks/allreduce.py)")
    if rank_reduce not in ("max", "mean"):
        raise ValueError(f"rank_reduce must be 'max' or 'mean', got {rank_reduce!r}")
    iters, warmup = _count("iters", iters), int(_non_negative("warmup", warmup))
    dt = _torch_dtype(dtype)
    itemsize = torch.empty((), dtype=dt).element_size()
    sizes = [int(s) for s in sizes_bytes]
    for s in sizes:
        if s < itemsize or s % itemsize:
            raise ValueError(f"size {s} bytes is not a positive multiple of the {dt} element size ({itemsize} bytes)")
    n = dist.get_world_size(group)
    if device is None:
        backend = dist.get_backend(group)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    rows = []
    for size in sizes:
        buf = torch.zeros(size // itemsize, dtype=dt, device=device)  # values do not change the speed
        for _ in range(warmup):
            dist.all_reduce(buf, group=group)
        times_s = _time_allreduce(buf, iters, group, on_cuda, device)
        median = statistics.median(times_s)
        total = torch.tensor([median], dtype=torch.float64, device=device)
        extremes = torch.tensor([median, -median], dtype=torch.float64, device=device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
        mean_s, max_s, min_s = total.item() / n, extremes[0].item(), -extremes[1].item()
        t = max_s if rank_reduce == "max" else mean_s
        alg = algbw_gbs(size, t)
        rows.append({"bytes": size, "time_us": t * 1e6, "algbw_gbs": alg, "busbw_gbs": busbw_gbs(alg, n),
                     "time_us_rank_min": min_s * 1e6, "time_us_rank_max": max_s * 1e6,
                     "iters": iters, "n_ranks": n})
        del buf
        if on_cuda:
            torch.cuda.empty_cache()
    return rows


def _time_allreduce(buf, iters: int, group, on_cuda: bool, device) -> list[float]:
    """Seconds per all_reduce call, one per iteration (clocks looked up at call time)."""
    import torch
    import torch.distributed as dist

    if on_cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        torch.cuda.synchronize(device)
        for start, end in events:
            start.record()
            dist.all_reduce(buf, group=group)
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) / 1e3 for s, e in events]
    out = []
    for _ in range(iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        out.append(time.perf_counter() - t0)
    return out


# -- validation ----------------------------------------------------------------------------

_positive = validate.positive
_non_negative = validate.non_negative


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


# -- leaving a launched rank ----------------------------------------------------------------


def exit_without_teardown(code: int) -> NoReturn:
    """End a rank that ``torchrun`` or ``accelerate launch`` started, skipping the interpreter's teardown.

    gloo's worker threads can still hold tensors when Python shuts down, and freeing them then aborts the
    process ("terminate called without an active exception", SIGABRT), after every result was written:
    pytorch/pytorch#179291. Here it took a rank of ``utils.parallel.zero_memory`` 1 launch in 25 and a rank of
    ``benchmarks/train_multi_gpu.py --compile`` in a CI run. Call it from the ``__main__`` block only, after
    ``main()`` returned: output is flushed first, but atexit handlers do not run.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
