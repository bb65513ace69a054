"""How much load utils.serving.loadgen can hold, and its client CPU per request.

Issue 7's setting: a local server with known timing (tests/timed_server.py, its own
process), TTFT 20 ms, ITL 5 ms, 32 output tokens, concurrency 64. A request then lasts
20 + 31 * 5 = 175 ms, so the schedule allows at most 64 / 0.175 = 366 requests/s.
Goal: at least 250 requests/s with the concurrency held, under 3 ms of client CPU per
request (client process only: ``time.process_time`` and ``resource.getrusage`` of this
process; the server's CPU is reported apart from /proc).

    .venv/bin/python benchmarks/loadgen_overhead.py [--num-requests 3000] [--json-out FILE]
    .venv/bin/python benchmarks/loadgen_overhead.py --compare-httpx   # why aiohttp, not httpx

``--compare-httpx`` times the bare streaming loop of both HTTP clients (read every chunk,
no parsing) in the same setting: the CPU per request of the library alone. uvloop is used
when installed (``event_loop`` in the output says which loop ran).

Prints one JSON object (and writes it with --json-out). On a shared machine, rerun if
``server_cpu_s + client_cpu_s`` is far below ``duration_s * cores``: another process had
the CPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

from utils.serving import loadgen

ROOT = Path(__file__).resolve().parents[1]


def _timed_server():
    spec = importlib.util.spec_from_file_location("timed_server", ROOT / "tests" / "timed_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


async def _bare_clients(url: str, n: int, concurrency: int, output_len: int) -> dict:
    """CPU per streamed request of aiohttp and httpx alone: the same request, every chunk read."""
    import asyncio

    import aiohttp
    import httpx

    body = json.dumps({"model": "timed-model", "prompt": "a b c", "max_tokens": output_len, "stream": True}).encode()
    headers = {"Content-Type": "application/json"}

    async def timed(open_stream):
        jobs = iter(range(n))

        async def worker():
            for _ in jobs:
                await open_stream()

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"request_throughput": round(n / (time.perf_counter() - t0), 1),
                "cpu_ms_per_request": round(1e3 * (time.process_time() - cpu0) / n, 3)}

    out = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def aiohttp_stream():
            async with s.post(url, data=body, headers=headers) as r:
                async for _ in r.content.iter_any():
                    pass
        out[f"aiohttp {aiohttp.__version__}"] = await timed(aiohttp_stream)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=60) as c:
        async def httpx_stream():
            async with c.stream("POST", url, content=body, headers=headers) as r:
                async for _ in r.aiter_raw():
                    pass
        out[f"httpx {httpx.__version__}"] = await timed(httpx_stream)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--progress", action="store_true", help="show the progress bar (on by default in the CLI)")
    p.add_argument("--compare-httpx", action="store_true", help="time the bare aiohttp and httpx loops instead")
    p.add_argument("--json-out")
    a = p.parse_args(argv)
    ts = _timed_server()
    if a.compare_httpx:
        import asyncio

        with ts.serve_in_subprocess(ttft_ms=a.ttft_ms, itl_ms=a.itl_ms) as (url, _pid):
            n = min(a.num_requests, 1000)
            res = asyncio.run(_bare_clients(url + "/v1/completions", n, a.concurrency, a.output_len))
        out = {"benchmark": "loadgen_overhead --compare-httpx", "date": time.strftime("%Y-%m-%d"),
               "cpu_count": os.cpu_count(), "num_requests": n, "concurrency": a.concurrency, "clients": res}
        print(json.dumps(out, indent=1))
        return out
    request_s = (a.ttft_ms + (a.output_len - 1) * a.itl_ms) / 1e3
    with ts.serve_in_subprocess(ttft_ms=a.ttft_ms, itl_ms=a.itl_ms) as (url, server_pid):
        w = loadgen.Workload(url, ts.MODEL, num_requests=a.num_requests, input_len=16, output_len=a.output_len,
                             concurrency=a.concurrency)
        srv0, ru0, cpu0, t0 = _proc_cpu_s(server_pid), resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        res = loadgen.run(w, progress=a.progress)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        srv1 = _proc_cpu_s(server_pid)
    sent = res["completed"] + res["failed"]
    out = {
        "benchmark": "loadgen_overhead", "date": time.strftime("%Y-%m-%d"), "machine": _cpu_model(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "event_loop": res["client"]["event_loop"],
        "command": "python benchmarks/loadgen_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "workload": res["label"], "num_requests": a.num_requests, "truth_ttft_ms": a.ttft_ms, "truth_tpot_ms": a.itl_ms,
        "schedule_max_request_rate": round(a.concurrency / request_s, 1),
        "request_throughput": res["request_throughput"], "completed": res["completed"], "failed": res["failed"],
        "in_flight_mean": res["load"]["in_flight_mean"], "load_held": res["load_held"], "warnings": res["warnings"],
        "ttft_ms_mean": res["ttft_ms"]["mean"], "tpot_ms_mean": res["tpot_ms"]["mean"], "itl_ms_mean": res["itl_ms"]["mean"],
        "duration_s": res["duration_s"],
        "client_cpu_ms_per_request_run": res["client"]["cpu_ms_per_request"],
        "client_cpu_ms_per_request_total": round(1e3 * cpu / max(sent, 1), 3),
        "client_rusage_user_s": round(ru1.ru_utime - ru0.ru_utime, 3), "client_rusage_sys_s": round(ru1.ru_stime - ru0.ru_stime, 3),
        "client_wall_s": round(wall, 3),
        "server_cpu_s": None if srv0 is None or srv1 is None else round(srv1 - srv0, 3),
        "loop_lag_ms_p99": res["client"]["loop_lag_ms_p99"],
        "goal_met": res["request_throughput"] >= 250 and res["load_held"] and 1e3 * cpu / max(sent, 1) < 3.0,
    }
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
