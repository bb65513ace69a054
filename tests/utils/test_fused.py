"""utils/train/fused.py and the course's own bias + GELU kernel (grader/fused_reference.py, interpreted on a
CPU) against the unfused ops."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from grader import fused_reference as ref
from utils.train import fused  # noqa: I001 (first: it chooses the interpreter before any kernel is decorated)

DEV = "cpu" if fused.INTERPRETED else "cuda"
# odd sizes: not multiples of the block, a single element, more than one program per row
SHAPES = [(1, 1), (3, 1000), (37, 101), (5, 1025), (2, 3, 67)]


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*shape, generator=g)).to(DEV, dtype)  # spans GELU's curved part and both tails
    b = torch.randn(shape[-1], generator=g).to(DEV, dtype)
    return x, b


def test_interpreter_chosen_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine compiles the kernel")
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert fused.INTERPRETED and type(ref._bias_gelu_kernel).__name__ == "InterpretedFunction"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", [fused.DEFAULT_BLOCK, 64])
def test_fp32_matches_unfused(shape, block):
    x, b = _inputs(shape, torch.float32)
    out = ref.bias_gelu(x, b, block_size=block)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, fused.bias_gelu_reference(x, b), rtol=1e-5, atol=1e-6)


def test_matches_the_tanh_formula():
    """The kernel's v*sigmoid(2u) is GELU's 0.5 v (1 + tanh(u)), checked against math.tanh."""
    vals = [-8.0, -3.0, -1.0, -0.1, 0.0, 0.1, 1.0, 3.0, 8.0]
    x = torch.tensor([vals], dtype=torch.float32, device=DEV)
    out = ref.bias_gelu(x, torch.zeros(len(vals), device=DEV)).cpu()[0].tolist()
    for v, y in zip(vals, out, strict=True):
        want = 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
        assert y == pytest.approx(want, rel=1e-5, abs=1e-6)


# one unit in the last place (relative) is 2^-7 in bf16 and 2^-10 in fp16. The fused kernel
# computes in fp32 and rounds once, so it must be within an ulp of the fp32 truth. Compiled, the
# cast rounds to nearest and one rounding beats the unfused ops' two on average (mean error about
# 0.82x theirs on these inputs, emulated with torch's own rounding); Triton 3.7's
# interpreter truncates fp32 -> bf16 instead (here 91% of bf16 outputs equalled the truncated
# truth), which can cost up to a full ulp, so that comparison is for the compiled kernel only.
@pytest.mark.parametrize("dtype, ulp", [(torch.bfloat16, 2**-7), (torch.float16, 2**-10)])
@pytest.mark.parametrize("shape", [(37, 101), (5, 1025)])
def test_half_precision_within_an_ulp(dtype, ulp, shape):
    x, b = _inputs(shape, dtype)
    truth = fused.bias_gelu_reference(x.float(), b.float())
    out = ref.bias_gelu(x, b)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), truth, rtol=ulp, atol=ulp)
    if not fused.INTERPRETED:
        err_fused = (out.float() - truth).abs().mean().item()
        err_unfused = (fused.bias_gelu_reference(x, b).float() - truth).abs().mean().item()
        assert err_fused < err_unfused


def test_non_contiguous_input():
    x, b = _inputs((64, 33), torch.float32)
    xt = x.t()  # (33, 64), not contiguous; bias has 64 entries
    bt = torch.linspace(-1, 1, 64, device=DEV)
    torch.testing.assert_close(ref.bias_gelu(xt, bt), fused.bias_gelu_reference(xt, bt), rtol=1e-5, atol=1e-6)


def test_compare_dict_on_small_sizes():
    r = fused.compare_bias_gelu(ref.bias_gelu, n_rows=3, n_cols=257, dtype="fp32", budget_s=0.2)
    assert r["interpreted"] is fused.INTERPRETED
    assert (r["n_rows"], r["n_cols"], r["dtype"]) == (3, 257, "float32")
    n = 3 * 257
    assert r["bytes_moved_fused"] == (2 * n + 257) * 4 and r["bytes_moved_unfused"] == (4 * n + 257) * 4
    assert r["unfused_ms"] > 0 and r["fused_ms"] > 0
    assert r["speedup"] == pytest.approx(r["unfused_ms"] / r["fused_ms"])
    assert r["fused_gbs"] == pytest.approx(r["bytes_moved_fused"] / (r["fused_ms"] * 1e-3) / 1e9)
    assert r["unfused_gbs"] == pytest.approx(r["bytes_moved_unfused"] / (r["unfused_ms"] * 1e-3) / 1e9)
    assert 0 <= r["max_abs_err"] < 1e-5
    lo, hi = r["fused_p20_p80_ms"]
    assert lo <= r["fused_ms"] <= hi


def test_compare_bf16_error_is_about_an_ulp():
    r = fused.compare_bias_gelu(ref.bias_gelu, n_rows=2, n_cols=300, dtype=torch.bfloat16, budget_s=0.2)
    assert r["dtype"] == "bfloat16" and r["bytes_moved_fused"] == (2 * 600 + 300) * 2
    assert 0 <= r["max_abs_err"] <= 0.1  # outputs up to ~5: a bf16 ulp there is 2^-5


@pytest.mark.parametrize("call, err, needle", [
    (lambda x, b: ref.bias_gelu(x, b[:-1]), ValueError, "bias must be 1-D with x's last dimension"),
    (lambda x, b: ref.bias_gelu(x, b.double()), ValueError, "must share dtype and device"),
    (lambda x, b: ref.bias_gelu(x.long(), b.long()), ValueError, "supports fp32, fp16 and bf16"),
    (lambda x, b: ref.bias_gelu(x, b, block_size=100), ValueError, "power of 2"),
    (lambda x, b: ref.bias_gelu(x.numpy() if DEV == "cpu" else 1, b), TypeError, "takes two tensors"),
    (lambda x, b: fused.compare_bias_gelu(ref.bias_gelu, n_rows=2, n_cols=8, dtype="int8"), ValueError, "dtype must be"),
])
def test_bad_input_one_line(call, err, needle):
    x, b = _inputs((4, 8), torch.float32)
    with pytest.raises(err) as info:
        call(x, b)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_without_triton_one_line(monkeypatch):
    """A fresh copy of the module on a machine without Triton: importable, reference works,
    the kernel raises one line saying what to install."""
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("fused_without_triton", fused.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert not mod.triton_available() and mod.INTERPRETED is False
    x, b = _inputs((2, 3), torch.float32)
    assert mod.bias_gelu_reference(x, b).shape == (2, 3)
    with pytest.raises(ImportError, match="pip install triton") as info:
        mod.compare_bias_gelu(lambda x, b, block_size: x, n_rows=2, n_cols=3)
    assert "\n" not in str(info.value)
    assert mod.bytes_moved(2, 3, 2) == {"bytes_moved_fused": 30, "bytes_moved_unfused": 54}


def test_gpu_check_script_runs_here(tmp_path, monkeypatch):
    """benchmarks/fused_check.py end to end at one tiny size (interpreted on a CPU)."""
    if not fused.INTERPRETED:
        pytest.skip("on a GPU run the script itself")
    spec = importlib.util.spec_from_file_location("fused_check", Path(fused.__file__).parents[2] / "benchmarks"
                                                  / "fused_check.py")
    fc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fc)
    monkeypatch.setattr(fc, "CPU_SIZES", [(2, 64)])
    out = tmp_path / "fused.json"
    assert fc.main(["--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["interpreted"] is True and r["dtype"] == "bfloat16" and len(r["results"]) == 1
    row = r["results"][0]
    assert row["copy_gbs"] > 0 and row["fused_over_copy_gbs"] == pytest.approx(row["fused_gbs"] / row["copy_gbs"])
    assert row["fused_fraction_of_datasheet_bw"] is None  # a CPU has no datasheet bandwidth here
    assert r["max_abs_err"] <= fc.BF16_TOL
