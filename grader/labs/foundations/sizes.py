"""Lab 00's sizes per tier, graded thresholds included (``grader.labs.sizes`` picks the device's)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.labs import PrintsPlan

ASSIGNMENT = "00_foundations"


@dataclass(frozen=True)
class Phase0Sizes(PrintsPlan):
    matmul_n: int  # square matmul side
    elementwise_numel: int  # elements in the elementwise (memory-bound) op
    tiny_ops: int  # launches in the loop of tiny ops (overhead-bound)
    train_steps: int
    batch_size: int
    seq_len: int
    model: str  # config name in utils/model/models.py


BY_TIER = {
    "cpu": Phase0Sizes(256, 1 << 20, 200, 8, 2, 64, "gpt2-tiny"),
    "t4": Phase0Sizes(4096, 1 << 26, 2000, 60, 8, 256, "gpt2-small"),
    "a100": Phase0Sizes(8192, 1 << 27, 2000, 80, 16, 512, "gpt2-small"),
    "h100": Phase0Sizes(8192, 1 << 28, 2000, 100, 16, 1024, "gpt2-small"),
}
