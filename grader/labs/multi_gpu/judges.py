"""Lab 02's judges: each graded cell's answers against the rule, the grader's own runs or a record.

Each judge is pure (``grader/judging.py``): it reads decoded answers, the outputs of the learner's
code run by the grader in a sandbox, and the grader's reference (``reference.py``). The cells:

- ``test_memory``, ``test_busbw``, ``test_parallelism``: the learner's formula functions on cases
  drawn from the grading run's secret seed, in a sandbox where the course's implementations of
  those formulas are tripwires (``forbid``); the expected values are computed here.
- ``test_zero_memory``: the grader draws a stack of layers the notebook does not show, asks the
  learner's ``memory_per_gpu_gb`` (in a sandbox, the course's rule a tripwire) for its size, then runs
  its own DDP, ZeRO-1 and FSDP2 launch of it (``reference.zero_run``; only once the predictions are
  numbers); each rank's bytes must be met within the shard remainder
  ``utils.parallel.zero_memory.remainder_bytes`` allows. The kernel's ``ZERO`` is not read.
- ``test_allreduce``, ``test_scaling``, ``test_breaks``, ``test_explanation``: the runs the notebook
  launched (course code) are checked for being the asked-for configuration and consistent, then
  against the grader's own launches of the same code (bands from the grader's own spread); the
  explanation's categorical answers follow the notebook's rule on the learner's numbers, which must
  agree with the grader's runs. From a GPU record (no GPU here): consistency, the link and the
  datasheet only, provisional.
- ``test_grad_sync``, ``test_sync_speed``, ``test_sync_explanation``: the learner's three
  synchronizations run by the grader on several ranks (``harness.grad_sync``) with weights and
  batches drawn from a secret seed; every rank's gradients (as weighted sums) against the grader's
  own model's (``reference.sync_expected``), and each version's step timed from the grader's side.
  The kernel's ``SYNC`` is the learner's claim: it must be consistent, and its medians agree with the
  grader's timing.
- ``test_fused_kernel``, ``test_second_fusion``: the learner's Triton kernels on shapes and inputs
  drawn by the grader (``harness.fused_kernel``, ``harness.second_fusion``), outputs against PyTorch
  computed here; launches counted; on a GPU the speed timed from the grader's side against the
  grader's own timing of the unfused ops.
"""
from __future__ import annotations

import math
import random
import secrets
import statistics
import tempfile
from typing import Any

import torch

from grader.expect import Fail, Unusable, approx, band, cases, close, equal, in_band, not_above, spread, usable
from grader.judging import Check
from grader.labs.multi_gpu import harness, reference
from grader.labs.multi_gpu.sizes import BY_TIER
from utils.measure.flops import flops_per_token_from_config
from utils.model.model_shapes import LLAMA_70B
from utils.model.models import preset_config
from utils.parallel import grad_sync, launch, zero_memory
from utils.parallel.distributed import (
    algbw_gbs,
    busbw_gbs,
    memory_per_gpu,
    parallel_weight_bytes_per_gpu,
    parse_size_bytes,
)
from utils.parallel.scaling_breaks import NEAR_LINEAR, SCENARIOS
from utils.train.fused import INTERPRETED, bias_gelu_reference

STAGES = ("ddp", "zero1", "zero2", "zero3")
MEMORY_RULES = ("utils.parallel.distributed:memory_per_gpu",)
BUSBW_RULES = ("utils.parallel.distributed:algbw_gbs", "utils.parallel.distributed:busbw_gbs", "utils.parallel.distributed:bus_factor",
               "utils.parallel.distributed:allreduce_time_s", "utils.parallel.distributed:busbw_fraction_of_link", "utils.units:gb_per_s")
PARALLEL_RULES = ("utils.parallel.distributed:parallel_weight_bytes_per_gpu", "utils.parallel.distributed:pipeline_layers_per_stage",
                  "utils.parallel.distributed:tensor_parallel_weight_bytes")
# the course's bias + GELU: its unfused PyTorch version and its own Triton kernel (instructors' repository only)
FUSED_RULES = ("utils.train.fused:bias_gelu_reference", "utils.train.fused:compare_bias_gelu", "grader.fused_reference:bias_gelu",
               "grader.fused_reference:_bias_gelu_kernel")
# (weights, gradients, optimizer) bytes per parameter beside the defaults: mixed-precision Adam, fp32 Adam, fp32
# gradients beside bf16 weights, bf16 Adam state, an 8-bit optimizer
MEMORY_WIDTHS = ((2, 2, 12), (4, 4, 8), (2, 4, 12), (2, 2, 4), (1, 2, 6))
GPU_MEMORY_GB = 80  # the 70B exercise: 80 GB cards (H100/A100 80GB)
WEIGHT_SHARE = 0.8  # rule of thumb: weights may take 80% of the card, the rest is KV cache/activations/workspace
TP_DEGREES = (1, 2, 4, 8)  # tensor parallelism stays inside one 8-GPU node (NVLink)
REL = 1e-6  # numbers a JSON file carries through: float round trips only
# Per-device throughput at N devices over one device's: above 1 is noise at most under DDP (5% on a GPU; 20% for
# CPU processes, which share cores and caches with the notebook and the grader)
EFFICIENCY_CAP = {"gpu": 1.05, "cpu": 1.2}
SYNC_FLOOR = {"gpu": 0.35, "cpu": 1.5}  # relative band of a version's speed against DDP's, at least (the notebook's)
CHECK_STEPS = 2  # steps of the gradient check: two batches per rank, every version on each
PROJECTIONS = {"check": 2, "time": 1}  # weighted sums per parameter in a harness section
MIN_SPEEDUP = 1.3  # fused bias-GELU over the unfused ops, on a GPU (measured 3.47x on an H200)
MIN_SECOND_SPEEDUP = 1.0  # a fusion must not be slower than what it fuses
FUSED_TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}  # (rtol, atol)
GPU_SHAPE = (16384, 3072)  # batch 16 x 1024 tokens of GPT-2 small's MLP
FUSED_REPS, FUSED_CALLS = 5, 200  # timed sections of the kernels on a GPU, and launches in each
CHECKSUM_RTOL = 1e-2  # a timed section's weighted sum against the grader's, relative to the sum of |terms| (half dtypes)


# -- helpers ------------------------------------------------------------------------------------------

def _log_uniform(rng, lo: float, hi: float) -> float:
    return 10 ** rng.uniform(math.log10(lo), math.log10(hi))


def llama_params(cfg: dict = LLAMA_70B) -> int:
    """Parameters of a Llama shape, counted from its config (untied embeddings): the embeddings and
    the output layer, per layer attention (q and o: h x h; k and v: h x kv-heads x head dim), the
    gated MLP (three h x intermediate matrices) and two norms, and the final norm."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
    embed = cfg["vocab_size"] * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return embed + layers * per_layer + h


# -- 1. memory per GPU --------------------------------------------------------------------------------

def memory_cases(rng, ctx) -> list:
    """``(n_params, n_devices, stage[, weight_bytes, grad_bytes, optim_bytes])``: every stage at the
    default widths and at drawn ones, device counts from 1 to thousands, parameter counts from one
    to a trillion."""
    out = []
    for i in range(32):
        n = int(_log_uniform(rng, 1, 1e12))
        d = rng.choice([1, 2, 3, 4, 7, 8, 16, 64, 1000, rng.randint(2, 4096)])
        stage = STAGES[i % 4]
        if i % 8 < 2:
            out.append([n, d, stage])
        elif i % 8 < 6:
            out.append([n, d, stage, *rng.choice(MEMORY_WIDTHS)])
        else:
            out.append([n, d, stage, rng.randint(1, 16), rng.choice([1, 2, 4, 0.5]), rng.randint(0, 16)])
    return out


def _memory_want(case: list) -> float:
    n, d, stage, *w = case
    widths = dict(zip(("param_bytes", "grad_bytes", "optimizer_bytes_per_param"), w, strict=False))
    return memory_per_gpu(n, d, stage, **widths)["total_gb"]


def memory(a, ref):
    want = [_memory_want(c) for c in a.inputs["memory_per_gpu_gb"]]
    return [cases(a.calls["memory_per_gpu_gb"], want, "memory_per_gpu_gb",
                  "GB (1e9 bytes) of weights + gradients + optimizer state per GPU: DDP holds all three, ZeRO-1 "
                  "divides the optimizer state by n_devices, ZeRO-2 the gradients too, ZeRO-3 the weights too; "
                  "weight_bytes, grad_bytes and optim_bytes per parameter (default 2, 2, 12)", approx(1e-9))]


# -- 1b. the arithmetic against the grader's sharded run ----------------------------------------------

ZERO_WIDTHS = {"weights": 4, "grads": 4, "optimizer": 8}  # the sharded run is fp32 AdamW everywhere (utils.parallel.zero_memory)


def zero_params(ctx, a) -> dict:
    """Draw a stack of layers the notebook does not show and ask the harness for the learner's prediction of
    every measured stage at its size, this machine's rank count and the run's byte widths; the grader's own
    sharded launch of that stack is taken by the judge once the predictions are numbers."""
    layers = reference.draw_layers(random.Random(secrets.randbits(64)))
    world = _plan().nproc
    widths = [ZERO_WIDTHS[k] for k in ("weights", "grads", "optimizer")]
    a.inputs["zero_layers"] = layers
    a.inputs["zero_cases"] = [[zero_memory.n_params(layers), world, stage, *widths] for stage in zero_memory.STAGES]
    return {"cases": a.inputs["zero_cases"]}


def zero(a, ref):
    got, cases_ = a.harness, a.inputs["zero_cases"]
    if not isinstance(got, list) or len(got) != len(cases_):
        raise Fail("the grader could not run memory_per_gpu_gb on the size of its own sharded run")
    preds = {}
    for (n, world, stage, *w), r in zip(cases_, got, strict=True):
        call = f"memory_per_gpu_gb({n}, {world}, {stage!r}, {', '.join(map(str, w))})"
        if not isinstance(r, dict) or "ok" not in r:
            raise Fail(f"{call} raised {r.get('error') if isinstance(r, dict) else repr(r)}"[:300])
        v = r["ok"]
        if type(v) not in (int, float) or not math.isfinite(v):
            raise Fail(f"{call} returned {v!r:.60}, not a number of GB")
        preds[stage] = (call, float(v))
    res = a.inputs.get("zero_run") or reference.zero_run(None, a.inputs["zero_layers"])
    a.inputs["zero_run"] = res  # a judge tried again reads the same run
    w, n, world = res["bytes_per_param"], res["n_params"], res["world_size"]
    if w != ZERO_WIDTHS or n != cases_[0][0] or world != cases_[0][1]:
        raise Unusable(f"the grader's own sharded run held {w} bytes per parameter of {n} parameters on {world} ranks, "
                       f"not the fp32 run of {cases_[0][0]} parameters on {cases_[0][1]} ranks it asked for")
    widths = ", ".join(str(w[k]) for k in ("weights", "grads", "optimizer"))
    said = []
    for stage in zero_memory.STAGES:
        call, v = preds[stage]
        pred = v * 1e9
        tol = zero_memory.remainder_bytes([tuple(s) for s in res["param_shapes"]], world, stage, w)
        for rank in res["stages"][stage]:
            held = rank["total_bytes"]
            if abs(pred - held) > tol + 1e-9 * held + 1:
                raise Fail(f"{call} = {v:.6g} GB ({pred:,.0f} bytes), but rank {rank['rank']} of the grader's {stage} run "
                           f"held {held:,} bytes (weights {rank['weights_bytes']:,}, gradients {rank['grads_bytes']:,}, "
                           f"optimizer state {rank['optimizer_bytes']:,}); its shards allow {tol:,.0f} bytes either way")
        held_all = ", ".join(f"{x['total_bytes']:,}" for x in res["stages"][stage])
        said.append(f"{stage}: predicted {pred:,.0f}, held {held_all} (+-{tol:,.0f})")
    return [f"the grader's run of a stack the notebook does not show: {n:,} parameters on {world} ranks over "
            f"{res['backend']}, {widths.replace(', ', ' + ')} bytes each", "; ".join(said)]


# -- 2. bus bandwidth ---------------------------------------------------------------------------------

def busbw_cases(rng, ctx) -> list:
    return [[int(_log_uniform(rng, 1, 2**36)), _log_uniform(rng, 0.1, 1e7),
             rng.choice([1, 2, 3, 4, 8, 16, 64, rng.randint(2, 1024)])] for _ in range(24)]


def busbw(a, ref):
    want = [busbw_gbs(algbw_gbs(b, t * 1e-6), n) for b, t, n in a.inputs["bus_bandwidth_gbs"]]
    return [cases(a.calls["bus_bandwidth_gbs"], want, "bus_bandwidth_gbs",
                  "algbw = n_bytes / (time_us / 1e6) / 1e9 GB/s, busbw = algbw x 2 (n_ranks - 1) / n_ranks "
                  "(nccl-tests)", approx(1e-9, 1e-12))]


def _allreduce_rows(result: dict, name: str, world: int, backend: str) -> list[dict]:
    """The table is ``benchmarks/allreduce.py``'s on ``world`` ranks over ``backend``; each row's
    bandwidths follow from its bytes and time (nccl-tests' definitions); the rows by size."""
    n = result["world_size"]
    if n != world:
        raise Fail(f"{name} ran on {n} ranks; on this machine the runs use {world}")
    if result["backend"] != backend:
        raise Fail(f"{name} ran over {result['backend']!r}; on this machine the all-reduce runs over {backend!r}")
    if n < 2:
        raise Fail(f"{name}: an all-reduce needs 2 or more ranks, the table has {n}")
    rows = sorted(result["results"], key=lambda r: r["bytes"])
    for r in rows:
        b, t = r["bytes"], r["time_us"]
        close(r["algbw_gbs"], b / (t * 1e-6) / 1e9, f"{name} algbw_gbs at {b:,} bytes", "bytes / time", rel=REL)
        close(r["busbw_gbs"], r["algbw_gbs"] * 2 * (n - 1) / n, f"{name} busbw_gbs at {b:,} bytes", "algbw x 2(n-1)/n",
              rel=REL)
    return rows


def allreduce(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    plan = ref.plan
    rows = _allreduce_rows(a.allreduce, "allreduce", plan.nproc, plan.backend)
    want_sizes = sorted(parse_size_bytes(x) for x in plan.sizes.allreduce_sizes.split(",") if x.strip())
    if [r["bytes"] for r in rows] != want_sizes:
        raise Fail(f"allreduce measured {[r['bytes'] for r in rows]} bytes; run launch.run_allreduce(PLAN) for the "
                   f"plan's sizes {plan.sizes.allreduce_sizes}")
    big, n = rows[-1], a.allreduce["world_size"]
    want = big["bytes"] / (big["time_us"] * 1e-6) / 1e9 * 2 * (n - 1) / n
    close(a.BUSBW_GBS, want, "BUSBW_GBS", f"the largest message's bus bandwidth: {big['bytes']:,} bytes in "
          f"{big['time_us']:.4g} us on {n} ranks, x 2(n-1)/n", rel=REL)
    link = ref.link
    if link is not None:
        for r in rows:
            not_above(r["busbw_gbs"], link.per_direction_gbs, f"allreduce busbw_gbs at {r['bytes']:,} bytes", "GB/s",
                      f"the {link.name} peak per direction")
    peak = f"; link peak {link.per_direction_gbs:g} GB/s per direction" if link else "; no link peak known for this path"
    if not ref.live:
        return [f"BUSBW_GBS {a.BUSBW_GBS:.4g} GB/s at {big['bytes']:,} bytes on {n} ranks, as recorded (not "
                f"re-measured){peak}"]
    runs = ref.allreduce()
    bws = [usable(_allreduce_rows(r, "the grader's all-reduce", plan.nproc, plan.backend)[-1]["busbw_gbs"],
                  "all-reduce bus bandwidth", "GB/s") for r in runs]
    smoke = plan.backend == "gloo"
    rel = band([spread(bws)], smoke, ref.slowdown, floor=reference.ALLREDUCE_FLOOR[ref.kind])
    why = f"the grader's {len(bws)} runs spread {100 * spread(bws):.0f}%" + (
        f", widened x{ref.slowdown:.2g} for load" if ref.slowdown > 1 else "")
    return [in_band(a.BUSBW_GBS, statistics.median(bws), rel, "BUSBW_GBS", "GB/s", why) + peak]


# -- 2b. gradient synchronization by hand ----------------------------------------------------------------

def _learner_sync_ok(run: dict, plan, *, versions: bool = True) -> dict:
    """The kernel's ``SYNC`` is a ``benchmarks/grad_sync.py`` result of the plan's run (its tier's
    sizes, its ranks and backend), its ratios follow from its medians, and (``versions``) its own
    check shows every version right."""
    s = grad_sync.sizes(plan.tier)
    if run["world_size"] != plan.nproc or run["backend"] != plan.backend:
        raise Fail(f"SYNC ran on {run['world_size']} ranks over {run['backend']!r}; here the runs are {plan.nproc} "
                   f"ranks over {plan.backend!r}")
    cfg = run["config"]
    want = {"preset": s.preset, "batch": s.batch, "seq": s.seq, "steps": s.steps, "warmup": s.warmup,
            "bucket_mb": s.bucket_mb, "dtype": "float32"}
    wrong = [f"{k}={cfg[k]!r} (expected {v!r})" for k, v in want.items() if cfg[k] != v]
    if wrong:
        raise Fail(f"SYNC is not the run this cell asks for: {', '.join(wrong)}")
    t = run["versions"]
    for v in grad_sync.VERSIONS:
        if t[v]["runs"] != s.steps:
            raise Fail(f"SYNC {v} timed {t[v]['runs']} steps, the run asks for {s.steps}")
        close(t[v]["median_ms"], max(t[v]["per_rank_median_ms"]), f"SYNC {v} median_ms", "its slowest rank's", rel=REL)
    for v, want_v in grad_sync.vs_ddp(run).items():
        close(run["vs_ddp"][v], want_v, f"SYNC vs_ddp[{v!r}]", "DDP's median over its own", rel=REL)
        close(run["exposed_comm_share"][v], grad_sync.exposed_share(run, v), f"SYNC exposed_comm_share[{v!r}]",
              "1 - none's median over its own", rel=REL, abs_tol=1e-12)
    if versions:
        problems = grad_sync.version_problems(run)
        if problems:
            raise Fail("SYNC: " + "; ".join(problems))
    return run


def _sync_cfg(plan, mode: str, seed: int) -> dict:
    """The harness's run: the gradient check at the CPU tier's small sizes on this machine's ranks
    (two batches, the notebook's bucket and a second one), or the timed run at the plan's tier."""
    s = grad_sync.sizes("cpu" if mode == "check" else plan.tier)
    versions = list(grad_sync.VERSIONS) + (["bucketed_check"] if mode == "check" else [])
    return {"mode": mode, "backend": plan.backend, "world": plan.nproc, "preset": s.preset, "batch": s.batch,
            "seq": s.seq, "steps": CHECK_STEPS if mode == "check" else s.warmup + s.steps,
            "warmup": 0 if mode == "check" else s.warmup, "bucket_mb": s.bucket_mb,
            "check_bucket_mb": s.check_bucket_mb if mode == "check" else None, "seed": seed,
            "projections": PROJECTIONS[mode], "versions": versions, "rotate": 1,
            "collective_timeout_s": 60 if plan.backend == "gloo" else 300}


def sync_check_params(ctx, a) -> dict:
    cfg = _sync_cfg(_plan(), "check", secrets.randbits(30))
    a.inputs["sync"] = cfg
    return cfg


def sync_time_params(ctx, a) -> dict:
    if ctx.fingerprint.get("kind") == "gpu" and ctx.device == "cuda" and not torch.cuda.is_available():
        a.inputs["sync"] = {"skip": "record"}
        return {"skip": "record"}  # judged from a record: the grader has no GPU to time the versions on
    cfg = _sync_cfg(_plan(), "time", secrets.randbits(30))
    a.inputs["sync"] = cfg
    return cfg


def _section(a, label: str) -> Any:
    sec = a.sections.get(label)
    if sec is None:
        raise Fail(f"the grader could not run your versions in all their sections ({label} is missing)")
    return sec


def _grads_problems(a, cfg: dict, expected: dict, device_note: str = "") -> tuple[list[str], dict]:
    """Every section's gradients (weighted sums per rank and parameter) against the grader's: per
    version, the worst relative difference and what broke; and the call counts of each version."""
    names, world = expected["params"], cfg["world"]
    worst: dict = {}
    problems, calls = [], {}
    for step in range(cfg["steps"]):
        for v in cfg["versions"]:
            out = _section(a, f"{v}/{step}").outputs
            sums = out.get("sums") if isinstance(out, dict) else None
            if not isinstance(sums, list) or len(sums) != world:
                raise Fail(f"the grader's run of {v} returned no gradients for step {step}")
            if v in ("each", "bucketed", "bucketed_check", "overlapped"):
                calls.setdefault(v, (out.get("calls") or [None])[0])
            for rank, got in enumerate(sums):
                want = expected["local"][step][rank] if v == "none" else expected["mean"][step]
                if not isinstance(got, list) or len(got) != len(want):
                    raise Fail(f"the grader's run of {v} returned gradients of another model")
                for name, g, w in zip(names, got, want, strict=True):
                    err = _sum_error(g, w)
                    if err > worst.get(v, (-1.0,))[0]:
                        worst[v] = (err, name, rank, step)
    for v, (err, name, rank, step) in worst.items():
        if err > grad_sync.GRAD_RTOL:
            what = "no gradient" if math.isinf(err) else f"off by {err:.3g} of its size"
            ref_what = "its own batch's gradient" if v == "none" else "DDP's (the mean over the ranks)"
            problems.append(f"{v}: {name} on rank {rank} at step {step} {what} against {ref_what}"
                            f" (at most {grad_sync.GRAD_RTOL:g} allowed){device_note}")
    return problems, {"worst": {v: w[0] for v, w in worst.items()}, "calls": calls}


def _sum_error(got: Any, want: list) -> float:
    """How far one parameter's weighted sums are from the grader's, relative to its gradient's norm."""
    if want is None:
        return 0.0 if got is None else math.inf
    if not isinstance(got, list) or len(got) != len(want) or not all(type(x) in (int, float) for x in got):
        return math.inf
    norm = math.sqrt(max(want[-1], 0.0))
    if norm == 0:
        return 0.0 if all(abs(x) < 1e-30 for x in got) else math.inf
    proj = max((abs(g - w) for g, w in zip(got[:-1], want[:-1], strict=True)), default=0.0) / norm
    sq = abs(got[-1] - want[-1]) / (2 * want[-1])
    out = max(proj, sq)
    return out if math.isfinite(out) else math.inf


def _call_problems(calls: dict, total: int, n_tensors: int, largest: int, cfg: dict) -> list[str]:
    """The harness's count of each version's all-reduce calls (its last step, rank 0) against its kind."""
    out = []
    for v, c in calls.items():
        if not isinstance(c, dict):
            continue
        bucket = (cfg["check_bucket_mb"] if v == "bucketed_check" else cfg["bucket_mb"]) * 1e6
        if c.get("bytes") != total:
            out.append(f"{v}: all-reduced {c.get('bytes')} bytes a step, the gradients hold {total}")
        if v == "each" and (c.get("calls") != n_tensors or c.get("in_backward")):
            out.append(f"each: {c.get('calls')} all-reduce calls a step ({c.get('in_backward')} during the backward); "
                       f"one per parameter after the backward is {n_tensors}")
        if v.startswith("bucketed"):
            most = grad_sync.next_fit_bound(total, bucket)
            if c.get("max_call_bytes", 0) > max(bucket, largest) or c.get("calls", 0) > most:
                out.append(f"{v}: {c.get('calls')} all-reduce calls a step, the largest {c.get('max_call_bytes')} bytes; "
                           f"buckets of at most {bucket:g} bytes need at most {most} calls, none larger than "
                           f"{max(bucket, largest):g} bytes")
        if v == "overlapped" and not c.get("in_backward"):
            out.append("overlapped: no all-reduce started during the backward (start them from the gradient hooks, "
                       "with async_op=True)")
    return out


def _plan():
    """This machine's plan (``utils.parallel.launch.plan``), as the harness ran it."""
    return launch.plan(BY_TIER, tempfile.gettempdir())


def grad_sync_check(a, ref):
    cfg = a.inputs["sync"]
    _learner_sync_ok(a.SYNC, _plan())
    expected = reference.sync_expected(cfg)
    problems, seen = _grads_problems(a, cfg, expected)
    sizes = expected["numels"]
    problems += _call_problems(seen["calls"], 4 * sum(sizes), len(sizes), 4 * max(sizes), cfg)
    if problems:
        raise Fail("the grader ran your versions with its own weights and batches: " + "; ".join(problems))
    worst = ", ".join(f"{v} {seen['worst'].get(v, 0):.2g}" for v in ("each", "bucketed", "bucketed_check", "overlapped"))
    return ["SYNC is the plan's run and shows every version equal to DDP's",
            f"the grader's run on {cfg['world']} ranks over {cfg['backend']}, weights and batches of its own, buckets of "
            f"{cfg['bucket_mb']:g} and {cfg['check_bucket_mb']:g} MB: every rank's gradients equal the mean of the "
            f"ranks' own (worst relative difference: {worst})"]


def _timing(a, cfg: dict, ctx) -> dict:
    """The grader's timing of each version (median over the timed steps of go-to-done, every rank
    included) and its spread, after checking every timed section's gradients against the grader's."""
    dev = "cuda" if cfg["backend"] == "nccl" and torch.cuda.is_available() else "cpu"
    expected = reference.sync_expected(cfg, dev)
    problems, _ = _grads_problems(a, cfg, expected, " while the grader timed it")
    if problems:
        raise Fail("; ".join(problems))
    out = {}
    for v in grad_sync.VERSIONS:
        secs = [_section(a, f"{v}/{s}").seconds for s in range(cfg["warmup"], cfg["steps"])]
        ms = [x * 1e3 for x in secs]
        q = statistics.quantiles(ms, n=5) if len(ms) >= 2 else [ms[0]] * 4
        med = statistics.median(ms)
        out[v] = {"median_ms": med, "spread": (q[3] - q[0]) / med if med > 0 else math.inf}
    return out


def _speed_vs_grader(mine: dict, run: dict, t: dict, ref) -> list[str]:
    """The learner's ratios (DDP's median over each version's) and the per-parameter version's exposed
    share against the grader's timing of the same versions."""
    smoke = ref.plan.backend == "gloo"
    lines = []
    for v in grad_sync.LEARNER_VERSIONS:
        want = usable(t["ddp"]["median_ms"], "DDP's step", "ms") / usable(t[v]["median_ms"], f"{v}'s step", "ms")
        rel = band([t[v]["spread"], t["ddp"]["spread"]], smoke, ref.slowdown, floor=SYNC_FLOOR[ref.kind])
        lines.append(in_band(mine[v], want, rel, f"SYNC_VS_DDP[{v!r}]", "x DDP's speed",
                             f"the grader's steps spread {100 * t[v]['spread']:.0f}% and {100 * t['ddp']['spread']:.0f}%"))
    share, ref_share = grad_sync.exposed_share(run, "each"), max(0.0, 1 - t["none"]["median_ms"] / t["each"]["median_ms"])
    width = ref.fraction_band([(1 - ref_share) * (t["none"]["spread"] + t["each"]["spread"])])
    if abs(share - ref_share) > width:
        raise Fail(f"the per-parameter version's exposed communication share in SYNC is {share:.3f}, but the grader "
                   f"timed {ref_share:.3f}; accepted {ref_share - width:.3f} to {ref_share + width:.3f} (+-{width:g})")
    lines.append(f"exposed communication of the per-parameter step: grader {ref_share:.3f}, yours {share:.3f} "
                 f"(+-{width:g})")
    return lines


def sync_speed(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    run = _learner_sync_ok(a.SYNC, ref.plan)
    want = grad_sync.vs_ddp(run)
    for v in grad_sync.LEARNER_VERSIONS:
        close(a.SYNC_VS_DDP[v], want[v], f"SYNC_VS_DDP[{v!r}]", f"DDP's median step over {v}'s, from SYNC", rel=REL)
    if not ref.live:
        return ["speed against DDP as recorded (not re-timed): " + ", ".join(f"{v} {x:.3g}" for v, x in want.items())]
    cfg = a.inputs["sync"]
    return _speed_vs_grader(a.SYNC_VS_DDP, run, _timing(a, cfg, ref.ctx), ref)


def sync_explanation(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    run = _learner_sync_ok(a.SYNC, ref.plan, versions=False)
    want = grad_sync.explanation(run)
    e = a.SYNC_EXPLANATION
    if e["fastest"] != want["fastest"]:
        raise Fail(f"SYNC_EXPLANATION['fastest'] = {e['fastest']!r}, but in SYNC {want['fastest']!r} has the shortest "
                   "median step")
    close(e["each_comm_share"], want["each_comm_share"], "SYNC_EXPLANATION['each_comm_share']",
          "1 - none's median over each's", rel=REL, abs_tol=1e-12)
    close(e["each_vs_ddp"], want["each_vs_ddp"], "SYNC_EXPLANATION['each_vs_ddp']", "DDP's median over each's", rel=REL)
    if e["cause"] != want["cause"]:
        t = {v: run["versions"][v]["median_ms"] for v in ("none", "ddp", "each")}
        raise Fail(f"SYNC_EXPLANATION['cause'] = {e['cause']!r}, but your medians say {want['cause']!r}: each "
                   f"{t['each']:.4g} ms, DDP {t['ddp']:.4g} ms, no synchronization {t['none']:.4g} ms (the rule: within "
                   f"{100 * grad_sync.NEAR_DDP:.0f}% of DDP's step, as fast as DDP; else exposed communication when the "
                   "synchronization's share of each's step is at least half of what DDP saves)")
    line = f"{want['cause']!r} follows from your medians by the rule"
    if not ref.live:
        return [line + " (as recorded, not re-timed)"]
    return [line, *_speed_vs_grader(grad_sync.vs_ddp(run), run, _timing(a, a.inputs["sync"], ref.ctx), ref)]


# -- 3. scaling 1 -> N ----------------------------------------------------------------------------

def scenario_config(scenario: str, sizes) -> dict:
    """What a run of ``scenario`` changes against the reference run (config keys and env)."""
    base = {"batch_per_device": sizes.batch_per_device, "grad_accum": 1, "no_sync_accum": False}
    if scenario == "small_batch":
        return {**base, "batch_per_device": sizes.small_batch}
    if scenario == "accum_without_no_sync":
        return {"batch_per_device": sizes.accum_batch, "grad_accum": sizes.grad_accum, "no_sync_accum": True}
    return {**base, "env": {"NCCL_P2P_DISABLE": "1"}}


def run_ok(run: dict, name: str, sizes, backend: str, world: int, *, measure_comm: bool = False,
           expect: dict | None = None) -> dict:
    """``run`` is a ``train_multi_gpu.py`` result of the asked-for run: the world size, DDP over the
    plan's backend, the sizes' model, shape, precision and step counts, the scenario's changes
    (``expect``), each rank's tokens/s its tokens over its measured time, the per-device mean their
    mean, and (``measure_comm``) the exposed communication share its ranks' worst."""
    if run["world_size"] != world:
        raise Fail(f"{name} ran on {run['world_size']} process(es); this cell needs {world}")
    if world > 1:
        want = "MULTI_GPU" if backend == "nccl" else "MULTI_CPU"
        if run["distributed_type"] != want:
            raise Fail(f"{name} ran as {run['distributed_type']!r}; the reference run is DDP ({want}: "
                       "benchmarks/accelerate/ddp.yaml)")
    exp = dict(expect or {})
    env_want = exp.pop("env", {})
    want_cfg = {"preset": sizes.model, "seq": sizes.seq_len, "steps": sizes.steps, "warmup": sizes.warmup,
                "bf16": sizes.bf16, "compile": sizes.compile, "batch_per_device": sizes.batch_per_device,
                "grad_accum": 1, "no_sync_accum": False, **exp}
    cfg = run["config"]
    wrong = [f"{k}={cfg[k]!r} (expected {v!r})" for k, v in want_cfg.items() if cfg[k] != v]
    if wrong:
        raise Fail(f"{name} is not the run this cell asks for: {', '.join(wrong)}")
    env = run.get("env") or {}
    for k, v in env_want.items():
        if str(env.get(k)) != v:
            raise Fail(f"{name} ran without {k}={v} (its environment has {k}={env.get(k)!r})")
    ranks = run["per_rank"]
    if len(ranks) != world or sorted(r["rank"] for r in ranks) != list(range(world)):
        raise Fail(f"{name} has results for ranks {[r['rank'] for r in ranks]}, not one for each of its {world} ranks")
    per_step = sizes.seq_len * want_cfg["batch_per_device"] * want_cfg["grad_accum"]
    equal(run["tokens_per_step_per_device"], per_step, f"{name} tokens per step per device",
          "seq x batch per device x micro-batches")
    for r in ranks:
        who = f"{name} rank {r['rank']}"
        if r["steps"] != sizes.steps:
            raise Fail(f"{who} measured {r['steps']} steps, the run asked for {sizes.steps}")
        total = r["total_s"]
        if not total > 0 or not r["median_ms"] > 0:
            raise Fail(f"{who}: total_s {total:.4g} and median_ms {r['median_ms']:.4g} must be positive")
        close(r["tokens_per_s"], r["steps"] * per_step / total, f"{who} tokens/s", "its tokens over its measured time",
              rel=REL)
        times = r.get("step_times_ms")
        if times:
            close(sum(times) / 1e3, total, f"{who} total_s", "the sum of its step times", rel=1e-6, abs_tol=1e-6)
            close(r["median_ms"], statistics.median(times), f"{who} median_ms", "the median of its step times", rel=REL)
    close(run["tokens_per_s_per_device"], statistics.fmean(r["tokens_per_s"] for r in ranks),
          f"{name} tokens_per_s_per_device", "the mean over its ranks", rel=REL)
    close(run["total_tokens_per_s"], sum(r["tokens_per_s"] for r in ranks) if world > 1 else
          run["tokens_per_s_per_device"], f"{name} total_tokens_per_s", "the sum over its ranks", rel=1e-3)
    if measure_comm:
        shares = []
        for r in ranks:
            who = f"{name} rank {r['rank']}"
            nos, s = r.get("nosync_median_ms"), r.get("exposed_comm_share")
            if nos is None or s is None or not nos > 0:
                raise Fail(f"{who} has no nosync_median_ms: run it with measure_comm=True")
            close(s, max(0.0, 1.0 - nos / r["median_ms"]), f"{who} exposed_comm_share", "1 - nosync median / median",
                  rel=REL, abs_tol=1e-12)
            shares.append(s)
        if run.get("exposed_comm_share") is None:
            raise Fail(f"{name} has no exposed_comm_share: run it with measure_comm=True")
        close(run["exposed_comm_share"], max(shares), f"{name} exposed_comm_share", "its worst rank's", rel=REL,
              abs_tol=1e-12)
        if not 0 <= max(shares) < 1:
            raise Fail(f"{name} exposed_comm_share = {max(shares):.3g}: a share of the step is in [0, 1)")
    return run


def _rank_spread(run: dict) -> float:
    """The relative spread of a run's step times (p20 to p80 over the median, its worst rank)."""
    return max((r["p80_ms"] - r["p20_ms"]) / r["median_ms"] for r in run["per_rank"] if r["median_ms"] > 0)


def _plausible_throughput(run: dict, ctx) -> None:
    spec = ctx.spec
    if spec is None:
        return
    cfg = run["config"]
    fpt = flops_per_token_from_config(preset_config(str(cfg["preset"])), int(cfg["seq"]))
    peak = spec.peak_tflops("bf16") if cfg["bf16"] else max(p for p in (spec.fp32_tflops, spec.tf32_tflops) if p)
    not_above(run["tokens_per_s_per_device"] * fpt / 1e12, peak, "tokens/s per device x FLOPs per token", "TFLOP/s",
              f"the {spec.name} datasheet peak")


def _near(value: float, want: float, width: float, name: str, what: str) -> str:
    if abs(value - want) > width:
        raise Fail(f"{name} = {value:.3f}, but the grader measured {want:.3f} in its own {what}; accepted "
                   f"{want - width:.3f} to {want + width:.3f} (+-{width:.3g})")
    return f"{name}: grader {want:.3f}, yours {value:.3f} (+-{width:.3g})"


def _grader_scaling(ref) -> tuple[float, float, float, float]:
    """The grader's efficiency and exposed share from its own two runs, and their bands."""
    one, many = ref.training()
    eff = usable(many["tokens_per_s_per_device"], f"{ref.plan.nproc}-process tokens/s per device", "tokens/s") / \
        usable(one["tokens_per_s_per_device"], "1-process tokens/s", "tokens/s")
    share = many.get("exposed_comm_share")
    if not isinstance(share, (int, float)) or not math.isfinite(share):
        raise Unusable("the grader's own run has no exposed communication share")
    s1, sn = _rank_spread(one), _rank_spread(many)
    return eff, share, ref.fraction_band([eff * (s1 + sn)]), ref.fraction_band([2 * (1 - share) * sn])


def scaling(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    plan = ref.plan
    s = plan.sizes
    if plan.nproc < 2:
        raise Fail(f"the runs need 2 or more processes; this plan has {plan.nproc}")
    run_ok(a.one, "one", s, plan.backend, 1)
    run_ok(a.many, "many", s, plan.backend, plan.nproc, measure_comm=True)
    eff = a.scaling_efficiency
    close(eff, a.many["tokens_per_s_per_device"] / a.one["tokens_per_s_per_device"], "scaling_efficiency",
          "per-device tokens/s at N over tokens/s on one", rel=REL)
    cap = EFFICIENCY_CAP[ref.kind]
    if eff > cap:
        raise Fail(f"scaling_efficiency = {eff:.3g}: above {cap}, not physically possible here. Under DDP each of the N "
                   "devices does the one device's work plus a gradient all-reduce, so its throughput cannot beat one "
                   "device's (beyond measurement noise); run both measurements again, unchanged")
    if eff < s.min_efficiency:
        raise Fail(f"scaling_efficiency = {eff:.3g}, below the {s.min_efficiency:g} this device tier expects for the "
                   "reference DDP run")
    close(a.comm_share, a.many["exposed_comm_share"], "comm_share", "many['exposed_comm_share']", rel=REL, abs_tol=1e-12)
    if not ref.live:
        if plan.backend == "nccl":
            for run in (a.one, a.many):
                _plausible_throughput(run, ref.ctx)
        return [f"scaling efficiency {eff:.3f} on {plan.nproc} devices, exposed communication {a.comm_share:.3f}, as "
                "recorded (not re-measured)"]
    ref_eff, ref_share, w_eff, w_share = _grader_scaling(ref)
    return [_near(eff, ref_eff, w_eff, "scaling_efficiency", "1- and N-process runs"),
            _near(a.comm_share, ref_share, w_share, "comm_share", "N-process run"),
            f"at least {s.min_efficiency:g} on this tier"]


# -- 4. where scaling breaks --------------------------------------------------------------------------

def _breaks_ok(breaks: dict, ref) -> None:
    plan = ref.plan
    if not breaks:
        raise Fail(f"BREAKS must map at least one scenario ({', '.join(SCENARIOS)}) to its run")
    for scenario, run in breaks.items():
        if scenario == "p2p_disabled" and plan.backend != "nccl":
            raise Fail("p2p_disabled needs NCCL between GPUs: NCCL_P2P_DISABLE changes nothing over gloo; on this "
                       "machine run small_batch or accum_without_no_sync")
        run_ok(run, f"BREAKS[{scenario!r}]", plan.sizes, plan.backend, plan.nproc, measure_comm=True,
               expect=scenario_config(scenario, plan.sizes))


def _breaks_vs_grader(breaks: dict, ref) -> list[str]:
    lines = []
    for scenario, run in breaks.items():
        theirs = ref.scenario(scenario)
        share = theirs.get("exposed_comm_share")
        if not isinstance(share, (int, float)) or not math.isfinite(share):
            raise Unusable(f"the grader's own {scenario} run has no exposed communication share")
        width = ref.fraction_band([2 * (1 - share) * _rank_spread(theirs)])
        lines.append(_near(run["exposed_comm_share"], share, width, f"BREAKS[{scenario!r}] exposed_comm_share",
                           f"{scenario} run"))
    return lines


def breaks(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    _breaks_ok(a.BREAKS, ref)
    if not ref.live:
        return [f"{len(a.BREAKS)} break(s) as recorded (not re-measured): " + ", ".join(
            f"{k} {v['exposed_comm_share']:.3f}" for k, v in a.BREAKS.items())]
    return _breaks_vs_grader(a.BREAKS, ref)


# -- 5. the explanation -------------------------------------------------------------------------------

def reference_cause(efficiency: float, comm_share: float) -> str:
    """The notebook's rule for the dominant cause of lost scaling efficiency: under :data:`NEAR_LINEAR`
    of loss, ``near_linear``; else ``exposed_communication`` when the exposed share explains at least
    half of the loss (if the unhidden all-reduce were all that differs, loss = share), else
    ``other_overhead``."""
    loss = 1.0 - efficiency
    if loss < NEAR_LINEAR:
        return "near_linear"
    return "exposed_communication" if comm_share >= loss / 2 else "other_overhead"


def explanation(a, ref):
    if ref.problem:
        raise Fail(ref.problem)
    e, eff, share = a.EXPLANATION, a.scaling_efficiency, a.comm_share
    close(e["efficiency"], eff, "EXPLANATION['efficiency']", "your scaling_efficiency", rel=REL)
    close(e["exposed_comm_share"], share, "EXPLANATION['exposed_comm_share']", "your comm_share", rel=REL, abs_tol=1e-12)
    _breaks_ok(a.BREAKS, ref)
    want = reference_cause(eff, share)
    if e["dominant_cause"] != want:
        loss = 1 - eff
        raise Fail(f"EXPLANATION['dominant_cause'] = {e['dominant_cause']!r}, but your measurements say {want!r}: "
                   f"efficiency {eff:.3f} (a loss of {loss:.3f}), exposed communication {share:.3f} of the step"
                   + ("" if loss < NEAR_LINEAR else f" ({'at least' if share >= loss / 2 else 'less than'} half the loss)"))
    shares = {k: v["exposed_comm_share"] for k, v in a.BREAKS.items()}
    worst = max(shares, key=shares.get)
    if e["worst_break"] != worst:
        raise Fail(f"EXPLANATION['worst_break'] = {e['worst_break']!r}, but of your BREAKS {worst!r} exposed the most "
                   f"communication ({shares[worst]:.3f} of the step)")
    line = f"efficiency {eff:.3f}, exposed communication {share:.3f}: {want!r}, as the rule gives; worst break {worst!r}"
    if not ref.live:
        return [line + " (as recorded, not re-measured)"]
    ref_eff, ref_share, w_eff, w_share = _grader_scaling(ref)
    return [line, _near(eff, ref_eff, w_eff, "scaling_efficiency", "1- and N-process runs"),
            _near(share, ref_share, w_share, "comm_share", "N-process run"), *_breaks_vs_grader(a.BREAKS, ref)]


# -- 6. model parallelism -------------------------------------------------------------------------------

def parallel_cases(rng, ctx) -> list:
    """``(n_params, n_layers, tp, pp[, bytes_per_param])``: stages that do not divide the layers, one
    layer per stage, tensor degrees up to 16, byte widths of bf16, fp8, 4-bit and fp32."""
    out = []
    for i in range(24):
        layers = rng.choice([rng.randint(1, 128), rng.choice([12, 22, 32, 80, 126])])
        pp = rng.choice([1, layers, rng.randint(1, min(layers, 16))])
        case = [int(_log_uniform(rng, 1e6, 1e12)), layers, rng.choice([1, 2, 4, 8, 16]), pp]
        out.append(case if i % 4 == 0 else case + [rng.choice([2, 1, 0.5, 4])])
    return out


def min_tp() -> int:
    n70 = llama_params()
    for tp in TP_DEGREES:
        if parallel_weight_bytes_per_gpu(n70, LLAMA_70B["num_hidden_layers"], tp=tp) / 1e9 <= WEIGHT_SHARE * GPU_MEMORY_GB:
            return tp
    raise ValueError("no tensor-parallel degree up to 8 fits")


def parallelism(a, ref):
    want = [parallel_weight_bytes_per_gpu(n, layers, tp=tp, pp=pp, bytes_per_param=(rest[0] if rest else 2)) / 1e9
            for n, layers, tp, pp, *rest in a.inputs["weights_per_gpu_gb"]]
    line = cases(a.calls["weights_per_gpu_gb"], want, "weights_per_gpu_gb",
                 "n_params x bytes_per_param x (layers of the busiest stage, ceil(n_layers / pp)) / n_layers / tp, in GB",
                 approx(1e-9))
    n70, tp = llama_params(), min_tp()
    if a.MIN_TP != tp:
        raise Fail(f"MIN_TP = {a.MIN_TP!r}, but {tp} is the smallest degree in {TP_DEGREES} whose bf16 weights "
                   f"({n70 / 1e9:.1f}B parameters) fit in {WEIGHT_SHARE:.0%} of an {GPU_MEMORY_GB} GB card")
    return [line, f"MIN_TP = {tp}"]


# -- 8. the Triton kernels ------------------------------------------------------------------------

def _kernel_device() -> tuple[str, list[str]]:
    """Where the kernels run here, and in which dtypes: CPU tensors under Triton's interpreter (fp32), else
    the GPU (fp32 and the card's 16-bit type)."""
    if INTERPRETED or not torch.cuda.is_available():
        return "cpu", ["float32"]
    from utils.device import rehearsal

    return "cuda", ["float32", str(rehearsal.half_torch_dtype()).removeprefix("torch.")]


def _shapes(rng) -> list[tuple[int, int]]:
    """A single element; ragged tails (numel not a multiple of any power-of-2 block); an odd width; wider
    than 3072: none of them the notebook's own."""
    return [(1, rng.randint(1, 7)), (rng.randint(2, 9), rng.randrange(101, 1201, 2)), (rng.randint(11, 40),
            rng.randrange(65, 257, 2)), (rng.randint(2, 6), 3072 + rng.randrange(1, 32, 2)),
            (rng.randint(1, 3), rng.randrange(3001, 5001, 2))]


def fused_params(ctx, a) -> dict:
    rng = random.Random(secrets.randbits(64))
    device, dtypes = _kernel_device()
    params = {"device": device, "cases": [[r, c, dt, rng.randrange(2**31)] for dt in dtypes for r, c in _shapes(rng)]}
    if device == "cuda":
        params["time"] = {"shape": list(GPU_SHAPE), "dtype": dtypes[1], "reps": FUSED_REPS, "calls": FUSED_CALLS}
        a.inputs["unfused_s"] = reference.unfused_seconds(GPU_SHAPE, dtypes[1], FUSED_REPS, FUSED_CALLS)
    a.inputs["fused"] = params
    return params


def _kernel_kind(kind: str, name: str) -> None:
    if kind == "NoneType":
        raise Fail(f"{name} is not defined by your definitions")
    if kind not in ("jit", "interpreted"):
        raise Fail(f"{name} is a {kind}, not a Triton kernel: decorate it with @triton.jit")


def _launcher_case(case: dict, fn: str, kernel: str, what: str) -> None:
    """One call of a launcher, as the harness saw it: it launched the kernel, the kernel was given the
    tensor it returned, and no PyTorch computation made it."""
    if "error" in case:
        raise Fail(f"{fn} on {what} raised {case['error']}" if "launches" not in case else f"{fn}: {case['error']}")
    if not case["launches"]:
        raise Fail(f"{fn} did not launch {kernel}: the kernel must compute the output")
    if case["torch_ops"]:
        raise Fail(f"{fn} called PyTorch's {', '.join(case['torch_ops'][:4])} beside launching {kernel}: the kernel "
                   "alone computes the output")
    if case["is_input"]:
        raise Fail(f"{fn} returned one of its inputs: return a new tensor the kernel wrote")
    if not case["out_launched"]:
        raise Fail(f"{fn} returned a tensor {kernel} was not given: the kernel must write the output")


def _compare(got: list, want, what: str) -> None:
    rtol, atol = FUSED_TOL[str(want.dtype).removeprefix("torch.")]
    g = torch.tensor(got, dtype=torch.float64)
    w = want.detach().double().reshape(-1)
    if g.numel() != w.numel():
        raise Fail(f"{what}: {g.numel()} values, expected {w.numel()}")
    bad = ~torch.isclose(g, w, rtol=rtol, atol=atol) | ~torch.isfinite(g)
    if bool(bad.any()):
        err = (g - w).abs().nan_to_num(math.inf)
        i = int(bad.nonzero()[0])
        raise Fail(f"{what} differs from PyTorch's by up to {err.max().item():.3g} ({int(bad.sum())} of {w.numel()} "
                   f"elements, the first at index {i}; tolerance {atol:g} + {rtol:g} x |value|)")


def _timed(a, prefix: str, reps: int) -> list[float]:
    out = []
    for r in range(reps):
        out.append(_section(a, f"{prefix}/{r}").seconds)
    return out


def _section_seed(sec) -> int:
    """The seed the grader sent with a section's go (``Section.seed``; never one the harness reports)."""
    seed = sec.seed
    if type(seed) is not int:
        raise Fail("a timed section of your kernel returned no result the grader could check")
    return seed


def fused_kernel_judge(a, ref):
    r, params = a.harness, a.inputs["fused"]
    if not isinstance(r, dict):
        raise Fail("the grader could not run fused_bias_gelu")
    _kernel_kind(r["kind"], "BIAS_GELU_KERNEL")
    if not r.get("defined"):
        raise Fail("fused_bias_gelu is not defined by your definitions")
    if len(r["cases"]) != len(params["cases"]):
        raise Fail("the grader could not run fused_bias_gelu on all its inputs")
    for case, (rows, cols, dtype, seed) in zip(r["cases"], params["cases"], strict=True):
        what = f"a {rows} x {cols} {dtype} input the grader drew"
        _launcher_case(case, "fused_bias_gelu", "BIAS_GELU_KERNEL", what)
        x, bias = harness.inputs(seed, rows, cols, torch.device("cpu"), getattr(torch, dtype))
        want = bias_gelu_reference(x, bias)
        if case["shape"] != [rows, cols] or case["dtype"] != dtype:
            raise Fail(f"fused_bias_gelu on {what} returned shape {case['shape']} {case['dtype']}; expected "
                       f"{[rows, cols]} {dtype}")
        _compare(case["values"], want, f"fused_bias_gelu on {what}")
    n = len(params["cases"])
    if "time" not in params:
        return [f"fused_bias_gelu matches PyTorch on {n} inputs the grader drew, launching BIAS_GELU_KERNEL, under "
                "Triton's interpreter (speed is not graded there: its times are NumPy's)"]
    t = params["time"]
    for k in range(t["reps"]):
        sec = _section(a, f"fused/{k}")
        want, scale = reference.fused_checksum(_section_seed(sec), t["shape"], t["dtype"])
        got = sec.outputs.get("checksum") if isinstance(sec.outputs, dict) else None
        if type(got) not in (int, float) or abs(got - want) > CHECKSUM_RTOL * scale:
            raise Fail("while the grader timed it, fused_bias_gelu's output was not bias + GELU of the inputs the "
                       "grader drew for that section")
    fused_s = statistics.median(_timed(a, "fused", t["reps"]))
    unfused_s = statistics.median(a.inputs["unfused_s"])
    speedup = usable(unfused_s / fused_s, "fused_bias_gelu speedup", "x")
    line = (f"fused_bias_gelu: {speedup:.2f}x the unfused ops ({t['reps']} sections of {t['calls']} calls on "
            f"{t['shape'][0]} x {t['shape'][1]} {t['dtype']}, timed by the grader; at least {MIN_SPEEDUP:g}x)")
    if speedup < MIN_SPEEDUP:
        raise Fail(f"fused_bias_gelu is {speedup:.2f}x the unfused ops, timed by the grader; at least {MIN_SPEEDUP:g}x "
                   "is expected from the bytes it saves")
    return [f"fused_bias_gelu matches PyTorch on {n} inputs the grader drew", line]


def second_params(ctx, a) -> dict:
    rng = random.Random(secrets.randbits(64))
    device, dtypes = _kernel_device()
    params = {"device": device, "cases": [[r, c, dt, rng.randrange(2**31)] for dt in dtypes for r, c in _shapes(rng)[1:]],
              "bytes_case": [rng.randint(1000, 5000), rng.randint(1000, 4000), rng.choice([2, 4])]}
    if device == "cuda":
        params["time"] = {"shape": list(GPU_SHAPE), "dtype": dtypes[1], "reps": FUSED_REPS, "calls": FUSED_CALLS,
                          "check_seed": rng.randrange(2**31)}
    a.inputs["second"] = params
    return params


def second_fusion_judge(a, ref):
    r, params = a.harness, a.inputs["second"]
    if not isinstance(r, dict):
        raise Fail("the grader could not run your second fusion")
    if r["missing"]:
        raise Fail(f"{', '.join(r['missing'])} {'is' if len(r['missing']) == 1 else 'are'} not defined by your definitions")
    _kernel_kind(r["kind"], "SECOND_KERNEL")
    if r["same_kernel"]:
        raise Fail("SECOND_KERNEL is the bias-GELU kernel again: the second fusion is one of your own choice")
    if len(r["cases"]) != len(params["cases"]):
        raise Fail("the grader could not run your second fusion on all its inputs")
    n_ops = 0
    for k, (case, (rows, cols, dtype, _)) in enumerate(zip(r["cases"], params["cases"], strict=True)):
        what = f"{rows} x {cols} {dtype} inputs the grader asked second_inputs for"
        if "error" in case:
            raise Fail(f"on {what}: {case['error']}")
        if k == 0:
            n_ops = len(case["unfused_ops"])
            if n_ops < 2:
                raise Fail(f"second_unfused calls {n_ops} PyTorch operation(s) ({', '.join(case['unfused_ops']) or 'none'})"
                           ": a fusion joins two or more")
        if case["unfused_copies_input"]:
            raise Fail("second_unfused returns one of its inputs unchanged: a fusion computes something")
        _launcher_case(case["fused"], "second_fused", "SECOND_KERNEL", what)
        want = torch.tensor(case["unfused"], dtype=getattr(torch, case["unfused_dtype"]))
        _compare(case["fused"]["values"], want, f"second_fused on {what} (against your second_unfused)")
    moved = r.get("bytes")
    if not isinstance(moved, dict) or not all(type(moved.get(k)) in (int, float) for k in ("unfused", "fused")):
        raise Fail(f"second_bytes must return {{'unfused': bytes, 'fused': bytes}}, got {moved!r:.120}")
    if not 0 < moved["fused"] < moved["unfused"]:
        raise Fail(f"second_bytes says the fused kernel moves {moved['fused']:,.0f} bytes and the unfused ops "
                   f"{moved['unfused']:,.0f}: fusing saves the round trips of the intermediates, so fused < unfused")
    head = (f"second fusion matches its PyTorch version on {len(params['cases'])} inputs; {n_ops} ops fused; bytes "
            f"{moved['unfused']:,.0f} -> {moved['fused']:,.0f}")
    if "time" not in params:
        return [head + " (speed not graded under Triton's interpreter)"]
    t = params["time"]
    agree = r.get("timed_agree") or {}
    if not agree or agree.get("max_abs", math.inf) > FUSED_TOL[t["dtype"]][1] + FUSED_TOL[t["dtype"]][0] * agree.get("scale", 0):
        raise Fail(f"second_fused differs from second_unfused on the {t['shape'][0]} x {t['shape'][1]} inputs it was timed on")
    fused_s = statistics.median(_timed(a, "fused", t["reps"]))
    unfused_s = statistics.median(_timed(a, "unfused", t["reps"]))
    speedup = usable(unfused_s / fused_s, "second_fused speedup", "x")
    if speedup < MIN_SECOND_SPEEDUP:
        raise Fail(f"second_fused is {speedup:.2f}x its unfused version, both timed by the grader in alternating sections; "
                   f"a fusion must not be slower than what it fuses (at least {MIN_SECOND_SPEEDUP:g}x)")
    return [head, f"second_fused: {speedup:.2f}x second_unfused, timed by the grader (at least {MIN_SECOND_SPEEDUP:g}x)"]


HARNESS = "grader.labs.multi_gpu.harness"

CHECKS = [
    Check("test_memory", memory, calls={"memory_per_gpu_gb": memory_cases}, forbid=MEMORY_RULES),
    Check("test_zero_memory", zero, harness=f"{HARNESS}:memory_predictions", harness_params=zero_params,
          forbid=MEMORY_RULES, imports=(HARNESS,)),
    Check("test_busbw", busbw, calls={"bus_bandwidth_gbs": busbw_cases}, forbid=BUSBW_RULES),
    Check("test_allreduce", allreduce, measures=("allreduce",)),
    Check("test_grad_sync", grad_sync_check, harness=f"{HARNESS}:grad_sync", harness_params=sync_check_params,
          imports=(HARNESS,), timeout_s=600),
    Check("test_sync_speed", sync_speed, measures=("sync",), harness=f"{HARNESS}:grad_sync",
          harness_params=sync_time_params, imports=(HARNESS,), timeout_s=600),
    Check("test_sync_explanation", sync_explanation, measures=("sync",), harness=f"{HARNESS}:grad_sync",
          harness_params=sync_time_params, imports=(HARNESS,), timeout_s=600),
    Check("test_scaling", scaling, measures=("train",)),
    Check("test_breaks", breaks, measures=("breaks",)),
    Check("test_explanation", explanation, measures=("train", "breaks")),
    Check("test_parallelism", parallelism, calls={"weights_per_gpu_gb": parallel_cases}, forbid=PARALLEL_RULES),
    # compiled, Triton starts its compiler's processes: the sandbox is strict only under the interpreter (the
    # course's bias + GELU is a tripwire either way)
    Check("test_fused_kernel", fused_kernel_judge, harness=f"{HARNESS}:fused_kernel", harness_params=fused_params,
          forbid=FUSED_RULES, strict=INTERPRETED, imports=(HARNESS,)),
    Check("test_second_fusion", second_fusion_judge, harness=f"{HARNESS}:second_fusion", harness_params=second_params,
          forbid=FUSED_RULES, strict=INTERPRETED, imports=(HARNESS,)),
]
