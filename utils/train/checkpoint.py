"""Checkpoints of a training run that resume bit-identical: RNG state, DCP save/load, digests.

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
without it, which resuming skips. :func:`state_digests` hashes every piece of the final state,
so two runs compare bit for bit.

The run that uses these (its loader, loop and command line) is ``utils/train/checkpointed_run.py``;
the experiment that SIGKILLs it and resumes is ``utils/train/kill_harness.py``. Written by hand rather
than taken from torchtitan's ``CheckpointManager`` (a framework for distributed jobs) or
torchdata's ``StatefulDataLoader`` (an extra dependency): the course wants every piece of
state on the page.
"""
from __future__ import annotations

import hashlib
import inspect
import io
import pickle
import random
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from utils.measure.timing import device_sync

STEP_PREFIX = "step_"
METADATA_FILE = ".metadata"  # written last by DCP's FileSystemWriter: the completeness marker
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
