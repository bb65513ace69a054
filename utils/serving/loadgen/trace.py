"""A load-test result's requests as a raw event trace, and back.

Lab 04 has the learner compute TTFT, TPOT, ITL and end-to-end latency from raw events: when
each request was sent, when each chunk carrying text arrived, when the last data event
arrived. :func:`trace_from_result` turns a ``utils.serving.loadgen.run`` result into that trace;
:func:`records_from_trace` turns a trace back into the ``RequestRecord`` s the client fills,
so that ``utils.serving.loadgen.summarize`` (the reference metrics) can read it.
"""
from __future__ import annotations


def trace_from_result(result: dict) -> list[dict]:
    """A loadgen run's per-request records as raw events: when each request was sent, when
    each chunk carrying text arrived, when the last data event arrived, the output tokens the
    server reported, and whether it completed (seconds since the run started)."""
    out = []
    for r in result["requests"]:
        if r.get("sent_s") is None:
            continue
        if r["ok"]:
            chunks = [r["sent_s"] + r["ttft_s"]]
            for gap in r["itl_s"]:
                chunks.append(chunks[-1] + gap)
            end = r["sent_s"] + r["e2el_s"]
        else:
            chunks, end = [], r["done_s"] if r.get("done_s") is not None else r["sent_s"]
        out.append({"sent_s": r["sent_s"], "chunks_s": [round(c, 6) for c in chunks], "end_s": round(end, 6),
                    "output_tokens": r["output_tokens"] if r["ok"] else 0, "ok": bool(r["ok"])})
    return out

def records_from_trace(trace: list[dict]) -> list:
    """The trace as ``utils.serving.loadgen.RequestRecord`` s, the way the client fills them."""
    from utils.serving.loadgen import RequestRecord

    recs = []
    for i, t in enumerate(trace):
        c = t["chunks_s"]
        ok = bool(t["ok"]) and bool(c)
        recs.append(RequestRecord(
            i, scheduled_s=t["sent_s"], sent_s=t["sent_s"], done_s=t["end_s"],
            ttft_s=c[0] - t["sent_s"] if ok else None, e2el_s=t["end_s"] - t["sent_s"] if ok else None,
            itl_s=[b - a for a, b in zip(c, c[1:], strict=False)] if ok else [], output_tokens=t["output_tokens"] if ok else 0,
            ok=ok, reason="" if ok else "http_500"))
    return recs
