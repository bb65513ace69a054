"""Phase 2 bonus on a GPU: the fused Triton bias + GELU kernel against the unfused PyTorch ops.

    python benchmarks/fused_check.py --out results/fused_check.json      # CUDA GPU, bf16, about a minute
    python benchmarks/fused_check.py --out /tmp/fused.json               # CPU: tiny sizes, Triton's interpreter

For each ``(n_rows, n_cols)`` and block size, ``utils.train.fused.compare_bias_gelu`` times the course's
kernel (``grader/fused_reference.py``) and the unfused ops (``utils.measure.timing.benchmark``: CUDA events, L2 flush, repeats) and reports the speedup
and the fused kernel's achieved bandwidth (bytes it must move, ``2 N e + C e``, over its median
time). Beside them: the same bandwidth as a fraction of the datasheet figure in
``utils.device.hardware`` (H200: 4800 GB/s), and a measured ceiling, a device-to-device copy of the
same tensor (``out.copy_(x)``, which moves exactly the fused kernel's ``2 N e`` bytes): the
fused kernel cannot beat the copy by much, and how close it gets says how good the kernel is.
The byte counts say the speedup can approach 2x on tensors much larger than L2 (an estimate;
this script measures it). Rows of GPT-2 small's MLP (width 3072) at 1k to 64k tokens, plus
one wide row (Llama-1.1B's 5632).

Without CUDA the sizes are tiny and the kernel runs under Triton's interpreter: the output
says ``interpreted`` and its times are not a GPU's. Exits 1 if a fused result disagrees with
the unfused ops by more than bf16 allows.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "fused_check.py"
GPU_SIZES = [(1024, 3072), (4096, 3072), (16384, 3072), (65536, 3072), (16384, 5632)]
GPU_BLOCKS = (1024, 4096)
CPU_SIZES = [(4, 256), (3, 1000)]
CPU_BLOCKS = (1024,)
# max |fused - unfused| allowed: inputs x + bias ~ N(0, 2) reach about 12 over 2e8 elements, where a bf16
# ulp is 0.0625 and the two versions may differ by an ulp or two (one rounding vs two); a wrong
# kernel is off by O(1)
BF16_TOL = 0.25


def copy_ceiling(n_rows: int, n_cols: int, device, dtype) -> dict:
    """Median time and bandwidth of a copy of the same shape and dtype: reads N e, writes N e."""
    from utils.serving.inference import measure_copy_bandwidth

    c = measure_copy_bandwidth(n_rows * n_cols, device, budget_s=2.0, dtype=dtype)
    return {"copy_ms": c["time"].median_ms, "copy_gbs": c["gbs"]}


def run(out: Path) -> dict:
    import torch

    from grader.fused_reference import bias_gelu  # the course's kernel (instructors' repository only)
    from utils.device.hardware import current_spec, fingerprint, spec_dict
    from utils.measure.record import utils_hash
    from utils.train import fused

    fused._require_triton()
    interpreted = fused.INTERPRETED
    device = torch.device("cpu" if interpreted else "cuda")
    spec = current_spec(0)
    sizes, blocks = (CPU_SIZES, CPU_BLOCKS) if interpreted else (GPU_SIZES, GPU_BLOCKS)
    rows = []
    for n_rows, n_cols in sizes:
        ceiling = copy_ceiling(n_rows, n_cols, device, torch.bfloat16)
        for block in blocks:
            r = fused.compare_bias_gelu(bias_gelu, n_rows=n_rows, n_cols=n_cols, dtype="bf16", device=device, block_size=block,
                                        budget_s=0.5 if interpreted else 3.0)
            r.update(ceiling)
            r["fused_over_copy_gbs"] = r["fused_gbs"] / r["copy_gbs"]
            bw = spec.bandwidth_gbs
            r["fused_fraction_of_datasheet_bw"] = r["fused_gbs"] / bw if bw and not interpreted else None
            rows.append(r)
            print(f"{n_rows:6d} x {n_cols:5d} block {block:5d}: unfused {r['unfused_ms']:.4f} ms, fused "
                  f"{r['fused_ms']:.4f} ms, speedup {r['speedup']:.2f}x, fused {r['fused_gbs']:.0f} GB/s "
                  f"(copy {r['copy_gbs']:.0f} GB/s), max |err| {r['max_abs_err']:.3g}", flush=True)
    import triton

    return {
        "interpreted": interpreted, "dtype": "bfloat16", "device": str(device),
        "datasheet_bandwidth_gbs": spec.bandwidth_gbs, "spec": spec_dict(spec),
        "note": "times under Triton's interpreter are not GPU times" if interpreted else
                "fused_gbs = (2 N e + C e) / fused median time; copy_gbs = 2 N e / copy median time",
        "results": rows,
        "best_speedup": max(r["speedup"] for r in rows),
        "max_abs_err": max(r["max_abs_err"] for r in rows),
        "versions": {"torch": torch.__version__, "triton": triton.__version__},
        "fingerprint": fingerprint(0), "utils_sha256": utils_hash(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = p.parse_args(argv)
    if not args.out.parent.is_dir():
        print(f"{PROG}: error: the folder of --out ({args.out.parent}) does not exist; create it first", file=sys.stderr)
        return 2
    from utils.train.fused import TritonUnavailable

    try:
        res = run(args.out)
    except TritonUnavailable as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: res[k] for k in ("interpreted", "best_speedup", "max_abs_err", "datasheet_bandwidth_gbs")}))
    if res["max_abs_err"] > BF16_TOL:
        print(f"{PROG}: error: fused and unfused disagree by {res['max_abs_err']:.3g} (> {BF16_TOL})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
