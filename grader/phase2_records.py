"""Phase 2's run checks, reference answers and measurement record.

The checks of a training run's JSON (``benchmarks/train_multi_gpu.py``) and an all-reduce
table (``benchmarks/allreduce.py``) live here because the live checks (the learner's runs,
re-measured) and the record checks (a GPU run's record, on a grading machine without a GPU)
apply the same ones: the run is the configuration the notebook asked for, every derived
number follows from the per-rank numbers it came from, and nothing is physically
impossible (per-device throughput above one device's, bus bandwidth above the link, FLOP/s
above the datasheet). An invented but consistent, plausible record passes: the record proves
the arithmetic, not the run (docs/grading.md).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from grader import checks  # grader.phase(2) rebinds it to a fresh copy
from utils.scaling_breaks import CAUSES, NEAR_LINEAR, SCENARIOS  # checked unchanged by grader/phase2.py's untampered()

PHASE = "02_multi_gpu"
# Per-device throughput at N devices over one device's. DDP at a fixed per-device batch does the
# same work per device plus the all-reduce, so above 1 is noise at most: 5% on a GPU (clocks);
# 20% for CPU processes, which share cores and caches with the notebook and the grader.
EFFICIENCY_CAP = {"gpu": 1.05, "cpu": 1.2}
REL = 1e-6  # numbers a JSON file carries through: float round trips only


def reference_cause(efficiency: float, comm_share: float) -> str:
    """The notebook's rule for the dominant cause of lost scaling efficiency.

    With a loss ``L = 1 - efficiency`` below :data:`NEAR_LINEAR` the run scales near
    linearly. Otherwise the exposed communication share ``c`` (``1 - t_nosync / t_sync`` of
    the N-device run) is compared with the loss: if the gradient all-reduce the backward
    pass did not hide were all that differs, ``efficiency = t_1 / t_sync`` with
    ``t_1 = t_nosync``, so ``L = c``. When ``c`` explains at least half of ``L`` the cause is
    ``exposed_communication``; else the N-device run is slow even with the all-reduce
    skipped (processes competing for cores, memory bandwidth or PCIe; a lagging rank):
    ``other_overhead``."""
    loss = 1.0 - efficiency
    if loss < NEAR_LINEAR:
        return "near_linear"
    return "exposed_communication" if comm_share >= loss / 2 else "other_overhead"


def scenario_config(scenario: str, sizes) -> dict:
    """What a run of ``scenario`` changes against the reference run (config keys and env)."""
    base = {"batch_per_device": sizes.batch_per_device, "grad_accum": 1, "no_sync_accum": False}
    if scenario == "small_batch":
        return {**base, "batch_per_device": sizes.small_batch}
    if scenario == "accum_without_no_sync":
        return {"batch_per_device": sizes.accum_batch, "grad_accum": sizes.grad_accum, "no_sync_accum": True}
    if scenario == "p2p_disabled":
        return {**base, "env": {"NCCL_P2P_DISABLE": "1"}}
    raise ValueError(f"unknown scenario {scenario!r}; use one of {', '.join(SCENARIOS)}")


# -- one run, checked ---------------------------------------------------------------------------

def run_ok(run: Any, name: str, sizes, backend: str, world: int, *, measure_comm: bool = False,
           expect: dict | None = None) -> dict:
    """AssertionError unless ``run`` is a ``train_multi_gpu.py`` result of the asked-for run.

    Checks the world size, the distributed engine (DDP over NCCL or gloo), the model, shape,
    precision and step counts of ``sizes``, the scenario's changes (``expect``: config keys
    and ``env``), and that every rank's tokens/s is its tokens over its measured time, the
    per-device mean their mean, and the exposed communication share its ranks' worst."""
    if not isinstance(run, dict) or "per_rank" not in run or "config" not in run:
        raise AssertionError(f"{name} must be the dict that phase2.run_training returned (a train_multi_gpu.py result)")
    ws = run.get("world_size")
    if ws != world:
        raise AssertionError(f"{name} ran on {ws} process(es); this cell needs {world}")
    if world > 1:
        want = "MULTI_GPU" if backend == "nccl" else "MULTI_CPU"
        if run.get("distributed_type") != want:
            raise AssertionError(f"{name} ran as {run.get('distributed_type')!r}; the reference run is DDP ({want}: "
                                 "benchmarks/accelerate/ddp.yaml)")
    cfg, exp = run["config"], dict(expect or {})
    env_want = exp.pop("env", {})
    want_cfg = {"preset": sizes.model, "seq": sizes.seq_len, "steps": sizes.steps, "warmup": sizes.warmup,
                "bf16": sizes.bf16, "compile": sizes.compile, "batch_per_device": sizes.batch_per_device,
                "grad_accum": 1, "no_sync_accum": False, **exp}
    wrong = [f"{k}={cfg.get(k)!r} (expected {v!r})" for k, v in want_cfg.items() if cfg.get(k) != v]
    if wrong:
        raise AssertionError(f"{name} is not the run this cell asks for: {', '.join(wrong)}")
    env = run.get("env") or {}
    for k, v in env_want.items():
        if str(env.get(k)) != v:
            raise AssertionError(f"{name} ran without {k}={v} (its environment has {k}={env.get(k)!r})")
    ranks = run["per_rank"]
    if not isinstance(ranks, list) or len(ranks) != world:
        raise AssertionError(f"{name} has {len(ranks) if isinstance(ranks, list) else 'no'} per-rank results for {world} ranks")
    tokens_per_step = sizes.seq_len * want_cfg["batch_per_device"] * want_cfg["grad_accum"]
    checks.assert_close(run.get("tokens_per_step_per_device"), tokens_per_step, f"{name} tokens per step per device", rel=0)
    tps = []
    for r in ranks:
        steps = checks.as_number(r.get("steps"), f"{name} rank {r.get('rank')} steps")
        total = checks.assert_positive(r.get("total_s"), f"{name} rank {r.get('rank')} total_s")
        if steps != sizes.steps:
            raise AssertionError(f"{name} rank {r.get('rank')} measured {steps:g} steps, the run asked for {sizes.steps}")
        t = checks.assert_positive(r.get("tokens_per_s"), f"{name} rank {r.get('rank')} tokens_per_s")
        checks.assert_close(t, steps * tokens_per_step / total, f"{name} rank {r.get('rank')} tokens/s (its tokens over its "
                            "measured time)", rel=REL)
        tps.append(t)
    checks.assert_close(run.get("tokens_per_s_per_device"), statistics.fmean(tps),
                        f"{name} tokens_per_s_per_device (the mean over its ranks)", rel=REL)
    if measure_comm:
        shares = []
        for r in ranks:
            med = checks.assert_positive(r.get("median_ms"), f"{name} rank {r.get('rank')} median_ms")
            nos = checks.assert_positive(r.get("nosync_median_ms"), f"{name} rank {r.get('rank')} nosync_median_ms "
                                         "(run it with measure_comm=True)")
            s = checks.as_number(r.get("exposed_comm_share"), f"{name} rank {r.get('rank')} exposed_comm_share")
            checks.assert_close(s, max(0.0, 1.0 - nos / med), f"{name} rank {r.get('rank')} exposed_comm_share "
                                "(1 - nosync median / median)", rel=REL, abs_tol=1e-12)
            shares.append(s)
        checks.assert_close(run.get("exposed_comm_share"), max(shares), f"{name} exposed_comm_share (the worst rank's)",
                            rel=REL, abs_tol=1e-12)
        if not 0 <= max(shares) < 1:
            raise AssertionError(f"{name} exposed_comm_share = {max(shares):.3g}: a share of the step is in [0, 1)")
    return run


def efficiency_ok(efficiency: Any, one: dict, many: dict, kind: str, min_efficiency: float) -> float:
    """The learner's efficiency is per-device N over one device, physically possible, and
    at least the tier's minimum."""
    eff = checks.as_number(efficiency, "scaling_efficiency")
    want = many["tokens_per_s_per_device"] / one["tokens_per_s_per_device"]
    checks.assert_close(eff, want, "scaling_efficiency (per-device tokens/s at N over tokens/s on one)", rel=REL)
    cap = EFFICIENCY_CAP[kind]
    if eff > cap:
        raise AssertionError(
            f"scaling_efficiency = {eff:.3g}: above {cap}, not physically possible here. Under DDP each of the "
            "N devices does the one device's work plus a gradient all-reduce, so its throughput cannot beat one "
            "device's (beyond measurement noise); run both measurements again, unchanged")
    if eff < min_efficiency:
        raise AssertionError(f"scaling_efficiency = {eff:.3g}, below the {min_efficiency:g} this device tier expects "
                             "for the reference DDP run")
    return eff


def allreduce_ok(result: Any, name: str, world: int | None = None, backend: str | None = None) -> list[dict]:
    """The all-reduce table is ``benchmarks/allreduce.py``'s, each row's bandwidths follow
    from its bytes and time (nccl-tests' definitions); returns the rows by size."""
    if not isinstance(result, dict) or not isinstance(result.get("results"), list) or not result["results"]:
        raise AssertionError(f"{name} must be the dict that phase2.run_allreduce returned (benchmarks/allreduce.py's JSON)")
    n = result.get("world_size")
    if world is not None and n != world:
        raise AssertionError(f"{name} ran on {n} ranks; this cell needs {world}")
    if backend is not None and result.get("backend") != backend:
        raise AssertionError(f"{name} ran over {result.get('backend')!r}; on this machine the all-reduce runs over {backend!r}")
    if not isinstance(n, int) or n < 2:
        raise AssertionError(f"{name}: an all-reduce needs 2 or more ranks, the table has {n!r}")
    factor = 2 * (n - 1) / n
    rows = sorted(result["results"], key=lambda r: r.get("bytes", 0))
    for r in rows:
        b = checks.assert_positive(r.get("bytes"), f"{name} bytes")
        t = checks.assert_positive(r.get("time_us"), f"{name} time_us at {b:g} bytes")
        checks.assert_close(r.get("algbw_gbs"), b / (t * 1e-6) / 1e9, f"{name} algbw_gbs at {b:g} bytes (bytes / time)",
                            rel=REL)
        alg = r["algbw_gbs"]
        checks.assert_close(r.get("busbw_gbs"), alg * factor, f"{name} busbw_gbs at {b:g} bytes (algbw x 2(n-1)/n)", rel=REL)
    return rows


def link_ceiling(gpu_name: str) -> Any:
    """The usual GPU-to-GPU link of this card (``utils.distributed.link_peak``), or None."""
    from utils.distributed import link_peak

    try:
        return link_peak(gpu_name)
    except ValueError:
        return None


def explanation_ok(explanation: Any, efficiency: float, comm_share: float, breaks: dict) -> str:
    """EXPLANATION names the numbers it explains, the cause they give and the worst break."""
    keys = {"efficiency", "exposed_comm_share", "dominant_cause", "worst_break"}
    if not isinstance(explanation, dict) or set(explanation) != keys:
        raise AssertionError(f"EXPLANATION must be a dict with exactly the keys {', '.join(sorted(keys))}")
    checks.assert_close(explanation["efficiency"], efficiency, "EXPLANATION['efficiency'] (your scaling_efficiency)", rel=REL)
    checks.assert_close(explanation["exposed_comm_share"], comm_share, "EXPLANATION['exposed_comm_share'] (your comm_share)",
                        rel=REL, abs_tol=1e-12)
    cause = checks.as_label(explanation["dominant_cause"], CAUSES, "EXPLANATION['dominant_cause']")
    want = reference_cause(efficiency, comm_share)
    if cause != want:
        loss = 1 - efficiency
        raise AssertionError(
            f"EXPLANATION['dominant_cause'] = {cause!r}, but your measurements say {want!r}: efficiency {efficiency:.3f} "
            f"(a loss of {loss:.3f}), exposed communication {comm_share:.3f} of the step"
            + ("" if loss < NEAR_LINEAR else f" ({'at least' if comm_share >= loss / 2 else 'less than'} half the loss)"))
    shares = {k: checks.as_number(v.get("exposed_comm_share"), f"BREAKS[{k!r}] exposed_comm_share") for k, v in breaks.items()}
    worst = max(shares, key=shares.get)
    if explanation["worst_break"] != worst:
        raise AssertionError(f"EXPLANATION['worst_break'] = {explanation['worst_break']!r}, but of your BREAKS "
                             f"{worst!r} exposed the most communication ({shares[worst]:.3f} of the step)")
    return cause


# -- gradient synchronization by hand (benchmarks/grad_sync.py) -------------------------------------

def sync_versions_ok(run: dict, name: str) -> None:
    """Every learner version's gradients equal DDP's and its all-reduce calls are its kind."""
    from utils.grad_sync import version_problems

    problems = version_problems(run)
    if problems:
        raise AssertionError(f"{name}: " + "; ".join(problems))


def sync_run_ok(run: Any, name: str, sizes, backend: str, world: int, *, versions: bool = True) -> dict:
    """``run`` is a ``benchmarks/grad_sync.py`` result at the tier's sizes (``sizes``:
    ``utils.grad_sync.SyncSizes``) on ``world`` ranks over ``backend``; its ratios follow from its
    medians; with ``versions``, every version is right (:func:`sync_versions_ok`)."""
    from utils.grad_sync import LEARNER_VERSIONS, VERSIONS, exposed_share, vs_ddp

    if not isinstance(run, dict) or run.get("benchmark") != "grad_sync" or not isinstance(run.get("versions"), dict):
        raise AssertionError(f"{name} must be the dict that launch.run_grad_sync returned (benchmarks/grad_sync.py's JSON)")
    if run.get("world_size") != world or run.get("backend") != backend:
        raise AssertionError(f"{name} ran on {run.get('world_size')} ranks over {run.get('backend')!r}; here the runs are "
                             f"{world} ranks over {backend!r}")
    cfg = run.get("config") or {}
    want = {"preset": sizes.preset, "batch": sizes.batch, "seq": sizes.seq, "steps": sizes.steps, "warmup": sizes.warmup,
            "bucket_mb": sizes.bucket_mb, "dtype": "float32"}
    wrong = [f"{k}={cfg.get(k)!r} (expected {v!r})" for k, v in want.items() if cfg.get(k) != v]
    if wrong:
        raise AssertionError(f"{name} is not the run this cell asks for: {', '.join(wrong)}")
    for v in VERSIONS:
        t = run["versions"].get(v) or {}
        checks.assert_positive(t.get("median_ms"), f"{name} {v} median_ms")
        if t.get("runs") != sizes.steps:
            raise AssertionError(f"{name} {v} timed {t.get('runs')} steps, the run asks for {sizes.steps}")
        checks.assert_close(t["median_ms"], max(t.get("per_rank_median_ms") or [0]), f"{name} {v} median_ms (its slowest "
                            "rank's)", rel=REL)
    for v, want_v in vs_ddp(run).items():
        checks.assert_close((run.get("vs_ddp") or {}).get(v), want_v, f"{name} vs_ddp[{v!r}] (DDP's median over its own)", rel=REL)
    for v in LEARNER_VERSIONS:
        checks.assert_close((run.get("exposed_comm_share") or {}).get(v), exposed_share(run, v),
                            f"{name} exposed_comm_share[{v!r}] (1 - none's median over its own)", rel=REL, abs_tol=1e-12)
    if versions:
        sync_versions_ok(run, name)
    return run


def sync_vs_ddp_ok(vs: Any, run: dict) -> dict:
    """``SYNC_VS_DDP``: each learner version's DDP median over its own median, from ``run``."""
    from utils.grad_sync import LEARNER_VERSIONS, vs_ddp

    if not isinstance(vs, dict) or set(vs) != set(LEARNER_VERSIONS):
        raise AssertionError(f"SYNC_VS_DDP must be a dict with exactly the keys {', '.join(LEARNER_VERSIONS)}")
    want = vs_ddp(run)
    for v in LEARNER_VERSIONS:
        checks.assert_close(vs[v], want[v], f"SYNC_VS_DDP[{v!r}] (DDP's median step over {v}'s, from SYNC)", rel=REL)
    return {v: float(vs[v]) for v in LEARNER_VERSIONS}


def sync_explanation_ok(explanation: Any, run: dict) -> str:
    """``SYNC_EXPLANATION`` is the rule's answer on ``run``'s medians (``utils.grad_sync.explanation``)."""
    from utils.grad_sync import GAP_CAUSES, LEARNER_VERSIONS
    from utils.grad_sync import explanation as reference

    want = reference(run)
    if not isinstance(explanation, dict) or set(explanation) != set(want):
        raise AssertionError(f"SYNC_EXPLANATION must be a dict with exactly the keys {', '.join(sorted(want))}")
    checks.as_label(explanation["fastest"], LEARNER_VERSIONS, "SYNC_EXPLANATION['fastest']")
    if explanation["fastest"] != want["fastest"]:
        raise AssertionError(f"SYNC_EXPLANATION['fastest'] = {explanation['fastest']!r}, but in SYNC {want['fastest']!r} has "
                             "the shortest median step")
    checks.assert_close(explanation["each_comm_share"], want["each_comm_share"], "SYNC_EXPLANATION['each_comm_share'] (1 - "
                        "none's median over each's)", rel=REL, abs_tol=1e-12)
    checks.assert_close(explanation["each_vs_ddp"], want["each_vs_ddp"], "SYNC_EXPLANATION['each_vs_ddp'] (DDP's median over "
                        "each's)", rel=REL)
    cause = checks.as_label(explanation["cause"], GAP_CAUSES, "SYNC_EXPLANATION['cause']")
    if cause != want["cause"]:
        t = {v: run["versions"][v]["median_ms"] for v in ("none", "ddp", "each")}
        raise AssertionError(f"SYNC_EXPLANATION['cause'] = {cause!r}, but your medians say {want['cause']!r}: each "
                             f"{t['each']:.4g} ms, DDP {t['ddp']:.4g} ms, no synchronization {t['none']:.4g} ms")
    return cause


def _recorded_sync():
    rec, _ = checks.open_record()
    from utils.grad_sync import sizes as sync_sizes

    _record_sizes(rec, "sync_vs_ddp")  # the tier is the record's GPU's
    m = rec.measurements["sync_vs_ddp"]
    run, vs, expl = checks.recorded(rec, "sync_vs_ddp", "run", "vs_ddp", "explanation")[1:]
    sync_run_ok(run, "the recorded gradient-sync run", sync_sizes(m.extra.get("tier")), m.extra.get("backend"),
                m.extra.get("nproc"))
    return run, vs, expl


def sync_speed_record() -> None:
    run, vs, _ = _recorded_sync()
    mine = sync_vs_ddp_ok(vs, run)
    checks.record_ok("speed against DDP: " + ", ".join(f"{v} {x:.3g}" for v, x in mine.items()))


def sync_explanation_record() -> None:
    run, _, expl = _recorded_sync()
    cause = sync_explanation_ok(expl, run)
    checks.record_ok(f"the gap's cause {cause!r} follows from the recorded medians")


# -- writing -----------------------------------------------------------------------------------

_RUN_KEYS = ("world_size", "distributed_type", "mixed_precision", "config", "tokens_per_step_per_device",
             "tokens_per_s_per_device", "total_tokens_per_s", "exposed_comm_share", "scaling_efficiency",
             "peak_allocated_gib_per_rank", "flops_per_token", "peak_tflops", "peak_dtype")
_RANK_KEYS = ("rank", "tokens_per_s", "steps", "total_s", "median_ms", "p20_ms", "p80_ms", "nosync_median_ms",
              "exposed_comm_share", "peak_allocated_gib")


def slim_run(run: dict) -> dict:
    """A run without its step-time lists: what the record keeps."""
    out = {k: run[k] for k in _RUN_KEYS if k in run}
    out["env"] = {k: v for k, v in (run.get("env") or {}).items() if k.startswith("NCCL_")}
    out["per_rank"] = [{k: r[k] for k in _RANK_KEYS if k in r} for r in run.get("per_rank", [])]
    return out


_NEEDED = ("PLAN", "allreduce", "BUSBW_GBS", "SYNC", "SYNC_VS_DDP", "SYNC_EXPLANATION", "one", "many", "scaling_efficiency", "comm_share", "BREAKS", "EXPLANATION")


def save_record(ns: dict, path: str | Path | None = None):
    """Write the notebook's measurements, read by name from ``ns`` (its ``globals()``)."""
    from utils.env import smoke_mode
    from utils.record import Record

    missing = [k for k in _NEEDED if k not in ns]  # inline: callable before ``checks`` is set
    if missing:
        raise NameError(f"run every cell above first: {', '.join(missing)} not defined")
    plan = ns["PLAN"]
    setting = {"backend": plan.backend, "nproc": plan.nproc, "n_gpus": plan.n_gpus, "tier": plan.tier}
    rec = Record.new()
    ar = ns["allreduce"]
    rec.add("busbw_gbs", ns["BUSBW_GBS"], "GB/s", "benchmarks/allreduce.py (nccl-tests busbw)", None, rows=ar["results"],
            world_size=ar["world_size"], allreduce_backend=ar["backend"], link=ar.get("link"), dtype=ar.get("dtype"),
            **setting)
    sync = {k: v for k, v in ns["SYNC"].items() if k not in ("fingerprint", "file")}
    rec.add("sync_vs_ddp", ns["SYNC_VS_DDP"]["overlapped"], "fraction", "DDP's median step over the overlapped version's "
            "(benchmarks/grad_sync.py)", None, run=sync, vs_ddp=ns["SYNC_VS_DDP"], explanation=ns["SYNC_EXPLANATION"],
            **setting)
    rec.add("scaling_efficiency", ns["scaling_efficiency"], "fraction", "per-device tokens/s at N over 1 (accelerate launch)",
            None, one=slim_run(ns["one"]), many=slim_run(ns["many"]), comm_share=ns["comm_share"], **setting)
    rec.add("exposed_comm_share", ns["comm_share"], "fraction", "1 - t_nosync/t_sync (train_multi_gpu.py --measure-comm)",
            None, breaks={k: slim_run(v) for k, v in ns["BREAKS"].items()}, explanation=ns["EXPLANATION"], **setting)
    rec.save(Path(path) if path else checks.record_path(PHASE, smoke_mode()))
    return rec


# -- grading the record ------------------------------------------------------------------------

def _record_sizes(rec, name: str):
    """The sizes the record's run used: its tier's, and the tier must be its GPU's."""
    from utils.env import phase_sizes
    from utils.tier_plan import fingerprint_tier

    m = rec.measurements.get(name)
    if m is None:
        raise AssertionError(f"the record has no measurement {name!r}: run the whole notebook before saving it")
    backend, tier = m.extra.get("backend"), m.extra.get("tier")
    fp = rec.fingerprint
    want = fingerprint_tier(fp) if backend == "nccl" else "cpu"  # one GPU: the multi-process runs were CPU processes
    if tier != want:
        raise AssertionError(f"the record's runs used the {tier!r} sizes; a {fp.get('name')} run over {backend} uses {want!r}")
    return phase_sizes(PHASE, tier), backend, ("gpu" if backend == "nccl" else "cpu")


def allreduce_record() -> None:
    rec, spec = checks.open_record()
    sizes, backend, _ = _record_sizes(rec, "busbw_gbs")
    v, rows, world, rec_backend = checks.recorded(rec, "busbw_gbs", "rows", "world_size", "allreduce_backend")
    if rec_backend != backend:
        raise AssertionError(f"the record's all-reduce ran over {rec_backend!r}, its runs over {backend!r}")
    rows = allreduce_ok({"results": rows, "world_size": world, "backend": rec_backend}, "the recorded all-reduce")
    checks.assert_close(v, rows[-1]["busbw_gbs"], "recorded BUSBW_GBS (the largest message's)", rel=REL)
    link = link_ceiling(spec.name) if backend == "nccl" else None
    if link is not None:
        checks.assert_not_above(v, link.per_direction_gbs, "recorded BUSBW_GBS", "GB/s",
                                f"the {link.name} peak per direction")
    checks.record_ok(f"bus bandwidth {v:.4g} GB/s at {rows[-1]['bytes']:,} bytes on {world} ranks")


def _plausible_throughput(run: dict, spec) -> None:
    from utils.flops import flops_per_token_from_config
    from utils.models import preset_config

    cfg = run["config"]
    with checks.quiet():
        fpt = flops_per_token_from_config(preset_config(str(cfg["preset"])), int(cfg["seq"]))
    peak = spec.peak_tflops("bf16") if cfg.get("bf16") else max(p for p in (spec.fp32_tflops, spec.tf32_tflops) if p)
    checks.assert_not_above(run["tokens_per_s_per_device"] * fpt / 1e12, peak, "recorded tokens/s per device x FLOPs per "
                            "token", "TFLOP/s", f"the {spec.name} datasheet peak")


def scaling_record() -> None:
    rec, spec = checks.open_record()
    sizes, backend, kind = _record_sizes(rec, "scaling_efficiency")
    eff, one, many, share, nproc = checks.recorded(rec, "scaling_efficiency", "one", "many", "comm_share", "nproc")
    run_ok(one, "the recorded 1-device run", sizes, backend, 1)
    run_ok(many, "the recorded N-device run", sizes, backend, nproc, measure_comm=True)
    if nproc < 2:
        raise AssertionError(f"the record's N-device run has {nproc} process(es): scaling needs 2 or more")
    efficiency_ok(eff, one, many, kind, sizes.min_efficiency)
    checks.assert_close(share, many["exposed_comm_share"], "recorded comm_share", rel=REL, abs_tol=1e-12)
    if backend == "nccl":
        for run in (one, many):
            _plausible_throughput(run, spec)
    checks.record_ok(f"scaling efficiency {eff:.3f} on {nproc} devices, exposed communication {share:.3f}")


def breaks_record() -> dict:
    rec, _ = checks.open_record()
    sizes, backend, _ = _record_sizes(rec, "exposed_comm_share")
    breaks, nproc = checks.recorded(rec, "exposed_comm_share", "breaks", "nproc")[1:]
    breaks_ok(breaks, sizes, backend, nproc)
    checks.record_ok(f"{len(breaks)} break(s): " + ", ".join(f"{k} {v['exposed_comm_share']:.3f}" for k, v in breaks.items()))
    return breaks


def breaks_ok(breaks: Any, sizes, backend: str, nproc: int) -> None:
    if not isinstance(breaks, dict) or not breaks:
        raise AssertionError(f"BREAKS must map at least one scenario ({', '.join(SCENARIOS)}) to its run")
    for scenario, run in breaks.items():
        checks.as_label(scenario, SCENARIOS, "each BREAKS key")
        if scenario == "p2p_disabled" and backend != "nccl":
            raise AssertionError("p2p_disabled needs NCCL between GPUs: NCCL_P2P_DISABLE changes nothing over gloo; "
                                 "on this machine run small_batch or accum_without_no_sync")
        run_ok(run, f"BREAKS[{scenario!r}]", sizes, backend, nproc, measure_comm=True,
               expect=scenario_config(scenario, sizes))


def explanation_record() -> None:
    rec, _ = checks.open_record()
    eff, share = checks.recorded(rec, "scaling_efficiency")[0], checks.recorded(rec, "exposed_comm_share")[0]
    _, breaks, explanation = checks.recorded(rec, "exposed_comm_share", "breaks", "explanation")
    cause = explanation_ok(explanation, eff, share, breaks)
    checks.record_ok(f"dominant cause {cause!r} follows from efficiency {eff:.3f} and exposed communication {share:.3f}")
