"""utils.loadgen against tests/timed_server.py (its own process, loopback): measured timing
against the known truth, the load held, arrivals, failures by reason, outputs and the CLI.

Accuracy band (issue 7): TTFT and TPOT within 2% plus 1 ms of the server's configured
timing. The server sends on absolute deadlines, so what the client sees beyond the configured
timing is the trip through both HTTP stacks plus the server's wake-up lateness: about 1.0 to
1.6 ms measured on this 2-core machine (client aiohttp 0.15 ms, server parse and dispatch 0.5 ms,
sleep lateness 0.3 ms, delivery 0.2 ms). Requests that arrive together queue in the server and
see more; the accuracy runs keep arrivals apart.
"""
import asyncio
import csv
import json
import math
import socket
import subprocess
import sys

import pytest
import timed_server

from utils import loadgen
from utils.env import repo_root
from utils.loadgen.__main__ import main as cli_main

TTFT_MS, ITL_MS, N_TOK = 100.0, 20.0, 8


@pytest.fixture(scope="module")
def server():
    with timed_server.serve_in_subprocess(ttft_ms=TTFT_MS, itl_ms=ITL_MS) as srv:
        yield srv.url


def _url(base, **scenario):
    return base + ("/s/" + ",".join(f"{k}={v}" for k, v in scenario.items()) if scenario else "")


def _run(base, scenario=None, **kw):
    kw = {"num_requests": 8, "input_len": 8, "output_len": N_TOK, "concurrency": 4, **kw}
    return loadgen.run(loadgen.Workload(_url(base, **(scenario or {})), timed_server.MODEL, **kw), progress=False)


def _close(measured, truth):
    return abs(measured - truth) <= 0.02 * truth + 1.0


@pytest.mark.parametrize("endpoint,scenario,load", [
    ("completions", {}, {"concurrency": 1, "num_requests": 6}),
    # An empty role chunk first and no [DONE] (transformers serve); arrivals 73 ms apart keep about
    # four requests in flight without two arriving, or two sending a token, at the same instant.
    ("chat", {"role_early": 1, "done": 0}, {"concurrency": None, "request_rate": 1 / 0.073, "arrival": "constant",
                                            "num_requests": 10}),
])
def test_ttft_tpot_itl_match_the_server_timing(server, endpoint, scenario, load):
    r = _run(server, scenario, endpoint=endpoint, **load)
    n = load["num_requests"]
    assert r["completed"] == n and r["failed"] == 0
    assert r["output_tokens_source"] == "usage" and r["output_tokens_mean"] == N_TOK
    assert _close(r["ttft_ms"]["mean"], TTFT_MS), r["ttft_ms"]
    assert _close(r["ttft_ms"]["p50"], TTFT_MS), r["ttft_ms"]
    assert _close(r["tpot_ms"]["mean"], ITL_MS), r["tpot_ms"]
    assert _close(r["itl_ms"]["mean"], ITL_MS), r["itl_ms"]
    assert r["itl_ms"]["n"] == n * (N_TOK - 1)
    assert _close(r["e2el_ms"]["mean"], TTFT_MS + (N_TOK - 1) * ITL_MS), r["e2el_ms"]


def test_without_usage_tokens_are_counted_chunks(server):
    r = _run(server, {"usage": 0, "done": 0})
    assert r["completed"] == 8 and r["output_tokens_source"] == "chunks" and r["output_tokens_mean"] == N_TOK


def test_non_streaming_measures_latency_only(server):
    r = _run(server, stream=False)
    assert r["completed"] == 8 and r["ttft_ms"]["n"] == 0 and r["tpot_ms"]["mean"] is None
    assert _close(r["e2el_ms"]["mean"], TTFT_MS + (N_TOK - 1) * ITL_MS)


def test_concurrency_is_held_and_reported(server):
    r = _run(server, {"ttft_ms": 5, "itl_ms": 1}, num_requests=48, concurrency=8)
    load = r["load"]
    assert r["completed"] == 48 and load["in_flight_max"] == 8
    assert load["in_flight_mean"] >= 0.9 * 8 and r["load_held"] is True and r["load_warning"] is None
    assert r["workload"]["kind"] == "concurrency 8"


def test_concurrency_cap_on_an_all_at_once_run(server):
    r = _run(server, {"ttft_ms": 5, "itl_ms": 1}, num_requests=12, concurrency=None, request_rate=math.inf)
    assert r["load"]["in_flight_max"] == 12  # all at once
    r = _run(server, {"ttft_ms": 5, "itl_ms": 1}, num_requests=12, concurrency=3, request_rate=math.inf)
    assert r["load"]["in_flight_max"] == 3


@pytest.mark.parametrize("arrival", ["constant", "poisson"])
def test_rate_runs_follow_their_schedule(server, arrival):
    rate, n = 50.0, 15
    r = _run(server, {"ttft_ms": 5, "itl_ms": 1}, num_requests=n, concurrency=None, request_rate=rate, arrival=arrival,
             seed=4)
    want = loadgen.arrival_offsets(n, rate, arrival=arrival, seed=4)
    reqs = r["requests"]
    assert [q["scheduled_s"] for q in reqs] == pytest.approx(want.tolist(), abs=1e-5)
    assert all(q["sent_s"] >= q["scheduled_s"] - 1e-6 for q in reqs)  # never early
    assert r["load"]["dispatch_delay_ms"]["n"] == n and r["load"]["schedule_request_rate"] > 0
    assert "rate 50" in r["workload"]["kind"]


def test_failed_requests_are_counted_with_their_reason(server):
    r = _run(server, {"fail_every": 3, "fail_status": 500, "ttft_ms": 5, "itl_ms": 1}, num_requests=9, concurrency=1,
             probe=False)
    assert r["completed"] == 6 and r["failed"] == 3 and r["failures"] == {"http_500": 3}
    assert "injected failure" in r["failure_examples"]["http_500"]
    assert r["ttft_ms"]["n"] == r["e2el_ms"]["n"] == 6  # failures do not enter the latencies


@pytest.mark.parametrize("scenario,reason", [
    ({"hang": 1}, "timeout"),
    ({"hang_after": 3}, "timeout"),
    ({"drop_after": 3}, "dropped_stream"),
    ({"end_after": 3}, "dropped_stream"),
    ({"malformed_after": 2}, "malformed_chunk"),
    ({"error_after": 2}, "stream_error"),
    ({"plain": 1}, "malformed_chunk"),
    ({"end_after": 0}, "dropped_stream"),
])
def test_broken_streams_fail_with_a_reason_and_the_run_ends(server, scenario, reason):
    r = _run(server, {"ttft_ms": 5, "itl_ms": 1, **scenario}, num_requests=3, probe=False, timeout_s=0.5)
    assert r["completed"] == 0 and r["failures"] == {reason: 3}, r["failure_examples"]


def test_a_server_that_never_answers_fails_the_warm_up_in_one_line(server):
    with pytest.raises(loadgen.LoadgenError, match="did not answer"):
        _run(server, {"hang": 1}, timeout_s=0.3)


def test_run_works_inside_a_running_event_loop(server):
    async def inside():  # as in Jupyter, where a loop is already running
        return _run(server, {"ttft_ms": 5, "itl_ms": 1}, num_requests=4)

    assert asyncio.run(inside())["completed"] == 4


def test_max_duration_stops_the_run_and_counts_what_was_cut(server):
    r = _run(server, {"ttft_ms": 2000}, num_requests=20, concurrency=2, max_duration_s=0.5, probe=False)
    assert r["cancelled"] == 2 and r["not_sent"] == 18 and r["completed"] == 0 and r["failed"] == 0
    assert r["duration_s"] < 1.5 and any("max_duration_s" in m for m in r["warnings"])


def test_rejected_fixed_output_fields_are_dropped_with_a_warning(server):
    r = _run(server, {"reject": "ignore_eos+min_tokens"})
    assert r["completed"] == 8 and r["fields_dropped"] == ["ignore_eos", "min_tokens"]
    assert any("ignore_eos" in m for m in r["warnings"])


def test_goodput_against_slos(server):
    r = _run(server, slo_ms={"ttft": 1000, "tpot": 100})
    assert r["goodput"]["good_requests"] == 8
    r = _run(server, slo_ms={"tpot": ITL_MS / 2})
    assert r["goodput"]["good_requests"] == 0 and r["goodput"]["request_goodput"] == 0


def test_cli_writes_json_csv_and_plot(server, tmp_path, capsys):
    rc = cli_main(["--base-url", server, "--model", timed_server.MODEL, "--num-requests", "6", "--input-len", "4",
                   "--output-len", "4", "--concurrency", "3", "--goodput", "ttft:500", "--no-progress",
                   "--json-out", str(tmp_path / "r.json"), "--csv-out", str(tmp_path / "r.csv"),
                   "--plot-out", str(tmp_path / "r.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "load held: True" in out and "vLLM" in out
    res = json.loads((tmp_path / "r.json").read_text())
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert {"mean", "p50", "p90", "p95", "p99"} <= set(res[key])
    assert {"completed", "failed", "request_throughput", "output_throughput", "workload", "load", "load_held",
            "load_warning", "definitions", "goodput", "failures", "requests"} <= set(res)
    assert res["workload"]["concurrency"] == 3 and res["workload"]["output_len"] == 4 and len(res["requests"]) == 6
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert len(rows) == 1 and rows[0]["completed"] == "6" and "ttft_ms_p99" in rows[0]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_goes_from_synchronous_to_throughput(server, tmp_path):
    w = loadgen.Workload(_url(server, ttft_ms=20, itl_ms=2), timed_server.MODEL, num_requests=8, input_len=4,
                         output_len=8, arrival="constant")
    res = loadgen.sweep(w, points=2, progress=False)
    labels = [r["label"] for r in res["runs"]]
    assert labels[:2] == ["synchronous", "throughput"] and len(labels) == 4
    lo, hi = res["runs"][0]["request_throughput"], res["runs"][1]["request_throughput"]
    rates = [r["workload"]["request_rate"] for r in res["runs"][2:]]
    assert lo < rates[0] < rates[1] < hi
    loadgen.write_csv(res, tmp_path / "s.csv")
    assert len(list(csv.DictReader((tmp_path / "s.csv").open()))) == 4
    assert loadgen.plot_latency_throughput(res, tmp_path / "s.png") is not None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_unreachable_server_is_one_line_and_nonzero():
    out = subprocess.run([sys.executable, "-m", "utils.loadgen", "--base-url", f"http://127.0.0.1:{_free_port()}",
                          "--model", "m", "--concurrency", "1", "--no-progress"],
                         cwd=repo_root(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("error: cannot reach") and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (["--model", "wrong-model"], "404 for model 'wrong-model'"),
    (["--dataset", "BAD"], "line 1: not JSON"),
    (["--tokenizer", "/nonexistent/tokenizer"], "cannot load tokenizer"),
])
def test_cli_bad_input_is_one_line_and_nonzero(server, tmp_path, capsys, args, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    args = [str(bad) if a == "BAD" else a for a in args]
    base = ["--base-url", server, "--model", timed_server.MODEL, "--concurrency", "1", "--no-progress"]
    rc = cli_main(base + args)
    err = capsys.readouterr().err.strip()
    assert rc == 1 and message in err and len(err.splitlines()) == 1


def test_cli_usage_errors(server, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["--base-url", server, "--model", "m"])
    assert e.value.code == 2 and "name the load" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli_main(["--base-url", server, "--model", "m", "--request-rate", "0"])
    assert e.value.code == 2
