"""Lab 04's references: the grader's own engine and load runs on this machine, or a learner's record.

:func:`measure` (live) starts, in the grader's process after the notebook's kernel and every engine
it started are gone, the same engine on the same model directory the notebook's locked ``engine``
cell starts (``utils.serving.serve``, ``utils.serving.serve.default_engine()``: vLLM where it runs, else
``transformers serve``), warms it with one burst of requests, and hands the judges a
:class:`Reference` that runs loads on it. The engine the kernel started is never used: the notebook
could have replaced it, or the directory it serves.

What the grader runs is the learner's workload at the learner's operating rate, which ``measure``
does not see (it gets the check's needs, not its answers). So :meth:`Reference.operating` takes
the runs when a judge first asks for them (the workload's fields, validated by the judge first,
pointed at the grader's engine), :data:`RERUNS` of them, and keeps them for the other cells of
this try; a try after a miss measures afresh (a new :class:`Reference`). The engine itself is kept
for the grading process (it is not a measurement): a retry reruns the loads, not the start.
:func:`close` stops it (tests; a grading worker stops it when it exits).

:func:`from_record` (provisional) has no engine: the judges' comparisons become notes, and what a
record is checked against is the datasheet (no request faster than reading the model's weights
once per output token at the card's bandwidth; the weights' bytes counted here from the lab's model).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from utils.model.models import preset_config
from utils.serving import loadgen, serve

RERUNS = 3  # the grader's runs at the operating rate, per comparison: the band is 3x their spread
SYNC_REQUESTS = 4  # the grader's requests one at a time, where their latency is the engine's own speed
GPU_WEIGHT_BYTES = 2  # the lab's engines serve bf16 or fp16 on a GPU (utils.model.model_dir.default_dtype)
_ENGINES: dict = {}  # (engine, device, preset) -> the running Server, or the error its start raised
_WARM: set = set()  # engines that have had their warm-up burst
_PARAMS: dict = {}  # preset -> parameter count


@dataclasses.dataclass(frozen=True)
class Operating:
    """The grader's runs of one workload at one rate: goodput (req/s) and p95 E2E latency (ms, NaN
    where no request finished) of each."""

    goodput: list
    p95: list


@dataclasses.dataclass
class Reference:
    """What the judges compare against: the context, the grader's engine (live) and the runs taken on
    it in this try (``cache``), the slowdown the judge measured on a loaded machine, and from a
    record, the weights' bytes of the lab's model."""

    ctx: Any
    live: bool = True
    slowdown: float = 1.0
    server: Any = None
    cache: dict = dataclasses.field(default_factory=dict)
    weight_bytes: int | None = None

    @property
    def engine_label(self) -> str | None:
        """The grader's engine's ``Server.label`` (the name the notebook's candidates use for it)."""
        return self.server.label if self.server is not None else None

    def _workload(self, desc: dict, **change) -> loadgen.Workload:
        """The learner's workload (its decoded fields) pointed at the grader's engine."""
        keep = ("num_requests", "input_len", "output_len", "endpoint", "arrival", "burstiness", "stream", "seed",
                "timeout_s", "max_duration_s", "slo_ms")
        fields = {k: desc[k] for k in keep}
        fields.update(self.server.workload_fields())  # base_url, model, tokenizer, and what fixes the output length
        fields.update(probe=False, **change)
        return loadgen.Workload(**fields)

    def _warm(self, desc: dict) -> None:
        if id(self.server) not in _WARM:
            _run(self._workload(desc, request_rate=math.inf), "grader warm-up")
            _WARM.add(id(self.server))

    def operating(self, desc: dict, rate: float) -> Operating:
        """:data:`RERUNS` runs of the workload ``desc`` at ``rate`` on the grader's engine, taken when
        first asked in this try."""
        key = ("operating", _key(desc), float(rate))
        if key not in self.cache:
            self._warm(desc)
            runs = [_run(self._workload(desc, request_rate=float(rate)), "grader") for _ in range(RERUNS)]
            self.cache[key] = Operating(
                [float((r.get("goodput") or {}).get("request_goodput") or 0.0) for r in runs],
                [math.nan if r["e2el_ms"]["p95"] is None else float(r["e2el_ms"]["p95"]) for r in runs])
        return self.cache[key]

    def engine_e2el_ms(self, desc: dict) -> float:
        """The engine's E2E latency p50 (ms) one request at a time, for the workload's prompt and
        output lengths: no queue, so its own speed (NaN if none finished). E2E latency, not TPOT:
        an engine that falls behind its stream sends a request's tokens in one chunk, and its TPOT
        then reads 0 (seen with vLLM's CPU build on a loaded machine); a request's end is not moved."""
        key = ("sync", _key(desc))
        if key not in self.cache:
            self._warm(desc)
            r = _run(self._workload(desc, concurrency=1, request_rate=math.inf, num_requests=SYNC_REQUESTS),
                     "grader, synchronous")
            p50 = r["e2el_ms"]["p50"]
            self.cache[key] = math.nan if p50 is None else float(p50)
        return self.cache[key]


def _key(desc: dict) -> str:
    return json.dumps({k: desc[k] for k in sorted(desc)}, sort_keys=True, default=str)


def _run(w: loadgen.Workload, label: str) -> dict:
    with contextlib.redirect_stderr(io.StringIO()):
        return loadgen.run(w, progress=False, label=label)


def engine(ctx) -> serve.Server:
    """The grader's engine for ``ctx``: the notebook's engine on the notebook's model directory,
    started once per grading process (:class:`serve.ServeError` if it cannot start)."""
    name = serve.default_engine()
    key = (name, ctx.device, ctx.sizes.model)
    held = _ENGINES.get(key)
    if isinstance(held, serve.ServeError):
        raise held
    if held is not None and held.alive():
        return held
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            model_dir = serve.build_model_dir(ctx.sizes.model, serve.default_dtype(ctx.device, name), device=ctx.device)
        server = serve.start(model_dir, engine=name, device=ctx.device,
                             kv_cache_tokens=ctx.sizes.num_requests * ctx.sizes.max_len,
                             timeout_s=ctx.sizes.start_timeout_s)
    except serve.ServeError as exc:
        _ENGINES[key] = serve.ServeError(f"the grader's own engine could not start: {exc}")
        raise _ENGINES[key] from None
    _ENGINES[key] = server
    return server


def close() -> None:
    """Stop the grader's engines (a grading process stops them at exit anyway)."""
    for key, held in list(_ENGINES.items()):
        if isinstance(held, serve.Server):
            held.stop()
            _WARM.discard(id(held))
        del _ENGINES[key]


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's reference for a check that ``needs`` ``"engine"``: the grader's engine, started
    now if it is not up; its load runs are taken when a judge asks (:meth:`Reference.operating`,
    :meth:`Reference.engine_e2el_ms`), into ``cache``."""
    server = engine(ctx) if "engine" in needs else None
    return Reference(ctx, True, slowdown, server, cache)


def weight_bytes(preset: str, nbytes: int = GPU_WEIGHT_BYTES) -> int:
    """The bytes of ``preset``'s weights at ``nbytes`` per parameter (counted on the meta device:
    no memory, no download)."""
    if preset not in _PARAMS:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(preset_config(preset))
        _PARAMS[preset] = sum(p.numel() for p in model.parameters())
    return _PARAMS[preset] * nbytes


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own (provisional): the record's card and the
    lab's model are all there is to check it against."""
    return Reference(ctx, live=False, weight_bytes=weight_bytes(ctx.sizes.model))
