"""utils.measure.timing on the CPU. A fake clock (swapped in for the module's ``time``) makes run
times exact, so the stopping rules are tested without timing anything real."""
from __future__ import annotations

import math
import random
import sys
import types

import pytest

from utils.measure import timing
from utils.measure.timing import Stopwatch, TimingResult, benchmark, device_sync, relative_standard_error


class FakeClock:
    """``perf_counter`` that only moves when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


def scripted(clock: FakeClock, durations_s):
    """A function whose n-th call takes durations_s[n] seconds on the fake clock."""
    it = iter(durations_s)
    calls = []

    def fn(*args):
        calls.append(args)
        clock.advance(next(it))

    fn.calls = calls
    return fn


# -- benchmark -----------------------------------------------------------------------------

def test_stops_early_when_the_rse_target_is_met(clock):
    fn = scripted(clock, [5.0] * 2 + [0.002] * 100)  # slow warm-up, then a steady 2 ms
    r = benchmark(fn, warmup=2, min_runs=3, device="cpu")
    assert r.stopped == "rse" and r.runs == 3 and r.rse == 0.0
    assert r.median_ms == pytest.approx(2.0) and r.times_ms == pytest.approx([2.0] * 3)
    assert len(fn.calls) == 2 + 3  # warm-up calls are made but not timed
    assert r.method == "perf_counter" and r.l2_flushed is False and r.warmup_runs == 2


def test_runs_to_max_runs_when_the_target_is_out_of_reach(clock):
    fn = scripted(clock, [0.001, 0.003] * 100)
    r = benchmark(fn, warmup=0, min_runs=3, max_runs=20, target_rse=1e-9, budget_s=1e6, device="cpu")
    assert r.stopped == "max_runs" and r.runs == 20
    assert r.mean_ms == pytest.approx(2.0) and r.median_ms == pytest.approx(2.0)
    assert r.std_ms == pytest.approx(math.sqrt(20 / 19))  # sample stdev of ten 1s and ten 3s
    assert r.rse == pytest.approx(r.std_ms / math.sqrt(20) / 2.0)


def test_rse_stopping_point_is_the_first_run_under_target(clock):
    durations = [0.010, 0.012] * 50
    fn = scripted(clock, durations)
    target = 0.02
    r = benchmark(fn, warmup=0, min_runs=3, max_runs=100, target_rse=target, budget_s=1e6, device="cpu")
    expected = next(n for n in range(3, 101) if relative_standard_error([d * 1e3 for d in durations[:n]]) < target)
    assert r.stopped == "rse" and r.runs == expected and r.rse < target


def test_respects_the_budget(clock):
    fn = scripted(clock, [1.0, 1.5] * 50)  # noisy, so the rse target is never met
    r = benchmark(fn, warmup=0, min_runs=3, max_runs=100, target_rse=1e-9, budget_s=5.0, device="cpu")
    # after run 4 the timed runs have used 1 + 1.5 + 1 + 1.5 = 5 s
    assert r.stopped == "budget" and r.runs == 4


def test_min_runs_holds_even_over_budget(clock):
    fn = scripted(clock, [10.0, 11.0] * 10)
    r = benchmark(fn, warmup=0, min_runs=3, target_rse=1e-9, budget_s=1.0, device="cpu")
    assert r.runs == 3 and r.stopped == "budget"


def test_setup_runs_untimed_and_supplies_arguments(clock):
    fn = scripted(clock, [0.004] * 10)
    made = []

    def setup():
        clock.advance(1.0)  # expensive input preparation must not be timed
        made.append(len(made))
        return (len(made), "x")

    r = benchmark(fn, warmup=1, min_runs=3, setup=setup, device="cpu")
    assert r.median_ms == pytest.approx(4.0) and r.runs == 3
    assert fn.calls == [(1, "x"), (2, "x"), (3, "x"), (4, "x")]


def test_args_and_kwargs_are_passed(clock):
    seen = []

    def fn(a, b, *, c):
        seen.append((a, b, c))
        clock.advance(0.001)

    benchmark(fn, 1, 2, kwargs={"c": 3}, warmup=1, device="cpu")
    assert set(seen) == {(1, 2, 3)}


def test_fields_are_consistent_on_random_times(clock):
    rng = random.Random(0)
    fn = scripted(clock, [rng.lognormvariate(-6, 0.5) for _ in range(200)])
    r = benchmark(fn, warmup=0, min_runs=5, max_runs=50, target_rse=0.0, device="cpu")
    assert 5 <= r.runs <= 50 and len(r.times_ms) == r.runs
    assert min(r.times_ms) <= r.p20_ms <= r.median_ms <= r.p80_ms <= max(r.times_ms)
    assert r.rse == pytest.approx(r.std_ms / math.sqrt(r.runs) / r.mean_ms)
    assert "median" in str(r) and "runs" in str(r) and r.to_dict()["runs"] == r.runs


def test_percentiles_match_linear_interpolation():
    r = TimingResult.from_times([4.0, 1.0, 3.0, 2.0, 5.0], "perf_counter")
    assert (r.p20_ms, r.median_ms, r.p80_ms) == (1.8, 3.0, 4.2)
    assert r.times_ms == [4.0, 1.0, 3.0, 2.0, 5.0]  # in run order


def test_real_clock_on_cpu():
    r = benchmark(lambda: sum(range(1000)), warmup=1, min_runs=3, max_runs=10, budget_s=5)
    assert 3 <= r.runs <= 10 and r.method == "perf_counter" and r.device == "cpu"
    assert all(t > 0 for t in r.times_ms)


@pytest.mark.parametrize("kwargs, match", [
    ({"min_runs": 0}, "min_runs"),
    ({"min_runs": 5, "max_runs": 3}, "max_runs"),
    ({"warmup": -1}, "warmup"),
    ({"budget_s": 0}, "budget_s"),
    ({"target_rse": -0.1}, "target_rse"),
])
def test_bad_arguments_say_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        benchmark(lambda: None, **kwargs)


def test_passing_a_result_instead_of_a_function():
    with pytest.raises(TypeError, match="pass fn, not fn()"):
        benchmark(42)


# -- device_sync ---------------------------------------------------------------------------

def test_device_sync_is_a_noop_on_cpu(monkeypatch):
    torch = pytest.importorskip("torch")

    def boom(*a, **k):
        raise AssertionError("synchronize must not be called")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    assert device_sync("cpu") is None
    assert device_sync(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert device_sync() is None  # no CUDA context yet: nothing queued, nothing created


def test_device_sync_calls_cuda_synchronize_when_cuda_is_live(monkeypatch):
    torch = pytest.importorskip("torch")
    called = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: called.append(device))
    device_sync()
    device_sync("cuda:1")
    device_sync("cpu")
    assert called == [None, "cuda:1"]


def test_device_sync_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert device_sync() is None


# -- Stopwatch -------------------------------------------------------------------------------

def test_stopwatch_skips_warmup_and_counts_tokens(clock):
    sw = Stopwatch(warmup_steps=2, tokens_per_step=1000, device="cpu")
    for seconds in [3.0, 2.0, 0.010, 0.010, 0.010]:
        with sw.step():
            clock.advance(seconds)
    s = sw.summary()
    assert s["method"] == "perf_counter" and s["steps"] == 3 and s["warmup_steps"] == 2
    assert s["median_ms"] == pytest.approx(10.0) and s["total_s"] == pytest.approx(0.030)
    assert s["tokens_per_s"] == pytest.approx(3000 / 0.030)
    assert len(sw) == 5 and sw.times_ms[0] == pytest.approx(3000.0)
    assert sw.last_ms == pytest.approx(10.0)


def test_stopwatch_tokens_per_step_can_vary(clock):
    sw = Stopwatch(warmup_steps=0, device="cpu")
    for tokens in (100, 300):
        with sw.step(tokens=tokens):
            clock.advance(0.5)
    assert sw.summary()["tokens_per_s"] == pytest.approx(400 / 1.0)


def test_stopwatch_without_tokens_and_failed_steps(clock):
    sw = Stopwatch(warmup_steps=0, device="cpu")
    with sw.step():
        clock.advance(0.1)
    with pytest.raises(KeyError):
        with sw.step():
            raise KeyError("bad batch")
    assert len(sw) == 1 and sw.summary()["tokens_per_s"] is None


def test_stopwatch_with_only_warmup_steps_explains():
    sw = Stopwatch(warmup_steps=3, device="cpu")
    with sw.step():
        pass
    with pytest.raises(ValueError, match="no steps measured yet"):
        sw.summary()


# -- the CUDA code path, with fake events on the fake clock ----------------------------------

@pytest.fixture
def fake_cuda(monkeypatch, clock):
    """torch.cuda as benchmark and Stopwatch use it, backed by the fake clock: an event
    records the clock when recorded; the flush buffer counts its zeroings."""
    import contextlib

    torch = pytest.importorskip("torch")

    class FakeEvent:
        created = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            FakeEvent.created += 1
            self.t = None

        def record(self, stream=None):
            self.t = clock.now

        def synchronize(self):
            assert self.t is not None

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    class FlushBuffer:
        zeroed = 0

        def zero_(self):
            FlushBuffer.zeroed += 1
            clock.advance(0.5)  # flushing happens before the start event: never timed

    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(timing, "_flush_buffer", lambda torch, dev: FlushBuffer())
    return types.SimpleNamespace(Event=FakeEvent, Flush=FlushBuffer, syncs=syncs)


def test_benchmark_on_cuda_uses_events_and_flushes_l2(clock, fake_cuda):
    fn = scripted(clock, [0.002] * 20)
    r = benchmark(fn, warmup=2, min_runs=3, device="cuda")
    assert r.method == "cuda_events" and r.l2_flushed and r.device == "cuda"
    assert r.runs == 3 and r.median_ms == pytest.approx(2.0)
    assert fake_cuda.Flush.zeroed == 3  # once before every timed run, not during warm-up
    assert fake_cuda.Event.created == 6
    assert fake_cuda.syncs == ["cuda"]  # one sync after warm-up; runs wait on their end event


def test_benchmark_on_cuda_queues_runs_in_batches(clock, fake_cuda, monkeypatch):
    waits = []
    wait = fake_cuda.Event.synchronize
    monkeypatch.setattr(fake_cuda.Event, "synchronize", lambda self: waits.append(1) or wait(self))
    fn = scripted(clock, [0.001, 0.001, 0.003] * 30)  # rse never reaches 0: runs until max_runs
    r = benchmark(fn, warmup=0, min_runs=3, max_runs=40, target_rse=0.0, budget_s=100, device="cuda")
    assert r.runs == 40 and r.stopped == "max_runs"
    # batches: the 3 min_runs, then BATCH_MS / median (20 ms / 1 ms = 20 runs), then the 17 left
    assert timing.BATCH_MS == 20.0 and len(waits) == 3
    assert fake_cuda.Flush.zeroed == 40  # still one flush before every run


def test_benchmark_on_cuda_without_flush(clock, fake_cuda):
    r = benchmark(scripted(clock, [0.001] * 10), warmup=0, min_runs=3, device="cuda", flush_l2=False)
    assert not r.l2_flushed and fake_cuda.Flush.zeroed == 0


def test_benchmark_picks_cuda_when_available(clock, fake_cuda):
    r = benchmark(scripted(clock, [0.001] * 10), warmup=0)
    assert r.method == "cuda_events" and r.device == "cuda"


def test_stopwatch_on_cuda_records_events_without_syncing(clock, fake_cuda):
    sw = Stopwatch(warmup_steps=1, tokens_per_step=512)
    for seconds in (1.0, 0.1, 0.1):
        with sw.step():
            clock.advance(seconds)
    assert fake_cuda.syncs == []  # nothing synchronises during the loop
    s = sw.summary()
    assert s["method"] == "cuda_events" and s["steps"] == 2
    assert s["median_ms"] == pytest.approx(100.0) and s["tokens_per_s"] == pytest.approx(1024 / 0.2)


def test_stopwatch_with_sync_on_cuda(clock, fake_cuda):
    sw = Stopwatch(warmup_steps=0, sync=True)
    with sw.step():
        clock.advance(0.25)
    assert sw.method == "perf_counter+sync" and len(fake_cuda.syncs) == 2
    assert sw.summary()["median_ms"] == pytest.approx(250.0)
