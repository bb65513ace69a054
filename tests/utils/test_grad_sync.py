"""utils/parallel/grad_sync.py: the learner's cell as a module, the checks of a run, the gap rule."""
from __future__ import annotations

import importlib.util
import linecache

import pytest

from utils.parallel import grad_sync as G

CELL = '''import torch
import torch.distributed as dist
BUCKET = 0.5
print("a line that reads the notebook:", SIZES)


def sync_each(model):
    return "each"


def sync_bucketed(model, bucket_mb):
    return helper(bucket_mb)


def helper(x):
    return x * BUCKET


class OverlappedSync:
    def __init__(self, model):
        self.model = model

    def finish(self):
        return "done"

done = sync_each(None)
'''


def _cell(src: str, name: str) -> dict:
    """Define ``src`` as IPython does a cell: compiled under a file name whose lines linecache holds."""
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns: dict = {"SIZES": "sizes"}
    exec(compile(src, name, "exec"), ns)  # noqa: S102 (a test's own cell)
    return ns


def test_the_cell_becomes_a_module_of_its_imports_and_definitions(tmp_path):
    ns = _cell(CELL, "<ipython-cell-grad-sync-1>")
    path = G.write_answer_module(tmp_path / "answer.py", ns["sync_each"], ns["sync_bucketed"], ns["OverlappedSync"])
    text = path.read_text()
    assert "print(" not in text and "done =" not in text and "BUCKET = 0.5" in text and "def helper" in text
    spec = importlib.util.spec_from_file_location("answer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports without the notebook's SIZES
    assert mod.sync_bucketed(None, 2) == 1.0 and mod.OverlappedSync(None).finish() == "done"


def test_a_cell_without_the_three_names_or_its_source_is_refused(tmp_path):
    ns = _cell(CELL, "<ipython-cell-grad-sync-2>")
    with pytest.raises(ValueError, match="pass sync_bucketed itself"):
        G.write_answer_module(tmp_path / "a.py", ns["sync_each"], ns["helper"], ns["OverlappedSync"])
    with pytest.raises(ValueError, match="not a function or a class"):
        G.answer_source(42)
    lost = {}
    exec(compile("def sync_each(m):\n    pass\n", "<no-source-kept>", "exec"), lost)  # noqa: S102
    with pytest.raises(ValueError, match="source of <no-source-kept> is not available"):
        G.answer_source(lost["sync_each"])


def fake_run(total=3_946_496, tensors=28, largest=2_097_152, bucket_mb=0.5, **changes) -> dict:
    """A run's JSON as the harness writes it, every version right: gradients equal DDP's, the
    per-parameter version 28 calls after the backward, buckets by next-fit, overlap in the backward."""
    ok = {"match": True, "worst_rel_err": 0.0, "worst_param": "", "rank": 0, "steps_checked": 10}
    run = {"grad_bytes": total, "grad_tensors": tensors, "largest_grad_bytes": largest,
           "config": {"bucket_mb": bucket_mb, "check_bucket_mb": 0.2},
           "grads": {v: dict(ok) for v in ("each", "bucketed", "overlapped", "bucketed_check")},
           "calls": {"each": {"calls": tensors, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "bucketed": {"calls": 6, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "bucketed_check": {"calls": 13, "bytes": total, "max_call_bytes": largest, "in_backward": 0},
                     "overlapped": {"calls": tensors, "bytes": total, "max_call_bytes": largest, "in_backward": tensors}}}
    for key, value in changes.items():
        kind, version, field = key.split("__")
        run[kind][version][field] = value
    return run


def test_a_right_run_has_no_problems():
    assert G.version_problems(fake_run()) == []


@pytest.mark.parametrize("changes, says", [
    ({"grads__each__match": False, "grads__each__worst_rel_err": 1.0, "grads__each__worst_param": "lm_head.weight"},
     "each: gradients differ from DDP's: lm_head.weight off by 1"),  # a sum not divided by the world size
    ({"grads__bucketed_check__match": False}, "bucketed_check: gradients differ"),  # wrong only at the other bucket
    ({"calls__bucketed__bytes": 3_946_496 - 512}, "bucketed: all-reduced 3945984 bytes"),  # a bucket dropped a bias
    ({"calls__each__calls": 6}, "one per parameter after the backward is 28"),  # buckets in the per-parameter version
    ({"calls__each__in_backward": 28}, "28 during the backward"),  # hooks in the per-parameter version
    ({"calls__bucketed__calls": 28}, "need at most 16 calls"),  # one call per parameter sold as buckets
    ({"calls__bucketed__max_call_bytes": 3_946_496}, "none larger than 2.09715e+06"),  # one bucket of everything
    ({"calls__overlapped__in_backward": 0}, "no all-reduce started during the backward"),  # all after the backward
])
def test_each_kind_of_wrong_version_is_named(changes, says):
    problems = G.version_problems(fake_run(**changes))
    assert len(problems) == 1 and says in problems[0], problems


def test_next_fit_bound():
    assert G.next_fit_bound(3_946_496, 0.5e6) == 16
    assert G.next_fit_bound(1e6, 1e6) == 3  # e.g. 0.6 + 0.6 + ... never packs into one: at most 2x the fewest, plus one


@pytest.mark.parametrize("t_each, t_ddp, t_none, cause", [
    (104.0, 100.0, 90.0, "as_fast_as_ddp"),
    (200.0, 100.0, 100.0, "exposed_communication"),  # all of the gap is the synchronization
    (200.0, 100.0, 150.0, "exposed_communication"),  # c = 0.25 = half of s = 0.5: the boundary counts as communication
    (200.0, 100.0, 160.0, "other_overhead"),  # c = 0.2 < s / 2
    (200.0, 100.0, 210.0, "other_overhead"),  # no-sync step slower than the per-parameter one: c = 0
])
def test_gap_cause(t_each, t_ddp, t_none, cause):
    assert G.gap_cause(t_each, t_ddp, t_none) == cause


def test_explanation_and_ratios_from_a_run():
    run = {"versions": {"none": {"median_ms": 100.0}, "ddp": {"median_ms": 120.0}, "each": {"median_ms": 200.0},
                        "bucketed": {"median_ms": 150.0}, "overlapped": {"median_ms": 140.0}}}
    assert G.vs_ddp(run) == pytest.approx({"each": 0.6, "bucketed": 0.8, "overlapped": 120 / 140})
    assert G.explanation(run) == pytest.approx({"fastest": "overlapped", "each_comm_share": 0.5, "each_vs_ddp": 0.6,
                                                "cause": "exposed_communication"})
    with pytest.raises(ValueError, match="unknown tier 'tpu'"):
        G.sizes("tpu")
