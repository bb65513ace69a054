"""The course's own fused bias + GELU Triton kernel: lab 02's bonus answer, for instructors.

Lab 02 asks the learner to write this kernel (``BIAS_GELU_KERNEL`` and ``fused_bias_gelu``), so
it lives here, in the instructors' repository, and not in ``utils/``, which the student edition
ships (``grader/edition.py``). ``benchmarks/fused_check.py`` times it on a GPU against the
unfused ops and a copy (the H200 row in ``benchmarks/RESULTS.md``), and ``tests/utils/test_fused.py``
checks it under Triton's interpreter. The arithmetic and the timing harness are
``utils.train.fused``'s (import it first: it chooses Triton's interpreter where Triton cannot compile).
"""
from __future__ import annotations

import torch

from utils.train import fused as F
from utils.train.fused import tl, triton

if triton is None:
    _bias_gelu_kernel = None
else:
    @triton.jit
    def _bias_gelu_kernel(x_ptr, bias_ptr, out_ptr, n_elements, n_cols, BLOCK: tl.constexpr):
        # one program per BLOCK consecutive elements of the flattened (rows, n_cols) tensor;
        # element i's bias is bias[i % n_cols] (the bias is small and stays in cache)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(bias_ptr + offs % n_cols, mask=mask, other=0.0).to(tl.float32)
        v = x + b
        # literals: a @jit function may read only constexpr globals; 0.79788... = sqrt(2 / pi)
        two_u = 2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v)
        # 0.5 v (1 + tanh(u)) == v * sigmoid(2u); exp clamped at e^80 (finite in fp32: no overflow
        # warning from the interpreter), where sigmoid(2u) < 2e-35 and the output is 0 either way
        y = v / (1.0 + tl.exp(tl.minimum(-two_u, 80.0)))
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, block_size: int = F.DEFAULT_BLOCK) -> torch.Tensor:
    """``gelu(x + bias, approximate="tanh")`` in one Triton kernel; ``x`` is ``(..., C)``, ``bias`` ``(C,)``.

    Computes in fp32 and stores in ``x.dtype`` (fp32, fp16 or bf16). A non-contiguous ``x``
    is copied to a contiguous one first. Where Triton cannot compile it runs under Triton's
    interpreter on CPU tensors (``utils.train.fused``); compiled, the tensors must be on the GPU.
    """
    F._require_triton()
    F._check(x, bias)
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of 2, got {block_size}")
    if not F.INTERPRETED and x.device.type != "cuda":
        raise ValueError(f"x is on {x.device}; the compiled Triton kernel needs CUDA tensors (move them with .cuda())")
    if not F.INTERPRETED:
        F._require_capability(x.device)
    x = x.contiguous()
    bias = bias.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _bias_gelu_kernel[(triton.cdiv(n, block_size),)](x, bias, out, n, bias.shape[0], BLOCK=block_size)
    return out
