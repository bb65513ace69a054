"""utils.serving.loadgen's pure parts: metric definitions, goodput, load held, arrivals, prompts, inputs."""
import json
import math

import numpy as np
import pytest

from utils.serving import loadgen
from utils.serving.loadgen.client import RequestRecord, endpoint_url


def _rec(i, *, ttft, e2el, tokens, itl=(), ok=True, reason="", sent=0.0, done=None, usage=True, scheduled=None):
    return RequestRecord(i, scheduled_s=sent if scheduled is None else scheduled, sent_s=sent,
                         done_s=sent + (e2el or 0.0) if done is None else done, ttft_s=ttft, e2el_s=e2el, itl_s=list(itl),
                         output_tokens=tokens, tokens_from_usage=usage, ok=ok, reason=reason)


def test_stats_ms_matches_numpy_and_handles_no_values():
    s = loadgen.stats_ms([0.001, 0.002, 0.003, 0.010])
    assert s["mean"] == pytest.approx(4.0) and s["median"] == pytest.approx(2.5) and s["n"] == 4
    assert s["p90"] == pytest.approx(np.percentile([1, 2, 3, 10], 90))
    assert s["p99"] == pytest.approx(np.percentile([1, 2, 3, 10], 99)) and s["max"] == 10.0
    empty = loadgen.stats_ms([])
    assert empty["n"] == 0 and empty["mean"] is None and empty["p99"] is None


def test_summarize_uses_vllm_definitions():
    # Two requests: TTFT 100/200 ms; 5 and 3 tokens; E2EL 300/260 ms.
    recs = [_rec(0, ttft=0.100, e2el=0.300, tokens=5, itl=[0.05] * 4),
            _rec(1, ttft=0.200, e2el=0.260, tokens=3, itl=[0.02, 0.04], usage=False),
            _rec(2, ttft=None, e2el=None, tokens=0, ok=False, reason="http_500")]
    s = loadgen.summarize(recs, duration_s=2.0, concurrency=2)
    assert s["completed"] == 2 and s["failed"] == 1 and s["failures"] == {"http_500": 1}
    assert s["ttft_ms"]["mean"] == pytest.approx(150.0)
    # TPOT = (E2EL - TTFT)/(tokens - 1): 200/4 = 50 ms and 60/2 = 30 ms, then the mean over requests.
    assert s["tpot_ms"]["mean"] == pytest.approx(40.0) and s["tpot_ms"]["n"] == 2
    # ITL pools every gap: four of 50, one of 20, one of 40.
    assert s["itl_ms"]["mean"] == pytest.approx((4 * 50 + 20 + 40) / 6) and s["itl_ms"]["n"] == 6
    assert s["e2el_ms"]["mean"] == pytest.approx(280.0)
    assert s["request_throughput"] == pytest.approx(1.0) and s["output_throughput"] == pytest.approx(4.0)
    assert s["output_tokens_source"] == "mixed"


def test_one_token_requests_have_no_tpot_but_count_as_meeting_the_tpot_slo():
    r = _rec(0, ttft=0.1, e2el=0.1, tokens=1)
    assert r.tpot_s is None
    assert loadgen.meets_slo(r, {"tpot": 1.0, "ttft": 150.0})
    assert not loadgen.meets_slo(r, {"ttft": 50.0})


def test_goodput_counts_requests_meeting_every_slo():
    recs = [_rec(0, ttft=0.05, e2el=0.5, tokens=10), _rec(1, ttft=0.30, e2el=0.6, tokens=10),
            _rec(2, ttft=0.05, e2el=2.0, tokens=10)]
    s = loadgen.summarize(recs, duration_s=4.0, slo={"ttft": 100.0, "e2el": 1000.0})
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["request_goodput"] == pytest.approx(0.25)
    assert s["goodput"]["fraction_of_completed"] == pytest.approx(1 / 3, abs=1e-4)


def test_parse_goodput_accepts_vllm_form_and_rejects_the_rest():
    assert loadgen.parse_goodput(["ttft:500", "TPOT:50", "e2el:2000.5"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.5}
    for bad in (["ttft=5"], ["itl:5"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            loadgen.parse_goodput(bad)


def test_in_flight_is_time_weighted():
    # [0,1] and [0,2] over [0,2]: 1.5 on average, 2 at most.
    mean, peak = loadgen.in_flight([(0.0, 1.0), (0.0, 2.0)], 0.0, 2.0)
    assert mean == pytest.approx(1.5) and peak == 2
    # Back-to-back intervals never overlap.
    assert loadgen.in_flight([(0.0, 1.0), (1.0, 2.0)], 0.0, 2.0) == (pytest.approx(1.0), 1)


def test_assess_load_flags_a_concurrency_it_did_not_hold():
    kw = dict(request_rate=math.inf, num_requests=1000, in_flight_max=64, dispatch_delay_p99_ms=None, sent_rate=None,
              schedule_rate=None)
    held, warning = loadgen.assess_load(concurrency=64, in_flight_mean=31.0, **kw)
    assert not held and "31.0" in warning and "64" in warning
    assert loadgen.assess_load(concurrency=64, in_flight_mean=63.5, **kw) == (True, None)
    # Fewer requests than the concurrency: the most it could hold is the number of requests.
    kw["num_requests"] = 10
    assert loadgen.assess_load(concurrency=64, in_flight_mean=10.0, **kw)[0]


def test_assess_load_flags_late_dispatch_and_a_slow_send_rate():
    kw = dict(concurrency=None, request_rate=50.0, num_requests=100, in_flight_mean=3.0, in_flight_max=5)
    assert loadgen.assess_load(dispatch_delay_p99_ms=1.0, sent_rate=49.0, schedule_rate=50.0, **kw) == (True, None)
    held, warning = loadgen.assess_load(dispatch_delay_p99_ms=25.0, sent_rate=49.0, schedule_rate=50.0, **kw)
    assert not held and "dispatch delay" in warning
    held, warning = loadgen.assess_load(dispatch_delay_p99_ms=1.0, sent_rate=30.0, schedule_rate=50.0, **kw)
    assert not held and "30.00 req/s" in warning
    kw["request_rate"] = math.inf  # all at once: dispatch delay is the workload, not a fault
    assert loadgen.assess_load(dispatch_delay_p99_ms=500.0, sent_rate=None, schedule_rate=None, **kw)[0]


def test_constant_arrivals_are_evenly_spaced():
    t = loadgen.arrival_offsets(5, 4.0, arrival="constant")
    assert t.tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert loadgen.arrival_offsets(4, math.inf).tolist() == [0.0] * 4


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_gamma_arrivals_have_the_named_mean_rate_and_spread(burstiness):
    # Gaps ~ gamma(shape b, scale 1/(R b)): mean 1/R, CV 1/sqrt(b). With 20000 gaps the standard
    # error of the mean gap is CV/sqrt(20000) <= 1.5%, so a 6% band is four standard errors.
    n, rate = 20001, 8.0
    gaps = np.diff(loadgen.arrival_offsets(n, rate, burstiness=burstiness, seed=1))
    assert 1 / gaps.mean() == pytest.approx(rate, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)
    same = loadgen.arrival_offsets(50, rate, burstiness=burstiness, seed=1)
    assert np.array_equal(same, loadgen.arrival_offsets(50, rate, burstiness=burstiness, seed=1))
    assert not np.array_equal(same, loadgen.arrival_offsets(50, rate, burstiness=burstiness, seed=2))


def test_synthetic_prompts_without_a_tokenizer_have_input_len_words():
    ps = loadgen.synthetic_prompts(20, 37, seed=3)
    assert all(len(p.split()) == 37 for p in ps) and len(set(ps)) == 20
    assert ps == loadgen.synthetic_prompts(20, 37, seed=3)


def test_synthetic_prompts_with_a_tokenizer_have_exactly_input_len_tokens():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", *[f"w{i}" for i in range(300)]])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    ps = loadgen.synthetic_prompts(5, 23, seed=0, tokenizer=hf)
    assert [len(hf.encode(p, add_special_tokens=False)) for p in ps] == [23] * 5
    assert "[UNK]" not in " ".join(ps)


def test_jsonl_rows_and_errors_name_the_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "hi", "output_len": 4}) + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    assert len(loadgen.load_jsonl(good, "chat")) == 2
    with pytest.raises(loadgen.LoadgenError, match="line 3: 'messages' needs --endpoint chat"):
        loadgen.load_jsonl(good, "completions")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(loadgen.LoadgenError, match="line 2: not JSON"):
        loadgen.load_jsonl(bad, "completions")
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(loadgen.LoadgenError, match="line 1: needs a string 'prompt'"):
        loadgen.load_jsonl(bad, "completions")
    with pytest.raises(loadgen.LoadgenError, match="no such file"):
        loadgen.load_jsonl(tmp_path / "missing.jsonl", "completions")


def test_bodies_ask_for_a_fixed_output_length(tmp_path):
    w = loadgen.Workload("http://h:1", "m", num_requests=3, input_len=8, output_len=16, endpoint="chat")
    bodies = loadgen.build_bodies(w)
    assert len(bodies) == 3 and bodies[0]["messages"][0]["role"] == "user"
    assert bodies[0]["max_tokens"] == bodies[0]["min_tokens"] == 16 and bodies[0]["ignore_eos"] is True
    assert bodies[0]["stream_options"] == {"include_usage": True}
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "output_len": 3}\n{"prompt": "b"}\n')
    w = loadgen.Workload("http://h:1", "m", num_requests=3, output_len=9, dataset=str(data), fixed_output=False,
                         extra_body={"temperature": 0})
    bodies = loadgen.build_bodies(w)
    assert [b["prompt"] for b in bodies] == ["a", "b", "a"] and [b["max_tokens"] for b in bodies] == [3, 9, 3]
    assert "ignore_eos" not in bodies[0] and bodies[0]["temperature"] == 0


def test_endpoint_url_accepts_base_with_or_without_v1():
    assert endpoint_url("http://h:8000", "completions") == "http://h:8000/v1/completions"
    assert endpoint_url("http://h:8000/v1/", "chat") == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h/x/v1/completions", "chat") == "http://h/x/v1/completions"
    with pytest.raises(loadgen.LoadgenError, match="http://"):
        endpoint_url("h:8000", "completions")


def test_workload_validation_is_one_clear_message():
    for kw, msg in (({"concurrency": 0}, "--concurrency"), ({"request_rate": 0}, "--request-rate"),
                    ({"arrival": "bursty"}, "--arrival"), ({"stream": False, "slo_ms": {"ttft": 5}}, "needs streaming")):
        with pytest.raises(loadgen.LoadgenError, match=msg):
            loadgen.Workload("http://h:1", "m", **kw).validate()
    assert loadgen.Workload("http://h:1", "m", concurrency=1).kind == "synchronous"
    assert "poisson" in loadgen.Workload("http://h:1", "m", request_rate=3).kind


def test_prompts_whose_random_ids_never_settle_are_redrawn_from_whole_words():
    from utils.model.models import shipped_tokenizer

    tok = shipped_tokenizer()  # byte-level BPE: random ids merge when joined
    ps = [p for seed in range(40) for p in loadgen.synthetic_prompts(6, 16, seed=seed, tokenizer=tok)]
    assert [len(tok.encode(p, add_special_tokens=False)) for p in ps] == [16] * len(ps)
    words = loadgen.workloads._word_ids(tok, [i for i in range(len(tok)) if i not in set(tok.all_special_ids)])
    assert len(words) > 100 and all(tok.encode(tok.decode([i, i]), add_special_tokens=False) == [i, i] for i in words[:50])


def test_a_tokenizer_that_merges_everything_is_a_clear_error():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "a": 1, "aa": 2}  # no pre-tokenizer: "a" + "a" always re-encodes as "aa"
    tok = Tokenizer(models.BPE(vocab, [("a", "a")], unk_token="[UNK]"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    with pytest.raises(loadgen.LoadgenError, match="exactly 5 tokens.*--dataset"):
        loadgen.synthetic_prompts(3, 5, seed=0, tokenizer=hf)
