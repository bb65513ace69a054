"""How loaded and how fast this machine is while the grader measures
(docs/grading.md#when-the-graders-own-measurement-is-bad).

:class:`Load` measures CPU contention over a window: the judges (``grader/judging.py``) open one
around every attempt of a measured cell, and a miss on a loaded machine is measured again with
wider bands, while an unusable measurement fails nobody. :func:`machine_speed` (a calibrated loop
and the cores other work takes) scales the smoke-mode cell timeout (grader/course.py), once per
grading run. ``python -m grader.remeasure`` prints both for this machine.
"""
from __future__ import annotations

import math
import os
import time

LOADED_PRESSURE = 0.1  # some task waited for a CPU 10% of the window: a loaded machine
LOADED_STEAL = 0.05  # the hypervisor gave 5% of the CPU time to other guests
LOADED_SHARE = 0.8  # a spinning thread got less than 80% of a core
MAX_SLOWDOWN = 4.0  # the most a band is widened for load (grader.expect.LOAD_CAP caps the band too)
CALIBRATION_LOOPS = 1_000_000  # iterations of calibration_loop(): about 0.06 s of one core (below)
# CPU seconds of calibration_loop() (best of 5) on the reference machine, the 2-core AMD EPYC virtual
# machine of benchmarks/RESULTS.md#grading-under-load, under 0.4 of a core busy with other work: the
# median of 10 runs of machine_speed() in fresh processes (`python -m grader.remeasure` prints it),
# 0.057 to 0.081 s, 2026-12-02
REFERENCE_LOOP_S = 0.062
REFERENCE_CORES = 2  # the smoke timeouts of grader/course.py were set on 2 cores
MAX_TIMEOUT_FACTOR = 8.0  # a slow, loaded machine gets at most 8x the smoke timeout


class Load:
    """CPU contention from construction to :meth:`close`: the share of the window in which some
    task waited for a CPU (Linux PSI, ``/proc/pressure/cpu``: Documentation/accounting/psi.rst in
    the Linux source), the share of CPU time a hypervisor gave to other guests (steal, in
    ``/proc/stat``: proc(5)), and at the end the share of a core that a spinning thread gets (its
    CPU time over wall time). Where PSI is missing, the demand the 1-minute load average puts
    beyond the cores stands in; it lags by about a minute (kernel/sched/loadavg.c), so it is last.
    ``os.getloadavg()`` alone would miss a busy process started seconds ago."""

    def __init__(self):
        self.t0, self.psi0, self.stat0 = time.monotonic(), _psi_us(), _cpu_stat()
        self.pressure = self.steal = None
        self.share, self.closed = 1.0, False

    def close(self) -> Load:
        dt, psi, stat = max(time.monotonic() - self.t0, 1e-3), _psi_us(), _cpu_stat()
        if psi is not None and self.psi0 is not None:
            self.pressure = min(1.0, max(0.0, (psi - self.psi0) / 1e6 / dt))
        elif hasattr(os, "getloadavg"):
            self.pressure = max(0.0, 1 - cores() / max(os.getloadavg()[0], 1e-9))
        if stat and self.stat0 and stat[2] > self.stat0[2]:
            self.steal = (stat[0] - self.stat0[0]) / (stat[2] - self.stat0[2])
        self.share, self.closed = core_share(), True
        return self

    @property
    def loaded(self) -> bool:
        return ((self.pressure or 0) >= LOADED_PRESSURE or (self.steal or 0) >= LOADED_STEAL
                or self.share < LOADED_SHARE)

    @property
    def slowdown(self) -> float:
        """At most how much slower than on a quiet machine the window's work ran: a second in which
        some task waited for a CPU delays a sequential workload by a second at most, so
        ``1 / (1 - pressure)``; likewise for steal, and ``1 / share`` for the probe."""
        worst = [1 / max(self.share, 1e-3)] + [1 / max(1 - x, 1e-3) for x in (self.pressure, self.steal) if x]
        return min(MAX_SLOWDOWN, max(worst))

    def describe(self) -> str:
        psi = "no PSI here" if self.pressure is None else f"some task waited for a CPU {self.pressure:.0%} of the time"
        steal = "" if self.steal is None else f", hypervisor steal {self.steal:.0%}"
        return f"{psi}{steal}, a probe got {self.share:.0%} of a core ({cores()} cores)"


def cores() -> int:
    """CPUs this process may run on (its affinity mask, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def core_share(probe_s: float = 0.05) -> float:
    """The share of one core a thread spinning for ``probe_s`` gets now: its CPU time over wall time."""
    w0, c0 = time.monotonic(), time.thread_time()
    while time.monotonic() - w0 < probe_s:
        pass
    return min(1.0, (time.thread_time() - c0) / max(time.monotonic() - w0, 1e-9))


def _psi_us() -> float | None:
    """Microseconds in which some task waited for a CPU, since boot (the ``some`` line's ``total=``)."""
    try:
        with open("/proc/pressure/cpu") as fh:
            return float(fh.readline().rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _cpu_stat() -> tuple[int, int, int] | None:
    """``(steal, busy, total)`` clock ticks of all CPUs, from the first line of ``/proc/stat``
    (user nice system idle iowait irq softirq steal: proc(5))."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:9]]
        return f[7], sum(f) - f[3] - f[4], sum(f)
    except (OSError, ValueError, IndexError):
        return None


def calibration_loop(n: int = CALIBRATION_LOOPS) -> int:
    """A fixed amount of pure-Python work (integer arithmetic in the interpreter loop, as the
    notebooks' Python-level code runs): its CPU time measures one core's speed."""
    x = 0
    for i in range(n):
        x += i * i % 7
    return x


def machine_speed(repeats: int = 5) -> dict:
    """This machine now: ``loop_s``, the CPU seconds of :func:`calibration_loop` (best of
    ``repeats``, against :data:`REFERENCE_LOOP_S`); ``others``, the cores that other work kept
    busy meanwhile (``/proc/stat``'s busy ticks over the window, less this thread's CPU time);
    ``cores``; and the :class:`Load` over the window."""
    window, stat0, w0, c_all = Load(), _cpu_stat(), time.monotonic(), time.thread_time()
    best = math.inf
    for _ in range(repeats):
        c0 = time.thread_time()
        calibration_loop()
        best = min(best, time.thread_time() - c0)
    wall, mine, stat = time.monotonic() - w0, time.thread_time() - c_all, _cpu_stat()
    others = None
    if stat and stat0 and hasattr(os, "sysconf"):
        busy_s = (stat[1] - stat0[1]) / os.sysconf("SC_CLK_TCK")
        others = max(0.0, (busy_s - mine) / max(wall, 1e-3))
    return {"loop_s": best, "others": others, "cores": cores(), "load": window.close()}


def timeout_factor(speed: dict, jobs: int = 1) -> tuple[float, str]:
    """How much longer than on the reference machine a cell may take here, and why: this core's
    slowness (:func:`machine_speed`'s loop against the reference) times the share of the reference's
    cores that are left for the grading (fewer cores, cores other work keeps busy, or more
    ``jobs`` than cores), at least 1 and at most :data:`MAX_TIMEOUT_FACTOR`."""
    slow = max(1.0, speed["loop_s"] / REFERENCE_LOOP_S)
    free = max(0.5, speed["cores"] - (speed["others"] or 0.0))
    crowd = max(1.0, REFERENCE_CORES / free, jobs / free)
    factor = min(MAX_TIMEOUT_FACTOR, slow * crowd)
    others = "unknown" if speed["others"] is None else f"{speed['others']:.1f}"
    why = (f"x{factor:.2g}: calibration loop {1e3 * speed['loop_s']:.0f} ms against {1e3 * REFERENCE_LOOP_S:.0f} ms "
           f"on the reference 2-core machine, {others} of {speed['cores']} cores busy with other work, "
           f"{jobs} job{'s' if jobs != 1 else ''}")
    return factor, why


if __name__ == "__main__":
    sp = machine_speed()
    print(f"calibration loop {sp['loop_s']:.4f} s (reference {REFERENCE_LOOP_S} s); "
          f"other work {sp['others']} of {sp['cores']} cores; {sp['load'].describe()}")
    print("smoke timeouts scale " + timeout_factor(sp)[1])
