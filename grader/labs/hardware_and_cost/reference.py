"""Lab 05's references: the grader's own measurements on this machine, or a learner's record.

:func:`measure` (live) runs, in the grader's process after the notebook's kernel has gone, the work
the notebook's locked cells set up: the big matmul and the copy (``points``), a training step of the
throughput model (``train``), greedy decode at the batch sizes the judges compare (``decode``), a
checkpoint of the checkpointed run (``checkpoint``: ``utils.train.checkpointed_run.measure_checkpoint_overhead``),
the recompilation experiment with ``utils.tpu.xla`` on the grader's own inputs (``xla``: compile counts,
compile, run and eager times), and an uninterrupted run of the course's checkpointed loop whose final
state the resumed run must match (``resume``). Each timing is taken several times
(:func:`grader.measuring.timed` and its pattern); a band comes from the spread of those runs alone.

What is not a timing is counted here too: the decode model's weight bytes, the checkpointed model's
(a checkpoint holds at least the weights and AdamW's two moments), the compilations. The counts and
the resumed run's reference are deterministic, so they are kept for the whole grading process.

:func:`from_record` (provisional) measures nothing: its comparisons are notes. What a CPU reproduces
exactly is still computed: the weight bytes, the compile counts (one compile per distinct shape, for
either set of lengths the notebook may have used), and the uninterrupted run for ``test_resume``
(which always runs here, on this machine's CPU, as the learner's resumed run does).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from grader import definitions, expect
from grader.labs.hardware_and_cost.sizes import BY_TIER
from grader.measuring import REPEATS, Measured, timed
from utils.measure.timing import benchmark
from utils.model.models import build_model, get_tokenizer, token_batches
from utils.tpu import xla  # noqa: F401  (asks XLA for the CPU devices before jax starts its backend)
from utils.train import checkpointed_run
from utils.train.checkpointed_run import DETERMINISM_ENV, RESULT_FILE, RunConfig
from utils.units import gb_per_s, tflop_per_s

ASSIGNMENT = "05_hardware_and_cost"
CPU_TFLOPS_CAP = 50.0  # estimate: no CPU socket comes near 50 fp32 TFLOP/s, so a CPU figure above it is invented
DECODE_BUDGET_S = 1.0  # utils.measure.timing.benchmark's budget per decode timing (10 runs fit it on a CPU)
XLA_BUDGET_S = 0.5  # and per jitted or eager run of the XLA layer (a fraction of a millisecond each)
SAVE_FLOOR = 1.0  # +-100% at least for a checkpoint write or an XLA compile: disk and compiler times wander
CODE = definitions.read_code()  # the course code the resumed run's reference runs on, read before any notebook ran
_KEPT: dict = {}  # deterministic results (counts, weight bytes, the reference run), per setting


@dataclasses.dataclass
class Reference:
    """What the judges compare against. ``measured``: quantity -> :class:`Measured` (empty from a
    record); ``weight_bytes``: the decode model's parameters in bytes; ``ckpt_weight_bytes``: the
    checkpointed model's; ``compiles``: the ``(unpadded, bucketed)`` counts a notebook may report;
    ``resume``: the reference run's final-state digests by its config (as JSON text), taken when
    :meth:`resume_digests` first asks for them where the reference came from a record."""

    ctx: Any
    measured: dict
    weight_bytes: int
    ckpt_weight_bytes: int
    compiles: tuple = ()
    resume: dict = dataclasses.field(default_factory=dict)
    live: bool = True

    def resume_digests(self, config: dict) -> dict | None:
        """The uninterrupted run's digests for the run ``config`` (a RunConfig's fields): measured
        live, or (from a record) run now on this machine's CPU; None for a config the grader did not
        run (a live reference holds only this machine's)."""
        key = config_key(config)
        if key not in self.resume and not self.live and config.get("device") == "cpu":
            self.resume[key] = resume_reference(RunConfig(**config))
        return self.resume.get(key)

    def against(self, key: str, value: float, name: str, unit: str) -> str:
        """The learner's ``value`` against the grader's measurement ``key``; from a record, a note."""
        if not self.live:
            return f"{name}: {value:.4g} {unit} as recorded (not re-measured)"
        return self.measured[key].against(value, name, unit)

    def peak_tflops(self) -> tuple[float | None, str]:
        """The ceiling no matmul rate may pass: the card's datasheet peak, or an estimate on a CPU."""
        spec = self.ctx.spec
        if self.ctx.device == "cuda":
            return (spec.peak_tflops(self.ctx.dtype) if spec else None), f"the {spec.name if spec else 'GPU'} datasheet peak"
        return CPU_TFLOPS_CAP, "what any CPU can do (an estimate)"


# -- settings the notebook's locked cells make ----------------------------------------------------

def run_config(sizes, device: str) -> RunConfig:
    """The checkpointed run of the notebook's ``resume_run`` cell."""
    return RunConfig(steps=sizes.ckpt_steps, checkpoint_every=sizes.ckpt_every, preset=sizes.ckpt_model,
                     batch_size=sizes.ckpt_batch, seq_len=sizes.ckpt_seq_len, device=device)


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def params_bytes(preset: str) -> int:
    """Bytes of a preset's parameters (each shared tensor once), as the notebook's WEIGHT_BYTES counts them."""
    if ("bytes", preset) not in _KEPT:
        model = build_model(preset, device="meta")
        _KEPT[("bytes", preset)] = int(sum(p.numel() * p.element_size() for p in model.parameters()))
    return _KEPT[("bytes", preset)]


def xla_sizes(sizes):
    """The notebook's rule: JAX on a CPU gets the CPU tier's sizes, whatever torch has."""
    return sizes if jax.default_backend() != "cpu" else BY_TIER["cpu"]


def expected_compiles(lengths) -> tuple[int, int]:
    """``(unpadded, bucketed)``: XLA compiles once per distinct input shape, and the inputs padded to
    ``utils.tpu.xla.pow2_buckets`` take as many shapes as buckets they use."""
    buckets = xla.pow2_buckets(max(lengths), min(lengths))
    return len(set(lengths)), len({xla.bucket_length(n, buckets) for n in lengths})


def _layer(x, w):
    h = jax.nn.gelu(x @ w)
    return (h * h).mean(axis=-1)


def xla_inputs(sizes) -> tuple[list, Any, tuple[int, ...]]:
    """The grader's own inputs for the recompilation experiment, built as the notebook builds its own."""
    rng = np.random.default_rng(0)
    d = sizes.xla_dim
    w = jnp.asarray(rng.standard_normal((d, d), dtype=np.float32) / math.sqrt(d))
    xs = [jnp.asarray(rng.standard_normal((n, d), dtype=np.float32)) for n in sizes.xla_lengths]
    return xs, w, xla.pow2_buckets(max(sizes.xla_lengths), min(sizes.xla_lengths))


# -- the reference run of test_resume --------------------------------------------------------------

def resume_reference(cfg: RunConfig, timeout_s: float = 600.0) -> dict:
    """The final-state digests of an uninterrupted run of the course's checkpointed loop
    (``python -m utils.train.checkpointed_run run``, the course's RNG functions), in a fresh process on a
    copy of the course code read before any notebook ran; kept per config."""
    key = ("resume", config_key(asdict(cfg)))
    if key in _KEPT:
        return _KEPT[key]
    work = Path(tempfile.mkdtemp(prefix="gpulab-resume-ref-"))
    try:
        code = definitions.write_code(CODE, work / "code")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY", "IPY", "JUPYTER", "PYTHON"))}
        env.update(DETERMINISM_ENV, PYTHONPATH=str(code), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_VERBOSITY="error")
        proc = subprocess.run([sys.executable, "-m", "utils.train.checkpointed_run", "run", "--out", str(work / "run"),
                               "--config", json.dumps(asdict(cfg))], cwd=code, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise expect.Unusable(f"the grader's uninterrupted reference run failed (exit {proc.returncode}): {tail[:200]}")
        digests = json.loads((work / "run" / RESULT_FILE).read_text())["digests"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _KEPT[key] = digests
    return digests


# -- the measurements ----------------------------------------------------------------------------

def _band_of(runs: list, smoke: bool, slowdown: float, floor: float | None = None) -> tuple[float, float, str]:
    """``(median, band, why)`` of TimingResults: their medians' spread and each one's p20-p80 spread."""
    medians = [r.median_ms for r in runs]
    within = [(r.p80_ms - r.p20_ms) / r.median_ms for r in runs if r.median_ms > 0]
    across = expect.spread(medians)
    rel = expect.band([across, *within], smoke, slowdown, floor)
    why = f"the grader's {len(runs)} runs spread {100 * across:.1f}%" + (f", widened x{slowdown:.2g} for load"
                                                                         if slowdown > 1 else "")
    return statistics.median(medians), rel, why


def _train_step(sizes, device: str):
    """The locked ``throughput_setup`` cell's training model, optimizer, batch and step, built here."""
    torch.manual_seed(0)
    model = build_model(sizes.model, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = next(token_batches(get_tokenizer(None), None, sizes.train_batch, sizes.seq_len, device=device,
                              vocab_size=model.config.vocab_size))

    def train_step(x, y):
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step, x, y


def _generate(sizes, device: str):
    """The locked ``throughput_setup`` cell's ``generate_tokens``, built here."""
    model = build_model(sizes.model, device=device).eval()
    prompt = next(token_batches(get_tokenizer(None), None, max(sizes.decode_batches), sizes.prompt_len, device=device,
                                vocab_size=model.config.vocab_size))[0]

    def generate_tokens(batch, n):
        with torch.inference_mode():
            ids = prompt[:batch]
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False, pad_token_id=0)

    return generate_tokens


def decode_batches(sizes) -> tuple[int, ...]:
    """The batch sizes whose TPOT the judges compare: the smallest, the middle one, the largest."""
    b = sorted(sizes.decode_batches)
    return tuple(sorted({b[0], b[len(b) // 2], b[-1]}))


def _measure_decode(sizes, device: str, smoke: bool, slowdown: float) -> dict:
    generate = _generate(sizes, device)
    n = sizes.new_tokens
    out = {}
    for b in decode_batches(sizes):
        tpots, within = [], []
        for _ in range(REPEATS):
            t1 = benchmark(generate, b, 1, warmup=1, max_runs=10, budget_s=DECODE_BUDGET_S)
            tn = benchmark(generate, b, n, warmup=1, max_runs=10, budget_s=DECODE_BUDGET_S)
            tpot = (tn.median_ms - t1.median_ms) / (n - 1)
            tpots.append(tpot)
            if tpot > 0:
                within.append((tn.p80_ms - tn.p20_ms + t1.p80_ms - t1.p20_ms) / (tn.median_ms - t1.median_ms))
        across = expect.spread(tpots)
        rel = expect.band([across, *within], smoke, slowdown)
        why = f"the grader's {REPEATS} runs spread {100 * across:.1f}%" + (f", widened x{slowdown:.2g} for load"
                                                                           if slowdown > 1 else "")
        out[f"tpot:{b}"] = Measured(statistics.median(tpots), rel, why)
    return out


def _measure_checkpoint(ctx, slowdown: float) -> dict:
    cfg = run_config(ctx.sizes, ctx.device)
    work = Path(tempfile.mkdtemp(prefix="gpulab-ckpt-ref-"))
    try:
        ov = checkpointed_run.measure_checkpoint_overhead(cfg, work, steps=6, repeats=REPEATS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {}
    for key, floor in (("step", None), ("sync_save", SAVE_FLOOR)):
        r = ov[key]
        within = (r.p80_ms - r.p20_ms) / r.median_ms if r.median_ms > 0 else math.inf
        why = f"the grader's {r.runs} timed runs spread {100 * within:.1f}% (p20-p80)" + (
            f", widened x{slowdown:.2g} for load" if slowdown > 1 else "")
        out[f"ckpt:{key}"] = Measured(r.median_ms, expect.band([within], ctx.smoke, slowdown, floor), why)
    return out


def _measure_xla(ctx, slowdown: float) -> dict:
    sizes = xla_sizes(ctx.sizes)
    xs, w, buckets = xla_inputs(sizes)
    key = ("compiles", jax.default_backend(), tuple(sizes.xla_lengths), sizes.xla_dim)
    if key not in _KEPT:
        plain = xla.count_compiles(_layer, [(x, w) for x in xs])
        padded = [xla.pad_to(x, xla.bucket_length(x.shape[0], buckets)) for x in xs]
        bucketed = xla.count_compiles(_layer, [(x, w) for x in padded])
        _KEPT[key] = (plain.compiles, bucketed.compiles)
    compile_ms, runs, eagers = [], [], []
    for _ in range(REPEATS):
        t = xla.compile_vs_run(_layer, xs[-1], w, budget_s=XLA_BUDGET_S, max_runs=30)
        compile_ms.append(t["compile_ms"])
        runs.append(t["run"])
        eagers.append(t["eager"])
    across = expect.spread(compile_ms)
    why = f"the grader's {REPEATS} compiles spread {100 * across:.1f}%" + (f", widened x{slowdown:.2g} for load"
                                                                           if slowdown > 1 else "")
    out = {"xla:compile": Measured(statistics.median(compile_ms), expect.band([across], ctx.smoke, slowdown, SAVE_FLOOR),
                                   why)}
    for name, rs in (("run", runs), ("eager", eagers)):
        med, rel, why = _band_of(rs, ctx.smoke, slowdown)
        out[f"xla:{name}"] = Measured(med, rel, why)
    out["xla:counts"] = _KEPT[key]
    return out


def measure(ctx, needs: frozenset, slowdown: float, cache: dict) -> Reference:
    """The grader's measurements that ``needs`` names, taken now on this machine (``cache``: those
    already taken by this try, shared between cells)."""
    s, dev, smoke = ctx.sizes, ctx.device, ctx.smoke
    out = cache
    if "points" in needs and "matmul" not in out:
        n = s.matmul_n
        dtype = getattr(torch, ctx.dtype)
        a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
        med, rel, why = timed(lambda: a @ b, slowdown=slowdown, smoke=smoke)
        out["matmul"] = Measured(tflop_per_s(2 * n**3, med), rel, why)
        del a, b
        x = torch.randn(s.copy_numel, device=dev)
        o = torch.empty_like(x)
        med, rel, why = timed(lambda: o.copy_(x), slowdown=slowdown, smoke=smoke)
        out["copy"] = Measured(gb_per_s(8 * s.copy_numel, med), rel, why)
        del x, o
    if "train" in needs and "samples_per_s" not in out:
        step, x, y = _train_step(s, dev)
        med, rel, why = timed(step, x, y, slowdown=slowdown, smoke=smoke, warmup=2, max_runs=10, budget_s=3.0)
        out["samples_per_s"] = Measured(s.train_batch / med * 1e3, rel, why)
        del step, x, y
    if "decode" in needs and not any(k.startswith("tpot:") for k in out):
        out.update(_measure_decode(s, dev, smoke, slowdown))
    if "checkpoint" in needs and "ckpt:step" not in out:
        out.update(_measure_checkpoint(ctx, slowdown))
    if "xla" in needs and "xla:compile" not in out:
        out.update(_measure_xla(ctx, slowdown))
    resume = {}
    if "resume" in needs:
        cfg = run_config(s, dev)
        resume[config_key(asdict(cfg))] = resume_reference(cfg)
    if dev == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    measured = {k: v for k, v in out.items() if isinstance(v, Measured)}
    return Reference(ctx, measured, params_bytes(s.model), params_bytes(s.ckpt_model),
                     (out["xla:counts"],) if "xla:counts" in out else (), resume, live=True)


def from_record(ctx, record: dict) -> Reference:
    """A reference with no measurement of the grader's own (provisional). The counts a CPU reproduces
    are computed: the weight bytes of the record's tier, the compile counts for the lengths of the
    record's tier or of the CPU tier (the notebook gives JAX on a CPU the CPU sizes), and the
    uninterrupted run of this machine's CPU, which the resumed run here is compared with."""
    cpu = BY_TIER["cpu"]
    counts = tuple(dict.fromkeys(expected_compiles(z.xla_lengths) for z in (ctx.sizes, cpu)))
    return Reference(ctx, {}, params_bytes(ctx.sizes.model), params_bytes(ctx.sizes.ckpt_model), counts, live=False)
