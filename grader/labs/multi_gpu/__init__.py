"""Lab 02, several GPUs: DDP, ZeRO and FSDP, all-reduce cost, gradient sync by hand, a Triton kernel.

Everything of the lab lives in this folder (see ``grader/labs/__init__.py``). The notebook is
``grader/source/02_multi_gpu/``.
"""
ASSIGNMENT = "02_multi_gpu"
