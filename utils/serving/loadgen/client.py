"""One request to an OpenAI-compatible server, timed chunk by chunk.

Built on aiohttp, a well-kept asyncio HTTP client: streaming 32-token responses at
concurrency 64 on this project's 2-core machine, its bare loop cost 0.6 to 1.1 ms of CPU per
request against 10 to 15 ms for httpx 0.28 (``benchmarks/loadgen_overhead.py
--compare-httpx``, 2026-11-30). The Server-Sent Events parser is written by hand because
it is the hot loop: a few lines that split on blank lines and read ``data:`` fields cost
less CPU than a general SSE library, and client CPU is what limits a load generator on a
small machine.

Timing follows vLLM ``benchmarks/serve.py`` (docs/reference.md, "LLM load metrics"): the clock
starts just before the request is handed to aiohttp; TTFT is the first chunk that carries
generated text (content, reasoning or a tool call; never the role-only first chunk that
vLLM, SGLang and OpenAI send); every later text chunk adds one inter-token gap (ITL); E2E
latency ends at the last data event (the usage chunk included, ``[DONE]`` excluded). A
stream is complete when it sends ``data: [DONE]`` or a ``finish_reason``: servers such as
``transformers serve`` end without ``[DONE]``; reading stops at ``[DONE]``, as the OpenAI
SDK's does, so a server that keeps the response open after it does not cause a timeout.
Output tokens come from the server's ``usage`` when it sends one (a chunk may carry several
tokens), else they are the count of text chunks.

Two points differ from vLLM's own client (``benchmarks/lib/endpoint_request_func.py``), on
purpose: its chat client starts TTFT at the first chunk with ``choices``, the role-only one
included, which servers send before computing any token; and its E2E ends at the last chunk
with ``choices``, before the usage chunk. On a server that sends both, vLLM's client reads a
shorter TTFT and E2E than this one.

The parser follows the SSE rules real servers rely on: ``\\n``, ``\\r\\n`` (sse-starlette) or
``\\r`` line endings, comments (``: ping`` keep-alives), ``event:``/``id:``/``retry:`` lines,
the data lines of one event joined, and a last event not closed by a blank line. An error
sent inside a 200 response fails the request as ``stream_error`` in the shapes servers use:
``data: {"error": ...}`` (OpenAI, vLLM, SGLang, LiteLLM, llama.cpp, TGI's string form),
``{"object": "error", ...}``, ``event: error``, and the ``error:`` field of older llama.cpp
servers (``server_sent_event(sink, "error", ...)``): a request cut short by the server never
counts as completed with a truncated output.
"""
from __future__ import annotations

import asyncio
import contextlib
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
STREAM_ERROR = "stream_error"  # the server reported an error inside a 200 response
EMPTY = "empty_output"
CANCELLED = "cancelled"  # still in flight when --max-duration-s ran out: counted apart, not a failure
# After [DONE], how long the end of the body may take: the end normally comes with [DONE] and the
# connection is kept for the next request; a server that holds the response open costs this much
# per request (and a new connection), not a timeout.
DONE_DRAIN_S = 0.25


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


def _error_message(obj):
    """The message of an error object, in the shapes servers send: ``{"error": {"message": ...}}``
    (OpenAI, vLLM, SGLang, llama.cpp, Ollama, LiteLLM), ``{"object": "error", "message": ...}``
    (older vLLM), ``{"error": "...", "error_type": ...}`` (TGI), ``{"detail": ...}`` (FastAPI)."""
    if isinstance(obj, dict):
        for key in ("message", "error", "detail"):
            if obj.get(key):
                return _error_message(obj[key])
        return None
    return obj


def _error_text(raw: bytes) -> str:
    """One line of at most 300 characters: the server's message if the body is a known error object."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        msg = _error_message(json.loads(text))
        if msg:
            text = msg if isinstance(msg, str) else json.dumps(msg)
    except ValueError:
        pass
    return " ".join(text.split())[:300]


def _is_error(obj: dict) -> bool:
    return obj.get("error") is not None or obj.get("object") == "error"


def _chunk_text(choice: dict):
    """The generated text of one choice: ``text`` (completions), else the delta's (or message's)
    content, reasoning (``reasoning_content``: SGLang, llama.cpp, older vLLM; ``reasoning``: vLLM,
    Ollama), refusal (OpenAI) or tool call (name and arguments, in a list or, as TGI's router
    has sent it, one object). A role-only delta has none."""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta") or choice.get("message")
        if delta:
            text = (delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    or delta.get("refusal"))
            if not text and (calls := delta.get("tool_calls")):
                fns = [c.get("function") or {} for c in (calls if isinstance(calls, list) else [calls])]
                text = "".join((f.get("name") or "") + (f.get("arguments") or "") for f in fns)
    return text


async def send(session: aiohttp.ClientSession, url: str, body: bytes, rec: RequestRecord, *,
               stream: bool, t_origin: float) -> None:
    """Send one request and fill ``rec``; never raises for a server's fault (it is recorded, with a
    one-line ``detail``: the server's message, and its ``Retry-After`` when it sends one)."""
    t0 = perf_counter()
    rec.sent_s = t0 - t_origin
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                raw = await resp.read()
                rec.reason, rec.detail = HTTP.format(status=resp.status), _error_text(raw) or resp.reason or ""
                if resp.headers.get("Retry-After"):
                    rec.detail += f" (Retry-After: {resp.headers['Retry-After']})"
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
        total = getattr(getattr(session, "timeout", None), "total", None)
        rec.reason, rec.detail = TIMEOUT, "no complete answer within --timeout-s" + (f" ({total:g} s)" if total else "")
    except (aiohttp.ClientError, ConnectionError) as e:
        rec.reason, rec.detail = CONNECTION, f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        rec.reason, rec.detail, rec.done_s = CANCELLED, "still in flight when the run stopped", perf_counter() - t_origin
        raise
    rec.done_s = perf_counter() - t_origin
    rec.ok = not rec.reason
    if rec.detail:
        rec.detail = " ".join(rec.detail.split())[:400]


def _parse_events(block: bytes) -> list[tuple[bool, list[bytes]]]:
    """The SSE events of ``block`` (LF line endings, events apart by blank lines) that carry data:
    ``(is_error, data lines)`` each. Comments and ``id:``/``retry:`` lines are skipped; ``event:
    error``, or llama.cpp's non-standard ``error:`` field, marks an error event."""
    events = []
    for event in block.split(b"\n\n"):
        lines, error = [], False
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                value = line[5:].strip()
            elif line.startswith(b"error:"):
                value, error = line[6:].strip(), True
            else:
                if line.startswith(b"event:"):
                    error = line[6:].strip() == b"error"
                continue
            if value:
                lines.append(value)
        if lines:
            events.append((error, lines))
    return events


async def _sse_reads(resp: aiohttp.ClientResponse):
    """Per read from the socket, its time and the events it completed (``_parse_events``). A
    ``\\r\\n`` split across two reads is joined; a last event without its blank line counts at the
    end of the body; a body with no events at all is ``malformed_chunk``."""
    buf = first = b""
    now = None
    cr_pending = seen = False
    async for data in resp.content.iter_any():
        now = perf_counter()
        first = first or data[:80]
        if cr_pending and data[:1] == b"\n":
            data = data[1:]
        cr_pending = data[-1:] == b"\r"
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = buf + data if buf else data
        k = buf.rfind(b"\n\n")
        if k >= 0:
            events, buf = _parse_events(buf[:k]), buf[k + 2:]
            if events:
                seen = True
                yield now, events
    rest = buf.strip()
    events = _parse_events(rest) if rest else []
    if events:
        yield now, events
    elif rest:
        with contextlib.suppress(ValueError):
            obj = json.loads(rest)
            if isinstance(obj, dict) and _is_error(obj):  # a bare JSON error object, no SSE framing
                raise _StreamFailure(STREAM_ERROR, _error_text(rest))
        if not seen:
            raise _StreamFailure(MALFORMED, f"no server-sent data events; the body starts {first!r}")


def _load(lines: list[bytes]) -> list:
    """The JSON objects of one event: its data lines joined (the SSE rule), or, if that is not JSON,
    one object per line (a server that put several objects in one event)."""
    if len(lines) == 1:
        return [json.loads(lines[0])]
    try:
        return [json.loads(b"\n".join(lines))]
    except ValueError:
        return [json.loads(x) for x in lines]


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, t0: float) -> None:
    first = last_text = last_event = None
    itl = rec.itl_s
    n_text = 0
    usage_tokens = prompt_tokens = None
    finished = done = False
    reads = _sse_reads(resp)
    try:
        async for now, events in reads:
            for error, lines in events:
                if error:
                    raise _StreamFailure(STREAM_ERROR, _error_text(b"\n".join(lines)))
                if b"[DONE]" in lines:
                    done = True
                    lines = [x for x in lines if x != b"[DONE]"]
                    if not lines:
                        continue
                try:
                    for obj in _load(lines):
                        choices = obj.get("choices")
                        if choices:
                            c = choices[0]
                            if _chunk_text(c):
                                if first is None:
                                    first = now
                                else:
                                    itl.append(now - last_text)
                                last_text = now
                                n_text += 1
                            if c.get("finish_reason"):
                                finished = True
                        elif _is_error(obj):
                            raise _StreamFailure(STREAM_ERROR, _error_text(b"\n".join(lines)))
                        usage = obj.get("usage")
                        if usage:
                            usage_tokens = usage.get("completion_tokens")
                            prompt_tokens = usage.get("prompt_tokens")
                except (ValueError, AttributeError, TypeError, IndexError, KeyError) as e:
                    raise _StreamFailure(MALFORMED, f"{type(e).__name__} on chunk {lines[0][:80]!r}") from None
                last_event = now
            if done:
                break
    finally:
        await reads.aclose()
    if done and not resp.content.at_eof():  # the end of the body normally follows [DONE] at once
        with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError, ConnectionError):
            await asyncio.wait_for(resp.content.read(), DONE_DRAIN_S)  # else aiohttp closes the connection
    if last_event is None and not done:
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
        if isinstance(obj, dict) and _is_error(obj):
            raise _StreamFailure(STREAM_ERROR, _error_text(raw))
        text = _chunk_text(obj["choices"][0]) or ""
        usage = obj.get("usage") or {}
        completion_tokens, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
    except (ValueError, AttributeError, TypeError, IndexError, KeyError) as e:
        raise _StreamFailure(MALFORMED, f"{type(e).__name__} on body {raw[:80]!r}") from None
    if not text:
        raise _StreamFailure(EMPTY, "response without any generated text")
    rec.e2el_s = now - t0
    if isinstance(completion_tokens, int):
        rec.output_tokens, rec.tokens_from_usage = completion_tokens, True
    else:  # no usage: words, a rough stand-in for tokens
        rec.output_tokens = len(text.split()) if isinstance(text, str) else 1
    rec.prompt_tokens = pt if isinstance(pt, int) else None


OPTIONAL_FIELDS = (("ignore_eos", "min_tokens"), ("stream_options",))


PROBE_PREFIX = "warm-up: "


def _unshared(body: dict) -> dict:
    """``body`` with its text behind :data:`PROBE_PREFIX`: the warm-up then shares no first token,
    hence no cached block, with the measured request built from the same row (a prefix cache
    keys blocks by a hash chained from the first token: ``vllm/v1/core/kv_cache_utils.py``)."""
    if isinstance(body.get("prompt"), str):
        return dict(body, prompt=PROBE_PREFIX + body["prompt"])
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        first = dict(messages[0])
        if isinstance(first.get("content"), str):
            first["content"] = PROBE_PREFIX + first["content"]
        return dict(body, messages=[first, *messages[1:]])
    return body


async def probe(session: aiohttp.ClientSession, url: str, body: dict, *, stream: bool, model: str) -> list[str]:
    """Send one short unmeasured request (a warm-up) and learn which optional fields the server
    takes; returns the fields to drop. A 4xx answer to a body with ``ignore_eos``/``min_tokens``
    (``transformers serve`` answers 422) is retried without them, then without
    ``stream_options``. Any other failure is a ``LoadgenError`` with the server's reason."""
    body = _unshared(dict(body, max_tokens=min(int(body.get("max_tokens") or 2), 2)))
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
