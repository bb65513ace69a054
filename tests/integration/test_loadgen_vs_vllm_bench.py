"""benchmarks/loadgen_vs_vllm_bench.py's pure parts: result parsing, histogram deltas, the table."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.procs import load_script

ROOT = Path(__file__).resolve().parents[2]
bench = load_script(ROOT / "benchmarks" / "loadgen_vs_vllm_bench.py", "loadgen_vs_vllm_bench")

# A ``vllm bench serve --save-result`` file as vLLM 0.32 writes it (fields trimmed).
VLLM_RESULT = {
    "date": "20261201-210000", "backend": "openai", "num_prompts": 48, "request_rate": "inf", "max_concurrency": 4,
    "duration": 6.0, "completed": 47, "total_input_tokens": 47 * 64, "total_output_tokens": 47 * 32,
    "request_throughput": 7.83, "output_throughput": 250.7, "median_ttft_ms": 40.0, "mean_ttft_ms": 45.0,
    "median_tpot_ms": 15.0, "mean_tpot_ms": 15.5, "median_itl_ms": 14.0, "mean_itl_ms": 15.2,
    "median_e2el_ms": 500.0, "mean_e2el_ms": 520.0, "p99_ttft_ms": 90.0,
}


def test_parse_vllm_bench_result_reads_its_fields():
    m = bench.parse_vllm_bench_result(VLLM_RESULT)
    assert m["completed"] == 47 and m["failed"] == 1  # num_prompts - completed when 'failed' is absent
    assert m["median_ttft_ms"] == 40.0 and m["mean_e2el_ms"] == 520.0 and m["median_itl_ms"] == 14.0
    assert m["prompt_tokens_mean"] == 64 and m["output_tokens_mean"] == 32 and m["duration_s"] == 6.0
    assert bench.parse_vllm_bench_result({**VLLM_RESULT, "failed": 3})["failed"] == 3


def test_parse_course_result_reads_loadgen_json():
    stats = {"median": 10.0, "mean": 11.0}
    d = {"completed": 48, "failed": 0, "cancelled": 0, "not_sent": 0, "duration_s": 5.0, "request_throughput": 9.6,
         "output_throughput": 307.2, "prompt_tokens_mean": 65.0, "output_tokens_mean": 32.0,
         "ttft_ms": stats, "tpot_ms": stats, "itl_ms": stats, "e2el_ms": {"median": 400.0, "mean": 410.0},
         "client": {"cpu_s": 0.12}}
    m = bench.parse_course_result(d)
    assert m["median_e2el_ms"] == 400.0 and m["mean_ttft_ms"] == 11.0 and m["run_cpu_s"] == 0.12
    assert m["completed"] == 48 and m["failed"] == 0


METRICS_BEFORE = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.1
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""
METRICS_AFTER = """vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.9
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.2
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 6.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 50.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.5
"""


def test_histogram_totals_sum_label_sets_and_skip_buckets():
    t = bench.histogram_totals(METRICS_AFTER)
    assert t["vllm:time_to_first_token_seconds"] == pytest.approx((1.1, 7.0))  # both engines
    assert t["vllm:request_time_per_output_token_seconds"] == (0.0, 0.0)  # absent
    b = bench.histogram_totals(METRICS_BEFORE)
    assert b["vllm:time_to_first_token_seconds"] == pytest.approx((0.5, 1.0))  # the _bucket line not counted


def test_histogram_means_are_sum_delta_over_count_delta():
    means = bench.histogram_means(bench.histogram_totals(METRICS_BEFORE), bench.histogram_totals(METRICS_AFTER))
    assert means["ttft"] == {"mean_ms": pytest.approx(100.0), "count": 6}  # (1.1 - 0.5) / (7 - 1)
    assert means["e2el"] == {"mean_ms": pytest.approx(1000.0), "count": 4}
    assert means["itl"] == {"mean_ms": pytest.approx(10.0), "count": 40}
    assert means["tpot"] == {"mean_ms": None, "count": 0}  # nothing counted in the window


def test_run_order_alternates_pairs():
    assert bench.run_order(3) == [(0, "course"), (0, "vllm-bench"), (1, "vllm-bench"), (1, "course"),
                                  (2, "course"), (2, "vllm-bench")]


def _run(client, pair, med, mean, server, cpu):
    metrics = {f"median_{m}_ms": med for m in bench.METRICS} | {f"mean_{m}_ms": mean for m in bench.METRICS}
    return {"client": client, "pair": pair, "ok": True, "metrics": metrics,
            "server": {m: {"mean_ms": server, "count": 48} for m in bench.METRICS},
            "process_cpu_ms_per_request": cpu, "run_cpu_ms_per_request": cpu / 10}


def test_summarize_runs_ratio_of_medians_and_against_server():
    runs = [_run("course", 0, 10.0, 11.0, 10.0, 30.0), _run("vllm-bench", 0, 8.0, 9.0, 9.0, 200.0),
            _run("vllm-bench", 1, 10.0, 10.0, 10.0, 220.0), _run("course", 1, 12.0, 12.0, 12.0, 40.0),
            _run("course", 2, 11.0, 11.0, 11.0, 35.0), {"client": "vllm-bench", "pair": 2, "ok": False}]
    s = bench.summarize_runs(runs)
    ttft = s["rows"][0]
    assert ttft["metric"] == "ttft" and ttft["course_median_ms"] == 11.0 and ttft["vllm_bench_median_ms"] == 9.0
    assert ttft["ratio_course_over_vllm_bench"] == pytest.approx(11 / 9, abs=1e-4)
    assert ttft["pair_ratio_min"] == pytest.approx(1.2) and ttft["pair_ratio_max"] == pytest.approx(1.25)
    assert ttft["course_mean_over_server_mean"] == pytest.approx(1.0)  # 1.1, 1.0, 1.0 -> median 1.0
    assert ttft["vllm_bench_mean_over_server_mean"] == pytest.approx(1.0)  # 9/9, 10/10
    assert s["cpu"]["course"]["process_cpu_ms_per_request"] == 35.0 and s["cpu"]["vllm-bench"]["runs"] == 2
    assert s["pairs_complete"] == 2
    table = bench.format_table(s)
    assert "1.222" in table and "vllm-bench" in table and len(table.splitlines()) == 1 + 4 + 3


def test_commands_carry_the_same_workload():
    fields = {"base_url": "http://127.0.0.1:9", "model": "/m", "tokenizer": "/m", "fixed_output": True,
              "extra_body": {"allowed_token_ids": [5, 6]}}
    kw = dict(num_requests=48, input_len=64, output_len=32, concurrency=4, seed=3)
    v = bench.vllm_bench_command("py", fields, result_dir="/r", result_filename="x.json", **kw)
    c = bench.course_command("py", fields, json_out="/r/c.json", **kw)
    val = lambda cmd, flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    assert val(v, "--num-prompts") == val(c, "--num-requests") == "48"
    assert val(v, "--random-input-len") == val(c, "--input-len") == "64"
    assert val(v, "--random-output-len") == val(c, "--output-len") == "32"
    assert val(v, "--max-concurrency") == val(c, "--concurrency") == "4" and val(v, "--request-rate") == "inf"
    assert val(v, "--extra-body") == val(c, "--extra-body") == '{"allowed_token_ids":[5,6]}'
    assert "--ignore-eos" in v and "--save-result" in v and val(v, "-c") == bench.VLLM_BENCH_ENTRY
    assert "--no-probe" in c
    with pytest.raises(bench.BenchError):
        bench.course_command("py", {**fields, "fixed_output": False}, json_out="x", **kw)


@pytest.mark.parametrize("bad", [dict(num_requests=0), dict(output_len=1), dict(concurrency=0), dict(pairs=0)])
def test_bad_options_are_one_line_errors(bad):
    kw = dict(num_requests=4, input_len=8, output_len=4, concurrency=2, pairs=1) | bad
    with pytest.raises(bench.BenchError):
        bench.check_options(**kw)
