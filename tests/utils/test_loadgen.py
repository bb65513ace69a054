"""utils.serving.loadgen against tests/timed_server.py (its own process, loopback): measured timing
against what the server actually did, the load held, arrivals, failures by reason, outputs
and the CLI.

Accuracy: TTFT and TPOT within 2% plus 1 ms of the truth. The truth is the
server's own timeline (timed_server.py: when it received each request and began writing each
event, on the client's clock), matched to the client's record by prompt. The configured
timing is not the truth: the server reached the client 1.4 to 2.1 ms after it on this 2-core
machine (a run's mean TTFT; the request's trip, the server's wake-up), and several ms later
when other processes took the CPU, which made the old comparison flaky.

What is left is the client's error. With aiohttp's ``data_received`` instrumented, nearly all
of it came before the client ran any code (from there to the client's timestamp took at most
0.26 ms): on a busy CPU the woken client waits in the run queue, up to a 4 ms scheduler tick
with two CPU hogs (this kernel: HZ=250, no preemption) and 12 to 20 ms with about six busy
processes on the two cores. No client measures better than the CPU it is given, so each
per-request check allows the band plus the time the OS kept the client or the server waiting
for a CPU during that request (Linux schedstat, read apart from the timestamps under test).
Measured here, the largest such wait of a run was 0.01 to 10 ms without CPU hogs and 13 to
210 ms with two, so under contention the per-request check says little; the TPOT and ITL
statistics keep the band alone there. A client slow by itself still fails: one whose every
timestamp came 5 ms late did (a one-off check by hand).
"""
import asyncio
import csv
import dataclasses
import json
import math
import subprocess
import sys
import time
import urllib.request

import pytest
import timed_server

from tests.procs import free_port
from utils.course.env import repo_root
from utils.serving import loadgen
from utils.serving.loadgen import client as loadgen_client
from utils.serving.loadgen.__main__ import main as cli_main

TTFT_MS, ITL_MS, N_TOK = 100.0, 20.0, 8
SERVER_LATE_MS = 50.0  # the server's own lateness against its schedule: a sanity bound, not the client's error


@pytest.fixture(scope="module")
def server():
    with timed_server.serve_in_subprocess(ttft_ms=TTFT_MS, itl_ms=ITL_MS) as srv:
        yield srv.url


def _url(base, **scenario):
    return base + ("/s/" + ",".join(f"{k}={v}" for k, v in scenario.items()) if scenario else "")


def _workload(base, scenario=None, **kw):
    kw = {"num_requests": 8, "input_len": 8, "output_len": N_TOK, "concurrency": 4, **kw}
    return loadgen.Workload(_url(base, **(scenario or {})), timed_server.MODEL, **kw)


def _run(base, scenario=None, **kw):
    return loadgen.run(_workload(base, scenario, **kw), progress=False)


def _close(measured, truth, allowance_ms=0.0):
    return abs(measured - truth) <= 0.02 * truth + 1.0 + allowance_ms


@pytest.fixture
def send_times(monkeypatch):
    """Per request index: its send instant on the client's clock (``perf_counter``), and how long
    the client's thread waited for a CPU while the request lasted (``timed_server.cpu_wait_s``).

    A spy around ``client.send``, in the test, not a hook in the client: the per-request record
    keeps ``sent_s`` relative to the run's origin, and the origin is what ``send`` is given."""
    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        pytest.skip("the client's and the server's perf_counter readings compare only where it is CLOCK_MONOTONIC")
    sends, real_send = {}, loadgen_client.send

    async def spy(session, url, body, rec, *, stream, t_origin):
        wait0 = timed_server.cpu_wait_s()
        try:
            await real_send(session, url, body, rec, stream=stream, t_origin=t_origin)
        finally:
            wait1 = timed_server.cpu_wait_s()
            if rec.index >= 0 and rec.sent_s is not None:  # index -1: the unmeasured warm-up
                sends[rec.index] = (t_origin + rec.sent_s, None if wait0 is None or wait1 is None else wait1 - wait0)

    monkeypatch.setattr(loadgen_client, "send", spy)
    return sends


def _timelines(base):
    """What the server did (tests/timed_server.py ``GET /_timelines``); no proxy for loopback."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base + "/_timelines", timeout=10) as f:
        return json.load(f)


def _truth(base, w, result, sends):
    """Per request: its send instant, the server's timeline of it (the first one the server received
    after the client sent it, with its prompt: every prompt of a run differs, and the warm-up and
    earlier runs that reuse a prompt were received before), and the milliseconds the client and the
    server together waited for a CPU while it lasted."""
    assert w.seed is None and isinstance(result["workload"]["seed"], int)  # drawn for the run, and recorded
    w = dataclasses.replace(w, seed=result["workload"]["seed"])
    prompts = [b.get("prompt") or b["messages"][-1]["content"] for b in loadgen.build_bodies(w)]
    assert len(set(prompts)) == len(prompts)
    timelines = _timelines(base)
    out = []
    for q in result["requests"]:
        sent, client_wait_s = sends[q["index"]]
        mine = [t for t in timelines if t["prompt"] == prompts[q["index"]] and t["received_s"] >= sent]
        assert mine, f"the server has no record of request {q['index']}"
        tl = min(mine, key=lambda t: t["received_s"])
        wait_ms = 1e3 * ((client_wait_s or 0.0) + (tl["cpu_wait_s"] or 0.0))
        out.append((sent, tl, wait_ms))
    return out


@pytest.mark.parametrize("endpoint,scenario,load", [
    ("completions", {}, {"concurrency": 1, "num_requests": 6}),
    # An empty role chunk first and no [DONE] (transformers serve); arrivals 73 ms apart keep about
    # four requests in flight without two arriving, or two sending a token, at the same instant.
    ("chat", {"role_early": 1, "done": 0}, {"concurrency": None, "request_rate": 1 / 0.073, "arrival": "constant",
                                            "num_requests": 10}),
])
def test_ttft_tpot_itl_match_what_the_server_did(server, send_times, record_property, endpoint, scenario, load):
    w = _workload(server, scenario, endpoint=endpoint, **load)
    r = loadgen.run(w, progress=False)
    n = load["num_requests"]
    assert r["completed"] == n and r["failed"] == 0
    assert r["output_tokens_source"] == "usage" and r["output_tokens_mean"] == N_TOK
    assert r["itl_ms"]["n"] == n * (N_TOK - 1)
    truth_s: dict[str, list] = {"ttft": [], "tpot": [], "itl": [], "e2el": []}
    worst_ms = dict.fromkeys(truth_s, 0.0)
    waits_ms = []
    for q, (sent, tl, wait_ms) in zip(r["requests"], _truth(server, w, r, send_times), strict=True):
        text, events = tl["text_written_s"], tl["events_written_s"]
        assert len(text) == N_TOK and tl["max_unsent_bytes"] == 0, tl  # every chunk went to the kernel at once
        true = {"ttft": text[0] - sent, "e2el": events[-1] - sent}  # [DONE] is not an event (vLLM)
        true["tpot"] = (true["e2el"] - true["ttft"]) / (N_TOK - 1)
        got = {"ttft": q["ttft_s"], "e2el": q["e2el_s"], "tpot": (q["e2el_s"] - q["ttft_s"]) / (N_TOK - 1)}
        pairs = [(k, 1e3 * got[k], 1e3 * true[k]) for k in got]
        pairs += [("itl", 1e3 * g, 1e3 * (b - a)) for g, a, b in zip(q["itl_s"], text[:-1], text[1:], strict=True)]
        for key, got_ms, true_ms in pairs:
            worst_ms[key] = max(worst_ms[key], abs(got_ms - true_ms))
            truth_s[key].append(true_ms / 1e3)
        waits_ms.append(wait_ms)
        # Causality: one clock for client and server, so no chunk is seen before the server sent it.
        assert got["ttft"] >= true["ttft"] and got["e2el"] >= true["e2el"], (q, tl)
        # The band, plus the time the OS kept the client or the server off the CPU during this request
        # (TPOT spreads a late last chunk over N_TOK - 1 tokens).
        off = [(k, round(g, 3), round(t, 3)) for k, g, t in pairs
               if not _close(g, t, allowance_ms=wait_ms / (N_TOK - 1) if k == "tpot" else wait_ms)]
        assert not off, f"request {q['index']}: (metric, client ms, truth ms) {off}; CPU wait {wait_ms:.2f} ms"
    for key, ms in [*worst_ms.items(), ("cpu_wait", max(waits_ms))]:  # for reports: pytest --junitxml
        record_property(f"worst_{key}_ms", round(ms, 3))
    # What the run reports against the same statistic of the truth. TPOT and ITL get the band
    # alone: a late chunk lengthens one gap and shortens the next, so they average out (worst 0.5 ms
    # inside the band with two CPU hogs). A TTFT or E2E statistic moves as far as the largest error.
    for key, want_s in truth_s.items():
        want, allow_ms = loadgen.stats_ms(want_s), max(waits_ms) if key in ("ttft", "e2el") else 0.0
        for stat in ("mean", "p50"):
            assert _close(r[f"{key}_ms"][stat], want[stat], allowance_ms=allow_ms), (key, stat, r[f"{key}_ms"], want)


def test_the_timed_server_keeps_its_configured_schedule(server, send_times):
    """A sanity check of the truth, not of the client: the server writes token k no earlier than
    arrival + TTFT + k * ITL, and at most SERVER_LATE_MS after it (its own wake-up and event-loop
    delay, several ms when other processes take the CPU; the accuracy test does not depend on it)."""
    w = _workload(server, {}, concurrency=1, num_requests=4)
    r = loadgen.run(w, progress=False)
    assert r["completed"] == 4
    for _sent, tl, _wait_ms in _truth(server, w, r, send_times):
        late_ms = [1e3 * (t - tl["received_s"]) - (TTFT_MS + k * ITL_MS) for k, t in enumerate(tl["text_written_s"])]
        assert len(late_ms) == N_TOK and min(late_ms) >= -1e-6 and max(late_ms) <= SERVER_LATE_MS, late_ms


def test_without_usage_tokens_are_counted_chunks(server):
    r = _run(server, {"usage": 0, "done": 0})
    assert r["completed"] == 8 and r["output_tokens_source"] == "chunks" and r["output_tokens_mean"] == N_TOK


def test_non_streaming_measures_latency_only(server, send_times):
    w = _workload(server, None, stream=False)
    r = loadgen.run(w, progress=False)
    assert r["completed"] == 8 and r["ttft_ms"]["n"] == 0 and r["tpot_ms"]["mean"] is None
    for q, (sent, tl, wait_ms) in zip(r["requests"], _truth(server, w, r, send_times), strict=True):
        true_s = tl["events_written_s"][-1] - sent  # the whole body
        assert q["e2el_s"] >= true_s and _close(1e3 * q["e2el_s"], 1e3 * true_s, allowance_ms=wait_ms), (q, tl)


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


def test_cli_unreachable_server_is_one_line_and_nonzero():
    out = subprocess.run([sys.executable, "-m", "utils.serving.loadgen", "--base-url", f"http://127.0.0.1:{free_port()}",
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


def test_runs_of_one_workload_send_fresh_prompts_and_the_warm_up_shares_none(server):
    """A prefix cache must not see a prompt twice: two runs of one ``Workload`` (no seed) send
    different prompts, each run records the seed that rebuilds its own, and the unmeasured
    warm-up's prompt starts with a text no measured prompt starts with. A pinned seed repeats."""
    w = _workload(server, {}, concurrency=2, num_requests=3)
    before = {t["prompt"] for t in _timelines(server)}
    runs = [loadgen.run(w, progress=False) for _ in range(2)]
    seen = [t["prompt"] for t in _timelines(server) if t["prompt"] not in before]
    sent = [[b["prompt"] for b in loadgen.build_bodies(dataclasses.replace(w, seed=r["workload"]["seed"]))]
            for r in runs]
    assert runs[0]["workload"]["seed"] != runs[1]["workload"]["seed"]
    assert not set(sent[0]) & set(sent[1])
    measured = set(sent[0]) | set(sent[1])
    assert measured <= set(seen)
    warm_ups = [p for p in seen if p not in measured]
    assert len(warm_ups) == 2 and all(p.startswith(loadgen_client.PROBE_PREFIX) for p in warm_ups)
    assert not any(p.startswith(loadgen_client.PROBE_PREFIX) for p in measured)
    pinned = dataclasses.replace(w, seed=7)
    assert loadgen.build_bodies(pinned) == loadgen.build_bodies(pinned)
