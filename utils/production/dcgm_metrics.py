"""The metrics the exporter serves: dcgm-exporter's names, types, units and labels, and the page.

Names, types and units follow dcgm-exporter's ``etc/default-counters.csv`` (NVIDIA/
dcgm-exporter; ``DCGM FIELD, Prometheus metric type, help``): every metric here is a
gauge except ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, a counter in mJ. The tensor metric
is from ``etc/dcp-metrics-included.csv`` (a gauge, a ratio 0..1). Labels are dcgm-
exporter's (``internal/pkg/rendermetrics/render_metrics.go``): ``gpu`` (NVML index),
``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``), ``modelName``, ``Hostname``
(``$NODE_NAME`` as its Helm chart sets it, else the host name), and ``container``,
``namespace``, ``pod`` when ``$CONTAINER_NAME``, ``$POD_NAMESPACE`` or ``$POD_NAME`` is
set (the exporter as a sidecar of the pod that holds the GPU; dcgm-exporter finds them
through the kubelet's pod-resources socket instead).

Where NVML differs from DCGM:

- ``DCGM_FI_DEV_FB_USED`` is NVML's ``memory.used`` (v1 memory info: reserved memory
  counts as used); DCGM reports reserved memory in a separate field.
- ``DCGM_FI_DEV_XID_ERRORS`` is the last XID seen through NVML's critical-XID events since
  the exporter started (0 until one arrives); absent where events cannot be registered.
- ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` comes from NVML GPM's
  ``NVML_GPM_METRIC_ANY_TENSOR_UTIL`` / 100 over one sampling interval: Hopper and newer
  only, whole GPUs only (not MIG), and similar to DCGM's HMMA-pipe ratio, not the same
  counter. Absent elsewhere (T4, A100, L4, ...).

Names. The ``DCGM_FI_*`` names break Prometheus' naming conventions (prometheus.io, "Metric
and label naming": base units, a unit suffix, ratios 0..1, ``_total`` on counters,
snake_case labels; ``promtool check metrics`` flags the camelCase labels and the counter
without ``_total``) on purpose: they are dcgm-exporter's, and Grafana dashboard 12239,
``deploy/grafana/dashboard.json``, the phase 4 notebook and PromQL written for DCGM read
them. They are kept. For a dashboard author, the quantities and their conversions:

| metric (as in dcgm-exporter)         | NVML call                                   | unit | in base units     |
|--------------------------------------|---------------------------------------------|------|-------------------|
| DCGM_FI_DEV_GPU_UTIL                 | nvmlDeviceGetUtilizationRates().gpu         | %    | ratio: ``/ 100``  |
| DCGM_FI_DEV_MEM_COPY_UTIL            | nvmlDeviceGetUtilizationRates().memory      | %    | ratio: ``/ 100``  |
| DCGM_FI_DEV_FB_USED, _FB_FREE        | nvmlDeviceGetMemoryInfo().used, .free       | MiB  | B: ``* 1048576``  |
| DCGM_FI_DEV_POWER_USAGE              | nvmlDeviceGetPowerUsage() (mW) / 1000       | W    | watts already     |
| DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION | nvmlDeviceGetTotalEnergyConsumption()       | mJ   | J: ``/ 1000`` (1) |
| DCGM_FI_DEV_GPU_TEMP                 | nvmlDeviceGetTemperature(TEMPERATURE_GPU)   | C    | celsius already   |
| DCGM_FI_DEV_SM_CLOCK, _MEM_CLOCK     | nvmlDeviceGetClockInfo(CLOCK_SM, CLOCK_MEM) | MHz  | Hz: ``* 1e6``     |
| DCGM_FI_DEV_XID_ERRORS               | nvmlEventSetWait, critical XID events       | code | the last XID      |
| DCGM_FI_PROF_PIPE_TENSOR_ACTIVE      | nvmlGpmMetricsGet ANY_TENSOR_UTIL / 100     | 0..1 | a ratio already   |

(1) Average power over a window in W: ``rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]) / 1000``.

Exposition. prometheus_client writes a counter as ``<name>_total``; dcgm-exporter's energy
counter has no ``_total``, so :func:`render` (what ``/metrics`` serves, text format 0.0.4)
renames that one counter's header and samples to the bare name (the 0.0.4 text format
allows counters without the suffix). Served any other way (``prometheus_client``'s own
``start_http_server``/``make_wsgi_app`` over a registry holding this collector) the counter
keeps ``_total``, as OpenMetrics requires: the page then stays valid in both formats, at the
cost of dcgm-exporter's exact name. Note that the default ``registry`` is prometheus_client's
global one; pass your own to keep these metrics out of an application's page.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the format dcgm-exporter serves


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str  # "gauge" or "counter", as in dcgm-exporter's CSV
    help: str


GPU_UTIL = MetricSpec("DCGM_FI_DEV_GPU_UTIL", "gauge",
                      "GPU utilization (in %): share of NVML's last sample period with a kernel running.")
MEM_COPY_UTIL = MetricSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge",
                           "Memory utilization (in %): share of the sample period with device memory read or written.")
FB_USED = MetricSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).")
FB_FREE = MetricSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).")
POWER = MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).")
ENERGY = MetricSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
                    "Total energy consumption since the driver loaded (in mJ).")
GPU_TEMP = MetricSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).")
SM_CLOCK = MetricSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).")
MEM_CLOCK = MetricSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).")
XID = MetricSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error seen since the exporter started.")
TENSOR_ACTIVE = MetricSpec("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
                           "Ratio of time the SMs ran tensor-core work (NVML GPM ANY_TENSOR_UTIL / 100; Hopper+).")
DCGM_METRICS = (GPU_UTIL, MEM_COPY_UTIL, FB_USED, FB_FREE, POWER, ENERGY, GPU_TEMP, SM_CLOCK,
                MEM_CLOCK, XID, TENSOR_ACTIVE)

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
K8S_ENV = {"container": "CONTAINER_NAME", "namespace": "POD_NAMESPACE", "pod": "POD_NAME"}



def kubernetes_labels(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``container``/``namespace``/``pod`` from the environment (downward API), or {} unless
    ``$POD_NAME`` or ``$POD_NAMESPACE`` is set. When given, all three are, empty where unset,
    as dcgm-exporter does. ``$CONTAINER_NAME`` alone is not enough: hosts outside Kubernetes
    set it too (a per-instance name, which would add a new series at every restart)."""
    environ = os.environ if environ is None else environ
    found = {label: environ.get(var, "") for label, var in K8S_ENV.items()}
    return found if found["pod"] or found["namespace"] else {}



def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The registry in Prometheus text format 0.0.4, with dcgm-exporter's bare counter
    names (prometheus_client writes ``<name>_total``) in the header and sample lines."""
    text = generate_latest(registry).decode()
    for spec in DCGM_METRICS:
        if spec.kind == "counter":
            text = text.replace(f"# HELP {spec.name}_total ", f"# HELP {spec.name} ")
            text = text.replace(f"# TYPE {spec.name}_total counter\n", f"# TYPE {spec.name} counter\n")
            text = text.replace(f"\n{spec.name}_total{{", f"\n{spec.name}{{")
    return text.encode()
