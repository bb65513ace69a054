"""utils.serving.loadgen against the wire behaviour of real OpenAI-compatible servers (tests/scripted_server.py).

Each scenario reproduces what a named server sends: the role-only first chunk and the
empty-``choices`` usage chunk (vLLM, SGLang, OpenAI), reasoning deltas (``reasoning_content``: SGLang,
llama.cpp, older vLLM; ``reasoning``: vLLM, Ollama), tool-call deltas (a list, or TGI's single
object), TGI's ``finish_reason: ""`` chunks and usage in the last text chunk, vLLM's
``continuous_usage_stats``, sse-starlette's ``\\r\\n`` framing and ``: ping`` comments, error events
in each server's format, HTTP error bodies, stalls and early closes. Read from: vLLM
``vllm/entrypoints/openai/chat_completion/serving.py`` and ``engine/serving.py``; SGLang
``python/sglang/srt/entrypoints/openai/serving_chat.py``; TGI ``router/src/server.rs`` and
``router/src/lib.rs``; llama.cpp ``tools/server`` (``server_sent_event``, ``format_oai_sse``); Ollama
``middleware/openai.go`` and ``openai/openai.go``; LiteLLM ``proxy_server.py``
(``async_data_generator``); sse-starlette ``sse_starlette/sse.py``; the OpenAI Python SDK
``_streaming.py``. Cases with no server source say so.

What the load generator must record: TTFT at the first chunk that carries generated text (content,
reasoning or a tool call), never the role-only chunk; output tokens from ``usage`` when the server
sends it; for every failure a reason and a one-line message, while the run goes on with the other
requests. Timings are checked only against lower bounds the server guarantees (it writes a chunk no
earlier than its scripted delay after it read the request, and the client sent the request before
that), never against an upper speed bound.
"""
import pytest
import scripted_server as S

from utils.serving import loadgen

DONE = b"data: [DONE]\n\n"
GAP = 0.01  # seconds between scripted text chunks
FIRST = 0.06  # seconds from the request to the first text chunk, where a role chunk came at once


@pytest.fixture(scope="module")
def srv():
    with S.serve() as server:
        yield server


def _stream(*items, sep="\n", end=True):
    """A chunked SSE response: floats are sleeps, dicts events, bytes raw body bytes, S.HANG or S.CLOSE."""
    steps = [S.head()]
    for it in items:
        if isinstance(it, (float, str)):
            steps.append(it)
        else:
            steps.append(S.chunk(it if isinstance(it, bytes) else S.sse(it, sep)))
    return steps + ([S.END] if end else [])


def _good_chat():
    return _stream(S.chat({"role": "assistant", "content": ""}), GAP, S.chat({"content": "ok"}),
                   S.chat({}, "stop"), S.usage(1), DONE)


def _good_completion():
    return _stream(GAP, S.completion("ok"), S.completion("", "length"), S.usage(1), DONE)


def _run(base, *, endpoint="completions", n=2, stream=True, timeout_s=5.0):
    w = loadgen.Workload(base, "m", num_requests=n, input_len=4, output_len=4, endpoint=endpoint, concurrency=1,
                         stream=stream, timeout_s=timeout_s, probe=False)
    return loadgen.run(w, progress=False)


def _one_line(detail):
    return bool(detail) and "\n" not in detail and "\r" not in detail and len(detail) <= 400


# --- what counts as the first token, and how many tokens ---------------------------------------

@pytest.mark.parametrize("role_delta", [
    {"role": "assistant", "content": "", "refusal": None},  # OpenAI
    {"role": "assistant", "content": ""},  # vLLM, SGLang
    {"role": "assistant"},  # llama.cpp
])
def test_ttft_is_the_first_text_chunk_not_the_role_chunk(srv, role_delta):
    base = srv.add("role", _stream(S.chat(role_delta), FIRST, S.chat({"content": "Hi"}), GAP,
                                   S.chat({"content": " there"}), GAP, S.chat({"content": "!"}), S.chat({}, "stop"),
                                   S.usage(3), DONE))
    r = _run(base, endpoint="chat")
    assert r["completed"] == 2 and r["output_tokens_source"] == "usage"
    for q in r["requests"]:
        assert q["ok"] and q["ttft_s"] >= FIRST and q["e2el_s"] >= FIRST + 2 * GAP, q
        assert q["output_tokens"] == 3 and q["tokens_from_usage"] and len(q["itl_s"]) == 2


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_text_is_generated_text(srv, field):
    """SGLang and llama.cpp stream ``reasoning_content``, vLLM and Ollama ``reasoning``: the first
    reasoning chunk is the first token, and without usage every reasoning chunk counts."""
    base = srv.add(f"think_{field}", _stream(S.chat({"role": "assistant", "content": ""}), FIRST,
                                             S.chat({field: "Let", "content": None}), GAP, S.chat({field: " me"}), GAP,
                                             S.chat({"content": "Hi"}), S.chat({}, "stop"), DONE))
    r = _run(base, endpoint="chat")
    assert r["completed"] == 2 and r["output_tokens_source"] == "chunks"
    for q in r["requests"]:
        assert q["ttft_s"] >= FIRST and q["output_tokens"] == 3 and len(q["itl_s"]) == 2, q


@pytest.mark.parametrize("calls", [
    lambda name, args: [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": args}}],
    lambda name, args: {"index": 0, "id": "", "type": "function", "function": {"name": name, "arguments": args}},  # TGI's ToolCallDelta
], ids=["list", "tgi_object"])
def test_tool_call_deltas_are_generated_text(srv, calls):
    """A reply that is only a tool call (content null throughout) is a complete answer."""
    base = srv.add("tools", _stream(S.chat({"role": "assistant", "content": None}), FIRST,
                                    S.chat({"tool_calls": calls("get_weather", "")}), GAP,
                                    S.chat({"tool_calls": calls(None, '{"city": ')}), GAP,
                                    S.chat({"tool_calls": calls(None, '"Paris"}')}), S.chat({}, "tool_calls"),
                                    S.usage(9), DONE))
    r = _run(base, endpoint="chat")
    assert r["completed"] == 2, r["failure_examples"]
    for q in r["requests"]:
        assert q["ttft_s"] >= FIRST and q["output_tokens"] == 9 and len(q["itl_s"]) == 2, q


def test_tgi_completions_stream_empty_finish_reason_and_usage_in_the_last_text_chunk(srv):
    final = S.completion(" end", "length", usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7})
    base = srv.add("tgi", _stream(FIRST, S.completion("a", ""), GAP, S.completion(" b", ""), GAP, final, DONE))
    r = _run(base)
    assert r["completed"] == 2 and r["output_tokens_source"] == "usage" and r["prompt_tokens_mean"] == 4
    assert all(q["ttft_s"] >= FIRST and q["output_tokens"] == 3 and len(q["itl_s"]) == 2 for q in r["requests"])


def _u(k):
    return {"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k}


@pytest.mark.parametrize("style", ["final_usage", "continuous_usage", "ollama_zero_usage"])
def test_usage_counts_tokens_when_a_chunk_carries_several(srv, style):
    """Four chunks of two tokens (vLLM ``--stream-interval``, speculative decoding): output tokens,
    and so TPOT, come from usage, not from the chunk count; ITL stays one gap per chunk."""
    extra = {"final_usage": lambda k: {}, "continuous_usage": lambda k: {"usage": _u(2 * k)},  # vLLM
             "ollama_zero_usage": lambda k: {"usage": _u(0)}}[style]  # Ollama /v1/completions
    items = [FIRST]
    for k in range(1, 5):
        items += [S.completion(" a b", "length" if k == 4 else None, **extra(k)), GAP]
    if style != "continuous_usage":
        items.append({**S.usage(8)})
    base = srv.add(f"multi_{style}", _stream(*items, DONE))
    r = _run(base)
    assert r["completed"] == 2 and r["output_tokens_source"] == "usage" and r["total_output_tokens"] == 16
    for q in r["requests"]:
        assert q["output_tokens"] == 8 and len(q["itl_s"]) == 3 and q["prompt_tokens"] == 4
    tpot_ms = [1e3 * (q["e2el_s"] - q["ttft_s"]) / 7 for q in r["requests"]]
    assert r["tpot_ms"]["mean"] == pytest.approx(sum(tpot_ms) / 2, abs=0.01)


# --- Server-Sent Events framing ------------------------------------------------------------------

def _text_events(sep="\n"):
    return [S.sse(S.completion("a"), sep), GAP, S.sse(S.completion(" b"), sep), GAP,
            S.sse(S.completion(" c", "length"), sep)]


PING = b": ping - 2025-01-01 00:00:00.000000\r\n\r\n"  # sse-starlette's keep-alive comment
FRAMINGS = {
    "crlf": ([], _text_events("\r\n"), b"data: [DONE]\r\n\r\n"),  # sse-starlette's default separator
    "cr": ([], _text_events("\r"), b"data: [DONE]\r\r"),  # sse-starlette sep="\r", legal SSE
    "pings": ([PING], _text_events()[:2] + [PING] + _text_events()[2:], PING + DONE),
    "axum_keepalive": ([b":\n\n"], _text_events(), DONE),  # TGI: axum's KeepAlive comment
    "event_id_retry_lines": ([b"retry: 3000\n\n"], [b"event: message\nid: 1\n" + e if isinstance(e, bytes) else e
                                                    for e in _text_events()], DONE),
    "no_space_after_colon": ([], [e.replace(b"data: ", b"data:") if isinstance(e, bytes) else e
                                  for e in _text_events()], b"data:[DONE]\n\n"),
    "done_with_trailing_spaces": ([], _text_events(), b"data: [DONE]   \n\n"),
    "multi_line_data": ([], [b'data: {"choices": [{"index": 0,\ndata:  "text": "a", "finish_reason": null}]}\n\n', GAP,
                             S.sse(S.completion(" b")), GAP, S.sse(S.completion(" c", "length"))], DONE),
    "no_blank_line_at_the_end": ([], _text_events()[:-1] + [S.sse(S.completion(" c", "length"))[:-2]], b""),
}


@pytest.mark.parametrize("framing", FRAMINGS)
def test_sse_framing_of_real_servers(srv, framing):
    before, events, tail = FRAMINGS[framing]
    base = srv.add(f"framing_{framing}", _stream(*before, FIRST, *events, *([tail] if tail else [])))
    r = _run(base)
    assert r["completed"] == 2, r["failure_examples"]
    for q in r["requests"]:  # a comment at once does not start the clock's first token
        assert q["ttft_s"] >= FIRST and q["output_tokens"] == 3 and len(q["itl_s"]) == 2, q


def test_an_event_split_across_reads_mid_line_is_timed_when_it_completes(srv):
    event = S.sse(S.completion("a"), "\r\n")
    pieces = [event[:2], event[2:30], event[30:-3], event[-3:]]  # the last split falls between \r and \n
    items = [pieces[0], 0.03, pieces[1], 0.03, pieces[2], 0.03, pieces[3], GAP, S.completion(" b", "length"), DONE]
    base = srv.add("split", _stream(*items))
    r = _run(base)
    assert r["completed"] == 2, r["failure_examples"]
    for q in r["requests"]:
        assert q["ttft_s"] >= 0.09 and q["output_tokens"] == 2, q


def test_done_then_a_connection_held_open_is_a_complete_answer(srv):
    """A server that sends ``data: [DONE]`` and keeps the response open: the OpenAI SDK stops
    reading at [DONE], so the answer is complete, not a timeout."""
    base = srv.add("done_hang", _stream(FIRST, S.completion("a"), GAP, S.completion(" b", "length"), S.usage(2), DONE,
                                        S.HANG, end=False))
    r = _run(base, timeout_s=2.0)
    assert r["completed"] == 2 and r["failed"] == 0, r["failure_examples"]
    assert all(q["output_tokens"] == 2 and q["e2el_s"] >= FIRST + GAP for q in r["requests"])


# --- failures: a reason, one line, and the run goes on --------------------------------------------

MESSAGE = "GPU fell off the bus"
ERROR_EVENTS = {
    "vllm_sglang_litellm": (S.sse({"error": {"message": MESSAGE, "type": "InternalServerError", "param": None,
                                             "code": 500}}), DONE),
    "llama_cpp": (S.sse({"error": {"code": 500, "message": MESSAGE, "type": "server_error"}}), b""),
    "llama_cpp_error_field": (S.sse({"code": 500, "message": MESSAGE, "type": "server_error"}, field="error"), DONE),
    "tgi": (S.sse({"error": MESSAGE, "error_type": "generation"}), DONE),
    "object_error": (S.sse({"object": "error", "message": MESSAGE, "type": "BadRequestError", "code": 400}), DONE),
    "event_error": (b"event: error\n" + S.sse({"message": MESSAGE}), DONE),
    # No server source: a gateway that appends a bare JSON error object, no SSE framing, and closes.
    "bare_json_error": (b'{"error": {"message": "' + MESSAGE.encode() + b'", "type": "api_error"}}\n', b""),
}


@pytest.mark.parametrize("style", ERROR_EVENTS)
def test_an_error_event_mid_stream_fails_the_request_with_the_servers_message(srv, style):
    event, tail = ERROR_EVENTS[style]
    bad = _stream(GAP, S.completion("a"), GAP, S.completion(" b"), event, *([tail] if tail else []))
    base = srv.add(f"err_{style}", [bad, _good_completion()])
    r = _run(base, n=4)
    assert r["completed"] == 2 and r["failures"] == {"stream_error": 2}, r["failure_examples"]
    detail = r["failure_examples"]["stream_error"]
    assert MESSAGE in detail and "{" not in detail and _one_line(detail), detail


HTTP_ERRORS = {
    "openai_400": (400, {"error": {"message": "max_tokens is too large", "type": "invalid_request_error",
                                   "param": "max_tokens", "code": None}}, {}, "max_tokens is too large"),
    "vllm_404": (404, {"object": "error", "message": "The model `m` does not exist.", "type": "NotFoundError",
                       "param": None, "code": 404}, {}, "The model `m` does not exist."),
    "fastapi_422": (422, {"detail": [{"loc": ["body", "min_tokens"], "msg": "Extra inputs are not permitted",
                                      "type": "extra_forbidden"}]}, {}, "Extra inputs are not permitted"),
    "tgi_424": (424, {"error": "Request failed during generation: CUDA out of memory", "error_type": "generation"},
                {}, "Request failed during generation: CUDA out of memory"),
    "tgi_429": (429, {"error": "Model is overloaded", "error_type": "overloaded"}, {"Retry-After": "2"},
                "Model is overloaded (Retry-After: 2)"),
    "litellm_429": (429, {"error": {"message": "Rate limit reached", "type": "None", "param": "None", "code": "429"}},
                    {"Retry-After": "7"}, "Rate limit reached (Retry-After: 7)"),
    "nginx_502_html": (502, b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body></body>\r\n</html>\r\n", {},
                       "502 Bad Gateway"),
    "empty_503": (503, b"", {"Retry-After": "5"}, "Service Unavailable (Retry-After: 5)"),
}


@pytest.mark.parametrize("case", HTTP_ERRORS)
def test_http_errors_record_the_status_and_the_servers_message(srv, case):
    status, body, headers, want = HTTP_ERRORS[case]
    base = srv.add(f"http_{case}", [S.json_response(status, body, headers), _good_completion()])
    r = _run(base, n=4)
    reason = f"http_{status}"
    assert r["completed"] == 2 and r["failures"] == {reason: 2}, r["failure_examples"]
    detail = r["failure_examples"][reason]
    assert want in detail and _one_line(detail), detail


STALLS = {
    "reads_the_request_never_answers": [S.HANG],
    "headers_then_nothing": [S.head(), S.HANG],
    "stalls_mid_stream": _stream(GAP, S.completion("a"), GAP, S.completion(" b"), S.HANG, end=False),
    "finish_then_nothing": _stream(GAP, S.completion("a", "length"), S.HANG, end=False),  # usage might follow
}


@pytest.mark.parametrize("case", STALLS)
def test_a_stalled_request_times_out_and_the_run_goes_on(srv, case):
    base = srv.add(f"stall_{case}", [STALLS[case], _good_completion()])
    r = _run(base, n=4, timeout_s=0.5)
    assert r["completed"] == 2 and r["failures"] == {"timeout": 2}, r["failure_examples"]
    assert _one_line(r["failure_examples"]["timeout"])
    assert r["ttft_ms"]["n"] == r["e2el_ms"]["n"] == 2  # failures stay out of the latencies


def test_a_server_that_accepts_and_never_sends_a_byte_times_out(srv):
    r = _run(srv.silent_url, n=2, timeout_s=0.3)
    assert r["completed"] == 0 and r["failures"] == {"timeout": 2} and r["not_sent"] == 0
    assert _one_line(r["failure_examples"]["timeout"])


CLOSES = {
    "before_any_byte": ([S.CLOSE], "connection_error"),
    "after_the_headers": ([S.head(), S.CLOSE], "dropped_stream"),
    "mid_chunk": ([S.head(), S.chunk(S.sse(S.completion("a"))), S.chunk(S.sse(S.completion(" b")))[:20], S.CLOSE],
                  "dropped_stream"),
    "close_delimited_body_cut": ([S.head(chunked=False, close=True), S.sse(S.completion("a")), GAP,
                                  S.sse(S.completion(" b")), S.CLOSE], "dropped_stream"),
    "after_finish_before_usage_and_done": (_stream(GAP, S.completion("a", "length"), end=False) + [S.CLOSE],
                                           "dropped_stream"),
}


@pytest.mark.parametrize("case", CLOSES)
def test_an_early_close_fails_with_a_reason_and_the_run_goes_on(srv, case):
    script, reason = CLOSES[case]
    base = srv.add(f"close_{case}", [script, _good_completion()])
    r = _run(base, n=4)
    assert r["completed"] == 2 and r["failures"] == {reason: 2}, r["failure_examples"]
    assert _one_line(r["failure_examples"][reason]), r["failure_examples"]


def test_a_close_delimited_body_that_ends_with_done_is_complete(srv):
    """HTTP/1.0-style framing (no chunks, no length, the close ends the body), as some proxies send."""
    base = srv.add("close_delimited_ok", [S.head(chunked=False, close=True), FIRST, *_text_events(), DONE, S.CLOSE])
    r = _run(base)
    assert r["completed"] == 2 and all(q["ttft_s"] >= FIRST and q["output_tokens"] == 3 for q in r["requests"])


NON_JSON = {
    "html_200_for_a_stream": ([S.head(content_type="text/html"), S.chunk(b"<html><body>upstream error</body></html>"),
                               S.END], True),
    "data_not_json": (_stream(GAP, S.completion("a"), b"data: <html>oops</html>\n\n", DONE), True),
    "html_200_for_a_plain_request": (S.json_response(200, b"<html><body>maintenance</body></html>"), False),
}


@pytest.mark.parametrize("case", NON_JSON)
def test_a_body_that_is_not_json_is_malformed(srv, case):
    script, stream = NON_JSON[case]
    good = _good_completion() if stream else S.json_response(200, {"choices": [{"index": 0, "text": "ok"}]})
    base = srv.add(f"nonjson_{case}", [script, good])
    r = _run(base, n=4, stream=stream)
    assert r["completed"] == 2 and r["failures"] == {"malformed_chunk": 2}, r["failure_examples"]
    assert _one_line(r["failure_examples"]["malformed_chunk"])


# --- non-streaming bodies --------------------------------------------------------------------------

def _chat_body(message, tokens=5):
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens}}


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "assistant", "content": None, "reasoning_content": "Let me think"},
    {"role": "assistant", "content": "", "reasoning": "Let me think"},
], ids=["tool_calls", "reasoning_content", "reasoning"])
def test_a_non_streamed_answer_without_content_is_complete(srv, message):
    base = srv.add("plain_nocontent", S.json_response(200, _chat_body(message)))
    r = _run(base, endpoint="chat", stream=False)
    assert r["completed"] == 2 and r["total_output_tokens"] == 10, r["failure_examples"]
    assert r["ttft_ms"]["n"] == 0 and r["e2el_ms"]["n"] == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_error_body_with_status_200_fails_with_the_message(srv, stream):
    """No server source: a gateway answering 200 with a JSON error body, streamed request or not."""
    good = _good_chat() if stream else S.json_response(200, _chat_body({"role": "assistant", "content": "ok"}))
    base = srv.add("plain_error200", [S.json_response(200, {"error": {"message": MESSAGE, "code": 500}}), good])
    r = _run(base, endpoint="chat", stream=stream, n=4)
    assert r["completed"] == 2 and r["failures"] == {"stream_error": 2}, r["failure_examples"]
    assert MESSAGE in r["failure_examples"]["stream_error"]
