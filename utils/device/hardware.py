"""GPU spec table, device detection and a fingerprint of the machine a number came from.

Every row of :data:`SPECS` is a datasheet figure (dense, no sparsity) with its source, as
torchtitan's ``get_peak_flops`` carries one per entry. Datasheet peaks are ceilings, not
expectations: a bf16 8192^3 matmul measured 793 TFLOP/s on one H200 here (80% of 989), and
stas00/ml-engineering's mamf-finder found about 80% on H100 and 87% on A100. The course
measures its own ceilings (``benchmarks/timing_agreement.py``) and uses these rows for
plausibility checks (nothing may beat the datasheet).
"""
from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

from utils.device import nvml


@dataclass(frozen=True)
class GpuSpec:
    name: str
    kind: str  # "gpu" or "cpu"
    bf16_tflops: float | None  # dense tensor-core peak; None where the chip has no bf16
    fp16_tflops: float | None
    tf32_tflops: float | None
    fp32_tflops: float | None  # plain (non-tensor-core) fp32
    memory_gb: float | None  # decimal GB as the datasheet gives it
    bandwidth_gbs: float | None  # memory bandwidth, decimal GB/s
    interconnect: str
    source: str

    def peak_tflops(self, dtype: str) -> float | None:
        """Peak dense TFLOP/s for ``dtype`` (``bf16``, ``fp16``, ``tf32``, ``fp32``)."""
        key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}.get(dtype, dtype)
        if key not in ("bf16", "fp16", "tf32", "fp32"):
            raise ValueError(f"unknown dtype {dtype!r}; use bf16, fp16, tf32 or fp32")
        return getattr(self, f"{key}_tflops")

    def ridge_flop_per_byte(self, dtype: str = "bf16") -> float | None:
        """Roofline ridge point: peak FLOP/s / bandwidth (H200 bf16: about 206)."""
        peak = self.peak_tflops(dtype)
        if not peak or not self.bandwidth_gbs:
            return None
        return peak * 1e12 / (self.bandwidth_gbs * 1e9)


_DS = "NVIDIA {} datasheet"
# Patterns are matched against the lower-cased device name in order; first hit wins.
SPECS: dict[str, GpuSpec] = {
    "T4": GpuSpec("T4", "gpu", None, 65.0, None, 8.1, 16, 320, "PCIe Gen3", _DS.format("T4")),
    "P100": GpuSpec("P100", "gpu", None, 18.7, None, 9.3, 16, 732, "PCIe Gen3 (Kaggle)", _DS.format("P100 PCIe 16GB")),
    "V100": GpuSpec("V100", "gpu", None, 125.0, None, 15.7, 16, 900, "NVLink 2 (SXM2)", _DS.format("V100 SXM2")),
    "L4": GpuSpec("L4", "gpu", 121.0, 121.0, 60.0, 30.3, 24, 300, "PCIe Gen4", _DS.format("L4") + " (242 bf16 is with sparsity)"),
    "A10": GpuSpec("A10", "gpu", 125.0, 125.0, 62.5, 31.2, 24, 600, "PCIe Gen4", _DS.format("A10") + " (A10G in clouds differs)"),
    "A100-40GB": GpuSpec("A100-40GB", "gpu", 312.0, 312.0, 156.0, 19.5, 40, 1555, "NVLink 3 (SXM)", _DS.format("A100")),
    "A100-80GB-PCIe": GpuSpec("A100-80GB-PCIe", "gpu", 312.0, 312.0, 156.0, 19.5, 80, 1935, "PCIe Gen4", _DS.format("A100")),
    "A100-80GB": GpuSpec("A100-80GB", "gpu", 312.0, 312.0, 156.0, 19.5, 80, 2039, "NVLink 3 (SXM)", _DS.format("A100")),
    "L40S": GpuSpec("L40S", "gpu", 362.0, 362.0, 183.0, 91.6, 48, 864, "PCIe Gen4", _DS.format("L40S")),
    "H100-PCIe": GpuSpec("H100-PCIe", "gpu", 756.0, 756.0, 378.0, 51.0, 80, 2000, "PCIe Gen5", _DS.format("H100")),
    "H100-SXM": GpuSpec("H100-SXM", "gpu", 989.0, 989.0, 494.5, 67.0, 80, 3350, "NVLink 4, 900 GB/s", _DS.format("H100")),
    "H200": GpuSpec("H200", "gpu", 989.0, 989.0, 494.5, 67.0, 141, 4800, "NVLink 4, 900 GB/s", _DS.format("H200")),
}

_PATTERNS: list[tuple[str, str]] = [
    (r"\bt4\b", "T4"),
    (r"p100", "P100"),
    (r"v100", "V100"),
    (r"\bl4\b", "L4"),
    (r"\ba10\b", "A10"),
    (r"a100.*(80\s*gb|80g).*pcie|a100.*pcie.*80", "A100-80GB-PCIe"),
    (r"a100.*(80\s*gb|80g)", "A100-80GB"),
    (r"a100", "A100-40GB"),
    (r"l40s", "L40S"),
    (r"h100.*pcie", "H100-PCIe"),
    (r"h100", "H100-SXM"),
    (r"h200", "H200"),
]

CPU_SPEC = GpuSpec(
    "CPU", "cpu", None, None, None, None, None, None, "none",
    "no datasheet: a CPU's ceilings are measured, never assumed",
)


def spec_for_name(name: str) -> GpuSpec | None:
    """The spec row for a device name as CUDA or NVML reports it, or None if unknown.

    >>> spec_for_name("NVIDIA H100 80GB HBM3").name
    'H100-SXM'
    """
    low = name.lower()
    for pattern, key in _PATTERNS:
        if re.search(pattern, low):
            return SPECS[key]
    return None


def current_spec(device_index: int = 0) -> GpuSpec:
    """The spec row of the CUDA device in use; :data:`CPU_SPEC` without one.

    An unknown GPU gets a row with its name and no peaks, so callers that need a peak
    must handle None (and the device report says the card is not in the table)."""
    try:
        import torch
    except ImportError:
        return CPU_SPEC
    if not torch.cuda.is_available():
        return CPU_SPEC
    name = torch.cuda.get_device_name(device_index)
    spec = spec_for_name(name)
    if spec is not None:
        return spec
    mem_gb = torch.cuda.get_device_properties(device_index).total_memory / 1e9
    return GpuSpec(name, "gpu", None, None, None, None, round(mem_gb, 1), None, "unknown", "not in the spec table")


def nvml_handle_for_torch(device_index: int) -> Any:
    """NVML's handle for torch device ``device_index``, matched by PCI bus id so that
    CUDA_VISIBLE_DEVICES reordering cannot pair the wrong cards."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        pci = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        h = nvml.query("nvmlDeviceGetHandleByPciBusId_v2", pci.encode())
        if h is not nvml.NA:
            return h
    return nvml.handle(device_index)


def nvml_fingerprint(h: Any) -> dict:
    """Driver-side facts of one device handle; fields NVML cannot give are None."""
    def q(name, *args):
        v = nvml.query(name, h, *args)
        return None if v is nvml.NA else v

    clock = nvml.constant("NVML_CLOCK_SM", 1)
    mclock = nvml.constant("NVML_CLOCK_MEM", 2)
    power_mw = q("nvmlDeviceGetEnforcedPowerLimit")
    mig = q("nvmlDeviceGetMigMode")
    reasons = None
    for call in nvml.THROTTLE_CALLS:  # the newer name first; an older driver answers only the other
        reasons = q(call)
        if reasons is not None:
            break
    return {
        "uuid": q("nvmlDeviceGetUUID"),
        "sm_clock_mhz": q("nvmlDeviceGetClockInfo", clock),
        "mem_clock_mhz": q("nvmlDeviceGetClockInfo", mclock),
        "sm_clock_max_mhz": q("nvmlDeviceGetMaxClockInfo", clock),
        "mem_clock_max_mhz": q("nvmlDeviceGetMaxClockInfo", mclock),
        "power_limit_w": power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
        "throttle_reasons": nvml.throttle_reasons(reasons) if reasons is not None else None,
        "mig_mode": (mig[0] if isinstance(mig, (list, tuple)) else mig),
    }


def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device_index: int = 0) -> dict:
    """Everything that identifies the machine a measurement came from.

    Name, compute capability, memory, driver, SM/memory clocks, power limit, throttle
    reasons, MIG mode, torch/CUDA versions; on a CPU machine the CPU's name and cores.
    """
    fp: dict[str, Any] = {
        "kind": "cpu",
        "name": _cpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    try:
        import torch
    except ImportError:
        fp["torch"] = None
        return fp
    fp["torch"] = torch.__version__
    fp["cuda"] = torch.version.cuda
    fp["cpu_threads"] = torch.get_num_threads()
    if not torch.cuda.is_available():
        return fp
    props = torch.cuda.get_device_properties(device_index)
    st = nvml.status()
    fp.update(
        kind="gpu",
        name=props.name,
        device_index=device_index,
        device_count=torch.cuda.device_count(),
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 2),
        cudnn=torch.backends.cudnn.version(),
        driver=st.driver or None,
        nvml=st.available,
    )
    if st.available:
        fp.update(nvml_fingerprint(nvml_handle_for_torch(device_index)))
    return fp


def spec_dict(spec: GpuSpec) -> dict:
    d = asdict(spec)
    d["ridge_bf16_flop_per_byte"] = spec.ridge_flop_per_byte("bf16") if spec.bf16_tflops else None
    return d
