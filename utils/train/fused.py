"""Fusing bias + GELU in Triton (lab 02's bonus): the arithmetic, the setup and the timing harness.

GPT-2's MLP computes ``gelu(x @ W + b)`` with GELU's tanh approximation
(Hendrycks and Gimpel, arXiv 1606.08415):
``gelu(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))``. In eager PyTorch the bias add
and the GELU are two kernels, ``t = x + bias`` then ``gelu(t, approximate="tanh")``, and the
intermediate ``t`` makes a round trip through GPU memory. Both ops do a handful of FLOPs per
element, far below any GPU's ridge point (H200 bf16: about 206 FLOP/byte, utils/measure/flops.py), so
their time is memory traffic. With ``N`` elements of ``e`` bytes and a bias of ``C`` columns:

- unfused: the add reads ``x`` and the bias and writes ``t``; the GELU reads ``t`` and writes
  the output: ``4 N e + C e`` bytes;
- fused (the learner's kernel in lab 02; the course's own is ``grader/fused_reference.py``, kept
  out of the student edition): one kernel reads ``x`` and the bias once and writes the output
  once: ``2 N e + C e`` bytes.

Half the bytes, so on a large tensor the fused kernel can be up to about 2x faster (an
estimate from the byte counts, not a measurement; ``benchmarks/fused_check.py`` measures it).
:func:`compare_bias_gelu` reports both times (``utils.measure.timing.benchmark``: CUDA events, L2
flush, repeats), the speedup and the bandwidth the fused kernel achieved,
``fused_gbs = bytes_moved_fused / fused time``, to set against the datasheet bandwidth.

A kernel that computes in fp32 whatever the storage dtype (the course's does), so in bf16 it rounds once (the
output) where the unfused ops round twice (``t`` and the output); compiled, that cast rounds to
nearest, while Triton 3.7.1's interpreter truncates (91% of bf16 outputs of a 37 x 101 test
equalled the truncated fp32 value, CPU here), so interpreted bf16 can be a full ulp off. It writes
``0.5 v (1 + tanh(u))`` as ``v * sigmoid(2u)`` (the same function: ``0.5 (1 + tanh(u)) =
1 / (1 + exp(-2u))``), because ``tl.exp`` exists on every backend and in the interpreter
while a tanh needs a backend-specific libdevice call.

Without CUDA a kernel runs under Triton's interpreter, which executes each program with
NumPy on the CPU: right answers, but its times say nothing about a GPU (``interpreted`` is
True in the result). Triton decides interpreter or compiler when ``@triton.jit`` decorates a
function: ``triton.jit`` reads ``TRITON_INTERPRET`` (through ``triton.knobs.runtime.interpret``
in Triton 3.x, ``triton/runtime/jit.py``) and returns an ``InterpretedFunction`` when it is
1. So this module sets ``TRITON_INTERPRET=1`` at import, before any kernel is
decorated, when the variable is unset and torch sees no CUDA device, or only GPUs Triton does not
compile for (compute capability below 7.0, a P100: :func:`_require_capability`); it stays set
for the process (every Triton kernel decorated afterwards, a learner's too, then runs
interpreted on CPU tensors, and Triton's ``constexpr_function`` helpers read it again at run
time). Import this module before decorating a kernel of your own: ``from utils.train.fused import
triton, tl``. Without Triton installed the
module still imports; :func:`compare_bias_gelu` then raises one line saying what to install,
and :func:`bias_gelu_reference` works as before. CUDA builds of torch bring Triton; for a CPU,
``pip install triton`` (requirements-dev.txt pins the version CI uses).
"""
from __future__ import annotations

import os
from typing import Any

import torch

from utils.device import rehearsal
from utils.units import gb_per_s


def _no_gpu_for_triton() -> bool:
    """No CUDA GPU, or none Triton compiles for (compute capability below 7.0: a P100)."""
    if not torch.cuda.is_available():
        return True
    return all(torch.cuda.get_device_capability(i)[0] < 7 for i in range(torch.cuda.device_count()))


if "TRITON_INTERPRET" not in os.environ and _no_gpu_for_triton():
    os.environ["TRITON_INTERPRET"] = "1"  # before @triton.jit below (and the learner's): that is when Triton reads it

try:
    import triton
    import triton.language as tl  # noqa: F401 (for the learner's kernels: from utils.train.fused import tl, triton)
except ImportError:  # the reference path and the byte arithmetic still work
    triton = tl = None

DEFAULT_BLOCK = 1024  # elements per program (Triton's vector-add tutorial size); a power of 2

if triton is not None:
    @triton.jit
    def _probe(x_ptr):  # decorated only to learn whether Triton interprets or compiles here
        pass

    INTERPRETED = type(_probe).__name__ == "InterpretedFunction"
else:
    INTERPRETED = False

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


class TritonUnavailable(ImportError):
    """Triton is not installed (one-line message)."""


def triton_available() -> bool:
    return triton is not None


def _require_triton() -> None:
    if triton is None:
        raise TritonUnavailable("Triton is not installed: pip install triton (without a GPU it runs under Triton's "
                                "interpreter); bias_gelu_reference needs only torch")


def _check(x: torch.Tensor, bias: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias_gelu takes two tensors, got {type(x).__name__} and {type(bias).__name__}")
    if bias.dim() != 1 or x.dim() < 1 or x.shape[-1] != bias.shape[0]:
        raise ValueError(f"bias must be 1-D with x's last dimension: x {tuple(x.shape)}, bias {tuple(bias.shape)}")
    if x.dtype != bias.dtype or x.device != bias.device:
        raise ValueError(f"x and bias must share dtype and device: {x.dtype} on {x.device} vs {bias.dtype} on "
                         f"{bias.device}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"bias_gelu supports fp32, fp16 and bf16, got {x.dtype}")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; the kernel's int32 offsets allow fewer than 2**31")


def _require_capability(device: torch.device) -> None:
    """One line instead of a compiler failure on a GPU Triton does not support: PyTorch gates its
    Triton use at compute capability 7.0 and Triton's README lists 8.0+ (``utils.course.tier_plan``)."""
    major, minor = rehearsal.capability(device.index or 0)
    if major < 7:
        raise RuntimeError(f"Triton does not compile for compute capability {major}.{minor} (7.0 or newer: a T4, "
                           "V100 or later); the fused kernel is skipped on this GPU")


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The unfused PyTorch ops: ``x + bias`` (one kernel) then tanh-approximated GELU (another)."""
    return torch.nn.functional.gelu(x + bias, approximate="tanh")


def bytes_moved(n_rows: int, n_cols: int, element_bytes: int) -> dict:
    """Minimum DRAM traffic of each version (see the module docstring): fused ``2 N e + C e``,
    unfused ``4 N e + C e`` with ``N = n_rows * n_cols``."""
    n = n_rows * n_cols
    return {"bytes_moved_fused": 2 * n * element_bytes + n_cols * element_bytes,
            "bytes_moved_unfused": 4 * n * element_bytes + n_cols * element_bytes}


def _dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be bf16, fp16 or fp32 (or the torch dtype), got {dtype!r}")


def compare_bias_gelu(fused_fn, n_rows: int | None = None, n_cols: int = 3072, dtype: Any = None, device: Any = None,
                      block_size: int = DEFAULT_BLOCK, budget_s: float | None = None, seed: int = 0) -> dict:
    """Time ``fused_fn(x, bias, block_size=...)``, a fused bias + GELU launcher (yours, in lab 02's
    bonus), against the unfused ops on one ``(n_rows, n_cols)`` input.

    Defaults: ``n_cols=3072`` (GPT-2 small's MLP width, 4 x 768); ``n_rows`` 16384 (batch 16 x
    1024 tokens) on a GPU, 64 under the interpreter; ``dtype`` the GPU's 16-bit type (bf16, fp16
    before compute capability 8.0), fp32 under the interpreter; ``device`` CUDA when the kernel is compiled, CPU when interpreted.

    Returns ``unfused_ms`` and ``fused_ms`` (medians of ``utils.measure.timing.benchmark``),
    ``speedup = unfused_ms / fused_ms``, ``max_abs_err`` of the fused output against the
    unfused one in the same dtype, ``interpreted``, ``bytes_moved_fused`` and
    ``bytes_moved_unfused`` (:func:`bytes_moved`), and the achieved bandwidths
    ``fused_gbs`` and ``unfused_gbs`` (bytes over median time, decimal GB/s). Under the
    interpreter the times are the interpreter's, not a GPU's: check ``interpreted``.
    """
    from utils.measure.timing import benchmark

    _require_triton()

    interpreted = INTERPRETED
    dt = _dtype(dtype if dtype is not None else ("fp32" if interpreted else rehearsal.half_dtype()))
    n_rows = n_rows if n_rows is not None else (64 if interpreted else 16384)
    if n_rows < 1 or n_cols < 1:
        raise ValueError(f"n_rows and n_cols must be >= 1, got {n_rows} and {n_cols}")
    dev = torch.device(device if device is not None else ("cpu" if interpreted else "cuda"))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n_rows, n_cols, generator=gen).to(device=dev, dtype=dt)
    bias = torch.randn(n_cols, generator=gen).to(device=dev, dtype=dt)

    fused = fused_fn(x, bias, block_size=block_size)
    err = (fused.float() - bias_gelu_reference(x, bias).float()).abs().max().item()
    budget = budget_s if budget_s is not None else (1.0 if interpreted else 3.0)
    opts = {"warmup": 1, "min_runs": 3, "max_runs": 5} if interpreted else {"warmup": 5}
    t_unfused = benchmark(bias_gelu_reference, x, bias, device=dev, budget_s=budget, **opts)
    t_fused = benchmark(fused_fn, x, bias, device=dev, budget_s=budget, kwargs={"block_size": block_size}, **opts)
    moved = bytes_moved(n_rows, n_cols, x.element_size())
    return {
        "n_rows": n_rows, "n_cols": n_cols, "dtype": str(dt).replace("torch.", ""), "device": str(dev),
        "block_size": block_size, "interpreted": interpreted,
        "unfused_ms": t_unfused.median_ms, "fused_ms": t_fused.median_ms,
        "unfused_p20_p80_ms": [t_unfused.p20_ms, t_unfused.p80_ms], "fused_p20_p80_ms": [t_fused.p20_ms, t_fused.p80_ms],
        "speedup": t_unfused.median_ms / t_fused.median_ms,
        "max_abs_err": err,
        **moved,
        "fused_gbs": gb_per_s(moved["bytes_moved_fused"], t_fused.median_ms),
        "unfused_gbs": gb_per_s(moved["bytes_moved_unfused"], t_unfused.median_ms),
        "timing_method": t_fused.method,
    }
