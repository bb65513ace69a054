"""utils: the GPU Utilization Roadmap's measurement package.

Imported from the repository root (``import utils``). One concept per module:

- ``hardware``: spec table (datasheet peaks, with sources), device detection, fingerprint
- ``nvml``: the one NVML wrapper and ``GpuMonitor`` (background sampler)
- ``timing``: GPU-correct benchmarking (``benchmark``, ``Stopwatch``, ``device_sync``)
- ``memory``: peak-memory tracking, training-memory estimates
- ``flops``: FLOPs per token (PaLM appendix B), MFU, roofline, bound classification
- ``profiling``: torch.profiler summary and diagnosis
- ``kvcache``: KV-cache bytes and vLLM's block/token/concurrency arithmetic (``python -m utils.kvcache``)
- ``distributed``: scaling efficiency, all-reduce bus bandwidth, ZeRO/FSDP memory per GPU
- ``inference``: prefill and decode measurement, decode bandwidth against copy bandwidth, KV growth, vLLM helpers
- ``decode``: three decode paths (eager, static cache + compile, gpt-fast-style ``FastDecoder`` with CUDA graphs)
- ``quantize``: bitsandbytes 8-bit and 4-bit against 16-bit: weight memory, decode speed, perplexity
- ``serve``: start and stop an existing engine (vLLM or ``transformers serve``) on a local model
- ``fused``: a fused bias + GELU Triton kernel against the unfused ops (interpreted without a GPU)
- ``loadgen``: load generator for OpenAI-compatible servers (``python -m utils.loadgen``)
- ``exporter``: Prometheus exporter with dcgm-exporter's names (``python -m utils.exporter``)
- ``cost``: cost per sample and per 1M tokens, spot, right-sizing, MIG
- ``checkpoint``: DCP checkpoints, kill-and-resume bit for bit, checkpoint overhead (``python -m utils.checkpoint``)
- ``xla``: JAX under XLA: compile counting, compile vs run time, bucketing
- ``topology``: ``nvidia-smi topo -m`` parsing, NCCL's view, network links
- ``plots``: the course's figures
- ``record``: the measurement record the grader reads
- ``env``: Colab/Kaggle/local, smoke mode, sizes by device
- ``models``: hub models online; shipped configs with random weights, tokenizer and text offline

``python -m utils`` prints the device report. Modules import torch lazily where they can,
so the pure maths works without it.
"""

__version__ = "0.1.0"
