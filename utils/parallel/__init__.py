"""Several GPUs: scaling efficiency, collectives, gradient synchronization, ZeRO/FSDP memory, and launching
multi-process runs.

- ``distributed``: several GPUs: scaling efficiency, collective bandwidth as nccl-tests defines it, an all-reduce
  benchmark, and the memory arithmetic of DDP, ZeRO/FSDP, tensor and pipeline parallelism.
- ``grad_sync``: gradient synchronization written by hand, three ways, and the rules that judge a run of it.
- ``grad_sync_harness``: one rank of the gradient-synchronization run: the learner's three versions against DDP.
- ``scaling``: scaling curves from recorded runs: ``benchmarks/train_multi_gpu.py`` and ``allreduce.py`` JSONs.
- ``scaling_breaks``: the names lab 02 gives to the ways data-parallel scaling breaks, and to their causes.
- ``zero_memory``: the bytes each rank really holds under DDP, ZeRO-1 and FSDP2, beside ZeRO's model-state
  arithmetic.
- ``launch``: launching lab 02's multi-process runs the way people launch them, and where they go.
"""
