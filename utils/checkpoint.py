"""Fault tolerance: checkpoint a training loop, kill it, resume it, end bit-identical.

A resumed run ends in exactly the state of an uninterrupted one only if the checkpoint holds
everything the remaining steps depend on:

- model parameters, optimizer state (AdamW's moments and step counts), LR scheduler;
- every random number generator the loop draws from: torch's CPU generator (dropout on a
  CPU), each CUDA device's generator (dropout on a GPU), Python's ``random`` (here: the
  data order) and NumPy's global generator (here: the crop offsets);
- the data loader's position: epoch, place in the epoch, and that epoch's order.

Saving uses torch.distributed.checkpoint (DCP): ``dcp.save``, or ``dcp.async_save`` where the
installed torch has it (2.4 and newer), which copies the state to CPU memory before it
returns and writes the files in a background thread, so the write overlaps the next
training steps; the loop waits for one write to finish before it starts the next. Without
``async_save`` the fallback does the same by hand: a CPU copy, then ``dcp.save`` in a thread.
DCP runs without an initialised process group in a single process (it then assumes one
rank; ``no_dist=True`` says so explicitly on versions that take it). Checked with torch 2.13.

A checkpoint counts as complete when its ``.metadata`` file exists: DCP's
``FileSystemWriter.finish`` writes it last, to ``.metadata.tmp`` and then renames it
(torch/distributed/checkpoint/filesystem.py), so a process killed mid-write leaves a folder
without it, which resuming skips.

Reproducible steps: ``torch.use_deterministic_algorithms(True)`` (``warn_only``: an op
without a deterministic kernel is reported, not fatal), ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
(cuBLAS's requirement for deterministic results, set before CUDA starts), eager attention
(no fused-attention backward with atomics) and a fixed number of CPU threads.

``python -m utils.checkpoint run --out DIR`` runs the loop (JSON lines on stdout);
:func:`kill_and_resume` runs it three times (uninterrupted; SIGKILLed after a chosen step;
resumed) and compares the final states. Written by hand rather than taken from torchtitan's
``CheckpointManager`` (a framework for distributed jobs) or torchdata's
``StatefulDataLoader`` (an extra dependency): the course wants every piece of state on
the page.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import io
import json
import os
import pickle
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

STEP_PREFIX = "step_"
METADATA_FILE = ".metadata"  # written last by DCP's FileSystemWriter: the completeness marker
RESULT_FILE = "result.json"
DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
COMPONENTS = ("model", "optimizer", "scheduler", "loader", "rng.torch", "rng.cuda", "rng.python", "rng.numpy")
_DCP_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


# -- random number generators -------------------------------------------------------------

def capture_rng_state() -> dict:
    """Every generator the loop draws from: torch CPU, all CUDA devices (if CUDA has started),
    Python's ``random``, NumPy's global generator."""
    import numpy as np
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}


def restore_rng_state(state: dict) -> None:
    """Put back what :func:`capture_rng_state` took."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    if state.get("cuda"):
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


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
    preset: str = "gpt2-tiny"  # a GPT-2 preset of utils.models (its dropout fields are set below)
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

    from utils.models import TokenBlocks, build_model, get_tokenizer

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


# -- DCP --------------------------------------------------------------------------------------

def has_async_save() -> bool:
    import torch.distributed.checkpoint as dcp

    return hasattr(dcp, "async_save")


def _quiet_dcp() -> None:
    """DCP warns that it assumes a single process; that is the intent here. The filter is
    global because async writes warn from their own thread."""
    warnings.filterwarnings("ignore", message=_DCP_WARNING, category=UserWarning)


def _dist_kwargs(fn: Callable) -> dict:
    return {"no_dist": True} if "no_dist" in inspect.signature(fn).parameters else {}


def _clone_to_cpu(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _clone_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_to_cpu(v) for v in obj]
    return obj


class _ThreadSave:
    """The fallback for a torch without ``dcp.async_save``: ``dcp.save`` in a thread, on a
    CPU copy taken before returning (so training can go on changing the originals)."""

    def __init__(self, state: dict, path: Path):
        import torch.distributed.checkpoint as dcp

        staged = _clone_to_cpu(state)
        self._error: BaseException | None = None

        def run():
            try:
                dcp.save(staged, checkpoint_id=str(path), **_dist_kwargs(dcp.save))
            except BaseException as exc:  # surfaced by result()
                self._error = exc

        self._thread = threading.Thread(target=run, name="dcp-save", daemon=True)
        self._thread.start()

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class Checkpointer:
    """DCP checkpoints of model, optimizer and a pickled ``extra`` dict under ``root/step_NNNNNNNN``.

    ``save`` waits for the previous asynchronous write, then saves (``async_save``: returns
    once the state is copied to CPU). ``latest`` is the newest complete checkpoint. Only the
    ``keep_last`` newest complete checkpoints stay on disk."""

    def __init__(self, root: str | Path, *, async_save: bool = True, keep_last: int = 2):
        self.root = Path(root)
        self.async_save = async_save
        self.keep_last = keep_last
        self._pending: tuple[Any, Path] | None = None

    @staticmethod
    def state(model, optimizer, extra: dict | None = None) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optimizer)
        return {"model": msd, "optim": osd, "extra": io.BytesIO(pickle.dumps(extra or {}))}

    def path(self, step: int) -> Path:
        return self.root / f"{STEP_PREFIX}{step:08d}"

    def save(self, step: int, model, optimizer, extra: dict | None = None) -> float:
        """Save; returns the milliseconds the caller was blocked (waiting for the previous
        write, building the state dict, and the save or its CPU staging)."""
        import torch.distributed.checkpoint as dcp

        from utils.timing import device_sync

        _quiet_dcp()
        t0 = time.perf_counter()
        self.wait()
        path = self.path(step)
        state = self.state(model, optimizer, extra)
        if self.async_save:
            if has_async_save():
                fut = dcp.async_save(state, checkpoint_id=str(path), **_dist_kwargs(dcp.async_save))
                fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse on some versions
            else:
                fut = _ThreadSave(state, path)
            self._pending = (fut, path)
        else:
            dcp.save(state, checkpoint_id=str(path), **_dist_kwargs(dcp.save))
            self._prune()
        device_sync()
        return (time.perf_counter() - t0) * 1e3

    def wait(self) -> float:
        """Wait for a pending asynchronous write; returns the milliseconds waited."""
        if self._pending is None:
            return 0.0
        t0 = time.perf_counter()
        fut, _ = self._pending
        self._pending = None
        fut.result()
        self._prune()
        return (time.perf_counter() - t0) * 1e3

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"{STEP_PREFIX}*") if (p / METADATA_FILE).is_file())

    def latest(self) -> Path | None:
        done = self.complete()
        return done[-1] if done else None

    def _prune(self) -> None:
        import shutil

        for old in self.complete()[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, path: str | Path, model, optimizer) -> dict:
        """Load a checkpoint into ``model`` and ``optimizer`` in place; returns its ``extra``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        _quiet_dcp()
        state = self.state(model, optimizer)
        state["extra"] = io.BytesIO()
        dcp.load(state, checkpoint_id=str(path), **_dist_kwargs(dcp.load))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        raw = state["extra"]
        return pickle.loads(raw.getvalue() if isinstance(raw, io.BytesIO) else raw)


# -- comparing final states -----------------------------------------------------------------

def _feed(h: Any, obj: Any) -> None:
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"A{obj.dtype}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[" if isinstance(obj, list) else b"(")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def digest(obj: Any) -> str:
    """sha256 of tensors (dtype, shape, bytes), arrays and nested containers: equal digests
    mean bit-identical contents."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def state_digests(model, optimizer, scheduler, loader, rng: dict) -> dict[str, str]:
    """One digest per piece of training state (:data:`COMPONENTS`)."""
    parts = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "loader": loader.state_dict(), "rng.torch": rng["torch"], "rng.cuda": rng["cuda"],
             "rng.python": rng["python"], "rng.numpy": rng["numpy"]}
    return {k: digest(v) for k, v in parts.items()}


# -- the loop ---------------------------------------------------------------------------------

def _emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


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
    (default: this module's). ``pause_after_step``: after that step, and after any
    checkpoint write in flight has finished, report ``paused`` and sleep forever, so a test
    can SIGKILL the process at a step of its choosing and know which checkpoint survives (a
    kill during a write is covered by the ``.metadata`` rule: that folder is skipped). At the end
    the final state's digests, taken with this module's own RNG capture, and the loss of
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


# -- running it in processes, and killing one ------------------------------------------------

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


class RunProcess:
    """``python -m utils.checkpoint run`` in a child process, its JSON events read as they come."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, *, hooks_file: str | Path | None = None,
                 pause_after_step: int | None = None, wait_for_go: bool = False):
        from utils.env import repo_root

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "utils.checkpoint", "run", "--out", str(self.out_dir), "--config",
               json.dumps(asdict(cfg))]
        if hooks_file is not None:
            cmd += ["--hooks", str(hooks_file)]
        if pause_after_step is not None:
            cmd += ["--pause-after-step", str(pause_after_step)]
        if wait_for_go:
            cmd += ["--wait-for-go"]
        root = str(repo_root())
        env = {**os.environ, **DETERMINISM_ENV, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"}
        self.events: list[dict] = []
        self._lines: queue.Queue = queue.Queue()
        self._stderr = open(self.out_dir / "stderr.log", "ab")  # noqa: SIM115 (closed in finish)
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     stdin=subprocess.PIPE if wait_for_go else subprocess.DEVNULL)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, event: str, timeout_s: float) -> dict:
        """The first event named ``event``; RuntimeError (with stderr's tail) if the process
        ends or ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"training process gave no {event!r} event within {timeout_s:.0f} s: "
                                   f"{self.stderr_tail()}") from None
            if line is None:
                self.proc.wait()
                raise RuntimeError(f"training process exited ({self.proc.returncode}) before {event!r}: "
                                   f"{self.stderr_tail()}")
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.events.append(ev)
            if ev.get("event") == event:
                return ev

    def go(self) -> None:
        """Let a process started with ``wait_for_go`` begin its run."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no handler runs, no file is flushed, as in a preemption without notice."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()

    def finish(self, timeout_s: float) -> dict:
        self.wait_for("done", timeout_s)
        self.proc.wait(timeout=timeout_s)
        self._stderr.close()
        return json.loads((self.out_dir / RESULT_FILE).read_text())

    def stderr_tail(self) -> str:
        """The last error line the process wrote (its full stderr is in ``out_dir/stderr.log``)."""
        if not self._stderr.closed:
            self._stderr.flush()
        lines = (self.out_dir / "stderr.log").read_text(errors="replace").strip().splitlines()
        errors = [ln for ln in lines if ln and not ln.startswith((" ", "Traceback"))]
        return (errors[-1] if errors else "no error output")[:300]


def compare(reference: dict, resumed: dict) -> dict:
    """Which components differ, and whether the steps both ran had the same losses."""
    differ = [k for k in COMPONENTS if reference["digests"].get(k) != resumed["digests"].get(k)]
    common = [k for k in resumed["losses"] if k in reference["losses"]]
    return {"identical": not differ, "differing": differ,
            "losses_match": all(reference["losses"][k] == resumed["losses"][k] for k in common)}


def expected_resume_step(cfg: RunConfig, kill_after_step: int) -> int:
    """The newest checkpoint a run killed after ``kill_after_step`` leaves (the pause waits for writes)."""
    return (kill_after_step // cfg.checkpoint_every) * cfg.checkpoint_every


def kill_and_resume(work_dir: str | Path, cfg: RunConfig, kill_after_step: int, *,
                    hooks_file: str | Path | None = None, reference: dict | None = None,
                    timeout_s: float = 300.0, keep_checkpoints: bool = False) -> dict:
    """The fault-tolerance experiment, in real processes:

    1. an uninterrupted run with this module's RNG functions (the reference; skipped when
       ``reference``, a result of an earlier one with the same ``cfg``, is given), started
       alongside
    2. a run with ``hooks_file``'s RNG functions, SIGKILLed once it has finished step
       ``kill_after_step`` (and any checkpoint write in flight), then
    3. a run in the same folder as 2, which resumes from 2's newest complete checkpoint
       (started early so that its imports overlap 2's steps; it waits until 2 is dead).

    Returns ``identical`` (every component of the final state equal, bit for bit),
    ``differing`` (the components that are not), ``killed_after_step``, ``resumed_from``,
    ``losses_match``, both digest dicts, ``reference`` (its result) and the wall time. The
    checkpoint folders are deleted afterwards unless ``keep_checkpoints`` (GPT-2 small's
    are 1.5 GB each)."""
    if not cfg.checkpoint_every <= kill_after_step < cfg.steps:
        raise ValueError(f"kill_after_step must be between checkpoint_every ({cfg.checkpoint_every}, the first "
                         f"checkpoint) and steps - 1 ({cfg.steps - 1}), got {kill_after_step}")
    work = Path(work_dir)
    if work.exists() and any(work.iterdir()):
        raise ValueError(f"{work} is not empty: give kill_and_resume a fresh folder (stale checkpoints would be resumed)")
    if reference is not None and reference.get("config") != asdict(cfg):
        raise ValueError("the reference result was run with another RunConfig")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # this process's cached blocks back to the driver: the runs need the memory (a T4)
    t0 = time.perf_counter()
    ref = None if reference is not None else RunProcess(cfg, work / "reference")
    victim = RunProcess(cfg, work / "interrupted", hooks_file=hooks_file, pause_after_step=kill_after_step)
    # the resuming process imports while the victim trains, and touches nothing until the kill is done
    resumed = RunProcess(cfg, work / "interrupted", hooks_file=hooks_file, wait_for_go=True)
    try:
        paused = victim.wait_for("paused", timeout_s)
        victim.kill()
        resumed.go()
        res = resumed.finish(timeout_s)
        if ref is not None:
            reference = ref.finish(timeout_s)
    finally:
        for p in (ref, victim, resumed):
            if p is not None and p.proc.poll() is None:
                p.kill()
        if not keep_checkpoints:
            import shutil

            for run in ("reference", "interrupted"):
                shutil.rmtree(work / run / "checkpoints", ignore_errors=True)
    want = expected_resume_step(cfg, kill_after_step)
    if res["resumed_from"] != want:
        raise RuntimeError(f"the resumed run started from step {res['resumed_from']}, not from the checkpoint of "
                           f"step {want}: the checkpoint was not found or not complete")
    out = compare(reference, res)
    out.update(killed_after_step=paused["step"], resumed_from=res["resumed_from"], steps_after_resume=res["steps_run"],
               reference_digests=reference["digests"], resumed_digests=res["digests"], reference=reference,
               async_save=res["async_save"], nondeterministic_ops=nondeterministic_ops(work),
               wall_s=time.perf_counter() - t0)
    return out


def nondeterministic_ops(work_dir: str | Path) -> list[str]:
    """Ops that warned they have no deterministic kernel (``warn_only`` mode), from the runs'
    stderr logs: the first suspects when a resumed GPU run is not bit-identical."""
    found = set()
    for log in Path(work_dir).glob("*/stderr.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "does not have a deterministic implementation" in line:
                found.add(line.split("UserWarning:")[-1].strip()[:200])
    return sorted(found)


# -- what a checkpoint costs ------------------------------------------------------------------

def measure_checkpoint_overhead(cfg: RunConfig, directory: str | Path, *, steps: int = 6, repeats: int = 3) -> dict:
    """Time a training step and a checkpoint of the same run, in this process.

    Returns TimingResults (``utils.timing``) for ``step`` (Stopwatch: CUDA events on a GPU),
    ``sync_save`` (``dcp.save``: the loop is blocked for all of it), ``async_blocking`` (what
    ``async_save`` blocks: building the state dict and the copy to CPU) and ``async_total``
    (until the files are written), plus ``checkpoint_bytes`` on disk and ``async_native``
    (False: the thread fallback). Save times are host times around a device sync. The
    checkpoints are deleted afterwards."""
    from utils.timing import Stopwatch, TimingResult, device_sync

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
    import shutil

    for sub in ("sync", "async"):
        shutil.rmtree(root / sub, ignore_errors=True)
    return {"step": sw.result(), "sync_save": TimingResult.from_times(sync, "perf_counter+sync"),
            "async_blocking": TimingResult.from_times(blocking, "perf_counter+sync"),
            "async_total": TimingResult.from_times(total, "perf_counter+sync"),
            "checkpoint_bytes": size, "async_native": has_async_save()}


# -- command line -------------------------------------------------------------------------------

def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m utils.checkpoint", description=__doc__.splitlines()[0])
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
        from utils.models import build_model

        build_model(cfg.preset, device="meta")  # imports the model code; meta tensors draw no random numbers
        _emit("ready")
        if not sys.stdin.readline():  # the parent went away
            return 1
    train(cfg, a.out, hooks=hooks, pause_after_step=a.pause_after_step)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
