"""``python -m utils.serving.loadgen``: the command line. A thin layer over ``run`` and ``sweep``.

Exit status: 0 when the run finished (check ``load_held`` and ``failed`` in the output),
1 on bad input or an unusable server (one line on stderr) or when no request completed,
2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from utils.serving.loadgen.client import LoadgenError
from utils.serving.loadgen.metrics import parse_goodput
from utils.serving.loadgen.report import format_summary, plot_latency_throughput, runs_of, write_csv, write_json
from utils.serving.loadgen.workloads import Workload, run, sweep


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (use inf for all at once)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m utils.serving.loadgen",
                                description="Load-test an OpenAI-compatible server; metrics with vLLM's definitions.")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", required=True, help="the model name the server serves")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (synthetic prompts)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens (and min_tokens/ignore_eos if accepted)")
    load = p.add_argument_group("load (choose --concurrency, --request-rate or --sweep)")
    load.add_argument("--concurrency", type=int, help="requests in flight; with --request-rate, a cap")
    load.add_argument("--request-rate", type=_rate, help="requests per second; inf sends all at once")
    load.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    load.add_argument("--sweep", action="store_true", help="synchronous -> throughput -> rates between (GuideLLM)")
    load.add_argument("--sweep-points", type=int, default=6, help="rates between synchronous and throughput")
    data = p.add_argument_group("prompts")
    data.add_argument("--dataset", help="JSONL with 'prompt' or 'messages' per line (optional 'output_len')")
    data.add_argument("--tokenizer", help="HF tokenizer name or path: exact synthetic prompt lengths")
    data.add_argument("--seed", type=int, default=None,
                      help="prompts and arrivals (default: a fresh seed per run, recorded in the summary)")
    req = p.add_argument_group("requests")
    req.add_argument("--timeout-s", type=float, default=300.0, help="per-request total timeout")
    req.add_argument("--max-duration-s", type=float, help="stop the run (each sweep step) after this long")
    req.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50 e2el:5000")
    req.add_argument("--no-stream", action="store_true", help="non-streaming requests (no TTFT/TPOT/ITL)")
    req.add_argument("--no-fixed-output", action="store_true", help="do not send ignore_eos/min_tokens")
    req.add_argument("--extra-body", help="JSON object merged into every request body")
    req.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    req.add_argument("--no-probe", action="store_true", help="skip the warm-up request that checks the server")
    req.add_argument("--max-dispatch-delay-ms", type=float, default=10.0, help="rate runs: p99 above this = load not held")
    out = p.add_argument_group("output")
    out.add_argument("--json-out", help="everything, including the per-request trace")
    out.add_argument("--csv-out", help="one row per run")
    out.add_argument("--plot-out", help="latency-throughput figure (png, pdf, svg)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.sweep and a.request_rate is not None:
        p.error("--sweep chooses its own rates: drop --request-rate")
    if not a.sweep and a.concurrency is None and a.request_rate is None:
        p.error("name the load: --concurrency N, --request-rate R (inf = all at once) or --sweep")
    try:
        extra = json.loads(a.extra_body) if a.extra_body else {}
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--extra-body must be a JSON object: {e}")
    try:
        slo = parse_goodput(a.goodput or [])
    except ValueError as e:
        p.error(str(e))
    w = Workload(base_url=a.base_url, model=a.model, num_requests=a.num_requests, input_len=a.input_len,
                 output_len=a.output_len, endpoint=a.endpoint, concurrency=a.concurrency,
                 request_rate=a.request_rate if a.request_rate is not None else math.inf, arrival=a.arrival,
                 burstiness=a.burstiness, stream=not a.no_stream, dataset=a.dataset, tokenizer=a.tokenizer, seed=a.seed,
                 timeout_s=a.timeout_s, max_duration_s=a.max_duration_s, fixed_output=not a.no_fixed_output,
                 extra_body=extra, api_key=a.api_key, slo_ms=slo, probe=not a.no_probe,
                 max_dispatch_delay_ms=a.max_dispatch_delay_ms)
    try:
        result = sweep(w, points=a.sweep_points, progress=not a.no_progress) if a.sweep else run(w, progress=not a.no_progress)
        print(format_summary(result))
        if a.json_out:
            write_json(result, a.json_out)
        if a.csv_out:
            write_csv(result, a.csv_out)
        if a.plot_out:
            plot_latency_throughput(result, a.plot_out)
    except LoadgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if sum(s["completed"] for s in runs_of(result)) == 0:
        print("error: no request completed; see the failures above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
