"""Lab 02's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``): each value crosses as JSON and
is checked against its spec before any judge sees it. The cells whose functions are judged on
hidden cases or in a harness read nothing here (``test_memory``, ``test_zero_memory``,
``test_busbw``, ``test_fused_kernel``, ``test_second_fusion``): the grader runs those functions in
a sandbox instead (``judges.py``). The runs the notebook launched (``allreduce``, ``SYNC``, ``one``,
``many``, ``BREAKS``) cross as the fields the judges read of the scripts' JSON.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from grader.labs import answers
from grader.schema import NONFINITE, Count, DictOf, Fields, Flag, Label, ListOf, Nullable, Number, Spec, Text
from utils.parallel.grad_sync import GAP_CAUSES, LEARNER_VERSIONS, VERSIONS
from utils.parallel.scaling_breaks import CAUSES, SCENARIOS

BACKENDS = ("gloo", "nccl")


@dataclasses.dataclass(frozen=True)
class Real(Spec):
    """A number that may be infinite (a gradient check's worst error when a version's gradient is missing)."""

    what = "a number (infinity allowed)"

    def decode(self, value: Any, name: str) -> float:
        if isinstance(value, dict) and set(value) == {NONFINITE} and value[NONFINITE] in ("inf", "-inf"):
            return float(value[NONFINITE])
        if type(value) not in (int, float) or math.isnan(value):
            raise self.fail(value, name)
        return float(value)


# benchmarks/allreduce.py's JSON (launch.run_allreduce)
ALLREDUCE_ROW = Fields({"bytes": Count(1), "time_us": Number("us", positive=True), "algbw_gbs": Number("GB/s"),
                        "busbw_gbs": Number("GB/s")}, label="a row of allreduce['results']")
LINK = Fields({"name": Text(), "per_direction_gbs": Number("GB/s", positive=True)}, label="allreduce['link']")
ALLREDUCE = Fields({"results": ListOf(ALLREDUCE_ROW, 1, 64), "world_size": Count(1), "backend": Label(BACKENDS),
                    "link": Nullable(LINK)}, optional=("link",), label="the dict launch.run_allreduce returned")

# benchmarks/train_multi_gpu.py's JSON (launch.run_training)
TRAIN_CONFIG = Fields({"preset": Text(), "batch_per_device": Count(1), "seq": Count(1), "steps": Count(1),
                       "warmup": Count(), "compile": Flag(), "bf16": Flag(), "grad_accum": Count(1),
                       "no_sync_accum": Flag()}, label="a run's config")
TRAIN_RANK = Fields({"rank": Count(), "tokens_per_s": Number("tokens/s"), "steps": Count(), "total_s": Number("s"),
                     "median_ms": Number("ms"), "p20_ms": Number("ms"), "p80_ms": Number("ms"),
                     "step_times_ms": ListOf(Number("ms"), 0, 10_000), "nosync_median_ms": Nullable(Number("ms")),
                     "exposed_comm_share": Nullable(Number())},
                    optional=("step_times_ms", "nosync_median_ms", "exposed_comm_share"), label="a rank of a run's per_rank")
RUN = Fields({"world_size": Count(1), "distributed_type": Text(), "config": TRAIN_CONFIG,
              "tokens_per_step_per_device": Count(1), "per_rank": ListOf(TRAIN_RANK, 1, 1024),
              "tokens_per_s_per_device": Number("tokens/s"), "total_tokens_per_s": Number("tokens/s"),
              "exposed_comm_share": Nullable(Number()), "env": DictOf(Text(), Nullable(Text()))},
             optional=("exposed_comm_share", "env"), label="the dict launch.run_training returned")

# benchmarks/grad_sync.py's JSON (launch.run_grad_sync)
SYNC_TIMES = Fields({"median_ms": Number("ms", positive=True), "p20_ms": Number("ms"), "p80_ms": Number("ms"),
                     "runs": Count(1), "per_rank_median_ms": ListOf(Number("ms"), 1, 1024)}, label="a version's times")
SYNC_GRADS = Fields({"match": Flag(), "worst_rel_err": Real(), "worst_param": Text(), "rank": Count(),
                     "steps_checked": Count()}, label="a version's gradient check")
SYNC_CALLS = Fields({"calls": Count(), "bytes": Count(), "max_call_bytes": Count(), "in_backward": Count()},
                    label="a version's all-reduce calls")
SYNC_CONFIG = Fields({"preset": Text(), "batch": Count(1), "seq": Count(1), "steps": Count(1), "warmup": Count(),
                      "bucket_mb": Number("MB"), "check_bucket_mb": Nullable(Number("MB")), "dtype": Text()},
                     label="SYNC['config']")
SYNC = Fields({"benchmark": Label(("grad_sync",)), "world_size": Count(1), "backend": Label(BACKENDS),
               "config": SYNC_CONFIG, "grad_tensors": Count(1), "grad_bytes": Count(1), "largest_grad_bytes": Count(1),
               "versions": DictOf(Label(VERSIONS), SYNC_TIMES, keys=VERSIONS),
               "grads": DictOf(Text(), SYNC_GRADS), "calls": DictOf(Text(), SYNC_CALLS),
               "vs_ddp": DictOf(Label(LEARNER_VERSIONS), Number(), keys=LEARNER_VERSIONS),
               "exposed_comm_share": DictOf(Label(LEARNER_VERSIONS), Number(), keys=LEARNER_VERSIONS)},
              label="the dict launch.run_grad_sync returned")
SYNC_EXPLANATION = Fields({"fastest": Label(LEARNER_VERSIONS), "each_comm_share": Number(), "each_vs_ddp": Number(),
                           "cause": Label(GAP_CAUSES)}, label="SYNC_EXPLANATION")
EXPLANATION = Fields({"efficiency": Number(), "exposed_comm_share": Number(), "dominant_cause": Label(CAUSES),
                      "worst_break": Label(SCENARIOS)}, label="EXPLANATION")
BREAKS = DictOf(Label(SCENARIOS), RUN)

ANSWERS = {
    "test_memory": {},
    "test_zero_memory": {},
    "test_busbw": {},
    "test_allreduce": answers(allreduce=ALLREDUCE, BUSBW_GBS=Number("GB/s")),
    "test_grad_sync": answers(SYNC=SYNC),
    "test_sync_speed": answers(SYNC=SYNC, SYNC_VS_DDP=DictOf(Label(LEARNER_VERSIONS), Number("x"),
                                                             keys=LEARNER_VERSIONS)),
    "test_sync_explanation": answers(SYNC=SYNC, SYNC_EXPLANATION=SYNC_EXPLANATION),
    "test_scaling": answers(one=RUN, many=RUN, scaling_efficiency=Number(), comm_share=Number()),
    "test_breaks": answers(BREAKS=BREAKS),
    "test_explanation": answers(EXPLANATION=EXPLANATION, scaling_efficiency=Number(), comm_share=Number(),
                                BREAKS=BREAKS),
    "test_parallelism": answers(MIN_TP=Count(1)),
    "test_fused_kernel": {},
    "test_second_fusion": {},
}
