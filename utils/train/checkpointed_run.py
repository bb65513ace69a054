"""The checkpointed training run: a resumable loader, the loop, its checkpoint cost, its command line.

A small GPT-2 (``utils.model.models``) trains with dropout, a shuffled and randomly cropped data
order (:class:`ShuffledBlocks`) and a warm-up schedule, so every random number generator
and every piece of state that ``utils/train/checkpoint.py`` saves matters to the next step. It
checkpoints every ``checkpoint_every`` steps through :class:`utils.train.checkpoint.Checkpointer`
and resumes from the newest complete checkpoint in its folder.

Reproducible steps: ``torch.use_deterministic_algorithms(True)`` (``warn_only``: an op
without a deterministic kernel is reported, not fatal), ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
(cuBLAS's requirement for deterministic results, set before CUDA starts), eager attention
(no fused-attention backward with atomics) and a fixed number of CPU threads.

``python -m utils.train.checkpointed_run run --out DIR`` runs the loop (JSON lines on stdout);
``utils/train/kill_harness.py`` runs it in processes and SIGKILLs one. The RNG functions the run
stores may come from a file (:func:`write_hooks`, :func:`load_hooks`): the notebook's own.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import random
import shutil
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from utils.measure.timing import Stopwatch, TimingResult, device_sync
from utils.model.models import TokenBlocks, build_model, get_tokenizer
from utils.train.checkpoint import Checkpointer, capture_rng_state, has_async_save, restore_rng_state, state_digests

RESULT_FILE = "result.json"
DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


# -- the data loader ------------------------------------------------------------------------

class ShuffledBlocks:
    """A resumable loader over token blocks: each epoch visits the blocks in an order drawn
    with Python's ``random.shuffle``; each sample is a window of ``seq_len`` tokens at an
    offset drawn with NumPy (a random crop). The last partial batch of an epoch is dropped.

    Its position is :meth:`state_dict`: epoch, cursor and the epoch's order (the order came
    from the RNG state at the epoch's start, which a mid-epoch checkpoint no longer has)."""

    def __init__(self, blocks: Any, batch_size: int, seq_len: int):
        if blocks.ndim != 2 or blocks.shape[1] < seq_len:
            raise ValueError(f"blocks must be (n, >= seq_len={seq_len}) token ids, got shape {tuple(blocks.shape)}")
        if not 1 <= batch_size <= blocks.shape[0]:
            raise ValueError(f"batch_size must be between 1 and the {blocks.shape[0]} blocks, got {batch_size}")
        self.blocks, self.batch_size, self.seq_len = blocks, batch_size, seq_len
        self.jitter = blocks.shape[1] - seq_len
        self.epoch, self.cursor, self.order = 0, 0, None

    def next_batch(self):
        import numpy as np
        import torch

        n = self.blocks.shape[0]
        if self.order is None or self.cursor + self.batch_size > n:
            if self.order is not None:
                self.epoch += 1
            self.order = list(range(n))
            random.shuffle(self.order)
            self.cursor = 0
        idx = self.order[self.cursor:self.cursor + self.batch_size]
        self.cursor += self.batch_size
        offsets = np.random.randint(0, self.jitter + 1, size=self.batch_size)
        return torch.stack([self.blocks[i, int(o):int(o) + self.seq_len] for i, o in zip(idx, offsets, strict=True)])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "order": None if self.order is None else list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.order = None if state["order"] is None else list(state["order"])


# -- the run --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunConfig:
    """One training run. The defaults run on a CPU in about a second per ten steps."""

    steps: int = 12
    checkpoint_every: int = 4
    preset: str = "gpt2-tiny"  # a GPT-2 preset of utils.model.models (its dropout fields are set below)
    batch_size: int = 4
    seq_len: int = 32
    jitter: int = 8  # random-crop range: blocks are seq_len + jitter tokens
    dataset_blocks: int = 16  # with batch_size 4 an epoch is 4 steps, so a resume crosses epochs
    lr: float = 1e-3
    warmup_steps: int = 4
    dropout: float = 0.1
    seed: int = 0
    device: str = "cpu"
    async_save: bool = True
    keep_last: int = 2  # complete checkpoints kept on disk
    cpu_threads: int = 1

    def __post_init__(self):
        for name in ("steps", "checkpoint_every", "batch_size", "seq_len", "dataset_blocks", "warmup_steps",
                     "keep_last", "cpu_threads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"RunConfig.{name} must be a positive integer, got {v!r}")
        if not self.preset.startswith("gpt2"):
            raise ValueError(f"RunConfig.preset must be a GPT-2 preset (gpt2-tiny, gpt2-small), got {self.preset!r}")

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown RunConfig fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def _set_determinism(cfg: RunConfig) -> None:
    import torch

    for k, v in DETERMINISM_ENV.items():
        os.environ.setdefault(k, v)
    torch.set_num_threads(cfg.cpu_threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def build(cfg: RunConfig):
    """``(model, optimizer, scheduler, loader)`` seeded from ``cfg.seed``: the same every time."""
    import numpy as np
    import torch

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    p = cfg.dropout
    model = build_model(cfg.preset, device=cfg.device, attn_implementation="eager",
                        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = cfg.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    ds = TokenBlocks(get_tokenizer(None), None, cfg.seq_len + cfg.jitter, vocab_size=model.config.vocab_size)
    n = min(len(ds), cfg.dataset_blocks)
    if n < cfg.batch_size:
        raise ValueError(f"the text gives {n} blocks, fewer than batch_size {cfg.batch_size}")
    blocks = torch.stack([ds[i][0] for i in range(n)])
    return model, opt, sched, ShuffledBlocks(blocks, cfg.batch_size, cfg.seq_len)


def train_step(model, optimizer, scheduler, batch):
    """Forward, backward, clip, AdamW, scheduler; returns the loss (not synchronised)."""
    import torch

    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


# -- the loop, and the RNG functions it may load from a file -----------------------------------

def _emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


def write_hooks(path: str | Path, *functions: Callable) -> Path:
    """Write ``functions`` (defined in a notebook: ``capture_rng_state``, ``restore_rng_state``)
    to a Python file a training process can load, with the imports they usually need."""
    parts = ["import random", "import numpy as np", "import torch", ""]
    for fn in functions:
        try:
            parts.append(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError):
            raise ValueError(f"cannot read the source of {getattr(fn, '__name__', fn)!r}: define it with def "
                             "in a notebook cell or a file") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts))
    return path


def load_hooks(path: str | Path) -> tuple[Callable, Callable]:
    """``capture_rng_state`` and ``restore_rng_state`` from a Python file (see :func:`write_hooks`)."""
    spec = importlib.util.spec_from_file_location("_gpulab_rng_hooks", str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        return mod.capture_rng_state, mod.restore_rng_state
    except AttributeError:
        raise ValueError(f"{path} must define capture_rng_state() and restore_rng_state(state)") from None


def train(cfg: RunConfig, out_dir: str | Path, *, hooks: tuple[Callable, Callable] | None = None,
          pause_after_step: int | None = None, emit: Callable[..., None] = _emit) -> dict:
    """Run (or resume, if ``out_dir`` holds a complete checkpoint) ``cfg.steps`` steps.

    Checkpoints after every ``checkpoint_every`` steps (not after the last). ``hooks`` are
    the ``(capture, restore)`` RNG functions stored in and restored from checkpoints
    (default: ``utils.train.checkpoint``'s). ``pause_after_step``: after that step, and after any
    checkpoint write in flight has finished, report ``paused`` and sleep forever, so a test
    can SIGKILL the process at a step of its choosing and know which checkpoint survives (a
    kill during a write is covered by the ``.metadata`` rule: that folder is skipped). At the end
    the final state's digests, taken with ``utils.train.checkpoint``'s own RNG capture, and the loss of
    every step run go to ``out_dir/result.json`` and are returned."""
    _set_determinism(cfg)
    capture, restore = hooks or (capture_rng_state, restore_rng_state)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, opt, sched, loader = build(cfg)
    ckpt = Checkpointer(out / "checkpoints", async_save=cfg.async_save, keep_last=cfg.keep_last)
    start, resumed_from = 0, None
    latest = ckpt.latest()
    if latest is not None:
        extra = ckpt.load(latest, model, opt)
        sched.load_state_dict(extra["scheduler"])
        loader.load_state_dict(extra["loader"])
        start = resumed_from = int(extra["step"])
        restore(extra["rng"])
        emit("resumed", step=start, checkpoint=latest.name)
    losses, blocked_ms = {}, []
    t0 = time.perf_counter()
    for step in range(start + 1, cfg.steps + 1):
        batch = loader.next_batch().to(cfg.device)
        losses[step] = float(train_step(model, opt, sched, batch))
        emit("step", step=step, loss=losses[step])
        if step % cfg.checkpoint_every == 0 and step < cfg.steps:
            extra = {"step": step, "rng": capture(), "loader": loader.state_dict(), "scheduler": sched.state_dict()}
            blocked_ms.append(ckpt.save(step, model, opt, extra))
            emit("checkpoint", step=step, blocked_ms=blocked_ms[-1])
        if pause_after_step == step:
            ckpt.wait()  # the write in flight finishes first, so the kill leaves a known newest checkpoint
            emit("paused", step=step, newest_checkpoint=ckpt.latest().name if ckpt.latest() else None)
            while True:
                time.sleep(3600)
    ckpt.wait()
    result = {"config": asdict(cfg), "resumed_from": resumed_from, "steps_run": len(losses),
              "losses": {str(k): v for k, v in losses.items()}, "checkpoint_blocked_ms": blocked_ms,
              "wall_s": time.perf_counter() - t0, "async_save": cfg.async_save and has_async_save(),
              "digests": state_digests(model, opt, sched, loader, capture_rng_state())}
    (out / RESULT_FILE).write_text(json.dumps(result, indent=1))
    emit("done", steps_run=len(losses))
    return result


# -- what a checkpoint costs ------------------------------------------------------------------

def measure_checkpoint_overhead(cfg: RunConfig, directory: str | Path, *, steps: int = 6, repeats: int = 3) -> dict:
    """Time a training step and a checkpoint of the same run, in this process.

    Returns TimingResults (``utils.measure.timing``) for ``step`` (Stopwatch: CUDA events on a GPU),
    ``sync_save`` (``dcp.save``: the loop is blocked for all of it), ``async_blocking`` (what
    ``async_save`` blocks: building the state dict and the copy to CPU) and ``async_total``
    (until the files are written), plus ``checkpoint_bytes`` on disk and ``async_native``
    (False: the thread fallback). Save times are host times around a device sync. The
    checkpoints are deleted afterwards."""
    model, opt, sched, loader = build(replace(cfg, async_save=True))
    sw = Stopwatch(warmup_steps=1, device=cfg.device)
    for _ in range(max(2, steps)):
        batch = loader.next_batch().to(cfg.device)
        with sw.step():
            train_step(model, opt, sched, batch)
    root = Path(directory)
    sync, blocking, total = [], [], []
    sync_ckpt = Checkpointer(root / "sync", async_save=False, keep_last=1)
    async_ckpt = Checkpointer(root / "async", async_save=True, keep_last=1)
    for i in range(repeats + 1):  # the first of each is a warm-up
        device_sync()
        t_sync = sync_ckpt.save(i, model, opt, {"step": i})
        device_sync()
        t0 = time.perf_counter()
        t_block = async_ckpt.save(i, model, opt, {"step": i})
        async_ckpt.wait()
        t_total = (time.perf_counter() - t0) * 1e3
        if i > 0:
            sync.append(t_sync)
            blocking.append(t_block)
            total.append(t_total)
    latest = sync_ckpt.latest()
    size = sum(p.stat().st_size for p in latest.iterdir()) if latest else 0

    for sub in ("sync", "async"):
        shutil.rmtree(root / sub, ignore_errors=True)
    return {"step": sw.result(), "sync_save": TimingResult.from_times(sync, "perf_counter+sync"),
            "async_blocking": TimingResult.from_times(blocking, "perf_counter+sync"),
            "async_total": TimingResult.from_times(total, "perf_counter+sync"),
            "checkpoint_bytes": size, "async_native": has_async_save()}


# -- command line -------------------------------------------------------------------------------

def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m utils.train.checkpointed_run", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run or resume the checkpointed training loop (JSON lines on stdout)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--config", default="{}", help="RunConfig fields as JSON")
    r.add_argument("--hooks", type=Path, help="a file defining capture_rng_state() and restore_rng_state(state)")
    r.add_argument("--pause-after-step", type=int)
    r.add_argument("--wait-for-go", action="store_true",
                   help="import everything, then wait for a line on stdin before starting (hides start-up time)")
    a = p.parse_args(argv)
    try:
        cfg = RunConfig.from_json(a.config)
        hooks = load_hooks(a.hooks) if a.hooks else None
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.wait_for_go:
        from utils.model.models import build_model

        build_model(cfg.preset, device="meta")  # imports the model code; meta tensors draw no random numbers
        _emit("ready")
        if not sys.stdin.readline():  # the parent went away
            return 1
    train(cfg, a.out, hooks=hooks, pause_after_step=a.pause_after_step)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
