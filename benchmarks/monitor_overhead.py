"""How much does GpuMonitor, sampling at 10 Hz, slow a real training step?

A GPT-2-small-shaped model (transformers ``GPT2LMHeadModel`` from its default config,
random weights, 124M parameters) trains under bf16 autocast with fused AdamW, batch 16 x
1024 tokens on a GPU (a step of roughly 85 ms on an H200, from docs/reference.md's 194k
tokens/s). Blocks of ``--steps-per-block`` steps alternate without and with a running
monitor, in pairs whose order alternates (AB, BA, AB, ...) so that a slow drift of the
clocks or the temperature does not look like overhead. Each block is timed with
``perf_counter`` between two device syncs; the monitor is started before and stopped
after the timed window, so what is measured is the cost of sampling while training
(start-up and shutdown happen once per run in practice).

The result is the per-pair slowdown (monitored / plain - 1, in %) with its median, p20/p80
and mean +- standard error, beside the spread between plain blocks, which is the noise
the slowdown has to be read against. The goal is under 1%.

    python benchmarks/monitor_overhead.py --out results/monitor_overhead.json   # GPU, about 1 min
    python benchmarks/monitor_overhead.py --smoke                               # CPU, tiny model
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from utils.device.monitor import GpuMonitor
from utils.measure.timing import device_sync

GPU_SHAPE = {"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}  # GPT-2 small
SMOKE_SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 64,
               "bos_token_id": 511, "eos_token_id": 511}


def build(smoke: bool, batch: int, seq: int):
    """Model, optimizer, a fixed batch of random tokens, and one training step."""
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()  # config notices are not results

    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    shape = dict(SMOKE_SHAPE if smoke else GPU_SHAPE)
    if seq > shape["n_positions"]:
        raise SystemExit(f"--seq {seq} exceeds the model's {shape['n_positions']} positions")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**shape)).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    tokens = torch.randint(0, shape["vocab_size"], (batch, seq), device=device)

    def step() -> None:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    n_params = sum(p.numel() for p in model.parameters())
    shape["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    return step, device, shape, n_params


def timed_block(step, device, steps: int, monitor: GpuMonitor | None) -> tuple[float, dict | None]:
    """Seconds per step over one block, and the monitor's numbers for it."""
    device_sync(device)
    if monitor is not None:
        monitor.start()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    device_sync(device)
    elapsed = time.perf_counter() - t0
    info = None
    if monitor is not None:
        monitor.stop()
        s = next(iter(monitor.summary().values()))
        info = {"samples": s["samples"], "gaps": s["gaps"], "source": monitor.source,
                "tick_ms_mean": monitor.overhead["tick_ms_mean"],
                "util_gpu_pct_mean": (s.get("util_gpu_pct") or {}).get("mean"),
                "power_w_mean": (s.get("power_w") or {}).get("mean")}
    return elapsed / steps, info


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run(smoke: bool, pairs: int, steps_per_block: int, warmup_steps: int, interval_s: float,
        batch: int, seq: int) -> dict:
    import torch

    from utils.device.hardware import fingerprint
    from utils.measure.record import utils_hash

    step, device, shape, n_params = build(smoke, batch, seq)
    for _ in range(warmup_steps):
        step()
    device_sync(device)
    monitor = GpuMonitor(interval_s=interval_s)
    blocks = []
    for pair in range(pairs):
        order = ("plain", "monitored") if pair % 2 == 0 else ("monitored", "plain")
        times = {}
        for kind in order:
            s_per_step, info = timed_block(step, device, steps_per_block, monitor if kind == "monitored" else None)
            times[kind] = s_per_step
            blocks.append({"pair": pair, "kind": kind, "ms_per_step": s_per_step * 1e3, "monitor": info})
        print(f"pair {pair}: plain {times['plain'] * 1e3:.2f} ms/step, monitored {times['monitored'] * 1e3:.2f} "
              f"ms/step ({100 * (times['monitored'] / times['plain'] - 1):+.2f}%)", flush=True)
    plain = [b["ms_per_step"] for b in blocks if b["kind"] == "plain"]
    mon = [b["ms_per_step"] for b in blocks if b["kind"] == "monitored"]
    slowdown = [100 * (m / p - 1) for p, m in zip(plain, mon, strict=True)]
    infos = [b["monitor"] for b in blocks if b["monitor"]]
    tokens_per_step = batch * seq
    result = {
        "benchmark": "monitor_overhead",
        "smoke": smoke,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "workload": {"model": "GPT2LMHeadModel, random weights", "shape": shape, "n_params": n_params,
                     "batch": batch, "seq": seq, "autocast": "bfloat16", "optimizer": "AdamW" + (
                         " (fused)" if device.type == "cuda" else ""), "device": str(device),
                     "torch": torch.__version__},
        "protocol": {"pairs": pairs, "steps_per_block": steps_per_block, "warmup_steps": warmup_steps,
                     "interval_s": interval_s, "order": "pairs alternate AB / BA",
                     "timing": "perf_counter between device syncs, per block"},
        "plain_ms_per_step": {"median": statistics.median(plain), "min": min(plain), "max": max(plain)},
        "monitored_ms_per_step": {"median": statistics.median(mon), "min": min(mon), "max": max(mon)},
        "plain_block_spread_pct": 100 * statistics.stdev(plain) / statistics.fmean(plain) if len(plain) > 1 else None,
        "slowdown_pct": {
            "median": statistics.median(slowdown), "p20": pct(slowdown, 0.2), "p80": pct(slowdown, 0.8),
            "mean": statistics.fmean(slowdown),
            "stderr": statistics.stdev(slowdown) / math.sqrt(len(slowdown)) if len(slowdown) > 1 else None,
            "per_pair": slowdown,
        },
        "tokens_per_s_plain": tokens_per_step / (statistics.median(plain) / 1e3),
        "monitor": {"source": infos[0]["source"] if infos else None,
                    "reason": monitor.reason,
                    "samples_per_block_median": statistics.median(i["samples"] for i in infos) if infos else None,
                    "gaps_total": sum(i["gaps"] for i in infos),
                    "tick_ms_mean": statistics.fmean(i["tick_ms_mean"] for i in infos if i["tick_ms_mean"]) if infos else None,
                    "util_gpu_pct_mean": statistics.fmean(i["util_gpu_pct_mean"] for i in infos)
                    if infos and all(i["util_gpu_pct_mean"] is not None for i in infos) else None,
                    "power_w_mean": statistics.fmean(i["power_w_mean"] for i in infos)
                    if infos and all(i["power_w_mean"] is not None for i in infos) else None},
        "goal": "median slowdown < 1%",
        "fingerprint": fingerprint(),
        "utils_sha256": utils_hash(),
    }
    result["goal_met"] = result["slowdown_pct"]["median"] < 1.0
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU, a few seconds")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--pairs", type=int, help="plain/monitored block pairs (default 12; smoke 2)")
    ap.add_argument("--steps-per-block", type=int, help="training steps per block (default 10; smoke 3)")
    ap.add_argument("--warmup-steps", type=int, help="untimed steps first (default 5; smoke 2)")
    ap.add_argument("--interval-s", type=float, default=0.1, help="monitor interval (default 0.1 s = 10 Hz)")
    ap.add_argument("--batch", type=int, help="sequences per step (default 16; smoke 2)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default 1024; smoke 64)")
    a = ap.parse_args(argv)
    import torch

    smoke = a.smoke
    if not smoke and not torch.cuda.is_available():
        print("no CUDA GPU here: running the --smoke configuration on the CPU", flush=True)
        smoke = True
    d = {"pairs": 2, "steps": 3, "warmup": 2, "batch": 2, "seq": 64} if smoke else \
        {"pairs": 12, "steps": 10, "warmup": 5, "batch": 16, "seq": 1024}
    result = run(smoke, a.pairs or d["pairs"], a.steps_per_block or d["steps"], a.warmup_steps or d["warmup"],
                 a.interval_s, a.batch or d["batch"], a.seq or d["seq"])
    s = result["slowdown_pct"]
    print(f"slowdown with GpuMonitor at {1 / a.interval_s:g} Hz: median {s['median']:+.2f}% "
          f"(p20 {s['p20']:+.2f}%, p80 {s['p80']:+.2f}%; mean {s['mean']:+.2f}% +- {s['stderr'] or 0:.2f}); "
          f"plain blocks vary by {result['plain_block_spread_pct'] or 0:.2f}%; "
          f"{result['plain_ms_per_step']['median']:.1f} ms/step plain; monitor source {result['monitor']['source']}, "
          f"{result['monitor']['samples_per_block_median']} samples per block, {result['monitor']['gaps_total']} gaps")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
