"""A raw HTTP/1.1 server that answers each request with a byte script: the odd wire behaviour of
real OpenAI-compatible servers, reproduced exactly and with known timing, for
tests/integration/test_loadgen_servers.py.

``timed_server.py`` is the timing truth for a well-behaved server; this one writes whatever a
test scripts, byte for byte, on a raw socket: status line and headers, chunked framing or a body
delimited by closing the connection, events split mid-line across writes, ``\\r\\n`` or ``\\r``
line endings, SSE comments, error events in each server's format, a stall, an early close. A
framework server (aiohttp, uvicorn) would normalise most of that away.

A script is a list of steps, run after the request has been read:

- ``float``: sleep that many seconds (measured from the previous step; the first from receipt);
- ``bytes``: write them as they are (``head()``, ``chunk()``, ``sse()`` help build them);
- ``CLOSE``: close the connection; ``HANG``: never write again (until the server stops).

A scenario is a list of scripts; its k-th request gets script ``k % len``, so a scenario can
alternate a failure with a good answer and a test can check that the run goes on. Requests go
to ``{url}/x/{name}/v1/completions`` (or ``/v1/chat/completions``); ``silent_url`` is a socket
that completes the TCP handshake (the kernel's backlog) and is never accepted: a server that
takes the connection and then never sends a byte.

The server runs on an asyncio loop in a thread of the test process (``serve()``), so scenarios
are plain Python objects the test adds with ``Server.add``.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
from http import HTTPStatus

CLOSE = "close"
HANG = "hang"
END = b"0\r\n\r\n"  # the last chunk of a chunked body


def head(status: int = 200, *, content_type: str = "text/event-stream", chunked: bool = True,
         length: int | None = None, close: bool = False, headers: dict | None = None) -> bytes:
    """Status line and headers. ``chunked``: Transfer-Encoding chunked; else ``length`` gives
    Content-Length, or neither (a body that ends when the server closes: set ``close``)."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Type: {content_type}"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse(obj, sep: str = "\n", field: str = "data") -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line, with ``sep`` as line ending."""
    payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return field.encode() + b": " + payload + sep.encode() * 2


def json_response(status: int, obj, headers: dict | None = None) -> list:
    """A whole JSON (or raw bytes) response with Content-Length."""
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    ctype = "application/json" if not isinstance(obj, bytes) else "text/html"
    return [head(status, content_type=ctype, chunked=False, length=len(body), headers=headers) + body]


def chat(delta: dict, finish: str | None = None, **extra) -> dict:
    """A chat.completion.chunk with one choice."""
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}


def completion(text: str, finish: str | None = None, **extra) -> dict:
    """A text_completion chunk with one choice."""
    return {"id": "c", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], **extra}


def usage(completion_tokens: int, prompt_tokens: int = 4) -> dict:
    """The final usage chunk of ``stream_options: {include_usage: true}``: no choices."""
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class Server:
    """The running server: ``url``, ``silent_url``, ``add(name, scripts) -> base_url``."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.scenarios: dict[str, list] = {}
        self.counters: dict[str, itertools.count] = {}
        self.tasks: set = set()
        self.url = self.silent_url = ""

    def add(self, name: str, scripts: list) -> str:
        """Register a scenario (a list of scripts, or one script); returns its base URL."""
        if scripts and not isinstance(scripts[0], list):
            scripts = [scripts]
        self.scenarios[name], self.counters[name] = scripts, itertools.count()
        return f"{self.url}/x/{name}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.tasks.add(asyncio.current_task())
        try:
            while True:  # keep-alive: the next request on the same connection
                try:
                    header = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = header.decode("latin-1").split("\r\n")
                length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                await reader.readexactly(length)
                path = lines[0].split()[1]
                name = path.split("/")[2] if path.startswith("/x/") else ""
                if name not in self.scenarios:
                    for step in json_response(404, {"error": {"message": f"no scenario {name!r}"}}):
                        writer.write(step)
                    continue
                scripts = self.scenarios[name]
                script = scripts[next(self.counters[name]) % len(scripts)]
                for step in script:
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    elif step == CLOSE:
                        writer.close()
                        return
                    elif step == HANG:
                        await asyncio.Event().wait()
                    else:
                        writer.write(step)
                        await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.tasks.discard(asyncio.current_task())
            writer.close()


@contextlib.contextmanager
def serve():
    """Run a ``Server`` on 127.0.0.1 (a free port) in a daemon thread; yields it."""
    loop = asyncio.new_event_loop()
    srv = Server(loop)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # never accepted: the kernel completes the handshake and queues it
    srv.silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    started = threading.Event()
    holder = {}

    async def start():
        holder["server"] = await asyncio.start_server(srv._handle, "127.0.0.1", 0)
        srv.url = f"http://127.0.0.1:{holder['server'].sockets[0].getsockname()[1]}"

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="scripted_server", daemon=True)
    thread.start()
    started.wait(10)

    async def stop():
        for t in list(srv.tasks):
            t.cancel()
        holder["server"].close()
        await asyncio.gather(*srv.tasks, return_exceptions=True)

    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        silent.close()
