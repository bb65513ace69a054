"""grader/gpu_check.py's runs, on CPU: what a check printed is in its log file, written as it runs."""
from __future__ import annotations

import os

from grader import gpu_check


def test_a_check_keeps_what_it_printed_in_its_log(tmp_path):
    missing = tmp_path / "absent.ipynb"
    res = gpu_check._check(missing, tmp_path, "check_gpu", dict(os.environ), [])
    log = (tmp_path / "check_gpu.txt").read_text()
    assert res["exit"] == 2 and res["score"] is None and not res["full_marks"]
    assert "error: absent.ipynb cannot be read" in log
