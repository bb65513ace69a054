"""Lab 03's sizes per tier, graded thresholds included (``grader.labs.sizes`` picks the device's)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.labs import PrintsPlan

ASSIGNMENT = "03_inference_serving"


@dataclass(frozen=True)
class Phase3Sizes(PrintsPlan):
    model: str  # the decode, KV-cache and quantization model (utils/model/models.py preset)
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


BY_TIER = {
    "cpu": Phase3Sizes("llama-tiny", 16, 8, (16, 32, 64, 128), 2, 8, (1, 2, 4), 1 << 20, 64, 4, 4, 6, 0.5),
    "t4": Phase3Sizes("llama-1.1b", 128, 32, (128, 256, 512, 1024), 4, 32, (1, 4, 16), 1 << 26, 512, 8, 16, 16, 2.0),
    "a100": Phase3Sizes("llama-1.1b", 128, 64, (128, 512, 1024, 2048), 4, 64, (1, 8, 32), 1 << 27, 512, 8, 16, 32, 3.0),
    "h100": Phase3Sizes("llama-1.1b", 128, 64, (128, 512, 1024, 2048), 4, 64, (1, 8, 32), 1 << 28, 512, 8, 16, 32, 4.0),
}
