"""Profile a naive and a fixed training loop with ``utils.diagnosis.profiling`` and compare them.

(a) naive: batch 8, a ``.item()`` every step, ``num_workers=0``, pageable host memory,
    a Dataset that spends ``per_sample_us`` of CPU per sample (a stand-in for decoding and
    augmentation: a spin that holds the GIL, as Python-level transforms do).
(b) fixed: batch 512, DataLoader workers, ``pin_memory`` + ``non_blocking`` copies, the loss
    summed on the GPU and read once at the end (no per-step sync).

Both train the same fp32 MLP (3x32x32 inputs, hidden 6144): at batch 512 one step is
about 0.4 TFLOP of fp32 matmuls (6 x params x batch), several ms on an H200 (an estimate from the
67 TFLOP/s fp32 datasheet peak), longer than 12 workers take to prepare the next batch, so
the fixed loop should be GPU-bound; the naive one cannot be. Each loop is profiled (3 warm-up +
10 recorded steps) and timed without the profiler (samples/s, CUDA synchronised).

    python benchmarks/profiling_check.py --out out/profiling_check.json      # CUDA GPU, < 2 min
    python benchmarks/profiling_check.py --smoke --out out/profiling_check_smoke.json  # CPU

``checks`` in the JSON are structural: on a GPU they confirm that the event names this
module looks for (launches, syncs, pageable/pinned copies, kernels) exist in this torch's
traces; the exit status is 1 when one fails. ``expectations`` (fixed loop faster, less idle)
are reported, not enforced.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from utils.device import hardware
from utils.diagnosis import profiling


@dataclass(frozen=True)
class Config:
    in_features: int = 3 * 32 * 32
    hidden: int = 6144
    layers: int = 4  # hidden layers
    classes: int = 10
    per_sample_us: float = 50.0
    naive_batch: int = 8
    fixed_batch: int = 512
    workers: int = 12
    warmup: int = 3
    steps: int = 10  # profiled
    timed_steps: int = 30  # timed without the profiler


SMOKE = Config(in_features=256, hidden=128, layers=2, per_sample_us=20.0, naive_batch=4, fixed_batch=32,
               workers=2, warmup=1, steps=3, timed_steps=5)


class SpinDataset(torch.utils.data.Dataset):
    """Synthetic images from a small pool; each sample costs ``per_sample_us`` of CPU."""

    def __init__(self, cfg: Config, length: int = 10_000_000):
        g = torch.Generator().manual_seed(0)
        self.pool = torch.randn(64, cfg.in_features, generator=g)
        self.labels = torch.randint(0, cfg.classes, (64,), generator=g)
        self.per_sample_s = cfg.per_sample_us / 1e6
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        end = time.perf_counter() + self.per_sample_s
        while time.perf_counter() < end:
            pass
        j = i % 64
        return self.pool[j].clone(), self.labels[j]


def make_model(cfg: Config, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    dims = [cfg.in_features] + [cfg.hidden] * cfg.layers
    mods: list[torch.nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        mods += [torch.nn.Linear(a, b, device=device), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(dims[-1], cfg.classes, device=device))
    return torch.nn.Sequential(*mods)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def naive_loop(cfg: Config, device: str):
    model = make_model(cfg, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    it = iter(torch.utils.data.DataLoader(SpinDataset(cfg), batch_size=cfg.naive_batch, num_workers=0))
    losses = []

    def step():
        x, y = next(it)
        x, y = x.to(device), y.to(device)  # pageable memory, a blocking copy
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a host sync every step
    return step, cfg.naive_batch, lambda: None


def fixed_loop(cfg: Config, device: str):
    model = make_model(cfg, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cuda = device == "cuda"
    loader = torch.utils.data.DataLoader(SpinDataset(cfg), batch_size=cfg.fixed_batch, num_workers=cfg.workers,
                                         pin_memory=cuda, persistent_workers=True, prefetch_factor=4)
    it = iter(loader)
    total = torch.zeros((), device=device)

    def step():
        nonlocal total
        x, y = next(it)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = total + loss.detach()  # stays on the GPU; read once at the end

    def close():
        nonlocal it
        float(total)
        del it
    return step, cfg.fixed_batch, close


def run_one(name: str, build, cfg: Config, device: str, trace_dir: Path | None) -> dict:
    step, batch, close = build(cfg, device)
    trace = trace_dir / f"{name}.json.gz" if trace_dir else None
    summary = profiling.profile_steps(step, steps=cfg.steps, warmup=cfg.warmup, wait=1,
                                      cuda=device == "cuda", trace_path=trace)
    for _ in range(cfg.warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(cfg.timed_steps):
        step()
    _sync(device)
    dt = time.perf_counter() - t0
    close()
    print(f"\n== {name} loop: batch {batch}, {cfg.timed_steps * batch / dt:,.0f} samples/s unprofiled ==")
    print(summary)
    return {"batch": batch, "samples_per_s": cfg.timed_steps * batch / dt, "step_ms_unprofiled": dt / cfg.timed_steps * 1e3,
            "summary": summary.to_dict()}


def checks(res: dict, device: str) -> tuple[dict, dict]:
    n, f = res["naive"]["summary"], res["fixed"]["summary"]
    # the per-step .item() is one sync; on CUDA each pageable host-to-device copy also
    # synchronises the stream (cudaMemcpyAsync from pageable memory: 2 per step here, seen
    # on one H200 with torch 2.11), so the naive loop shows 1 + its pageable copies
    pageable = n["h2d_copies_by_source"].get("Pageable", 0) / n["steps"] if device == "cuda" else 0
    c = {"naive_syncs_per_step": n["host_syncs_per_step"] == 1 + pageable,
         "fixed_no_sync_per_step": f["host_syncs_per_step"] == 0,
         "loader_wait_seen": n["loader_wait_ms_per_step"] > 0 and f["loader_wait_ms_per_step"] > 0}
    if device == "cuda":
        c.update({"kernels_seen": bool(n["top"]) and n["gpu_idle_fraction"] is not None,
                  "launches_seen": n["launches_per_step"] > 0,
                  "naive_pageable_copies": n["h2d_copies_by_source"].get("Pageable", 0) >= 2 * n["steps"],
                  "fixed_pinned_copies": f["h2d_copies_by_source"].get("Pinned", 0) >= 2 * f["steps"]})
    e = {"fixed_faster": res["fixed"]["samples_per_s"] > res["naive"]["samples_per_s"],
         "naive_host_side_diagnosis": n["diagnosis"] not in ("compute-bound", "memory-bound")}
    if device == "cuda":
        e["fixed_less_idle"] = f["gpu_idle_fraction"] < n["gpu_idle_fraction"]
        e["fixed_gpu_bound"] = f["diagnosis"] in ("compute-bound", "memory-bound")
    return c, e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU CI); without it a CUDA GPU is required")
    ap.add_argument("--traces", help="folder for the two Chrome traces (.json.gz), optional")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("profiling_check: no CUDA GPU visible; run with --smoke on a CPU", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    cfg = SMOKE if args.smoke else Config()
    if not args.smoke:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 4)
        cfg = Config(workers=max(1, min(cfg.workers, cpus - 2)))
    trace_dir = Path(args.traces) if args.traces else None
    if trace_dir:
        trace_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = {name: run_one(name, build, cfg, device, trace_dir) for name, build in (("naive", naive_loop), ("fixed", fixed_loop))}
    c, e = checks(res, device)
    out = {"schema": "gpulab.profiling_check/1", "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "torch": torch.__version__, "device": device, "smoke": args.smoke, "fingerprint": hardware.fingerprint(),
           "config": asdict(cfg), **res,
           "speedup": res["fixed"]["samples_per_s"] / res["naive"]["samples_per_s"],
           "checks": c, "expectations": e, "wall_s": time.perf_counter() - t0}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nspeedup fixed/naive {out['speedup']:.1f}x; checks {c}; expectations {e}; wrote {path} in {out['wall_s']:.0f} s")
    return 0 if all(c.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
