"""The exporter's collector: NVML read in a background thread into the metrics of ``utils/production/dcgm_metrics.py``.

Design. NVML is read by a background thread every ``interval_s`` into a snapshot that
``collect()`` serves, rather than at scrape time, because (1) GPM tensor activity and XID
events are differences over time and need state kept between reads anyway; (2) a scrape
then never waits on the driver: a hung NVML call (a known failure of a GPU that fell off
the bus) leaves the thread stuck, and the scrape still answers, reporting
``gpulab_exporter_nvml_up 0`` and dropping stale values after ``stale_after_s``; (3) two
Prometheus replicas scraping do not double the NVML load. dcgm-exporter works the same way
(its ``--collect-interval``). The cost is values up to one interval old; NVML itself only
refreshes every 1/6 to 1 s (docs/reference.md), so 1 s loses little.

Self-metrics: ``gpulab_exporter_nvml_up`` (1: NVML answered the last refresh, in time),
``gpulab_exporter_nvml_errors_total{call,error}`` (failed NVML calls, by function and NVML
error name, :func:`utils.device.nvml.error_name`), ``gpulab_exporter_gpus`` (GPUs that answered at
least one query in the last fresh refresh) and ``gpulab_exporter_sample_age_seconds``. A
failed query leaves its metric out (never 0, never NaN) and is logged once per call and
error, on one line, with the GPU it happened on. What an SRE reads from the errors:

- ``NVML_ERROR_NOT_SUPPORTED``: the board lacks the field (power on some GeForce cards,
  energy before Volta, utilization of a MIG-enabled GPU, whose instances this exporter does
  not split). It counts on every refresh; alert on
  ``increase(gpulab_exporter_nvml_errors_total{error!="NVML_ERROR_NOT_SUPPORTED"}[10m]) > 0``.
- ``NVML_ERROR_GPU_IS_LOST``: the GPU fell off the bus (Xid 79); every metric of that GPU
  disappears (its last XID stays) and ``gpulab_exporter_gpus`` drops. It does not come back
  by itself: users report needing a reboot (NVIDIA/open-gpu-kernel-modules #507, #1151).
- ``NVML_ERROR_NO_PERMISSION``: a container without the device files, or GPM/events that
  need root.
- ``nvmlInit`` errors (``NVML_ERROR_DRIVER_NOT_LOADED``, ``..._LIB_RM_VERSION_MISMATCH``,
  ``..._LIBRARY_NOT_FOUND``): NVML never came up; the exporter serves only its own metrics,
  says why once on stderr, and tries ``nvmlInit`` again every ``INIT_RETRY_S``, so a
  DaemonSet pod that started before the driver had loaded recovers without a restart.
  A failing ``nvmlDeviceGetCount`` (``NVML_ERROR_UNINITIALIZED``, ...) re-initialises at the
  next refresh the same way.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from utils.device import nvml
from utils.device.nvml import NA
from utils.production.dcgm_metrics import (
    DCGM_METRICS,
    ENERGY,
    FB_FREE,
    FB_USED,
    GPU_TEMP,
    GPU_UTIL,
    LABELS,
    MEM_CLOCK,
    MEM_COPY_UTIL,
    POWER,
    SM_CLOCK,
    TENSOR_ACTIVE,
    XID,
    kubernetes_labels,
)

MIB = 2**20
INIT_RETRY_S = 30.0  # seconds between nvmlInit attempts while NVML is unavailable
NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _is_timeout(lib: Any, exc: BaseException) -> bool:
    timeout_cls = getattr(lib, "NVMLError_Timeout", None)
    if isinstance(timeout_cls, type) and isinstance(exc, timeout_cls):
        return True
    return getattr(exc, "value", None) == getattr(lib, "NVML_ERROR_TIMEOUT", 10)


class NvmlExporter(Collector):
    """A prometheus_client collector of NVML metrics (nvitop's
    ``PrometheusExporter(devices, *, registry=REGISTRY, interval=1.0)`` pattern).

    ``devices``: NVML indices to export (None: all). ``registry``: where to register (None:
    nowhere; tests pass a fresh ``CollectorRegistry``). ``start()`` runs the sampling thread;
    ``refresh()`` takes one sample now (the thread calls it; so can tests). ``clock`` and
    ``log`` come in as parameters so tests control time and capture messages."""

    def __init__(self, devices: Sequence[int] | None = None, *, registry: CollectorRegistry | None = REGISTRY,
                 interval_s: float = 1.0, hostname: str | None = None,
                 k8s_labels: dict[str, str] | None = None, stale_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = _stderr):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.devices = None if devices is None else list(devices)
        self.interval_s = float(interval_s)
        self.stale_after_s = float(stale_after_s) if stale_after_s is not None else max(5 * self.interval_s, 5.0)
        self.hostname = hostname or os.environ.get("NODE_NAME") or socket.gethostname()
        self.k8s_labels = kubernetes_labels() if k8s_labels is None else dict(k8s_labels)
        self._clock, self._log = clock, log
        self._lock = threading.Lock()
        self._errors: dict[tuple[str, str], int] = {}  # (call, NVML error name) -> failures
        self._logged: set = set()
        self._last_error = ""  # NVML error name of the last failed _call
        self._gpu: int | None = None  # the GPU being read, for log lines
        self._snapshot: list[tuple[dict[str, str], dict[str, float]]] = []
        self._answered = 0  # GPUs that answered at least one query in the last refresh
        self._sampled_at: float | None = None
        self._init_tried_at: float | None = None  # last nvmlInit attempt that failed
        self._reinit = False  # NVML failed after init: drop per-device state once it answers
        self._up = False
        self._static: dict[int, dict[str, str]] = {}
        self._gpm: dict[int, dict[str, Any]] = {}
        self._xid: dict[int, int] = {}
        self._event_set: Any = None
        self._events_tried = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if registry is not None:
            registry.register(self)

    # -- NVML calls, counted ------------------------------------------------------------
    def _count(self, call: str, why: str, error: str = "") -> None:
        error = error or "unknown"
        with self._lock:
            self._errors[(call, error)] = self._errors.get((call, error), 0) + 1
        if (call, error) not in self._logged:
            self._logged.add((call, error))
            where = "" if self._gpu is None else f" (first on GPU {self._gpu})"
            self._log(f"exporter: {call} failed ({why}){where}; what it reads is left out (counted in "
                      f'gpulab_exporter_nvml_errors_total{{call="{call}",error="{error}"}})')

    def _call(self, call: str, fn: Callable[[Any], Any], *, count: bool = True, timeout_ok: bool = False) -> Any:
        """``fn(lib)`` through :func:`utils.device.nvml.query`; a failure returns NA and is counted
        under ``call``. A timeout returns None when ``timeout_ok`` (event polling)."""
        failure: list[BaseException] = []

        def run(lib: Any) -> Any:
            try:
                return fn(lib)
            except Exception as exc:  # pynvml.NVMLError and anything a broken driver throws
                if timeout_ok and _is_timeout(lib, exc):
                    return None
                failure.append(exc)
                return NA

        value = nvml.query(run)
        if value is NA:
            self._last_error = nvml.error_name(failure[0]) if failure else (nvml.last_error() or "unknown")
            if count:
                self._count(call, nvml.short_error(failure[0]) if failure else "NVML unavailable", self._last_error)
        return value

    def _get(self, name: str, *args: Any, count: bool = True) -> Any:
        return self._call(name, lambda lib: getattr(lib, name)(*args), count=count)

    # -- sampling -----------------------------------------------------------------------
    def _static_labels(self, index: int, h: Any) -> dict[str, str]:
        if index in self._static:
            return self._static[index]
        failed: list[str] = []

        def get(call: str) -> Any:
            value = self._get(call, h)
            if value is NA:
                failed.append(self._last_error)
            return value

        uuid, name = get("nvmlDeviceGetUUID"), get("nvmlDeviceGetName")
        pci, minor = get("nvmlDeviceGetPciInfo"), get("nvmlDeviceGetMinorNumber")
        labels = {
            "gpu": str(index),
            "UUID": "" if uuid is NA else _text(uuid),
            "pci_bus_id": "" if pci is NA else _text(getattr(pci, "busId", "")),
            "device": "" if minor is NA else f"nvidia{minor}",
            "modelName": "" if name is NA else _text(name),
            "Hostname": self.hostname,
            **self.k8s_labels,
        }
        # Keep them once known; a call the board does not support will not answer later either
        # (nvmlDeviceGetMinorNumber is Linux-only), so asking every refresh only adds errors.
        if uuid is not NA and name is not NA and all(e == NOT_SUPPORTED for e in failed):
            self._static[index] = labels
        return labels

    def _setup_events(self, handles: dict[int, Any]) -> None:
        """Register every GPU for critical-XID events, once; a GPU that refuses has no XID metric."""
        self._events_tried = True
        es = self._get("nvmlEventSetCreate")
        if es is NA:
            return
        self._event_set = es
        xid_type = nvml.constant("nvmlEventTypeXidCriticalError", 0x8)
        for index, h in handles.items():
            if self._get("nvmlDeviceRegisterEvents", h, xid_type, es) is not NA:
                self._xid[index] = 0

    def _drain_events(self) -> None:
        xid_type = nvml.constant("nvmlEventTypeXidCriticalError", 0x8)
        es = self._event_set
        for _ in range(256):  # bounded: a storm of events cannot stall the refresh
            data = self._call("nvmlEventSetWait", lambda lib: lib.nvmlEventSetWait(es, 0), timeout_ok=True)
            if data is None or data is NA:
                return
            if not int(getattr(data, "eventType", 0)) & int(xid_type):
                continue
            index = self._get("nvmlDeviceGetIndex", data.device)
            if index is not NA and index in self._xid:
                self._xid[index] = int(data.eventData)

    def _tensor_active(self, index: int, h: Any) -> float | None:
        """GPM ANY_TENSOR_UTIL between the previous and this refresh, as a ratio; None when
        GPM is unsupported (checked once) or this is the first sample."""
        state = self._gpm.get(index)
        if state is None:
            support = self._get("nvmlGpmQueryDeviceSupport", h, count=False)
            ok = support is not NA and bool(getattr(support, "isSupportedDevice", 0))
            samples = [self._get("nvmlGpmSampleAlloc") for _ in range(2)] if ok else []
            ok = ok and NA not in samples
            state = self._gpm[index] = {"ok": ok, "samples": samples, "turn": 0, "have_prev": False}
        if not state["ok"]:
            return None
        cur = state["samples"][state["turn"]]
        prev = state["samples"][1 - state["turn"]]
        if self._get("nvmlGpmSampleGet", h, cur) is NA:
            state["ok"] = False  # e.g. MIG mode, where GPM wants per-instance samples
            return None
        state["turn"] = 1 - state["turn"]
        if not state["have_prev"]:
            state["have_prev"] = True
            return None

        def metrics_get(lib: Any) -> float:
            mg = lib.c_nvmlGpmMetricsGet_t()
            mg.version = lib.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = prev, cur
            mg.metrics[0].metricId = lib.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            lib.nvmlGpmMetricsGet(mg)
            if mg.metrics[0].nvmlReturn != 0:
                raise RuntimeError(f"GPM metric returned NVML status {mg.metrics[0].nvmlReturn}")
            return float(mg.metrics[0].value)

        pct = self._call("nvmlGpmMetricsGet", metrics_get)
        return None if pct is NA else pct / 100.0

    def _sample_gpu(self, index: int, h: Any) -> tuple[dict[str, str], dict[str, float], bool]:
        self._gpu = index
        values: dict[str, float] = {}
        util = self._get("nvmlDeviceGetUtilizationRates", h)
        if util is not NA:
            values[GPU_UTIL.name], values[MEM_COPY_UTIL.name] = float(util.gpu), float(util.memory)
        mem = self._get("nvmlDeviceGetMemoryInfo", h)
        if mem is not NA:
            values[FB_USED.name], values[FB_FREE.name] = float(mem.used // MIB), float(mem.free // MIB)
        power_mw = self._get("nvmlDeviceGetPowerUsage", h)
        if power_mw is not NA:
            values[POWER.name] = power_mw / 1000.0
        energy_mj = self._get("nvmlDeviceGetTotalEnergyConsumption", h)
        if energy_mj is not NA:
            values[ENERGY.name] = float(energy_mj)
        temp = self._get("nvmlDeviceGetTemperature", h, nvml.constant("NVML_TEMPERATURE_GPU", 0))
        if temp is not NA:
            values[GPU_TEMP.name] = float(temp)
        for spec, clock in ((SM_CLOCK, "NVML_CLOCK_SM"), (MEM_CLOCK, "NVML_CLOCK_MEM")):
            mhz = self._get("nvmlDeviceGetClockInfo", h, nvml.constant(clock, 1 if clock.endswith("SM") else 2))
            if mhz is not NA:
                values[spec.name] = float(mhz)
        tensor = self._tensor_active(index, h)
        if tensor is not None:
            values[TENSOR_ACTIVE.name] = tensor
        answered = bool(values)
        if index in self._xid:  # kept for a lost GPU too: its last XID (79) is the news
            values[XID.name] = float(self._xid[index])
        labels = self._static_labels(index, h)
        self._gpu = None
        return labels, values, answered

    def _nvml_status(self) -> nvml.NvmlStatus:
        """``nvml.status()``, with ``nvmlInit`` tried again every ``INIT_RETRY_S`` while it
        fails (the driver may load after the exporter started) and after NVML failed mid-run."""
        now = self._clock()
        if self._init_tried_at is not None and now - self._init_tried_at >= INIT_RETRY_S:
            nvml.reset()
        elif self._reinit and self._init_tried_at is None:
            nvml.reset()
        st = nvml.status()
        if st.available:
            if self._reinit or self._init_tried_at is not None:
                self._forget_devices()  # NVML initialised anew: handles, GPM samples, events are stale
            self._init_tried_at, self._reinit = None, False
            return st
        if self._init_tried_at is None or now - self._init_tried_at >= INIT_RETRY_S:
            self._init_tried_at = now
            with self._lock:
                key = ("nvmlInit", st.error or "unknown")
                self._errors[key] = self._errors.get(key, 0) + 1
            if ("nvmlInit", st.reason) not in self._logged:
                self._logged.add(("nvmlInit", st.reason))
                self._log(f"exporter: NVML unavailable ({st.reason}); serving only gpulab_exporter_* "
                          f"metrics, trying again every {INIT_RETRY_S:g} s")
        return st

    def _forget_devices(self) -> None:
        """Drop what belonged to the previous NVML initialisation (its objects are not freed:
        the library state that owned them may be gone)."""
        self._static.clear()
        self._gpm.clear()
        self._xid.clear()
        self._event_set, self._events_tried = None, False

    def refresh(self) -> None:
        """Read every GPU once and swap the snapshot that scrapes see."""
        self._gpu = None
        st = self._nvml_status()
        if not st.available:
            with self._lock:
                self._snapshot, self._answered, self._up, self._sampled_at = [], 0, False, self._clock()
            return
        count = self._get("nvmlDeviceGetCount")
        if count is NA:
            self._reinit = True  # NVML_ERROR_UNINITIALIZED and friends: nvmlInit again next time
            with self._lock:
                self._snapshot, self._answered, self._up, self._sampled_at = [], 0, False, self._clock()
            return
        indices = [i for i in (self.devices if self.devices is not None else range(count))]
        handles = {}
        for i in indices:
            self._gpu = i
            h = self._get("nvmlDeviceGetHandleByIndex", i)
            if h is not NA:
                handles[i] = h
        self._gpu = None
        for gone in set(self._static) - set(handles):  # an index that vanished: its labels may not return
            del self._static[gone]
        if not self._events_tried:
            self._setup_events(handles)
        if self._event_set is not None:
            self._drain_events()
        read = [self._sample_gpu(i, h) for i, h in handles.items()]
        with self._lock:
            self._snapshot = [(labels, values) for labels, values, _ in read]
            self._answered = sum(answered for _, _, answered in read)
            self._up, self._sampled_at = True, self._clock()

    # -- thread -------------------------------------------------------------------------
    def start(self) -> NvmlExporter:
        """Sample now and then every ``interval_s`` in a daemon thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="nvml-exporter", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception as exc:  # never let one bad refresh end the thread
                self._count("refresh", nvml.short_error(exc))
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread and free NVML resources it holds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            stuck = self._thread.is_alive()
            self._thread = None
            if stuck:  # inside a hung NVML call: freeing would hang this thread on the same driver
                self._log(f"exporter: the NVML thread is stuck in a call (a hung driver?); "
                          f"stopped without waiting past {timeout_s:g} s")
                return
        for state in self._gpm.values():
            for sample in state["samples"]:
                if sample is not NA:
                    self._get("nvmlGpmSampleFree", sample, count=False)
        self._gpm.clear()
        if self._event_set is not None:
            self._get("nvmlEventSetFree", self._event_set, count=False)
            self._event_set, self._events_tried = None, False

    # -- prometheus_client Collector ----------------------------------------------------
    def _families(self) -> dict[str, Metric]:
        names = LABELS + tuple(self.k8s_labels)
        fams: dict[str, Metric] = {}
        for spec in DCGM_METRICS:
            if spec.kind == "counter":
                # Samples <name>_total, valid OpenMetrics; render() serves dcgm-exporter's bare name.
                fams[spec.name] = CounterMetricFamily(spec.name, spec.help, labels=names)
            else:
                fams[spec.name] = GaugeMetricFamily(spec.name, spec.help, labels=names)
        return fams

    def describe(self) -> Iterable[Metric]:
        yield from self._families().values()
        yield GaugeMetricFamily("gpulab_exporter_nvml_up", "")
        yield CounterMetricFamily("gpulab_exporter_nvml_errors", "", labels=["call", "error"])
        yield GaugeMetricFamily("gpulab_exporter_gpus", "")
        yield GaugeMetricFamily("gpulab_exporter_sample_age_seconds", "")

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            snapshot, up, sampled_at, errors = self._snapshot, self._up, self._sampled_at, dict(self._errors)
            answered = self._answered
        age = None if sampled_at is None else max(0.0, self._clock() - sampled_at)
        fresh = age is not None and age <= self.stale_after_s
        fams = self._families()
        if fresh:
            for labels, values in snapshot:
                for name, value in values.items():
                    fams[name].add_metric([labels[k] for k in LABELS + tuple(self.k8s_labels)], value)
        yield from fams.values()
        yield GaugeMetricFamily("gpulab_exporter_nvml_up",
                                "1 if NVML answered the last refresh and it is not older than the staleness limit.",
                                value=1.0 if (up and fresh) else 0.0)
        err = CounterMetricFamily("gpulab_exporter_nvml_errors",
                                  "Failed NVML calls, by NVML function and NVML error name (NVML_ERROR_NOT_SUPPORTED: "
                                  "the board lacks the field; NVML_ERROR_GPU_IS_LOST: off the bus, Xid 79).",
                                  labels=["call", "error"])
        for (call, error), n in sorted(errors.items()):
            err.add_metric([call, error], float(n))
        yield err
        yield GaugeMetricFamily("gpulab_exporter_gpus",
                                "GPUs that answered at least one NVML query in the last fresh refresh.",
                                value=float(answered if fresh else 0))
        if age is not None:
            yield GaugeMetricFamily("gpulab_exporter_sample_age_seconds",
                                    "Seconds since the last completed NVML refresh.", value=age)
