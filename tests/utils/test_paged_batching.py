"""utils.serving.paged_batching: the paged engine decodes what the model decodes, refuses a schedule a
real pool could not run, and static batching is a valid schedule that the rule beats on steps."""
from __future__ import annotations

import pytest

from utils.kv.kvcache import KVSpec
from utils.serving import paged_batching as pb

SPEC = KVSpec(2, 2, 32, 4)  # llama-tiny's KV geometry in fp32


def dry(trace, **kw):
    return pb.PagedEngine(None, trace, spec=SPEC, **{"num_blocks": 16, "block_size": 4, "max_batch": 4, **kw})


def rule(engine):
    from grader.labs.inference_serving.reference import rule_schedule

    rule_schedule(engine)
    return engine.result()


@pytest.fixture(scope="module")
def model():
    import torch

    from utils.model.models import build_model

    torch.manual_seed(0)
    return build_model(pb.MODEL).eval()


def greedy(model, ids, n):
    """``n`` greedy tokens, recomputing the whole sequence each time (no cache at all)."""
    import torch

    out = []
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(model(input_ids=ids, use_cache=False).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
    return out


def test_blocks_for_is_the_ceiling_and_the_engine_uses_vllms_count():
    assert [pb.blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    e = dry([pb.Request(0, 0, 3, 2)])
    assert [e.blocks_needed(n) for n in (1, 4, 5, 17)] == [1, 1, 2, 5]
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        pb.blocks_for(3, 0)


def test_make_trace_is_deterministic_and_within_its_ranges():
    a, b = pb.make_trace(30, 5), pb.make_trace(30, 5)
    assert a == b and a != pb.make_trace(30, 6)
    assert [r.rid for r in a] == list(range(30))
    assert all(4 <= r.prompt_len <= 24 and 1 <= r.output_len <= 24 for r in a)
    assert [r.arrival_step for r in a] == sorted(r.arrival_step for r in a)


def test_paged_decode_gives_the_tokens_of_generate_alone_and_in_a_batch(model):
    """The cache read through block tables is the model's cache: greedy tokens equal
    transformers' generate for one request, and each request's tokens are the same served alone
    or beside others (fp32 on the CPU)."""
    trace = pb.make_trace(6, 2)
    e = pb.PagedEngine(model, trace, num_blocks=60)
    rule(e)
    for r in trace[:3]:
        ids = e._prompts[r.rid][None]
        assert e.tokens(r.rid) == greedy(model, ids, r.output_len)
        alone = pb.PagedEngine(model, [pb.Request(0, 0, r.prompt_len, r.output_len)], num_blocks=60)
        alone._prompts[0] = e._prompts[r.rid]
        rule(alone)
        assert alone.tokens(0) == e.tokens(r.rid)


def test_static_batching_is_a_valid_schedule_that_takes_more_steps_than_the_rule():
    trace = pb.make_trace(12, 4)
    st = dry(trace, num_blocks=32, max_batch=8)
    pb.static_batching(st)
    s = st.result()
    c = rule(dry(trace, num_blocks=32, max_batch=8))
    assert s["tokens"] == c["tokens"] == sum(r.output_len for r in trace)
    assert c["busy_steps"] < s["busy_steps"] and c["mean_latency_steps"] < s["mean_latency_steps"]
    assert c["peak_blocks"] <= 32 and s["peak_blocks"] <= 32


@pytest.mark.parametrize("tables, match", [
    ({0: [0], 1: [0]}, "block 0 is in the tables of requests 0 and 1"),
    ({0: [0, 1], 1: [2]}, "request 0 holds 2 blocks; after this step it caches 3 tokens"),
    ({0: [99], 1: [2]}, "block 99 of request 0 is not in the pool"),
    ({0: [0], 1: [1], 2: [2]}, "request 2 arrives at step 5"),
    ({0: [0], 7: [1]}, "no request 7"),
    ({}, "non-empty dict"),
])
def test_the_engine_refuses_what_a_pool_could_not_run(tables, match):
    e = dry([pb.Request(0, 0, 3, 3), pb.Request(1, 0, 2, 2), pb.Request(2, 5, 2, 2)])
    with pytest.raises(pb.ScheduleError, match=match):
        e.step(tables)


def test_the_engine_refuses_moved_blocks_dropped_requests_and_overcommitted_admissions():
    e = dry([pb.Request(0, 0, 3, 4), pb.Request(1, 0, 2, 4)], num_blocks=3)
    e.step({0: [0]})
    with pytest.raises(pb.ScheduleError, match="blocks \\[0\\] changed to \\[1\\]"):
        e.step({0: [1]})
    with pytest.raises(pb.ScheduleError, match="request 0 is running and not finished"):
        e.step({1: [1]})
    with pytest.raises(pb.ScheduleError, match="leaves too few blocks"):
        e.step({0: [0], 1: [1]})  # 0 will need 2 blocks, 1 needs 2: 4 > 3
    with pytest.raises(pb.ScheduleError, match="wait\\(\\) with requests \\[0\\] running"):
        e.wait()


def test_a_scheduler_that_never_finishes_is_stopped_and_an_unfinished_run_has_no_result():
    e = dry([pb.Request(0, 3, 2, 2)])
    with pytest.raises(pb.ScheduleError, match="does not finish"):
        while True:
            e.wait()
    with pytest.raises(pb.ScheduleError, match="did not get all their tokens"):
        e.result()


def test_timed_runs_report_the_median_run(model):
    trace = pb.make_trace(4, 1, output_lens=(1, 4))
    r = pb.timed_runs(pb.static_batching, lambda: pb.PagedEngine(model, trace, num_blocks=40), 3)
    assert r["time"].runs == 3 and r["tokens"] == sum(x.output_len for x in trace)
    assert r["tokens_per_s"] == pytest.approx(r["tokens"] / (r["time"].median_ms / 1e3))
    assert r["mean_latency_ms"] > 0 and r["mean_latency_steps"] >= 1
