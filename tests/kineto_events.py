"""Synthetic Kineto trace events for the profiler tests (tests/utils/test_profiling.py,
tests/utils/test_trace_events.py), shaped as ``prof.export_chrome_trace`` writes them."""
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
