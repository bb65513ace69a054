"""Lab 04's judges: each graded cell's answers against the rule, the grader's own runs or a record.

Each judge is pure in what it decides (``grader/judging.py``); the one exception is the grader's
own load runs, which ``reference.Reference.operating`` takes when a judge first asks for them,
because what they run is the learner's workload at the learner's operating rate (see
``reference.py``).

- ``test_percentile``, ``test_metrics``: the learner's ``percentile`` and ``latency_metrics`` on
  lists and request traces drawn from the grading run's secret seed, in a sandbox where the course's
  own percentile and TTFT/TPOT/ITL code (``utils.serving.loadgen.metrics``, ``utils.serving.loadgen.trace``,
  ``utils.measure.timing._quantile``) is a tripwire; the expected values are numpy's percentile and
  ``utils.serving.loadgen.summarize``, here.
- ``test_workload``: ``WORKLOAD``'s fields against the course's rules for this tier, and the sweep
  (every summary recomputed from its own requests, every step the one ``utils.serving.loadgen.sweep``
  runs there, its rates where it puts them), its SLOs against the unloaded latency the learner's
  own runs show; those runs no faster than the grader's own engine one request at a time (from a
  record: than the card can read the weights once per token).
- ``test_capacity``: ``capacity_rate`` on sweeps drawn from the seed, and ``CAPACITY`` and
  ``OPERATING_RATE`` by the rule on the learner's sweep.
- ``test_goodput``: the operating run consistent and of ``WORKLOAD`` at ``OPERATING_RATE``; then
  the grader's own engine runs the same load three times (``reference.py``) and the learner's
  goodput and p95 must fall in the band of those runs' spread. A run that did not keep up is
  treated as before (``_you_queued``, and Unusable when the grader's own runs queue): never failed
  on, but a run faster than the engine one request at a time fails.
- ``test_choice``: the candidates consistent and of the same load; the engine's own candidate
  against the grader's runs (shared with ``test_goodput``); ``CHOICE`` by the rule on the
  learner's rows.
- ``test_scrape``: the learner's ``scrape`` against a page of seed-drawn samples the grader serves
  on a loopback port from its own process, compared with prometheus_client's parse of it.
- ``test_gpu_limits``, ``test_gpu_pod``, ``test_time_slicing``: the learner's functions on
  manifests and arguments drawn from the seed; their outputs checked by ``utils.production.k8s_gpu`` here.
"""
from __future__ import annotations

import math
import re
import statistics

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from grader import expect
from grader.expect import Fail, approx, cases, close, equal
from grader.judging import Check
from grader.labs.benchmarking_production.answers import METRICS, SLO_KEYS
from grader.measuring import Measured
from utils.capacity.operating_point import (
    CHOICE_TIE,
    HEADROOM,
    MIN_GOOD_FRACTION,
    SLO_FLOOR_MS,
    candidate_row,
    step_rate,
)
from utils.production import k8s_gpu
from utils.production.dcgm_metrics import render
from utils.production.exporter import MetricsServer
from utils.serving.loadgen import RequestRecord, summarize
from utils.serving.loadgen.trace import records_from_trace
from utils.units import transfer_ms

STATS = ("mean", "p50", "p90", "p95", "p99")  # what latency_metrics returns per metric
ROUNDING_MS = 1e-4  # utils.serving.loadgen rounds milliseconds to 4 decimals
TRACE_TOL_MS = 2e-3  # a summary against its own trace: the trace keeps microseconds
DURATION_SLACK_S = 2.0  # a run ends this long after its last request at most (plus 25%), unless stopped
SLO_MAX_FACTOR = 20.0  # an SLO above 20x the unloaded p50 says nothing about the engine (floor: SLO_FLOOR_MS)
# Fields that define the load. The sweep changes request_rate and concurrency per step, and drops
# the warm-up probe after its first step.
MATCH_KEYS = ("base_url", "model", "endpoint", "num_requests", "input_len", "output_len", "arrival", "burstiness",
              "stream", "dataset", "tokenizer", "seed", "slo_ms", "fixed_output", "max_duration_s")
SERVER_KEYS = ("base_url", "model", "tokenizer")  # what differs between candidates on other servers
TRACE_FORBID = ("utils.serving.loadgen.metrics:stats_ms", "utils.serving.loadgen.metrics:summarize",
                "utils.serving.loadgen.trace:records_from_trace", "utils.measure.timing:_quantile")
CAPACITY_FORBID = ("utils.capacity.operating_point:step_rate", f"{__name__}:reference_capacity")
K8S_FORBID = ("utils.production.k8s_gpu:pod_spec", "utils.production.k8s_gpu:gpu_count", f"{__name__}:reference_gpu_limits")
PERCENTILE_RULE = ("sort the values; rank r = p / 100 x (n - 1); interpolate linearly between the values at floor(r) "
                   "and ceil(r) (numpy's default)")
METRICS_RULE = ("over the completed requests (ok) only: TTFT = first chunk - sent; E2EL = end - sent; TPOT = (E2EL - "
                "TTFT) / (output_tokens - 1) for requests of at least 2 tokens; ITL = every gap between consecutive "
                "chunks, pooled; each as mean, p50, p90, p95, p99 in ms")
CAPACITY_RULE = ("the highest offered rate (request_rate; the achieved request_throughput where it is inf) among the "
                 "steps that completed every request with at least min_good_fraction of them within every SLO; the "
                 "first step's request_throughput when none did")
GPU_LIMITS_RULE = ("one entry 'Kind/name/container' for every container, init containers included, of every workload "
                   "kind (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob) whose resources.limits "
                   "name an nvidia.com/ resource: {resource: count as an int}; requests alone do not count")


# -- hidden cases, drawn from the run's secret seed ------------------------------------------------

def percentile_cases(rng, ctx) -> list:
    """``(values, p)``: one value, two, duplicates, negatives, long lists; p at 0, 100, the usual
    percentiles and anywhere between."""
    out = [[[round(rng.uniform(-50, 50), 3)], rng.choice([0, 37.5, 50, 99, 100])]]
    for _ in range(19):
        n = rng.choice([2, 3, 4, 5, rng.randint(6, 40), rng.randint(41, 300)])
        kind = rng.randrange(3)
        if kind == 0:
            values = [rng.lognormvariate(0, 1) for _ in range(n)]
        elif kind == 1:
            values = [float(rng.randint(0, 5)) for _ in range(n)]  # ties
        else:
            values = [rng.uniform(-1e3, 1e3) for _ in range(n)]
        out.append([values, rng.choice([0, 100, 50, 90, 95, 99, round(rng.uniform(0, 100), 3)])])
    rng.shuffle(out)
    return out


def random_trace(rng, n: int) -> list[dict]:
    """A made-up trace in the notebook's format, with what trips a careless implementation: failed
    requests (some with chunks), one-chunk answers (no TPOT), chunks that carry several tokens (TPOT
    counts tokens, ITL counts chunk gaps), a usage event after the last text chunk (E2E latency ends
    there), and arrivals that overlap."""
    rate = rng.uniform(5.0, 40.0)
    failed = set(rng.sample(range(n), max(1, n // 8)))
    single = set(rng.sample(range(n), max(1, n // 9)))
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        sent = round(t, 6)
        chunks = [sent + rng.lognormvariate(math.log(0.05), 0.6)]
        n_chunks = 1 if i in single else rng.randint(2, 24)
        for _ in range(n_chunks - 1):
            chunks.append(chunks[-1] + rng.lognormvariate(math.log(0.01), 0.5))
        tokens = n_chunks + (rng.randint(1, 3) if rng.random() < 0.25 else 0)
        end = chunks[-1] + rng.uniform(0.0, 0.002)
        ok = i not in failed
        if not ok:
            chunks = chunks[: rng.randint(0, len(chunks) - 1)]
            end, tokens = (chunks[-1] if chunks else sent) + rng.uniform(0.0, 0.5), 0
        out.append({"sent_s": sent, "chunks_s": [round(c, 6) for c in chunks], "end_s": round(end, 6),
                    "output_tokens": tokens, "ok": ok})
    return out


def trace_cases(rng, ctx) -> list:
    return [[random_trace(rng, rng.randint(12, 60))] for _ in range(4)]


def random_sweep(rng, nothing_qualifies: bool = False) -> dict:
    """A sweep in ``utils.serving.loadgen.sweep``'s shape: rates that meet the SLO and some that do not, at
    and next to the threshold, steps cut short (not every request completed)."""
    num = rng.choice((8, 12, 16))
    sync = round(rng.uniform(0.5, 20.0), 4)
    top = round(sync * rng.uniform(1.0, 6.0), 4)

    def run(rate, throughput, fraction, completed):
        fraction = None if completed == 0 else fraction
        return {"label": "step", "workload": {"request_rate": rate, "num_requests": num, "concurrency": None},
                "request_throughput": throughput, "completed": completed,
                "goodput": {"fraction_of_completed": fraction, "request_goodput": throughput * (fraction or 0)}}

    runs = [run("inf", sync, 0.0 if nothing_qualifies else rng.choice((1.0, 0.95, 0.5)), num),
            run("inf", top, 0.0 if nothing_qualifies else rng.uniform(0, 1), num if rng.random() < 0.8 else num - 1)]
    runs[0]["workload"]["concurrency"] = 1
    for rate in sorted(rng.uniform(sync, top) for _ in range(rng.randint(1, 4))):
        frac = 0.0 if nothing_qualifies else rng.choice((1.0, 0.92, 0.9, 0.89, 0.3, 0.0))
        done = num if rng.random() < 0.8 else rng.randint(0, num - 1)
        runs.append(run(round(rate, 4), round(rate * rng.uniform(0.7, 1.0), 4), frac, done))
    return {"sweep": True, "runs": runs}


def capacity_cases(rng, ctx) -> list:
    sweeps = [random_sweep(rng, nothing_qualifies=k == 0) for k in range(12)]
    rng.shuffle(sweeps)
    return [[s, f] for s in sweeps for f in (MIN_GOOD_FRACTION, round(rng.uniform(0.3, 0.99), 3))]


_SERVED: dict = {}  # url -> (server, the grader's parse of its page): the scrape check's page, in this process
_MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA L4", "NVIDIA A10G")


class _Page:
    """A Prometheus collector whose samples were drawn once: GPU gauges and the energy counter under
    dcgm-exporter's names and labels, the exporter's own health metrics, an error counter (its
    samples end in ``_total``) and a histogram (``_bucket`` samples with an ``le`` label)."""

    def __init__(self, rng):
        self.rng = rng
        gpus = rng.randint(1, 8)
        host = f"node-{rng.randint(1, 99):02d}.{rng.choice(['gpu', 'infer', 'train'])}.example"
        model = rng.choice(_MODELS)
        labels = ["gpu", "UUID", "modelName", "Hostname"]
        self.families = []
        per_gpu = {"DCGM_FI_DEV_GPU_UTIL": lambda: float(rng.randint(0, 100)),
                   "DCGM_FI_DEV_FB_USED": lambda: float(rng.randint(0, 81000)),
                   "DCGM_FI_DEV_POWER_USAGE": lambda: round(rng.uniform(30, 700), 3),
                   "DCGM_FI_DEV_GPU_TEMP": lambda: float(rng.randint(25, 90))}
        rows = [[str(i), f"GPU-{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}", model, host] for i in range(gpus)]
        for name, draw in per_gpu.items():
            if rng.random() < 0.85 or name == "DCGM_FI_DEV_FB_USED":
                fam = GaugeMetricFamily(name, f"{name} (drawn by the grader)", labels=labels)
                for row in rows:
                    fam.add_metric(row, draw())
                self.families.append(fam)
        energy = CounterMetricFamily("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy (in mJ).", labels=labels)
        for row in rows:
            energy.add_metric(row, float(rng.randint(10**6, 10**12)))
        self.families.append(energy)
        up = GaugeMetricFamily("gpulab_exporter_nvml_up", "NVML answered.")
        up.add_metric([], float(rng.randint(0, 1)))
        self.families.append(up)
        count = GaugeMetricFamily("gpulab_exporter_gpus", "GPUs read.")
        count.add_metric([], float(gpus))
        self.families.append(count)
        errors = CounterMetricFamily("gpulab_exporter_nvml_errors", "Failed NVML calls.", labels=["call", "error"])
        for call in rng.sample(["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlGpmMetricsGet",
                                "nvmlDeviceGetClockInfo"], rng.randint(1, 3)):
            errors.add_metric([call, rng.choice(["Not Supported", "Unknown Error", "GPU is lost"])],
                              float(rng.randint(1, 50)))
        self.families.append(errors)
        bounds = sorted(rng.sample([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0], 3))
        counts, total = [], 0
        for _ in bounds:
            total += rng.randint(0, 20)
            counts.append(total)
        total += rng.randint(0, 5)
        hist = HistogramMetricFamily("gpulab_exporter_read_seconds", "Seconds per NVML sweep.",
                                     buckets=[(repr(b), float(c)) for b, c in zip(bounds, counts, strict=True)]
                                     + [("+Inf", float(total))], sum_value=round(rng.uniform(0, 5), 6))
        self.families.append(hist)

    def collect(self):
        return iter(self.families)


def parse_page(text: str) -> dict:
    """``{sample name: [(labels, value), ...]}`` of a Prometheus text page, by prometheus_client's parser."""
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def scrape_cases(rng, ctx) -> list:
    """Serve a page of drawn samples on a loopback port from this process (``utils.production.exporter``'s
    server); the case is its URL, and the grader's parse of the page waits here for the judge."""
    registry = CollectorRegistry()
    registry.register(_Page(rng))
    server = MetricsServer("127.0.0.1", 0, registry)
    _SERVED[server.url] = (server, parse_page(render(registry).decode()))
    return [[server.url]]


_WORDS = ("vllm", "serve", "embed", "rerank", "train", "eval", "batch", "nightly", "worker", "proxy", "cache", "web")
_IMAGES = ("gpulab-vllm", "vllm/vllm-openai", "nvcr.io/nvidia/pytorch", "ghcr.io/acme/infer", "busybox", "python")
_OTHER_KINDS = ("Service", "ConfigMap", "PersistentVolumeClaim", "Secret")


def _resources(rng) -> dict | None:
    n = rng.randint(1, 8)
    kind = rng.randrange(9)
    if kind == 0:
        return None
    if kind == 1:
        return {"limits": {"cpu": str(rng.randint(1, 16)), "memory": f"{rng.randint(1, 64)}Gi"}}
    if kind == 2:
        return {"limits": {"nvidia.com/gpu": n, "cpu": str(rng.randint(1, 8))}}
    if kind == 3:
        return {"limits": {"nvidia.com/gpu": str(n)}}  # a count as text, as YAML may give it
    if kind == 4:
        return {"limits": {f"nvidia.com/mig-{rng.choice(['1g.10gb', '2g.20gb', '3g.40gb'])}": n}}
    if kind == 5:
        return {"limits": {"nvidia.com/gpu": n}, "requests": {"nvidia.com/gpu": n, "memory": "8Gi"}}
    if kind == 6:
        return {"requests": {"nvidia.com/gpu": n}}  # a request alone is no GPU: extended resources go in limits
    if kind == 7:
        return {"limits": {"amd.com/gpu": n}}
    return {}


def _containers(rng, k: int, prefix: str) -> list[dict]:
    out = []
    for i in range(k):
        c = {"name": f"{prefix}{i}-{rng.choice(_WORDS)}", "image": f"{rng.choice(_IMAGES)}:{rng.randint(1, 40)}"}
        res = _resources(rng)
        if res is not None:
            c["resources"] = res
        out.append(c)
    return out


def random_manifests(rng) -> list[dict]:
    """Workloads of every kind the rule covers, and kinds it does not (one with a GPU-looking key)."""
    docs, used = [], set()
    for _ in range(rng.randint(3, 8)):
        kind = rng.choice(tuple(k8s_gpu.POD_SPEC) + _OTHER_KINDS)
        name = f"{rng.choice(_WORDS)}-{rng.randint(0, 999)}"
        if (kind, name) in used:
            continue
        used.add((kind, name))
        if kind not in k8s_gpu.POD_SPEC:
            doc = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
            if kind == "ConfigMap":
                doc["data"] = {"nvidia.com/gpu": str(rng.randint(1, 4))}
            docs.append(doc)
            continue
        spec = {"containers": _containers(rng, rng.randint(1, 3), "c")}
        if rng.random() < 0.35:
            spec["initContainers"] = _containers(rng, rng.randint(1, 2), "init")
        doc = {"apiVersion": "v1" if kind == "Pod" else "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
               "kind": kind, "metadata": {"name": name}}
        node = doc
        path = k8s_gpu.POD_SPEC[kind]
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = spec
        docs.append(doc)
    return docs


def gpu_limits_cases(rng, ctx) -> list:
    return [[random_manifests(rng)] for _ in range(8)]


def gpu_pod_cases(rng, ctx) -> list:
    """``(image, model, gpus, port)``: registries, models, GPU counts and ports the notebook does not use."""
    out = []
    for gpus in [1, *(rng.randint(2, 8) for _ in range(3))]:
        registry = rng.choice(["", "registry.example.com/", "ghcr.io/acme/", f"{rng.choice(_WORDS)}.example:5000/"])
        image = f"{registry}{rng.choice(['gpulab-vllm', 'vllm-serve', 'llm'])}:{rng.randint(0, 9)}.{rng.randint(0, 40)}.0"
        org = rng.choice(["Qwen", "meta-llama", "TinyLlama", "mistralai", "acme"])
        model = f"{org}/{rng.choice(['Chat', 'Base', 'Instruct', 'Coder'])}-{rng.randint(1, 70)}B-v{rng.randint(1, 9)}"
        port = rng.choice([p for p in (rng.randint(1024, 65535) for _ in range(3)) if p != 8000] or [9000])
        out.append([image, model, gpus, port])
    rng.shuffle(out)
    return out


def time_slicing_cases(rng, ctx) -> list:
    return [[n] for n in rng.sample([n for n in range(2, 17) if n != 4], 3) + [4]]


# -- reference rules (the sandbox has them as tripwires) ---------------------------------------------

def reference_capacity(sweep: dict, min_good_fraction: float = MIN_GOOD_FRACTION) -> float:
    """The highest offered rate among the steps that completed every request with at least
    ``min_good_fraction`` of them within every SLO; the first (synchronous) step's achieved rate if
    none did (one request at a time is the floor)."""
    runs = sweep["runs"]
    ok = [step_rate(r) for r in runs
          if r["completed"] == r["workload"]["num_requests"]
          and (r.get("goodput") or {}).get("fraction_of_completed") is not None
          and r["goodput"]["fraction_of_completed"] >= min_good_fraction]
    return max(ok) if ok else float(runs[0]["request_throughput"])


def reference_gpu_limits(docs: list) -> dict:
    """``{"Kind/name/container": {resource: count}}``: see :data:`GPU_LIMITS_RULE`."""
    out = {}
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in k8s_gpu.POD_SPEC:
            continue
        spec = doc
        for key in k8s_gpu.POD_SPEC[doc["kind"]]:
            spec = (spec or {}).get(key) or {}
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            limits = (c.get("resources") or {}).get("limits") or {}
            gpus = {k: int(v) for k, v in limits.items() if str(k).startswith("nvidia.com/")}
            if gpus:
                out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = gpus
    return out


def reference_metrics(trace: list[dict]) -> dict:
    """TTFT, TPOT, ITL and E2EL statistics of a trace, by ``utils.serving.loadgen.summarize``."""
    s = summarize(records_from_trace(trace), duration_s=max((t["end_s"] for t in trace), default=0.0))
    return {m: {k: s[m][k] for k in STATS} for m in METRICS}


def reference_choice(rows: dict) -> str:
    """The notebook's rule: the highest goodput at the operating rate; candidates within
    :data:`CHOICE_TIE` of it tie, and the lowest p95 E2E latency wins the tie."""
    best = max(r["goodput_rps"] for r in rows.values())
    tied = [n for n, r in rows.items() if r["goodput_rps"] >= (1 - CHOICE_TIE) * best]
    return min(tied, key=lambda n: (rows[n]["p95_e2el_ms"] if rows[n]["p95_e2el_ms"] is not None else math.inf, n))


# -- judges of the rule cells ----------------------------------------------------------------------------

def percentile(a, ref):
    want = [float(np.percentile(v, p)) for v, p in a.inputs["percentile"]]
    return [cases(a.calls["percentile"], want, "percentile", PERCENTILE_RULE, approx(1e-9, 1e-9))]


def _metrics_differ(got, want: dict) -> str:
    """How ``got`` (a latency_metrics result) differs from ``want``; "" when it does not."""
    if not isinstance(got, dict) or set(got) != set(METRICS):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return f"it must return a dict with the keys {', '.join(METRICS)}, got {keys}"
    for m in METRICS:
        stats = got[m]
        if not isinstance(stats, dict) or not set(STATS) <= set(stats):
            return f"[{m!r}] must have {', '.join(STATS)}"
        for k in STATS:
            v, w = stats[k], want[m][k]
            if type(v) not in (int, float) or not math.isclose(v, w, rel_tol=1e-9, abs_tol=ROUNDING_MS):
                return f"[{m!r}][{k!r}] = {v!r:.12}, expected {w:.6g}"
    return ""


def metrics(a, ref):
    wrong, first = 0, ""
    results = a.calls["latency_metrics"]
    for r, (trace,) in zip(results, a.inputs["latency_metrics"], strict=True):
        why = f"it raised {r.error}" if not r.ok else _metrics_differ(r.value, reference_metrics(trace))
        if why:
            wrong, first = wrong + 1, first or why
    if wrong:
        raise Fail(f"latency_metrics disagreed with the definitions on {wrong} of {len(results)} hidden traces (first: "
                   f"{first}). The definitions: {METRICS_RULE}")
    return [f"latency_metrics: right on all {len(results)} hidden traces (within the {ROUNDING_MS:g} ms utils.serving.loadgen "
            "rounds to)"]


def capacity(a, ref):
    want = [reference_capacity(s, f) for s, f in a.inputs["capacity_rate"]]
    lines = [cases(a.calls["capacity_rate"], want, "capacity_rate", CAPACITY_RULE, approx(1e-9))]
    cap = reference_capacity(a.sweep_result, MIN_GOOD_FRACTION)
    close(a.CAPACITY, cap, "CAPACITY", f"the rule on sweep_result at min_good_fraction {MIN_GOOD_FRACTION}: "
          + CAPACITY_RULE, rel=1e-9)
    close(a.OPERATING_RATE, HEADROOM * cap, "OPERATING_RATE", f"operating_point.HEADROOM ({HEADROOM}) x CAPACITY",
          rel=1e-9)
    return lines + [f"capacity {cap:.4g} req/s at >= {MIN_GOOD_FRACTION:.0%} of requests within the SLOs; operating "
                    f"rate {HEADROOM * cap:.4g} req/s"]


def scrape(a, ref):
    (url,), = a.inputs["scrape"]
    server, want = _SERVED.pop(url, (None, None))
    if server is not None:
        server.close()
    if want is None:
        raise RuntimeError("the page the grader served is gone")
    (r,) = a.calls["scrape"]
    if not r.ok:
        raise Fail(f"scrape(the grader's URL) raised {r.error}")
    got = r.value
    if not isinstance(got, dict):
        raise Fail(f"scrape must return a dict of sample name -> [(labels dict, value), ...], got {type(got).__name__}")
    canon = {}
    for name, samples in got.items():
        try:
            canon[name] = sorted((tuple(sorted(lab.items())), float(v)) for lab, v in samples
                                 if isinstance(lab, dict) and type(v) in (int, float))
            ok = len(canon[name]) == len(samples)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise Fail(f"scrape(...)[{name!r}] must be a list of (labels dict, value) pairs, one per sample")
    expected = {k: sorted((tuple(sorted(lab.items())), v) for lab, v in s) for k, s in want.items()}
    if canon != expected:
        missing = sorted(set(expected) - set(canon))
        wrong = sorted(k for k in set(expected) & set(canon) if expected[k] != canon[k])
        extra = sorted(set(canon) - set(expected))
        raise Fail(f"scrape of the grader's page differs from prometheus_client's parse of it: missing samples "
                   f"{missing[:4]}, different values or labels {wrong[:4]}, unexpected {extra[:4]} (the keys are sample "
                   "names, such as a counter's <name>_total, not family names)")
    return [f"scrape: all {sum(len(v) for v in expected.values())} samples of {len(expected)} names of the grader's "
            "page, labels and values as prometheus_client parses them"]


def gpu_limits(a, ref):
    want = [reference_gpu_limits(docs) for (docs,) in a.inputs["gpu_limits"]]
    return [cases(a.calls["gpu_limits"], want, "gpu_limits", GPU_LIMITS_RULE)]


def _hide(text: str, values: tuple) -> str:
    """``text`` with the hidden arguments in it replaced by what they are (a message never names an input)."""
    for value, what in values:
        text = text.replace(repr(value), what).replace(str(value), what) if isinstance(value, str) else \
            re.sub(rf"(?<![\w.]){value}(?![\w.])", what, text)
    return text


def _manifests(a, name: str, validate, hidden) -> tuple[int, str, list[str]]:
    wrong, first, notes = 0, "", []
    for r, args in zip(a.calls[name], a.inputs[name], strict=True):
        if not r.ok:
            why = f"it raised {r.error}"
        else:
            try:
                notes = validate(r.value, *args)
                why = ""
            except k8s_gpu.ManifestError as exc:
                why = _hide(str(exc), hidden(*args))
        if why:
            wrong, first = wrong + 1, first or why
    return wrong, first, notes


def gpu_pod(a, ref):
    def validate(doc, image, model, gpus, port):
        return k8s_gpu.validate_vllm_pod(doc, image=image, model=model, gpus=gpus, port=port)

    wrong, first, notes = _manifests(a, "gpu_pod", validate,
                                     lambda image, model, gpus, port: ((image, "<image>"), (model, "<model>"),
                                                                       (port, "<port>")))
    n = len(a.calls["gpu_pod"])
    if wrong:
        raise Fail(f"gpu_pod's manifest was refused on {wrong} of {n} hidden (image, model, gpus, port) (first: {first}). "
                   "The rules: a Pod running `vllm serve <model> --port <port>` from <image>, its GPUs an int in "
                   "resources.limits (a request equal or absent), --tensor-parallel-size equal to the GPUs when more "
                   "than one, and a containerPort for the port")
    return [f"gpu_pod: {n} hidden manifests (1 to 8 GPUs, other images, models and ports) pass; " + "; ".join(notes[:1])]


def time_slicing(a, ref):
    wrong, first, notes = _manifests(a, "time_slicing_config", lambda doc, n: k8s_gpu.validate_time_slicing(doc, n),
                                     lambda n: ())
    n = len(a.calls["time_slicing_config"])
    if wrong:
        raise Fail(f"time_slicing_config's ConfigMap was refused on {wrong} of {n} hidden replica counts (first: "
                   f"{first}). The rules: a ConfigMap whose data values are the device plugin's config as YAML text, "
                   "version v1, sharing.timeSlicing.resources = [{name: nvidia.com/gpu, replicas: <replicas>}]")
    return [f"time_slicing_config: {n} hidden replica counts each read back; " + "; ".join(notes[:1])]


# -- a load test's result: consistent with its own requests, and the load it claims -----------------------

def _recompute(run: dict) -> dict:
    """The run's summary from its own requests, with its workload's SLOs (as ``utils.serving.loadgen.run`` does)."""
    w = run["workload"]
    return summarize([RequestRecord.from_dict(r) for r in run["requests"]], duration_s=run["duration_s"],
                     slo=w["slo_ms"] or None, concurrency=w["concurrency"], request_rate=w["request_rate"])


def consistent(run: dict, what: str) -> None:
    """Every number of ``run`` the judges use follows from its per-request records, and its duration
    covers them."""
    try:
        again = _recompute(run)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise Fail(f"{what}: its per-request records cannot be read ({type(exc).__name__}: {exc})") from None
    if len(run["requests"]) != run["workload"]["num_requests"]:
        raise Fail(f"{what} has {len(run['requests'])} request records, but its workload sent "
                   f"{run['workload']['num_requests']}: edited results")
    for key in ("completed", "failed", "cancelled", "not_sent"):
        if again[key] != run[key]:
            raise Fail(f"{what}['{key}'] = {run[key]} but its requests say {again[key]}: edited results")
    ends = [r["done_s"] for r in run["requests"] if r["done_s"] is not None]
    last = max(ends, default=0.0)
    stopped = run["cancelled"] or run["not_sent"]
    if run["duration_s"] < last - 1e-3 or (not stopped and run["duration_s"] > 1.25 * last + DURATION_SLACK_S):
        raise Fail(f"{what}['duration_s'] = {run['duration_s']:.4g} s, but its last request finished at {last:.4g} s: "
                   "edited results")
    close(run["request_throughput"], again["request_throughput"], f"{what}['request_throughput']",
          "completed requests over duration_s, from its requests: edited results?", rel=1e-3, abs_tol=1e-4)
    for m in METRICS:
        for k in (*STATS, "min", "max"):
            x, y = run[m][k], again[m][k]
            if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=1e-6, abs_tol=TRACE_TOL_MS)):
                raise Fail(f"{what}['{m}']['{k}'] = {x} but its requests give {y}: edited results")
    g1, g2 = run.get("goodput"), again.get("goodput")
    if (g1 is None) != (g2 is None) or (g1 and (g1["good_requests"] != g2["good_requests"]
                                                 or g1["slo_ms"] != run["workload"]["slo_ms"])):
        raise Fail(f"{what}: its goodput does not follow from its requests and SLOs: edited results")
    if g1:
        close(g1["request_goodput"], g2["request_goodput"], f"{what}['goodput']['request_goodput']",
              "good requests over duration_s: edited results?", rel=1e-3, abs_tol=1e-4)
        f1, f2 = g1["fraction_of_completed"], g2["fraction_of_completed"]
        if (f1 is None) != (f2 is None) or (f1 is not None and abs(f1 - f2) > 1e-4):
            raise Fail(f"{what}['goodput']['fraction_of_completed'] = {f1} but its requests give {f2}: edited results")


def _same_load(w: dict, desc: dict, what: str, keys: tuple = MATCH_KEYS) -> None:
    for k in keys:
        if k == "seed" and desc.get(k) is None and isinstance(w.get(k), int):
            continue  # no seed set: each run draws its own and records it (utils/serving/loadgen/workloads.py)
        if w.get(k) != desc.get(k):
            raise Fail(f"{what} ran {k}={w.get(k)!r:.80}, but WORKLOAD has {desc.get(k)!r:.80}: not the workload you "
                       "defined (re-run it after changing WORKLOAD)")


def workload_valid(desc: dict, sizes) -> None:
    """The rules of the notebook's workload exercise for this tier's sizes (one message per broken rule)."""
    slo = desc["slo_ms"]
    rules = [
        (desc["endpoint"] == "completions" and desc["stream"] is True,
         "endpoint must be 'completions' with stream=True (TTFT and TPOT need streaming)"),
        (desc["num_requests"] == sizes.num_requests, f"num_requests must be SIZES.num_requests ({sizes.num_requests})"),
        (desc["output_len"] >= 8, "output_len must be at least 8 tokens"),
        (desc["input_len"] + desc["output_len"] <= sizes.max_len,
         f"input_len + output_len must be at most SIZES.max_len ({sizes.max_len})"),
        (desc["concurrency"] is None, "leave concurrency unset: the sweep sets it per step"),
        (desc["arrival"] in ("poisson", "constant"), "arrival must be 'poisson' or 'constant' with a positive burstiness"),
        (desc["dataset"] is None, "use synthetic prompts (dataset=None): the grader re-creates them"),
        (desc["max_duration_s"] is not None and desc["max_duration_s"] <= sizes.max_duration_s,
         f"max_duration_s must be set, at most SIZES.max_duration_s ({sizes.max_duration_s:g} s)"),
        (set(slo) == set(SLO_KEYS) and all(v > 0 for v in slo.values()),
         "slo_ms must set all three SLOs, {'ttft': ms, 'tpot': ms, 'e2el': ms}, each a positive number"),
    ]
    for ok, message in rules:
        if not ok:
            raise Fail(f"WORKLOAD: {message}")


def slo_bounds(p50_ms: float) -> tuple[float, float]:
    """The SLOs a synchronous p50 allows: at least the p50, at most :data:`SLO_MAX_FACTOR` times it,
    with a p50 under ``operating_point.SLO_FLOOR_MS`` counted as that floor."""
    return p50_ms, SLO_MAX_FACTOR * max(p50_ms, SLO_FLOOR_MS)


def sweep_ran(sweep: dict, desc: dict, points: int, first: dict | None = None) -> list[float]:
    """``sweep`` is ``utils.serving.loadgen.sweep(WORKLOAD, points=points)``, unedited, and the SLOs are
    attainable without load and meaningful under it; returns the unloaded TTFT/TPOT/E2EL p50s.

    The unloaded latency is the sweep's synchronous step and ``first``, the notebook's own
    synchronous run, which the learner sets the SLOs from. On a shared machine the two can differ
    several-fold (on two cores, beside a second engine, a TTFT p50 of 10 ms in one and 54 ms in the
    other), so an SLO passes if it is at least the lower p50 and at most :data:`SLO_MAX_FACTOR`
    times the higher: the learner is judged on a run they saw."""
    if not sweep["sweep"]:
        raise Fail("sweep_result must be what utils.serving.loadgen.sweep returns")
    runs = sweep["runs"]
    if len(runs) != points + 2:
        raise Fail(f"the sweep has {len(runs)} steps; utils.serving.loadgen.sweep(WORKLOAD, points={points}) has {points + 2} "
                   f"(synchronous, throughput, {points} rates)")
    _same_load(sweep["workload"], desc, "the sweep")
    for i, run in enumerate(runs):
        what = f"sweep step {i} ({run['label']})"
        _same_load(run["workload"], desc, what)
        conc, rate = run["workload"]["concurrency"], run["workload"]["request_rate"]
        want = (1, "inf") if i == 0 else (None, "inf") if i == 1 else (None, "finite")
        if (conc, "inf" if math.isinf(rate) else "finite") != want:
            raise Fail(f"{what}: concurrency {conc}, rate {rate}: not the step utils.serving.loadgen.sweep runs there")
        consistent(run, what)
    lo, hi = runs[0]["request_throughput"], runs[1]["request_throughput"]
    rates = [float(x) for x in np.linspace(lo, hi, points + 2)[1:-1]]
    for run, want in zip(runs[2:], rates, strict=True):
        if not math.isclose(run["workload"]["request_rate"], want, rel_tol=1e-9):
            raise Fail(f"sweep step {run['label']!r} ran at {run['workload']['request_rate']:.6g} req/s; utils.serving.loadgen.sweep "
                       f"spaces its rates evenly between the synchronous and throughput steps' ({lo:.4g} and {hi:.4g} "
                       f"req/s), so {want:.6g} req/s there: edited results")
    unloaded = [runs[0]]
    if first is not None:
        consistent(first, "first")
        _same_load(first["workload"], desc, "first", ("base_url", "model", "input_len", "output_len"))
        if first["workload"]["concurrency"] != 1 or not math.isinf(first["workload"]["request_rate"]):
            raise Fail("first must be the synchronous run (concurrency=1) the notebook makes")
        unloaded.append(first)
    lows = []
    for key in SLO_KEYS:
        p50s = [p for p in (r[f"{key}_ms"]["p50"] for r in unloaded) if p is not None]
        if not p50s:
            raise Fail(f"the synchronous step has no {key} measurement; did its requests fail?")
        slo, where = desc["slo_ms"][key], " and ".join(f"{p:.4g}" for p in p50s)
        if slo < min(p50s):
            raise Fail(f"the {key} SLO ({slo:.4g} ms) is below the synchronous p50 ({where} ms): even an idle engine "
                       "misses it; base it on the unloaded latency")
        if slo > slo_bounds(max(p50s))[1]:
            raise Fail(f"the {key} SLO ({slo:.4g} ms) is over {SLO_MAX_FACTOR:g}x the synchronous p50 ({where} ms, "
                       f"counted as at least {SLO_FLOOR_MS:g} ms): every load meets it, so it measures nothing")
        lows.append(min(p50s))
    return lows


def operating_run_ok(run: dict, desc: dict, rate: float, what: str = "operating", same_server: bool = True) -> None:
    """``run`` is WORKLOAD at ``rate`` (against another server when ``same_server`` is False),
    unedited, with the goodput of WORKLOAD's SLOs."""
    consistent(run, what)
    keys = MATCH_KEYS if same_server else tuple(k for k in MATCH_KEYS if k not in SERVER_KEYS)
    _same_load(run["workload"], desc, what, keys)
    got = run["workload"]["request_rate"]
    if math.isinf(got) or not math.isclose(got, rate, rel_tol=1e-9):
        raise Fail(f"{what} ran at request_rate {got}, not OPERATING_RATE ({rate:.6g} req/s)")
    if run["workload"]["concurrency"] is not None:
        raise Fail(f"{what} capped concurrency; run WORKLOAD at OPERATING_RATE as it is")
    if run.get("goodput") is None:
        raise Fail(f"{what} has no goodput: run WORKLOAD, whose slo_ms sets the SLOs")


def plausible(run: dict, weight_bytes: int, spec, what: str) -> str:
    """Every decode step reads all the weights: no request of n tokens ends sooner than n - 1 reads of
    the weights' bytes at the datasheet bandwidth after it was sent (batched requests share a step,
    they do not shorten it; E2E latency, which no chunking of the stream can shorten, not TPOT)."""
    step_ms = transfer_ms(weight_bytes, spec.bandwidth_gbs)
    worst, ratio = None, math.inf
    for r in run["requests"]:
        if r["ok"] and r["e2el_s"] is not None and r["output_tokens"] >= 2:
            need = (r["output_tokens"] - 1) * step_ms
            if r["e2el_s"] * 1e3 / need < ratio:
                worst, ratio = r, r["e2el_s"] * 1e3 / need
    if worst is None:
        return f"{what}: no request of two tokens or more to check against the datasheet"
    n, ms = worst["output_tokens"], worst["e2el_s"] * 1e3
    if ratio * expect.DATASHEET_SLACK < 1:
        raise Fail(f"{what}: a request of {n} tokens in {ms:.4g} ms read {weight_bytes / 1e9:.3g} GB of weights {n - 1} "
                   f"times at {(n - 1) * weight_bytes / ms / 1e6:.4g} GB/s, above the {spec.name} datasheet bandwidth "
                   f"({spec.bandwidth_gbs:g} GB/s): not physically possible")
    return (f"{what}: its fastest request ({n} tokens in {ms:.4g} ms) is no faster than the {spec.name} reads the "
            f"weights {n - 1} times ({(n - 1) * step_ms:.4g} ms)")


# -- the grader's own runs at the operating rate ----------------------------------------------------------

def _not_faster_than_the_engine(run: dict, desc: dict, ref, what: str) -> str:
    """The learner's run's E2E latency p50 against the engine's own, one request at a time: no request
    finishes sooner under load than alone, and a loaded CPU slows the engine by a bounded factor
    only, so a made-up fast run fails here. (E2E latency, not TPOT: an engine that falls behind its
    stream sends a request's tokens in one chunk and its TPOT reads 0; its end is not moved.)"""
    yours = run["e2el_ms"]["p50"]
    if yours is None:
        return f"no request of {what} finished: nothing to compare with the engine's speed"
    mine = expect.usable(ref.engine_e2el_ms(desc), "E2E latency p50 one request at a time", "ms")
    lowest = mine / (1 + expect.LOAD_CAP[ref.ctx.smoke])
    if yours < lowest:
        raise Fail(f"{what}'s E2E latency p50 = {yours:.4g} ms, but the grader measured {mine:.4g} ms for its own engine, "
                   f"one request at a time; at least {lowest:.4g} ms accepted: faster than the engine")
    return (f"the engine's own E2E latency p50, one request at a time: grader {mine:.4g} ms, {what}'s {yours:.4g} ms "
            f"(at least {lowest:.4g} ms)")


def _you_queued(run: dict, desc: dict, ref, what: str) -> list[str]:
    """The learner's own run at the operating rate had no request within every SLO. That run was
    measured in the very execution being graded, on the grading machine: a goodput of 0 is that
    machine's load at that moment (the engine queued), never a wrong answer, and a made-up zero gains
    nothing. So nothing is compared but the run's speed against the engine's alone, and the feedback
    says what the zero means."""
    lines = []
    if run["e2el_ms"]["p50"] is not None:  # None: not one request finished, nothing to time
        lines.append(_not_faster_than_the_engine(run, desc, ref, what) if ref.live else
                     f"{what}: E2E latency p50 {run['e2el_ms']['p50']:.4g} ms as recorded (not re-measured)")
    slo = run["goodput"]["slo_ms"]
    p95 = {k: run[f"{k}_ms"]["p95"] for k in slo if f"{k}_ms" in run}
    missed = ", ".join(f"{k.upper()} p95 {p95[k]:.4g} ms against {slo[k]:.4g} ms" for k in slo
                       if p95.get(k) is not None and p95[k] > slo[k])
    return lines + [f"no request of {what} met every SLO ({missed or 'none finished'}): the engine queued while it ran, "
                    "so the machine was busier than during your sweep. Not compared, so not counted against you; on a "
                    "quieter machine, run the sweep and the operating run again for a rate that holds"]


def against_the_graders_runs(run: dict, desc: dict, rate: float, ref, what: str, goodput_name: str,
                             p95_name: str) -> list[str]:
    """The learner's run at the operating rate against the grader's own runs of the same load on its
    own engine (bands from their spread alone); from a record, notes."""
    goodput, p95 = run["goodput"]["request_goodput"], run["e2el_ms"]["p95"]
    if p95 is None or goodput == 0:
        return _you_queued(run, desc, ref, what)
    if not ref.live:
        return [f"{goodput_name}: {goodput:.4g} req/s and {p95_name}: {p95:.4g} ms as recorded (not re-measured)"]
    mine = ref.operating(desc, rate)
    g, e = mine.goodput, mine.p95
    runs = (f"the grader's runs: goodput {', '.join(f'{x:.4g}' for x in g)} req/s, p95 E2E latency "
            f"{', '.join(f'{x:.4g}' for x in e)} ms")
    if not all(x > 0 for x in g) or not all(math.isfinite(x) and x > 0 for x in e):
        line = _not_faster_than_the_engine(run, desc, ref, what)
        raise expect.Unusable(f"the grader's own runs at your operating rate did not keep up ({runs}; {line}): the "
                              "engine queued, so their goodput and p95 cannot be compared with yours")
    why = f"the grader's {len(g)} runs spread {{:.0%}}" + (f", widened x{ref.slowdown:.2g} for load" if ref.slowdown > 1 else "")
    e_ref = Measured(statistics.median(e), expect.band([expect.spread(e)], ref.ctx.smoke, ref.slowdown),
                     why.format(expect.spread(e)))
    g_ref = Measured(statistics.median(g), expect.band([expect.spread(g)], ref.ctx.smoke, ref.slowdown),
                     why.format(expect.spread(g)))
    return [e_ref.against(p95, p95_name, "ms"),  # first: a made-up fast run fails here
            g_ref.against(goodput, goodput_name, "req/s"), runs]


# -- judges of the measured cells --------------------------------------------------------------------------

def workload(a, ref):
    ctx = ref.ctx
    desc = a.WORKLOAD
    workload_valid(desc, ctx.sizes)
    lows = sweep_ran(a.sweep_result, desc, ctx.sizes.sweep_points, a.first)
    slo = ", ".join(f"{k} {desc['slo_ms'][k]:.4g}" for k in SLO_KEYS)
    lines = [f"SLOs {slo} ms; unloaded p50s "
             f"{', '.join(f'{k} {v:.4g}' for k, v in zip(SLO_KEYS, lows, strict=True))} ms"]
    for what, run in (("the sweep's synchronous step", a.sweep_result["runs"][0]), ("first", a.first)):
        if ref.live:
            lines.append(_not_faster_than_the_engine(run, desc, ref, what))
        elif ref.weight_bytes and ctx.spec:
            lines.append(plausible(run, ref.weight_bytes, ctx.spec, what))
    return lines


def goodput(a, ref):
    desc, rate, run = a.WORKLOAD, a.OPERATING_RATE, a.operating
    workload_valid(desc, ref.ctx.sizes)
    close(rate, HEADROOM * a.CAPACITY, "OPERATING_RATE", f"operating_point.HEADROOM ({HEADROOM}) x CAPACITY", rel=1e-9)
    operating_run_ok(run, desc, rate)
    close(a.goodput_rps, run["goodput"]["request_goodput"], "goodput_rps", "operating['goodput']['request_goodput']",
          rel=1e-9)
    want_p95 = run["e2el_ms"]["p95"]
    if want_p95 is None and a.p95_e2el_ms is not None:
        raise Fail(f"p95_e2el_ms = {a.p95_e2el_ms:.6g}, but no request of operating finished (its e2el_ms p95 is None): "
                   "take operating['e2el_ms']['p95']")
    if want_p95 is not None:
        close(a.p95_e2el_ms if a.p95_e2el_ms is not None else math.nan, want_p95, "p95_e2el_ms",
              "operating['e2el_ms']['p95']", rel=1e-9)
    lines = []
    if not ref.live and ref.weight_bytes and ref.ctx.spec:
        lines.append(plausible(run, ref.weight_bytes, ref.ctx.spec, "operating"))
    return against_the_graders_runs(run, desc, rate, ref, "operating", "goodput_rps", "p95_e2el_ms") + lines


def choice(a, ref):
    desc, rate, cands, pick = a.WORKLOAD, a.OPERATING_RATE, a.candidates, a.CHOICE
    if not cands:
        raise Fail("candidates must map each configuration's name to its loadgen result")
    for name, run in cands.items():
        operating_run_ok(run, desc, rate, what=f"candidates[{name!r}]", same_server=False)
    rows = {n: candidate_row(r) for n, r in cands.items()}
    if pick["config"] not in rows:
        raise Fail(f"CHOICE['config'] = {pick['config']!r:.80} is not one of the measured candidates "
                   f"({', '.join(map(repr, rows))})")
    want = reference_choice(rows)
    if pick["config"] != want:
        r, w = rows[pick["config"]], rows[want]
        raise Fail(f"CHOICE picks {pick['config']!r} ({r['goodput_rps']:.4g} req/s good, p95 E2E {r['p95_e2el_ms']} ms), "
                   f"but the rule picks {want!r} ({w['goodput_rps']:.4g} req/s, p95 {w['p95_e2el_ms']} ms): the highest "
                   f"goodput; goodputs within {CHOICE_TIE:.0%} of it tie, and the lowest p95 E2E latency breaks the tie")
    row = rows[want]
    close(pick["goodput_rps"], row["goodput_rps"], "CHOICE['goodput_rps']", "the chosen candidate's measured goodput",
          rel=1e-9)
    if (pick["p95_e2el_ms"] is None) != (row["p95_e2el_ms"] is None):
        equal(pick["p95_e2el_ms"], row["p95_e2el_ms"], "CHOICE['p95_e2el_ms']", "the chosen candidate's measured p95")
    elif row["p95_e2el_ms"] is not None:
        close(pick["p95_e2el_ms"], row["p95_e2el_ms"], "CHOICE['p95_e2el_ms']", "the chosen candidate's measured p95",
              rel=1e-9)
    if len(pick["why"].split()) < 5:
        raise Fail("CHOICE['why'] must say in a sentence why (what the numbers show)")
    lines = [f"CHOICE {want!r} among {len(rows)} candidates, by the rule on their measured goodput and p95"]
    if ref.live:
        mine = ref.engine_label
        if mine not in cands:
            raise Fail(f"candidates has no result for the engine the notebook started ({mine!r}); the compare cell "
                       "names it by server.label")
        lines += against_the_graders_runs(cands[mine], desc, rate, ref, f"candidates[{mine!r}]",
                                          f"candidates[{mine!r}] goodput", f"candidates[{mine!r}] p95 E2E latency")
    return lines


CHECKS = [
    Check("test_percentile", percentile, calls={"percentile": percentile_cases}, forbid=TRACE_FORBID),
    Check("test_metrics", metrics, calls={"latency_metrics": trace_cases}, forbid=TRACE_FORBID),
    Check("test_workload", workload, measures=("engine",)),
    Check("test_capacity", capacity, calls={"capacity_rate": capacity_cases}, forbid=CAPACITY_FORBID),
    Check("test_goodput", goodput, measures=("engine",)),
    Check("test_choice", choice, measures=("engine",)),
    Check("test_scrape", scrape, calls={"scrape": scrape_cases}, strict=True),
    Check("test_gpu_limits", gpu_limits, calls={"gpu_limits": gpu_limits_cases}, forbid=K8S_FORBID),
    Check("test_gpu_pod", gpu_pod, calls={"gpu_pod": gpu_pod_cases}),
    Check("test_time_slicing", time_slicing, calls={"time_slicing_config": time_slicing_cases}),
]
