"""Production: a Prometheus exporter under dcgm-exporter's names, Kubernetes manifests and Dockerfiles checked.

- ``exporter``: A Prometheus exporter of NVML metrics under dcgm-exporter's names, units and labels.
- ``nvml_collector``: the exporter's collector: NVML read in a background thread into the metrics of
  ``utils/production/dcgm_metrics.py``.
- ``dcgm_metrics``: the metrics the exporter serves: dcgm-exporter's names, types, units and labels, and the page.
- ``k8s_gpu``: kubernetes manifests that use NVIDIA GPUs, checked: a pod that asks for GPUs the way Kubernetes and
  NVIDIA's device plugin expect, and the device plugin's time-slicing config.
- ``dockerfile``: A Dockerfile read instruction by instruction, each with what it does: lab 04 prints
  ``deploy/Dockerfile`` this way, so that the explanation follows the file when the file changes.
"""
