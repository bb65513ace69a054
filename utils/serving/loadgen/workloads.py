"""Workloads: what to send (prompts), when to send it (arrivals), and the run itself.

The named loads (docs/reference.md, "LLM load metrics"):

- **synchronous**: one request at a time (concurrency 1);
- **concurrency C**: C requests always in flight; a finished request's slot is refilled at once;
- **rate R**: arrivals at R req/s, ``constant`` (spacing 1/R) or gamma-distributed with
  shape ``burstiness`` and mean 1/R (vLLM ``benchmarks/serve.py``: burstiness 1 is a
  Poisson process, lower is burstier); R = inf sends everything at once; an optional
  concurrency cap holds requests until a slot frees (vLLM's ``--max-concurrency``);
- **sweep** (GuideLLM's): synchronous, then throughput (everything at once), then
  ``points`` constant or Poisson rates evenly spaced between the two measured rates.

Each run draws fresh prompts unless ``seed`` is set, and the summary records the seed it used.
A repeated run of the same prompts measures a server's prefix cache, not its prefill: vLLM
caches every full block of a prompt, keyed by a hash chained from the first token
(``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``), and keeps prefix caching on by
default. A lab 04 sweep on an H200 (vLLM 0.26, the same seed for every step) logged a prefix
cache hit rate of 84.1%; the ``vllm bench serve`` runs beside it, with fresh random prompts,
logged 1.2 to 5.5% (``benchmarks/results/vllm-gpu-h200/``).

Every run ends on its own: after ``num_requests``, or at ``max_duration_s`` (requests
still in flight are cancelled and counted as ``cancelled``), and each request has a
total timeout ``timeout_s``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import numpy as np
from tqdm.auto import tqdm

from utils.serving.loadgen import client
from utils.serving.loadgen.client import LoadgenError, RequestRecord
from utils.serving.loadgen.metrics import DEFINITIONS, UNITS, summarize

SCHEMA = "gpulab.loadgen/1"

# Frequent short English words. Preceded by a space, such words are usually a single token in
# the byte-level BPE vocabularies of large models, so N of them make a prompt of about N
# tokens (plus a BOS token or a chat template): with the repository's small byte-level BPE
# (utils/data/tokenizer.json, 4096 tokens) 50 prompts of 100 words averaged 100.2 tokens.
# An estimate for other vocabularies: the server's usage.prompt_tokens, reported as
# prompt_tokens_mean, is the measured count, and --tokenizer makes the length exact.
_WORDS = ("the of and to in is that for it with as was on be at by this had not are but from or have an they which "
          "one you were all we her she there been his if has more when will would who so no out up into do time "
          "can only new some could these two may first then any like my now over such our man me even most made "
          "after also did many off before must well back through years much where your way down should because "
          "long each just those people how too little state good very make world still own see men work last "
          "here life both year under never day same another know while might great old off come since against "
          "go came right used take three").split()
_WORDS = tuple(dict.fromkeys(_WORDS))  # unique, in order


@dataclass
class Workload:
    """A load test, fully defined (the summary repeats it: never tokens/s without the workload)."""

    base_url: str
    model: str
    num_requests: int = 100
    input_len: int = 128
    output_len: int = 128
    endpoint: str = "completions"  # or "chat"
    concurrency: int | None = None  # in-flight cap; alone it names a concurrency run
    request_rate: float = math.inf  # req/s; inf = all at once
    arrival: str = "poisson"  # or "constant" (ignored at rate inf)
    burstiness: float = 1.0  # gamma shape; 1 = Poisson
    stream: bool = True
    dataset: str | None = None  # JSONL: {"prompt": ...} or {"messages": [...]}, optional "output_len"
    tokenizer: str | None = None  # Hugging Face tokenizer name or path for exact synthetic prompt lengths
    seed: int | None = None  # prompts and arrivals; None: a fresh seed per run, recorded in the summary
    timeout_s: float = 300.0
    max_duration_s: float | None = None
    fixed_output: bool = True  # also send ignore_eos and min_tokens (dropped if the server rejects them)
    extra_body: dict = field(default_factory=dict)
    api_key: str | None = None
    slo_ms: dict = field(default_factory=dict)  # goodput SLOs: {"ttft": ms, "tpot": ms, "e2el": ms}
    probe: bool = True  # one unmeasured warm-up request that also checks the model and optional fields
    min_in_flight_fraction: float = 0.9
    max_dispatch_delay_ms: float = 10.0

    @property
    def kind(self) -> str:
        if math.isinf(self.request_rate):
            if self.concurrency == 1:
                return "synchronous"
            return f"concurrency {self.concurrency}" if self.concurrency else "throughput (all at once)"
        arrival = "constant" if self.arrival == "constant" else f"poisson (gamma, burstiness {self.burstiness:g})"
        cap = f", concurrency cap {self.concurrency}" if self.concurrency else ""
        return f"rate {self.request_rate:g} req/s, {arrival}{cap}"

    def validate(self) -> None:
        client.endpoint_url(self.base_url, self.endpoint)
        checks = [
            (self.num_requests >= 1, "--num-requests must be at least 1"),
            (self.input_len >= 1, "--input-len must be at least 1"),
            (self.output_len >= 1, "--output-len must be at least 1"),
            (self.concurrency is None or self.concurrency >= 1, "--concurrency must be at least 1"),
            (self.request_rate > 0, "--request-rate must be positive (inf: all at once)"),
            (self.arrival in ("poisson", "constant"), "--arrival must be 'poisson' or 'constant'"),
            (self.burstiness > 0, "--burstiness must be positive (1 = Poisson)"),
            (self.timeout_s > 0, "--timeout-s must be positive"),
            (self.max_duration_s is None or self.max_duration_s > 0, "--max-duration-s must be positive"),
            (self.stream or "ttft" not in self.slo_ms and "tpot" not in self.slo_ms,
             "a ttft or tpot SLO needs streaming: drop --no-stream or the SLO"),
            (bool(self.model), "--model is empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise LoadgenError(message)

    def describe(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("api_key")
        d["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        d["kind"] = self.kind
        d["prompt_source"] = (f"JSONL file {self.dataset}" if self.dataset else
                              f"synthetic, {self.input_len} tokens of {self.tokenizer}" if self.tokenizer else
                              f"synthetic, {self.input_len} common English words (about 1 token each; see prompt_tokens_mean)")
        return d


def arrival_offsets(n: int, rate: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times in seconds after the start, first request at 0.

    Gaps are ``1/rate`` (constant) or gamma(shape=burstiness, scale=1/(rate*burstiness)),
    whose mean is 1/rate and coefficient of variation 1/sqrt(burstiness) (vLLM's arrivals;
    burstiness 1 is exponential, i.e. Poisson). rate = inf: all at 0."""
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if arrival == "constant":
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def synthetic_prompts(n: int, input_len: int, *, seed: int = 0, tokenizer=None) -> list[str]:
    """``n`` distinct random prompts of ``input_len`` tokens (random words, so no two share a
    prefix for the server's prefix cache to reuse).

    With a tokenizer: random non-special token ids, decoded and re-encoded until the prompt
    is exactly ``input_len`` tokens (vLLM's random dataset does the same). Random ids merge
    across their boundaries, and eight rounds left 100 of 1,800 prompts a token off (the
    course's 4096-token tokenizer, 16-token prompts, seeds 0 to 299). Such a prompt is redrawn
    from whole-word tokens that decode and re-encode to themselves (:func:`_word_ids`), and
    is checked once more; a tokenizer with no such tokens raises :class:`LoadgenError`.
    Without a tokenizer: ``input_len`` common words, about one token each (an estimate)."""
    rng = np.random.default_rng(seed)
    if tokenizer is None:
        idx = rng.integers(0, len(_WORDS), size=(n, input_len))
        return [" ".join(_WORDS[i] for i in row) for row in idx]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = [i for i in range(len(tokenizer)) if i not in special]

    def length(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    prompts, words = [], None
    for _ in range(n):
        ids = list(rng.choice(vocab, size=input_len))
        for _round in range(8):
            ids = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
            if len(ids) == input_len:
                break
            ids = ids[:input_len] + list(rng.choice(vocab, size=max(0, input_len - len(ids))))
        text = tokenizer.decode(ids)
        if length(text) != input_len:
            words = _word_ids(tokenizer, vocab) if words is None else words
            text = tokenizer.decode(list(rng.choice(words, size=input_len))) if words else text
            if length(text) != input_len:
                raise LoadgenError(f"could not build a prompt of exactly {input_len} tokens with this tokenizer "
                                   f"(its tokens merge when joined); pass --dataset with your own prompts")
        prompts.append(text)
    return prompts


def _word_ids(tokenizer, vocab: list[int], enough: int = 2048) -> list[int]:
    """Up to ``enough`` ids of ``vocab`` whose token is one space-led word and decodes and
    re-encodes to itself, so a run of them keeps its length under whitespace pre-tokenizers
    (GPT-2's byte-level BPE, SentencePiece's space-led pieces). Written here: tokenizers offers
    no such query."""
    out = []
    for i in vocab:
        text = tokenizer.decode([i, i])
        if re.fullmatch(r" ?[A-Za-z]{2,} [A-Za-z]{2,}", text) and tokenizer.encode(text, add_special_tokens=False) == [i, i]:
            out.append(i)
            if len(out) >= enough:
                break
    return out


def load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # a missing path, no network, a broken config: all one line for the user
        raise LoadgenError(f"cannot load tokenizer {name!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def load_jsonl(path: str | os.PathLike, endpoint: str) -> list[dict]:
    """Rows of a JSONL prompt file: ``{"prompt": str}`` (either endpoint) or ``{"messages": [...]}``
    (chat only), optionally ``"output_len"``; blank lines are skipped."""
    p = Path(path)
    if not p.is_file():
        raise LoadgenError(f"--dataset {path}: no such file")
    rows = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise LoadgenError(f"--dataset {path} line {lineno}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or not (isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)):
                raise LoadgenError(f"--dataset {path} line {lineno}: needs a string 'prompt' or a list 'messages'")
            if "messages" in row and "prompt" not in row and endpoint != "chat":
                raise LoadgenError(f"--dataset {path} line {lineno}: 'messages' needs --endpoint chat")
            out = row.get("output_len")
            if out is not None and (not isinstance(out, int) or out < 1):
                raise LoadgenError(f"--dataset {path} line {lineno}: 'output_len' must be a positive integer")
            rows.append(row)
    if not rows:
        raise LoadgenError(f"--dataset {path}: no rows")
    return rows


def build_bodies(w: Workload) -> list[dict]:
    """The JSON body of every request, in order (built before the clock starts)."""
    if w.dataset:
        rows = load_jsonl(w.dataset, w.endpoint)
        rows = [rows[i % len(rows)] for i in range(w.num_requests)]  # in file order, cycling
    else:
        tok = load_tokenizer(w.tokenizer) if w.tokenizer else None
        rows = [{"prompt": p} for p in synthetic_prompts(w.num_requests, w.input_len, seed=w.seed, tokenizer=tok)]
    bodies = []
    for row in rows:
        out = row.get("output_len") or w.output_len
        body = {"model": w.model, "max_tokens": out, "stream": w.stream}
        if w.endpoint == "chat":
            body["messages"] = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        else:
            body["prompt"] = row["prompt"]
        if w.stream:
            body["stream_options"] = {"include_usage": True}
        if w.fixed_output:
            body["ignore_eos"], body["min_tokens"] = True, out
        body.update(w.extra_body)
        bodies.append(body)
    return bodies


async def _lag_monitor(samples: list, interval_s: float = 0.02) -> None:
    """Event-loop lag: how late a 20 ms sleep wakes. A busy client timestamps chunks late."""
    while True:
        t = perf_counter()
        await asyncio.sleep(interval_s)
        samples.append(perf_counter() - t - interval_s)


async def _drive(w: Workload, session, url: str, bodies: list[bytes], offsets, bar) -> tuple[list, float]:
    n = len(bodies)
    offsets = [float(x) for x in offsets]
    records = [RequestRecord(i) for i in range(n)]
    t_origin = perf_counter()
    stop = False

    async def one(rec: RequestRecord, eligible: float) -> None:
        rec.scheduled_s = eligible - t_origin
        try:
            await client.send(session, url, bodies[rec.index], rec, stream=w.stream, t_origin=t_origin)
        finally:
            bar.update(1)

    async def concurrency_run() -> None:
        counter = itertools.count()

        async def worker() -> None:
            eligible = t_origin
            while not stop:
                i = next(counter)
                if i >= n:
                    return
                await one(records[i], eligible)
                eligible = perf_counter()

        await asyncio.gather(*(worker() for _ in range(min(w.concurrency, n))))

    async def rate_run() -> None:
        sem = asyncio.Semaphore(w.concurrency) if w.concurrency else None
        freed = [t_origin]
        tasks: set = set()

        async def capped(rec, eligible):
            try:
                await one(rec, eligible)
            finally:
                freed[0] = perf_counter()
                sem.release()

        try:
            for i in range(n):
                target = t_origin + offsets[i]
                delay = target - perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                eligible = target
                if sem is not None:
                    waited = sem.locked()
                    await sem.acquire()
                    if waited:  # eligible from the moment a slot freed, not from the arrival
                        eligible = max(target, freed[0])
                    task = asyncio.ensure_future(capped(records[i], eligible))
                else:
                    task = asyncio.ensure_future(one(records[i], eligible))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    concurrent_only = w.concurrency and math.isinf(w.request_rate)
    main = asyncio.ensure_future(concurrency_run() if concurrent_only else rate_run())
    done, _ = await asyncio.wait({main}, timeout=w.max_duration_s)
    if not done:
        stop = True
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
    else:
        main.result()
    return records, perf_counter() - t_origin


async def run_async(w: Workload, *, progress: bool = True, label: str | None = None) -> dict:
    """Run one workload and return its summary (metrics, workload, load held, per-request trace).

    Use this from a running event loop (``await`` in Jupyter); ``run()`` elsewhere."""
    w.validate()
    if w.seed is None:
        w = dataclasses.replace(w, seed=int.from_bytes(os.urandom(4), "little") >> 1)
    url = client.endpoint_url(w.base_url, w.endpoint)
    bodies = build_bodies(w)
    dropped: list[str] = []
    async with client.make_session(w.timeout_s, w.api_key) as session:
        if w.probe:
            dropped = await client.probe(session, url, bodies[0], stream=w.stream, model=w.model)
        payloads = [json.dumps({k: v for k, v in b.items() if k not in dropped}).encode() for b in bodies]
        offsets = arrival_offsets(w.num_requests, w.request_rate, arrival=w.arrival, burstiness=w.burstiness, seed=w.seed)
        lag: list[float] = []
        with tqdm(total=w.num_requests, desc=label or w.kind, unit="req", file=sys.stderr, disable=not progress,
                  mininterval=0.5, leave=False) as bar:
            monitor = asyncio.ensure_future(_lag_monitor(lag))
            cpu0, wall0 = time.process_time(), time.time()
            try:
                records, duration_s = await _drive(w, session, url, payloads, offsets, bar)
            finally:
                monitor.cancel()
            cpu_s = time.process_time() - cpu0

    summary = summarize(records, duration_s=duration_s, slo=w.slo_ms or None, concurrency=w.concurrency,
                        request_rate=w.request_rate, schedule_offsets_s=None if math.isinf(w.request_rate) else offsets,
                        min_in_flight_fraction=w.min_in_flight_fraction, max_dispatch_delay_ms=w.max_dispatch_delay_ms)
    warnings = []
    if summary["load_warning"]:
        warnings.append(summary["load_warning"])
    if summary["not_sent"] or summary["cancelled"]:
        warnings.append(f"stopped at max_duration_s={w.max_duration_s:g}: {summary['not_sent']} requests not sent, "
                        f"{summary['cancelled']} cancelled in flight")
    if [f for f in dropped if f in ("ignore_eos", "min_tokens")]:
        warnings.append("the server rejected ignore_eos/min_tokens: output length not enforced, the model may stop "
                        "early (see output_tokens_mean)")
    lag_ms = np.percentile(np.asarray(lag) * 1e3, [50, 99]).round(3).tolist() if lag else [None, None]
    if lag_ms[1] is not None and lag_ms[1] > 5.0:
        warnings.append(f"client event-loop lag p99 {lag_ms[1]:.1f} ms: the client was busy and may have "
                        "timestamped chunks late; latencies include that much client delay")
    sent = summary["completed"] + summary["failed"] + summary["cancelled"]
    summary.update({
        "schema": SCHEMA, "label": label or w.kind, "workload": w.describe(),
        "fields_dropped": dropped, "definitions": DEFINITIONS, "units": UNITS, "warnings": warnings,
        "client": {"cpu_s": round(cpu_s, 4), "cpu_ms_per_request": round(1e3 * cpu_s / sent, 4) if sent else None,
                   "loop_lag_ms_p50": lag_ms[0], "loop_lag_ms_p99": lag_ms[1], "event_loop": _loop_name(),
                   "start_unix": round(wall0, 3), "cpu_count": os.cpu_count(), "python": sys.version.split()[0]},
        "requests": [r.to_dict() for r in records],
    })
    return summary


def _loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def _run_coro(make_coro):
    """Run a coroutine to completion with uvloop if installed, else asyncio; from a thread of
    its own when this thread already runs a loop (Jupyter), so ``run()`` works there too."""
    def go():
        try:
            import uvloop
        except ImportError:
            uvloop = None
        if getattr(uvloop, "run", None) is None:  # not installed, or older than 0.18
            return asyncio.run(make_coro())
        return uvloop.run(make_coro())

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return go()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(go).result()


def run(w: Workload, *, progress: bool = True, label: str | None = None) -> dict:
    """Run one workload (blocking) and return its summary; see ``run_async``."""
    return _run_coro(lambda: run_async(w, progress=progress, label=label))


def sweep(w: Workload, *, points: int = 6, progress: bool = True) -> dict:
    """GuideLLM's sweep: synchronous, throughput (all at once, capped by ``w.concurrency`` if
    set), then ``points`` rates evenly spaced strictly between the two measured request rates,
    with ``w.arrival`` arrivals. Each step sends ``w.num_requests`` requests."""
    if points < 1:
        raise LoadgenError("--sweep-points must be at least 1")
    base = dataclasses.replace(w, request_rate=math.inf)

    async def go():
        runs = [await run_async(dataclasses.replace(base, concurrency=1), progress=progress, label="synchronous")]
        nonprobe = dataclasses.replace(base, probe=False)  # the first step checked the server
        runs.append(await run_async(nonprobe, progress=progress, label="throughput"))
        lo, hi = runs[0]["request_throughput"], runs[1]["request_throughput"]
        if not (lo > 0 and hi > 0):
            raise LoadgenError("sweep: the synchronous or throughput step completed no requests; see their failures")
        for rate in np.linspace(lo, hi, points + 2)[1:-1]:
            step = dataclasses.replace(nonprobe, request_rate=float(rate))
            runs.append(await run_async(step, progress=progress, label=f"rate {rate:.3g}"))
        return runs

    runs = _run_coro(go)
    warnings = [f"{r['label']}: {m}" for r in runs for m in r["warnings"]]
    if runs[1]["request_throughput"] <= runs[0]["request_throughput"] * 1.05:
        warnings.append("throughput step was no faster than synchronous: the server does not batch, or the cap "
                        "is 1; the rates between are nearly equal")
    return {"schema": SCHEMA, "sweep": True, "points": points, "workload": w.describe(), "definitions": DEFINITIONS,
            "units": UNITS, "warnings": warnings, "runs": runs}
