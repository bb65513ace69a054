"""utils.diagnosis.profiling and the trace modules it runs on (trace_metrics, profile_diagnosis): exact
numbers from synthetic Kineto traces (tests/kineto_events.py), diagnoses, and end-to-end CPU
profiles. Real trace files and malformed input: tests/utils/test_trace_events.py."""
import gzip
import json
import time

import pytest

from tests.kineto_events import BWD, gpu_step_copy, h2d, kernel, loader, noise, op, rt, step
from utils.diagnosis import profile_diagnosis as D
from utils.diagnosis import profiling as P
from utils.diagnosis import trace_events as TE
from utils.diagnosis import trace_metrics as TM

# ---------------------------------------------------------------- pure pieces

def test_intersection_of_interval_sets():
    assert TM.intersection_us([(0, 10)], [(5, 20)]) == 5
    assert TM.intersection_us([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert TM.intersection_us([(0, 4), (2, 6)], [(3, 5), (4, 8)]) == 3  # each side merged first: [0,6] with [3,8]
    assert TM.intersection_us([(0, 10)], []) == 0 and TM.intersection_us([(0, 1)], [(1, 2)]) == 0


NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_comm_overlap_splits_hidden_from_exposed():
    """Two steps on one GPU: the backward's compute kernels on stream 7, an all-reduce on the
    NCCL stream 20 that starts during the backward and ends 3 ms after it."""
    ev = [step(1, 0, 10_000), step(2, 10_000, 10_000)]
    for t in (0, 10_000):
        ev += [kernel(t, 6_000), kernel(t + 6_000, 1_000, name="sm90_xmma_gemm_bf16bf16"),
               kernel(t + 5_000, 5_000, name=NCCL, stream=20)]
    r = TM.comm_overlap([e for e in (TE._from_dict(d) for d in ev) if e])
    assert r["steps"] == 2 and r["devices"] == 1
    assert r["comm_ms_per_step"] == pytest.approx(5.0)
    assert r["overlapped_ms_per_step"] == pytest.approx(2.0)  # 5-7 ms: NCCL next to compute
    assert r["exposed_ms_per_step"] == pytest.approx(3.0)  # 7-10 ms: NCCL alone
    assert r["compute_ms_per_step"] == pytest.approx(7.0) and r["overlap_fraction"] == pytest.approx(0.4)
    assert r["window_ms_per_step"] == pytest.approx(10.0)


def test_comm_overlap_none_without_communication_kernels():
    ev = [TE._from_dict(d) for d in (step(1, 0, 100), kernel(0, 50))]
    assert TM.comm_overlap(ev) is None


def test_union_counts_overlapping_kernels_once():
    assert TM.union_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert TM.union_us([(0, 10), (2, 3), (10, 12)]) == 12  # enclosed and touching
    assert TM.union_us([]) == 0


def test_idle_fraction_from_known_gaps_and_two_overlapping_streams():
    ev = [step(2, 0, 400), step(3, 400, 400), gpu_step_copy(2, 0, 800),
          kernel(0, 100), kernel(50, 100, stream=13),  # overlap: busy 0..150
          kernel(300, 100), kernel(500, 50), kernel(700, 200),  # the last runs past the CPU's step end
          ] + noise()
    events = TE.load_events(ev)
    assert TM.step_windows(events) == [(0, 400), (400, 800)]
    window = TM.analysis_window(events)
    assert window == (0, 900)
    assert TM.gpu_busy_us(events, window) == {0: 150 + 100 + 50 + 200}
    assert TM.gpu_idle_fraction(events, window) == pytest.approx(1 - 500 / 900, abs=1e-12)
    s = D.summarize(ev)
    assert s.steps == 2 and s.step_time_ms == pytest.approx(0.45) and s.gpu_busy_ms_per_step == pytest.approx(0.25)


def test_idle_is_per_device_then_averaged_and_kernels_clip_to_the_window():
    ev = [step(1, 100, 100), kernel(50, 100, device=0), kernel(100, 100, device=1, stream=20)]
    events = TE.load_events(ev)
    window = TM.analysis_window(events)
    assert window == (100, 200)
    assert TM.gpu_busy_us(events, window) == {0: 50, 1: 100}
    assert TM.gpu_idle_fraction(events, window) == pytest.approx((0.5 + 0.0) / 2)


def test_h2d_copies_count_bytes_time_and_pageable_vs_pinned():
    ev = [step(1, 0, 1000), step(2, 1000, 1000),
          h2d(10, 20, 4096), h2d(40, 30, 8192, "Pinned"), h2d(1010, 50, 4096),
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
           "ts": 1100, "dur": 5, "args": {"bytes": 4}}]
    events = TE.load_events(ev)
    out = TM.h2d_copies(events, TM.analysis_window(events))
    assert out == {"count": 3, "bytes": 16384, "time_us": 100.0, "by_source": {"Pageable": 2, "Pinned": 1}}
    s = D.summarize(ev)
    assert (s.h2d_copies_per_step, s.h2d_bytes_per_step, s.h2d_ms_per_step) == (1.5, 8192, 0.05)


def test_launches_count_runtime_driver_and_graph_calls_once_each():
    ev = [step(1, 0, 1000), step(2, 1000, 1000),
          rt("cudaLaunchKernel", 10, 10), rt("cuLaunchKernel", 12, 5, cat="cuda_driver"),  # nested: one launch
          rt("cuLaunchKernel", 30, 5, cat="cuda_driver"),  # Triton launches through the driver
          rt("cudaLaunchKernelExC", 50, 5, tid=BWD),  # the autograd thread
          rt("cudaGraphLaunch", 1100, 20), rt("cudaMemcpyAsync", 1200, 5),
          rt("cudaLaunchKernel", 2500, 5)]  # after the last step: not counted
    events = TE.load_events(ev)
    assert TM.count_launches(events, TM.step_windows(events)) == 4
    assert D.summarize(ev).launches_per_step == 2


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
    events = TE.load_events(ev)
    assert TM.host_syncs(events, TM.step_windows(events)) == (2, 400.0)
    s = D.summarize(ev)
    assert s.host_syncs_per_step == 1 and s.sync_wait_ms_per_step == pytest.approx(0.2)


def test_cpu_only_trace_counts_every_item_as_a_would_be_sync():
    ev = [step(1, 0, 100), op("aten::item", 10, 5), op("aten::_local_scalar_dense", 11, 3)]
    events = TE.load_events(ev)
    assert TM.host_syncs(events, TM.step_windows(events)) == (1, 5.0)


def test_loader_wait_per_step_single_and_multiprocess():
    ev = [step(1, 0, 1000), step(2, 1000, 1000), loader(0, 300), loader(1000, 500, multi=True), loader(2500, 99)]
    events = TE.load_events(ev)
    assert TM.loader_wait_us(events, TM.step_windows(events)) == 800
    s = D.summarize(ev)
    assert s.loader_wait_ms_per_step == pytest.approx(0.4) and s.loader_wait_fraction == pytest.approx(0.4)


def test_top_cpu_ops_by_self_time_and_top_kernels_by_total_time():
    ev = [step(1, 0, 1000), op("aten::linear", 0, 100), op("aten::addmm", 10, 50), op("aten::t", 70, 10),
          op("aten::addmm", 200, 30)]
    events = TE.load_events(ev)
    top = {t.name: (t.calls, t.total_ms) for t in TM.top_cpu_ops(events, TM.step_windows(events))}
    assert top == {"aten::addmm": (2, pytest.approx(0.08)), "aten::linear": (1, pytest.approx(0.04)),
                   "aten::t": (1, pytest.approx(0.01))}
    s = D.summarize(ev)
    assert s.device == "cpu" and s.top_label.startswith("CPU ops") and s.top[0].name == "aten::addmm"
    assert s.gpu_idle_fraction is None and s.diagnosis == "cpu-bound (no GPU in the trace)"

    kev = [step(1, 0, 100), kernel(0, 30, "sm90_xmma_gemm_f32f32"), kernel(40, 30, "sm90_xmma_gemm_f32f32"),
           kernel(80, 20, "elementwise")]
    ks = TM.top_kernels(TE.load_events(kev), (0, 100))
    assert [(k.name, k.calls, k.total_ms, k.share) for k in ks] == [
        ("sm90_xmma_gemm_f32f32", 2, pytest.approx(0.06), pytest.approx(0.75)), ("elementwise", 1, pytest.approx(0.02), pytest.approx(0.25))]
    assert D.summarize(kev).top_label == "GPU kernels by total device time"


# ---------------------------------------------------------------- diagnoses, one scenario each

def _steps(n, dur=1000):
    return [step(i + 1, i * dur, dur) for i in range(n)]


def test_scenario_data_loading_bound():
    ev = _steps(4)
    for i in range(4):
        t = i * 1000
        ev += [loader(t, 500), rt("cudaLaunchKernel", t + 510, 5), kernel(t + 520, 300, "sm80_xmma_gemm")]
    s = D.summarize(ev)
    assert s.loader_wait_fraction == pytest.approx(0.5) and s.gpu_idle_fraction == pytest.approx(0.7)
    # after the loader fix the 0.5 ms of CPU work per step would still outlast 0.3 ms of kernels
    assert s.diagnosis == "data-loading-bound" and s.findings == ["data-loading-bound", "overhead-bound (launch/Python)"]
    assert "50%" in s.explanation and "num_workers" in s.suggestion


def test_scenario_copy_bound():
    ev = _steps(2)
    for t in (0, 1000):
        ev += [rt("cudaMemcpyAsync", t, 300), h2d(t + 5, 290, 64 << 20), rt("cudaLaunchKernel", t + 310, 5),
               kernel(t + 320, 400, "cutlass_gemm")]
    s = D.summarize(ev)
    assert s.h2d_copies_by_source == {"Pageable": 2} and s.h2d_bytes_per_step == 64 << 20
    assert s.diagnosis == "copy-bound" and "pin_memory" in s.suggestion


def test_scenario_host_sync_bound():
    ev = _steps(3)
    for i in range(3):
        t = i * 1000
        ev += [rt("cudaLaunchKernel", t + 10 * k, 5) for k in range(10)]
        ev += [kernel(t + 100, 600, "sm90_xmma_gemm"), op("aten::item", t + 100, 605),
               op("aten::_local_scalar_dense", t + 101, 603), rt("cudaStreamSynchronize", t + 110, 590)]
    s = D.summarize(ev)
    assert s.launches_per_step == 10 and s.host_syncs_per_step == 1
    assert s.gpu_idle_fraction == pytest.approx(0.4) and s.cpu_work_ms_per_step == pytest.approx(0.395)
    assert s.diagnosis == "host-sync-bound" and ".item()" in s.suggestion


def test_scenario_overhead_bound():
    ev = _steps(2)
    for t in (0, 1000):
        for k in range(100):
            ev += [rt("cudaLaunchKernel", t + 10 * k, 4), rt("cuLaunchKernel", t + 10 * k + 1, 2, cat="cuda_driver"),
                   kernel(t + 10 * k + 5, 2)]
    s = D.summarize(ev)
    assert s.launches_per_step == 100 and s.mean_kernel_us == 2 and s.gpu_idle_fraction == pytest.approx(0.8)
    assert s.diagnosis == "overhead-bound (launch/Python)" and "torch.compile" in s.suggestion
    assert "100 launches" in s.explanation


def test_scenario_sync_with_slow_host_is_overhead_not_sync():
    # a sync per step, but the CPU's own work exceeds the GPU's: removing the sync would not feed the GPU
    ev = _steps(2)
    for t in (0, 1000):
        ev += [kernel(t + 800, 100), op("aten::item", t + 800, 110), rt("cudaStreamSynchronize", t + 805, 100)]
    s = D.summarize(ev)
    assert s.host_syncs_per_step == 1 and s.cpu_work_ms_per_step > s.gpu_busy_ms_per_step
    assert s.diagnosis == "overhead-bound (launch/Python)"


@pytest.mark.parametrize("name, expected", [("sm90_xmma_gemm_bf16bf16_bf16f32", "compute-bound"),
                                            ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "compute-bound"),
                                            ("void at::native::vectorized_elementwise_kernel<4>", "memory-bound"),
                                            ("triton_red_fused_native_layer_norm_0", "memory-bound")])
def test_scenario_busy_gpu_compute_vs_memory(name, expected):
    ev = _steps(2) + [kernel(0, 1900, name), kernel(1900, 100, "reduce_kernel")]
    s = D.summarize(ev)
    assert s.gpu_idle_fraction == 0 and s.diagnosis == expected


def test_slow_host_without_syncs_is_overhead_bound():
    ev = _steps(1) + [op("aten::mm", 0, 100), loader(100, 150), kernel(600, 400, "gemm")]
    s = D.summarize(ev)  # loader 15%: under its threshold; the CPU's 0.85 ms of work outlasts the GPU's 0.4
    assert s.cpu_work_ms_per_step == pytest.approx(0.85) and s.gpu_busy_ms_per_step == pytest.approx(0.4)
    assert s.diagnosis == "overhead-bound (launch/Python)"


def test_idle_gpu_with_no_named_cause_says_so():
    # a sync every other step (under the one-per-step rule) and a small loader wait
    ev = _steps(2) + [kernel(0, 900, "gemm"), rt("cudaDeviceSynchronize", 50, 850),
                      loader(1000, 150), kernel(1150, 450, "gemm")]
    s = D.summarize(ev)
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
    assert D.summarize(p).loader_wait_fraction == D.summarize(str(g)).loader_wait_fraction == pytest.approx(0.6)
    with pytest.raises(FileNotFoundError, match="no trace at"):
        D.summarize(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a Chrome-trace JSON"):
        D.summarize(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="traceEvents"):
        D.summarize({"events": []})
    with pytest.raises(ValueError, match="cannot read trace events"):
        D.summarize(42)
    with pytest.raises(ValueError, match="pass steps=N"):
        D.summarize([op("aten::mm", 0, 10)])
    with pytest.raises(ValueError, match="holds 2 ProfilerStep"):
        D.summarize(ev, steps=3)
    s = D.summarize([op("aten::mm", 0, 10), op("aten::mm", 10, 10)], steps=2)  # no schedule: steps given
    assert s.steps == 2 and s.step_time_ms == pytest.approx(0.01)


def test_summary_dict_is_json_and_report_is_readable():
    ev = _steps(2) + [loader(0, 600), loader(1000, 600), h2d(700, 10, 1000), kernel(720, 50, "gemm")]
    s = D.summarize(ev)
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
    assert D.summarize(tmp_path / "trace.json").loader_wait_ms_per_step == s.loader_wait_ms_per_step


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
    a, b = D.summarize(prof), D.summarize(events)
    assert a.steps == b.steps == 2 and a.host_syncs_per_step == b.host_syncs_per_step == 1
    assert a.loader_wait_ms_per_step == pytest.approx(b.loader_wait_ms_per_step, rel=1e-3)
    for e in events:  # torch before 2.13 has no activity_type: categories are guessed from the event
        e.activity_type = None
    c = D.summarize(events)
    assert (c.steps, c.host_syncs_per_step, c.loader_wait_ms_per_step) == (b.steps, 1, b.loader_wait_ms_per_step)
    assert [t.name for t in c.top] == [t.name for t in b.top]
