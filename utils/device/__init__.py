"""The device: what card this is, NVML read once or sampled, memory in use, how GPUs are wired, a smaller card's limits
rehearsed on a bigger one.

- ``hardware``: GPU spec table, device detection and a fingerprint of the machine a number came from.
- ``nvml``: the one wrapper around NVML (``nvidia-ml-py``, imported as ``pynvml``).
- ``monitor``: ``GpuMonitor``: a background sampler of every visible GPU while a block of code runs.
- ``gpu_memory``: GPU memory in use, for a notebook that wants to know what a server process took, and the card's
  total, for how many such processes fit on it.
- ``topology``: how GPUs are wired: ``nvidia-smi topo -m``, NCCL's view of it, and what InfiniBand adds.
- ``rehearsal``: A smaller GPU's limits on a bigger one: ``GPULAB_TIER=t4`` on an A100 or H100 runs a lab as a T4
  learner runs it, not only at the T4 tier's sizes.
"""
