"""The checks the hidden tests of phase 2 (``02_multi_gpu``) run.

The memory-per-GPU and bus-bandwidth functions are checked exactly against
``utils.distributed``, and the memory function against the bytes each rank held in the
grader's own DDP, ZeRO-1 and FSDP2 run (``utils.zero_memory``) within the shard remainder;
the bus bandwidth and the scaling efficiency and exposed communication share are re-measured
by the grader's own launches (``utils.launch``, the runner the notebook uses; sizes from
``utils.env``, not from the notebook) within a band;
every run is checked for being the asked-for configuration and internally consistent
(:mod:`grader.phase2_records`), and nothing may be above what is physically possible (an
efficiency above 1, a bus bandwidth above the link). The breaks and the explanation are
checked against the learner's measured numbers, which the scaling check re-measures. With no
GPU here and a GPU record submitted, the measured cells grade the record (docs/grading.md).
Hidden tests get this module from ``grader.phase(2)``, with fresh copies of ``checks.py`` and
``phase2_records.py`` (``grader/__init__.py``).
"""
from __future__ import annotations

import os
import shutil
import tempfile

from grader import checks, remeasure  # grader.phase(2) rebinds these to fresh copies: use them at call time only
from grader import phase2_records as records

PHASE = "02_multi_gpu"
# runs, 70B shape, sync rules, the sharded run's bytes
EXTRA_MODULES = ("utils.launch", "utils.model_shapes", "utils.scaling_breaks", "utils.grad_sync", "utils.zero_memory")
CONSTANT_MODULES = ("utils.scaling_breaks", "utils.grad_sync", "utils.zero_memory")  # names and thresholds the rules read
STAGES = ("ddp", "zero1", "zero2", "zero3")
# (weights, gradients, optimizer) bytes per parameter: mixed-precision Adam, fp32 Adam, fp32 gradients beside bf16
# weights, bf16 Adam state, an 8-bit optimizer
MEMORY_WIDTHS = ((2, 2, 12), (4, 4, 8), (2, 4, 12), (2, 2, 4), (1, 2, 6))
# The grader's sharded run: widths the notebook does not show (odd, so no shard divides evenly), layers of similar
# size, so that ZeRO-1's whole-tensor split (off by up to half the largest tensor on 2 ranks) stays below the
# 2 bytes per parameter that a wrong byte width or stage costs
ZERO_LAYERS = (72, 97, 95, 93, 91, 11)
GPU_MEMORY_GB = 80  # the 70B exercise: 80 GB cards (H100/A100 80GB)
WEIGHT_SHARE = 0.8  # rule of thumb: weights may take 80% of the card, the rest is KV cache/activations/workspace
TP_DEGREES = (1, 2, 4, 8)  # tensor parallelism stays inside one 8-GPU node (NVLink)
# |yours - grader's| for a scaling efficiency or a share of the step, measured twice: a few % on a
# GPU (clocks, NCCL's ring setup); CPU processes share two cores with the notebook and the grader
FRACTION_BAND = {"gpu": 0.12, "cpu": 0.5}
ATTEMPTS = 2  # a re-measurement outside the band is taken once more (each one is several launches)
SYNC_SEED = 7  # the grader's gradient-sync run: other weights and batches than the notebook's seed 0
REL = 1e-9  # pure arithmetic: the same formula up to operation order


# -- where the grader's runs go -------------------------------------------------------------------

def _grader_plan():
    """This machine's ``utils.launch.Plan``, its runs in a scratch folder of this process
    (removed after each check)."""
    from utils.launch import plan

    return plan(os.path.join(tempfile.gettempdir(), f"gpulab-phase2-grader-{os.getpid()}"))


def _where(p) -> str:
    if p.backend == "nccl":
        import torch

        return f"{p.nproc} x {torch.cuda.get_device_name(0)}"
    return "2 CPU processes over gloo (" + ("one GPU: scaling across GPUs cannot be measured; " if p.n_gpus == 1
                                            else "smoke mode: ") + "plumbing, lenient bands)"


# -- grading helpers ------------------------------------------------------------------------------

def untampered() -> None:
    """:func:`checks.assert_untampered`: clocks and every ``utils`` module the checks use
    (``utils.distributed`` holds the reference arithmetic, ``utils.launch`` runs the grader's launches)."""
    checks.assert_untampered(EXTRA_MODULES)
    checks.assert_constants_unchanged(CONSTANT_MODULES)


def _begin(what: str, p, remeasured: bool = True) -> str:
    """Say how this cell is graded (first, so a failing cell says it too); returns the mode."""
    how = "re-measured by the grader in this run" if remeasured else "checked on the results of this run"
    return checks.begin(what, how, where=_where(p))


def _assert_near(value: float, reference: float, band: float, name: str) -> None:
    if abs(value - reference) > band:
        raise AssertionError(f"{name} = {value:.3f}, but the grader re-measured {reference:.3f} in this run; accepted "
                             f"{reference - band:.3f} to {reference + band:.3f} (+-{band:g})")


def _quiet_launch(fn, *args, **kwargs):
    """The grader's own launch (a ``utils.launch`` runner), its output kept out of the cell; a run
    that fails (a timeout on a loaded machine, a port taken) is the grader's, :class:`checks.Unusable`."""
    try:
        with checks.quiet():
            return fn(*args, verbose=False, **kwargs)
    except RuntimeError as exc:
        raise checks.Unusable(f"the grader's own run failed: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


# -- 1. memory per GPU ----------------------------------------------------------------------------

def check_memory(memory_per_gpu_gb) -> None:
    """Exact against ``utils.distributed.memory_per_gpu`` (ZeRO paper): its defaults (mixed-precision
    Adam, 2 + 2 + 12 bytes per parameter), then the byte widths of :data:`MEMORY_WIDTHS` passed as
    ``weight_bytes, grad_bytes, optim_bytes``."""
    from utils.distributed import memory_per_gpu

    for n in (1, 124_439_808, 1_100_048_384, 7_500_000_000, 70_553_706_496):
        for d in (1, 2, 8, 64, 1000):
            for stage in STAGES:
                got = checks.call(memory_per_gpu_gb, n, d, stage, name="memory_per_gpu_gb")
                checks.assert_close(got, memory_per_gpu(n, d, stage)["total_gb"], f"memory_per_gpu_gb({n}, {d}, {stage!r})",
                                    rel=REL)
    for w, g, o in MEMORY_WIDTHS:
        for n in (1, 124_439_808, 7_500_000_000):
            for d in (1, 2, 64):
                for stage in STAGES:
                    got = checks.call(memory_per_gpu_gb, n, d, stage, w, g, o, name="memory_per_gpu_gb")
                    want = memory_per_gpu(n, d, stage, param_bytes=w, grad_bytes=g, optimizer_bytes_per_param=o)["total_gb"]
                    checks.assert_close(got, want, f"memory_per_gpu_gb({n}, {d}, {stage!r}, {w}, {g}, {o})", rel=REL)


def _zero_run(p) -> dict:
    """The grader's own sharded run of :data:`ZERO_LAYERS` (``utils.zero_memory``); one that is not
    the run asked for is the grader's, :class:`checks.Unusable`."""
    from utils import zero_memory

    res = _quiet_launch(zero_memory.run, p, None, ZERO_LAYERS, "grader_zero_memory")
    bad = zero_memory.run_problems(res, ZERO_LAYERS, p.nproc, p.backend)
    if bad:
        raise checks.Unusable("the grader's own sharded run is not the one asked for: " + "; ".join(bad[:3]))
    return res


def check_zero_memory(memory_per_gpu_gb) -> dict | None:
    """Always live, on CPU processes where there is no GPU: the grader launches its own DDP, ZeRO-1
    and FSDP2 run of a model the notebook does not show (:data:`ZERO_LAYERS`) and every rank counts
    the bytes it holds after one AdamW step (``utils.zero_memory``); then :func:`zero_memory_ok`.
    Returns the grader's run (None where a loaded machine left it unusable)."""
    p = _grader_plan()
    where = _where(p).split(" (")[0]  # no band here: bytes held are exact on CPU processes too
    checks.say(f"{checks.LIVE} on {where}: your memory_per_gpu_gb against the bytes each rank held in the grader's "
               "own DDP, ZeRO-1 and FSDP2 run of a model the notebook does not show")
    untampered()
    try:
        res = remeasure.agree(lambda: _zero_run(p), 1)  # bytes held do not vary: only a failed launch is tried again
    finally:
        shutil.rmtree(p.work, ignore_errors=True)
    if res is not None:
        zero_memory_ok(memory_per_gpu_gb, res)
    return res


def zero_memory_ok(memory_per_gpu_gb, res: dict) -> None:
    """For each measured stage and rank of the sharded run ``res``: ``memory_per_gpu_gb`` with the
    run's byte widths, in bytes, within :func:`utils.zero_memory.remainder_bytes` of the bytes the
    rank held (0 for DDP; half the largest tensor's optimizer state for ZeRO-1 on 2 ranks; the
    rows FSDP2 rounds up, per parameter, for stage 3), plus float rounding (``REL``)."""
    from utils import zero_memory

    w, n, world = res["bytes_per_param"], res["n_params"], res["world_size"]
    widths = (w["weights"], w["grads"], w["optimizer"])
    said = []
    for stage in zero_memory.STAGES:
        tol = zero_memory.remainder_bytes(res["param_shapes"], world, stage, w)
        got = checks.as_number(checks.call(memory_per_gpu_gb, n, world, stage, *widths, name="memory_per_gpu_gb"),
                               f"memory_per_gpu_gb({n}, {world}, {stage!r}, {', '.join(map(str, widths))})") * 1e9
        for r in res["stages"][stage]:
            held = r["total_bytes"]
            if abs(got - held) > tol + REL * held:
                raise AssertionError(
                    f"memory_per_gpu_gb({n}, {world}, {stage!r}, {', '.join(map(str, widths))}) = {got / 1e9:.6g} GB "
                    f"({got:,.0f} bytes), but rank {r['rank']} of the grader's {stage} run held {held:,} bytes (weights "
                    f"{r['weights_bytes']:,}, gradients {r['grads_bytes']:,}, optimizer state {r['optimizer_bytes']:,}); "
                    f"its shards allow {tol:,.0f} bytes either way")
        held_all = ", ".join(f"{r['total_bytes']:,}" for r in res["stages"][stage])
        said.append(f"{stage}: predicted {got:,.0f}, held {held_all} (+-{tol:,.0f})")
    checks.say(f"  {n:,} parameters on {world} ranks, {' + '.join(map(str, widths))} bytes each: " + "; ".join(said))


def check_busbw(bus_bandwidth_gbs) -> None:
    """Exact against nccl-tests' definitions in ``utils.distributed``."""
    from utils.distributed import algbw_gbs, busbw_gbs

    for size in (4096, 2**20, 16 * 2**20, 2**30):
        for t_us in (12.5, 980.0, 3283.0):
            for n in (1, 2, 4, 8, 64):
                want = busbw_gbs(algbw_gbs(size, t_us * 1e-6), n)
                got = checks.call(bus_bandwidth_gbs, size, t_us, n, name="bus_bandwidth_gbs")
                checks.assert_close(got, want, f"bus_bandwidth_gbs({size}, {t_us}, {n})", rel=REL, abs_tol=1e-12)


# -- 2. the all-reduce, re-measured ---------------------------------------------------------------

def check_allreduce(allreduce, busbw) -> None:
    """The learner's table is the plan's, consistent; BUSBW_GBS is its largest message's bus
    bandwidth, within a band of the grader's own run and below the link's peak."""
    from utils.launch import run_allreduce

    p = _grader_plan()
    if _begin("all-reduce bus bandwidth", p) == checks.RECORD:
        return records.allreduce_record()
    untampered()
    rows = records.allreduce_ok(allreduce, "allreduce", p.nproc, p.backend)
    want_sizes = sorted(int(x) for x in _sizes_bytes(p.sizes.allreduce_sizes))
    if [r["bytes"] for r in rows] != want_sizes:
        raise AssertionError(f"allreduce measured {[r['bytes'] for r in rows]} bytes; run launch.run_allreduce(PLAN) "
                             f"for the plan's sizes {p.sizes.allreduce_sizes}")
    mine = checks.as_number(busbw, "BUSBW_GBS")
    checks.assert_close(mine, rows[-1]["busbw_gbs"], "BUSBW_GBS (the largest message's bus bandwidth)", rel=1e-6)

    def compare():
        ref = _quiet_launch(run_allreduce, p)
        ref_bw = records.allreduce_ok(ref, "the grader's all-reduce", p.nproc, p.backend)[-1]["busbw_gbs"]
        # gloo between CPU processes is at the scheduler's mercy (x5 between runs seen on a busy
        # 2-core machine): x4 either way there, the widest smoke band; 35% on GPUs
        rel = checks.band(smoke_mode=True, floor=checks.SMOKE_BAND_CAP) if p.backend == "gloo" else checks.band(smoke_mode=False)
        link = ref.get("link")
        if link:
            checks.assert_not_above(mine, link["per_direction_gbs"], "BUSBW_GBS", "GB/s", f"the {link['name']} peak per direction")
        checks.assert_in_band(mine, ref_bw, rel, "BUSBW_GBS", "GB/s")
        checks.say(f"  bus bandwidth at {rows[-1]['bytes']:,} bytes: grader {ref_bw:.4g} GB/s, yours {mine:.4g} GB/s "
                   f"(band +-{100 * rel:.0f}%)" + (f"; link peak {link['per_direction_gbs']:g} GB/s per direction" if link
                                                  else "; no link peak known for this path"))

    try:
        remeasure.agree(compare, ATTEMPTS)
    finally:
        shutil.rmtree(p.work, ignore_errors=True)


def _sizes_bytes(text: str) -> list[int]:
    from utils.distributed import parse_size_bytes

    return [parse_size_bytes(x) for x in text.split(",") if x.strip()]


# -- 3. scaling 1 -> N, re-measured ---------------------------------------------------------------

def check_scaling(one, many, scaling_efficiency, comm_share) -> None:
    """Both runs are the reference configuration and consistent; the efficiency and exposed
    communication share follow from them, are possible, meet the tier's minimum, and agree
    with the grader's own 1- and N-process runs."""
    from utils.launch import run_training

    p = _grader_plan()
    if _begin("scaling efficiency 1 -> N and exposed communication", p) == checks.RECORD:
        return records.scaling_record()
    untampered()
    s = p.sizes
    records.run_ok(one, "one", s, p.backend, 1)
    records.run_ok(many, "many", s, p.backend, p.nproc, measure_comm=True)
    eff = records.efficiency_ok(scaling_efficiency, one, many, p.kind, s.min_efficiency)
    share = checks.as_number(comm_share, "comm_share")
    checks.assert_close(share, many["exposed_comm_share"], "comm_share (many['exposed_comm_share'])", rel=1e-6, abs_tol=1e-12)
    band = FRACTION_BAND[p.kind]

    def compare():
        r1 = _quiet_launch(run_training, p, 1, "grader_one")
        rn = _quiet_launch(run_training, p, p.nproc, "grader_many", measure_comm=True)
        ref_eff = checks.usable(rn["tokens_per_s_per_device"], f"{p.nproc}-process tokens/s per device", "tokens/s") / \
            checks.usable(r1["tokens_per_s_per_device"], "1-process tokens/s", "tokens/s")
        checks.say(f"  efficiency on {p.nproc}: grader {ref_eff:.3f}, yours {eff:.3f}; exposed communication: grader "
                   f"{rn['exposed_comm_share']:.3f}, yours {share:.3f} (each +-{band:g}; at least {s.min_efficiency:g} "
                   "on this tier)")
        _assert_near(eff, ref_eff, band, "scaling_efficiency")
        _assert_near(share, rn["exposed_comm_share"], band, "comm_share")

    try:
        remeasure.agree(compare, ATTEMPTS)
    finally:
        shutil.rmtree(p.work, ignore_errors=True)


# -- 4. where scaling breaks ----------------------------------------------------------------------

def check_breaks(breaks) -> None:
    """Each run in BREAKS is its scenario's (checked from its config and environment) and
    consistent. Not re-measured: its numbers feed the explanation, which is checked against them."""
    p = _grader_plan()
    if _begin("where scaling breaks: your runs' configuration and consistency (not re-measured)", p, False) == checks.RECORD:
        records.breaks_record()
        return
    untampered()
    records.breaks_ok(breaks, p.sizes, p.backend, p.nproc)
    checks.say("  " + ", ".join(f"{k}: exposed communication {v['exposed_comm_share']:.3f}" for k, v in breaks.items()))


# -- 5. the explanation ---------------------------------------------------------------------------

def check_explanation(explanation, scaling_efficiency, comm_share, breaks) -> None:
    """The dominant cause follows from the measured efficiency and exposed communication share
    by the notebook's rule (:func:`grader.phase2_records.reference_cause`); the worst break is
    the one with the largest exposed share."""
    p = _grader_plan()
    mode = _begin("your explanation against your measured efficiency and communication share", p, False)
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    if mode == checks.RECORD:
        return records.explanation_record()
    eff = checks.as_number(scaling_efficiency, "scaling_efficiency")
    share = checks.as_number(comm_share, "comm_share")
    if not isinstance(breaks, dict) or not breaks:
        raise AssertionError("BREAKS must hold at least one run (section 4)")
    cause = records.explanation_ok(explanation, eff, share, breaks)
    checks.say(f"  efficiency {eff:.3f}, exposed communication {share:.3f}: {cause!r}, as the rule gives")


# -- 2b. gradient synchronization by hand -----------------------------------------------------------

def _sync_launch(p, fns, **kwargs) -> dict:
    """The grader's run of the learner's three versions; an error in their code is theirs
    (AssertionError), any other failed launch the grader's (:class:`checks.Unusable`)."""
    from utils.launch import run_grad_sync

    try:
        with checks.quiet():
            return run_grad_sync(p, *fns, "grader_grad_sync", verbose=False, **kwargs)
    except ValueError as exc:
        raise AssertionError(f"the sync functions cannot be run: {exc}") from None
    except RuntimeError as exc:
        line = str(exc).splitlines()[0] if str(exc) else repr(exc)
        if "grad_sync.py: error: your " in line:
            raise AssertionError(line.split("grad_sync.py: error: ", 1)[1].split("; full log")[0]) from None
        raise checks.Unusable(f"the grader's own run failed: {line}") from None


def check_grad_sync(sync_each, sync_bucketed, overlapped, sync) -> None:
    """Always live, on CPU processes where there is no GPU: the learner's run (``SYNC``) is the
    plan's and shows every version equal to DDP's gradients and of its kind; then the grader runs
    the three versions itself with other weights and batches, and ``sync_bucketed`` at a second
    bucket size too: every gradient must equal DDP's again (:func:`utils.grad_sync.version_problems`)."""
    from utils.grad_sync import sizes

    p = _grader_plan()
    checks.say(f"{checks.LIVE} on {_where(p)}: your gradient synchronization against DDP's gradients, run again by the "
               "grader with other weights, batches and a second bucket size")
    untampered()
    s = sizes(p.tier)
    records.sync_run_ok(sync, "SYNC", s, p.backend, p.nproc)

    def compare():
        ref = _sync_launch(p, (sync_each, sync_bucketed, overlapped), seed=SYNC_SEED, check_bucket_mb=s.check_bucket_mb)
        records.sync_versions_ok(ref, f"the grader's run (seed {SYNC_SEED}, buckets of {s.bucket_mb:g} and "
                                      f"{s.check_bucket_mb:g} MB)")
        checks.say("  " + ", ".join(f"{v}: worst relative difference {g['worst_rel_err']:.2g} over {g['steps_checked']} steps"
                                    for v, g in ref["grads"].items()))

    try:
        remeasure.agree(compare, 1)  # a wrong gradient is wrong every time: only a failed launch is tried again
    finally:
        shutil.rmtree(p.work, ignore_errors=True)


def check_sync_speed(sync_each, sync_bucketed, overlapped, sync, vs_ddp) -> None:
    """``SYNC_VS_DDP`` is each version's speed over DDP's in ``SYNC`` (DDP's median step over its
    own), and within a band of the grader's own run of the same versions. From a record: the
    recorded run checked the same way, not re-run."""
    from utils.grad_sync import LEARNER_VERSIONS, exposed_share, sizes
    from utils.grad_sync import vs_ddp as ref_vs_ddp

    p = _grader_plan()
    if _begin("your versions' speed against DDP", p) == checks.RECORD:
        return records.sync_speed_record()
    untampered()
    s = sizes(p.tier)
    records.sync_run_ok(sync, "SYNC", s, p.backend, p.nproc)
    mine = records.sync_vs_ddp_ok(vs_ddp, sync)
    band = FRACTION_BAND[p.kind]

    def compare():
        ref = _sync_launch(p, (sync_each, sync_bucketed, overlapped))
        records.sync_versions_ok(ref, "the grader's run")
        want = ref_vs_ddp(ref)
        t = ref["versions"]
        for v in LEARNER_VERSIONS:
            rel = checks.band(checks.mine(checks.Times(t[v])), checks.mine(checks.Times(t["ddp"])), smoke_mode=p.backend == "gloo")
            checks.say_versus(f"{v} against DDP", want[v], mine[v], "x DDP's speed", rel)
            checks.assert_in_band(mine[v], checks.usable(want[v], f"{v} against DDP", "x"), rel, f"SYNC_VS_DDP[{v!r}]",
                                  "x DDP's speed")
        share, ref_share = exposed_share(sync, "each"), exposed_share(ref, "each")
        checks.say(f"  exposed communication of the per-parameter step: grader {ref_share:.3f}, yours {share:.3f} "
                   f"(+-{band:g})")
        _assert_near(share, ref_share, band, "the per-parameter version's exposed communication share")

    try:
        remeasure.agree(compare, ATTEMPTS)
    finally:
        shutil.rmtree(p.work, ignore_errors=True)


def check_sync_explanation(explanation, sync) -> None:
    """The explanation follows from the learner's measured medians by the notebook's rule
    (:func:`utils.grad_sync.gap_cause`); the speed cell re-measures those medians."""
    p = _grader_plan()
    mode = _begin("your explanation of the gap to DDP against your measured medians", p, False)
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    if mode == checks.RECORD:
        return records.sync_explanation_record()
    from utils.grad_sync import sizes

    records.sync_run_ok(sync, "SYNC", sizes(p.tier), p.backend, p.nproc, versions=False)
    cause = records.sync_explanation_ok(explanation, sync)
    checks.say(f"  {cause!r}, as the rule gives on your medians")


# -- 6. model parallelism -------------------------------------------------------------------------

def reference_min_tp(n_params: int, n_layers: int) -> int:
    from utils.distributed import parallel_weight_bytes_per_gpu

    for tp in TP_DEGREES:
        if parallel_weight_bytes_per_gpu(n_params, n_layers, tp=tp) / 1e9 <= WEIGHT_SHARE * GPU_MEMORY_GB:
            return tp
    raise ValueError("no tensor-parallel degree up to 8 fits")


def check_parallelism(weights_per_gpu_gb, min_tp) -> None:
    """Exact against ``utils.distributed.parallel_weight_bytes_per_gpu``; MIN_TP from the
    70B shape's parameter count, counted here."""
    from utils.distributed import parallel_weight_bytes_per_gpu

    for n, layers in ((70_553_706_496, 80), (124_439_808, 12), (6_738_415_616, 32), (1_100_048_384, 22)):
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 3, 4, 8):
                for b in (2, 1, 0.5):
                    want = parallel_weight_bytes_per_gpu(n, layers, tp=tp, pp=pp, bytes_per_param=b) / 1e9
                    got = checks.call(weights_per_gpu_gb, n, layers, tp, pp, b, name="weights_per_gpu_gb")
                    checks.assert_close(got, want, f"weights_per_gpu_gb({n}, {layers}, tp={tp}, pp={pp}, bytes={b})", rel=REL)
    from utils.model_shapes import LLAMA_70B, llama_70b_params

    with checks.quiet():
        n70 = llama_70b_params()
    want = reference_min_tp(n70, LLAMA_70B["num_hidden_layers"])
    if type(min_tp) is not int or min_tp != want:
        raise AssertionError(f"MIN_TP = {min_tp!r}, but {want} is the smallest degree in {TP_DEGREES} whose bf16 weights "
                             f"({n70 / 1e9:.1f}B parameters) fit in {WEIGHT_SHARE:.0%} of an {GPU_MEMORY_GB} GB card")
