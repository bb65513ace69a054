"""utils.diagnosis.trace_events on real trace formats (tests/data/traces) and malformed input, each read
through to the summary (utils.diagnosis.profile_diagnosis) so a misread shows as a wrong number."""

import pytest

from tests.kineto_events import kernel, op, rt, step
from utils.diagnosis import profile_diagnosis as D
from utils.diagnosis import trace_events as TE
from utils.diagnosis import trace_metrics as TM

# ---------------------------------------------------------------- real trace formats (tests/data/traces)
# Each fixture's format and source: tests/data/traces/README.md. Expected numbers are worked out
# by hand from the fixture's timestamps (noted beside each assertion).
TRACES = __import__("pathlib").Path(__file__).parent.parent / "data" / "traces"


def _one_line_error(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_real_hta_trace_file():
    """HTA's own test trace (copied verbatim): one 413451 us step, one 45 us CUTLASS kernel."""
    path = TRACES / "hta_backward_thread.json"
    events = TE.load_events(path)
    assert len(events) == 7 and TM.step_windows(events) == [(1666149715033200, 1666149715446651)]
    s = D.summarize(path)
    assert s.steps == 1 and s.step_time_ms == pytest.approx(413.451)
    assert s.gpu_idle_fraction == pytest.approx(1 - 45 / 413451) and s.gpu_busy_ms_per_step == pytest.approx(0.045)
    assert s.launches_per_step == 1  # the cudaLaunchKernel on the autograd thread 24922
    assert s.matmul_share == 1.0 and s.top[0].name.startswith("void cutlass::Kernel<cutlass_80_tensorop")
    assert s.diagnosis == "overhead-bound (launch/Python)"


def test_torch18_capitalised_categories_are_read():
    """torch 1.8 Kineto: "Kernel"/"Memcpy"/"Runtime"/"Operator". Before the fix every kernel was
    dropped and this GPU trace was diagnosed "cpu-bound (no GPU in the trace)"."""
    events = TE.load_events(TRACES / "torch18_kineto.json")
    cats = {e.cat for e in events}
    assert cats == {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}
    assert all(isinstance(e.tid, str) for e in events)  # "24572", "stream 7" kept as written
    s = D.summarize(TRACES / "torch18_kineto.json")
    # window 100..900 us; kernels 260-360, 370-390, 600-800, 820-850 -> busy 350 of 800
    assert s.device == "cuda" and s.steps == 2 and s.step_time_ms == pytest.approx(0.4)
    assert s.gpu_idle_fraction == pytest.approx(1 - 350 / 800) and s.gpu_busy_ms_per_step == pytest.approx(0.175)
    assert s.mean_kernel_us == pytest.approx(87.5) and s.matmul_share == pytest.approx(300 / 350)
    assert (s.h2d_copies_per_step, s.h2d_bytes_per_step, s.h2d_ms_per_step) == (0.5, 2048, pytest.approx(0.01))
    assert s.h2d_copies_by_source == {"Pageable": 1}
    assert s.launches_per_step == 2  # 4 cudaLaunchKernel, one on the backward thread "24610"
    assert s.loader_wait_ms_per_step == pytest.approx(0.07) and s.loader_wait_fraction == pytest.approx(0.175)
    assert s.cpu_work_ms_per_step == pytest.approx(0.33) and s.diagnosis == "overhead-bound (launch/Python)"
    assert s.top[0].name == "volta_sgemm_128x32_nt" and s.top[0].calls == 2


def test_torch2_ddp_compile_trace_gzipped():
    """torch 2.x, gzipped, ns-resolution timestamps, a compute stream 7, a second compute stream 13
    and an NCCL stream 20. Per 1000 us step the kernels cover 100-250, 260-500 (s7), 200-300 (s13),
    450-700 (NCCL), 720-800 (s7): 820 us of kernel time, 680 us of busy GPU."""
    path = TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz"
    events = TE.load_events(path)
    from collections import Counter
    assert Counter(e.cat for e in events) == {  # flows, instants and metadata skipped
        "user_annotation": 6, "gpu_user_annotation": 2, "python_function": 2, "cpu_op": 6, "cuda_runtime": 10,
        "cuda_driver": 4, "kernel": 10, "gpu_memcpy": 2, "gpu_memset": 2, "Trace": 1}
    assert any(e.pid == "Spans" for e in events)
    assert TM.step_windows(events) == [(5249248346000.125, 5249248347000.125), (5249248347000.125, 5249248348000.125)]
    window = TM.analysis_window(events)
    assert window == (5249248346000.125, 5249248348000.125)
    assert TM.gpu_busy_us(events, window) == {0: 2 * 680.0}  # streams merged, not summed (820)
    s = D.summarize(path)
    assert s.steps == 2 and s.step_time_ms == pytest.approx(1.0)
    assert s.gpu_idle_fraction == pytest.approx(0.32) and s.gpu_busy_ms_per_step == pytest.approx(0.68)
    assert s.mean_kernel_us == pytest.approx(820 / 5) and s.matmul_share == pytest.approx(340 / 820)  # tem + gemm
    assert s.launches_per_step == 5  # 2 cuLaunchKernel (Triton) + 3 cudaLaunchKernel
    assert s.h2d_copies_by_source == {"Pinned": 2} and s.h2d_bytes_per_step == 1048576
    assert s.h2d_ms_per_step == pytest.approx(0.0125) and s.host_syncs_per_step == 0
    assert s.loader_wait_ms_per_step == pytest.approx(0.05)
    assert s.top[0].name.startswith("ncclDevKernel_AllReduce") and s.top[0].share == pytest.approx(500 / 1640)
    assert s.diagnosis == "overhead-bound (launch/Python)"  # idle 32% and 0.95 ms of CPU work per step
    r = TM.comm_overlap(events)
    assert (r["steps"], r["devices"]) == (2, 1)
    assert r["comm_ms_per_step"] == pytest.approx(0.25) and r["overlapped_ms_per_step"] == pytest.approx(0.05)
    assert r["exposed_ms_per_step"] == pytest.approx(0.2) and r["overlap_fraction"] == pytest.approx(0.2)
    assert r["compute_ms_per_step"] == pytest.approx(0.48)  # 100-500 and 720-800, both compute streams merged


def test_comm_overlap_reads_old_nccl_kernel_names():
    events = TE.load_events(TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz")
    for e in events:
        if e.name.startswith("ncclDevKernel_"):
            e.name = "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)"  # NCCL < 2.19 naming
    r = TM.comm_overlap(events)
    assert r["comm_ms_per_step"] == pytest.approx(0.25) and r["exposed_ms_per_step"] == pytest.approx(0.2)


def test_two_gpus_in_one_process_are_measured_separately():
    """Device 0 busy 0-600 of 1000 us; device 1 busy 100-500 (stream 7) and 400-900 (stream 21).
    Merging the devices would give idle 0.1; summing device 1's streams, busy 900."""
    events = TE.load_events(TRACES / "torch2_two_gpus.json")
    window = TM.analysis_window(events)
    assert TM.gpu_busy_us(events, window) == {0: 600.0, 1: 800.0}
    assert TM.gpu_idle_fraction(events, window) == pytest.approx((0.4 + 0.2) / 2)
    s = D.summarize(TRACES / "torch2_two_gpus.json")
    assert s.gpu_busy_ms_per_step == pytest.approx(0.7) and s.gpu_idle_fraction == pytest.approx(0.3)


def test_cpu_only_trace_gives_a_cpu_diagnosis():
    """Two 1000 us steps, each waiting 300 us in the DataLoader and calling .item() once."""
    s = D.summarize(TRACES / "torch2_cpu_only.json")
    assert s.device == "cpu" and s.gpu_idle_fraction is None and s.steps == 2
    assert s.loader_wait_fraction == pytest.approx(0.3) and s.host_syncs_per_step == 1
    assert s.sync_wait_ms_per_step == pytest.approx(0.01) and s.cpu_work_ms_per_step == pytest.approx(0.69)
    assert s.diagnosis == "data-loading-bound" and s.findings == ["data-loading-bound"]
    # self times per step: AddmmBackward0 250, addmm 150, linear 200-150, mse_loss 50, _local_scalar_dense 8, item 2
    top = {t.name: t.total_ms for t in s.top}
    assert top == {"autograd::engine::evaluate_function: AddmmBackward0": pytest.approx(0.5),
                   "aten::addmm": pytest.approx(0.3), "aten::linear": pytest.approx(0.1),
                   "aten::mse_loss": pytest.approx(0.1), "aten::_local_scalar_dense": pytest.approx(0.016)}
    assert s.top[0].share == pytest.approx(250 / 510)


def test_begin_end_pairs_string_timestamps_and_ns_display_unit():
    """B/E pairs become complete events; ts are numeric strings; "displayTimeUnit": "ns" does not
    rescale (ts stays in us). Step 100.5-1100.5 us, kernels 200.5-500.5 and 400.5-700.5 us."""
    events = TE.load_events(TRACES / "chrome_begin_end.json")
    assert sorted((e.name, e.ts, e.dur) for e in events) == [
        ("ProfilerStep#1", 100.5, 1000.0), ("elementwise_kernel", 400.5, 300.0), ("gemm_kernel", 200.5, 300.0)]
    s = D.summarize(TRACES / "chrome_begin_end.json")
    assert s.steps == 1 and s.step_time_ms == pytest.approx(1.0)
    assert s.gpu_busy_ms_per_step == pytest.approx(0.5) and s.gpu_idle_fraction == pytest.approx(0.5)


def test_begin_end_pairs_nest_per_thread_and_unclosed_begins_are_dropped():
    ev = [{"ph": "B", "name": "outer", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0},
          {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10},
          {"ph": "B", "name": "other thread", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 12},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 30, "args": {"n": 1}},
          {"ph": "E", "pid": 1, "tid": 1, "ts": 50},
          {"ph": "E", "pid": 1, "tid": 3, "ts": 60},  # an E with no B: ignored
          {"ph": "B", "name": "odd args", "cat": "cpu_op", "pid": 2, "tid": 1, "ts": 0, "args": [1]},
          {"ph": "E", "pid": 2, "tid": 1, "ts": 5, "args": "x"}]
    got = sorted((e.name, e.ts, e.dur, e.args) for e in TE.load_events(ev))
    assert got == [("inner", 10.0, 20.0, {"n": 1}), ("odd args", 0.0, 5.0, {}), ("outer", 0.0, 50.0, {})]


def test_legacy_autograd_profiler_trace_without_categories():
    """torch.autograd.profiler without Kineto: no "cat"; "CUDA functions" hold the GPU time (150-550 us)."""
    events = TE.load_events(TRACES / "legacy_autograd.json")
    assert {(e.pid, e.cat) for e in events} == {("CPU functions", "cpu_op"), ("CUDA functions", "kernel")}
    s = D.summarize(TRACES / "legacy_autograd.json")
    assert s.device == "cuda" and s.gpu_idle_fraction == pytest.approx(0.6)
    assert s.gpu_busy_ms_per_step == pytest.approx(0.4)


def test_a_chrome_trace_that_is_not_a_pytorch_profile_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not a PyTorch profiler trace") as exc:
        D.summarize(TRACES / "chrome_browser_not_torch.json", steps=1)
    assert "toplevel" in _one_line_error(exc)


def test_without_steps_kinetos_trace_span_is_not_part_of_the_window():
    # the "Trace" span runs from T-120 to T+2180 us; the work from T+0.125 (the first
    # python_function) to T+1998.625 (the second one's end), T = 5249248346000.125
    events = [e for e in TE.load_events(TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz")
              if not e.name.startswith("ProfilerStep#")]
    assert TM.analysis_window(events) == (5249248346000.25, 5249248347998.75)


def test_hip_launch_and_sync_names_of_rocm_traces():
    ev = [step(1, 0, 1000), rt("hipLaunchKernel", 10, 5), rt("hipExtModuleLaunchKernel", 20, 5),
          op("aten::item", 100, 300), rt("hipStreamSynchronize", 110, 280),
          kernel(30, 100, "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32")]
    events = TE.load_events(ev)
    windows = TM.step_windows(events)
    assert TM.count_launches(events, windows) == 2 and TM.host_syncs(events, windows) == (1, 300.0)


# ---------------------------------------------------------------- malformed input: one line, no traceback

def test_malformed_files_give_one_line_errors(tmp_path):
    gz = (TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz").read_bytes()
    cases = {"not_json.json": b"this is not json",
             "truncated.json.gz": gz[: len(gz) // 2],  # a copy cut short
             "empty.json": b"",
             "latin1.json": b'{"traceEvents": [{"name": "\xe9"}]}'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="is not a Chrome-trace JSON file") as exc:
            D.summarize(tmp_path / name)
        _one_line_error(exc)
    with pytest.raises(FileNotFoundError, match="is a directory"):
        D.summarize(tmp_path)


@pytest.mark.parametrize("trace, match", [
    ({"schemaVersion": 1}, "needs a 'traceEvents' list"),
    ({"traceEvents": None}, "'traceEvents' must be a list"),
    ({"traceEvents": []}, "holds no events with a duration"),
    ({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}},
                      {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 5}]},
     "holds no events with a duration"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "abc", "dur": 1}]}, "ts='abc'"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": float("nan"), "dur": 1}]}, "ts=nan"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": [3]}]}, "dur=\\[3\\]"),
    ({"traceEvents": [{"ph": "B", "cat": "cpu_op", "name": "k", "ts": None}]}, "ts=None"),
])
def test_malformed_traces_give_one_line_errors(trace, match):
    with pytest.raises(ValueError, match=match) as exc:
        D.summarize(trace, steps=1)
    _one_line_error(exc)


def test_tolerated_irregularities(tmp_path):
    # null dur (0), negative dur (0), args that are not a dict, pid/tid of odd types
    ev = [step(1, 0, 100), {**kernel(10, 20), "args": ["x"]}, {**kernel(40, 10), "dur": None},
          {**kernel(60, -5), "tid": [7]}, {**op("aten::mm", 5, 10), "pid": {"a": 1}}]
    s = D.summarize(ev)
    assert s.gpu_busy_ms_per_step == pytest.approx(0.02) and s.steps == 1
    # Kineto files that strict JSON rejects: raw control characters (tb_plugin reads them with
    # strict=False) and Windows paths with raw backslashes (pytorch/kineto#336)
    (tmp_path / "ctrl.json").write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\tb", '
                                        '"pid": 1, "tid": 1, "ts": 0, "dur": 5}]}')
    assert TE.load_events(tmp_path / "ctrl.json")[0].name == "a\tb"
    (tmp_path / "win.json").write_text('{"traceEvents": [{"ph": "X", "cat": "python_function", '
                                       '"name": "C:\\Users\\me\\\\train.py(3): f", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}')
    assert TE.load_events(tmp_path / "win.json")[0].name == "C:\\Users\\me\\train.py(3): f"
    # gzip is recognised by content, whatever the file is called
    (tmp_path / "renamed.json").write_bytes((TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz").read_bytes())
    assert D.summarize(tmp_path / "renamed.json").gpu_busy_ms_per_step == pytest.approx(0.68)
