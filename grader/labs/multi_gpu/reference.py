"""Lab 02's references: the grader's own runs of the course code, on this machine, or a learner's record.

:func:`measure` (live) returns a :class:`Reference` that launches, in the grader's process after the
notebook's kernel has gone, the same course code the notebook's cells launch (``utils.parallel.launch``, the
plan of this machine, sizes from ``utils.course.env``, never the notebook's): the all-reduce benchmark
(:data:`REPEATS` times: its band comes from the spread of those runs), the reference training run
on one process and on all of them, and each scenario of section 4 a learner's ``BREAKS`` names.
Each launch happens the first time a judge asks for it and is kept in the cache the cells share on
their first try (a cell that fails its own consistency checks launches nothing). Its bands come
from the grader's runs alone: the spread of its repeats, or of each rank's step times.

Also here, for the cells judged from a harness: the grader's own sharded run of a model drawn
from a secret seed (:func:`zero_run`, ``utils.parallel.zero_memory``), the gradients the learner's
synchronization must produce, computed by the grader's own model from the same seed
(:func:`sync_expected`), and on a GPU the grader's timing of the unfused bias + GELU ops in the
harness's protocol (:func:`unfused_seconds`) and the checksum a timed section of the learner's kernel
must return (:func:`fused_checksum`).

:func:`from_record` (provisional) launches nothing: the judges check a GPU record's runs for
consistency and against the datasheet and the link, and say that nothing was re-measured.
"""
from __future__ import annotations

import dataclasses
import json
import math
import secrets
import shutil
import tempfile
import time
from typing import Any

import torch
import transformers.models.gpt2.modeling_gpt2  # noqa: F401 - loaded now: build_model imports it when called

from grader import expect
from grader.labs.multi_gpu import harness
from grader.labs.multi_gpu.sizes import BY_TIER
from utils.course.tier_plan import fingerprint_tier
from utils.parallel import launch, zero_memory
from utils.parallel.distributed import link_peak
from utils.parallel.scaling_breaks import SCENARIOS
from utils.train.fused import bias_gelu_reference

REPEATS = 2  # the grader's all-reduce runs: its band is 3x their spread (a launch is 15 to 30 s on 2 CPU cores)
# |yours - grader's| at least, for a scaling efficiency or a share of the step: a few % on GPUs (clocks, NCCL's
# ring setup); CPU processes share two cores with the notebook and the grader (the notebook says these bands)
FRACTION_FLOOR = {"gpu": 0.12, "cpu": 0.5}
FRACTION_CAP = {"gpu": 0.3, "cpu": 0.7}  # never wider, even for load: a band must be able to fail
ALLREDUCE_FLOOR = {"gpu": 0.35, "cpu": expect.SMOKE_CAP}  # relative: gloo between CPU processes is at the scheduler's mercy


@dataclasses.dataclass
class Reference:
    """What the judges compare against. ``plan``: the runs' plan (this machine's, or the record's
    GPUs'); ``live``: measured here (False: a record, nothing re-measured); ``cache``: launches
    taken so far; ``problem``: why a record cannot be judged at all (its tier is not its GPU's)."""

    ctx: Any
    plan: Any
    live: bool = True
    slowdown: float = 1.0
    cache: dict = dataclasses.field(default_factory=dict)
    problem: str = ""

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def link(self):
        """The GPUs' usual link (``utils.parallel.distributed.link_peak``), or None (CPU processes, an unknown card)."""
        if self.plan.backend != "nccl":
            return None
        try:
            return link_peak(self.ctx.device_name)
        except ValueError:
            return None

    def _launch(self, key: str, fn, *args, **kwargs) -> dict:
        if not self.live:
            raise RuntimeError("a record's reference launches nothing")  # a judge's fault: records are not re-measured
        if key not in self.cache:
            work = tempfile.mkdtemp(prefix="gpulab-02-grader-")
            try:
                self.cache[key] = fn(self.plan._replace(work=work), *args, verbose=False, **kwargs)
            except RuntimeError as exc:
                line = str(exc).splitlines()[0] if str(exc) else repr(exc)
                raise expect.Unusable(f"the grader's own run failed: {line}") from None
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return self.cache[key]

    def allreduce(self) -> list[dict]:
        """The grader's :data:`REPEATS` runs of ``benchmarks/allreduce.py`` at the plan's sizes."""
        return [self._launch(f"allreduce:{i}", launch.run_allreduce, f"grader_allreduce_{i}") for i in range(REPEATS)]

    def training(self) -> tuple[dict, dict]:
        """The grader's reference run on one process and on all of them (exposed communication measured)."""
        one = self._launch("train:1", launch.run_training, 1, "grader_one")
        many = self._launch("train:n", launch.run_training, self.plan.nproc, "grader_many", measure_comm=True)
        return one, many

    def scenario(self, name: str) -> dict:
        """The grader's run of one scenario of section 4 on all processes, exposed communication measured."""
        if name not in SCENARIOS:
            raise ValueError(name)
        s = self.plan.sizes
        kwargs = {"small_batch": {"batch_per_device": s.small_batch},
                  "accum_without_no_sync": {"batch_per_device": s.accum_batch, "grad_accum": s.grad_accum,
                                            "no_sync_accum": True},
                  "p2p_disabled": {"env": {"NCCL_P2P_DISABLE": "1"}}}[name]
        return self._launch(f"break:{name}", launch.run_training, self.plan.nproc, f"grader_{name}", measure_comm=True,
                            **kwargs)

    def fraction_band(self, spreads: list[float]) -> float:
        """The absolute band for a scaling efficiency or a share of the step: :data:`FRACTION_FLOOR`, or
        3x the grader's own relative spread where wider; widened for load; at most :data:`FRACTION_CAP`."""
        base = FRACTION_FLOOR[self.kind]
        rel = max([base] + [expect.SPREAD_FACTOR * s for s in spreads if math.isfinite(s)])
        if self.slowdown > 1:
            rel = rel * self.slowdown
        return min(FRACTION_CAP[self.kind], rel)


def _plan_of(ctx) -> Any:
    """This machine's plan (``utils.parallel.launch.plan``: smoke mode, its GPUs, its tier); each launch gets a folder of its own."""
    return launch.plan(BY_TIER, tempfile.gettempdir())


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's reference on this machine; its launches happen when a judge first asks for them,
    kept in ``cache`` (shared by the cells on their first try)."""
    return Reference(ctx, _plan_of(ctx), True, slowdown, cache)


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own: the record's GPUs (their count and tier
    from the record's fingerprint) say which runs the record must hold (provisional)."""
    fp = ctx.fingerprint or {}
    n_gpus = int(fp.get("device_count") or 1)
    plan = launch.plan_for(n_gpus, False, ctx.tier, BY_TIER, tempfile.gettempdir())
    problem = ""
    want = fingerprint_tier(fp)
    if ctx.tier != want:
        problem = (f"the record's runs used the {ctx.tier!r} sizes; a {fp.get('name')} runs the {want!r} sizes "
                   "(run the notebook on that GPU without GPULAB_TIER)")
    return Reference(ctx, plan, False, 1.0, {}, problem)


# -- the sharded run of test_zero_memory ------------------------------------------------------------

def draw_layers(rng) -> tuple[int, ...]:
    """Widths of a stack of Linear layers the notebook does not show: 5 to 7 odd widths of similar
    size (no shard divides evenly), so that ZeRO-1's whole-tensor split (off by up to the largest
    tensor's optimizer state) stays well below what a wrong byte width or stage costs."""
    while True:
        widths = tuple(rng.randrange(61, 140) | 1 for _ in range(rng.randint(5, 7)))
        shapes = zero_memory.param_shapes(widths)
        if max(math.prod(s) for s in shapes) <= zero_memory.n_params(widths) / 4:
            return widths


def zero_run(ctx, layers) -> dict:
    """The grader's own DDP, ZeRO-1 and FSDP2 run of ``layers`` on this machine's plan (``utils.parallel.zero_memory``):
    the bytes every rank held after one AdamW step. :class:`grader.expect.Unusable` when it fails or is
    not the run asked for."""
    plan = _plan_of(ctx)
    work = tempfile.mkdtemp(prefix="gpulab-02-zero-")
    try:
        res, why = None, ""
        for _ in range(2):  # a launch that failed on the machine's side is tried once more by utils.parallel.launch itself
            try:
                res = zero_memory.run(plan._replace(work=work), None, layers, "grader_zero_memory",
                                      seed=secrets.randbits(20), verbose=False)
                break
            except RuntimeError as exc:
                why = str(exc).splitlines()[0] if str(exc) else repr(exc)
        if res is None:
            raise expect.Unusable(f"the grader's own sharded run failed: {why}")
        bad = zero_memory.run_problems(res, layers, plan.nproc, plan.backend)
        if bad:
            raise expect.Unusable("the grader's own sharded run is not the one asked for: " + "; ".join(bad[:3]))
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the gradients of test_grad_sync, test_sync_speed and test_sync_explanation ------------------------

def sync_expected(cfg: dict, device: str = "cpu") -> dict:
    """The checksums (:func:`grader.labs.multi_gpu.harness.checksums`) every rank's gradients must have
    at each step of the harness's run ``cfg``: ``{"local": [step][rank], "mean": [step]}`` (the local
    gradient of each rank's own batch, and their mean over the ranks: what DDP's all-reduce leaves),
    computed by the grader's own model on ``device``, one process, no communication."""
    key = (json.dumps(cfg, sort_keys=True), device)
    if key not in _EXPECTED:
        while len(_EXPECTED) >= 4:
            _EXPECTED.pop(next(iter(_EXPECTED)))
        _EXPECTED[key] = _sync_expected(cfg, device)
    return _EXPECTED[key]


_EXPECTED: dict = {}  # sync_expected of the last few runs (a judge tried again reads the same run)


def _sync_expected(cfg: dict, device: str) -> dict:
    dev = torch.device(device)
    threads = torch.get_num_threads()
    try:
        model = harness.build_base(cfg, dev)
        named = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        weights = [w.to(dev) for w in harness.projection_weights(named, cfg["seed"], cfg["projections"])]
        vocab = model.config.vocab_size
        local, mean = [], []
        for step in range(cfg["steps"]):
            total = [torch.zeros_like(p) for p in model.parameters()]
            per_rank = []
            for rank in range(cfg["world"]):
                model.zero_grad(set_to_none=True)
                x = harness.batch(cfg, step, rank, vocab).to(dev)
                model(input_ids=x, labels=x).loss.backward()
                per_rank.append(harness.checksums(model, weights))
                with torch.no_grad():
                    for t, p in zip(total, model.parameters(), strict=True):
                        if p.grad is not None:
                            t += p.grad
            with torch.no_grad():
                for t, p in zip(total, model.parameters(), strict=True):
                    p.grad = t / cfg["world"]
            mean.append(harness.checksums(model, weights))
            local.append(per_rank)
        return {"local": local, "mean": mean, "params": [n for n, _ in named],
                "numels": [math.prod(shape) for _, shape in named]}
    finally:
        torch.set_num_threads(threads)


# -- the fused kernel's speed, on a GPU --------------------------------------------------------------

def unfused_seconds(shape, dtype: str, reps: int, calls: int, device: str = "cuda") -> list[float]:
    """The grader's timing of the unfused ops (``utils.train.fused.bias_gelu_reference``) in the harness's
    protocol (:func:`grader.labs.multi_gpu.harness.fused_kernel`): per section, inputs drawn on the
    device from a fresh seed, ``calls`` runs, the last output's weighted sum read back."""
    rows, cols = shape
    dt = getattr(torch, dtype)
    dev = torch.device(device)
    x, b = harness.device_inputs(0, rows, cols, dev, dt)
    bias_gelu_reference(x, b)  # warm
    torch.cuda.synchronize(dev) if dev.type == "cuda" else None
    out = []
    for _ in range(reps):
        seed = secrets.randbits(31)
        t0 = time.perf_counter()
        x, b = harness.device_inputs(seed, rows, cols, dev, dt)
        y = None
        for _ in range(calls):
            y = bias_gelu_reference(x, b)
        harness.weighted_sum(y, seed)
        out.append(time.perf_counter() - t0)
    return out


def fused_checksum(seed: int, shape, dtype: str, device: str = "cuda") -> tuple[float, float]:
    """The weighted sum a timed section of the fused kernel must return for ``seed``, from the unfused
    ops, and the scale its tolerance is relative to (the sum of |weight x output|)."""
    rows, cols = shape
    x, b = harness.device_inputs(seed, rows, cols, torch.device(device), getattr(torch, dtype))
    y = bias_gelu_reference(x, b)
    return harness.weighted_sum(y, seed), harness.weighted_sum(y, seed, absolute=True)
