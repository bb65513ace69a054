"""The processes a grading run starts, found and stopped: the worker adopts what a notebook or a
sandbox leaves behind (:func:`become_subreaper`) and kills it when its kernel or sandbox stops
(:func:`descendants`, :func:`kill_descendants`).

Imports nothing of the grader: the course calls (``grader/course.py``), the preprocessors and the
sandboxes all use it, and none of them needs another for it.
"""
from __future__ import annotations

import sys

PR_SET_DUMPABLE = 4  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, arg: int) -> None:
    """prctl(2) on Linux, through libc; nothing elsewhere or where libc does not answer."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so that
    what a notebook starts in a new session stays findable by :func:`kill_descendants`."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def descendants() -> set[tuple[int, float]]:
    """``(pid, start time)`` of every process below this one."""
    import psutil

    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            out.add((p.pid, p.create_time()))
        except psutil.Error:
            pass
    return out


def kill_descendants(spare: set[tuple[int, float]] = frozenset()) -> int:
    """SIGKILL every process below this one but ``spare`` (from :func:`descendants`): a stopped
    kernel's leftovers. Returns how many."""
    import psutil

    procs = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.pid, p.create_time()) not in spare:
                procs.append(p)
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)
