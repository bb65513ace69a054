"""The grader's own re-measurements that more than one phase makes: the setting the
notebook's setup cells choose, a timed matmul, and the GPU's spec row.

Timed through :func:`grader.checks.timed` (``utils.timing`` after a tamper check).
``grader.phase(n)`` loads a fresh copy of this file with the fresh ``checks``
(``grader/__init__.py``); its functions look ``checks`` up at call time.
"""
from __future__ import annotations

from typing import Any

from grader import checks  # rebound to a fresh copy by grader.phase(n)
from utils.units import tflop_per_s


def setting(assignment: str) -> tuple[Any, str, Any]:
    """``(sizes, device, matmul dtype)`` as the notebook's setup cells choose them: the CPU
    in fp32 in smoke mode, else CUDA in bf16 (fp16 before Ampere)."""
    import torch

    from utils.env import phase_sizes, smoke_mode

    if smoke_mode():
        return phase_sizes(assignment), "cpu", torch.float32
    dtype = torch.bfloat16 if torch.cuda.get_device_capability()[0] >= 8 else torch.float16
    return phase_sizes(assignment), "cuda", dtype


def matmul(n: int, dtype, device) -> dict:
    """An ``n x n`` matmul timed: its timing, TFLOP/s (``2 n^3`` FLOPs) and arithmetic intensity."""
    import torch

    from utils.memory import bytes_per_dtype

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = checks.timed(lambda: a @ b)
    return {"time": t, "tflops": tflop_per_s(2 * n**3, t.median_ms),
            "intensity": 2 * n / (3 * int(bytes_per_dtype(checks.dtype_name(dtype))))}


def gpu_spec():
    """The GPU's spec row as the notebook sees it: None in smoke mode (GPULAB_SMOKE=1 included)
    or on a device that is not a GPU in ``utils.hardware``."""
    from utils.env import smoke_mode
    from utils.hardware import current_spec

    if smoke_mode():
        return None
    spec = current_spec()
    return spec if spec.kind == "gpu" else None
