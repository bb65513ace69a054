"""Where the notebook runs (Colab, Kaggle, local), smoke mode, and sizes by device.

Smoke mode runs every notebook end to end in minutes on tiny sizes: it is on when no CUDA
GPU is visible or when ``GPULAB_SMOKE=1``. The code path is the same as on a GPU; only
the sizes (and the grading thresholds) change (docs/architecture.md, "Smoke mode").

Sizes come in tiers chosen from the device: ``cpu`` (smoke), ``t4`` (16 GB class, no bf16
tensor cores: T4, P100, V100), ``a100`` (Ampere/Ada: A100, A10, L4, L40S) and ``h100``
(Hopper and newer). A phase asks :func:`phase_sizes` for its numbers; the tier names say
what they were sized for, not what they were measured on. Each tier's sizes are sized to fit its
smallest card by ``utils.lab_memory``'s estimate (``a100``: an L4's 22.5 GiB), and they print as
their plan on this machine (``utils.tier_plan``): dtype, ``torch.compile``, what is skipped and why.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from utils import rehearsal
from utils.rehearsal import TIER_VAR  # force a tier, e.g. GPULAB_TIER=t4 on a big GPU to rehearse

SMOKE_VAR = "GPULAB_SMOKE"
TIERS = ("cpu", "t4", "a100", "h100")


def platform_name() -> str:
    """``colab``, ``kaggle`` or ``local``, from the variables each runtime sets."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG") or os.environ.get("COLAB_GPU"):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE"):
        return "kaggle"
    return "local"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def smoke_mode() -> bool:
    """True with no CUDA GPU, or when ``GPULAB_SMOKE`` is set to 1/true/yes."""
    flag = os.environ.get(SMOKE_VAR, "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off") and cuda_available():
        return False
    return not cuda_available()


def matmul_dtype():
    """The dtype the labs time matmuls in: fp32 in smoke mode (a CPU has no tensor cores), else the
    card's tensor-core dtype: bf16 from Ampere, fp16 before it (a T4), the rehearsed card's under
    ``GPULAB_TIER`` (:func:`utils.rehearsal.half_torch_dtype`)."""
    import torch

    return torch.float32 if smoke_mode() else rehearsal.half_torch_dtype()


def device_tier() -> str:
    """The size tier for this runtime (see the module docstring)."""
    forced = os.environ.get(TIER_VAR, "").strip().lower()
    if forced:
        if forced not in TIERS:
            raise ValueError(f"{TIER_VAR}={forced!r} is not one of {', '.join(TIERS)}")
        return forced
    if smoke_mode():
        return "cpu"
    import torch

    from utils.tier_plan import gpu_tier

    major, _ = torch.cuda.get_device_capability(0)
    return gpu_tier(major, torch.cuda.get_device_properties(0).total_memory / 2**30)


class _PrintsPlan:
    """Sizes print (``str``, what ``print(SIZES)`` shows) as their tier plan, ``utils.tier_plan``:
    the card, dtype, ``torch.compile``, what runs, what is skipped and why, and whether it fits
    the card's memory. ``repr``, fields, ``==`` and ``dataclasses.asdict`` stay the dataclass's."""

    def __str__(self) -> str:
        try:
            from utils import tier_plan

            lab = next(k for k, tiers in _PHASES.items() if type(tiers["cpu"]) is type(self))
            tiers = _PHASES[lab]
            tier = next((t for t, s in tiers.items() if s is self), None) or next(
                (t for t, s in tiers.items() if s == self), device_tier())
            return tier_plan.describe(self, lab, tier, smoke_mode(), phase_sizes)
        except Exception as exc:  # the sizes still print when the plan cannot be made
            return f"{self!r}\n(no plan: {type(exc).__name__}: {exc})"


def repo_root() -> Path:
    """The repository root (the folder holding ``utils/``)."""
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Phase0Sizes(_PrintsPlan):
    matmul_n: int  # square matmul side
    elementwise_numel: int  # elements in the elementwise (memory-bound) op
    tiny_ops: int  # launches in the loop of tiny ops (overhead-bound)
    train_steps: int
    batch_size: int
    seq_len: int
    model: str  # config name in utils/models.py


_PHASE0 = {
    "cpu": Phase0Sizes(256, 1 << 20, 200, 8, 2, 64, "gpt2-tiny"),
    "t4": Phase0Sizes(4096, 1 << 26, 2000, 60, 8, 256, "gpt2-small"),
    "a100": Phase0Sizes(8192, 1 << 27, 2000, 80, 16, 512, "gpt2-small"),
    "h100": Phase0Sizes(8192, 1 << 28, 2000, 100, 16, 1024, "gpt2-small"),
}

@dataclass(frozen=True)
class Phase5Sizes(_PrintsPlan):
    matmul_n: int  # square matmul side (roofline point)
    copy_numel: int  # fp32 elements copied (roofline point)
    model: str  # config name in utils/models.py, for throughput and decode
    train_batch: int
    seq_len: int
    train_steps: int
    decode_batches: tuple[int, ...]  # batch sizes of the decode (right-sizing) measurements
    prompt_len: int
    new_tokens: int  # tokens generated per decode measurement
    ckpt_model: str  # the checkpointed training run (utils.checkpointed_run.RunConfig)
    ckpt_batch: int
    ckpt_seq_len: int
    ckpt_steps: int
    ckpt_every: int
    kill_after: int  # the notebook kills its run after this step (the grader picks another)
    xla_dim: int  # width of the JAX layer in the recompilation experiment
    xla_lengths: tuple[int, ...]  # sequence lengths fed to it, in order


_XLA_CPU = (37, 50, 64, 100, 128, 129, 200, 256, 37, 64)
_XLA_GPU = (300, 512, 700, 1024, 1500, 2048, 2049, 3000, 300, 1024)
_PHASE5 = {
    "cpu": Phase5Sizes(256, 1 << 20, "gpt2-tiny", 4, 64, 8, (1, 4, 16), 16, 16, "gpt2-tiny", 4, 32, 12, 4, 6,
                       128, _XLA_CPU),
    "t4": Phase5Sizes(4096, 1 << 26, "gpt2-small", 8, 256, 20, (1, 8, 32), 64, 32, "gpt2-small", 4, 128, 12, 4, 6,
                      1024, _XLA_GPU),
    "a100": Phase5Sizes(8192, 1 << 27, "gpt2-small", 8, 512, 30, (1, 8, 32, 64), 128, 64, "gpt2-small", 8, 256, 12,
                        4, 6, 2048, _XLA_GPU),
    "h100": Phase5Sizes(8192, 1 << 28, "gpt2-small", 16, 1024, 30, (1, 8, 32, 128), 128, 64, "gpt2-small", 8, 256,
                        12, 4, 6, 4096, _XLA_GPU),
}

@dataclass(frozen=True)
class Phase1Sizes(_PrintsPlan):
    model: str  # the training-loop model (utils/models.py preset)
    seq_len: int
    naive_batch: int  # the naive baseline's small batch
    big_batch: int  # the optimized loop's batch
    steps: int  # measured steps per loop
    ft_model: str  # the LoRA/QLoRA model
    ft_batch: int
    ft_seq_len: int
    min_speedup: float  # graded: optimized over naive tokens/s, same run (H200 reference 9.1x; smoke checks plumbing)


_PHASE1 = {
    "cpu": Phase1Sizes("gpt2-tiny", 64, 2, 8, 6, "llama-tiny", 2, 64, 0.5),
    # t4: batch 16 x 512 is an estimated 14.5 GiB beside the naive loop (utils.lab_memory): too close to 15
    "t4": Phase1Sizes("gpt2-small", 256, 4, 16, 12, "llama-1.1b", 4, 512, 2.0),
    # a100: sized for an L4 (22.5 GiB); batch 32 x 1024 eager peaked at 45.6 GiB on one H200 (training KV cache
    # on, benchmarks/RESULTS.md): measured, not an L4 figure
    "a100": Phase1Sizes("gpt2-small", 512, 4, 16, 12, "llama-1.1b", 8, 512, 4.0),
    "h100": Phase1Sizes("gpt2-small", 1024, 4, 32, 12, "llama-1.1b", 8, 512, 6.0),
}

@dataclass(frozen=True)
class Phase2Sizes(_PrintsPlan):
    model: str  # the reference run (benchmarks/train_multi_gpu.py --preset)
    batch_per_device: int
    seq_len: int
    steps: int  # measured optimizer steps per run
    warmup: int
    bf16: bool  # Accelerate mixed_precision="bf16" (a T4 has no bf16 tensor cores: fp32 there)
    compile: bool  # torch.compile the prepared model (a minute per launch on a GPU)
    small_batch: int  # the "small per-GPU batch" break
    accum_batch: int  # micro-batch of the accumulation break
    grad_accum: int  # micro-batches per step in the accumulation break
    allreduce_sizes: str  # benchmarks/allreduce.py --sizes
    allreduce_iters: int
    min_efficiency: float  # graded: per-device scaling efficiency 1 -> N of the reference run (H200 eager: 0.990)
    post_batch: int  # TRL SFT/DPO batch per GPU (benchmarks/post_train_trl.py --batch-per-device)
    post_max_len: int  # and tokens per sequence (--max-length): DPO runs chosen and rejected, 2x the batch


_PHASE2 = {
    "cpu": Phase2Sizes("gpt2-tiny", 2, 64, 6, 2, False, False, 1, 1, 2, "4KiB,256KiB,4MiB", 20, 0.1, 2, 64),
    "t4": Phase2Sizes("gpt2-small", 8, 512, 15, 3, False, False, 1, 2, 4, "1MiB,16MiB,256MiB", 20, 0.6, 4, 512),
    # a100: sized for its smallest card, an L4 (22.5 GiB): batch 16 x 1024 peaked at 24.02 GiB per GPU on 2x H200
    "a100": Phase2Sizes("gpt2-small", 8, 1024, 20, 5, True, False, 1, 4, 4, "1MiB,16MiB,256MiB,1GiB", 20, 0.85, 8, 512),
    "h100": Phase2Sizes("gpt2-small", 16, 1024, 20, 5, True, False, 1, 4, 4, "1MiB,16MiB,256MiB,1GiB", 20, 0.9, 8, 1024),
}

@dataclass(frozen=True)
class Phase4Sizes(_PrintsPlan):
    model: str  # the served preset (utils.serve.build_model_dir): its real checkpoint, or random weights offline
    num_requests: int  # per load run: every sweep step, the operating-point run, the grader's re-runs
    input_len: int  # the course's default prompt length (tokens of the served model's tokenizer)
    output_len: int  # the course's default output length (the served model never stops early)
    max_len: int  # input_len + output_len may not exceed this (KV-cache budget per request)
    sweep_points: int  # request rates between synchronous and saturation
    max_duration_s: float  # cap on one load run: a configuration that cannot keep up stops here
    start_timeout_s: float  # engine start, weights load and warm-up


_PHASE4 = {
    "cpu": Phase4Sizes("llama-tiny", 12, 32, 16, 256, 2, 8.0, 600.0),  # vLLM CPU build: 50-110 s to start on 2 quiet cores
    "t4": Phase4Sizes("llama-1.1b", 12, 128, 32, 1024, 2, 60.0, 600.0),
    "a100": Phase4Sizes("llama-1.1b", 16, 256, 32, 1024, 2, 60.0, 600.0),
    "h100": Phase4Sizes("llama-1.1b", 16, 256, 32, 1024, 2, 60.0, 600.0),
}

@dataclass(frozen=True)
class Phase3Sizes(_PrintsPlan):
    model: str  # the decode, KV-cache and quantization model (utils/models.py preset)
    prompt_len: int  # decode prompt (tokens)
    new_tokens: int  # tokens per decode measurement: TPOT = (t(n) - t(1)) / (n - 1)
    ttft_lens: tuple[int, ...]  # prompt lengths of the prefill (TTFT) sweep
    kv_batch: int  # sequences in the KV-growth measurement
    kv_new_tokens: int  # decode steps in the KV-growth measurement
    batches: tuple[int, ...]  # batching sweep (fast decode path)
    copy_numel: int  # fp32 elements in the copy-bandwidth measurement
    ppl_seq_len: int  # perplexity block length (held-out text)
    ppl_blocks: int
    quant_new_tokens: int  # tokens per decode measurement of the quantized models (eager bitsandbytes is slow)
    cb_requests: int  # requests in the continuous-batching run
    min_fast_speedup: float  # graded: fast path over eager generate tokens/s, same run (smoke checks plumbing)


_PHASE3 = {
    "cpu": Phase3Sizes("llama-tiny", 16, 8, (16, 32, 64, 128), 2, 8, (1, 2, 4), 1 << 20, 64, 4, 4, 6, 0.5),
    "t4": Phase3Sizes("llama-1.1b", 128, 32, (128, 256, 512, 1024), 4, 32, (1, 4, 16), 1 << 26, 512, 8, 16, 16, 2.0),
    "a100": Phase3Sizes("llama-1.1b", 128, 64, (128, 512, 1024, 2048), 4, 64, (1, 8, 32), 1 << 27, 512, 8, 16, 32, 3.0),
    "h100": Phase3Sizes("llama-1.1b", 128, 64, (128, 512, 1024, 2048), 4, 64, (1, 8, 32), 1 << 28, 512, 8, 16, 32, 4.0),
}

_PHASES = {"00_foundations": _PHASE0, "01_single_gpu": _PHASE1, "02_multi_gpu": _PHASE2, "03_inference_serving": _PHASE3, "04_benchmarking_production": _PHASE4, "05_hardware_and_cost": _PHASE5}


def phase_sizes(phase: str, tier: str | None = None):
    """The sizes of ``phase`` (e.g. ``"00_foundations"``) for ``tier`` (default: this device)."""
    if phase not in _PHASES:
        raise KeyError(f"no sizes for phase {phase!r}; known: {', '.join(_PHASES)}")
    if tier is None:
        line = rehearsal.apply()  # a forced smaller tier on a bigger GPU: that card's memory and dtype
        if line and line not in _said:
            _said.add(line)
            print(line)
    return _PHASES[phase][tier or device_tier()]


_said: set[str] = set()


def describe() -> dict:
    """The environment part of the device report."""
    return {
        "platform": platform_name(),
        "smoke": smoke_mode(),
        "tier": device_tier(),
        "python": sys.version.split()[0],
        "repo_root": str(repo_root()),
    }
