"""Inference accelerators beyond the course's GPUs, their prices, and the cheapest one for a TPOT SLO.

Three parts, one question (where could this model be served more cheaply?):

* :data:`ACCELERATORS`: one row per chip. Every number is a vendor figure with its source and
  the date it was read (``as_of``); a figure no source gave is None and the row's ``note``
  says so. Peaks are dense (no sparsity) unless the field says ``sparse``. L4 and L40S take
  their 16-bit peak, memory and bandwidth from :data:`utils.device.hardware.SPECS`.
* :data:`ACCELERATOR_PRICES`: dated on-demand prices as :class:`utils.capacity.cost.GpuPrice` rows,
  **prices change: dated, check before use** (:data:`utils.capacity.cost.PRICES_LABEL`). The L4 row is
  the g6.xlarge row of :data:`utils.capacity.cost.PRICES`, not a copy.
* :func:`cheapest_for_slo`: scale a measured decode TPOT to each candidate by memory
  bandwidth, keep those that meet the SLO and hold the model, and price the monthly volume.

Units are in the names: ``_tflops`` TFLOP/s, ``_tops`` tera-operations/s, ``_gb`` decimal GB,
``_gbs`` decimal GB/s, ``_w`` watts, ``_ms`` milliseconds, ``_usd_per_hour`` US dollars an hour.

``python -m utils.capacity.accelerators --markdown`` prints the tables of docs/inference-hardware.md;
``--write-doc`` rewrites that section of the doc (a test checks the two agree).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from utils import validate
from utils.capacity.cost import PRICES, PRICES_LABEL, GpuPrice, gpus_needed
from utils.device.hardware import SPECS, spec_for_name

HOURS_PER_MONTH = 730.0  # 8760 hours a year / 12, the convention of cloud price calculators
DOC = Path(__file__).resolve().parents[2] / "docs" / "inference-hardware.md"
BEGIN = "<!-- accelerator-tables: written by `python -m utils.capacity.accelerators --write-doc`; edit utils/capacity/accelerators.py, not this -->"
END = "<!-- /accelerator-tables -->"
READ_ON = "2026-12-02"  # the day the stored copies of the vendor pages below were read


@dataclass(frozen=True)
class Accelerator:
    key: str  # the name cheapest_for_slo and the price rows use
    name: str
    vendor: str
    bf16_tflops: float | None  # dense 16-bit (bf16/fp16) peak
    fp8_tflops: float | None  # dense
    int8_tops: float | None  # dense
    int8_tops_sparse: float | None  # with 2:4 structured sparsity, where only that is stated
    memory_gb: float | None  # per chip, as the source states it (see note where GiB)
    bandwidth_gbs: float | None  # memory bandwidth per chip
    power_w: float | None
    formats: tuple[str, ...]  # low-precision formats the vendor documents
    engines: tuple[str, ...]  # serving engines whose own documentation names this chip
    source: str
    as_of: str
    note: str = ""


# -- sources ----------------------------------------------------------------------------------

_NEURON = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/"
_INF2_SRC = (_NEURON + "general/arch/neuron-hardware/inferentia2.html (chip); "
             "aws-neuron/aws-neuron-sdk general/arch/neuron-hardware/inf2-arch.rst (Inf2 sizes); "
             "about-neuron/arch/neuron-features/data-types.rst and neuron-hardware/neuron-core-v2.rst (formats)")
_TRN1_SRC = (_NEURON + "general/arch/neuron-hardware/trainium.html (chip); "
             "aws-neuron/aws-neuron-sdk about-neuron/arch/neuron-features/data-types.rst (formats)")
_TRN2_SRC = ("aws-neuron/aws-neuron-sdk about-neuron/arch/neuron-hardware/trainium2.rst (chip); "
             "general/arch/neuron-hardware/trn2-arch.rst (trn2 instance); "
             + _NEURON + "about-neuron/arch/neuron-hardware/neuron-core-v3.html (formats)")
_TPU_V5E_SRC = "https://cloud.google.com/tpu/docs/v5e (Key chip specifications)"
_TPU_V6E_SRC = "https://docs.cloud.google.com/tpu/docs/v6e (System architecture)"
_L4_SRC = ("utils.device.hardware.SPECS['L4'] (NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/); "
           "sparse INT8 and 72 W from the same datasheet as transcribed by grokipedia.com/page/NVIDIA_L4_vs_L40S "
           "and store.sourcecode.com")
_L40S_SRC = ("utils.device.hardware.SPECS['L40S'] (NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/); "
             "FP8 and 350 W from the same datasheet's table as transcribed by mullet.se (product 355414)")
_ADA_FORMATS_SRC = ("TensorRT-LLM support matrix 0.18.2, Precision: 'Ada Lovelace (SM89) - FP32, FP16, BF16, FP8, "
                    "INT8, INT4' (https://nvidia.github.io/TensorRT-LLM/0.18.2/reference/support-matrix.html)")
_JETSON_SRC = ("NVIDIA Jetson AGX Orin Series Modules Data Sheet DS-10662-001 v1.8 (Memory Subsystem: 256-bit "
               "LPDDR5, up to 204.8 GB/s; JAO 64GB: 170 GPU + 105 DLA sparse INT8 TOPS; 15 W to 60 W), read "
               "through a third-party quotation; 275 TOPS total corroborated by NVIDIA/Deep-Learning-Accelerator-SW "
               "README and the Seeed Studio reComputer J501 spec table")

# Engines: only what each engine's (or vendor's) own documentation says.
_VLLM_CUDA = "vLLM (NVIDIA CUDA; https://docs.vllm.ai/en/latest/getting_started/installation/)"
_VLLM_NEURON = ("vLLM on Neuron via NxD Inference (Inf2, Trn1, Trn2; " + _NEURON
                + "libraries/vllm-neuron/neuron-inference-overview.html)")
_VLLM_NEURON_PLUGIN = "vLLM Neuron plugin, beta (Trn2, Trn3; " + _NEURON + "vllm-neuron/index.html)"
_NXDI = "NxD Inference (neuronx-distributed-inference; " + _NEURON + "libraries/nxd-inference/vllm/index.html)"
_VLLM_TPU = ("vLLM TPU (vllm-tpu / tpu-inference; 'TPU versions: v7x, v6e, v5e', "
             "https://docs.vllm.ai/projects/tpu/en/latest/getting_started/quickstart/)")
_JETSTREAM = ("JetStream ('LLM inference on XLA devices, starting with TPUs', https://github.com/AI-Hypercomputer/JetStream; "
              "v5e tutorial https://cloud.google.com/tpu/docs/tutorials/LLM/jetstream)")
_TRTLLM_L40S = "TensorRT-LLM ('NVIDIA Ada Lovelace: L20, L40/L40S', https://nvidia.github.io/TensorRT-LLM/supported-hardware.html)"
_TRTLLM_JETSON = "TensorRT-LLM v0.12.0-jetson branch, AGX Orin, JetPack 6.1 (https://jetson-ai-lab.com/tensorrt_llm.html)"
_EDGE_LLM = "TensorRT Edge-LLM (https://pypi.org/project/tensorrt-edgellm/; Orin on JetPack 7.2, Seeed Studio wiki)"
_SGLANG_JETSON = "SGLang (Jetson AGX Orin, JetPack 6.1+, https://docs.sglang.io/platforms/nvidia_jetson.html)"

_NEURON_V2_FORMATS = ("BF16", "FP16", "TF32", "cFP8 (FP8_e5m2, FP8_e4m3, FP8_e3m4)", "UINT8", "INT8 (TensorEngine inputs)")

_L4, _L40S = SPECS["L4"], SPECS["L40S"]

ACCELERATORS: dict[str, Accelerator] = {a.key: a for a in (
    Accelerator(
        "inf2", "AWS Inferentia2", "AWS", 190.0, 190.0, 380.0, None, 32.0, 820.0, None,
        _NEURON_V2_FORMATS, (_VLLM_NEURON, _NXDI), _INF2_SRC, READ_ON,
        "per chip (two NeuronCore-v2); 190 TFLOPS is stated for FP16/BF16/cFP8/TF32 alike and the Inf2 "
        "instance table lists it as FP8/FP16/BF16/TF32; the current page says 32 GiB and 820 GiB/sec, the "
        "v2.9.1 page and the NKI guide 32 GB and 820 GB/s: the smaller reading (32, 820) is kept; the data-types "
        "page notes compiler support for cFP8 and UINT8 was still planned; no power figure stated"),
    Accelerator(
        "trn1", "AWS Trainium", "AWS", 190.0, 190.0, 380.0, None, 32.0, 820.0, None,
        _NEURON_V2_FORMATS, (_VLLM_NEURON, _NXDI), _TRN1_SRC, READ_ON,
        "per chip (two NeuronCore-v2, as Inferentia2); current page 380 INT8 TOPS, v2.9.1 page 420: 380 kept; "
        "32 GiB / 820 GiB/sec on the current page, 32 GB / 820 GB/s on v2.9.1; no power figure stated"),
    Accelerator(
        "trn2", "AWS Trainium2", "AWS", 667.0, 1299.0, None, None, 96.0, 2900.0, None,
        ("BF16", "FP16", "TF32", "FP8", "cFP8 (adjustable exponent bias)"), (_VLLM_NEURON_PLUGIN, _VLLM_NEURON, _NXDI),
        _TRN2_SRC, READ_ON,
        "per chip (eight NeuronCore-v3); 96 GiB at 2.9 TB/s (the NKI guide for Neuron 2.29 says 3 TB/s); "
        "2,563 TFLOPS is FP8/FP16/BF16/TF32 with sparsity; no INT8 or power figure stated; a trn2 instance has 16 chips"),
    Accelerator(
        "L4", "NVIDIA L4", "NVIDIA", _L4.bf16_tflops, None, None, 485.0, _L4.memory_gb, _L4.bandwidth_gbs, 72.0,
        ("FP8", "BF16", "FP16", "TF32", "INT8", "INT4"), (_VLLM_CUDA,), _L4_SRC + "; formats: " + _ADA_FORMATS_SRC,
        READ_ON,
        "the datasheet states FP8 (485 TFLOPS) and INT8 (485 TOPS) only with sparsity, so the dense FP8 and INT8 "
        "fields are None; TensorRT-LLM's support matrix covers Ada (SM89) but its supported-hardware page names "
        "L20 and L40/L40S, not L4"),
    Accelerator(
        "L40S", "NVIDIA L40S", "NVIDIA", _L40S.bf16_tflops, 733.0, None, None, _L40S.memory_gb, _L40S.bandwidth_gbs,
        350.0, ("FP8", "BF16", "FP16", "TF32", "INT8", "INT4"), (_VLLM_CUDA, _TRTLLM_L40S),
        _L40S_SRC + "; formats: " + _ADA_FORMATS_SRC, READ_ON,
        "FP8 733 dense (1,466 with sparsity); the transcription read gave no INT8 figure for the L40S column, "
        "so INT8 is None"),
    Accelerator(
        "tpu-v5e", "Google TPU v5e", "Google", 197.0, None, 393.0, None, 16.0, 819.0, None,
        ("BF16", "INT8"), (_VLLM_TPU, _JETSTREAM), _TPU_V5E_SRC, READ_ON,
        "per chip (one TensorCore); '16 GB, 819 GBps' on the English page; a newer revision lists 800 GiBps "
        "(859 GB/s): the smaller is kept; no power figure stated"),
    Accelerator(
        "tpu-v6e", "Google TPU v6e (Trillium)", "Google", 918.0, None, 1836.0, None, 32.0, 1638.0, None,
        ("BF16", "INT8"), (_VLLM_TPU, _JETSTREAM), _TPU_V6E_SRC, READ_ON,
        "per chip (one TensorCore); no power figure stated"),
    Accelerator(
        "jetson-agx-orin-64gb", "NVIDIA Jetson AGX Orin 64GB", "NVIDIA", None, None, None, 275.0, 64.0, 204.8, 60.0,
        ("FP16", "INT8", "INT4"), (_TRTLLM_JETSON, _EDGE_LLM, _SGLANG_JETSON),
        _JETSON_SRC + "; formats: TensorRT Edge-LLM runtime precisions on Orin (FP16, INT8, INT4; no FP8), "
        "Seeed Studio wiki 'Deploy TensorRT Edge-LLM on JetPack 7.2'", READ_ON,
        "module: 2048-core Ampere GPU with 64 Tensor Cores and 2 DLAs sharing 64 GB LPDDR5 with the CPU; "
        "275 TOPS is sparse INT8, GPU and DLAs together; no dense 16-bit or dense INT8 figure stated; "
        "power is the top of the 15-60 W range; bought, not rented: no hourly price"),
)}


# -- prices -----------------------------------------------------------------------------------

_SKYPILOT_AWS = ("AWS EC2 price list (Linux), as recorded in skypilot-org/skypilot-catalog "
                 "catalogs/v7/aws/vms.csv @ 001367d2; https://aws.amazon.com/ec2/pricing/on-demand/")
_SKYPILOT_AWS_DATE = ("undated catalog snapshot from before AWS's June 2025 P-instance price cut "
                      "(the snapshot utils.capacity.cost.PRICES reads)")
_SKYPILOT_GCP = ("Google Cloud TPU price list, as recorded in skypilot-org/skypilot-catalog "
                 "catalogs/v7/gcp/vms.csv @ 017e2502; https://cloud.google.com/tpu/pricing")
_SKYPILOT_GCP_DATE = "undated catalog snapshot, read " + READ_ON
_SPOT = "spot = median of the {} availability zones in the snapshot ({}); spot moves daily"

_L4_PRICE = next(p for p in PRICES if p.gpu == "L4" and p.product.startswith("g6.xlarge"))

ACCELERATOR_PRICES: tuple[GpuPrice, ...] = (
    GpuPrice("inf2", "aws", "inf2.xlarge (1x Inferentia2)", "us-east-1", 1, 0.7582, 0.1276, "instance",
             _SKYPILOT_AWS, _SKYPILOT_AWS_DATE, _SPOT.format("us-east-1", "0.1205-0.1921")),
    GpuPrice("trn1", "aws", "trn1.2xlarge (1x Trainium)", "us-east-1", 1, 1.34375, 0.34925, "instance",
             _SKYPILOT_AWS, _SKYPILOT_AWS_DATE, _SPOT.format("us-east-1", "0.3409-0.3576")),
    GpuPrice("trn2", "aws", "trn2.48xlarge (16x Trainium2)", "us-east-2", 16, 85.964, None, "instance",
             _SKYPILOT_AWS, _SKYPILOT_AWS_DATE, "instance price / 16 chips; the only trn2 row in the snapshot"),
    _L4_PRICE,
    GpuPrice("L40S", "aws", "g6e.xlarge (1x L40S)", "us-east-1", 1, 1.861, 0.81705, "instance",
             _SKYPILOT_AWS, _SKYPILOT_AWS_DATE, _SPOT.format("us-east-1", "0.7870-1.2079")),
    GpuPrice("tpu-v5e", "gcp", "tpu-v5litepod-1 (1 chip)", "us-central1", 1, 1.2, 0.21298, "instance",
             _SKYPILOT_GCP, _SKYPILOT_GCP_DATE, "per chip-hour; spot is the snapshot's us-central1-a figure"),
    GpuPrice("tpu-v6e", "gcp", "tpu-v6e-1 (1 chip)", "us-central1", 1, 2.7, 0.64833, "instance",
             _SKYPILOT_GCP, _SKYPILOT_GCP_DATE, "per chip-hour; spot is the snapshot's us-central1 figure"),
)
NO_PRICE = {"jetson-agx-orin-64gb": "an edge module that is bought, not rented: no hourly on-demand price"}


def accelerator(key: str, accelerators: Mapping[str, Accelerator] = ACCELERATORS) -> Accelerator:
    """The row for ``key``; ValueError naming the known keys otherwise."""
    if key not in accelerators:
        raise ValueError(f"unknown accelerator {key!r}; known: {', '.join(accelerators)}")
    return accelerators[key]


def on_demand_usd_per_device_hour(key: str, prices: Iterable[GpuPrice] = ACCELERATOR_PRICES) -> tuple[float, GpuPrice]:
    """The lowest on-demand price per chip-hour for ``key`` and the row it came from."""
    rows = [p for p in prices if p.gpu == key and p.on_demand_usd_per_gpu_hour is not None]
    if not rows:
        why = NO_PRICE.get(key, "no row in the price table")
        raise ValueError(f"no on-demand price for {key!r} ({why}); pass prices= with your own GpuPrice row")
    best = min(rows, key=lambda p: p.on_demand_usd_per_gpu_hour)
    return best.on_demand_usd_per_gpu_hour, best


# -- the cheapest accelerator for a TPOT SLO -------------------------------------------------------

@dataclass(frozen=True)
class SloOption:
    accelerator: str
    scaled_tpot_ms: float
    tokens_per_s_per_device: float
    devices: int
    usd_per_device_hour: float
    monthly_cost_usd: float
    price: GpuPrice


@dataclass(frozen=True)
class SloRejection:
    accelerator: str
    reason: str
    scaled_tpot_ms: float | None


@dataclass(frozen=True)
class SloChoice:
    options: tuple[SloOption, ...]  # the candidates that qualify, cheapest first
    cheapest: SloOption | None  # None when none qualifies (see rejected)
    rejected: tuple[SloRejection, ...]
    demand_tokens_per_s: float
    measured_bandwidth_gbs: float


def _measured_bandwidth_gbs(measured_gpu: str | None, measured_bandwidth_gbs: float | None) -> float:
    if (measured_gpu is None) == (measured_bandwidth_gbs is None):
        raise ValueError("give exactly one of measured_gpu (a utils.device.hardware.SPECS key or device name) "
                         "and measured_bandwidth_gbs")
    if measured_bandwidth_gbs is not None:
        return validate.positive("measured_bandwidth_gbs", measured_bandwidth_gbs)
    spec = SPECS.get(measured_gpu) or spec_for_name(measured_gpu)
    if spec is None or not spec.bandwidth_gbs:
        raise ValueError(f"no datasheet bandwidth for GPU {measured_gpu!r}; pass measured_bandwidth_gbs")
    return float(spec.bandwidth_gbs)


def cheapest_for_slo(*, measured_tpot_ms: float, batch_size: int, slo_tpot_ms: float,
                     output_tokens_per_month: float, model_bytes: float,
                     measured_gpu: str | None = None, measured_bandwidth_gbs: float | None = None,
                     candidates: Sequence[str] | None = None,
                     accelerators: Mapping[str, Accelerator] = ACCELERATORS,
                     prices: Iterable[GpuPrice] = ACCELERATOR_PRICES,
                     hours_per_month: float = HOURS_PER_MONTH) -> SloChoice:
    """The cheapest accelerator that would serve ``output_tokens_per_month`` within a TPOT SLO.

    Input: a decode TPOT the learner measured (``measured_tpot_ms`` per output token, every
    sequence in a batch of ``batch_size``) on a GPU of known memory bandwidth (``measured_gpu``,
    looked up in :data:`utils.device.hardware.SPECS`, or ``measured_bandwidth_gbs``), and
    ``model_bytes`` that must sit in one device's memory (weights plus the KV cache the
    measurement used).

    For each candidate (default: every accelerator with a price):

    1. ``scaled_tpot_ms = measured_tpot_ms * measured_bandwidth_gbs / candidate bandwidth_gbs``.
       Decode at small batch is memory-bound: each step reads the weights (and KV cache) once,
       so time per token is about bytes read / bandwidth, far left of every ridge point (the
       roofline, Williams, Waterman and Patterson 2009; docs/reference.md#flops-mfu-roofline).
       **This is an estimate.** It assumes the candidate reaches the same fraction of its
       datasheet bandwidth as the measured GPU did, and ignores differences in kernel
       efficiency, compilers and software stacks (Neuron, XLA, TensorRT), launch overheads,
       and compute limits at large batch. Measure on the candidate before buying.
    2. Rejected if ``scaled_tpot_ms > slo_tpot_ms`` or ``model_bytes`` exceeds the device's
       memory (sharding over several chips is not modelled: it changes the TPOT).
    3. ``tokens_per_s_per_device = batch_size / (scaled_tpot_ms / 1000)``; demand is
       ``output_tokens_per_month / (hours_per_month * 3600)``; devices = ``ceil(demand /
       per-device rate)`` (:func:`utils.capacity.cost.gpus_needed`, at least 1); monthly cost =
       devices x on-demand price per chip-hour x ``hours_per_month`` (730 by default).

    Returns the qualifying options sorted by monthly cost (then devices, then name), the
    cheapest (None if none qualifies), and each rejection with its reason. Prices come from
    :data:`ACCELERATOR_PRICES`: prices change: dated, check before use.
    """
    tpot = validate.positive("measured_tpot_ms", measured_tpot_ms)
    batch = validate.positive_int("batch_size", batch_size)
    slo = validate.positive("slo_tpot_ms", slo_tpot_ms)
    volume = validate.positive("output_tokens_per_month", output_tokens_per_month)
    need_bytes = validate.positive("model_bytes", model_bytes)
    hours = validate.positive("hours_per_month", hours_per_month)
    measured_bw = _measured_bandwidth_gbs(measured_gpu, measured_bandwidth_gbs)
    prices = list(prices)
    if candidates is None:
        priced = {p.gpu for p in prices if p.on_demand_usd_per_gpu_hour is not None}
        keys = [k for k in accelerators if k in priced]
    else:
        keys = list(candidates)
    if not keys:
        raise ValueError("cheapest_for_slo needs at least one candidate accelerator")
    demand = volume / (hours * 3600)
    options: list[SloOption] = []
    rejected: list[SloRejection] = []
    for key in keys:
        acc = accelerator(key, accelerators)
        if not acc.bandwidth_gbs:
            raise ValueError(f"{key!r} has no memory bandwidth in the table, so its TPOT cannot be scaled")
        price_per_hour, row = on_demand_usd_per_device_hour(key, prices)
        scaled = tpot * measured_bw / acc.bandwidth_gbs
        if scaled > slo:
            rejected.append(SloRejection(key, f"scaled TPOT {scaled:.4g} ms > SLO {slo:g} ms", scaled))
            continue
        if acc.memory_gb is None or need_bytes > acc.memory_gb * 1e9:
            held = "unknown" if acc.memory_gb is None else f"{acc.memory_gb:g} GB"
            rejected.append(SloRejection(key, f"model needs {need_bytes / 1e9:.4g} GB, one device holds {held}",
                                         scaled))
            continue
        rate = batch / (scaled / 1e3)
        n = gpus_needed(demand, rate)
        options.append(SloOption(key, scaled, rate, n, price_per_hour, n * price_per_hour * hours, row))
    options.sort(key=lambda o: (o.monthly_cost_usd, o.devices, o.accelerator))
    return SloChoice(tuple(options), options[0] if options else None, tuple(rejected), demand, measured_bw)


# -- the doc's tables ---------------------------------------------------------------------------

def _num(value: float | None) -> str:
    return "none stated" if value is None else f"{value:g}"


def markdown() -> str:
    """The tables of docs/inference-hardware.md, from :data:`ACCELERATORS` and :data:`ACCELERATOR_PRICES`."""
    out = ["| accelerator | bf16/fp16 TFLOP/s | FP8 TFLOP/s | INT8 TOPS | INT8 TOPS, sparse | memory GB "
           "| bandwidth GB/s | power W |",
           "|---|---|---|---|---|---|---|---|"]
    for a in ACCELERATORS.values():
        out.append(f"| {a.name} (`{a.key}`) | {_num(a.bf16_tflops)} | {_num(a.fp8_tflops)} | {_num(a.int8_tops)} "
                   f"| {_num(a.int8_tops_sparse)} | {_num(a.memory_gb)} | {_num(a.bandwidth_gbs)} | {_num(a.power_w)} |")
    out += ["", "| accelerator | low-precision formats | serving engines |", "|---|---|---|"]
    for a in ACCELERATORS.values():
        out.append(f"| `{a.key}` | {', '.join(a.formats)} | {'; '.join(a.engines)} |")
    out += ["", "Sources and notes, per row:", ""]
    for a in ACCELERATORS.values():
        out.append(f"- `{a.key}` (read {a.as_of}): {a.source}. {a.note[0].upper() + a.note[1:]}.")
    out += ["", f"Prices: **{PRICES_LABEL}.**", "",
            "| accelerator | offer | region | on-demand $/chip-hour | spot $/chip-hour | as of | source | note |",
            "|---|---|---|---|---|---|---|---|"]
    for p in ACCELERATOR_PRICES:
        spot = "none recorded" if p.spot_usd_per_gpu_hour is None else f"{p.spot_usd_per_gpu_hour:g}"
        out.append(f"| `{p.gpu}` | {p.product} | {p.region} | {p.on_demand_usd_per_gpu_hour:g} | {spot} "
                   f"| {p.as_of} | {p.source} | {p.note} |")
    for key, why in NO_PRICE.items():
        out.append(f"| `{key}` | none | | none | none | | | {why} |")
    return "\n".join(out)


def doc_block(path: Path = DOC) -> str:
    """The generated section as it stands in the doc (between BEGIN and END)."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no generated section; run: python -m utils.capacity.accelerators --write-doc")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write_doc(path: Path = DOC) -> None:
    """Rewrite the generated section of the doc from the tables above."""
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.capacity.accelerators", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print the tables of docs/inference-hardware.md")
    group.add_argument("--write-doc", action="store_true", help="rewrite that section of the doc")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown())
    else:
        write_doc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
