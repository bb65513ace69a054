"""The bytes a training step's operations read and write: the step's memory traffic, counted.

A step's bandwidth is its bytes over its time (phase 0, section 5). The bytes here are counted
from what the step runs, not taken from a formula: :func:`count_bytes` runs the step once under a
``TorchDispatchMode`` (``torch.utils._python_dispatch``, the hook ``torch.utils.flop_counter.FlopCounterMode``
counts FLOPs with), which sees every ATen operation, the backward pass's and the optimizer's included,
and adds up the bytes of each one's tensor inputs and outputs. That is what the operation reads and
writes when nothing stays in a cache between operations. Views move nothing and are not counted; a
fused kernel (SDPA's attention, a fused optimizer) counts as the one operation it is, so the count
follows what actually ran.

It is an estimate of the step's memory traffic, and says so: it overstates it where a cache serves an
operation's inputs (small tensors, a CPU's caches), and understates it where a kernel reads its inputs
more than once (a matmul's tiles of A and B). The course uses it to ask whether the step's bandwidth,
so counted, comes near the memory ceiling (``utils.measure.flops.step_bound``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepTraffic:
    """What one call moved: ``bytes`` read and written by its ``ops`` operations (views not counted)."""

    bytes: int
    ops: int


def _free_ops() -> set:
    """Operations that allocate or alias without reading or writing tensor data."""
    import torch

    aten = torch.ops.aten
    return {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.detach.default,
            aten.lift_fresh.default, aten._local_scalar_dense.default}


def count_bytes(fn: Callable, *args: Any, **kwargs: Any) -> StepTraffic:
    """Run ``fn(*args, **kwargs)`` once and count the bytes its ATen operations read and write:
    for every operation that is not a view, the bytes of its tensor arguments (read; an in-place
    operation's target is read too) and of the tensors it returns (written)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    if not callable(fn):
        raise TypeError(f"count_bytes needs a function to call, got {type(fn).__name__}: pass fn, not fn()")
    free = _free_ops()

    def nbytes(tree) -> int:
        return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not getattr(func, "is_view", False) and func not in free:
                self.bytes += nbytes((args, kwargs)) + nbytes(out)
                self.ops += 1
            return out

    with Counter() as counter:
        fn(*args, **kwargs)
    return StepTraffic(bytes=int(counter.bytes), ops=int(counter.ops))
