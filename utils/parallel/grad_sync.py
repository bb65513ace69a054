"""Gradient synchronization written by hand, three ways, and the rules that judge a run of it.

Data parallelism averages every gradient over the ranks after each backward pass. Lab 02 has
the learner write that averaging three ways and time each against PyTorch's
``DistributedDataParallel`` on the same model (``benchmarks/grad_sync.py``,
:mod:`utils.parallel.grad_sync_harness`):

- ``each``: one ``all_reduce`` per parameter after the backward;
- ``bucketed``: the gradients packed into flat buckets of at most ``bucket_mb`` MB (10^6 bytes),
  one ``all_reduce`` per bucket, after the backward (fewer, larger messages: the latency of
  each call is paid fewer times, as DDP's 25 MB buckets do; PyTorch's DDP design note,
  https://pytorch.org/docs/stable/notes/ddp.html);
- ``overlapped``: an asynchronous ``all_reduce`` started from a gradient hook
  (``Tensor.register_post_accumulate_grad_hook``) as soon as a parameter's gradient is complete,
  while the backward still computes earlier layers; ``finish()`` waits for them.

The learner's functions live in a notebook cell. :func:`write_answer_module` writes the cell's
imports and definitions to a file that every launched rank imports, so the notebook and the
grader (``grader/labs/multi_gpu/``) run the same code in processes of their own.

Also here: the per-tier sizes of the run, the checks of a run's JSON (each version is what it
claims to be, its gradients equal DDP's), and the rule of the explanation cell
(:func:`gap_cause`). Pure functions; torch is imported only by the harness.
"""
from __future__ import annotations

import ast
import linecache
import math
from pathlib import Path
from typing import Any, NamedTuple

LEARNER_VERSIONS = ("each", "bucketed", "overlapped")
VERSIONS = ("none", "ddp") + LEARNER_VERSIONS  # "none": no synchronization, the compute-only step
NAMES = {"each": "sync_each", "bucketed": "sync_bucketed", "overlapped": "OverlappedSync"}
# |averaged gradient - DDP's| over max |DDP's| of the same parameter: fp32 sums in another order
# differ in the last bits (1e-7 relative); on a GPU, atomics in the embedding's backward add about
# 1e-6. A wrong average is off by tens of percent (a sum not divided: 100%).
GRAD_RTOL = 1e-3
NEAR_DDP = 0.05  # a per-parameter step within 5% of DDP's has no gap worth explaining
GAP_CAUSES = ("as_fast_as_ddp", "exposed_communication", "other_overhead")


class SyncSizes(NamedTuple):
    preset: str  # utils.model.models preset, fp32
    batch: int  # sequences per rank per step
    seq: int
    steps: int  # timed steps per version
    warmup: int  # untimed steps per version (gradients checked there too)
    bucket_mb: float  # the notebook's bucket (DDP's bucket_cap_mb too)
    check_bucket_mb: float  # the grader's other bucket, a case the notebook does not run


# cpu: the smoke model (28 tensors, 3.9 MB of fp32 gradients, the tied embedding 2.1 MB of it);
# GPUs: GPT-2 small (148 tensors, 498 MB), at a batch that leaves room for five copies of the model
SIZES = {
    "cpu": SyncSizes("gpt2-tiny", 2, 64, 6, 1, 0.5, 0.2),
    "t4": SyncSizes("gpt2-small", 4, 512, 10, 3, 25.0, 10.0),
    "a100": SyncSizes("gpt2-small", 4, 1024, 10, 3, 25.0, 10.0),
    "h100": SyncSizes("gpt2-small", 8, 1024, 10, 3, 25.0, 10.0),
}


def sizes(tier: str) -> SyncSizes:
    if tier not in SIZES:
        raise ValueError(f"unknown tier {tier!r}; use one of {', '.join(SIZES)}")
    return SIZES[tier]


# -- the learner's cell as a module ----------------------------------------------------------------

def _code_of(obj: Any):
    """The code objects that define ``obj``: a function's, or a class's methods'."""
    if hasattr(obj, "__code__"):
        return [obj.__code__]
    if isinstance(obj, type):
        return [v.__code__ for v in vars(obj).values() if hasattr(v, "__code__")]
    return []


def _keep(node: ast.stmt) -> bool:
    """Imports, definitions and constants: what a module needs. Anything else in the cell (a print,
    a line that reads another cell's results) stays in the notebook."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        try:
            ast.literal_eval(node.value)
        except ValueError:
            return False
        return True
    return False


def answer_source(*objects: Any) -> str:
    """The source of the cells (or files) that define ``objects``, cut to their imports,
    definitions and constants, in order. IPython keeps each cell's source in ``linecache`` under
    the file name its code objects carry, which is how a function defined in a notebook is found."""
    files: list[str] = []
    for obj in objects:
        codes = _code_of(obj)
        if not codes:
            raise ValueError(f"{obj!r:.60} is not a function or a class defined in the notebook")
        for code in codes:
            if code.co_filename not in files:
                files.append(code.co_filename)
    parts = []
    for name in files:
        text = "".join(linecache.getlines(name))
        if not text:
            raise ValueError(f"the source of {name} is not available: define the functions in a notebook cell")
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            raise ValueError(f"the cell defining the sync functions does not parse: {exc}") from None
        parts += [seg for node in tree.body if _keep(node) and (seg := ast.get_source_segment(text, node))]
    out = []
    for p in parts:  # imports one to a line, the rest two blank lines apart
        glue = "\n" if out and p.startswith(("import ", "from ")) and out[-1].startswith(("import ", "from ")) else "\n\n\n"
        out += [glue, p] if out else [p]
    return "".join(out) + "\n"


def write_answer_module(path: str | Path, sync_each: Any, sync_bucketed: Any, overlapped: Any) -> Path:
    """Write the three versions' defining code to ``path`` (a ``.py`` file the ranks import) and
    check it names them as the harness calls them."""
    path = Path(path)
    for want, obj in zip(NAMES.values(), (sync_each, sync_bucketed, overlapped), strict=True):
        if getattr(obj, "__name__", None) != want:
            raise ValueError(f"pass {want} itself (got {getattr(obj, '__name__', obj)!r:.60})")
    src = answer_source(sync_each, sync_bucketed, overlapped)
    defined = {n.name for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    missing = [n for n in NAMES.values() if n not in defined]
    if missing:
        raise ValueError(f"the cell does not define {', '.join(missing)} at its top level")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# The gradient synchronization of a lab 02 notebook, written by utils/parallel/grad_sync.py.\n" + src)
    return path


# -- what a run's JSON must show -------------------------------------------------------------------

def next_fit_bound(total_bytes: float, bucket_bytes: float) -> int:
    """Most buckets a one-pass packing may use: two neighbouring buckets of next-fit packing hold
    more than one bucket's bytes together (else they would be one), so at most
    ``2 * total / bucket + 1`` buckets, twice the fewest possible."""
    return int(2 * total_bytes / bucket_bytes) + 1


def version_problems(run: dict) -> list[str]:
    """Why each version is not what it claims (empty: all are): the gradients differ from DDP's,
    or its all-reduce calls are not its kind (counted per step by the harness)."""
    out = []
    grads, calls = run.get("grads") or {}, run.get("calls") or {}
    total, n_tensors = run["grad_bytes"], run["grad_tensors"]
    for v in [k for k in grads if k not in ("none", "ddp")]:
        g = grads[v]
        if not g.get("match"):
            out.append(f"{v}: gradients differ from DDP's: {g.get('worst_param')} off by {g.get('worst_rel_err', math.inf):.3g} "
                       f"of its largest value on rank {g.get('rank')} (at most {GRAD_RTOL:g} allowed)")
    for v, c in calls.items():
        bucket = run["config"]["check_bucket_mb" if v == "bucketed_check" else "bucket_mb"] * 1e6
        if c.get("bytes") != total and not any(v in p for p in out):
            out.append(f"{v}: all-reduced {c.get('bytes')} bytes a step, the gradients hold {total}")
        if v == "each" and (c.get("calls") != n_tensors or c.get("in_backward")):
            out.append(f"each: {c.get('calls')} all-reduce calls a step ({c.get('in_backward')} during the backward); "
                       f"one per parameter after the backward is {n_tensors}")
        if v.startswith("bucketed"):
            largest = max(bucket, run["largest_grad_bytes"])
            if c.get("max_call_bytes", 0) > largest or c.get("calls", 0) > next_fit_bound(total, bucket):
                out.append(f"{v}: {c.get('calls')} all-reduce calls a step, the largest {c.get('max_call_bytes')} bytes; "
                           f"buckets of at most {bucket:g} bytes need at most {next_fit_bound(total, bucket)} calls, "
                           f"none larger than {largest:g} bytes")
        if v == "overlapped" and not c.get("in_backward"):
            out.append("overlapped: no all-reduce started during the backward (start them from the gradient hooks, "
                       "with async_op=True)")
    return out


def vs_ddp(run: dict) -> dict:
    """Each learner version's speed as a fraction of DDP's: DDP's median step over its own."""
    t = {v: run["versions"][v]["median_ms"] for v in VERSIONS}
    return {v: t["ddp"] / t[v] for v in LEARNER_VERSIONS}


def exposed_share(run: dict, version: str) -> float:
    """The share of ``version``'s step that the synchronization adds to the compute-only step
    (``none``): ``1 - t_none / t_version``, at least 0 (the lab's exposed communication share)."""
    t = run["versions"]
    return max(0.0, 1.0 - t["none"]["median_ms"] / t[version]["median_ms"])


def gap_cause(t_each_ms: float, t_ddp_ms: float, t_none_ms: float) -> str:
    """Why the per-parameter version is slower than DDP, from three measured medians.

    Within :data:`NEAR_DDP` of DDP's step: ``as_fast_as_ddp``. Otherwise compare the share of the
    per-parameter step that DDP saves, ``s = 1 - t_ddp / t_each``, with the share the
    synchronization adds to the compute-only step, ``c = 1 - t_none / t_each``. If DDP hid all of
    its communication behind the backward and the rest were equal, ``t_ddp = t_none`` and
    ``s = c``: when ``c >= s / 2`` the gap is the exposed communication (many small calls, none
    overlapped), else something other than communication (``other_overhead``)."""
    if t_each_ms <= (1 + NEAR_DDP) * t_ddp_ms:
        return "as_fast_as_ddp"
    saved, comm = 1 - t_ddp_ms / t_each_ms, max(0.0, 1 - t_none_ms / t_each_ms)
    return "exposed_communication" if comm >= saved / 2 else "other_overhead"


def explanation(run: dict) -> dict:
    """The explanation cell's answer on a run: the fastest of the three versions, the share of the
    per-parameter step spent on exposed communication, its gap to DDP and the cause."""
    t = {v: run["versions"][v]["median_ms"] for v in VERSIONS}
    return {"fastest": min(LEARNER_VERSIONS, key=t.get), "each_comm_share": exposed_share(run, "each"),
            "each_vs_ddp": t["ddp"] / t["each"], "cause": gap_cause(t["each"], t["ddp"], t["none"])}
