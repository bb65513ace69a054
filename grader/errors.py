"""Errors a grading command reports in one line (``python -m grader``'s exit status 2, or 130 for Ctrl-C)."""


class Interrupted(Exception):
    """Ctrl-C during a batch: the workers were killed; what finished was kept (the message says where)."""
