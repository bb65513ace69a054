"""Lab 05's sandbox side: what the grader runs inside a sandbox on the learner's definitions.

Every function here runs in a process that holds the learner's code, so whatever it returns is a
claim the judge checks (``judges.py``); none of it decides a grade by itself.

- :func:`victim` and :func:`resume`: the kill-and-resume experiment of ``test_resume`` with the
  learner's ``capture_rng_state`` and ``restore_rng_state``, in two processes. The interrupted run
  (:func:`victim`) runs in the grader's hidden-cases sandbox: it trains up to the step the grader
  drew from its secret seed, writing a checkpoint every ``checkpoint_every`` steps as the course's
  loop does (``utils.train.checkpointed_run.train``), and stops there; the grader then SIGKILLs that
  process with everything else it held. The resume (:func:`resume`) runs in a fresh sandbox
  process: it loads the newest checkpoint, restores the learner's RNG state and finishes the run.
  Its final state's digests (``utils.train.checkpoint.state_digests``) are compared by the judge with the
  grader's own uninterrupted run of the course's loop (``reference.py``). The checkpoints are
  ``torch.save`` files rather than DCP folders: DCP renames its ``.metadata`` file into place, and a
  sandbox that forbids the course's RNG functions refuses renames (``grader/sandbox.py``); what is
  saved, and when, is the course loop's.
- :func:`sharded_case`: the learner's ``sharded_matmul`` on the grader's arrays, mesh and specs,
  reported as plain data (the values, the result's type, its devices and which slice each device
  holds), for ``test_pod_sharding``.
- :func:`partition_spec`: builds a ``jax.sharding.PartitionSpec`` from JSON entries (a sandbox
  argument, ``{"__build__": ...}``).

Everything is imported when the sandbox starts (``Check.imports``), before the learner's code and
the sandbox's audit hook: the GPT-2 model code included, so the interrupted run does not import
transformers under the hook.
"""
from __future__ import annotations

import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers.models.gpt2.modeling_gpt2  # noqa: F401  (build_model's model code, imported before the hook)
from jax.sharding import PartitionSpec
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: F401  (and the tokenizer's)

from utils.tpu import (
    tpu_pod,
    xla,  # noqa: F401  (asks XLA for the CPU devices before anything starts JAX)
)
from utils.train.checkpoint import state_digests
from utils.train.checkpointed_run import RunConfig, _set_determinism, build, train_step

CHECKPOINT_FILE = "checkpoint.pt"
NONDETERMINISTIC = "does not have a deterministic implementation"  # torch's warning under warn_only determinism


def partition_spec(*entries) -> PartitionSpec:
    """``PartitionSpec(*entries)``, a JSON list of axes (a tuple entry) read back as a tuple."""
    return PartitionSpec(*(tuple(e) if isinstance(e, list) else e for e in entries))


def _learner(ns: dict, name: str):
    fn = ns.get(name)
    if not callable(fn):
        raise NameError(f"{name} is not defined by your definitions")
    return fn


def _checkpoint_step(cfg: RunConfig, step: int) -> bool:
    """The course loop checkpoints after every ``checkpoint_every`` steps, never after the last."""
    return step % cfg.checkpoint_every == 0 and step < cfg.steps


def victim(ns: dict, kill_after_step: int, run_dir: str, config: dict) -> dict:
    """The interrupted run: ``config``'s training run with the learner's ``capture_rng_state`` at each
    checkpoint, up to ``kill_after_step``; the newest checkpoint before it is written to
    ``run_dir`` (the earlier ones are captured and pickled as the loop does, and not kept)."""
    capture = _learner(ns, "capture_rng_state")
    cfg = RunConfig(**config)
    _set_determinism(cfg)
    model, opt, sched, loader = build(cfg)
    newest = (kill_after_step // cfg.checkpoint_every) * cfg.checkpoint_every
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    for step in range(1, kill_after_step + 1):
        train_step(model, opt, sched, loader.next_batch().to(cfg.device))
        if _checkpoint_step(cfg, step):
            extra = pickle.dumps({"step": step, "rng": capture(), "loader": loader.state_dict(),
                                  "scheduler": sched.state_dict()})  # pickled at once, as Checkpointer.state does
            if step == newest:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "extra": extra},
                           out / CHECKPOINT_FILE)
    return {"steps_run": kill_after_step, "checkpoint_step": newest}


def _draws() -> dict:
    out = {"torch": torch.rand(4).tolist(), "python": [random.random() for _ in range(4)],
           "numpy": np.random.rand(4).tolist()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.rand(4, device="cuda").tolist()
    return out


def resume(ns: dict, params: dict, clock) -> dict:
    """The resumed run, in a fresh process: the checkpoint the interrupted run left in
    ``params["run_dir"]`` (deleted once read), the learner's ``restore_rng_state``, the steps that remain; returns the
    final state's digests, the step it resumed from, which generators do not repeat their draws after
    ``restore_rng_state(capture_rng_state())`` (taken after the digests), and the ops without a
    deterministic kernel that warned on the way (the first suspects on a GPU)."""
    capture, restore = _learner(ns, "capture_rng_state"), _learner(ns, "restore_rng_state")
    cfg = RunConfig(**params["config"])
    _set_determinism(cfg)
    model, opt, sched, loader = build(cfg)
    path = Path(params["run_dir"]) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError("the interrupted run left no checkpoint")
    saved = torch.load(path, map_location=cfg.device, weights_only=True)
    path.unlink()  # read once: the folder is the grader's, and a GPU checkpoint is gigabytes
    extra = pickle.loads(saved["extra"])  # noqa: S301 - written by the interrupted run, read in a sandbox
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    sched.load_state_dict(extra["scheduler"])
    loader.load_state_dict(extra["loader"])
    start = int(extra["step"])
    restore(extra["rng"])
    with warnings.catch_warnings(record=True) as caught:  # warn_only determinism: ops without a deterministic kernel
        warnings.simplefilter("always")
        for step in range(start + 1, cfg.steps + 1):
            train_step(model, opt, sched, loader.next_batch().to(cfg.device))
            if _checkpoint_step(cfg, step):
                pickle.dumps({"step": step, "rng": capture(), "loader": loader.state_dict(),
                              "scheduler": sched.state_dict()})
    ops = sorted({str(w.message).strip()[:200] for w in caught if NONDETERMINISTIC in str(w.message)})
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    final = {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate(), "numpy": np.random.get_state()}
    digests = state_digests(model, opt, sched, loader, final)
    try:
        state = capture()
        first = _draws()
        restore(state)
        again = _draws()
        round_trip = sorted(k for k in first if first[k] != again[k])
    except Exception as exc:  # the learner's functions raised: the judge says so
        round_trip = [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]]
    return {"resumed_from": start, "steps_run": cfg.steps - start, "digests": digests, "round_trip": round_trip,
            "nondeterministic_ops": ops}


def sharded_case(ns: dict, x: list, w: list, mesh_shape: dict, x_spec: list, w_spec: list) -> dict:
    """The learner's ``sharded_matmul(x, w, mesh, x_spec, w_spec)`` on a mesh of ``mesh_shape`` over
    the first CPU devices: the result's type, shape and values, the ids of the devices it lives on,
    and per addressable shard its device and the ``[start, stop)`` of each dimension it holds."""
    fn = _learner(ns, "sharded_matmul")
    mesh = tpu_pod.mesh(mesh_shape)
    out = fn(np.asarray(x, dtype=np.float32), np.asarray(w, dtype=np.float32), mesh, partition_spec(*x_spec),
             partition_spec(*w_spec))
    report = {"type": f"{type(out).__module__}.{type(out).__name__}", "shape": [int(d) for d in getattr(out, "shape", ())],
              "values": np.asarray(out, dtype=np.float64).tolist(), "devices": None, "shards": None}
    sharding = getattr(out, "sharding", None)
    if sharding is not None and hasattr(out, "addressable_shards"):
        report["devices"] = sorted(int(d.id) for d in sharding.device_set)
        report["shards"] = sorted(
            ({"device": int(s.device.id),
              "index": [[int(sl.start or 0), int(dim if sl.stop is None else sl.stop)]
                        for sl, dim in zip(s.index, out.shape, strict=True)]} for s in out.addressable_shards),
            key=lambda r: r["device"])
    return report
