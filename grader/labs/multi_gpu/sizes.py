"""Lab 02's sizes per tier, graded thresholds included (``grader.labs.sizes`` picks the device's)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.labs import PrintsPlan

ASSIGNMENT = "02_multi_gpu"


@dataclass(frozen=True)
class Phase2Sizes(PrintsPlan):
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


BY_TIER = {
    "cpu": Phase2Sizes("gpt2-tiny", 2, 64, 6, 2, False, False, 1, 1, 2, "4KiB,256KiB,4MiB", 20, 0.1, 2, 64),
    "t4": Phase2Sizes("gpt2-small", 8, 512, 15, 3, False, False, 1, 2, 4, "1MiB,16MiB,256MiB", 20, 0.6, 4, 512),
    # a100: sized for its smallest card, an L4 (22.5 GiB): batch 16 x 1024 peaked at 24.02 GiB per GPU on 2x H200
    "a100": Phase2Sizes("gpt2-small", 8, 1024, 20, 5, True, False, 1, 4, 4, "1MiB,16MiB,256MiB,1GiB", 20, 0.85, 8, 512),
    "h100": Phase2Sizes("gpt2-small", 16, 1024, 20, 5, True, False, 1, 4, 4, "1MiB,16MiB,256MiB,1GiB", 20, 0.9, 8, 1024),
}
