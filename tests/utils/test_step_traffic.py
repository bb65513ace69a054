"""utils/measure/step_traffic.py: the bytes a call's operations read and write, counted on a CPU against
what each operation must move by hand."""
from __future__ import annotations

import pytest
import torch

from utils.measure.step_traffic import count_bytes


def test_each_operation_counts_its_inputs_and_outputs_once():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert count_bytes(lambda: a @ b).bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4  # read A and B, write C
    x = torch.randn(1000)
    assert count_bytes(lambda: x + 1).bytes == 2 * 1000 * 4  # read x, write the sum
    h = torch.randn(1000, dtype=torch.bfloat16)
    assert count_bytes(lambda: h * 2).bytes == 2 * 1000 * 2  # bytes of the dtype, not of fp32


def test_views_move_nothing_and_a_copy_of_one_moves_its_bytes():
    a = torch.randn(64, 32)
    assert count_bytes(lambda: a.t().view(-1, 64)[:4]) == count_bytes(lambda: None)
    assert count_bytes(lambda: a.t().contiguous()).bytes == 2 * 64 * 32 * 4
    assert count_bytes(lambda: torch.empty(10**6)).bytes == 0  # an allocation reads and writes nothing


def test_an_in_place_update_reads_and_writes_its_target():
    x, y = torch.randn(100), torch.randn(100)
    r = count_bytes(lambda: x.add_(y))
    assert r.bytes == 3 * 100 * 4 and r.ops == 1  # read x and y, write x


def test_backward_and_the_optimizer_are_counted():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(8, 256)

    def forward():
        return layer(x).sum()

    def step():
        layer(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    fwd, full = count_bytes(forward), count_bytes(step)
    weights = 256 * 256 * 4
    assert fwd.bytes >= weights  # the forward reads the weights
    assert full.bytes >= fwd.bytes + 3 * weights  # backward writes the weight gradient; SGD reads it and updates the weights
    assert full.ops > fwd.ops


def test_the_function_runs_once_and_a_non_function_is_one_line():
    calls = []
    count_bytes(calls.append, 1)
    assert calls == [1]
    with pytest.raises(TypeError, match="pass fn, not fn"):
        count_bytes(torch.randn(3))
