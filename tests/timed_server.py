"""A local OpenAI-compatible server whose token timing is known: the truth for loadgen.

``utils.serving.loadgen`` is checked against it (tests/utils/test_loadgen*.py) and benchmarked against
it (benchmarks/loadgen_overhead.py). It generates nothing: it streams ``n`` tokens, the
first ``ttft_ms`` after the request arrives and then one every ``itl_ms``, on absolute
deadlines (token k is due at arrival + ttft + k * itl), so sleep overshoot does not
accumulate. It is still late against that schedule by its own wake-up and event-loop delay
(measured on this 2-core machine: 0.1 to 4 ms with other work running, up to 8 ms with two
CPU hogs), so the truth for a client is what the server actually did, which it records:

- a **timeline** per answered request, from ``GET /_timelines`` (JSON, the last
  ``TIMELINE_KEEP`` requests, oldest first): its ``prompt`` (to match it to the request a
  test sent), when the handler received it (``received_s``), when the write of each data
  event began (``text_written_s``: the chunks that carry generated text; ``events_written_s``:
  every ``data:`` event but ``[DONE]``, role and usage chunks included; a response that is
  not streamed is one event, its body), ``max_unsent_bytes`` (the transport's buffer after
  each write: 0 means every event went to the kernel at once) and ``cpu_wait_s``, the time
  the server waited for a CPU during the request (``cpu_wait_s()``).
- **The clock** is ``time.perf_counter()``, the clock ``utils.serving.loadgen`` timestamps with. On
  Linux it is ``clock_gettime(CLOCK_MONOTONIC)`` (``time.get_clock_info``), one clock for the
  whole system, so the server's and the client's readings compare directly although they
  are two processes; ``time.time()`` would too, but NTP can step it mid-run.

Behaviour is chosen per request by an optional path prefix, so one server process serves
every scenario of a test module::

    http://127.0.0.1:PORT/v1/completions                      the start-up settings
    http://127.0.0.1:PORT/s/ttft_ms=50,done=0/v1/completions  overrides for this request

Settings (start-up flags ``--ttft-ms`` ... or prefix keys):

- ``ttft_ms``, ``itl_ms``: timing; ``n``: tokens per response (0 = honour ``max_tokens``)
- ``done=0``: end streams without ``data: [DONE]``, usage in the last chunk (as
  ``transformers serve`` does); ``usage=0``: never report usage
- ``role_early=1``: (chat) send an empty role chunk at once, before the first token
- ``reject=ignore_eos+min_tokens``: answer 422 when the body has any of these fields
- ``fail_every=K``, ``fail_status=S``: every K-th request of this scenario gets status S
- ``hang=1``: never answer; ``hang_after=K``: stall forever after K tokens
- ``drop_after=K``: cut the connection after K tokens
- ``end_after=K``: end the response cleanly after K tokens, with no finish_reason or [DONE]
- ``malformed_after=K``: send a chunk that is not JSON after K tokens
- ``error_after=K``: send an in-stream ``{"error": ...}`` event after K tokens
- ``plain=1``: answer a streaming request with one JSON body, not server-sent events

Run it: ``python tests/timed_server.py --port 0 --ttft-ms 20 --itl-ms 5 --n 32``; it prints
``READY <port>`` on stdout once listening. ``serve_in_subprocess()`` does that for you.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from aiohttp import web

MODEL = "timed-model"
DEFAULTS = {
    "ttft_ms": 20.0, "itl_ms": 5.0, "n": 0, "done": 1, "usage": 1, "role_early": 0, "reject": "",
    "fail_every": 0, "fail_status": 500, "hang": 0, "hang_after": -1, "drop_after": -1,
    "end_after": -1, "malformed_after": -1, "error_after": -1, "plain": 0,
}
TIMELINE_KEEP = 4096  # timelines kept for GET /_timelines (a bounded memory for long benchmarks)
ServerProcess = collections.namedtuple("ServerProcess", "url pid")
_counters: dict[str, itertools.count] = defaultdict(lambda: itertools.count(1))


def _parse_scenario(text: str, base: dict) -> dict:
    cfg = dict(base)
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in DEFAULTS:
            raise web.HTTPBadRequest(text=f"unknown timed_server setting {key!r}")
        cfg[key] = value if key == "reject" else float(value)
    return cfg


def _error(status: int, message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return web.json_response(body, status=status)


def _chunk(chat: bool, text: str | None, finish: str | None, model: str, role: bool = False) -> dict:
    if chat:
        delta = {"role": "assistant", "content": text or ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": "cmpl-t", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def cpu_wait_s() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (Linux ``schedstat``'s
    run_delay, CONFIG_SCHED_INFO); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class _Timeline:
    """What the server actually did for one request (perf_counter seconds, see above)."""

    __slots__ = ("prompt", "scenario", "received_s", "text_written_s", "events_written_s", "max_unsent_bytes",
                 "cpu_wait_s", "_wait0")

    def __init__(self, prompt: str, scenario: str, received_s: float, wait0: float | None):
        self.prompt, self.scenario, self.received_s, self._wait0 = prompt, scenario, received_s, wait0
        self.text_written_s: list[float] = []
        self.events_written_s: list[float] = []
        self.max_unsent_bytes = 0
        self.cpu_wait_s: float | None = None  # the server's wait for a CPU from receipt to the last event

    def mark(self, t: float, request: web.Request, *, text: bool) -> None:
        """Note an event whose write began at ``t`` (``text``: it carries generated text)."""
        self.events_written_s.append(t)
        if text:
            self.text_written_s.append(t)
        self.max_unsent_bytes = max(self.max_unsent_bytes, request.transport.get_write_buffer_size())

    async def write(self, resp: web.StreamResponse, request: web.Request, data: bytes, *, text: bool) -> None:
        # The time is read before the write: the write wakes the client, which may take this CPU
        # before a time read after it (measured: a write that took 7.8 ms, with two CPU hogs).
        t = time.perf_counter()
        await resp.write(data)
        self.mark(t, request, text=text)

    def finish(self) -> None:
        wait1 = cpu_wait_s()
        self.cpu_wait_s = None if self._wait0 is None or wait1 is None else wait1 - self._wait0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if not k.startswith("_")}


async def _timelines(request):
    return web.json_response([t.to_dict() for t in request.app["timelines"]])


async def _handle(request: web.Request, chat: bool) -> web.StreamResponse:
    t0, wait0 = time.perf_counter(), cpu_wait_s()
    base = request.app["config"]
    scenario = request.match_info.get("scenario", "")
    cfg = _parse_scenario(scenario, base)
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "body is not JSON")
    if body.get("model") != request.app["model"]:
        return _error(404, f"The model `{body.get('model')}` does not exist.")
    rejected = [f for f in cfg["reject"].split("+") if f and f in body]
    if rejected:
        return _error(422, f"Unexpected fields: {rejected}")
    if cfg["fail_every"] and next(_counters[scenario]) % int(cfg["fail_every"]) == 0:
        return _error(int(cfg["fail_status"]), "injected failure")
    if cfg["hang"]:
        await asyncio.sleep(3600)
    n = int(cfg["n"]) or int(body.get("max_tokens") or 16)
    ttft_s, itl_s = cfg["ttft_ms"] / 1e3, cfg["itl_ms"] / 1e3
    prompt = str(body.get("prompt") if not chat else " ".join(m.get("content", "") for m in body.get("messages", [])))
    prompt_tokens = len(prompt.split())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    model = body["model"]

    if not body.get("stream") or cfg["plain"]:
        await _sleep_until(t0 + ttft_s + (n - 1) * itl_s)
        text = " tok" * n
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
                  else {"index": 0, "text": text, "finish_reason": "length"})
        out = {"id": "t", "object": "chat.completion" if chat else "text_completion", "model": model, "choices": [choice]}
        if cfg["usage"]:
            out["usage"] = usage
        timeline = _Timeline(prompt, scenario, t0, wait0)
        request.app["timelines"].append(timeline)
        resp = web.json_response(out)
        await resp.prepare(request)
        t = time.perf_counter()
        await resp.write_eof()  # sent here, not after the handler returns, so that the time is known
        timeline.mark(t, request, text=True)
        timeline.finish()
        return resp

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    timeline = _Timeline(prompt, scenario, t0, wait0)
    request.app["timelines"].append(timeline)
    include_usage = cfg["usage"] and (not cfg["done"] or (body.get("stream_options") or {}).get("include_usage"))
    if chat and cfg["role_early"]:
        await timeline.write(resp, request, _sse(_chunk(chat, "", None, model, role=True)), text=False)
    for k in range(n):
        if k == cfg["hang_after"]:
            await asyncio.sleep(3600)
        if k == cfg["drop_after"]:
            request.transport.close()
            return resp
        if k == cfg["end_after"]:
            await resp.write_eof()
            return resp
        if k == cfg["malformed_after"]:
            await resp.write(b"data: {not json\n\n")
        if k == cfg["error_after"]:
            await resp.write(_sse({"error": {"message": "injected in-stream error", "code": 500}}))
        await _sleep_until(t0 + ttft_s + k * itl_s)
        last = k == n - 1
        chunk = _chunk(chat, " tok", "length" if last else None, model, role=(chat and k == 0 and not cfg["role_early"]))
        if last and include_usage and not cfg["done"]:
            chunk["usage"] = usage  # transformers serve: usage in the last chunk, no [DONE]
        await timeline.write(resp, request, _sse(chunk), text=True)
    if cfg["done"] and include_usage:
        usage_event = {"id": "t", "object": "text_completion", "model": model, "choices": [], "usage": usage}
        await timeline.write(resp, request, _sse(usage_event), text=False)
    timeline.finish()
    if cfg["done"]:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _completions(request):
    return await _handle(request, chat=False)


async def _chat(request):
    return await _handle(request, chat=True)


async def _models(request):
    return web.json_response({"object": "list", "data": [{"id": request.app["model"], "object": "model"}]})


def make_app(model: str = MODEL, **settings) -> web.Application:
    """The aiohttp application; ``settings`` override ``DEFAULTS`` for every request."""
    unknown = set(settings) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown timed_server settings: {sorted(unknown)}")
    app = web.Application()
    app["config"] = {**DEFAULTS, **settings}
    app["model"] = model
    app["timelines"] = collections.deque(maxlen=TIMELINE_KEEP)
    app.router.add_get("/_timelines", _timelines)
    for prefix in ("", "/s/{scenario}"):
        app.router.add_post(prefix + "/v1/completions", _completions)
        app.router.add_post(prefix + "/v1/chat/completions", _chat)
        app.router.add_get(prefix + "/v1/models", _models)
    return app


@contextlib.contextmanager
def serve_in_subprocess(*, ttft_ms: float = 20.0, itl_ms: float = 5.0, n: int = 0, model: str = MODEL,
                        python: str | None = None, startup_timeout_s: float = 20.0):
    """Start this server in its own process on a free loopback port; yields ``(url, pid)``.

    A separate process keeps the server's CPU apart from the client's, so the client's
    CPU time can be measured alone (benchmarks/loadgen_overhead.py)."""
    cmd = [python or sys.executable, str(Path(__file__).resolve()), "--port", "0", "--ttft-ms", str(ttft_ms),
           "--itl-ms", str(itl_ms), "--n", str(n), "--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + startup_timeout_s
        line = ""
        while time.monotonic() < deadline and not line.startswith("READY"):
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"timed_server exited with code {proc.returncode}")
        if not line.startswith("READY"):
            raise RuntimeError("timed_server did not start in time")
        yield ServerProcess(f"http://127.0.0.1:{int(line.split()[1])}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _serve(args) -> None:
    app = make_app(args.model, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, n=args.n, done=int(not args.no_done))
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    await asyncio.Event().wait()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--n", type=int, default=0, help="tokens per response (0: honour max_tokens)")
    p.add_argument("--no-done", action="store_true", help="end streams without data: [DONE]")
    p.add_argument("--model", default=MODEL)
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
