"""Lab 03's serving exercise: a paged KV cache that a scheduler written by the learner drives.

:class:`PagedEngine` is the model step. It keeps the KV cache of a small Hugging Face decoder
(the ``llama-tiny`` or ``qwen-tiny`` preset of ``utils/model/models.py``) in a pool of fixed-size
blocks, as vLLM's PagedAttention does (Kwon et al., SOSP 2023): block ``b`` holds the keys and
values of ``block_size`` consecutive tokens of one request, and each request's *block table*
lists its blocks in order. At every :meth:`PagedEngine.step` the scheduler hands over the table
of every running request; the engine prefills the requests new to this step (their first
token) and decodes one token for the others in one batched forward, gathering each request's
cache from its blocks. A scheduler decides which requests run (Orca's iteration-level
scheduling: Yu et al., OSDI 2022) and which blocks they hold; the engine refuses, in one line
(:class:`ScheduleError`), a schedule that could not run on a real pool: a block in two tables,
a block that moved, a table not ``ceil(tokens / block_size)`` blocks long (vLLM's count for a
full-attention layer, ``utils.kv.vllm_kv.vllm_blocks_per_request``), an admission that would leave
a running request short of a block later, a running request left out of a step.

Lengths: a request of prompt ``P`` and ``N`` output tokens is prefilled once (its cache then
holds ``P`` tokens and it has its first token) and decoded ``N - 1`` times, each decode step
feeding the last token (the cache grows by one). Its cache ends at ``P + N - 1`` tokens.

Arrivals are counted in engine steps (:attr:`PagedEngine.now`); :meth:`PagedEngine.wait` is a
step with nothing to run, and costs no time here. Latency is counted in steps and in the
milliseconds of the steps a request lived through, each step timed with ``time.perf_counter``
after the device has finished it (``utils.measure.timing.device_sync``; the tokens are read back to the
host every step anyway). :func:`static_batching` is the baseline; :func:`timed_runs` times a
scheduler on fresh engines.
"""
from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from utils import validate
from utils.kv.vllm_kv import vllm_blocks_per_request, vllm_num_blocks
from utils.measure.timing import TimingResult, device_sync
from utils.serving.inference import kv_spec as spec

MODEL = "llama-tiny"  # the serving exercise's model on every device: its cost is the scheduler's steps
BLOCK_SIZE = 4  # tokens per block: small, so that requests of tens of tokens cross several blocks
MAX_BATCH = 8  # requests in one step at most


class ScheduleError(ValueError):
    """A schedule the engine cannot run; the message says which request and what to fix."""


class Request(NamedTuple):
    rid: int
    arrival_step: int
    prompt_len: int
    output_len: int


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_size)``, 0 for none."""
    validate.positive_int("block_size", block_size)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative integer, got {tokens!r}")
    return -(-tokens // block_size)


def final_len(r: Request) -> int:
    """Tokens in a request's cache when it finishes: its prompt and all but its last token."""
    return r.prompt_len + r.output_len - 1


def make_trace(n_requests: int, seed: int, *, prompt_lens: tuple[int, int] = (4, 24),
               output_lens: tuple[int, int] = (1, 24), per_step: float = 2.0) -> list[Request]:
    """``n_requests`` requests, arriving ``per_step`` a step on average (``random.Random(seed)``):
    prompt and output lengths uniform in the closed ranges; mixed output lengths are where
    iteration-level scheduling pays."""
    validate.positive_int("n_requests", n_requests)
    validate.positive("per_step", per_step)
    rng, out, t = random.Random(seed), [], 0.0
    for rid in range(n_requests):
        out.append(Request(rid, int(t), rng.randint(*prompt_lens), rng.randint(*output_lens)))
        t += rng.expovariate(per_step)
    return out


def kv_spec(model: Any):
    """The model's KV geometry (``utils.kv.kvcache``), in its dtype."""
    return spec(model)


def pool_blocks(model: Any, kv_memory_bytes: int, block_size: int = BLOCK_SIZE) -> int:
    """Blocks in ``kv_memory_bytes`` of KV memory, by vLLM's arithmetic (``utils.kv.vllm_kv``)."""
    return vllm_num_blocks(int(kv_memory_bytes), kv_spec(model), block_size=block_size)


class PagedEngine:
    """A paged KV pool of ``num_blocks`` blocks for ``model`` and the requests of ``trace``.

    ``model=None`` runs the bookkeeping and the checks without a model (every token is 0):
    the grader checks a scheduler on many traces that way. ``kv_spec`` is then needed for the
    block arithmetic."""

    def __init__(self, model: Any, trace: list[Request], *, num_blocks: int, block_size: int = BLOCK_SIZE,
                 max_batch: int = MAX_BATCH, spec: Any = None):
        validate.positive_int("num_blocks", num_blocks, ScheduleError)
        validate.positive_int("block_size", block_size, ScheduleError)
        validate.positive_int("max_batch", max_batch, ScheduleError)
        self.trace = [Request(*r) for r in trace]
        if sorted(r.rid for r in self.trace) != list(range(len(self.trace))):
            raise ScheduleError("the trace's request ids must be 0 .. n-1, each once")
        self.model, self.num_blocks, self.block_size, self.max_batch = model, num_blocks, block_size, max_batch
        self.spec = spec if spec is not None else kv_spec(model)
        self.now = 0
        self.generated = {r.rid: 0 for r in self.trace}
        self.tables: dict[int, list[int]] = {}  # running requests' block tables, as of the last step
        self.log: list[dict] = []
        self._by_id = {r.rid: r for r in self.trace}
        self._tokens = {r.rid: [] for r in self.trace}
        # every busy step makes a token, so a schedule that finishes takes at most this many steps
        self.max_steps = max(r.arrival_step for r in self.trace) + sum(r.output_len for r in self.trace) + 1
        if model is not None:
            self._setup_model()

    # -- the scheduler's view ------------------------------------------------------------------

    def request(self, rid: int) -> Request:
        return self._by_id[rid]

    def finished(self, rid: int) -> bool:
        return self.generated[rid] == self._by_id[rid].output_len

    def tokens(self, rid: int) -> list[int]:
        """The token ids generated for request ``rid`` so far."""
        return list(self._tokens[rid])

    def blocks_needed(self, tokens: int) -> int:
        """Blocks one request of ``tokens`` cached tokens holds (vLLM's full-attention count)."""
        return vllm_blocks_per_request(self.spec, tokens, block_size=self.block_size) if tokens else 0

    def _tick(self) -> None:
        if self.now >= self.max_steps:
            raise ScheduleError(f"step {self.now}: more steps than this trace can need ({self.max_steps}, one request "
                                "at a time): the scheduler does not finish")

    def wait(self) -> None:
        """A step with nothing to run (nothing is running): the clock moves on."""
        self._tick()
        if self.tables:
            raise ScheduleError(f"wait() with requests {sorted(self.tables)} running: run them with step()")
        self.log.append({"step": self.now, "new": [], "batch": [], "finished": [], "blocks": 0, "ms": 0.0})
        self.now += 1

    def step(self, tables: dict[int, list[int]]) -> list[int]:
        """Run one step: prefill the requests new in ``tables`` (``{rid: block ids}``), decode one
        token for the others. Returns the ids of the requests that finished in this step."""
        self._tick()
        new = self._check(tables)

        dev = None if self.model is None else self._device
        device_sync(dev)
        t0 = time.perf_counter()
        out = self._run(new, tables)
        device_sync(dev)
        ms = (time.perf_counter() - t0) * 1e3
        done = []
        for rid, tok in out.items():
            self.generated[rid] += 1
            self._tokens[rid].append(tok)
            if self.finished(rid):
                done.append(rid)
        self.tables = {rid: list(t) for rid, t in tables.items() if rid not in done}
        self.log.append({"step": self.now, "new": sorted(new), "batch": sorted(tables), "finished": sorted(done),
                         "blocks": sum(len(t) for t in tables.values()), "ms": ms})
        self.now += 1
        return sorted(done)

    # -- the checks ----------------------------------------------------------------------------

    def _check(self, tables: Any) -> list[int]:
        if not isinstance(tables, dict) or not tables:
            raise ScheduleError(f"step() takes a non-empty dict {{request id: [block ids]}}, got {tables!r:.80}")
        if len(tables) > self.max_batch:
            raise ScheduleError(f"step {self.now}: {len(tables)} requests in one step, more than max_batch = {self.max_batch}")
        left_out = sorted(set(self.tables) - set(tables))
        if left_out:
            raise ScheduleError(f"step {self.now}: request {left_out[0]} is running and not finished: it must be in "
                                "every step until it finishes (no preemption here)")
        seen: dict[int, int] = {}
        new = []
        for rid, table in tables.items():
            if rid not in self._by_id:
                raise ScheduleError(f"step {self.now}: no request {rid!r} in the trace")
            r = self._by_id[rid]
            if self.finished(rid):
                raise ScheduleError(f"step {self.now}: request {rid} already has its {r.output_len} tokens")
            if r.arrival_step > self.now:
                raise ScheduleError(f"step {self.now}: request {rid} arrives at step {r.arrival_step}, not before")
            if not isinstance(table, list | tuple) or any(isinstance(b, bool) or not isinstance(b, int) for b in table):
                raise ScheduleError(f"step {self.now}: request {rid}'s block table must be a list of int block ids")
            for b in table:
                if not 0 <= b < self.num_blocks:
                    raise ScheduleError(f"step {self.now}: block {b} of request {rid} is not in the pool (0 .. "
                                        f"{self.num_blocks - 1})")
                if b in seen:
                    raise ScheduleError(f"step {self.now}: block {b} is in the tables of requests {seen[b]} and {rid}")
                seen[b] = rid
            length = r.prompt_len + self.generated[rid]  # tokens cached after this step
            want = self.blocks_needed(length)
            if len(table) != want:
                raise ScheduleError(f"step {self.now}: request {rid} holds {len(table)} blocks; after this step it "
                                    f"caches {length} tokens, which take ceil({length}/{self.block_size}) = {want}")
            before = self.tables.get(rid)
            if before is None:
                new.append(rid)
            elif list(table[:len(before)]) != before:
                raise ScheduleError(f"step {self.now}: request {rid}'s blocks {before} changed to {list(table)}: a "
                                    "block holds its cache, keep it until the request finishes")
        if new:
            self._check_admission(tables, new)
        return new

    def _check_admission(self, tables: dict, new: list[int]) -> None:
        """Admitted requests must be able to finish: the blocks every request in the step will
        still need, on top of what the step holds, fit in the pool (no preemption here)."""
        owed = sum(self.blocks_needed(final_len(self._by_id[rid])) - len(t) for rid, t in tables.items())
        held = sum(len(t) for t in tables.values())
        if held + owed > self.num_blocks:
            raise ScheduleError(f"step {self.now}: admitting request(s) {sorted(new)} leaves too few blocks: the "
                                f"running requests hold {held} and will need {owed} more to finish, "
                                f"{held + owed} > {self.num_blocks} in the pool")

    # -- the model -----------------------------------------------------------------------------

    def _setup_model(self) -> None:
        import torch

        p = next(self.model.parameters())
        self._device, s = p.device, self.spec
        shape = (s.num_layers, self.num_blocks * self.block_size, s.num_kv_heads, s.head_dim)
        self._k = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self._v = torch.zeros(shape, dtype=p.dtype, device=p.device)
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        vocab = self.model.config.vocab_size
        self._prompts = {r.rid: torch.randint(1, vocab, (r.prompt_len,), generator=torch.Generator().manual_seed(r.rid))
                         for r in self.trace}

    def _slots(self, table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [table[i // bs] * bs + i % bs for i in range(start, end)]

    def _run(self, new: list[int], tables: dict) -> dict[int, int]:
        if self.model is None:
            return {rid: 0 for rid in tables}
        import torch

        with torch.inference_mode():
            out = {rid: self._prefill(rid, tables[rid]) for rid in new}
            old = [rid for rid in tables if rid not in out]
            if old:
                out.update(self._decode(old, tables))
        return out

    def _write(self, cache: Any, slots: list[int], sl: slice) -> None:
        import torch

        idx = torch.tensor(slots, device=self._device)
        for layer, lay in enumerate(cache.layers):  # keys [batch, kv heads, tokens, head dim]
            self._k[layer, idx] = lay.keys[..., sl, :].permute(0, 2, 1, 3).reshape(len(slots), *self._k.shape[2:])
            self._v[layer, idx] = lay.values[..., sl, :].permute(0, 2, 1, 3).reshape(len(slots), *self._v.shape[2:])

    def _prefill(self, rid: int, table: list[int]) -> int:
        from transformers import DynamicCache

        ids = self._prompts[rid].to(self._device)[None]
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: cache}).logits
        self._write(cache, self._slots(table, 0, ids.shape[1]), slice(None))
        return int(logits[0, -1].argmax())

    def _decode(self, rids: list[int], tables: dict) -> dict[int, int]:
        """One token for each of ``rids``: their caches gathered from the pool into a padded
        batch (padding masked out), one forward, each new key and value written to its block."""
        import torch
        from transformers import DynamicCache

        lens = [self._by_id[r].prompt_len + self.generated[r] - 1 for r in rids]  # cached before this step
        longest = max(lens)
        idx = torch.zeros(len(rids), longest, dtype=torch.long)
        mask = torch.zeros(len(rids), longest + 1, dtype=torch.long)
        for i, (rid, n) in enumerate(zip(rids, lens, strict=True)):
            idx[i, :n] = torch.tensor(self._slots(tables[rid], 0, n))
            mask[i, :n] = 1
        mask[:, -1] = 1
        idx, mask = idx.to(self._device), mask.to(self._device)
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.spec.num_layers):
            cache.update(self._k[layer, idx].transpose(1, 2), self._v[layer, idx].transpose(1, 2), layer)
        last = torch.tensor([self._tokens[r][-1] for r in rids], device=self._device)[:, None]
        pos = torch.tensor(lens, device=self._device)[:, None]
        logits = self.model(input_ids=last, position_ids=pos, attention_mask=mask, use_cache=True,
                            **{self._cache_kw: cache}).logits
        for i, (rid, n) in enumerate(zip(rids, lens, strict=True)):
            self._write(_Row(cache, i), self._slots(tables[rid], n, n + 1), slice(-1, None))
        return {rid: int(t) for rid, t in zip(rids, logits[:, -1].argmax(-1).tolist(), strict=True)}

    # -- results -------------------------------------------------------------------------------

    def result(self) -> dict:
        """What the run did: tokens, steps, busy time, latency per request (steps and ms of the
        steps it lived through, arrival step to the step of its last token), peak blocks."""
        unfinished = [r.rid for r in self.trace if not self.finished(r.rid)]
        if unfinished:
            raise ScheduleError(f"requests {unfinished[:5]} did not get all their tokens (the run stopped early)")
        end = {rid: e["step"] for e in self.log for rid in e["finished"]}
        ms_at = [0.0]
        for e in self.log:
            ms_at.append(ms_at[-1] + e["ms"])
        lat_steps = [end[r.rid] - r.arrival_step + 1 for r in self.trace]
        lat_ms = [ms_at[end[r.rid] + 1] - ms_at[min(r.arrival_step, len(self.log))] for r in self.trace]
        busy_ms = ms_at[-1]
        tokens = sum(r.output_len for r in self.trace)
        return {"requests": len(self.trace), "tokens": tokens, "steps": len(self.log),
                "busy_steps": sum(1 for e in self.log if e["batch"]), "busy_ms": busy_ms,
                "mean_latency_steps": sum(lat_steps) / len(lat_steps), "mean_latency_ms": sum(lat_ms) / len(lat_ms),
                "peak_blocks": max((e["blocks"] for e in self.log), default=0), "num_blocks": self.num_blocks,
                "admitted": {e["step"]: e["new"] for e in self.log if e["new"]}}


class _Row:
    """Row ``i`` of a batched cache, seen as a batch of one (for :meth:`PagedEngine._write`)."""

    def __init__(self, cache: Any, i: int):
        self.layers = [_RowLayer(lay.keys[i:i + 1], lay.values[i:i + 1]) for lay in cache.layers]


class _RowLayer(NamedTuple):
    keys: Any
    values: Any


# -- the baseline and the timing -------------------------------------------------------------------

def static_batching(engine: PagedEngine) -> None:
    """Static batching on the same pool: wait until the next ``max_batch`` requests (fewer if the
    pool cannot finish that many at once, or at the end of the trace) have arrived, run them until
    the longest has all its tokens, and only then take the next batch. Blocks still come on demand."""
    queue = sorted(engine.trace, key=lambda r: (r.arrival_step, r.rid))
    free = list(range(engine.num_blocks))
    while queue:
        batch, need = [], 0
        for r in queue[:engine.max_batch]:
            n = engine.blocks_needed(final_len(r))
            if need + n > engine.num_blocks:
                break
            batch.append(r)
            need += n
        if not batch:
            raise ScheduleError(f"request {queue[0].rid} needs more blocks than the pool's {engine.num_blocks}")
        queue = queue[len(batch):]
        while batch[-1].arrival_step > engine.now:
            engine.wait()
        tables = {r.rid: [] for r in batch}
        while tables:
            for rid, t in tables.items():
                r = engine.request(rid)
                while len(t) < engine.blocks_needed(r.prompt_len + engine.generated[rid]):
                    t.append(free.pop())
            for rid in engine.step(tables):
                free.extend(tables.pop(rid))


def timed_runs(scheduler: Callable[[PagedEngine], Any], make_engine: Callable[[], PagedEngine],
               repeats: int = 5) -> dict:
    """``scheduler`` run ``repeats`` times, each on a fresh engine from ``make_engine``, timed
    whole with ``time.perf_counter`` (the device synchronised at both ends): the median run's
    tokens/s and mean latency, and the timing of all runs (``utils.measure.timing.TimingResult``)."""
    validate.positive_int("repeats", repeats)
    runs = []
    for _ in range(repeats):
        engine = make_engine()
        device_sync(getattr(engine, "_device", None))
        t0 = time.perf_counter()
        scheduler(engine)
        device_sync(getattr(engine, "_device", None))
        runs.append(((time.perf_counter() - t0) * 1e3, engine.result()))
    t = TimingResult.from_times([ms for ms, _ in runs], "perf_counter+sync")
    ms, res = sorted(runs, key=lambda x: x[0])[len(runs) // 2]
    return {**res, "wall_ms": ms, "time": t, "tokens_per_s": res["tokens"] / (t.median_ms / 1e3),
            "mean_latency_ms": sorted(r["mean_latency_ms"] for _, r in runs)[len(runs) // 2]}

