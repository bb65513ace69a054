"""Measuring GPU work right: timing, FLOPs and MFU, the matmul ceiling, peak memory, a step's memory traffic, and the
record of where a number came from.

- ``timing``: correct timing of GPU work: warm-up, CUDA events, synchronisation, L2 flush, repeats.
- ``flops``: FLOPs per token, MFU and the roofline: numbers in, numbers out.
- ``matmul_ceiling``: the matmul throughput this device reaches, measured now: the ceiling a training loop's MFU is
  also read against.
- ``matmul_sweep``: tile and wave quantization of a matmul, and the shapes lab 00 sweeps to see them.
- ``memory``: peak-memory measurement, and estimates of what training needs (weights, gradients, optimizer state,
  activations) by dtype.
- ``step_traffic``: the bytes a training step's operations read and write: the step's memory traffic, counted.
- ``record``: the measurement record: where numbers came from, written beside the notebook.
"""
