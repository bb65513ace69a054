"""The plan of each lab on each card: sizes, dtype, ``torch.compile``, what is skipped and why, and
whether it fits the card's memory. Printed by every lab's device cell (``print(SIZES)``: the sizes
of ``utils.course.env`` print as their plan), so a learner reads what they will get before any cell
runs, not from a crash. ``python -m grader.tier_table`` prints the plans for this machine or any
card below, and writes README.md's table of tiers from them (a test checks they agree).

What decides a plan is the card's compute capability (NVIDIA's list, https://developer.nvidia.com/cuda-gpus:
T4 7.5, P100 6.0, L4 8.9, A100 8.0, H100 9.0), its memory and its GPU count:

- **bf16** needs compute capability 8.0 (Ampere): a T4 (7.5) and a P100 (6.0) run fp16.
  On a P100 even bf16 storage is no way out: cuBLAS refuses its bf16 GEMMs
  (``CUBLAS_STATUS_NOT_SUPPORTED``; pytorch/pytorch, "BFloat16 CUDA GEMM ops unsupported on
  Nvidia P100 (SM_60) on CUDA 11.3").
- **torch.compile** (inductor) generates Triton kernels for CUDA, and PyTorch refuses GPUs
  below compute capability 7.0: ``torch/utils/_triton.py`` (``has_triton``: its CUDA check is
  ``get_device_properties().major >= 7``), ``torch/_dynamo/device_interface.py``
  (``CudaInterface.is_triton_capable``) and ``torch/_inductor/scheduler.py``
  (``Scheduler.create_backend``), which raises ``GPUTooOldForTriton``
  (``torch/_inductor/exc.py``: "Triton only supports devices of CUDA Capability >= 7.0, but
  your device is of CUDA capability 6.0"). PyTorch 2.13's sources, as installed here; the
  error is reported from P100s and GTX 10x0s in vllm-project/vllm, karpathy/nanoGPT and
  MIC-DKFZ/nnUNet issues. It is raised when the first compiled call compiles, not when
  ``torch.compile`` wraps the function, which is why a lab has to decide before it runs.
  Backends that generate no Triton code (``eager``, ``aot_eager``, ``cudagraphs``) do not hit it.
- **Triton** itself lists "NVIDIA GPUs (Compute Capability 8.0+)" as its supported hardware
  (triton-lang/triton README, Compatibility); since its MMAv1 removal ("[BACKEND] Deprecate
  MMAv1; fallback to FMA for computeCapability < 80") older GPUs fall back to FMA dot
  products, and its maintainers answer sm75 reports with "sm75 is not currently supported. It
  may work at times". So on a T4 compile runs at PyTorch's gate (7.0) without Triton's
  support, and on a P100 neither compile nor a compiled Triton kernel runs (``utils.train.fused`` then runs
  hand-written kernels under Triton's interpreter on the CPU).
- **PyTorch's own wheels**: from PyTorch 2.8 its CUDA 12.8 and 12.9 builds carry no Maxwell or
  Pascal kernels (its 2.8.0 release notes: "please utilize CUDA 12.6 instead"; CUDA 13 builds
  start at Turing), and a proposal for 2.15 removes the CUDA 12.6 builds too (pytorch/pytorch,
  "[RFC] CUDA support matrix for Release 2.15 — deprecate CUDA 12.6"). Kaggle's default image
  ships a CUDA 12.8 build, so a P100 there allocates, ``torch.cuda.is_available()`` is True, and
  the first CUDA operation fails with "no kernel image is available" (Kaggle/docker-python,
  "Pytorch CUDA P100 GPU Incompatibility", whose warning lists "sm_70 sm_75 sm_80 sm_86 sm_90
  sm_100 sm_120"; Kaggle/kaggle-cli, "machine_shape NvidiaTeslaP100 ... has no sm_60 kernels",
  where Kaggle recommends T4 or L4). The live plan reads ``torch.cuda.get_arch_list()`` and
  says so first.
- **vLLM**'s CUDA build needs 7.0 (``utils.serving.engines.VLLM_MIN_CAPABILITY``); fp8 weights run as
  W8A8 from 8.9 and weight-only (FP8 Marlin) from 7.5 (vLLM docs, "FP8 W8A8").
- **bitsandbytes**: LLM.int8() needs 7.5, NF4 4-bit 6.0 (bitsandbytes installation guide,
  "NVIDIA CUDA" feature table).

Memory: at every peak of the lab (``utils.course.lab_memory``), each process's tensors plus
:data:`MARGIN` of them plus :data:`CONTEXT_GIB` of CUDA context, summed over the processes on a
GPU, is what the peak needs; a share an engine enforces itself (vLLM's
``--gpu-memory-utilization``, its context included) counts as it is. A plan fits when every peak's
need is at most the card's memory. The figure a plan prints is the peak as ``nvidia-smi``'s
device-wide ``memory.used`` shows it: the need, or more where the notebook's caching allocator
keeps blocks from earlier cells that it cannot reuse (``Moment.cached_gib``) beyond the margin,
up to the card's memory, since the allocator gives cached blocks back when an allocation would
otherwise fail. The margin is chosen (what the caching allocator reserves beyond what it hands
out); the context is measured. Each plan is compared with the lab's measured peaks (``MEASURED_PEAKS``
in ``grader/labs/<lab>/plan.py``, all of them ``grader.labs.measured_peaks``), and ``tests/utils/test_tier_plan.py``
fails when a plan is below a measured peak or more than 15% above it. What a lab runs and where its
memory peaks are the lab's own (``parts`` and ``moments`` in the same ``plan.py``); this module holds
the cards, the rules and the arithmetic they share.

The grader's own processes are not in a plan: its judges, its re-measurements (``measure`` in a
lab's ``reference.py``) and the sandboxes that run a learner's functions start once the notebook's
kernel is gone (``grader/judging.py``), so they never share the GPU with the notebook. A grader
measurement that runs beside a sandbox on the same GPU is neither planned nor measured here.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from utils.course import lab_memory
from utils.device import hardware, rehearsal
from utils.serving import engines

MARGIN = 0.15  # added to every estimate of a process's peak: a chosen headroom (see the module docstring)
# CUDA context per process on a GPU, measured device-wide on one H200 (torch 2.11.0+cu130,
# 2026-12-04): 621 MiB for lab 02's notebook holding only small CUDA tensors (its Triton kernels'
# checks, cell fused_answer, t4_memcells_02_multi_gpu.json) and in lab 04's run once its engines had
# stopped, 719 MiB for lab 04's notebook beside its engines (t4_mem_04_benchmarking_production.txt), both in
# benchmarks/results/h200-t4-rehearsal-all-labs-2026-12-04/. A T4's context is smaller: there it errs high.
CONTEXT_GIB = 0.68
COMPILE_MIN = (7, 0)  # PyTorch's inductor: GPUTooOldForTriton below
BF16_MIN = (8, 0)
TENSOR_CORES_MIN = (7, 0)  # Volta
BNB_INT8_MIN, BNB_NF4_MIN = (7, 5), (6, 0)
FP8_W8A8_MIN = (8, 9)


def gpu_tier(major: int, memory_gib: float) -> str:
    """The ``utils.course.env`` size tier of a GPU of compute capability ``major``.x with ``memory_gib`` of memory:
    ``h100`` from Hopper, ``a100`` for Ampere/Ada above 20 GiB, else ``t4``."""
    if major >= 9:
        return "h100"
    return "a100" if major >= 8 and memory_gib > 20 else "t4"


def fingerprint_tier(fingerprint: dict) -> str:
    """:func:`gpu_tier` of the GPU a measurement record's fingerprint names (``compute_capability``
    as ``"9.0"``, ``memory_gib``); a missing or unreadable capability counts as the smallest tier."""
    try:
        major = int(str(fingerprint.get("compute_capability", "0")).split(".")[0])
    except ValueError:
        major = 0
    return gpu_tier(major, fingerprint.get("memory_gib") or 0)


@dataclass(frozen=True)
class Card:
    """A GPU (or the CPU) a learner runs on; ``memory_gib`` is what the plans must fit."""

    key: str
    name: str
    memory_gib: float | None  # per GPU; None on the CPU
    capability: tuple[int, int] | None  # None on the CPU
    gpus: int = 1
    where: str = ""
    memory_source: str = ""
    absent: tuple[tuple[str, str], ...] = ()  # (package, why) not usable on this machine: "vllm", "bitsandbytes"
    sms: int | None = None  # streaming multiprocessors (lab 00's shape sweep is sized by them)

    @property
    def gpu(self) -> bool:
        return self.capability is not None

    def lacks(self, package: str) -> str | None:
        """Why ``package`` cannot be used on this machine, or None (a tier card lacks nothing)."""
        return dict(self.absent).get(package)

    def at_least(self, cap: tuple[int, int]) -> bool:
        return self.gpu and tuple(self.capability) >= cap

    @property
    def size_tier(self) -> str:
        """The ``utils.course.env`` tier this card gets (``utils.course.env.device_tier``'s rule)."""
        return gpu_tier(self.capability[0], self.memory_gib) if self.gpu else "cpu"


_SMI = "nvidia-smi's total as these cards commonly report it (utils.device.rehearsal), an estimate"
# SMs: NVIDIA's architecture whitepapers (Turing T4 40, Pascal P100 56, Ada L4 58, Ampere A100 108,
# Hopper H100 SXM5 132)
_DS = "the datasheet's {} GB as 10^9 bytes (utils.device.hardware.SPECS; nvidia-smi's total is not recorded here)"
CARDS = {c.key: c for c in (
    Card("cpu", "CPU (smoke mode)", None, None, 0, "any machine without a CUDA GPU"),
    Card("t4", "T4", rehearsal.TIER_CARDS["t4"].memory_gib, (7, 5), 1, "Colab free tier, Kaggle", _SMI, sms=40),
    Card("t4x2", "T4 x2", rehearsal.TIER_CARDS["t4"].memory_gib, (7, 5), 2, "Kaggle (GPU T4 x2)", _SMI, sms=40),
    Card("p100", "P100", 16e9 / 2**30, (6, 0), 1, "Kaggle (GPU P100)", _DS.format(16), sms=56),
    Card("l4", "L4", rehearsal.TIER_CARDS["a100"].memory_gib, (8, 9), 1, "Colab paid tiers", _SMI, sms=58),
    Card("a100-40gb", "A100 40GB", 40e9 / 2**30, (8, 0), 1, "Colab paid tiers", _DS.format(40), sms=108),
    Card("h100", "H100 80GB", rehearsal.TIER_CARDS["h100"].memory_gib, (9, 0), 1, "clouds", _SMI, sms=132),
)}


# -- the plans against measured peaks ---------------------------------------------------------

REHEARSED_T4 = dataclasses.replace(
    CARDS["t4"], name="T4 rehearsed on an H200", sms=132, where="GPULAB_TIER=t4 on one H200 (utils.device.rehearsal)",
    absent=(("bitsandbytes", "not installed on the rehearsal machine (no internet)"),))
H100_NO_VLLM = dataclasses.replace(CARDS["h100"], absent=(("vllm", "not run in that measurement"),))
T4_RUN = "benchmarks/results/h200-t4-rehearsal-all-labs-2026-12-04/"
T4_FP16 = "benchmarks/results/h200-t4-rehearsal-labs-00-05-fp16-2026-12-04/"
T4_HOW = "H200 rehearsing a T4 (GPULAB_TIER=t4), nvidia-smi every 0.5 s, lab graded live, 2026-12-04"
H100_HOW = "H100 80GB, nvidia-smi every 0.5 s, lab graded live at the h100 tier, 2026-12-05"
H100_RUN = "benchmarks/results/h100-grader-live/2026-12-07/"
H100_LIVE_HOW = ("H100 80GB, nvidia-smi every 0.5 s, lab graded live at the h100 tier by the judges outside the "
                 "kernel (python -m grader.gpu_check --live-only), no vLLM, 2026-12-07")


@dataclass(frozen=True)
class MeasuredPeak:
    """A lab's measured peak: ``nvidia-smi``'s device-wide ``memory.used`` (every process and CUDA
    context on the GPU, the allocators' reserves), the highest reading while one of the notebook's
    cells ran, on ``card`` (what the plan is computed for). ``cell`` names where it was first
    reached, from ``benchmarks/memory_by_cell.py``'s join of the readings with the cells' times;
    empty where only the lab's total is known (the highest reading of the whole graded run)."""

    lab: str
    card: Card
    gib: float
    cell: str
    how: str
    source: str


PLAN_OVER_MEASURED_MAX = 1.15  # a plan is at least the measured peak and at most 15% above it


def compile_support(card: Card) -> tuple[bool, str]:
    """Whether ``torch.compile`` (inductor, Triton kernels) runs on ``card``, and why not."""
    if not card.gpu:
        return False, "smoke mode: the labs do not compile on the CPU"
    if not card.at_least(COMPILE_MIN):
        cc = ".".join(map(str, card.capability))
        return False, (f"compute capability {cc}: PyTorch's inductor generates Triton kernels and refuses GPUs "
                       "below 7.0 (GPUTooOldForTriton), so the lab runs eager instead")
    return True, ""


def too_old_to_compile(device=None) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` (a CUDA device below compute capability 7.0,
    the rehearsed card's under ``GPULAB_TIER``), or None. The labs' code asks this before compiling,
    so a P100 runs eager as its plan says instead of failing at the first compiled call."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    cap = tuple(rehearsal.capability(dev.index or 0))
    if cap >= COMPILE_MIN:
        return None
    return compile_support(Card("this", "this GPU", None, cap))[1]


def card_dtype(card: Card) -> str:
    """The card's 16-bit dtype: bf16 from compute capability 8.0, fp16 before; fp32 on the CPU."""
    if not card.gpu:
        return "fp32"
    return "bf16" if card.at_least(BF16_MIN) else "fp16"


@dataclass(frozen=True)
class LabPlan:
    """What ``lab`` does on ``card``. ``skipped`` maps each part left out (or replaced) to why."""

    lab: str
    card: Card
    size_tier: str
    sizes: object
    dtype: str
    compile: bool
    compile_note: str
    runs: tuple[str, ...]
    skipped: dict = field(default_factory=dict)
    moments: tuple = ()

    def needed_gib(self, m: lab_memory.Moment) -> float:
        """GPU memory ``m`` needs on one GPU, margin and contexts included: what must fit."""
        total = m.notebook_gib * (1 + MARGIN) + CONTEXT_GIB
        for o in m.others:
            total += o.gib if o.fixed else o.gib * (1 + MARGIN) + CONTEXT_GIB
        return total

    def expected_gib(self, m: lab_memory.Moment) -> float:
        """The device-wide memory ``nvidia-smi`` shows at ``m``: the need, plus the notebook's cached
        blocks beyond the margin, up to the card's memory (the allocator gives those blocks back
        before it fails an allocation)."""
        extra = max(0.0, m.cached_gib - m.notebook_gib * MARGIN)
        return max(self.needed_gib(m), min(self.needed_gib(m) + extra, self.card.memory_gib or 0.0))

    @property
    def peak(self) -> tuple[lab_memory.Moment, float] | None:
        """The moment with the highest device-wide memory, and that memory (:meth:`expected_gib`)."""
        if not self.card.gpu or not self.moments:
            return None
        m = max(self.moments, key=self.expected_gib)
        return m, self.expected_gib(m)

    @property
    def need(self) -> float:
        """The most any moment needs (:meth:`needed_gib`); 0 on the CPU."""
        return max((self.needed_gib(m) for m in self.moments), default=0.0) if self.card.gpu else 0.0

    @property
    def fits(self) -> bool:
        return self.need <= (self.card.memory_gib or 0.0) or not self.card.gpu

    def memory_line(self) -> str:
        p = self.peak
        if p is None:
            return "memory: smoke sizes on the CPU (no GPU memory to fit)"
        m, peak = p
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (f"memory: {peak:.1f} of {self.card.memory_gib:.1f} GiB at the peak ({m.name}): {verdict}; an "
                f"estimate (utils.course.lab_memory) with {MARGIN:.0%} margin and {CONTEXT_GIB} GiB of CUDA context per process")

    def text(self, others: Callable[[Card], Iterable[LabPlan]] | None = None) -> str:
        """The plan as the device cell prints it; ``others(card)`` (every lab's plan on that card:
        ``grader.labs.plans_on``) adds their one-line summaries on a card that cannot run everything (a P100)."""
        title = f"Plan for {self.lab}: {self.card.name}, {self.size_tier} sizes"
        lines = [title, "  " + "-" * len(title)]
        lines += ["  " + n for n in card_notes(self.card)]
        lines.append(f"  dtype: {self.dtype} | torch.compile: {'on' if self.compile else 'off'}"
                     + (f" ({self.compile_note})" if self.compile_note else ""))
        lines.append(f"  sizes: {self.sizes!r}")
        lines += [f"  runs: {r}" for r in self.runs]
        lines += [f"  skipped: {what}: {why}" for what, why in self.skipped.items()]
        lines.append("  " + self.memory_line())
        if others is not None and self.card.gpu and not self.card.at_least(COMPILE_MIN):
            lines.append(f"  On this card, lab by lab ({self.card.name}):")
            lines += [f"    {p.lab}: {lab_summary(p)}" for p in others(self.card)]
        return "\n".join(lines)


def card_notes(card: Card) -> list[str]:
    """What every lab on ``card`` should know first."""
    if not card.gpu:
        return ["no CUDA GPU: smoke mode, tiny sizes on the CPU, the same code and lenient checks"]
    cc = ".".join(map(str, card.capability))
    notes = []
    if not card.at_least(TENSOR_CORES_MIN):
        notes.append(f"compute capability {cc}: no tensor cores and no bf16 (fp16 runs on the CUDA cores; datasheet "
                     "peaks in utils.device.hardware.SPECS); no torch.compile, no Triton, no vLLM, no LLM.int8()")
        sm = f"sm_{card.capability[0]}{card.capability[1]}"
        notes.append(f"PyTorch's CUDA 12.8 and newer builds (Kaggle's default image) have no {sm} kernels: if "
                     f"torch.cuda.get_arch_list() lacks '{sm}', every CUDA operation fails; install a CUDA 12.6 "
                     "build of torch, or choose GPU T4 x2")
    elif not card.at_least(BF16_MIN):
        notes.append(f"compute capability {cc}: fp16 tensor cores, no bf16; torch.compile passes PyTorch's 7.0 gate, "
                     "though Triton lists 8.0+ as its supported hardware")
    return notes


def sizes_tier(plan: Any, card: Card) -> str:
    """The size tier of a lab's sizes on ``card``; ``plan`` is the lab's plan (``grader/labs/<lab>/plan.py``):
    the card's tier, unless the plan has its own ``sizes_tier`` (lab 02 on fewer than two GPUs runs CPU
    processes at smoke sizes)."""
    own = getattr(plan, "sizes_tier", None)
    return own(card) if own else card.size_tier


def plan_for(plan: Any, card: Card, sizes: Any, tier: str | None = None) -> LabPlan:
    """The plan of a lab on ``card`` at ``sizes`` (its sizes object of ``tier``). ``plan`` is the lab's
    plan (``grader/labs/<lab>/plan.py``): its ``ASSIGNMENT``, ``parts`` (what runs and what is skipped
    on a card) and ``moments`` (where its memory peaks); ``grader.labs.plan_for`` takes a lab's name."""
    ok, why = compile_support(card)
    tier = tier or sizes_tier(plan, card)
    ctx = lab_memory.Context(half=card_dtype(card), card_gib=card.memory_gib or 0.0,
                             multi_gpu=card.gpus >= 2 and card.gpu,
                             vllm=card.at_least((7, 0)) and not card.lacks("vllm"), sms=card.sms or 132, tier=tier)
    runs, skipped, dtype, compiled, note = plan.parts(card, sizes, ok, why)
    moments = tuple(plan.moments(sizes, ctx)) if card.gpu else ()
    return LabPlan(plan.ASSIGNMENT, card, tier, sizes, dtype, compiled, note, tuple(runs), skipped, moments)


def lab_summary(p: LabPlan) -> str:
    """One line: what runs (or is skipped) and the memory verdict."""
    skips = "; ".join(p.skipped) or "nothing skipped"
    peak = p.peak
    mem = f"{peak[1]:.1f}/{p.card.memory_gib:.1f} GiB" if peak else "CPU"
    return f"{p.dtype}, compile {'on' if p.compile else 'off'}; skips: {skips}; {mem}"


# -- this machine -----------------------------------------------------------------------------

def current_card(smoke: bool) -> Card:
    """The card this process runs on (the CPU in smoke mode): the rehearsed one under
    ``GPULAB_TIER`` (``utils.device.rehearsal``)."""
    if smoke:
        return CARDS["cpu"]
    import torch

    n = torch.cuda.device_count()
    rc = rehearsal.card(0)
    cap = tuple(rehearsal.capability(0))
    name = torch.cuda.get_device_name(0)
    mem = rc.memory_gib if rc else torch.cuda.get_device_properties(0).total_memory / 2**30
    label = f"{rc.name} (rehearsed on {name})" if rc else name
    spec = hardware.spec_for_name(rc.name if rc else name)
    key = {"T4": "t4x2" if n >= 2 else "t4", "P100": "p100", "L4": "l4", "A100-40GB": "a100-40gb"}.get(
        spec.name if spec else "", "this")
    return Card(key, label + (f" x{n}" if n >= 2 else ""), mem, cap, n, "this machine", "torch.cuda",
                software_absent(), torch.cuda.get_device_properties(0).multi_processor_count)


def software_absent() -> tuple[tuple[str, str], ...]:
    """The optional packages a GPU lab uses that this machine cannot use, each with the one-line
    reason the lab itself gives: vLLM (``utils.serving.engines.available``, what lab 03's and 04's engine
    choice reads) and bitsandbytes (``utils.model.quantize``)."""
    absent = []
    ok, why = engines.available("vllm")
    if not ok:
        absent.append(("vllm", why))
    if importlib.util.find_spec("bitsandbytes") is None:
        absent.append(("bitsandbytes", "bitsandbytes is not installed (pip install bitsandbytes)"))
    return tuple(absent)


def arch_warning(card: Card) -> str | None:
    """One line when this PyTorch build has no kernels for ``card`` (a P100 under a CUDA 12.8+ build)."""
    if not card.gpu:
        return None
    import torch

    arch = torch.cuda.get_arch_list()
    major, minor = card.capability
    cc = major * 10 + minor
    runnable = False
    for a in arch:  # SASS runs on its own major version, PTX (compute_XY) is compiled for any newer GPU
        m = re.fullmatch(r"(sm|compute)_(\d+)[af]?", a)
        if m and int(m[2]) <= cc and (m[1] == "compute" or int(m[2]) // 10 == major):
            runnable = True
    if arch and not runnable:
        sm = f"sm_{cc}"
        return (f"THIS PYTORCH HAS NO KERNELS FOR {sm} (it has {' '.join(arch)}): every CUDA operation will fail with "
                "'no kernel image is available'. Install a CUDA 12.6 build (pip install torch --index-url "
                "https://download.pytorch.org/whl/cu126) and restart, or choose another GPU (Kaggle: GPU T4 x2).")
    return None


def describe(sizes: Any, plan: Any, tier: str, smoke: bool,
             others: Callable[[Card], Iterable[LabPlan]] | None = None) -> str:
    """The plan for ``sizes`` (of ``tier``; ``plan``: the lab's ``plan.py``) on this machine, as the
    device cell prints it: a lab's sizes call this from their ``__str__`` (``grader.labs.PrintsPlan``)."""
    card = current_card(smoke)
    warn = arch_warning(card)
    return (warn + "\n" if warn else "") + plan_for(plan, card, sizes, tier).text(others)
