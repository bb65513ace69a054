"""Lab 04's sizes per tier, graded thresholds included (``grader.labs.sizes`` picks the device's)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.labs import PrintsPlan

ASSIGNMENT = "04_benchmarking_production"


@dataclass(frozen=True)
class Phase4Sizes(PrintsPlan):
    model: str  # the served preset (utils.serving.serve.build_model_dir): its real checkpoint, or random weights offline
    num_requests: int  # per load run: every sweep step, the operating-point run, the grader's re-runs
    input_len: int  # the course's default prompt length (tokens of the served model's tokenizer)
    output_len: int  # the course's default output length (the served model never stops early)
    max_len: int  # input_len + output_len may not exceed this (KV-cache budget per request)
    sweep_points: int  # request rates between synchronous and saturation
    max_duration_s: float  # cap on one load run: a configuration that cannot keep up stops here
    start_timeout_s: float  # engine start, weights load and warm-up


BY_TIER = {
    "cpu": Phase4Sizes("llama-tiny", 12, 32, 16, 256, 2, 8.0, 600.0),  # vLLM CPU build: 50-110 s to start on 2 quiet cores
    "t4": Phase4Sizes("llama-1.1b", 12, 128, 32, 1024, 2, 60.0, 600.0),
    "a100": Phase4Sizes("llama-1.1b", 16, 256, 32, 1024, 2, 60.0, 600.0),
    "h100": Phase4Sizes("llama-1.1b", 16, 256, 32, 1024, 2, 60.0, 600.0),
}
