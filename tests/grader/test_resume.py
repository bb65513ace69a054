"""An interrupted batch loses nothing (grader/resume.py through grader/batch.py): results saved
as they finish are kept by a rerun, which grades only what is missing or changed and says so.
The worker is replaced by a stand-in that returns a result at once; everything else is the
real batch (release, course copies, outputs)."""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from grader import batch, resume
from grader.submissions import find_submissions

ROOT = batch.REPO_ROOT
ASSIGNMENT = "00_foundations"


class Interrupted(Exception):
    pass


@pytest.fixture
def klass(tmp_path):
    d = tmp_path / "class"
    d.mkdir()
    for s in ("ana", "bo", "cy"):
        shutil.copyfile(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb", d / f"{s}.ipynb")
    return d


def _worker(calls, stop_at=None):
    def run(work, assignment, sub, *args, **kw):
        if sub.student_id == stop_at:
            raise Interrupted  # the batch is killed while this one is graded
        calls.append(sub.student_id)
        return {"student_id": sub.student_id, "score": 7.0, "max_score": 15.0, "status": "ok", "cells": []}
    return run


def _grade(klass, out, monkeypatch, calls, stop_at=None):
    monkeypatch.setattr(batch, "_run_worker", _worker(calls, stop_at))
    return batch.grade_batch(ASSIGNMENT, find_submissions(klass, ASSIGNMENT), out, jobs=1, progress=False)


def test_a_rerun_grades_only_what_the_interrupted_run_did_not_finish(klass, tmp_path, monkeypatch, capsys):
    out, first, second = tmp_path / "out", [], []
    with pytest.raises(Interrupted):
        _grade(klass, out, monkeypatch, first, stop_at="cy")
    assert not (out / "grades.csv").exists() and sorted(p.stem for p in (out / resume.PARTIAL).glob("*.json")) == \
        sorted(first)
    results = _grade(klass, out, monkeypatch, second)
    assert sorted(first + second) == ["ana", "bo", "cy"] and "cy" in second and not set(first) & set(second)
    assert f"resuming: {len(first)} of 3 submissions already graded" in capsys.readouterr().err
    with open(out / "grades.csv", newline="") as fh:
        assert [r["student_id"] for r in csv.DictReader(fh)] == ["ana", "bo", "cy"]
    assert [r["student_id"] for r in json.loads((out / "results.json").read_text())] == ["ana", "bo", "cy"]
    assert [(r["student_id"], r["status"]) for r in results] == [("ana", "ok"), ("bo", "ok"), ("cy", "ok")]
    assert not (out / resume.PARTIAL).exists()  # finished: nothing left to resume


def test_a_changed_submission_is_graded_again(klass, tmp_path, monkeypatch):
    out, first, second = tmp_path / "out", [], []
    with pytest.raises(Interrupted):
        _grade(klass, out, monkeypatch, first, stop_at="cy")
    assert first == ["ana", "bo"]
    nb = json.loads((klass / "ana.ipynb").read_text())
    nb["cells"][0]["source"] = "changed"
    (klass / "ana.ipynb").write_text(json.dumps(nb))
    _grade(klass, out, monkeypatch, second)
    assert sorted(second) == ["ana", "cy"]


def test_a_torn_partial_file_is_graded_again(klass, tmp_path, monkeypatch):
    out, first, second = tmp_path / "out", [], []
    with pytest.raises(Interrupted):
        _grade(klass, out, monkeypatch, first, stop_at="cy")
    (out / resume.PARTIAL / "bo.json").write_text('{"sha256": "')
    _grade(klass, out, monkeypatch, second)
    assert sorted(second) == ["bo", "cy"]
