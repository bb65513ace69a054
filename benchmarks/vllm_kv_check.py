"""Lab 03's project on a real engine: vLLM serves a preset, and what it allocated is put
beside lab 03's reference calculator (the blocks, tokens and concurrency) and beside the
memory the server really holds (NVML on a GPU, resident memory on a CPU).

    python benchmarks/vllm_kv_check.py --preset llama-1.1b --max-model-len 2036 --out OUT.json

One JSON row per configuration (``--kv-cache-dtype fp8`` adds an fp8-cache row). The engine's
log is kept beside the JSON. A missing vLLM or a server that dies is one line, exit 1.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB03 = ROOT / "grader" / "source" / "03_inference_serving" / "03_inference_serving.ipynb"


def reference_calculator():
    """Lab 03's reference ``kv_cache_calculator`` (the solution cell of the source notebook)."""
    nb = json.loads(LAB03.read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "kv_calculator_answer")
    ns: dict = {"math": math}
    exec(compile("".join(cell["source"]).split("\nEXAMPLES")[0], "kv_calculator_answer", "exec"), ns)  # noqa: S102
    return ns["kv_cache_calculator"]


def check(preset: str, max_model_len: int, out_dir: Path, *, kv_cache_dtype: str | None = None,
          gpu_memory_fraction: float = 0.5) -> dict:
    from utils.serving import inference, serve

    model_dir = serve.build_model_dir(preset, serve.default_dtype(None, "vllm"))
    used_before = inference.nvml_used_gib()
    with serve.start(model_dir, engine="vllm", max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                     gpu_memory_fraction=gpu_memory_fraction) as server:
        held_gib, how = inference.held_memory_gib(server, used_before)
        kv = inference.served_kv_check(server, reference_calculator())
        log = out_dir / f"vllm-{preset}{'-fp8kv' if kv_cache_dtype else ''}.log"
        shutil.copyfile(server.log_path, log)
        return {"preset": preset, "label": server.label, "command": server.command, "ready_s": server.ready_s,
                "facts": server.facts.as_dict(), "kv_check": kv, "held_memory_gib": held_gib, "held_memory_how": how,
                "nvml_used_before_gib": used_before, "weight_bytes": server.marker.get("weight_bytes"),
                "log": log.name}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-1.1b")
    p.add_argument("--max-model-len", type=int, default=2036, help="not a multiple of the block size, on purpose")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.5)
    p.add_argument("--kv-cache-dtype", action="append", default=[None], choices=("fp8",),
                   help="also check this KV-cache dtype (repeatable)")
    p.add_argument("--out", default="vllm_kv_check.json")
    a = p.parse_args(argv)
    from utils.device import hardware
    from utils.serving import serve

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for kv_dtype in a.kv_cache_dtype:
        try:
            row = check(a.preset, a.max_model_len, out.parent, kv_cache_dtype=kv_dtype,
                        gpu_memory_fraction=a.gpu_memory_fraction)
        except serve.ServeError as e:
            print(f"vllm_kv_check: {e}", file=sys.stderr)
            rows.append({"preset": a.preset, "kv_cache_dtype": kv_dtype, "error": str(e)})
            continue
        rows.append(row)
        k, f = row["kv_check"], row["facts"]
        print(f"{row['label']}: vLLM {f['version']} {f['num_blocks']} blocks x {f['block_size']} = {f['kv_cache_tokens']} "
              f"tokens, {f['max_concurrency']}x, {f['kv_cache_gib']} GiB; calculator {k.get('calculator_num_blocks')} "
              f"blocks, {k.get('calculator_kv_tokens')} tokens: {'agrees' if k.get('agrees') else 'DIFFERS'}; "
              f"held {row['held_memory_gib']} GiB ({row['held_memory_how']})")
    out.write_text(json.dumps({"benchmark": "vllm_kv_check", "date": time.strftime("%Y-%m-%d"),
                               "command": "python benchmarks/vllm_kv_check.py " + " ".join(argv or sys.argv[1:]),
                               "fingerprint": hardware.fingerprint(), "rows": rows}, indent=1, default=str) + "\n")
    return 0 if rows and all("error" not in r and r["kv_check"].get("agrees") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
