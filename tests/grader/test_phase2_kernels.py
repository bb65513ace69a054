"""grader/phase2_kernels.py: lab 02's Triton bonus, a right kernel and the ways a kernel is wrong.

The kernels run under Triton's interpreter (CPU CI: ``utils.fused`` sets ``TRITON_INTERPRET=1`` at
import, before the kernels below are decorated). Each wrong answer is a kind of mistake, not one
example: an unmasked or mis-indexed bias, another GELU, a launcher that does not use its kernel, a
plain function, a "fusion" of one op, a copy, a byte count that saves nothing, the first kernel again.
"""
from __future__ import annotations

import pytest
import torch

from utils import fused  # noqa: I001 (first: it sets TRITON_INTERPRET before the kernels below are decorated)
from utils.fused import tl, triton

pytestmark = pytest.mark.skipif(not fused.triton_available(), reason="Triton is a requirement of the tests")


@pytest.fixture(scope="module")
def kernels():
    return __import__("grader").phase(2).kernels


@triton.jit
def good_kernel(x_ptr, b_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    y = v / (1.0 + tl.exp(tl.minimum(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v), 80.0)))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bias_by_flat_offset(x_ptr, b_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b = tl.load(b_ptr + offs, mask=offs < n_cols, other=0.0).to(tl.float32)  # right for row 0 only
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + b
    y = v / (1.0 + tl.exp(tl.minimum(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v), 80.0)))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sigmoid_gelu(x_ptr, b_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    y = v / (1.0 + tl.exp(tl.minimum(-1.702 * v, 80.0)))  # GELU's sigmoid approximation: not the tanh one asked for
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def last_block_dropped(x_ptr, b_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < (n // BLOCK) * BLOCK  # the ragged tail is never written
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    y = v / (1.0 + tl.exp(tl.minimum(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v), 80.0)))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launcher(kernel, block=1024):
    def run(x, bias):
        out = torch.empty_like(x)
        n = x.numel()
        kernel[(triton.cdiv(n, block),)](x, bias, out, n, x.shape[-1], BLOCK=block)
        return out
    return run


@triton.jit
def bias_relu_residual(x_ptr, b_ptr, r_ptr, out_ptr, n, n_cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(b_ptr + offs % n_cols, mask=mask).to(tl.float32)
    y = tl.maximum(v, 0.0) + tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def second_inputs(rows, cols, device, dtype):
    g = torch.Generator().manual_seed(rows * 7919 + cols)
    return tuple(torch.randn(*s, generator=g).to(device=device, dtype=dtype) for s in ((rows, cols), (cols,), (rows, cols)))


def second_unfused(x, bias, residual):
    return torch.relu(x + bias) + residual


def second_fused(x, bias, residual, kernel=bias_relu_residual):
    out = torch.empty_like(x)
    n = x.numel()
    kernel[(triton.cdiv(n, 1024),)](x, bias, residual, out, n, x.shape[-1], BLOCK=1024)
    return out


def second_bytes(rows, cols, e):
    n = rows * cols
    return {"unfused": (2 * n + cols + 2 * n + 3 * n) * e, "fused": (3 * n + cols) * e}  # 3 kernels vs 1


def test_a_right_kernel_passes(kernels, capsys):
    kernels.check_fused_bias_gelu(launcher(good_kernel), good_kernel)
    kernels.check_second_fusion(second_fused, second_unfused, second_inputs, second_bytes, bias_relu_residual, good_kernel)
    out = capsys.readouterr().out
    if kernels.where()[1]:  # Triton's interpreter (no GPU): right on the shapes, speed not graded
        assert "5 hidden shapes" in out and "speed is not graded" in out and "3 ops fused" in out
    else:  # compiled on a GPU: both kernels re-timed against their unfused ops (a noisy GPU may retry)
        timed = [line for line in out.splitlines() if "re-measured here" in line]
        assert any("fused_bias_gelu: " in t for t in timed) and any("second_fused: " in t for t in timed), out


@pytest.mark.parametrize("kernel, why", [(bias_by_flat_offset, "differs from PyTorch"), (sigmoid_gelu, "differs from PyTorch"),
                                         (last_block_dropped, "differs from PyTorch")])
def test_a_wrong_kernel_fails(kernels, kernel, why):
    with pytest.raises(AssertionError, match=why):
        kernels.check_fused_bias_gelu(launcher(kernel), kernel)


def test_a_launcher_that_does_not_launch_its_kernel_or_a_plain_function_fails(kernels):
    with pytest.raises(AssertionError, match="did not launch BIAS_GELU_KERNEL"):
        kernels.check_fused_bias_gelu(fused.bias_gelu_reference, good_kernel)
    with pytest.raises(AssertionError, match="not a Triton kernel"):
        kernels.check_fused_bias_gelu(fused.bias_gelu_reference, fused.bias_gelu_reference)
    with pytest.raises(AssertionError, match="did not launch BIAS_GELU_KERNEL"):  # another kernel does the work
        kernels.check_fused_bias_gelu(launcher(sigmoid_gelu), good_kernel)


def test_a_launcher_that_raises_is_one_line(kernels):
    def broken(x, bias):
        raise IndexError("grid too small")
    with pytest.raises(AssertionError, match=r"fused_bias_gelu\(\.\.\.\) raised IndexError: grid too small"):
        kernels.check_fused_bias_gelu(broken, good_kernel)


def test_second_fusions_that_are_no_fusion_fail(kernels):
    k = kernels.check_second_fusion
    with pytest.raises(AssertionError, match="the bias-GELU kernel again"):
        k(second_fused, second_unfused, second_inputs, second_bytes, good_kernel, good_kernel)
    with pytest.raises(AssertionError, match="a fusion joins two or more"):
        k(second_fused, lambda x, b, r: x.relu(), second_inputs, second_bytes, bias_relu_residual, good_kernel)
    with pytest.raises(AssertionError, match="returns one of its inputs unchanged"):
        k(second_fused, lambda x, b, r: (x + 0) * 1, second_inputs, second_bytes, bias_relu_residual, good_kernel)
    with pytest.raises(AssertionError, match="did not launch SECOND_KERNEL"):
        k(second_unfused, second_unfused, second_inputs, second_bytes, bias_relu_residual, good_kernel)
    with pytest.raises(AssertionError, match="differs from PyTorch"):  # the residual never reaches the kernel
        k(lambda x, b, r: second_fused(x, b, torch.zeros_like(r)), second_unfused, second_inputs, second_bytes,
          bias_relu_residual, good_kernel)
    with pytest.raises(AssertionError, match="the bias-GELU kernel again"):  # decorated afresh, the same function
        k(second_fused, second_unfused, second_inputs, second_bytes, triton.jit(good_kernel.fn), good_kernel)
    with pytest.raises(AssertionError, match="fused < unfused"):
        k(second_fused, second_unfused, second_inputs, lambda r, c, e: {"unfused": 1, "fused": 1}, bias_relu_residual,
          good_kernel)
    with pytest.raises(AssertionError, match="must return a tuple of tensors"):
        k(second_fused, second_unfused, lambda *a: [1, 2], second_bytes, bias_relu_residual, good_kernel)

