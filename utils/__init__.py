"""utils: the GPU Utilization Roadmap's measurement package.

Imported from the repository root (``import utils``). One concept per module:
``hardware`` (spec table, fingerprint), ``nvml`` (the NVML wrapper and ``GpuMonitor``),
``timing`` (GPU-correct benchmarking), ``memory`` (peak memory, training-memory
estimates), ``flops`` (FLOPs per token, MFU, roofline), ``record`` (the measurement
record), ``env`` (platform, smoke mode, sizes), ``models`` (configs, offline models and
text), ``plots`` (figures). Modules import torch lazily where they can, so the pure
maths works without it.
"""

__version__ = "0.1.0"
