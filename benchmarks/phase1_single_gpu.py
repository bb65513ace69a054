"""Phase 1 on one GPU: the naive loop, the fixes one at a time, MFU, and LoRA/QLoRA memory recipes.

    python benchmarks/phase1_single_gpu.py --out DIR            # on a GPU: GPT-2-small + Llama-1.1B
    python benchmarks/phase1_single_gpu.py --out DIR --smoke    # on a CPU: tiny presets, plumbing only

Writes ``DIR/phase1_loops.json`` (the matmul ceiling measured first, ``utils.measure.matmul_ceiling``; each
loop variant: tokens/s, step times, MFU against the datasheet peak and against that ceiling, GPU
utilization, peak memory; the profiler's summary of the naive and optimized loops) and
``DIR/phase1_finetune.json`` (each LoRA/QLoRA recipe: peak memory split into weights,
optimizer, gradients and activations, tokens/s, whether every adapter got a gradient).
Each file is rewritten after every variant, so a run cut short keeps what it measured.
A variant that fails is recorded with its error and the run goes on.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
import traceback
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def _save(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))


def ladder(smoke: bool):
    """(name, LoopConfig) pairs: each adds one fix to the one before, then side variants."""
    from utils.train.training import best_precision, naive_config, with_changes

    b0, b1, seq = (2, 8, 64) if smoke else (4, 32, 1024)
    prec = best_precision()
    naive = naive_config(b0, seq)
    amp = with_changes(naive, precision=prec)
    feed = with_changes(amp, num_workers=2, pin_memory=True, non_blocking=True, sync_every_step=False)
    big = with_changes(feed, batch_size=b1)
    fused = with_changes(big, fused_adamw=True)
    padded = with_changes(fused, pad_vocab_to=64)
    compiled = with_changes(padded, compile_mode="default")
    return [("naive", naive), (f"+{prec} autocast", amp), ("+workers, pinned, non_blocking, no sync", feed),
            (f"+batch {b1}", big), ("+fused AdamW", fused), ("+vocab padded to 64", padded),
            ("+torch.compile (optimized)", compiled),
            (f"eager, batch {b1 // 4} x accum 4", with_changes(padded, batch_size=b1 // 4, grad_accum=4)),
            ("eager + activation checkpointing", with_changes(padded, checkpointing=True)),
            ("optimized, dropout off", with_changes(compiled, dropout=0.0)),
            (f"optimized, dropout off, batch {2 * b1}", with_changes(compiled, dropout=0.0, batch_size=2 * b1)),
            # the MFU push: CUDA graphs remove the remaining launch gaps; max-autotune
            # benchmarks Triton matmul/attention templates against cuBLAS at compile time (minutes)
            (f"optimized, dropout off, batch {2 * b1}, CUDA graphs",
             with_changes(compiled, dropout=0.0, batch_size=2 * b1, compile_mode="reduce-overhead")),
            (f"optimized, dropout off, batch {2 * b1}, max-autotune",
             with_changes(compiled, dropout=0.0, batch_size=2 * b1, compile_mode="max-autotune-no-cudagraphs"))]


def run_loops(out: Path, smoke: bool, steps: int, only: tuple = ()) -> dict:
    import torch

    from utils.diagnosis.profiling import profile_steps
    from utils.measure import matmul_ceiling
    from utils.train.training import best_precision, build_loop, measure_loop

    preset = "gpt2-tiny" if smoke else "gpt2-small"
    ceiling = matmul_ceiling.measure(best_precision())  # MFU is also read against what the card's matmuls reach
    print(f"matmul ceiling: {ceiling}", flush=True)
    res = {"preset": preset, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "matmul_ceiling": asdict(ceiling), "variants": [], "profiles": {}}
    for name, cfg in ladder(smoke):
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        row = {"name": name, "config": cfg.to_dict()}
        try:
            loop = build_loop(preset, cfg)
            row.update(measure_loop(loop, steps=steps, warmup_steps=3))
            row["of_matmul_ceiling"] = matmul_ceiling.fraction(row.get("achieved_tflops"), ceiling)
            if name == "naive" or name.endswith("(optimized)"):
                s = profile_steps(loop.step, steps=5, warmup=2, wait=1)
                res["profiles"][name] = {k: v for k, v in s.to_dict().items() if k != "top"}
                res["profiles"][name]["top"] = [asdict(t) for t in s.top]
                print(s, flush=True)
            del loop
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        row["wall_s"] = time.perf_counter() - t0
        res["variants"].append(row)
        print(json.dumps({k: row.get(k) for k in ("name", "tokens_per_s", "mfu", "of_matmul_ceiling", "util_gpu_pct",
                                                 "peak_allocated_gib",
                                                 "error", "wall_s")}), flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _save(out / "phase1_loops.json", res)
    base = res["variants"][0].get("tokens_per_s") if res["variants"] and res["variants"][0]["name"] == "naive" else None
    for row in res["variants"]:
        if base and row.get("tokens_per_s"):
            row["speedup_vs_naive"] = row["tokens_per_s"] / base
    _save(out / "phase1_loops.json", res)
    return res


def run_finetune(out: Path, smoke: bool, only: tuple = ()) -> dict:
    import torch

    from utils.train.training import RECIPES, bitsandbytes_usable, measure_finetune

    preset = "llama-tiny" if smoke else "llama-1.1b"
    batch, seq = (2, 64) if smoke else (8, 512)
    ok, why = bitsandbytes_usable()
    res = {"preset": preset, "batch_size": batch, "seq_len": seq, "bitsandbytes": why, "recipes": {}}
    plan = [(name, r, batch, seq) for name, r in RECIPES.items() if not only or name in only]
    plan += [] if only else [("qlora_lean_seq1024_b4", RECIPES["qlora_lean"], 4 if not smoke else 1, 1024 if not smoke else 128),
             ("lora_bf16_lean_seq1024_b4", RECIPES["lora_bf16_lean"], 4 if not smoke else 1, 1024 if not smoke else 128)]
    for name, recipe, b, s in plan:
        t0 = time.perf_counter()
        try:
            row = measure_finetune(preset, recipe, b, s, steps=3)
        except Exception as exc:
            row = {"error": f"{type(exc).__name__}: {exc}"[:2000], "recipe": asdict(recipe)}
            traceback.print_exc()
        row["wall_s"] = time.perf_counter() - t0
        res["recipes"][name] = row
        print(name, json.dumps({k: row.get(k) for k in ("peak_gib", "weights_gib", "optimizer_gib", "activations_gib",
                                                        "saved_activations_gib", "tokens_per_s", "lora_grads_ok",
                                                        "quant", "note", "error", "wall_s")}), flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _save(out / "phase1_finetune.json", res)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="tiny presets on the CPU (plumbing only)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--only", choices=("loops", "finetune"), default=None)
    p.add_argument("--names", nargs="*", default=(), help="run only these variants / recipes (by name)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.only in (None, "finetune"):
        run_finetune(a.out, a.smoke, tuple(a.names))
    if a.only in (None, "loops"):
        run_loops(a.out, a.smoke, a.steps, tuple(a.names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
