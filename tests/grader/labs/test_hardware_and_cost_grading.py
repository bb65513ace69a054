"""Lab 05 graded through the real commands, and the grader's own measurements on this CPU.

One ``python -m grader autograde --jobs 2`` batch grades (smoke mode, this CPU):

- ``reference``: the release with the reference answers typed in: full automatic marks, its
  measured cells measured live;
- ``release``: the untouched release: 0, with a message per cell;
- ``hostile``: the reference answers changed by a learner who has read the grader: RNG functions that
  call the course's own (``utils.train.checkpoint``), a spot cost from ``utils.capacity.cost.spot_job``, a typed-in
  ``samples_per_s``, a ``sharded_matmul`` that places on the notebook's 4 x 2 mesh whatever mesh it is
  given and bytes per device from a table of the notebook's two examples. Exactly those cells score 0;
- ``record``: the untouched release submitted with a consistent measurement record of a T4: its
  measured cells are judged from the record, provisionally, and count only with
  ``--count-provisional``; those whose functions the grader also runs (the estimate, the checkpoint
  percentage, the bucket, the RNG functions) and the computed cells score 0: nothing is implemented.

About four minutes on two quiet cores (the two answered notebooks each run the lab's kill-and-resume,
decode and checkpoint measurements in their kernel; the grader then measures its own).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from tests.grader.labs import hardware_and_cost_answers as made
from tests.nbcells import autograde, cell, messages, scores, src
from utils.train.checkpoint import COMPONENTS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "05_hardware_and_cost"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_speedup": 1, "test_points": 2, "test_cost_functions": 2, "test_measured_costs": 2, "test_right_sizing": 3,
          "test_beyond_gpus": 1, "test_resume": 3, "test_checkpoint_overhead": 2, "test_spot": 2, "test_recompiles": 3,
          "test_topology": 1, "test_pod_sharding": 2, "test_shard_bytes": 2}
MEASURED = ("test_points", "test_measured_costs", "test_right_sizing", "test_beyond_gpus", "test_resume",
            "test_checkpoint_overhead", "test_recompiles")
FROM_RECORD_ALONE = ("test_points", "test_measured_costs", "test_beyond_gpus")  # measured cells with no function to run
HOSTILE_CELLS = ("test_resume", "test_spot", "test_measured_costs", "test_pod_sharding", "test_shard_bytes")
TIMEOUT_S = 900  # per cell: a bound for a stuck cell on a loaded machine, not a budget


def answered() -> dict:
    from grader.release import reference_submission

    return reference_submission(ASSIGNMENT)


def replace_in(nb: dict, gid: str, old: str, new: str) -> None:
    c = cell(nb, gid)
    text = src(c)
    assert old in text, (gid, old)
    c["source"] = text.replace(old, new)


def hostile() -> dict:
    nb = answered()
    replace_in(nb, "rng_answer", 'cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and '
               'torch.cuda.is_initialized() else []\n    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": '
               'random.getstate(), "numpy": np.random.get_state()}', "return checkpoint.capture_rng_state()")
    replace_in(nb, "rng_answer", 'torch.set_rng_state(state["torch"])\n    if state["cuda"]:\n        '
               'torch.cuda.set_rng_state_all(state["cuda"])\n    random.setstate(state["python"])\n    '
               'np.random.set_state(state["numpy"])', "checkpoint.restore_rng_state(state)")
    replace_in(nb, "spot_answer", "useful = 1 - preemptions_per_h", "return cost.spot_job(work_h, usd_per_hour, "
               "checkpoint_interval_h=checkpoint_interval_h, checkpoint_write_h=checkpoint_write_h, restart_h=restart_h, "
               "preemptions_per_h=preemptions_per_h).cost_usd\n    useful = 1 - preemptions_per_h")
    replace_in(nb, "throughput_answer", "usd_per_sample = cost_per_sample_usd(",
               "samples_per_s = 40.0  # typed in: about what the grader measures here\nusd_per_sample = cost_per_sample_usd(")
    replace_in(nb, "pod_answer", "xs = jax.device_put(x, NamedSharding(mesh, x_spec))",
               'mesh = Mesh(np.array(jax.devices("cpu")[:8]).reshape(4, 2), ("data", "model"))  # the notebook\'s\n    '
               "xs = jax.device_put(x, NamedSharding(mesh, x_spec))")
    replace_in(nb, "pod_answer", "    total = itemsize\n", "    return {((64, 32), 4, 'data'): 1024, ((32, 48), 4, 'model'): "
               "3072}.get((tuple(shape), itemsize, next((e for e in spec if e), None)), 0)\n    total = itemsize\n")
    return nb


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    subs, out = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("graded")
    release = json.loads(RELEASE.read_text())
    for name, nb in (("reference", answered()), ("release", release), ("hostile", hostile()), ("record", release)):
        (subs / f"{name}.ipynb").write_text(json.dumps(nb, indent=1))
    (subs / "record.record.json").write_text(json.dumps(made.record(made.gpu_context())))
    return autograde(ROOT, ASSIGNMENT, subs, out, jobs=2, timeout_s=TIMEOUT_S, wait_s=2400)


def modes(result: dict) -> dict:
    return {c["cell"]: c["mode"] for c in result["cells"]}


def test_the_reference_scores_full_marks_measured_live(batch):
    r = batch["results"]["reference"]
    assert r["status"] == "ok" and scores(r) == POINTS, messages(r)
    assert all(modes(r)[c] == "measured live" for c in MEASURED), modes(r)
    assert r["verified_score"] == sum(POINTS.values()) and r["provisional_score"] == 0


def test_the_release_scores_zero_with_a_message_per_cell(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 and c["message"] for c in r["cells"]), messages(r)


def test_a_hostile_submission_loses_exactly_the_cells_it_cheated_on(batch):
    r = batch["results"]["hostile"]
    got = scores(r)
    assert {c for c, s in got.items() if s == 0} == set(HOSTILE_CELLS), messages(r)
    assert all(got[c] == p for c, p in POINTS.items() if c not in HOSTILE_CELLS), messages(r)
    msgs = {c["cell"]: c["message"] for c in r["cells"]}
    assert "utils.train.checkpoint.capture_rng_state, the course's own implementation" in msgs["test_resume"]
    assert "utils.capacity.cost.spot_job, the course's own implementation" in msgs["test_spot"]
    assert "samples_per_s" in msgs["test_measured_costs"]
    # the notebook's mesh in place of the given one: wrong devices, or an axis of the drawn specs it lacks
    assert re.search(r"sharded_matmul was wrong on \d of \d hidden meshes.*(lives on devices|Resource axis)",
                     msgs["test_pod_sharding"]), msgs["test_pod_sharding"]
    assert "per_device_bytes disagreed with the rule" in msgs["test_shard_bytes"]


def test_a_gpu_record_is_judged_provisionally_and_counts_only_when_allowed(batch):
    r = batch["results"]["record"]
    recorded = {c for c, m in modes(r).items() if m == "graded from record"}
    assert recorded == set(MEASURED), modes(r)
    cells = {c["cell"]: c for c in r["cells"]}
    earned = sum(POINTS[c] for c in FROM_RECORD_ALONE)
    assert all(cells[c]["provisional"] for c in MEASURED)
    assert r["provisional_score"] == earned and r["verified_score"] == 0 and r["score"] == 0, messages(r)
    for c in set(MEASURED) - set(FROM_RECORD_ALONE):  # a function of the cell is run here, and the release has none
        assert cells[c]["score"] == 0 and "NotImplementedError" in cells[c]["message"], cells[c]
    row = batch["rows"]["record"]
    assert float(row["provisional_score"]) == earned and float(row["verified_score"]) == 0
    html = (batch["out"] / "feedback" / "record" / f"{ASSIGNMENT}.html").read_text()
    assert "graded from record" in html and "Tesla T4" in html and "provisional" in html


def test_grades_csv_lists_every_submission(batch):
    assert set(batch["rows"]) == {"reference", "release", "hostile", "record"}
    assert float(batch["rows"]["reference"]["max_score"]) == sum(POINTS.values())


def test_the_graders_own_measurements_on_this_cpu():
    from grader.labs.hardware_and_cost import reference

    ctx = made.cpu_context()
    needs = frozenset(("points", "train", "decode", "checkpoint", "xla", "resume"))
    r = reference.measure(ctx, needs, 1.0, {})
    keys = {"matmul", "copy", "samples_per_s", "ckpt:step", "ckpt:sync_save", "xla:compile", "xla:run", "xla:eager"}
    keys |= {f"tpot:{b}" for b in reference.decode_batches(ctx.sizes)}
    assert keys <= set(r.measured), sorted(r.measured)
    for key in keys:
        assert r.measured[key].value > 0 and 1.0 <= r.measured[key].rel <= 3.0, (key, r.measured[key])
    assert r.compiles == (reference.expected_compiles(ctx.sizes.xla_lengths),)
    assert r.weight_bytes == reference.params_bytes(ctx.sizes.model) > 0
    digests = r.resume_digests(dataclasses.asdict(reference.run_config(ctx.sizes, "cpu")))
    assert set(digests) == set(COMPONENTS)
