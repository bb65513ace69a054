"""Lab 05's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``): each value crosses as JSON and
is checked against its spec before any judge sees it. Course objects cross as their fields (a
``utils.capacity.cost.Candidate``, a ``RightSizing``, an ``accelerators.SloChoice``, a ``TimingResult``);
a ``PartitionSpec`` as whether it is one and its entries. Cells whose functions are judged on hidden
cases read nothing here for those functions: the grader runs them in a sandbox (``judges.py``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from grader.labs import Answer, answers
from grader.schema import NONFINITE, TIMING, AnswerError, Count, DictOf, Fields, ListOf, Nullable, Number, Spec, Text


@dataclasses.dataclass(frozen=True)
class NumberOrInf(Spec):
    """A finite number, or positive infinity (``math.inf``: "never"), returned as a ``float``."""

    unit: str = ""

    @property
    def what(self) -> str:
        return "a number" + (f" in {self.unit}" if self.unit else "") + " or math.inf"

    def decode(self, value: Any, name: str) -> float:
        if isinstance(value, dict) and set(value) == {NONFINITE} and value[NONFINITE] == "inf":
            return math.inf
        return Number(self.unit).decode(value, name)


@dataclasses.dataclass(frozen=True)
class SpecEntries(Spec):
    """A ``PartitionSpec`` as ``(whether it is one, its entries)``: each entry None, a mesh axis name,
    or a sequence of axis names; returned as ``(bool, tuple of entries)``, tuples for the sequences."""

    what = "a jax.sharding.PartitionSpec: P(...) with a mesh axis name, a tuple of names or None per dimension"

    def decode(self, value: Any, name: str) -> tuple:
        if type(value) is not list or len(value) != 2 or type(value[0]) is not bool or type(value[1]) is not list:
            raise self.fail(value, name)
        entries = []
        for e in value[1]:
            if e is None or type(e) is str:
                entries.append(e)
            elif type(e) is list and e and all(type(a) is str for a in e):
                entries.append(tuple(e))
            else:
                raise AnswerError(f"{name} must be {self.what}; it holds the entry {e!r:.60}")
        return value[0], tuple(entries)


def _spec(name: str) -> Answer:
    return Answer(SpecEntries(), f"(isinstance({name}, __import__('jax.sharding', fromlist=['PartitionSpec'])"
                                 f".PartitionSpec), tuple({name}))")


CANDIDATE = Fields({"name": Text(), "usd_per_gpu_hour": Number("$/GPU-hour"), "throughput_per_s": Number("tokens/s"),
                    "latency_ms": Number("ms"), "basis": Text()}, label="a utils.capacity.cost.Candidate")
RIGHT_SIZING = Fields({"choice": CANDIDATE, "n_gpus": Count(1), "usd_per_hour": Number("$/hour")},
                      label="what utils.capacity.cost.right_size returns")
SLO_OPTION = Fields({"accelerator": Text(), "scaled_tpot_ms": Number("ms"), "tokens_per_s_per_device": Number("tokens/s"),
                     "devices": Count(1), "usd_per_device_hour": Number("$/hour"), "monthly_cost_usd": Number("$")},
                    label="an accelerators.SloOption")
SLO_REJECTION = Fields({"accelerator": Text(), "reason": Text(), "scaled_tpot_ms": Nullable(Number("ms"))},
                       label="an accelerators.SloRejection")
SLO_CHOICE = Fields({"options": ListOf(SLO_OPTION), "cheapest": Nullable(SLO_OPTION), "rejected": ListOf(SLO_REJECTION),
                     "demand_tokens_per_s": Number("tokens/s"), "measured_bandwidth_gbs": Number("GB/s")},
                    label="what accelerators.cheapest_for_slo returns")
STOPWATCH = Fields({"method": Text(), "steps": Count(1), "median_ms": Number("ms", positive=True),
                    "p20_ms": Number("ms", at_least=0.0), "p80_ms": Number("ms", at_least=0.0),
                    "total_s": Number("s", positive=True), "tokens_per_s": Nullable(Number("tokens/s"))},
                   label="the dict from stopwatch.summary()")
DECODE = DictOf(Count(1), Fields({"t1": TIMING, "tn": TIMING, "tpot_ms": Number("ms"), "tokens_per_s": Number("tokens/s")},
                                 label="{'t1', 'tn', 'tpot_ms', 'tokens_per_s'}"))
OVERHEAD = Fields({"step": TIMING, "sync_save": TIMING, "async_blocking": TIMING, "async_total": TIMING,
                   "checkpoint_bytes": Count()}, label="the dict from checkpointed_run.measure_checkpoint_overhead")
MESH_SHAPE = DictOf(Text(), Count(1))
RIGHT_SIZING_NUMBERS = {"decode": DECODE, "MY_BANDWIDTH_GBS": Number("GB/s", positive=True), "BYTES_PER_STEP": Count(1),
                        "TPOT_SLO_MS": Number("ms", positive=True), "DEMAND_TOKENS_PER_S": Number("tokens/s", positive=True)}

ANSWERS = {
    "test_speedup": {},
    "test_points": answers(matmul_tflops=Number("TFLOP/s"), matmul_time=TIMING, copy_gbs=Number("GB/s"),
                           copy_time=TIMING),
    "test_cost_functions": {},
    "test_measured_costs": answers(samples_per_s=Number("samples/s"), train=STOPWATCH, decode=DECODE,
                                   usd_per_sample=Number("$"), usd_per_million_tokens=Number("$"),
                                   PRICE_USD_PER_HOUR=Number("$/GPU-hour")),
    "test_right_sizing": answers(candidates=ListOf(CANDIDATE), answer=RIGHT_SIZING, copy_gbs=Number("GB/s"),
                                 **RIGHT_SIZING_NUMBERS),
    "test_beyond_gpus": answers(BEYOND=SLO_CHOICE, MONTHLY_TOKENS=Number("tokens"), **RIGHT_SIZING_NUMBERS),
    "test_resume": {},
    "test_checkpoint_overhead": answers(overhead=OVERHEAD, sync_overhead_pct=Number("%"), async_overhead_pct=Number("%")),
    "test_spot": {},
    "test_recompiles": answers(compiles_unpadded=Count(), compiles_bucketed=Count(), compile_ms=Number("ms"),
                               run_ms=Number("ms"), eager_ms=Number("ms"), break_even_calls=NumberOrInf("calls")),
    "test_topology": {},
    "test_pod_sharding": answers(DP_X=_spec("DP_X"), DP_W=_spec("DP_W"), TP_X=_spec("TP_X"), TP_W=_spec("TP_W"),
                                 MESH_DP=Answer(MESH_SHAPE, "dict(MESH_DP.shape)"),
                                 MESH_2D=Answer(MESH_SHAPE, "dict(MESH_2D.shape)")),
    "test_shard_bytes": {},
}
