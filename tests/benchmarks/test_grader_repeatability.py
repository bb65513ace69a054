"""benchmarks/grader_repeatability.py: lab 00's reference measured twice in smoke mode, every need of its
checks with finite numbers; an unknown lab is one line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.procs import load_script

ROOT = Path(__file__).resolve().parents[2]
gr = load_script(ROOT / "benchmarks" / "grader_repeatability.py")


@pytest.mark.slow
def test_every_need_of_lab_00_comes_back_with_finite_numbers(tmp_path, monkeypatch, capsys):
    from grader import expect, measuring
    from grader.labs.foundations import judges, reference

    real = measuring.timed

    def quick(fn, *args, **kwargs):  # the grader's timing, with a tiny budget: the plumbing, not the numbers
        return real(fn, *args, **{**kwargs, "warmup": 1, "max_runs": 3, "budget_s": 0.02, "repeats": 2})

    monkeypatch.setattr(reference, "timed", quick)
    monkeypatch.setenv("GPULAB_SMOKE", "1")
    out = tmp_path / "repeat.json"
    assert gr.main(["--labs", "00_foundations", "--repeats", "2", "--json-out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["fingerprint"] and len(data["labs"]) == 1
    lab = data["labs"][0]
    assert lab["assignment"] == "00_foundations" and lab["runs"] == 2 and lab["wall_s"] > 0
    want = {n for c in judges.CHECKS for n in c.measures}
    assert set(lab["needs"]) == want
    for need, d in lab["needs"].items():
        assert "skipped" not in d and "errors" not in d, (need, d)
        assert d["quantities"], need
        for name, q in d["quantities"].items():
            assert q["runs"] == 2 and len(q["values"]) == 2, (need, name)
            for key in ("median", "min", "max", "spread", "band_from_runs"):
                assert math.isfinite(q[key]), (need, name, key, q[key])
            assert q["min"] <= q["median"] <= q["max"]
            assert expect.SMOKE_FLOOR <= q["band_from_runs"] <= expect.SMOKE_CAP, (need, name)
    assert set(lab["needs"]["memory"]["quantities"]) == {"copy", "ew_gbs", "ew_tflops"}
    printed = capsys.readouterr().out
    assert "| test_matmul (matmul) | matmul |" in printed and "wall time per lab: 00_foundations" in printed


def test_an_unknown_lab_is_one_line(tmp_path, capsys):
    out = tmp_path / "none.json"
    assert gr.main(["--labs", "99_nope", "--json-out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no lab '99_nope'" in err and "00_foundations" in err
    assert not out.exists()
