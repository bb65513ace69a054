"""Phase 4 on one GPU: a served 1.1B Llama-shaped model under load, bf16 against bitsandbytes 4-bit and 8-bit.

    python benchmarks/phase4_serving.py --out FILE.json             # on a GPU (250 s on an H200 with --budget-s 400)
    python benchmarks/phase4_serving.py --out FILE.json --smoke     # on a CPU: llama-tiny, plumbing only

The engine is ``transformers serve`` (``utils.serving.serve``): the lab's sizes for this device
(``grader.labs.sizes("04_benchmarking_production")``), random weights, exact output
lengths. The baseline configuration (continuous batching, bf16) gets what the notebook does:
a synchronous calibration run, SLOs from it (TTFT 5x, TPOT 3x, E2E latency 4x the unloaded
p50, the notebook's reference answer), a load sweep, the capacity under those SLOs (90% of
requests within every SLO), and three runs at 70% of it (their spread is the band the
grader would use). Every other configuration (one request at a time; bnb-4bit; bnb-8bit)
gets a short synchronous run (unloaded decode speed) and a run at the baseline's operating
rate, capped at ``--other-cap-s``. For each: engine start time, GPU memory it took
(NVML), TTFT/TPOT/ITL/E2E statistics, goodput, and the weights read per second at the
synchronous TPOT against the datasheet bandwidth. The JSON is rewritten after every
configuration; a configuration that fails is recorded with its error (and its log's end) and
the run goes on; none starts after ``--budget-s``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path

CONFIGS = {  # name -> utils.serving.serve.start options
    "cb-bf16": {},
    "sequential-bf16": {"continuous_batching": False},
    "cb-bnb-4bit": {"quantization": "bnb-4bit"},
    "cb-bnb-8bit": {"quantization": "bnb-8bit"},
}
STATS = ("mean", "p50", "p95", "p99", "min")


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


def brief(run: dict) -> dict:
    """A run without its per-request records."""
    out = {k: run.get(k) for k in ("label", "completed", "failed", "cancelled", "not_sent", "duration_s",
                                   "request_throughput", "output_throughput", "goodput", "load_held", "load_warning",
                                   "output_tokens_mean", "prompt_tokens_mean", "warnings")}
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        out[m] = {k: run[m][k] for k in STATS}
    out["offered_rate"] = run["workload"]["request_rate"]
    out["client_cpu_ms_per_request"] = run["client"]["cpu_ms_per_request"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--smoke", action="store_true", help="CPU sizes (the tiny preset), CPU engine")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--max-duration-s", type=float, default=None, help="cap per load run (default: the lab's)")
    ap.add_argument("--other-cap-s", type=float, default=30.0, help="cap per load run of the other configurations")
    ap.add_argument("--budget-s", type=float, default=400.0, help="start no configuration after this many seconds")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()

    import torch

    from grader.labs import sizes as lab_sizes
    from grader.labs.benchmarking_production import judges as R
    from utils.device import hardware, nvml
    from utils.serving import loadgen, serve
    from utils.units import gb_per_s

    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    gpu = torch.cuda.is_available() and not a.smoke
    if not gpu and not a.smoke:
        print("error: no CUDA GPU visible; use --smoke for the CPU plumbing run", file=sys.stderr)
        return 2
    sizes = lab_sizes("04_benchmarking_production", None if gpu else "cpu")
    cap_s = a.max_duration_s or sizes.max_duration_s
    device = "cuda" if gpu else "cpu"
    spec = hardware.current_spec() if gpu else hardware.CPU_SPEC

    bnb, bnb_why = None, ""
    try:
        import bitsandbytes

        bnb = bitsandbytes.__version__
    except Exception as exc:  # not installed, or no GPU build: the bnb configurations are skipped
        bnb_why = f"{type(exc).__name__}: {exc}"
    import transformers

    out = {"fingerprint": hardware.fingerprint(), "versions": {"torch": torch.__version__,
                                                               "transformers": transformers.__version__,
                                                               "bitsandbytes": bnb},
           "sizes": dataclasses.asdict(sizes), "max_duration_s": cap_s, "configs": {}}
    t0 = time.perf_counter()
    model_dir = serve.build_model_dir(sizes.model, device=device)
    marker = serve.read_marker(model_dir)
    out["model"] = {k: marker[k] for k in ("preset", "dtype", "params", "weight_bytes", "vocab_size")}
    out["model"]["build_s"] = round(time.perf_counter() - t0, 2)
    out["model"]["suppressed_ids"] = marker["vocab_size"] - len(marker["allowed_token_ids"])
    print(f"model dir {model_dir} ({marker['params'] / 1e9:.3g}B parameters, {marker['dtype']}) in "
          f"{out['model']['build_s']} s", flush=True)
    kv_tokens = sizes.num_requests * sizes.max_len
    base_w = operating_rate = None

    for name in configs:
        opts = CONFIGS[name]
        entry: dict = {"options": opts}
        out["configs"][name] = entry
        if time.perf_counter() - t_start > a.budget_s:
            entry["skipped"] = f"over the --budget-s of {a.budget_s:g} s"
            continue
        if opts.get("quantization") and (bnb is None or not gpu):
            entry["skipped"] = "needs a GPU and bitsandbytes" + ("" if bnb else f" ({bnb_why})")
            print(f"{name}: skipped ({entry['skipped']})", flush=True)
            _save(a.out, out)
            continue
        if name != "cb-bf16" and operating_rate is None:
            entry["skipped"] = "the baseline cb-bf16 did not give an operating rate"
            continue
        before = nvml.used_gib(0)
        try:
            with serve.start(model_dir, engine="transformers", device=device, kv_cache_tokens=kv_tokens,
                             timeout_s=sizes.start_timeout_s, **opts) as server:
                entry["ready_s"] = server.ready_s
                entry["label"] = server.label
                entry["command"] = server.command[2:]
                after = nvml.used_gib(0)
                entry["gpu_memory_gib"] = None if None in (before, after) else round(after - before, 3)
                fields = server.workload_fields()
                print(f"{name}: ready in {server.ready_s} s, GPU memory {entry['gpu_memory_gib']} GiB", flush=True)
                n_sync, run_cap = (sizes.num_requests, cap_s) if name == "cb-bf16" else (4, min(cap_s, a.other_cap_s))
                sync = loadgen.run(loadgen.Workload(**fields, num_requests=n_sync, input_len=sizes.input_len,
                                                    output_len=sizes.output_len, concurrency=1, max_duration_s=run_cap),
                                   progress=False, label="synchronous")
                entry["synchronous"] = brief(sync)
                tpot = sync["tpot_ms"]["p50"]
                if tpot:
                    gbs = gb_per_s(marker["weight_bytes"], tpot)
                    entry["weights_read_gbs_at_sync_tpot"] = round(gbs, 1)
                    entry["fraction_of_datasheet_bandwidth"] = round(gbs / spec.bandwidth_gbs, 4) if gpu else None
                print(f"  synchronous: TTFT p50 {sync['ttft_ms']['p50']} ms, TPOT p50 {tpot} ms", flush=True)
                if name == "cb-bf16":
                    slo = {"ttft": 5 * sync["ttft_ms"]["p50"], "tpot": 3 * sync["tpot_ms"]["p50"],
                           "e2el": 4 * sync["e2el_ms"]["p50"]}
                    base_w = loadgen.Workload(**fields, num_requests=sizes.num_requests, input_len=sizes.input_len,
                                              output_len=sizes.output_len, max_duration_s=cap_s, slo_ms=slo)
                    sw = loadgen.sweep(base_w, points=sizes.sweep_points, progress=False)
                    cap = R.reference_capacity(sw)
                    operating_rate = R.HEADROOM * cap
                    entry.update(slo_ms=slo, sweep=[brief(r) for r in sw["runs"]], sweep_warnings=sw["warnings"],
                                 capacity_rps=cap, operating_rate=operating_rate)
                    print("  sweep: " + "; ".join(f"{r['label']} {r['request_throughput']:.3g} req/s, "
                                                  f"{r['goodput']['fraction_of_completed'] or 0:.0%} in SLO" for r in sw["runs"])
                          + f"; capacity {cap:.3g} req/s", flush=True)
                    runs = [loadgen.run(dataclasses.replace(base_w, request_rate=operating_rate, probe=k == 0),
                                        progress=False, label=f"operating {k}") for k in range(3)]
                else:
                    w = dataclasses.replace(base_w, **fields, request_rate=operating_rate, max_duration_s=run_cap)
                    runs = [loadgen.run(w, progress=False, label="operating")]
                entry["operating"] = [brief(r) for r in runs]
                g = [(r["goodput"] or {}).get("request_goodput") for r in runs]
                e = [r["e2el_ms"]["p95"] for r in runs]
                entry["goodput_rps"], entry["p95_e2el_ms"] = g, e
                print(f"  at {operating_rate:.3g} req/s: goodput {g} req/s, p95 E2E {e} ms", flush=True)
        except serve.ServeError as exc:
            entry["error"] = str(exc)
            print(f"{name}: {exc}", flush=True)
        except Exception as exc:  # record and go on to the next configuration
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-2000:]
            print(f"{name}: {entry['error']}", flush=True)
        _save(a.out, out)

    base = out["configs"].get("cb-bf16", {})
    rows = {n: c for n, c in out["configs"].items() if c.get("goodput_rps")}
    if rows:
        table = {n: {"goodput_rps": c["goodput_rps"][0], "p95_e2el_ms": c["p95_e2el_ms"][0]} for n, c in rows.items()}
        out["choice_by_the_notebook_rule"] = R.reference_choice(table)
        g = [x for x in base.get("goodput_rps", []) if x]
        if len(g) > 1:
            out["operating_goodput_spread"] = round((max(g) - min(g)) / sorted(g)[len(g) // 2], 4)
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    _save(a.out, out)
    print(json.dumps({n: {k: c.get(k) for k in ("ready_s", "gpu_memory_gib", "goodput_rps", "p95_e2el_ms",
                                                 "weights_read_gbs_at_sync_tpot", "skipped", "error")}
                      for n, c in out["configs"].items()}, indent=1))
    print(f"wrote {a.out} in {out['wall_s']} s; choice by the notebook's rule: {out.get('choice_by_the_notebook_rule')}")
    ok = "error" not in base and base.get("goodput_rps") and all(not math.isnan(x or 0) for x in base["goodput_rps"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
