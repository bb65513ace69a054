"""utils/parallel/zero_memory.py: the bytes each rank holds under DDP, ZeRO-1 and FSDP2, counted on a real run.

One launch of the notebook's stack on two gloo processes (a module-scoped fixture, about 20 s on
two busy cores): every rank's bytes equal what the stage's sharding implies, worked out here from
the parameter shapes alone (DDP: everything; ZeRO-1: whole tensors, largest first, to the rank with
the fewest elements; FSDP2: row chunks of ceil(rows / 2), parameters and gradients padded to the
first chunk, AdamW state as the unpadded shard). The counting, the remainder bound and the table are
checked in this process without a launch.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from grader.labs.multi_gpu.sizes import BY_TIER
from utils.parallel import launch
from utils.parallel import zero_memory as Z

ROOT = Path(__file__).resolve().parents[2]


def _numel(shape) -> int:
    return int(torch.Size(shape).numel())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return Z.run(launch.plan_for(0, True, "cpu", BY_TIER, str(tmp_path_factory.mktemp("zero"))), verbose=False)


def _zero1_elements(shapes, n: int) -> list[int]:
    """Elements of the parameters each rank optimizes: whole tensors, largest first, to the least-loaded rank."""
    loads = [0] * n
    for k in sorted((_numel(s) for s in shapes), reverse=True):
        loads[loads.index(min(loads))] += k
    return loads


@pytest.mark.slow
def test_each_rank_holds_what_its_stage_shards(run):
    shapes = [tuple(s) for s in run["param_shapes"]]
    psi = sum(_numel(s) for s in shapes)
    assert shapes == Z.param_shapes(Z.LAYERS) and run["n_params"] == psi == 58_399
    assert (run["world_size"], run["backend"], run["bytes_per_param"]) == (2, "gloo", {"weights": 4, "grads": 4, "optimizer": 8})
    assert not Z.run_problems(run, Z.LAYERS, 2, "gloo")
    for r in run["stages"]["ddp"]:  # replicated: 4 + 4 + 8 bytes of every parameter, DDP's buckets being the gradients
        assert (r["weights_bytes"], r["grads_bytes"], r["optimizer_bytes"]) == (4 * psi, 4 * psi, 8 * psi)
    for r, elements in zip(run["stages"]["zero1"], _zero1_elements(shapes, 2), strict=True):
        assert (r["weights_bytes"], r["grads_bytes"], r["optimizer_bytes"]) == (4 * psi, 4 * psi, 8 * elements)
    for rank, r in enumerate(run["stages"]["zero3"]):
        padded = sum(max(Z.chunk_rows(s[0], 2)) * _numel(s[1:]) for s in shapes)
        own = sum(Z.chunk_rows(s[0], 2)[rank] * _numel(s[1:]) for s in shapes)
        assert (r["weights_bytes"], r["grads_bytes"], r["optimizer_bytes"], r["param_elements"]) == \
            (4 * padded, 4 * padded, 8 * own, own)
    for stage in Z.STAGES:  # two 0-dim step counters' worth, 4 bytes per optimized tensor, kept out of the total
        assert sum(r["step_counter_bytes"] for r in run["stages"][stage]) == 4 * len(shapes) * (2 if stage != "zero1" else 1)


@pytest.mark.slow
def test_the_remainder_bound_holds_and_fsdp2_reaches_it(run):
    w, psi = run["bytes_per_param"], run["n_params"]
    for stage in Z.STAGES:
        even = (4 + 4 + 8) * psi / (2 if stage == "zero3" else 1) - (8 * psi / 2 if stage == "zero1" else 0)
        bound = Z.remainder_bytes(run["param_shapes"], 2, stage, w)
        off = [abs(r["total_bytes"] - even) for r in run["stages"][stage]]
        assert max(off) <= bound, (stage, off, bound)
    # rank 0 holds every rounded-up row: the bound for 2 ranks is exact
    assert max(abs(r["total_bytes"] - 8 * psi) for r in run["stages"]["zero3"]) == Z.remainder_bytes(
        run["param_shapes"], 2, "zero3", w) == 3_848


@pytest.mark.slow
def test_the_notebooks_explanation_quotes_this_run(run):
    """The prose under the table quotes the notebook's run: ZeRO-1's whole-tensor split, FSDP2's shard sizes."""
    nb = json.loads((ROOT / "grader" / "source" / "02_multi_gpu" / "02_multi_gpu.ipynb").read_text())
    text = next("".join(c["source"]) for c in nb["cells"] if c["metadata"]["nbgrader"]["grade_id"] == "zero_why_md")
    psi = run["n_params"]
    z1 = [r["optimizer_bytes"] // 8 for r in run["stages"]["zero1"]]
    z3 = [r["param_elements"] for r in run["stages"]["zero3"]]
    quoted = {*z1, *z3, abs(run["stages"]["zero1"][0]["total_bytes"] - 12 * psi),
              run["stages"]["zero3"][0]["total_bytes"] - 8 * psi}
    for x in quoted:
        assert f"{int(x):,}" in text, x
    assert f"{psi / 2:,}" in text and run["stages"]["zero3"][1]["total_bytes"] == 8 * psi  # "rank 1 meets it exactly"


def test_held_bytes_counts_each_storage_once_at_its_allocated_size():
    model = Z.build((5, 4, 3), seed=0, device="cpu")
    opt = torch.optim.AdamW(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in model.parameters()) + 7)  # one buffer, 7 elements of padding
    at = 0
    for p in model.parameters():  # every gradient a view of it, as DDP's buckets and FSDP2's reduce-scatter do
        p.grad = flat[at:at + p.numel()].view_as(p)
        at += p.numel()
    opt.step()
    held = Z.held_bytes(model, opt)
    psi = Z.n_params((5, 4, 3))
    assert psi == 4 * 5 + 4 + 3 * 4 + 3 == sum(p.numel() for p in model.parameters())
    assert held == {"weights_bytes": 4 * psi, "grads_bytes": 4 * (psi + 7), "optimizer_bytes": 8 * psi,
                    "step_counter_bytes": 4 * 4, "param_elements": psi, "total_bytes": 16 * psi + 28}


@pytest.mark.parametrize("rows, n", [(9, 8), (255, 2), (1, 2), (5, 4), (1001, 8), (16, 4)])
def test_chunk_rows_is_torch_chunk_padded_with_empty_ranks(rows, n):
    chunks = [len(c) for c in torch.arange(rows).chunk(n)]
    assert Z.chunk_rows(rows, n) == chunks + [0] * (n - len(chunks))


def test_the_remainder_bound_on_more_ranks_and_its_refusals():
    widths = {"weights": 4, "grads": 4, "optimizer": 8}
    shapes = [(9, 2), (9,)]  # on 8 ranks: rows 2, 2, 2, 2, 1, 0, 0, 0 against 9/8 = 1.125
    pad = (2 - 1.125) * 2 + (2 - 1.125)
    own = 1.125 * 2 + 1.125  # the empty ranks are the furthest below
    assert Z.remainder_bytes(shapes, 8, "zero3", widths) == pytest.approx(8 * pad + 8 * own)
    assert Z.remainder_bytes(shapes, 8, "zero1", widths) == 8 * 18 * 7 / 8
    assert Z.remainder_bytes(shapes, 8, "ddp", widths) == 0
    with pytest.raises(ValueError, match="no measured stage 'zero2'"):
        Z.remainder_bytes(shapes, 2, "zero2", widths)
    with pytest.raises(ValueError, match="two or more positive widths"):
        Z.param_shapes((4,))


def _fake_run() -> dict:
    psi = Z.n_params((3, 2))
    rank = {"weights_bytes": 4 * psi, "grads_bytes": 4 * psi, "optimizer_bytes": 8 * psi, "total_bytes": 16 * psi}
    return {"world_size": 2, "backend": "gloo", "dtype": "float32", "layers": [3, 2], "n_params": psi,
            "param_shapes": Z.param_shapes((3, 2)), "bytes_per_param": {"weights": 4, "grads": 4, "optimizer": 8},
            "stages": {s: [{"rank": r, **rank} for r in range(2)] for s in Z.STAGES}}


def test_the_table_prints_each_rank_beside_the_prediction_and_names_stage_2():
    res = _fake_run()
    out = Z.table(res, lambda n, d, stage, w, g, o: (w + g + o) * n / 1e9)
    assert re.search(r"zero3\s+1\s+32\s+32\s+64\s+128\s+128\s+\+0", out), out
    assert "zero2  not measured" in out and "predicted" in out
    assert "predicted" not in Z.table(res)


def test_run_problems_names_another_run():
    res = _fake_run()
    assert Z.run_problems(res, (3, 2), 2, "gloo") == []
    res["stages"]["zero1"] = res["stages"]["zero1"][:1]
    res["stages"]["ddp"][1]["total_bytes"] += 1
    bad = Z.run_problems(res, (4, 2), 2, "nccl")
    assert any("layers=[3, 2]" in b for b in bad) and any("backend='gloo'" in b for b in bad)
    assert any("zero1: ranks [0]" in b for b in bad) and any("ddp rank 1: total" in b for b in bad)
