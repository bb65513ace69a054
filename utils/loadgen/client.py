"""One request to an OpenAI-compatible server, timed chunk by chunk.

Built on aiohttp, a well-kept asyncio HTTP client: streaming 32-token responses at
concurrency 64 on this project's 2-core machine, its bare loop cost 0.6 to 1.1 ms of CPU per
request against 10 to 15 ms for httpx 0.28 (``benchmarks/loadgen_overhead.py
--compare-httpx``, 2026-11-30). The Server-Sent Events parser is written by hand because
it is the hot loop: a few lines that split on blank lines and read ``data:`` fields cost
less CPU than a general SSE library, and client CPU is what limits a load generator on a
small machine.

Timing follows vLLM ``benchmarks/serve.py`` (REFERENCE.md, "LLM load metrics"): the clock
starts just before the request is handed to aiohttp; TTFT is the first chunk that carries
generated text; every later text chunk adds one inter-token gap (ITL); E2E latency ends at
the last data event (the usage chunk included, ``[DONE]`` excluded). A stream is complete
when it sends ``data: [DONE]`` or a ``finish_reason``: servers such as ``transformers
serve`` end without ``[DONE]``.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from time import perf_counter

import aiohttp


class LoadgenError(Exception):
    """Bad input or an unusable server: the CLI prints the message as one line, no traceback."""


# Failure reasons (keys of the summary's ``failures``).
HTTP = "http_{status}"
TIMEOUT = "timeout"
CONNECTION = "connection_error"
DROPPED = "dropped_stream"
MALFORMED = "malformed_chunk"
STREAM_ERROR = "stream_error"
EMPTY = "empty_output"
CANCELLED = "cancelled"  # still in flight when --max-duration-s ran out: counted apart, not a failure


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request; times in seconds since the run started."""

    index: int
    scheduled_s: float | None = None  # when the schedule allowed it: its arrival, or a free concurrency slot
    sent_s: float | None = None  # handed to the HTTP client (None: never sent)
    done_s: float | None = None  # finished, failed or cancelled
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list = field(default_factory=list)
    output_tokens: int = 0
    tokens_from_usage: bool = False
    prompt_tokens: int | None = None
    ok: bool = False
    reason: str = ""
    detail: str = ""

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output_tokens - 1): vLLM's TPOT; None below two tokens or without TTFT."""
        if self.ttft_s is None or self.e2el_s is None or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        r6 = lambda x: None if x is None else round(x, 6)  # noqa: E731  (microseconds are plenty)
        return {"index": self.index, "scheduled_s": r6(self.scheduled_s), "sent_s": r6(self.sent_s),
                "done_s": r6(self.done_s), "ttft_s": r6(self.ttft_s), "e2el_s": r6(self.e2el_s),
                "itl_s": [round(x, 6) for x in self.itl_s], "output_tokens": self.output_tokens,
                "tokens_from_usage": self.tokens_from_usage, "prompt_tokens": self.prompt_tokens,
                "ok": self.ok, "reason": self.reason, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


class _StreamFailure(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def endpoint_url(base_url: str, endpoint: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` plus the endpoint path; a full ``.../completions`` URL is kept."""
    if endpoint not in ("completions", "chat"):
        raise LoadgenError(f"--endpoint must be 'completions' or 'chat', got {endpoint!r}")
    base = base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise LoadgenError(f"--base-url must start with http:// or https://, got {base_url!r}")
    if base.endswith("/completions"):
        return base
    path = "chat/completions" if endpoint == "chat" else "completions"
    return f"{base}/{path}" if base.endswith("/v1") else f"{base}/v1/{path}"


def make_session(timeout_s: float, api_key: str | None = None) -> aiohttp.ClientSession:
    """One session for the run: no connection limit (the workload decides concurrency, not the
    pool), a total per-request timeout, no cookies, no decompression."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers,
        cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False)


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        msg = obj.get("message") or obj.get("detail") or (obj.get("error") or {}).get("message") or text
        text = msg if isinstance(msg, str) else json.dumps(msg)
    except (ValueError, AttributeError):
        pass
    return " ".join(text.split())[:300]


def _chunk_text(choice: dict):
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or choice.get("message")
        if delta:
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return text


async def send(session: aiohttp.ClientSession, url: str, body: bytes, rec: RequestRecord, *,
               stream: bool, t_origin: float) -> None:
    """Send one request and fill ``rec``; never raises for a server's fault (it is recorded)."""
    t0 = perf_counter()
    rec.sent_s = t0 - t_origin
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                raw = await resp.read()
                rec.reason, rec.detail = HTTP.format(status=resp.status), _error_text(raw)
            else:
                try:
                    await (_read_stream if stream else _read_whole)(resp, rec, t0)
                except asyncio.TimeoutError:
                    raise
                except (aiohttp.ClientError, ConnectionError) as e:
                    raise _StreamFailure(DROPPED, f"connection lost mid-response ({type(e).__name__}: {e})") from None
    except _StreamFailure as e:
        rec.reason, rec.detail = e.reason, e.detail
    except asyncio.TimeoutError:
        rec.reason, rec.detail = TIMEOUT, "no complete answer within --timeout-s"
    except (aiohttp.ClientError, ConnectionError) as e:
        rec.reason, rec.detail = CONNECTION, f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        rec.reason, rec.detail, rec.done_s = CANCELLED, "still in flight when the run stopped", perf_counter() - t_origin
        raise
    rec.done_s = perf_counter() - t_origin
    rec.ok = not rec.reason


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, t0: float) -> None:
    first = last_text = last_event = None
    itl = rec.itl_s
    n_text = 0
    usage_tokens = prompt_tokens = None
    finished = done = False
    buf = b""
    loads = json.loads
    async for data in resp.content.iter_any():
        now = perf_counter()
        buf = buf + data if buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        while True:
            k = buf.find(b"\n\n")
            if k < 0:
                break
            event, buf = buf[:k], buf[k + 2:]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # SSE comments, event:, id:, retry:
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = loads(payload)
                    choices = obj.get("choices")
                    if choices:
                        c = choices[0]
                        text = _chunk_text(c)
                        if text:
                            if first is None:
                                first = now
                            else:
                                itl.append(now - last_text)
                            last_text = now
                            n_text += 1
                        if c.get("finish_reason"):
                            finished = True
                    elif obj.get("error") is not None:
                        raise _StreamFailure(STREAM_ERROR, _error_text(payload))
                    usage = obj.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens")
                        prompt_tokens = usage.get("prompt_tokens")
                except (ValueError, AttributeError, TypeError, IndexError, KeyError) as e:
                    raise _StreamFailure(MALFORMED, f"{type(e).__name__} on chunk {payload[:80]!r}") from None
                last_event = now
    if last_event is None and not done:
        if buf.strip():
            raise _StreamFailure(MALFORMED, f"no server-sent data events; the body starts {buf[:80]!r}")
        raise _StreamFailure(DROPPED, "the stream ended before any data")
    if not (done or finished):
        raise _StreamFailure(DROPPED, "stream ended before data: [DONE] or a finish_reason")
    if first is None:
        raise _StreamFailure(EMPTY, "stream finished without any generated text")
    rec.ttft_s = first - t0
    rec.e2el_s = last_event - t0
    if isinstance(usage_tokens, int) and usage_tokens > 0:
        rec.output_tokens, rec.tokens_from_usage = usage_tokens, True
    else:
        rec.output_tokens = n_text
    rec.prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) else None


async def _read_whole(resp: aiohttp.ClientResponse, rec: RequestRecord, t0: float) -> None:
    raw = await resp.read()
    now = perf_counter()
    try:
        obj = json.loads(raw)
        text = _chunk_text(obj["choices"][0]) or ""
        usage = obj.get("usage") or {}
    except (ValueError, AttributeError, TypeError, IndexError, KeyError) as e:
        raise _StreamFailure(MALFORMED, f"{type(e).__name__} on body {raw[:80]!r}") from None
    if not text:
        raise _StreamFailure(EMPTY, "response without any generated text")
    rec.e2el_s = now - t0
    if isinstance(usage.get("completion_tokens"), int):
        rec.output_tokens, rec.tokens_from_usage = usage["completion_tokens"], True
    else:
        rec.output_tokens = len(text.split())  # no usage: words, a rough stand-in for tokens
    pt = usage.get("prompt_tokens")
    rec.prompt_tokens = pt if isinstance(pt, int) else None


OPTIONAL_FIELDS = (("ignore_eos", "min_tokens"), ("stream_options",))


async def probe(session: aiohttp.ClientSession, url: str, body: dict, *, stream: bool, model: str) -> list[str]:
    """Send one short unmeasured request (a warm-up) and learn which optional fields the server
    takes; returns the fields to drop. A 4xx answer to a body with ``ignore_eos``/``min_tokens``
    (``transformers serve`` answers 422) is retried without them, then without
    ``stream_options``. Any other failure is a ``LoadgenError`` with the server's reason."""
    body = dict(body, max_tokens=min(int(body.get("max_tokens") or 2), 2))
    if "min_tokens" in body:
        body["min_tokens"] = body["max_tokens"]
    dropped: list[str] = []
    for level in range(len(OPTIONAL_FIELDS) + 1):
        rec = RequestRecord(-1)
        await send(session, url, json.dumps(body).encode(), rec, stream=stream, t_origin=perf_counter())
        if rec.ok:
            return dropped
        status = int(rec.reason[5:]) if rec.reason.startswith("http_") else None
        present = [f for f in OPTIONAL_FIELDS[level] if f in body] if level < len(OPTIONAL_FIELDS) else []
        if status in (400, 422) and present:
            for f in present:
                body.pop(f)
            dropped += present
            continue
        break
    host = url.split("/v1")[0]
    if rec.reason == CONNECTION:
        raise LoadgenError(f"cannot reach {host}: {rec.detail}; is the server running? check --base-url")
    if rec.reason == TIMEOUT:
        raise LoadgenError(f"{url} did not answer a 2-token request within --timeout-s; is the server up?")
    if rec.reason == "http_404":
        raise LoadgenError(f"{url} answered 404 for model {model!r}: {rec.detail}; check --model and --base-url")
    if rec.reason in ("http_401", "http_403"):
        raise LoadgenError(f"{url} refused the request ({rec.reason}): {rec.detail}; pass --api-key")
    raise LoadgenError(f"the warm-up request to {url} failed ({rec.reason}): {rec.detail}")
