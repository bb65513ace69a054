"""utils.profiling: exact numbers from synthetic Kineto traces, diagnoses, and end-to-end CPU profiles."""
import gzip
import json
import time

import pytest

from utils import profiling as P

# ---------------------------------------------------------------- synthetic Kineto events
# Shapes as prof.export_chrome_trace writes them (ts/dur in us; GPU events: pid=device, tid=stream).
HOST, MAIN, BWD = 100, 1, 2


def step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": HOST, "tid": MAIN, "ts": ts, "dur": dur}


def gpu_step_copy(n, ts, dur):  # Kineto's copy of the step on the GPU timeline: must be ignored
    return {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "pid": 0, "tid": 7, "ts": ts, "dur": dur}


def kernel(ts, dur, name="void at::native::vectorized_elementwise_kernel<4>", stream=7, device=0):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream, "correlation": 1}}


def rt(name, ts, dur, tid=MAIN, cat="cuda_runtime", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur, "args": args}


def op(name, ts, dur, tid=MAIN, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur, "args": args}


def loader(ts, dur, multi=False):
    it = "_MultiProcessingDataLoaderIter" if multi else "_SingleProcessDataLoaderIter"
    return {"ph": "X", "cat": "user_annotation", "name": f"enumerate(DataLoader)#{it}.__next__",
            "pid": HOST, "tid": MAIN, "ts": ts, "dur": dur}


def h2d(ts, dur, nbytes, src="Pageable"):
    return {"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy HtoD ({src} -> Device)", "pid": 0, "tid": 7,
            "ts": ts, "dur": dur, "args": {"device": 0, "stream": 7, "bytes": nbytes}}


def noise():  # metadata, flows and instants that a real trace carries and the summary must skip
    return [{"ph": "M", "name": "process_name", "pid": HOST, "tid": 0, "args": {"name": "python"}},
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": HOST, "tid": MAIN, "ts": 5},
            {"ph": "i", "name": "Record Window End", "pid": HOST, "tid": 0, "ts": 9e9, "s": "t"}]


# ---------------------------------------------------------------- pure pieces

def test_intersection_of_interval_sets():
    assert P.intersection_us([(0, 10)], [(5, 20)]) == 5
    assert P.intersection_us([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert P.intersection_us([(0, 4), (2, 6)], [(3, 5), (4, 8)]) == 3  # each side merged first: [0,6] with [3,8]
    assert P.intersection_us([(0, 10)], []) == 0 and P.intersection_us([(0, 1)], [(1, 2)]) == 0


NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_comm_overlap_splits_hidden_from_exposed():
    """Two steps on one GPU: the backward's compute kernels on stream 7, an all-reduce on the
    NCCL stream 20 that starts during the backward and ends 3 ms after it."""
    ev = [step(1, 0, 10_000), step(2, 10_000, 10_000)]
    for t in (0, 10_000):
        ev += [kernel(t, 6_000), kernel(t + 6_000, 1_000, name="sm90_xmma_gemm_bf16bf16"),
               kernel(t + 5_000, 5_000, name=NCCL, stream=20)]
    r = P.comm_overlap([e for e in (P._from_dict(d) for d in ev) if e])
    assert r["steps"] == 2 and r["devices"] == 1
    assert r["comm_ms_per_step"] == pytest.approx(5.0)
    assert r["overlapped_ms_per_step"] == pytest.approx(2.0)  # 5-7 ms: NCCL next to compute
    assert r["exposed_ms_per_step"] == pytest.approx(3.0)  # 7-10 ms: NCCL alone
    assert r["compute_ms_per_step"] == pytest.approx(7.0) and r["overlap_fraction"] == pytest.approx(0.4)
    assert r["window_ms_per_step"] == pytest.approx(10.0)


def test_comm_overlap_none_without_communication_kernels():
    ev = [P._from_dict(d) for d in (step(1, 0, 100), kernel(0, 50))]
    assert P.comm_overlap(ev) is None


def test_union_counts_overlapping_kernels_once():
    assert P.union_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert P.union_us([(0, 10), (2, 3), (10, 12)]) == 12  # enclosed and touching
    assert P.union_us([]) == 0


def test_idle_fraction_from_known_gaps_and_two_overlapping_streams():
    ev = [step(2, 0, 400), step(3, 400, 400), gpu_step_copy(2, 0, 800),
          kernel(0, 100), kernel(50, 100, stream=13),  # overlap: busy 0..150
          kernel(300, 100), kernel(500, 50), kernel(700, 200),  # the last runs past the CPU's step end
          ] + noise()
    events = P.load_events(ev)
    assert P.step_windows(events) == [(0, 400), (400, 800)]
    window = P.analysis_window(events)
    assert window == (0, 900)
    assert P.gpu_busy_us(events, window) == {0: 150 + 100 + 50 + 200}
    assert P.gpu_idle_fraction(events, window) == pytest.approx(1 - 500 / 900, abs=1e-12)
    s = P.summarize(ev)
    assert s.steps == 2 and s.step_time_ms == pytest.approx(0.45) and s.gpu_busy_ms_per_step == pytest.approx(0.25)


def test_idle_is_per_device_then_averaged_and_kernels_clip_to_the_window():
    ev = [step(1, 100, 100), kernel(50, 100, device=0), kernel(100, 100, device=1, stream=20)]
    events = P.load_events(ev)
    window = P.analysis_window(events)
    assert window == (100, 200)
    assert P.gpu_busy_us(events, window) == {0: 50, 1: 100}
    assert P.gpu_idle_fraction(events, window) == pytest.approx((0.5 + 0.0) / 2)


def test_h2d_copies_count_bytes_time_and_pageable_vs_pinned():
    ev = [step(1, 0, 1000), step(2, 1000, 1000),
          h2d(10, 20, 4096), h2d(40, 30, 8192, "Pinned"), h2d(1010, 50, 4096),
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
           "ts": 1100, "dur": 5, "args": {"bytes": 4}}]
    events = P.load_events(ev)
    out = P.h2d_copies(events, P.analysis_window(events))
    assert out == {"count": 3, "bytes": 16384, "time_us": 100.0, "by_source": {"Pageable": 2, "Pinned": 1}}
    s = P.summarize(ev)
    assert (s.h2d_copies_per_step, s.h2d_bytes_per_step, s.h2d_ms_per_step) == (1.5, 8192, 0.05)


def test_launches_count_runtime_driver_and_graph_calls_once_each():
    ev = [step(1, 0, 1000), step(2, 1000, 1000),
          rt("cudaLaunchKernel", 10, 10), rt("cuLaunchKernel", 12, 5, cat="cuda_driver"),  # nested: one launch
          rt("cuLaunchKernel", 30, 5, cat="cuda_driver"),  # Triton launches through the driver
          rt("cudaLaunchKernelExC", 50, 5, tid=BWD),  # the autograd thread
          rt("cudaGraphLaunch", 1100, 20), rt("cudaMemcpyAsync", 1200, 5),
          rt("cudaLaunchKernel", 2500, 5)]  # after the last step: not counted
    events = P.load_events(ev)
    assert P.count_launches(events, P.step_windows(events)) == 4
    assert P.summarize(ev).launches_per_step == 2


def test_host_syncs_nested_item_counts_once_and_cpu_tensor_item_not_at_all():
    ev = [step(1, 0, 1000), step(2, 1000, 1000), kernel(0, 10),
          # loss.item() on a CUDA tensor: item > _local_scalar_dense > cudaMemcpyAsync + cudaStreamSynchronize
          op("aten::item", 100, 300), op("aten::_local_scalar_dense", 101, 298, **{"External id": 9}),
          rt("cudaMemcpyAsync", 110, 5), rt("cudaStreamSynchronize", 120, 270, **{"External id": 9}),
          # Adam's step counter: .item() on a CPU tensor, no synchronize inside
          op("aten::item", 500, 3), op("aten::_local_scalar_dense", 500.5, 2),
          # torch.cuda.synchronize() in the second step
          rt("cudaDeviceSynchronize", 1500, 100),
          # the profiler's own sync at stop, after the last step: not counted
          rt("cudaDeviceSynchronize", 2100, 50)]
    events = P.load_events(ev)
    assert P.host_syncs(events, P.step_windows(events)) == (2, 400.0)
    s = P.summarize(ev)
    assert s.host_syncs_per_step == 1 and s.sync_wait_ms_per_step == pytest.approx(0.2)


def test_cpu_only_trace_counts_every_item_as_a_would_be_sync():
    ev = [step(1, 0, 100), op("aten::item", 10, 5), op("aten::_local_scalar_dense", 11, 3)]
    events = P.load_events(ev)
    assert P.host_syncs(events, P.step_windows(events)) == (1, 5.0)


def test_loader_wait_per_step_single_and_multiprocess():
    ev = [step(1, 0, 1000), step(2, 1000, 1000), loader(0, 300), loader(1000, 500, multi=True), loader(2500, 99)]
    events = P.load_events(ev)
    assert P.loader_wait_us(events, P.step_windows(events)) == 800
    s = P.summarize(ev)
    assert s.loader_wait_ms_per_step == pytest.approx(0.4) and s.loader_wait_fraction == pytest.approx(0.4)


def test_top_cpu_ops_by_self_time_and_top_kernels_by_total_time():
    ev = [step(1, 0, 1000), op("aten::linear", 0, 100), op("aten::addmm", 10, 50), op("aten::t", 70, 10),
          op("aten::addmm", 200, 30)]
    events = P.load_events(ev)
    top = {t.name: (t.calls, t.total_ms) for t in P.top_cpu_ops(events, P.step_windows(events))}
    assert top == {"aten::addmm": (2, pytest.approx(0.08)), "aten::linear": (1, pytest.approx(0.04)),
                   "aten::t": (1, pytest.approx(0.01))}
    s = P.summarize(ev)
    assert s.device == "cpu" and s.top_label.startswith("CPU ops") and s.top[0].name == "aten::addmm"
    assert s.gpu_idle_fraction is None and s.diagnosis == "cpu-bound (no GPU in the trace)"

    kev = [step(1, 0, 100), kernel(0, 30, "sm90_xmma_gemm_f32f32"), kernel(40, 30, "sm90_xmma_gemm_f32f32"),
           kernel(80, 20, "elementwise")]
    ks = P.top_kernels(P.load_events(kev), (0, 100))
    assert [(k.name, k.calls, k.total_ms, k.share) for k in ks] == [
        ("sm90_xmma_gemm_f32f32", 2, pytest.approx(0.06), pytest.approx(0.75)), ("elementwise", 1, pytest.approx(0.02), pytest.approx(0.25))]
    assert P.summarize(kev).top_label == "GPU kernels by total device time"


# ---------------------------------------------------------------- diagnoses, one scenario each

def _steps(n, dur=1000):
    return [step(i + 1, i * dur, dur) for i in range(n)]


def test_scenario_data_loading_bound():
    ev = _steps(4)
    for i in range(4):
        t = i * 1000
        ev += [loader(t, 500), rt("cudaLaunchKernel", t + 510, 5), kernel(t + 520, 300, "sm80_xmma_gemm")]
    s = P.summarize(ev)
    assert s.loader_wait_fraction == pytest.approx(0.5) and s.gpu_idle_fraction == pytest.approx(0.7)
    # after the loader fix the 0.5 ms of CPU work per step would still outlast 0.3 ms of kernels
    assert s.diagnosis == "data-loading-bound" and s.findings == ["data-loading-bound", "overhead-bound (launch/Python)"]
    assert "50%" in s.explanation and "num_workers" in s.suggestion


def test_scenario_copy_bound():
    ev = _steps(2)
    for t in (0, 1000):
        ev += [rt("cudaMemcpyAsync", t, 300), h2d(t + 5, 290, 64 << 20), rt("cudaLaunchKernel", t + 310, 5),
               kernel(t + 320, 400, "cutlass_gemm")]
    s = P.summarize(ev)
    assert s.h2d_copies_by_source == {"Pageable": 2} and s.h2d_bytes_per_step == 64 << 20
    assert s.diagnosis == "copy-bound" and "pin_memory" in s.suggestion


def test_scenario_host_sync_bound():
    ev = _steps(3)
    for i in range(3):
        t = i * 1000
        ev += [rt("cudaLaunchKernel", t + 10 * k, 5) for k in range(10)]
        ev += [kernel(t + 100, 600, "sm90_xmma_gemm"), op("aten::item", t + 100, 605),
               op("aten::_local_scalar_dense", t + 101, 603), rt("cudaStreamSynchronize", t + 110, 590)]
    s = P.summarize(ev)
    assert s.launches_per_step == 10 and s.host_syncs_per_step == 1
    assert s.gpu_idle_fraction == pytest.approx(0.4) and s.cpu_work_ms_per_step == pytest.approx(0.395)
    assert s.diagnosis == "host-sync-bound" and ".item()" in s.suggestion


def test_scenario_overhead_bound():
    ev = _steps(2)
    for t in (0, 1000):
        for k in range(100):
            ev += [rt("cudaLaunchKernel", t + 10 * k, 4), rt("cuLaunchKernel", t + 10 * k + 1, 2, cat="cuda_driver"),
                   kernel(t + 10 * k + 5, 2)]
    s = P.summarize(ev)
    assert s.launches_per_step == 100 and s.mean_kernel_us == 2 and s.gpu_idle_fraction == pytest.approx(0.8)
    assert s.diagnosis == "overhead-bound (launch/Python)" and "torch.compile" in s.suggestion
    assert "100 launches" in s.explanation


def test_scenario_sync_with_slow_host_is_overhead_not_sync():
    # a sync per step, but the CPU's own work exceeds the GPU's: removing the sync would not feed the GPU
    ev = _steps(2)
    for t in (0, 1000):
        ev += [kernel(t + 800, 100), op("aten::item", t + 800, 110), rt("cudaStreamSynchronize", t + 805, 100)]
    s = P.summarize(ev)
    assert s.host_syncs_per_step == 1 and s.cpu_work_ms_per_step > s.gpu_busy_ms_per_step
    assert s.diagnosis == "overhead-bound (launch/Python)"


@pytest.mark.parametrize("name, expected", [("sm90_xmma_gemm_bf16bf16_bf16f32", "compute-bound"),
                                            ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "compute-bound"),
                                            ("void at::native::vectorized_elementwise_kernel<4>", "memory-bound"),
                                            ("triton_red_fused_native_layer_norm_0", "memory-bound")])
def test_scenario_busy_gpu_compute_vs_memory(name, expected):
    ev = _steps(2) + [kernel(0, 1900, name), kernel(1900, 100, "reduce_kernel")]
    s = P.summarize(ev)
    assert s.gpu_idle_fraction == 0 and s.diagnosis == expected


def test_slow_host_without_syncs_is_overhead_bound():
    ev = _steps(1) + [op("aten::mm", 0, 100), loader(100, 150), kernel(600, 400, "gemm")]
    s = P.summarize(ev)  # loader 15%: under its threshold; the CPU's 0.85 ms of work outlasts the GPU's 0.4
    assert s.cpu_work_ms_per_step == pytest.approx(0.85) and s.gpu_busy_ms_per_step == pytest.approx(0.4)
    assert s.diagnosis == "overhead-bound (launch/Python)"


def test_idle_gpu_with_no_named_cause_says_so():
    # a sync every other step (under the one-per-step rule) and a small loader wait
    ev = _steps(2) + [kernel(0, 900, "gemm"), rt("cudaDeviceSynchronize", 50, 850),
                      loader(1000, 150), kernel(1150, 450, "gemm")]
    s = P.summarize(ev)
    assert s.gpu_idle_fraction == pytest.approx(0.325) and s.host_syncs_per_step == 0.5
    assert s.cpu_work_ms_per_step == pytest.approx(0.5) and s.gpu_busy_ms_per_step == pytest.approx(0.675)
    assert s.diagnosis == "idle GPU, cause not named" and "Perfetto" in s.suggestion


# ---------------------------------------------------------------- inputs, outputs, errors

def test_reads_paths_gzip_dicts_and_reports_bad_input(tmp_path):
    ev = _steps(2) + [loader(0, 600), loader(1000, 600)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    g = tmp_path / "t.json.gz"
    with gzip.open(g, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    assert P.summarize(p).loader_wait_fraction == P.summarize(str(g)).loader_wait_fraction == pytest.approx(0.6)
    with pytest.raises(FileNotFoundError, match="no trace at"):
        P.summarize(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a Chrome-trace JSON"):
        P.summarize(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="traceEvents"):
        P.summarize({"events": []})
    with pytest.raises(ValueError, match="cannot read trace events"):
        P.summarize(42)
    with pytest.raises(ValueError, match="pass steps=N"):
        P.summarize([op("aten::mm", 0, 10)])
    with pytest.raises(ValueError, match="holds 2 ProfilerStep"):
        P.summarize(ev, steps=3)
    s = P.summarize([op("aten::mm", 0, 10), op("aten::mm", 10, 10)], steps=2)  # no schedule: steps given
    assert s.steps == 2 and s.step_time_ms == pytest.approx(0.01)


def test_summary_dict_is_json_and_report_is_readable():
    ev = _steps(2) + [loader(0, 600), loader(1000, 600), h2d(700, 10, 1000), kernel(720, 50, "gemm")]
    s = P.summarize(ev)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["diagnosis"] == "data-loading-bound" and d["top"][0]["name"] == "gemm"
    text = str(s)
    assert "diagnosis: data-loading-bound" in text and "pageable 0.5" in text and "GPU idle" in text


def test_profiler_arguments_are_checked():
    with pytest.raises(ValueError, match="active must be an integer >= 1"):
        P.make_profiler(active=0)
    with pytest.raises(ValueError, match="step_fn must be a callable"):
        P.profile_steps(None)


# ---------------------------------------------------------------- end to end on the CPU

torch = pytest.importorskip("torch")


class _SlowData(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(0.005)  # a slow decoder: 4 samples -> at least 20 ms per batch
        return torch.full((16,), float(i % 7)), torch.ones(1)


def _loop(dataset, batch=4, item=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(torch.utils.data.DataLoader(dataset, batch_size=batch))

    def train_step():
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if item:
            loss.item()
    return train_step


def test_end_to_end_sleepy_dataloader_is_data_loading_bound(tmp_path):
    s = P.profile_steps(_loop(_SlowData()), steps=3, warmup=1, trace_path=tmp_path / "trace.json")
    assert s.steps == 3 and s.device == "cpu"
    assert s.loader_wait_ms_per_step >= 20.0  # time.sleep sleeps at least as long as asked
    assert s.diagnosis == "data-loading-bound", str(s)
    assert s.host_syncs_per_step == 0 and s.launches_per_step == 0
    assert (tmp_path / "trace.json").is_file() and s.trace_path == str(tmp_path / "trace.json")
    # the same trace read back, and through prof.events(), gives the same counts
    assert P.summarize(tmp_path / "trace.json").loader_wait_ms_per_step == s.loader_wait_ms_per_step


def test_end_to_end_item_per_step_is_one_sync_per_step():
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    with_item = P.profile_steps(_loop(data, item=True), steps=4, warmup=1)
    without = P.profile_steps(_loop(data, item=False), steps=4, warmup=1)
    assert with_item.host_syncs_per_step == 1 and without.host_syncs_per_step == 0


def test_function_events_give_the_same_counts_as_the_chrome_trace():
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    step_fn = _loop(data, item=True)
    prof = P.make_profiler(wait=0, warmup=1, active=2, cuda=False)
    with prof:
        for _ in range(3):
            step_fn()
            prof.step()
    events = list(prof.events())
    a, b = P.summarize(prof), P.summarize(events)
    assert a.steps == b.steps == 2 and a.host_syncs_per_step == b.host_syncs_per_step == 1
    assert a.loader_wait_ms_per_step == pytest.approx(b.loader_wait_ms_per_step, rel=1e-3)
    for e in events:  # torch before 2.13 has no activity_type: categories are guessed from the event
        e.activity_type = None
    c = P.summarize(events)
    assert (c.steps, c.host_syncs_per_step, c.loader_wait_ms_per_step) == (b.steps, 1, b.loader_wait_ms_per_step)
    assert [t.name for t in c.top] == [t.name for t in b.top]


# ---------------------------------------------------------------- real trace formats (tests/data/traces)
# Each fixture's format and source: tests/data/traces/README.md. Expected numbers are worked out
# by hand from the fixture's timestamps (noted beside each assertion).
TRACES = __import__("pathlib").Path(__file__).parent / "data" / "traces"


def _one_line_error(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_real_hta_trace_file():
    """HTA's own test trace (copied verbatim): one 413451 us step, one 45 us CUTLASS kernel."""
    path = TRACES / "hta_backward_thread.json"
    events = P.load_events(path)
    assert len(events) == 7 and P.step_windows(events) == [(1666149715033200, 1666149715446651)]
    s = P.summarize(path)
    assert s.steps == 1 and s.step_time_ms == pytest.approx(413.451)
    assert s.gpu_idle_fraction == pytest.approx(1 - 45 / 413451) and s.gpu_busy_ms_per_step == pytest.approx(0.045)
    assert s.launches_per_step == 1  # the cudaLaunchKernel on the autograd thread 24922
    assert s.matmul_share == 1.0 and s.top[0].name.startswith("void cutlass::Kernel<cutlass_80_tensorop")
    assert s.diagnosis == "overhead-bound (launch/Python)"


def test_torch18_capitalised_categories_are_read():
    """torch 1.8 Kineto: "Kernel"/"Memcpy"/"Runtime"/"Operator". Before the fix every kernel was
    dropped and this GPU trace was diagnosed "cpu-bound (no GPU in the trace)"."""
    events = P.load_events(TRACES / "torch18_kineto.json")
    cats = {e.cat for e in events}
    assert cats == {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}
    assert all(isinstance(e.tid, str) for e in events)  # "24572", "stream 7" kept as written
    s = P.summarize(TRACES / "torch18_kineto.json")
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
    events = P.load_events(path)
    from collections import Counter
    assert Counter(e.cat for e in events) == {  # flows, instants and metadata skipped
        "user_annotation": 6, "gpu_user_annotation": 2, "python_function": 2, "cpu_op": 6, "cuda_runtime": 10,
        "cuda_driver": 4, "kernel": 10, "gpu_memcpy": 2, "gpu_memset": 2, "Trace": 1}
    assert any(e.pid == "Spans" for e in events)
    assert P.step_windows(events) == [(5249248346000.125, 5249248347000.125), (5249248347000.125, 5249248348000.125)]
    window = P.analysis_window(events)
    assert window == (5249248346000.125, 5249248348000.125)
    assert P.gpu_busy_us(events, window) == {0: 2 * 680.0}  # streams merged, not summed (820)
    s = P.summarize(path)
    assert s.steps == 2 and s.step_time_ms == pytest.approx(1.0)
    assert s.gpu_idle_fraction == pytest.approx(0.32) and s.gpu_busy_ms_per_step == pytest.approx(0.68)
    assert s.mean_kernel_us == pytest.approx(820 / 5) and s.matmul_share == pytest.approx(340 / 820)  # tem + gemm
    assert s.launches_per_step == 5  # 2 cuLaunchKernel (Triton) + 3 cudaLaunchKernel
    assert s.h2d_copies_by_source == {"Pinned": 2} and s.h2d_bytes_per_step == 1048576
    assert s.h2d_ms_per_step == pytest.approx(0.0125) and s.host_syncs_per_step == 0
    assert s.loader_wait_ms_per_step == pytest.approx(0.05)
    assert s.top[0].name.startswith("ncclDevKernel_AllReduce") and s.top[0].share == pytest.approx(500 / 1640)
    assert s.diagnosis == "overhead-bound (launch/Python)"  # idle 32% and 0.95 ms of CPU work per step
    r = P.comm_overlap(events)
    assert (r["steps"], r["devices"]) == (2, 1)
    assert r["comm_ms_per_step"] == pytest.approx(0.25) and r["overlapped_ms_per_step"] == pytest.approx(0.05)
    assert r["exposed_ms_per_step"] == pytest.approx(0.2) and r["overlap_fraction"] == pytest.approx(0.2)
    assert r["compute_ms_per_step"] == pytest.approx(0.48)  # 100-500 and 720-800, both compute streams merged


def test_comm_overlap_reads_old_nccl_kernel_names():
    events = P.load_events(TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz")
    for e in events:
        if e.name.startswith("ncclDevKernel_"):
            e.name = "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)"  # NCCL < 2.19 naming
    r = P.comm_overlap(events)
    assert r["comm_ms_per_step"] == pytest.approx(0.25) and r["exposed_ms_per_step"] == pytest.approx(0.2)


def test_two_gpus_in_one_process_are_measured_separately():
    """Device 0 busy 0-600 of 1000 us; device 1 busy 100-500 (stream 7) and 400-900 (stream 21).
    Merging the devices would give idle 0.1; summing device 1's streams, busy 900."""
    events = P.load_events(TRACES / "torch2_two_gpus.json")
    window = P.analysis_window(events)
    assert P.gpu_busy_us(events, window) == {0: 600.0, 1: 800.0}
    assert P.gpu_idle_fraction(events, window) == pytest.approx((0.4 + 0.2) / 2)
    s = P.summarize(TRACES / "torch2_two_gpus.json")
    assert s.gpu_busy_ms_per_step == pytest.approx(0.7) and s.gpu_idle_fraction == pytest.approx(0.3)


def test_cpu_only_trace_gives_a_cpu_diagnosis():
    """Two 1000 us steps, each waiting 300 us in the DataLoader and calling .item() once."""
    s = P.summarize(TRACES / "torch2_cpu_only.json")
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
    events = P.load_events(TRACES / "chrome_begin_end.json")
    assert sorted((e.name, e.ts, e.dur) for e in events) == [
        ("ProfilerStep#1", 100.5, 1000.0), ("elementwise_kernel", 400.5, 300.0), ("gemm_kernel", 200.5, 300.0)]
    s = P.summarize(TRACES / "chrome_begin_end.json")
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
    got = sorted((e.name, e.ts, e.dur, e.args) for e in P.load_events(ev))
    assert got == [("inner", 10.0, 20.0, {"n": 1}), ("odd args", 0.0, 5.0, {}), ("outer", 0.0, 50.0, {})]


def test_legacy_autograd_profiler_trace_without_categories():
    """torch.autograd.profiler without Kineto: no "cat"; "CUDA functions" hold the GPU time (150-550 us)."""
    events = P.load_events(TRACES / "legacy_autograd.json")
    assert {(e.pid, e.cat) for e in events} == {("CPU functions", "cpu_op"), ("CUDA functions", "kernel")}
    s = P.summarize(TRACES / "legacy_autograd.json")
    assert s.device == "cuda" and s.gpu_idle_fraction == pytest.approx(0.6)
    assert s.gpu_busy_ms_per_step == pytest.approx(0.4)


def test_a_chrome_trace_that_is_not_a_pytorch_profile_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not a PyTorch profiler trace") as exc:
        P.summarize(TRACES / "chrome_browser_not_torch.json", steps=1)
    assert "toplevel" in _one_line_error(exc)


def test_without_steps_kinetos_trace_span_is_not_part_of_the_window():
    # the "Trace" span runs from T-120 to T+2180 us; the work from T+0.125 (the first
    # python_function) to T+1998.625 (the second one's end), T = 5249248346000.125
    events = [e for e in P.load_events(TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz")
              if not e.name.startswith("ProfilerStep#")]
    assert P.analysis_window(events) == (5249248346000.25, 5249248347998.75)


def test_hip_launch_and_sync_names_of_rocm_traces():
    ev = [step(1, 0, 1000), rt("hipLaunchKernel", 10, 5), rt("hipExtModuleLaunchKernel", 20, 5),
          op("aten::item", 100, 300), rt("hipStreamSynchronize", 110, 280),
          kernel(30, 100, "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32")]
    events = P.load_events(ev)
    windows = P.step_windows(events)
    assert P.count_launches(events, windows) == 2 and P.host_syncs(events, windows) == (1, 300.0)


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
            P.summarize(tmp_path / name)
        _one_line_error(exc)
    with pytest.raises(FileNotFoundError, match="is a directory"):
        P.summarize(tmp_path)


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
        P.summarize(trace, steps=1)
    _one_line_error(exc)


def test_tolerated_irregularities(tmp_path):
    # null dur (0), negative dur (0), args that are not a dict, pid/tid of odd types
    ev = [step(1, 0, 100), {**kernel(10, 20), "args": ["x"]}, {**kernel(40, 10), "dur": None},
          {**kernel(60, -5), "tid": [7]}, {**op("aten::mm", 5, 10), "pid": {"a": 1}}]
    s = P.summarize(ev)
    assert s.gpu_busy_ms_per_step == pytest.approx(0.02) and s.steps == 1
    # Kineto files that strict JSON rejects: raw control characters (tb_plugin reads them with
    # strict=False) and Windows paths with raw backslashes (pytorch/kineto#336)
    (tmp_path / "ctrl.json").write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a\tb", '
                                        '"pid": 1, "tid": 1, "ts": 0, "dur": 5}]}')
    assert P.load_events(tmp_path / "ctrl.json")[0].name == "a\tb"
    (tmp_path / "win.json").write_text('{"traceEvents": [{"ph": "X", "cat": "python_function", '
                                       '"name": "C:\\Users\\me\\\\train.py(3): f", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}')
    assert P.load_events(tmp_path / "win.json")[0].name == "C:\\Users\\me\\train.py(3): f"
    # gzip is recognised by content, whatever the file is called
    (tmp_path / "renamed.json").write_bytes((TRACES / "torch2_ddp_compile_rank0.pt.trace.json.gz").read_bytes())
    assert P.summarize(tmp_path / "renamed.json").gpu_busy_ms_per_step == pytest.approx(0.68)
