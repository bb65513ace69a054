"""The checks the hidden tests of phase 4 (``04_benchmarking_production``) run.

Pure cells are compared exactly with the course's references: the learner's percentile and
latency metrics against ``utils.loadgen``'s own code (``summarize``) on traces this file
generates, the capacity rule on the learner's sweep and on made-up ones, the GPU requests of
Kubernetes manifests, and a scrape of a Prometheus endpoint served here. Measured cells follow
the phase 0 rules: with a GPU here, or with no GPU record to grade, the grader re-runs the
learner's load at the operating rate against the same running engine, several times, and
compares goodput and p95 end-to-end latency within a band from the spread of its own runs
("measured live"); with no GPU here and a GPU record submitted, the record is graded instead
(:mod:`grader.phase4_records`). Whether the workload matches what was run, and whether the
engine choice follows from the measured candidates, is checked on the results' own per-request
traces (every summary is recomputed from them), live or from the record.

Hidden tests get this module from ``grader.phase(4)``, with fresh copies of ``checks.py`` and
``phase4_records.py`` (``grader/__init__.py``); the checks of the pod and time-slicing exercises are in
``grader/phase4_containers.py``, loaded afresh the same way.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from grader import checks, remeasure  # grader.phase(4) rebinds these to fresh copies: use them at call time only
from grader import phase4_records as records

PHASE = "04_benchmarking_production"
EXTRA_MODULES = ("utils.loadgen.client", "utils.loadgen.metrics", "utils.loadgen.workloads", "utils.serve",
                 "utils.engines", "utils.model_dir",  # the starter's command lines and model directory
                 "utils.exporter", "utils.dcgm_metrics", "utils.nvml_collector", "utils.loadgen.trace",
                 "utils.operating_point")
CONSTANT_MODULES = ("utils.operating_point",)  # the capacity and choice rules' thresholds
RERUNS = 3  # the grader's runs at the operating rate, per comparison
SYNC_REQUESTS = 4  # the grader's requests one at a time, when its runs at the operating rate did not keep up
ATTEMPTS = 2  # a comparison that misses its band is measured again once (more when the machine was at fault)
POD_SPEC = {"Pod": ("spec",), "Deployment": ("spec", "template", "spec"), "StatefulSet": ("spec", "template", "spec"),
            "DaemonSet": ("spec", "template", "spec"), "ReplicaSet": ("spec", "template", "spec"),
            "Job": ("spec", "template", "spec"), "CronJob": ("spec", "jobTemplate", "spec", "template", "spec")}


def sizes():
    from utils.env import phase_sizes

    return phase_sizes(PHASE)


# -- setting, tampering, reporting ----------------------------------------------------------

def untampered() -> None:
    """:func:`checks.assert_untampered` plus phase 4's modules (loadgen, serve, exporter)."""
    checks.assert_untampered(EXTRA_MODULES)


def _begin(what: str, remeasured: bool = True) -> str:
    """Say how this cell is graded (first, so a failing cell says it too); returns the mode."""
    return checks.begin(what, "re-measured by the grader in this run" if remeasured else "checked on the results of this run")


def _engine_ok(server) -> None:
    """``server`` is the engine the notebook started: alive, an engine's own server, on this
    lab's model directory."""
    from utils.serve import ServeError, Server, read_marker

    if not isinstance(server, Server) or not server.alive():
        raise AssertionError("server must be the running engine the notebook started (serve.start)")
    cmd = " ".join(server.command)
    if not any(e in cmd for e in ("transformers.cli.transformers serve", "vllm.entrypoints.openai.api_server",
                                  "sglang.launch_server")):
        raise AssertionError("server must run transformers serve, vLLM or SGLang (serve.start), not another program")
    try:
        preset = read_marker(server.model_dir).get("preset")
    except ServeError as exc:
        raise AssertionError(str(exc)) from None
    if preset != sizes().model:
        raise AssertionError(f"the engine serves {preset}; this lab serves {sizes().model} (SIZES.model)")


# -- 1. percentiles and latency metrics from a trace ----------------------------------------

def random_trace(seed: int, n: int = 40) -> list[dict]:
    """A made-up trace in the notebook's format, with what trips a careless implementation:
    failed requests (excluded), one-token answers (no TPOT), chunks that carry several tokens
    (TPOT counts tokens, ITL counts chunk gaps), a usage event after the last text chunk
    (E2E latency ends there), and arrivals that overlap."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(20.0)
        sent = round(t, 6)
        chunks = [sent + rng.lognormvariate(math.log(0.05), 0.6)]
        n_chunks = 1 if i % 9 == 4 else rng.randint(2, 24)
        for _ in range(n_chunks - 1):
            chunks.append(chunks[-1] + rng.lognormvariate(math.log(0.01), 0.5))
        tokens = n_chunks + (rng.randint(1, 3) if i % 5 == 2 else 0)
        end = chunks[-1] + rng.uniform(0.0, 0.002)
        ok = i % 7 != 3
        if not ok:
            chunks = chunks[: rng.randint(0, len(chunks) - 1)]
            end = (chunks[-1] if chunks else sent) + rng.uniform(0.0, 0.5)
            tokens = 0
        out.append({"sent_s": sent, "chunks_s": [round(c, 6) for c in chunks], "end_s": round(end, 6),
                    "output_tokens": tokens, "ok": ok})
    return out


def check_percentile(percentile) -> None:
    """Exact against numpy's default (linear interpolation between closest ranks)."""
    import numpy as np

    rng = np.random.default_rng(4)
    cases = [([7.0], 50), ([3.0, 1.0], 50), ([5.0, 1.0, 3.0], 0), ([5.0, 1.0, 3.0], 100), ([2.0, 2.0, 9.0, 4.0], 95)]
    cases += [(list(rng.lognormal(0, 1, size=k)), p) for k in (2, 5, 12, 101) for p in (50, 90, 95, 99, 37.5)]
    for values, p in cases:
        got = checks.call(percentile, list(values), p, name="percentile", show_args=False)
        checks.assert_close(got, float(np.percentile(values, p)), f"percentile({len(values)} values, {p})",
                            rel=1e-12, abs_tol=1e-12)


def _same_metrics(got: Any, want: dict, where: str) -> None:
    if not isinstance(got, dict) or set(got) != set(records.METRICS):
        raise AssertionError(f"latency_metrics must return a dict with keys {', '.join(records.METRICS)}; got "
                             f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
    for m in records.METRICS:
        stats = got[m]
        if not isinstance(stats, dict) or not set(records.STATS) <= set(stats):
            raise AssertionError(f"latency_metrics(...)[{m!r}] must have {', '.join(records.STATS)}")
        for s in records.STATS:
            checks.assert_close(stats[s], want[m][s], f"{m} {s} ({where})", rel=1e-9, abs_tol=records.ROUNDING_MS)


def check_metrics(latency_metrics, trace) -> None:
    """The learner's TTFT/TPOT/ITL/E2EL statistics equal utils.loadgen's (summarize) on the
    notebook's recorded trace and on traces made here (within the 1e-4 ms loadgen rounds to)."""
    for seed in (1, 2, 3):
        t = random_trace(seed)
        _same_metrics(checks.call(latency_metrics, t, name="latency_metrics", show_args=False), records.reference_metrics(t),
                      f"made-up trace {seed}")
    _same_metrics(checks.call(latency_metrics, trace, name="latency_metrics", show_args=False), records.reference_metrics(trace),
                  "TRACE")


# -- 2. the workload and the sweep ------------------------------------------------------------

def check_workload(workload, server, sweep_result, first=None) -> None:
    """WORKLOAD is a valid, complete definition for this engine, and the sweep ran exactly it;
    its SLOs are judged on the unloaded runs the learner saw (``first``, the sweep's first step)."""
    mode = _begin("your workload and the sweep that ran it", remeasured=False)
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    if mode == checks.RECORD:
        return records.workload_from_record()
    untampered()
    from utils.loadgen import Workload

    if not isinstance(workload, Workload):
        raise AssertionError("WORKLOAD must be a utils.loadgen.Workload")
    _engine_ok(server)
    desc = records.workload_desc(workload)
    records.workload_valid(desc, dataclasses.asdict(sizes()))
    for key in ("base_url", "model"):
        if desc[key] != getattr(server, key):
            raise AssertionError(f"WORKLOAD.{key} = {desc[key]!r}, but the engine's is {getattr(server, key)!r}: "
                                 "start from server.workload_fields()")
    records.sweep_ran(sweep_result, desc, sizes().sweep_points, first)
    checks.say(f"  SLOs {desc['slo_ms']} ms; synchronous p50: " + ", ".join(
        f"{k} {records.run_stat(sweep_result['runs'][0], k, 'p50'):.4g}" for k in records.SLO_KEYS))


# -- 3. capacity under the SLO ------------------------------------------------------------------

def random_sweeps(seed: int, n: int = 12) -> list[dict]:
    """Made-up sweeps in ``utils.loadgen.sweep``'s shape: rates that meet the SLO and some that
    do not, steps cut short (not every request completed), one where nothing qualifies."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        num = rng.choice((8, 12, 16))
        sync = rng.uniform(0.5, 20.0)
        top = sync * rng.uniform(1.0, 6.0)

        def run(rate, throughput, fraction, completed, num=num):
            good = None if fraction is None else {"fraction_of_completed": fraction}
            return {"workload": {"request_rate": rate, "num_requests": num}, "request_throughput": throughput,
                    "completed": completed, "goodput": good}

        runs = [run("inf", sync, rng.choice((1.0, 0.95, 0.5)), num),
                run("inf", top, rng.uniform(0, 1), num if rng.random() < 0.8 else num - 1)]
        for rate in sorted(rng.uniform(sync, top) for _ in range(rng.randint(1, 4))):
            frac = 0.0 if k == 3 else rng.choice((1.0, 0.92, 0.9, 0.89, 0.3, None))
            runs.append(run(round(rate, 4), rate * rng.uniform(0.7, 1.0), frac,
                            num if rng.random() < 0.85 else rng.randint(0, num - 1)))
        if k == 3:
            runs[0]["goodput"]["fraction_of_completed"] = runs[1]["goodput"]["fraction_of_completed"] = 0.0
        out.append({"sweep": True, "runs": runs})
    return out


def check_capacity(capacity_rate, sweep_result, capacity, operating_rate) -> None:
    """capacity_rate follows the rule exactly (the learner's sweep and made-up ones), and
    CAPACITY and OPERATING_RATE are what it gives on the sweep."""
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    for i, sw in enumerate(random_sweeps(7)):
        for frac in (records.MIN_GOOD_FRACTION, 0.5):
            got = checks.call(capacity_rate, sw, frac, name="capacity_rate", show_args=False)
            checks.assert_close(got, records.reference_capacity(sw, frac), f"capacity_rate(made-up sweep {i}, {frac})",
                                rel=1e-12)
    want = records.reference_capacity(sweep_result, records.MIN_GOOD_FRACTION)
    checks.assert_close(checks.call(capacity_rate, sweep_result, records.MIN_GOOD_FRACTION, name="capacity_rate", show_args=False), want,
                        "capacity_rate(sweep_result)", rel=1e-12)
    checks.assert_close(capacity, want, "CAPACITY", rel=1e-12)
    checks.assert_close(operating_rate, records.HEADROOM * want, f"OPERATING_RATE ({records.HEADROOM} x CAPACITY)", rel=1e-12)
    checks.say(f"  capacity {want:.4g} req/s at >= {records.MIN_GOOD_FRACTION:.0%} of requests within the SLOs; "
               f"operating rate {records.HEADROOM * want:.4g} req/s")


# -- 4. goodput and p95 at the operating rate, re-measured --------------------------------------

class _Spread:
    """median / min / max of a few runs, for checks.band() (as p20 / p80)."""

    def __init__(self, values: list[float]):
        v = sorted(values)
        self.median_ms, self.p20_ms, self.p80_ms = v[len(v) // 2], v[0], v[-1]


def measure_operating(workload, operating_rate: float, runs: int = RERUNS) -> list[dict]:
    """The grader's own runs of the learner's workload at the operating rate (no warm-up probe:
    the engine is warm)."""
    from utils import loadgen

    w = dataclasses.replace(workload, request_rate=float(operating_rate), probe=False)
    with checks.quiet():
        return [loadgen.run(w, progress=False, label="grader") for _ in range(runs)]


def measure_synchronous(workload, requests: int = SYNC_REQUESTS) -> dict:
    """The grader's run of the learner's workload one request at a time: no queue, so its TPOT is
    the engine's own speed, slowed by a loaded CPU at most by the slowdown ``remeasure.Load`` bounds."""
    from utils import loadgen

    w = dataclasses.replace(workload, concurrency=1, request_rate=math.inf, num_requests=requests, probe=False)
    with checks.quiet():
        return loadgen.run(w, progress=False, label="grader, synchronous")


def _not_faster_than_the_engine(workload, operating) -> float:
    """The learner's operating run's TPOT p50 against the engine's own speed, one request at a
    time, which a loaded CPU slows by a bounded factor only: a made-up fast run fails here.
    Returns the grader's TPOT p50 (ms)."""
    sync = records.run_stat(measure_synchronous(workload), "tpot", "p50")
    yours = checks.as_number(records.run_stat(operating, "tpot", "p50"), "operating's TPOT p50")
    ref = checks.usable(sync, "TPOT p50 one request at a time", "ms")
    lowest = ref / (1 + checks.LOAD_BAND_CAP[checks.smoke()])
    checks.say(f"  the engine's own TPOT p50, one request at a time: grader {ref:.4g} ms, your operating run's "
               f"{yours:.4g} ms (at least {lowest:.4g} ms)")
    if yours < lowest:
        raise AssertionError(f"operating's TPOT p50 = {yours:.4g} ms, but the grader re-measured {ref:.4g} ms for one "
                             f"request at a time in this run; at least {lowest:.4g} ms accepted: faster than the engine")
    return ref


def _overloaded(workload, operating, g: list[float], e: list[float]) -> None:
    """The grader's runs at the operating rate did not keep up (a run with no request in time, or
    none finished): the engine was slower than when the learner measured, and queued. Its latency
    and goodput then say nothing about the learner's, so :class:`checks.Unusable`; but first the
    learner's TPOT is checked (:func:`_not_faster_than_the_engine`)."""
    _not_faster_than_the_engine(workload, operating)
    raise checks.Unusable(f"the grader's own runs at your operating rate did not keep up (goodput "
                          f"{', '.join(f'{x:.4g}' for x in g)} req/s, p95 {', '.join(f'{x:.4g}' for x in e)} ms): "
                          "the engine queued, so their goodput and p95 cannot be compared with yours")


def _you_queued(workload, operating) -> None:
    """The learner's own run at the operating rate had no request within every SLO. Graded live,
    that run was measured in this very execution, on the grading machine: a goodput of 0 is that
    machine's load at that moment (the engine queued), never a wrong answer, and a made-up zero
    gains nothing. So nothing is compared but the run's TPOT (:func:`_not_faster_than_the_engine`),
    and the feedback says what the zero means."""
    if records.run_stat(operating, "tpot", "p50") is not None:  # None: not one request finished, nothing to time
        _not_faster_than_the_engine(workload, operating)
    slo = (operating.get("goodput") or {}).get("slo_ms") or {}
    p95 = {k: (operating.get(f"{k}_ms") or {}).get("p95") for k in slo}
    missed = ", ".join(f"{k.upper()} p95 {p95[k]:.4g} ms against {slo[k]:.4g} ms" for k in slo
                       if p95.get(k) is not None and p95[k] > slo[k])
    checks.say(f"  no request of your operating run met every SLO ({missed or 'none finished'}): the engine queued "
               "while it ran, so the machine was busier than during your sweep. Not compared, so not counted against "
               "you; on a quieter machine, run the sweep and the operating run again for a rate that holds")


def check_goodput(server, workload, operating_rate, operating, goodput_rps, p95_e2el_ms) -> None:
    """The learner's goodput and p95 E2E latency at OPERATING_RATE follow from their run, and
    agree with the grader's own runs of the same load against the same engine."""
    mode = _begin("goodput and p95 E2E latency at your operating rate")
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    if mode == checks.RECORD:
        return records.goodput_from_record()
    untampered()
    _engine_ok(server)
    desc = records.workload_desc(workload)
    if (desc["base_url"], desc["model"]) != (server.base_url, server.model):
        raise AssertionError(f"WORKLOAD points at {desc['base_url']} ({desc['model']}), not at the engine the notebook "
                             f"started ({server.base_url}): start from server.workload_fields()")
    records.operating_run_ok(operating, desc, operating_rate)
    checks.assert_close(goodput_rps, operating["goodput"]["request_goodput"], "goodput_rps (operating['goodput'])", rel=1e-9)
    if operating["e2el_ms"]["p95"] is None:  # not one request finished
        if p95_e2el_ms is not None:
            raise AssertionError(f"p95_e2el_ms = {p95_e2el_ms!r:.40}, but no request of operating finished "
                                 "(its e2el_ms p95 is None): take operating['e2el_ms']['p95']")
        return _you_queued(workload, operating)
    checks.assert_close(p95_e2el_ms, operating["e2el_ms"]["p95"], "p95_e2el_ms (operating['e2el_ms']['p95'])", rel=1e-9)
    if goodput_rps == 0:
        return _you_queued(workload, operating)
    goodput = checks.assert_positive(goodput_rps, "goodput_rps")
    p95 = checks.assert_positive(p95_e2el_ms, "p95_e2el_ms")

    def compare():
        mine = measure_operating(workload, operating_rate)
        g = [(r.get("goodput") or {}).get("request_goodput") or 0.0 for r in mine]
        e = [r["e2el_ms"]["p95"] or math.nan for r in mine]
        checks.say(f"  goodput: grader runs {', '.join(f'{x:.4g}' for x in g)} req/s; p95 E2E latency: grader runs "
                   f"{', '.join(f'{x:.4g}' for x in e)} ms")
        if not all(x > 0 for x in g) or not all(math.isfinite(x) and x > 0 for x in e):
            _overloaded(workload, operating, g, e)
        e_ref = checks.mine(_Spread(e))
        rel_e = checks.band(e_ref)
        checks.say_versus("p95 E2E latency", e_ref.median_ms, p95, "ms", rel_e)
        checks.assert_in_band(p95, e_ref.median_ms, rel_e, "p95_e2el_ms", "ms")  # first: a made-up fast run fails here
        g_ref = checks.mine(_Spread(g))
        rel_g = checks.band(g_ref)
        checks.say_versus("goodput", g_ref.median_ms, goodput, "req/s", rel_g)
        checks.assert_in_band(goodput, g_ref.median_ms, rel_g, "goodput_rps", "req/s")

    remeasure.agree(compare, ATTEMPTS)


# -- 5. the engine choice ------------------------------------------------------------------------

def check_choice(choice, candidates, operating_rate, workload) -> None:
    """CHOICE is the configuration the rule picks from the measured candidates, with their numbers."""
    mode = _begin("the configuration you chose from the measured candidates", remeasured=False)
    checks.assert_constants_unchanged(CONSTANT_MODULES)
    if mode == checks.RECORD:
        return records.choice_from_record()
    untampered()
    desc = records.workload_desc(workload)
    if not isinstance(candidates, dict) or not candidates:
        raise AssertionError("candidates must map each configuration's name to its loadgen result")
    for name, run in candidates.items():
        records.operating_run_ok(run, desc, operating_rate, what=f"candidates[{name!r}]", same_server=False)
    records.choice_ok(choice, {n: records.candidate_row(r) for n, r in candidates.items()})


# -- 6. production: scraping, manifests ---------------------------------------------------------

def _expected_scrape(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _canon(scraped: Any, where: str) -> dict:
    if not isinstance(scraped, dict):
        raise AssertionError(f"scrape must return a dict of sample name -> [(labels, value), ...], got {type(scraped).__name__}")
    out = {}
    for name, samples in scraped.items():
        try:
            out[name] = sorted((tuple(sorted(dict(lab).items())), float(v)) for lab, v in samples)
        except (TypeError, ValueError):
            raise AssertionError(f"scrape(...)[{name!r}] must be a list of (labels dict, value) pairs ({where})") from None
    return out


def check_scrape(scrape) -> None:
    """The learner's scrape of a /metrics endpoint served here (utils.exporter's server, a
    registry with labelled gauges and a counter) equals prometheus_client's parse of it."""
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from utils.dcgm_metrics import render
    from utils.exporter import MetricsServer

    reg = CollectorRegistry()
    fb = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", ["gpu", "UUID", "modelName"], registry=reg)
    util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", ["gpu", "UUID", "modelName"], registry=reg)
    for i, (used, u) in enumerate(((40321.0, 97.0), (1185.5, 0.0))):
        lab = {"gpu": str(i), "UUID": f"GPU-{i:08x}-test", "modelName": "NVIDIA H200"}
        fb.labels(**lab).set(used)
        util.labels(**lab).set(u)
    Counter("gpulab_exporter_nvml_errors", "Failed NVML calls.", ["call"], registry=reg).labels(call="nvmlDeviceGetPowerUsage").inc(3)
    srv = MetricsServer("127.0.0.1", 0, reg)
    try:
        got = _canon(checks.call(scrape, srv.url, name="scrape", show_args=False), "the grader's endpoint")
    finally:
        srv.close()
    want = _canon(_expected_scrape(render(reg).decode()), "expected")
    if got != want:
        missing = sorted(set(want) - set(got))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        extra = sorted(set(got) - set(want))
        raise AssertionError(f"scrape of the grader's endpoint differs from its parse: missing {missing[:4]}, "
                             f"different values or labels {wrong[:4]}, unexpected {extra[:4]}")


def reference_gpu_limits(docs: list) -> dict:
    """``{"Kind/name/container": {resource: count}}`` for every container (init containers
    too) whose ``resources.limits`` name an ``nvidia.com/`` resource."""
    out = {}
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in POD_SPEC:
            continue
        spec = doc
        for key in POD_SPEC[doc["kind"]]:
            spec = (spec or {}).get(key) or {}
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            limits = ((c.get("resources") or {}).get("limits") or {})
            gpus = {k: int(v) for k, v in limits.items() if str(k).startswith("nvidia.com/")}
            if gpus:
                out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = gpus
    return out


def made_up_manifests() -> list[dict]:
    """Workloads in each shape the rule covers, with MIG resources, string counts, init
    containers, requests without limits (not a GPU: extended resources go in limits)."""
    def pod(containers, init=None):
        spec = {"containers": containers}
        if init:
            spec["initContainers"] = init
        return spec

    def c(name, limits=None, requests=None):
        res = {}
        if limits is not None:
            res["limits"] = limits
        if requests is not None:
            res["requests"] = requests
        return {"name": name, "image": "x", "resources": res}

    return [
        {"kind": "Pod", "metadata": {"name": "p"}, "spec": pod([c("a", {"nvidia.com/gpu": "2", "cpu": "4"}), c("b")])},
        {"kind": "StatefulSet", "metadata": {"name": "s"},
         "spec": {"template": {"spec": pod([c("w", {"nvidia.com/mig-1g.10gb": 1})], [c("prep", {"nvidia.com/gpu": 1})])}}},
        {"kind": "CronJob", "metadata": {"name": "nightly"},
         "spec": {"jobTemplate": {"spec": {"template": {"spec": pod([c("eval", {"nvidia.com/gpu": 1, "memory": "8Gi"})])}}}}},
        {"kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": pod([c("r", None, {"nvidia.com/gpu": 1})])}}},
        {"kind": "Deployment", "metadata": {"name": "cpu-only"}, "spec": {"template": {"spec": pod([c("web", {"cpu": "1"})])}}},
        {"kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}},
        {"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"nvidia.com/gpu": "1"}},
    ]


def check_gpu_limits(gpu_limits, docs) -> None:
    """Exact against the reference on the course's manifests and on made-up ones."""
    for where, d in (("the course's manifests (DOCS)", docs), ("made-up manifests", made_up_manifests())):
        got = checks.call(gpu_limits, d, name="gpu_limits", show_args=False)
        want = reference_gpu_limits(d)
        if got != want:
            raise AssertionError(f"gpu_limits on {where} = {got!r:.300}, expected {want!r:.300}")
