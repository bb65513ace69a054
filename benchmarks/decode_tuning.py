"""Ways to compile the fast decode step, measured side by side, and where its time goes (the goal: 40% of copy bandwidth).

    python benchmarks/decode_tuning.py OUT.json [--variants NAME,...]   # on a CUDA GPU: Llama-1.1B shape, bf16, batch 1

``utils.serving.decode.FastDecoder`` (static KV cache, fused QKV and gate/up, one CUDA graph per
token) is built once per variant over the same random-weight model:

``default``
    ``torch.compile(mode="reduce-overhead")``, Inductor's defaults, and the decode steps'
    attention under SDPA's math backend (``decode_attention="sdpa"``), as gpt-fast's
    ``generate.py`` has it; on PyTorch 2.5 and later that backend copies bf16 inputs, the
    whole cache included, to fp32 and multiplies them on CUDA cores.
``coordinate_descent``
    the same with ``torch._inductor.config.coordinate_descent_tuning = True`` (gpt-fast sets
    it). With it, Inductor also rewrites every matrix-vector product (``mm`` with one row)
    as a multiply and a sum that it generates and tunes itself (``torch/_inductor/
    decomposition.py``), so the norm before a projection can fuse into it.
``cd_max_autotune``
    coordinate descent under ``mode="max-autotune"`` (autotuned matmul templates, CUDA graphs).
``cd_reduce`` / ``cd_matmul``
    coordinate descent, and the decode steps' attention without SDPA, reading the cache in
    bf16 (``FastDecoder(decode_attention=...)``): as inductor reductions, or as two small
    matmuls (``FastDecoder``'s default).
``matmul``
    ``FastDecoder``'s defaults alone: Inductor's default config, matmul attention.

Each is timed as ``utils.serving.inference.measure_decode`` times it (TPOT from 1 and 64 new tokens
after a 128-token prompt); ``weights_gbs`` is weight bytes read per step x steps per second,
the quantity the copy bandwidth bounds, and ``fraction_of_copy`` is that over the measured copy
bandwidth. A variant that fails records its error and the others still run. Each is then
profiled (``utils.diagnosis.profiling.profile_steps`` over 64-token generations): kernels per token,
GPU-busy time per token and the kernels that take the time.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# name -> (coordinate_descent_tuning, FastDecoder options)
VARIANTS = {
    "default": (False, {"decode_attention": "sdpa"}),
    "coordinate_descent": (True, {"decode_attention": "sdpa"}),
    "cd_max_autotune": (True, {"decode_attention": "sdpa", "compile_mode": "max-autotune"}),
    "cd_reduce": (True, {"decode_attention": "reduce"}),
    "cd_matmul": (True, {"decode_attention": "matmul"}),
    "matmul": (False, {"decode_attention": "matmul"}),
}
PROMPT_LEN, NEW_TOKENS = 128, 64


def kernel_profile(path, new_tokens: int, steps: int = 3) -> dict:
    """Kernels per generated token and where the GPU time goes, from a profile of ``steps``
    generations of ``new_tokens`` tokens (each includes one uncompiled prefill)."""
    from utils.diagnosis import profiling
    from utils.diagnosis.trace_events import load_events
    from utils.diagnosis.trace_metrics import analysis_window, step_windows
    from utils.measure.timing import device_sync

    def generation():  # synchronised, so each ProfilerStep holds its own generation's kernels
        path(new_tokens)
        device_sync(path.prompt.device)

    with tempfile.TemporaryDirectory() as tmp:
        s = profiling.profile_steps(generation, steps=steps, warmup=1, wait=0, top=15,
                                    trace_path=Path(tmp) / "trace.json")
        events = load_events(s.trace_path)
    window = analysis_window(events, step_windows(events))
    kernels = [e for e in events if e.cat == "kernel" and e.end > window[0] and e.ts < window[1]]
    per_gen = len(kernels) / steps
    return {"steps": steps, "new_tokens": new_tokens, "kernels_per_generation": per_gen,
            "kernels_per_token": per_gen / new_tokens, "gpu_busy_ms_per_generation": s.gpu_busy_ms_per_step,
            "wall_ms_per_generation": s.step_time_ms, "gpu_idle_fraction": s.gpu_idle_fraction,
            "mean_kernel_us": s.mean_kernel_us,
            "top_kernels": [{"name": o.name[:120], "calls_per_token": o.calls / steps / new_tokens,
                             "us_per_token": o.total_ms * 1e3 / steps / new_tokens, "share": o.share} for o in s.top]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="where to write the JSON results")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, from {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel profile of each variant")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        ap.error(f"unknown variant(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")

    import torch

    from utils.model.models import build_model
    from utils.serving import decode, inference
    from utils.units import GB

    if not torch.cuda.is_available():
        print("decode_tuning.py: error: needs a CUDA GPU (it measures compiled CUDA graphs)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = build_model("llama-1.1b", dtype="bf16", device="cuda").eval()
    prompt = torch.randint(100, 30000, (1, PROMPT_LEN), device="cuda")
    res: dict = {"model": "llama-1.1b", "dtype": "bf16", "batch": 1, "prompt_len": PROMPT_LEN,
                 "new_tokens": NEW_TOKENS, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "copy_gbs": inference.measure_copy_bandwidth()["gbs"],
                 "weight_bytes_read_per_step": inference.weight_bytes_read_per_step(model), "variants": {}}
    wbr = res["weight_bytes_read_per_step"]
    reference = None
    for name in names:
        tune, kw = VARIANTS[name]
        torch._dynamo.reset()
        torch._inductor.config.coordinate_descent_tuning = tune
        t0 = time.perf_counter()
        try:
            path = decode.warm(decode.fast_path(model, prompt, NEW_TOKENS, **kw), NEW_TOKENS)
            m = inference.measure_decode(path, NEW_TOKENS)
            tokens = path(NEW_TOKENS)
        except Exception as e:  # one variant failing (a backend that refuses the shape) leaves the rest
            res["variants"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
            print(name, res["variants"][name], flush=True)
            continue
        if reference is None:
            reference = tokens
        gbs = wbr * m["tokens_per_s"] / GB
        res["variants"][name] = {
            "coordinate_descent_tuning": tune, "compile_mode": path.decoder.compile_mode,
            "decode_attention": path.decoder.decode_attention,
            "warm_s": path.warmup_s,
            "tpot_ms": m["tpot_ms"], "tokens_per_s": m["tokens_per_s"], "weights_gbs": gbs,
            "fraction_of_copy": gbs / res["copy_gbs"], "wall_s": time.perf_counter() - t0,
            # bf16 kernels that add in another order can flip a near-tie of random weights
            "first_token_differing_from_first_variant": decode.first_mismatch(reference, tokens)}
        if not args.no_profile:
            try:
                res["variants"][name]["profile"] = kernel_profile(path, NEW_TOKENS)
            except Exception as e:
                res["variants"][name]["profile"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print(name, json.dumps(res["variants"][name], indent=1), flush=True)
        del path  # its fused weights and CUDA graphs
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(res, indent=1))  # what is done survives a run cut short
    ok = {n: v for n, v in res["variants"].items() if "error" not in v}
    if ok:
        res["fastest"] = min(ok, key=lambda n: ok[n]["tpot_ms"])
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
