"""A real busy process for tests that grade under load: one Python interpreter spinning
``while True: pass``, which keeps one core busy for as long as it runs (on this project's 2-core
CI machine, half of the machine). Started by :func:`busy_core` and killed by it at the end, by
its own process id; ``benchmarks/grade_under_load.py`` starts the same process.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_core():
    """One process spinning on one core while the block runs; yields its ``Popen``. It is at
    full speed before the block starts (it is a plain loop: a moment after the start) and
    killed, then reaped, when the block ends, however it ends."""
    proc = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # interpreter start-up: the loop runs by then
        if proc.poll() is not None:
            raise RuntimeError(f"the busy process exited at once (status {proc.returncode})")
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def cpu_seconds(proc: subprocess.Popen) -> float:
    """CPU seconds the process has used so far (user + system), from psutil."""
    import psutil

    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system
