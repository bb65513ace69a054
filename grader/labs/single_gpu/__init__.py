"""Lab 01, one GPU: the profiler, mixed precision, data loading, batch size, torch.compile, LoRA and QLoRA.

Everything of the lab lives in this folder (see ``grader/labs/__init__.py``). The notebook is
``grader/source/01_single_gpu/``.
"""
ASSIGNMENT = "01_single_gpu"
