"""Does ``utils.measure.timing.benchmark`` agree with ``triton.testing.do_bench``?

Both time the same functions: a bf16 matmul (n x n x n, three sizes) and a
device-to-device copy (``dst.copy_(src)``, three sizes), both flushing L2 between runs.
For each case the script reports both medians and their difference in % (the goal is
within 3%), the matmul's TFLOP/s (2 n^3 per run) and the copy's bandwidth (bytes read
plus written), each as a fraction of the datasheet peak in ``utils.device.hardware`` (bf16 dense
TFLOP/s; memory bandwidth). Which of the two tools runs first alternates between cases.

    python benchmarks/timing_agreement.py --out results/timing_agreement.json   # GPU, under a minute
    python benchmarks/timing_agreement.py --smoke                               # CPU, small sizes

Without CUDA or without triton, do_bench is skipped and the output says so; the
utils.measure.timing numbers are still reported.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from utils.device.hardware import CPU_SPEC, current_spec, fingerprint, spec_dict
from utils.measure.record import utils_hash
from utils.measure.timing import benchmark
from utils.units import gb_per_s, tflop_per_s

MIB = 2**20
GPU_SIZES = {"matmul_n": (2048, 4096, 8192), "copy_bytes": (64 * MIB, 256 * MIB, 1024 * MIB)}
SMOKE_SIZES = {"matmul_n": (64, 128, 256), "copy_bytes": (1 * MIB, 4 * MIB, 16 * MIB)}
GOAL_PCT = 3.0


def do_bench_reason(device) -> str:
    """Why triton's do_bench cannot run here ('' when it can)."""
    if device.type != "cuda":
        return "no CUDA GPU: triton.testing.do_bench needs one, so it was skipped"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: triton.testing.do_bench was skipped"
    return ""


def cases(device, sizes: dict):
    """(name, kind, size, fn, work) for every case; work is FLOPs or bytes moved."""
    import torch

    for n in sizes["matmul_n"]:
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        yield f"matmul_bf16_{n}", "matmul", n, (lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)), 2 * n**3
        del a, b, c
    for nbytes in sizes["copy_bytes"]:
        src = torch.randn(nbytes // 4, device=device, dtype=torch.float32)
        dst = torch.empty_like(src)
        yield f"copy_{nbytes // MIB}MiB", "copy", nbytes, (lambda s=src, d=dst: d.copy_(s)), 2 * nbytes
        del src, dst


def run(smoke: bool, budget_s: float) -> dict:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    reason = do_bench_reason(device)
    do_bench = None
    triton_version = None
    if not reason:
        import triton
        from triton.testing import do_bench

        triton_version = triton.__version__
    spec = current_spec() if device.type == "cuda" else CPU_SPEC
    peak_tflops, peak_gbs = spec.bf16_tflops, spec.bandwidth_gbs
    sizes = SMOKE_SIZES if smoke else GPU_SIZES
    rows = []
    for i, (name, kind, size, fn, work) in enumerate(cases(device, sizes)):
        ours = theirs = None
        order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
        for who in order:
            if who == "ours":
                ours = benchmark(fn, warmup=5, min_runs=10, max_runs=100, target_rse=0.001, budget_s=budget_s,
                                 flush_l2=True, device=device)
            elif do_bench is not None:
                theirs = do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        row = {"case": name, "kind": kind, "size": size,
               "utils_timing": {"median_ms": ours.median_ms, "p20_ms": ours.p20_ms, "p80_ms": ours.p80_ms,
                                "runs": ours.runs, "rse": ours.rse, "stopped": ours.stopped,
                                "method": ours.method, "l2_flushed": ours.l2_flushed},
               "do_bench": None, "diff_pct": None}
        if theirs is not None:
            med, p20, p80 = theirs
            row["do_bench"] = {"median_ms": med, "p20_ms": p20, "p80_ms": p80}
            row["diff_pct"] = 100 * (ours.median_ms - med) / med
        if kind == "matmul":
            row["tflops"] = tflop_per_s(work, ours.median_ms)
            row["fraction_of_peak"] = row["tflops"] / peak_tflops if peak_tflops else None
        else:
            row["bandwidth_gbs"] = gb_per_s(work, ours.median_ms)
            row["fraction_of_peak"] = row["bandwidth_gbs"] / peak_gbs if peak_gbs else None
        rows.append(row)
        diff = "n/a" if row["diff_pct"] is None else f"{row['diff_pct']:+.2f}%"
        theirs_ms = "skipped" if theirs is None else f"{theirs[0]:.4f} ms"
        rate = f"{row['tflops']:.1f} TFLOP/s" if kind == "matmul" else f"{row['bandwidth_gbs']:.0f} GB/s"
        frac = "" if row["fraction_of_peak"] is None else f" ({100 * row['fraction_of_peak']:.0f}% of datasheet)"
        print(f"{name:>18}: utils.measure.timing {ours.median_ms:.4f} ms ({ours.runs} runs), do_bench {theirs_ms}, "
              f"diff {diff}; {rate}{frac}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    diffs = [abs(r["diff_pct"]) for r in rows if r["diff_pct"] is not None]
    matmuls = [r for r in rows if r["kind"] == "matmul"]
    copies = [r for r in rows if r["kind"] == "copy"]
    best_mm = max(matmuls, key=lambda r: r["tflops"])
    best_cp = max(copies, key=lambda r: r["bandwidth_gbs"])
    return {
        "benchmark": "timing_agreement",
        "smoke": smoke,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "device": str(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "do_bench_skipped": reason or None,
        "protocol": {"utils_timing": f"warmup 5, 10-100 runs, rse target 0.1%, budget {budget_s} s, L2 flush",
                     "do_bench": "warmup=25 ms, rep=100 ms, quantiles 0.5/0.2/0.8 (flushes L2)",
                     "order": "alternates per case"},
        "spec": spec_dict(spec),
        "cases": rows,
        "summary": {
            "max_abs_diff_pct": max(diffs) if diffs else None,
            "goal_pct": GOAL_PCT,
            "within_goal": all(d <= GOAL_PCT for d in diffs) if diffs else None,
            "matmul_best": {"case": best_mm["case"], "tflops": best_mm["tflops"],
                            "fraction_of_peak": best_mm["fraction_of_peak"]},
            "copy_best": {"case": best_cp["case"], "bandwidth_gbs": best_cp["bandwidth_gbs"],
                          "fraction_of_peak": best_cp["fraction_of_peak"]},
        },
        "fingerprint": fingerprint(),
        "utils_sha256": utils_hash(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="small sizes on the CPU, without do_bench")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--budget-s", type=float, default=2.0, help="utils.measure.timing budget per case (default 2 s)")
    a = ap.parse_args(argv)
    import torch

    smoke = a.smoke
    if not smoke and not torch.cuda.is_available():
        print("no CUDA GPU here: running the --smoke sizes on the CPU", flush=True)
        smoke = True
    result = run(smoke, a.budget_s)
    s = result["summary"]
    if result["do_bench_skipped"]:
        print(result["do_bench_skipped"])
    else:
        print(f"largest |difference| {s['max_abs_diff_pct']:.2f}% (goal {GOAL_PCT}%): "
              f"{'met' if s['within_goal'] else 'NOT met'}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
