"""utils.serving.loadgen: a load generator for any OpenAI-compatible server (vLLM, SGLang, TGI, ``transformers serve``).

Asynchronous (asyncio + aiohttp), streaming or not, ``/v1/completions`` or
``/v1/chat/completions``. Workloads: synchronous, fixed concurrency, a request rate with
constant or gamma/Poisson arrivals, and GuideLLM's sweep (``workloads``). Metrics with
vLLM's definitions, stated in every result (``metrics.DEFINITIONS``): TTFT, TPOT, ITL, E2E
latency, throughput, goodput, failures by reason, and the load the run actually held.

    from utils.serving import loadgen
    w = loadgen.Workload("http://127.0.0.1:8000", "my-model", num_requests=200,
                         input_len=256, output_len=128, concurrency=16)
    result = loadgen.run(w)           # or: await loadgen.run_async(w) in Jupyter
    result["ttft_ms"]["p95"], result["load_held"]

CLI: ``python -m utils.serving.loadgen --base-url URL --model NAME --num-requests N --input-len N
--output-len N --concurrency C --json-out run.json`` (``--help`` for the rest).
"""
from utils.serving.loadgen.client import LoadgenError, RequestRecord
from utils.serving.loadgen.metrics import (
    DEFINITIONS,
    assess_load,
    in_flight,
    meets_slo,
    parse_goodput,
    stats_ms,
    summarize,
)
from utils.serving.loadgen.report import format_summary, plot_latency_throughput, write_csv, write_json
from utils.serving.loadgen.workloads import (
    Workload,
    arrival_offsets,
    build_bodies,
    load_jsonl,
    run,
    run_async,
    sweep,
    synthetic_prompts,
)

__all__ = [
    "DEFINITIONS", "LoadgenError", "RequestRecord", "Workload", "arrival_offsets", "assess_load", "build_bodies",
    "format_summary", "in_flight", "load_jsonl", "meets_slo", "parse_goodput", "plot_latency_throughput", "run",
    "run_async", "stats_ms", "summarize", "sweep", "synthetic_prompts", "write_csv", "write_json",
]
