"""Lab 03's harness: the learner's allocator and scheduler, run in a sandbox on the grader's traces.

Runs **inside** a sandbox (``grader/sandbox.py``) that holds the learner's definitions alone, so
everything it returns is a claim the judge checks: the traces come from the grader (drawn after
the kernel has gone, ``judges.batching_params``), and the judge replays every schedule returned
here on the course's own engine in its own process (``judges.batching``).

:func:`schedules` returns, for each trace, what the learner's ``continuous_batching`` handed the
engine at every step (the block tables, or a wait), the ids each step finished, and what the
learner's ``BlockAllocator`` gave out and took back between the steps; plus a probe of the
allocator on its own. Plain data only.
"""
from __future__ import annotations

from typing import Any

from utils.kv.kvcache import KVSpec
from utils.serving.paged_batching import PagedEngine, Request

MAX_LOG = 20_000  # engine calls recorded per trace: a schedule that loops is cut here (the engine stops it sooner)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


class _Recorder(PagedEngine):
    """The course's engine without a model, writing down every call the scheduler makes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.calls: list[dict] = []

    def step(self, tables):
        entry = {"tables": [[rid, list(t)] for rid, t in tables.items()] if isinstance(tables, dict) else None,
                 "finished": None, "allocated": [], "freed": []}
        if len(self.calls) < MAX_LOG:
            self.calls.append(entry)
        done = super().step(tables)
        entry["finished"] = list(done)
        return done

    def wait(self):
        entry = {"wait": True, "allocated": [], "freed": []}
        if len(self.calls) < MAX_LOG:
            self.calls.append(entry)
        return super().wait()


class _Watched:
    """The learner's allocator, with its allocations and frees written down between engine calls."""

    def __init__(self, inner: Any, engine: _Recorder):
        self._inner, self._engine = inner, engine
        self.before: dict = {"allocated": [], "freed": []}  # calls before the first engine call

    def _bucket(self) -> dict:
        return self._engine.calls[-1] if self._engine.calls else self.before

    def num_free(self):
        return self._inner.num_free()

    def allocate(self):
        block = self._inner.allocate()
        self._bucket()["allocated"].append(block if type(block) is int else repr(block)[:40])
        return block

    def free(self, block_ids):
        ids = list(block_ids)
        self._bucket()["freed"].extend(b if type(b) is int else repr(b)[:40] for b in ids)
        return self._inner.free(ids)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_inner"], name)


def probe(allocator_class: Any, n: int) -> dict:
    """``BlockAllocator(n)`` on its own: free count, ``n`` allocations, one more, two frees, two more.
    ``error`` says which of these raised."""
    out: dict = {"n": n}
    stage = f"BlockAllocator({n})"
    try:
        a = allocator_class(n)
        stage = "num_free() before any allocate()"
        out["free0"] = a.num_free()
        stage = f"allocate() of {n} blocks"
        out["got"] = [a.allocate() for _ in range(n)]
        try:
            extra = a.allocate()
        except Exception as exc:  # noqa: BLE001 - any exception is a refusal
            out["extra"] = {"raised": type(exc).__name__}
        else:
            out["extra"] = {"returned": repr(extra)[:40]}
        back = [out["got"][i] for i in sorted({0, n // 2, n - 1})][:2]
        stage = "free()"
        a.free(list(back))
        out["freed"], out["free_after"] = back, a.num_free()
        stage = f"allocate() after free() of {len(back)} blocks"
        out["again"] = [a.allocate() for _ in range(len(back))]
    except Exception as exc:  # noqa: BLE001 - the learner's error, in one line
        out["error"] = f"{stage} raised {_line(exc)}"
    return out


def run_trace(allocator_class: Any, scheduler: Any, trace: list, sizes: dict, spec: dict) -> dict:
    """The learner's scheduler on one trace: every engine call, the allocator's calls between them,
    how it ended (``error``) and the allocator's free count at the end."""
    engine = _Recorder(None, [Request(*r) for r in trace], spec=KVSpec(**spec), **sizes)
    out: dict = {"error": None, "num_free_end": None}
    watched = None
    try:
        watched = _Watched(allocator_class(sizes["num_blocks"]), engine)
        scheduler(engine, watched)
    except Exception as exc:  # noqa: BLE001 - the engine's refusal or the learner's error, in one line
        out["error"] = f"at step {engine.now}: {_line(exc)}"
    if watched is not None:
        try:
            out["num_free_end"] = watched.num_free()
        except Exception as exc:  # noqa: BLE001
            out["error"] = out["error"] or f"num_free() raised {_line(exc)}"
    out["before"] = watched.before if watched is not None else {"allocated": [], "freed": []}
    out["calls"] = engine.calls
    out["cut"] = len(engine.calls) >= MAX_LOG
    return out


def schedules(ns: dict, params: dict, clock: Any) -> dict:
    """The harness (``Check.harness``): the allocator probe and one schedule per trace of ``params``."""
    alloc, sched = ns.get("BlockAllocator"), ns.get("continuous_batching")
    missing = [n for n, v in (("BlockAllocator", alloc), ("continuous_batching", sched)) if not callable(v)]
    if missing:
        return {"missing": missing}
    return {"probe": probe(alloc, int(params["probe"])),
            "runs": [run_trace(alloc, sched, t["trace"], t["sizes"], params["spec"]) for t in params["traces"]]}
