"""grader/selfcheck.py: the lines `python -m grader check` prints beside its table."""
from __future__ import annotations

from grader.selfcheck import format_table, time_line


def _res(**kw):
    base = {"score": 3, "max_score": 5, "status": "ok", "grading_s": 100.0, "calls_s": 12.0,
            "cells": [{"cell": "test_a", "points": 2, "score": 2, "passed": True, "mode": "measured live", "judge_s": 40.0},
                      {"cell": "test_b", "points": 3, "score": 1, "passed": False, "mode": "computed", "judge_s": 0.2},
                      {"cell": "write_up", "points": 2, "score": 0, "mode": "manual"}]}
    return base | kw


def test_the_time_line_splits_the_notebook_from_the_graders_own_work():
    line = time_line(_res())
    assert line == ("time: 100 s in all: the notebook run 48 s, the grader's own work 52 s "
                    "(drawn cases 12 s; longest: test_a 40 s)")
    assert time_line(_res(grading_s=10.0)).startswith("time: 10 s in all: the notebook run 0 s")  # never negative


def test_the_table_says_where_the_time_went_only_when_it_was_measured():
    assert "time: 100 s in all" in format_table(_res())
    assert "time:" not in format_table(_res(grading_s=None))
