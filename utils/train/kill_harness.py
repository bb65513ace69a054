"""The fault-tolerance experiment: run the checkpointed loop, SIGKILL it, resume it, compare.

:func:`kill_and_resume` starts ``python -m utils.train.checkpointed_run run`` three times, in real
processes (uninterrupted; SIGKILLed after a chosen step; resumed in the killed run's folder),
and compares the final states' digests (:func:`utils.train.checkpoint.state_digests`): a resume is
correct when every component is equal bit for bit. SIGKILL runs no handler and flushes no
file, as a preemption without notice.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from utils.course.env import repo_root
from utils.train.checkpoint import COMPONENTS
from utils.train.checkpointed_run import DETERMINISM_ENV, RESULT_FILE, RunConfig

# -- running it in processes, and killing one ------------------------------------------------

class RunProcess:
    """``python -m utils.train.checkpointed_run run`` in a child process, its JSON events read as they come."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, *, hooks_file: str | Path | None = None,
                 pause_after_step: int | None = None, wait_for_go: bool = False):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "utils.train.checkpointed_run", "run", "--out", str(self.out_dir), "--config",
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

    1. an uninterrupted run with ``utils.train.checkpoint``'s RNG functions (the reference; skipped when
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
