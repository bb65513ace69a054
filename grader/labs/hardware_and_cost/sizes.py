"""Lab 05's sizes per tier, graded thresholds included (``grader.labs.sizes`` picks the device's)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.labs import PrintsPlan

ASSIGNMENT = "05_hardware_and_cost"


@dataclass(frozen=True)
class Phase5Sizes(PrintsPlan):
    matmul_n: int  # square matmul side (roofline point)
    copy_numel: int  # fp32 elements copied (roofline point)
    model: str  # config name in utils/model/models.py, for throughput and decode
    train_batch: int
    seq_len: int
    train_steps: int
    decode_batches: tuple[int, ...]  # batch sizes of the decode (right-sizing) measurements
    prompt_len: int
    new_tokens: int  # tokens generated per decode measurement
    ckpt_model: str  # the checkpointed training run (utils.train.checkpointed_run.RunConfig)
    ckpt_batch: int
    ckpt_seq_len: int
    ckpt_steps: int
    ckpt_every: int
    kill_after: int  # the notebook kills its run after this step (the grader picks another)
    xla_dim: int  # width of the JAX layer in the recompilation experiment
    xla_lengths: tuple[int, ...]  # sequence lengths fed to it, in order


_XLA_CPU = (37, 50, 64, 100, 128, 129, 200, 256, 37, 64)
_XLA_GPU = (300, 512, 700, 1024, 1500, 2048, 2049, 3000, 300, 1024)
BY_TIER = {
    "cpu": Phase5Sizes(256, 1 << 20, "gpt2-tiny", 4, 64, 8, (1, 4, 16), 16, 16, "gpt2-tiny", 4, 32, 12, 4, 6,
                       128, _XLA_CPU),
    "t4": Phase5Sizes(4096, 1 << 26, "gpt2-small", 8, 256, 20, (1, 8, 32), 64, 32, "gpt2-small", 4, 128, 12, 4, 6,
                      1024, _XLA_GPU),
    "a100": Phase5Sizes(8192, 1 << 27, "gpt2-small", 8, 512, 30, (1, 8, 32, 64), 128, 64, "gpt2-small", 8, 256, 12,
                        4, 6, 2048, _XLA_GPU),
    "h100": Phase5Sizes(8192, 1 << 28, "gpt2-small", 16, 1024, 30, (1, 8, 32, 128), 128, 64, "gpt2-small", 8, 256,
                        12, 4, 6, 4096, _XLA_GPU),
}
