"""Lab 02's bonus, graded: the learner's own Triton kernels (cells ``test_fused_kernel`` and ``test_second_fusion``).

The learner writes a ``@triton.jit`` kernel for ``gelu(x + bias)`` (tanh approximation, as
``utils.fused.bias_gelu_reference``) and a launcher, then a second fusion of their own choice with
its unfused PyTorch version. What is checked, on shapes the notebook does not show:

- the kernel is a Triton kernel, and the launcher really launches it: every call is counted on
  the kernel object itself, so a launcher that returns PyTorch's result beside an unused kernel
  launches nothing and fails;
- the output equals the PyTorch ops' to a tolerance of the dtype (fp32: 1e-5; fp16 and bf16: two
  units in the last place plus the PyTorch ops' own double rounding), ragged sizes included (a
  missing mask reads and writes past the end, a bias indexed by the flat offset instead of the
  column is wrong from the second row on);
- the second fusion: two or more PyTorch operations in its unfused version (counted with
  ``torch.overrides.TorchFunctionMode``, a public PyTorch API), fewer bytes moved in the learner's
  own estimate than unfused, the output not a copy of an input, and a kernel that is not the first one;
- on a GPU Triton compiles for (compute capability 7.0 and newer), speed re-measured by the grader
  (``utils.timing``: CUDA events, L2 flush): the fused kernel at least :data:`MIN_SPEEDUP` x the
  unfused ops (measured 3.47x on an H200 for bf16 65,536 x 3,072, ``benchmarks/RESULTS.md``; the
  byte counts alone allow about 2x), the second fusion not slower than its unfused version
  (:data:`MIN_SECOND_SPEEDUP`). Where the kernels run under Triton's interpreter (no GPU, or a GPU
  older than 7.0: ``utils.fused``) the times are NumPy's, and speed is not graded.

``grader.phase(2)`` loads this file afresh beside ``phase2.py`` (as ``phase(2).kernels``), with the
same fresh ``checks`` and ``remeasure``.
"""
from __future__ import annotations

from typing import Any

from grader import checks, remeasure  # rebound to fresh copies by grader.phase(2)

MIN_SPEEDUP = 1.3  # fused bias-GELU over the unfused ops, on a GPU (measured 3.47x on an H200)
MIN_SECOND_SPEEDUP = 1.0  # a fusion must not be slower than what it fuses
ATTEMPTS = 2
# (rows, cols): a single element, ragged tails (numel not a multiple of any power-of-2 block), an odd width,
# GPT-2's MLP width; none of them is the notebook's own example
SHAPES = ((1, 1), (3, 1000), (17, 129), (5, 3072), (2, 4099))
GPU_SHAPE = (16384, 3072)  # batch 16 x 1024 tokens of GPT-2 small's MLP
TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}  # (rtol, atol)


def _triton_kernel_types() -> tuple:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return JITFunction, InterpretedFunction


class _Launches:
    """Counts launches of ``kernel`` (``kernel[grid](...)`` calls ``kernel.run``) while active."""

    def __init__(self, kernel: Any):
        self.kernel, self.count = kernel, 0

    def __enter__(self):
        original = type(self.kernel).run

        def run(*args, **kwargs):
            if not kwargs.get("warmup"):
                self.count += 1
            return original(self.kernel, *args, **kwargs)

        self.kernel.run = run  # an instance attribute shadows the class's method; removed on exit
        return self

    def __exit__(self, *exc):
        self.kernel.__dict__.pop("run", None)


def where() -> tuple[Any, bool]:
    """``(device, interpreted)``: CPU tensors under Triton's interpreter, else the GPU."""
    import torch

    from utils import fused

    return (torch.device("cpu"), True) if fused.INTERPRETED else (torch.device("cuda"), False)


def _dtypes(interpreted: bool) -> tuple:
    import torch

    if interpreted:
        return (torch.float32,)
    from utils import rehearsal

    return (torch.float32, rehearsal.half_torch_dtype())  # as utils.fused times the learner's kernel


def assert_triton_kernel(kernel: Any, name: str) -> None:
    try:
        kinds = _triton_kernel_types()
    except ImportError:
        raise AssertionError("Triton is not installed: pip install triton, then run the notebook again") from None
    if not isinstance(kernel, kinds):
        raise AssertionError(f"{name} is a {type(kernel).__name__}, not a Triton kernel: decorate it with @triton.jit")


def _inputs(rows: int, cols: int, dtype, device, seed: int):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = (3 * torch.randn(rows, cols, generator=gen)).to(device=device, dtype=dtype)  # GELU's curved part and tails
    bias = torch.randn(cols, generator=gen).to(device=device, dtype=dtype)
    return x, bias


def _assert_matches(got: Any, want, what: str) -> None:
    import torch

    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what} returned {type(got).__name__}, not a tensor")
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{what} returned shape {tuple(got.shape)} {got.dtype}; expected {tuple(want.shape)} {want.dtype}")
    rtol, atol = TOL[str(want.dtype).replace("torch.", "")]
    if not torch.allclose(got.float(), want.float(), rtol=rtol, atol=atol):
        err = (got.float() - want.float()).abs()
        i = int(err.flatten().argmax())
        raise AssertionError(f"{what} differs from PyTorch's by up to {err.max().item():.3g} (element {i} of "
                             f"{want.numel()}; tolerance {atol:g} + {rtol:g} x |value|)")


def check_fused_bias_gelu(fused_bias_gelu, kernel) -> None:
    """The learner's ``fused_bias_gelu(x, bias)`` launching ``kernel``: right on the hidden shapes
    in every dtype the device computes in, one or more launches per call, and on a GPU at least
    :data:`MIN_SPEEDUP` x the unfused ops (re-measured)."""
    from utils.fused import bias_gelu_reference

    assert_triton_kernel(kernel, "BIAS_GELU_KERNEL")
    device, interpreted = where()
    for dtype in _dtypes(interpreted):
        for k, (rows, cols) in enumerate(SHAPES):
            x, bias = _inputs(rows, cols, dtype, device, seed=100 + k)
            with _Launches(kernel) as launched:
                got = checks.call(fused_bias_gelu, x, bias, name="fused_bias_gelu", show_args=False)
            if launched.count == 0:
                raise AssertionError("fused_bias_gelu did not launch BIAS_GELU_KERNEL: the kernel must compute the output")
            _assert_matches(got, bias_gelu_reference(x, bias), f"fused_bias_gelu on a {rows} x {cols} {dtype} input")
    if interpreted:
        checks.say("fused_bias_gelu matches PyTorch on 5 hidden shapes under Triton's interpreter (speed is not "
                   "graded there: its times are NumPy's)")
        return
    x, bias = _inputs(*GPU_SHAPE, _dtypes(False)[1], device, seed=7)
    _speed(lambda: fused_bias_gelu(x, bias), lambda: bias_gelu_reference(x, bias), MIN_SPEEDUP, "fused_bias_gelu")


def _speed(fused, unfused, minimum: float, what: str) -> None:
    def compare():
        t_unfused = checks.timed(unfused)
        t_fused = checks.timed(fused)
        speedup = checks.usable(checks.median(t_unfused, "unfused") / checks.median(t_fused, "fused"), f"{what} speedup", "x")
        checks.say(f"  {what}: {speedup:.2f}x the unfused ops, re-measured here (at least {minimum:g}x)")
        if speedup < minimum:
            raise AssertionError(f"{what} is {speedup:.2f}x the unfused ops, re-measured here; at least {minimum:g}x "
                                 "is expected from the bytes it saves")
        return speedup

    remeasure.agree(compare, ATTEMPTS)


class _CountTorchOps:
    """Counts PyTorch functions and tensor methods called inside (``torch.overrides.TorchFunctionMode``)."""

    def __init__(self):
        from torch.overrides import TorchFunctionMode

        counter = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name not in ("__get__", "__set__", "size", "dim", "numel", "element_size", "is_contiguous",
                                "contiguous", "stride", "data_ptr", "__len__", "__repr__", "__format__"):
                    counter.ops.append(name)
                return func(*args, **(kwargs or {}))

        self.ops: list[str] = []
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def check_second_fusion(second_fused, second_unfused, second_inputs, second_bytes, kernel, first_kernel) -> None:
    """The learner's own fusion: ``second_inputs(rows, cols, device, dtype)`` gives the input
    tensors, ``second_unfused(*inputs)`` computes with two or more PyTorch ops, ``second_fused(*inputs)``
    launches ``kernel`` (a Triton kernel other than the bias-GELU one) and agrees with it, and
    ``second_bytes(rows, cols, element_bytes)`` returns ``{"unfused": B1, "fused": B2}`` with B2 < B1."""
    import torch

    assert_triton_kernel(kernel, "SECOND_KERNEL")
    if kernel is first_kernel or getattr(kernel, "fn", None) is getattr(first_kernel, "fn", object()):
        raise AssertionError("SECOND_KERNEL is the bias-GELU kernel again: the second fusion is one of your own choice")
    device, interpreted = where()
    for dtype in _dtypes(interpreted):
        for k, (rows, cols) in enumerate(SHAPES[1:]):
            inputs = checks.call(second_inputs, rows, cols, device, dtype, name="second_inputs")
            if not isinstance(inputs, tuple) or not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
                raise AssertionError(f"second_inputs must return a tuple of tensors, got {type(inputs).__name__}")
            with _CountTorchOps() as counted:
                want = checks.call(second_unfused, *inputs, name="second_unfused", show_args=False)
            if k == 0 and len(counted.ops) < 2:
                raise AssertionError(f"second_unfused calls {len(counted.ops)} PyTorch operation(s) "
                                     f"({', '.join(counted.ops) or 'none'}): a fusion joins two or more")
            if not isinstance(want, torch.Tensor):
                raise AssertionError(f"second_unfused returned {type(want).__name__}, not a tensor")
            if any(t.shape == want.shape and torch.equal(t, want) for t in inputs):
                raise AssertionError("second_unfused returns one of its inputs unchanged: a fusion computes something")
            with _Launches(kernel) as launched:
                got = checks.call(second_fused, *inputs, name="second_fused", show_args=False)
            if launched.count == 0:
                raise AssertionError("second_fused did not launch SECOND_KERNEL: the kernel must compute the output")
            _assert_matches(got, want, f"second_fused on {rows} x {cols} {dtype} inputs")
    moved = checks.call(second_bytes, 4096, 3072, 2, name="second_bytes")
    if not isinstance(moved, dict) or not {"unfused", "fused"} <= set(moved):
        raise AssertionError(f"second_bytes must return {{'unfused': bytes, 'fused': bytes}}, got {moved!r:.120}")
    unfused_b, fused_b = (checks.as_number(moved[k], f"second_bytes(...)[{k!r}]") for k in ("unfused", "fused"))
    if not 0 < fused_b < unfused_b:
        raise AssertionError(f"second_bytes says the fused kernel moves {fused_b:,.0f} bytes and the unfused ops "
                             f"{unfused_b:,.0f}: fusing saves the round trips of the intermediates, so fused < unfused")
    if interpreted:
        checks.say(f"second fusion matches its PyTorch version on 4 hidden shapes; {len(counted.ops)} ops fused; "
                   f"bytes {unfused_b:,.0f} -> {fused_b:,.0f} (speed not graded under the interpreter)")
        return
    inputs = second_inputs(*GPU_SHAPE, device, _dtypes(False)[1])
    _speed(lambda: second_fused(*inputs), lambda: second_unfused(*inputs), MIN_SECOND_SPEEDUP, "second_fused")
