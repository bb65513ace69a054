"""Lab 01's GPU paths, on a CUDA machine (skipped without one).

The source notebook's cells (solutions and visible tests; not the setup cell, which finds and installs the
course) run in this process as its kernel would run them; before each graded cell its answers are taken
as the export cell takes them (``grader.answers.collect``); then, the notebook's objects gone, every graded
cell is judged by ``grader.judging.judge_all``: the grader's own timing and profile of the naive loop on the
GPU, its loss drop, the learner's ``FastLoop`` audited and timed in a sandbox (``torch.compile``, DataLoader
worker processes, pinned memory), the LoRA peaks measured with the learner's recipes (4-bit QLoRA where
bitsandbytes imports, its 0.7x goal checked). Needs no nbgrader or Jupyter: the GPU image lacks them.

Run on a GPU machine from the repository root (2 min 44 s on one H100, bitsandbytes absent)::

    HF_HUB_OFFLINE=1 MPLBACKEND=Agg python -m pytest -q -s -p no:cacheprovider tests/grader/labs/test_single_gpu_cuda.py
"""
from __future__ import annotations

import gc
import json
import random
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "grader" / "source" / "01_single_gpu" / "01_single_gpu.ipynb"
A = "01_single_gpu"


def _src(c: dict) -> str:
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def _md(c: dict) -> dict:
    return c.get("metadata", {}).get("nbgrader", {})


def test_the_reference_notebook_is_judged_at_full_marks_on_this_gpu(tmp_path, monkeypatch):
    from grader import definitions, labs
    from grader.answers import collect
    from grader.context import live
    from grader.judging import Run, judge_all

    try:
        import IPython  # noqa: F401 - the notebook's syntax, read as IPython reads it
    except ImportError:  # the GPU image has no IPython: this notebook has no magics to translate
        monkeypatch.setattr(definitions, "as_python", lambda text: text)
    monkeypatch.chdir(tmp_path)  # the record cell writes beside the "notebook"
    nb = json.loads(SOURCE.read_text())
    ns: dict = {"__name__": "__main__"}
    exports, points = {}, {}
    for c in nb["cells"]:
        md = _md(c)
        if c["cell_type"] != "code" or md.get("grade_id") == "setup":
            continue
        if md.get("grade") and not md.get("solution"):
            exports[md["grade_id"]] = json.dumps(collect(A, md["grade_id"], ns))
            points[md["grade_id"]] = float(md["points"])
        exec(compile(_src(c), md.get("grade_id", "cell"), "exec"), ns)  # noqa: S102 - the course's own notebook
    ns.clear()  # the kernel is gone before the grader judges: its models, loaders and workers with it
    gc.collect()
    torch.cuda.empty_cache()
    ctx = live(A)
    run = Run(labs.load(A), points, exports, ctx, definitions.job(nb), definitions.read_code(ROOT), tmp_path,
              random.SystemRandom().randrange(1 << 62))
    verdicts = judge_all(run)
    lines = [f"{v.cell}: {v.points:g}/{v.max_points:g} {v.mode} {v.message} | {' | '.join(v.notes)}" for v in verdicts.values()]
    print("\n".join(lines))
    assert ctx.device == "cuda" and set(verdicts) == set(points)
    assert all(v.passed for v in verdicts.values()), "\n".join(lines)
    notes = " ".join(n for v in verdicts.values() for n in v.notes)
    assert "grader's profile of the naive loop" in notes and "speedup: grader" in notes
