"""Lab 05's functions in real sandboxes, judged by grader/judging.py's ``judge_all`` on exports built
here (no notebook run): every course implementation the lab forbids is a tripwire that costs the
cell its points, and the kill-and-resume experiment, run in two sandbox processes against the
grader's own uninterrupted run, fails a restore that forgets Python's generator, naming what differs
(the right pair passes in the grading test's reference). About 40 s on two quiet cores.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from grader import context, definitions, judging, labs
from grader.answers import encode
from tests.grader.labs import hardware_and_cost_answers as made
from tests.nbcells import cell, src

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "05_hardware_and_cost"
SOURCE = json.loads((ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").read_text())
CODE = definitions.read_code()


def changed(**cells: tuple[str, str]) -> dict:
    """The source notebook (reference answers) with ``old`` replaced by ``new`` in each answer cell."""
    nb = copy.deepcopy(SOURCE)
    for gid, (old, new) in cells.items():
        c = cell(nb, gid)
        assert old in src(c), (gid, old)
        c["source"] = src(c).replace(old, new)
    return nb


def grade(nb: dict, cells: tuple[str, ...], tmp: Path, seed: int = 5) -> dict:
    """``judge_all`` on ``cells`` of ``nb``: its definitions in sandboxes, the answers the export cells
    would print made here for this CPU."""
    values = made.answers(made.cpu_context())
    exports = {c: json.dumps({"cell": c, "values": {k: encode(v) for k, v in values.get(c, {}).items()}, "missing": [],
                              "errors": {}}) for c in cells}
    run = judging.Run(labs.load(ASSIGNMENT), {c: 1.0 for c in cells}, exports, context.live(ASSIGNMENT),
                      definitions.job(nb), CODE, tmp, seed)
    return judging.judge_all(run)


CHEATS = {  # answer cell: (a line of the solution, a line that calls the course's implementation first)
    "speedup_answer": ("    def roof(spec):", "    return __import__('utils.measure.flops').measure.flops.attainable_tflops(intensity, "
                       "to_spec.peak_tflops(dtype), to_spec.bandwidth_gbs) / __import__('utils.measure.flops').measure.flops."
                       "attainable_tflops(intensity, from_spec.peak_tflops(dtype), from_spec.bandwidth_gbs)\n"
                       "    def roof(spec):"),
    "cost_functions": ("    return usd_per_gpu_hour / (samples_per_s * 3600)",
                       "    return cost.cost_per_sample_usd(samples_per_s, usd_per_gpu_hour)"),
    "spot_answer": ("    useful = 1 - preemptions_per_h", "    return cost.spot_job(work_h, usd_per_hour, checkpoint_interval_h="
                    "checkpoint_interval_h, checkpoint_write_h=checkpoint_write_h, restart_h=restart_h, preemptions_per_h="
                    "preemptions_per_h).cost_usd\n    useful = 1 - preemptions_per_h"),
    "topo_answer": ("    return min(", "    return topology.slowest_gpu_link(topo)\n    return min("),
    "pod_answer": ("    total = itemsize\n", "    return tpu_pod.jax_shard_bytes(shape, {1: 'int8', 2: 'float16', 4: "
                   "'float32', 8: 'float64'}[itemsize], mesh_shape, spec)[0]\n    total = itemsize\n"),
}
TRIPPED = {"test_speedup": "utils.measure.flops.attainable_tflops", "test_cost_functions": "utils.capacity.cost.cost_per_sample_usd",
           "test_spot": "utils.capacity.cost.spot_job", "test_topology": "utils.device.topology.slowest_gpu_link",
           "test_shard_bytes": "utils.tpu.tpu_pod.jax_shard_bytes"}


def test_every_forbidden_course_implementation_is_a_tripwire_and_a_forgetful_restore_fails_the_resume(tmp_path):
    """One grading of the reference answers with a cheat in each formula cell and a restore that forgets
    Python's generator: each cheating cell loses its points to the tripwire; the resumed run, in a fresh
    process, ends different from the grader's uninterrupted one and the message names the generator
    (the RNG functions calling the course's own: tests/grader/labs/test_hardware_and_cost_grading.py)."""
    nb = changed(**CHEATS, rng_answer=('    random.setstate(state["python"])\n', ""))
    verdicts = grade(nb, (*TRIPPED, "test_resume"), tmp_path, seed=9)
    for c, name in TRIPPED.items():
        v = verdicts[c]
        assert v.points == 0 and f"your answer called {name}, the course's own implementation" in v.message, (c, v)
    v = verdicts["test_resume"]
    assert v.points == 0 and "did not repeat their draws: python" in v.message and "rng.python" in v.message, v
