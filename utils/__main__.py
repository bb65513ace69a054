"""``python -m utils``: a device report for a person, or ``--json`` for machines.

What it answers in the learner's first minute: which device will the labs use, what are
its datasheet ceilings, does NVML answer (and why not), which torch, which platform, and
whether the notebooks will run in smoke mode.
"""
from __future__ import annotations

import argparse
import json
import sys

from utils.course import env
from utils.device import hardware, nvml


def report() -> dict:
    """The device report as a dict (the ``--json`` output)."""
    spec = hardware.current_spec()
    fp = hardware.fingerprint()
    st = nvml.status()
    peaks = {d: spec.peak_tflops(d) for d in ("bf16", "fp16", "tf32", "fp32")}
    device = {
        "name": fp.get("name") if fp.get("kind") == "gpu" else spec.name,
        "kind": spec.kind,
        "spec_row": spec.name,
        "memory_gib": fp.get("memory_gib"),
        "peak_tflops": peaks,
        "bandwidth_gbs": spec.bandwidth_gbs,
        "ridge_bf16_flop_per_byte": spec.ridge_flop_per_byte("bf16"),
        "spec_source": spec.source,
        "fingerprint": fp,
    }
    if spec.kind == "cpu":
        device["cpu_name"] = fp.get("name")
        device["cpu_threads"] = fp.get("cpu_threads")
    return {
        "device": device,
        "nvml": {"available": st.available, "reason": st.reason or None, "driver": st.driver or None},
        "torch": {"version": fp.get("torch"), "cuda": fp.get("cuda")},
        "environment": env.describe(),
        "smoke": env.smoke_mode(),
    }


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = f"{value:,.1f}"
    return f"{value} {unit}".strip()


def render(rep: dict) -> str:
    """The report as a short table for a person."""
    d, e = rep["device"], rep["environment"]
    peaks = d["peak_tflops"]
    rows = [
        ("device", f"{d['name']} ({d['kind']})"),
        ("spec row", f"{d['spec_row']}: {d['spec_source']}"),
        ("memory", _fmt(d["memory_gib"], "GiB")),
        ("peak bf16 / fp16", f"{_fmt(peaks['bf16'])} / {_fmt(peaks['fp16'])} TFLOP/s (datasheet, dense)"),
        ("peak tf32 / fp32", f"{_fmt(peaks['tf32'])} / {_fmt(peaks['fp32'])} TFLOP/s (datasheet, dense)"),
        ("bandwidth", f"{_fmt(d['bandwidth_gbs'], 'GB/s')} (datasheet)"),
        ("ridge (bf16)", _fmt(d["ridge_bf16_flop_per_byte"], "FLOP/byte")),
        ("NVML", "available, driver " + str(rep["nvml"]["driver"]) if rep["nvml"]["available"] else f"unavailable: {rep['nvml']['reason']}"),
        ("torch", f"{rep['torch']['version']} (CUDA {rep['torch']['cuda'] or 'none'})"),
        ("platform", f"{e['platform']}, Python {e['python']}"),
        ("size tier", e["tier"]),
        ("smoke mode", "yes: tiny sizes, same code path" if rep["smoke"] else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    if d["kind"] == "cpu":
        lines.append("")
        lines.append("No CUDA GPU: the labs run in smoke mode. For a GPU: Colab > Runtime > Change runtime type > T4 GPU;")
        lines.append("Kaggle > Settings > Accelerator > GPU T4 x2.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        rep = report()
    except Exception as exc:  # a broken driver or torch install: say so in one line
        print(f"python -m utils: could not read the device ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(json.dumps(rep, indent=2, default=str) if args.json else render(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
