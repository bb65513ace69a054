"""The processes a grading run starts, found and stopped: the worker adopts what a notebook or a
sandbox leaves behind (:func:`become_subreaper`) and kills it when its kernel or sandbox stops
(:func:`descendants`, :func:`kill_descendants`).

Imports nothing of the grader: the course calls (``grader/course.py``), the preprocessors and the
sandboxes all use it, and none of them needs another for it.
"""
from __future__ import annotations

import sys


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), so that
    what a notebook starts in a new session stays findable by :func:`kill_descendants`."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # 36 = PR_SET_CHILD_SUBREAPER (linux/prctl.h)
    except (OSError, AttributeError):
        pass


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
