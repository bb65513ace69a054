"""Phase 3 on one GPU: decode three ways against copy bandwidth, KV growth against the calculator,
prefill, quantization and batching.

    python benchmarks/phase3_inference.py --out FILE.json            # on a GPU: the 1.1B Llama shape, bf16
    python benchmarks/phase3_inference.py --out FILE.json --smoke    # on a CPU: llama-tiny, plumbing only

Sections, in this order (each rewrites FILE.json when it ends, so a run cut short keeps what
it measured; a section that fails is recorded with its error and the run goes on):

1. ``copy``: device-to-device copy bandwidth (1 GiB, read + write), the ceiling decode is
   compared with.
2. ``decode``: batch-1 greedy decode of the prompt, TPOT = ``(t(n) - t(1)) / (n - 1)`` for eager
   ``generate``, the hand-written fast path (static cache, fused QKV and gate/up,
   ``torch.compile(mode="reduce-overhead")``: one CUDA graph per token) and ``generate`` with a
   static cache (transformers compiles it); for each, tokens/s, achieved bandwidth (weights
   read + KV at the mean context, per step) and its fraction of the copy bandwidth, the
   warm-up (compile) time, and where its greedy tokens part from eager ``generate``'s.
   Goal: the fast path at >= 40% of the copy bandwidth on one H200.
3. ``kv_growth``: ``torch.cuda.memory_allocated`` as decoding grows a ``DynamicCache``, against
   ``utils.kv.kvcache`` (goal: within 2%).
4. ``ttft``: time to first token against prompt length.
5. ``quantization``: bitsandbytes int8 and NF4 against bf16: weight memory, decode tokens/s
   (eager ``generate``), held-out perplexity (random weights: only the change means anything).
6. ``batching``: the fast path's TPOT and tokens/s as the batch grows (one recompile per batch
   size), within what is left of ``--budget-s``.
7. ``continuous_batching``: transformers' ``generate_batch`` on requests of different lengths,
   if time is left.

Designed to finish in about six minutes on one H200 (torch 2.11, transformers 5.17).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _t(r) -> dict:
    return {"median_ms": r.median_ms, "p20_ms": r.p20_ms, "p80_ms": r.p80_ms, "runs": r.runs, "method": r.method}


class Run:
    """The result dict, written after every section; sections run in order while time is left."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.t0, self.budget_s = out, time.perf_counter(), budget_s
        self.res: dict = {"sections": {}}

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def section(self, name: str, fn, *args, min_left_s: float | None = None) -> dict | None:
        """Run ``fn`` as section ``name``; with ``min_left_s``, only if that much of the budget is left."""
        if min_left_s is not None and self.left_s() < min_left_s:
            self.res["sections"][name] = {"skipped": f"{self.left_s():.0f} s left of --budget-s, needs {min_left_s:.0f}"}
            print(f"--- {name}: skipped (time budget)", flush=True)
            self.save()
            return None
        t0 = time.perf_counter()
        print(f"--- {name} ({time.perf_counter() - self.t0:.0f} s into the run)", flush=True)
        try:
            row = fn(*args)
        except Exception as exc:
            traceback.print_exc()
            row = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        self.res["sections"][name] = row
        print(json.dumps(_brief(row), default=str), flush=True)
        self.save()
        _free()
        return row

    def save(self) -> None:
        self.res["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        self.out.write_text(json.dumps(self.res, indent=1, default=str))


def _brief(row: dict) -> dict:
    return {k: v for k, v in row.items() if not isinstance(v, (list, dict)) or k in ("paths", "modes")}


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--smoke", action="store_true", help="llama-tiny on the CPU, tiny sizes (plumbing only)")
    p.add_argument("--budget-s", type=float, default=330.0, help="skip later sections once this much time is spent")
    a = p.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)

    import torch

    from grader import labs
    from utils.device.hardware import current_spec, fingerprint
    from utils.kv import kvcache
    from utils.model import quantize
    from utils.model.models import build_model, get_tokenizer, token_batches
    from utils.serving import decode, inference
    from utils.units import GB

    if a.smoke:
        os.environ["GPULAB_SMOKE"] = "1"
    tier = "cpu" if a.smoke or not torch.cuda.is_available() else "h100"
    s = labs.sizes("03_inference_serving", tier)
    device = torch.device("cpu" if tier == "cpu" else "cuda")
    dtype = quantize.reference_mode(device)
    run = Run(a.out, a.budget_s)
    spec = current_spec()
    run.res.update(fingerprint=fingerprint(), torch=torch.__version__, sizes=s.__dict__, dtype=dtype, preset=s.model,
                   datasheet_bandwidth_gbs=spec.bandwidth_gbs if spec.kind == "gpu" else None)
    import transformers

    run.res["transformers"] = transformers.__version__
    print(f"{spec.name}: {s.model} in {dtype}, torch {torch.__version__}, transformers {transformers.__version__}", flush=True)

    state: dict = {}

    def copy() -> dict:
        c = inference.measure_copy_bandwidth(s.copy_numel, device)
        state["copy_gbs"] = c["gbs"]
        return {"gbs": c["gbs"], "bytes": c["bytes"], "time": _t(c["time"])}

    run.section("copy", copy)

    torch.manual_seed(0)
    model = build_model(s.model, dtype=dtype, device=device).eval()
    sweep_batches = s.batches + ((64,) if tier != "cpu" else ())
    prompts = next(token_batches(get_tokenizer(None), None, max(sweep_batches), max(s.ttft_lens), device=device,
                                 vocab_size=model.config.vocab_size))[0]
    prompt = prompts[:1, :s.prompt_len]
    wbr = inference.weight_bytes_read_per_step(model)
    kvt = kvcache.bytes_per_token(inference.kv_spec(model))
    bytes_per_step = inference.decode_bytes_per_step(wbr, kvt, 1, inference.mean_context_len(s.prompt_len, s.new_tokens))

    def one_path(make) -> dict:
        path = make()
        decode.warm(path, s.new_tokens)
        d = inference.measure_decode(path, s.new_tokens)
        gbs = bytes_per_step * d["tokens_per_s"] / GB
        tokens = path(s.new_tokens)
        state.setdefault("tokens", {})[path.name] = tokens
        ref = state["tokens"].get("eager")
        row = {"note": path.note, "compiled": path.compiled, "warmup_s": path.warmup_s, "tpot_ms": d["tpot_ms"],
               "tokens_per_s": d["tokens_per_s"], "bandwidth_gbs": gbs,
               "copy_fraction": gbs / state["copy_gbs"] if state.get("copy_gbs") else None,
               "first_mismatch_vs_eager": None if ref is None else decode.first_mismatch(ref, tokens),
               "t1": _t(d["t1"]), "tn": _t(d["tn"])}
        if path.name == "fast":
            from torch._dynamo.utils import counters

            row["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
            state["decoder"] = path.decoder
        return row

    def decode_all() -> dict:
        out = {"bytes_per_step": bytes_per_step, "weight_bytes_read": wbr, "kv_bytes_per_token": kvt,
               "prompt_len": s.prompt_len, "new_tokens": s.new_tokens, "paths": {}}
        makers = {"eager": lambda: decode.eager_path(model, prompt),
                  "fast": lambda: decode.fast_path(model, prompt, s.new_tokens),
                  "static_compiled": lambda: decode.static_path(model, prompt)}
        for name, make in makers.items():
            t0 = time.perf_counter()
            try:
                out["paths"][name] = one_path(make)
            except Exception as exc:
                traceback.print_exc()
                out["paths"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            out["paths"][name]["wall_s"] = round(time.perf_counter() - t0, 1)
            print(name, json.dumps({k: v for k, v in out["paths"][name].items() if k not in ("t1", "tn")}, default=str),
                  flush=True)
            run.res["sections"]["decode"] = out
            run.save()
        ok = {k: v for k, v in out["paths"].items() if "tokens_per_s" in v}
        if "fast" in ok and "eager" in ok:
            out["fast_over_eager"] = ok["fast"]["tokens_per_s"] / ok["eager"]["tokens_per_s"]
        if "fast" in ok and ok["fast"].get("copy_fraction") is not None:
            out["goal_40pct_of_copy_met"] = ok["fast"]["copy_fraction"] >= 0.40
        return out

    run.section("decode", decode_all)

    def kv_growth() -> dict:
        g = inference.measure_kv_growth(model, prompts[:s.kv_batch, :s.prompt_len], s.kv_new_tokens)
        want = kvcache.bytes_per_token(inference.kv_spec(model)) * s.kv_batch
        return {"batch": s.kv_batch, "steps": s.kv_new_tokens, "source": g["source"], "bytes_per_step": g["bytes_per_step"],
                "calculator_bytes_per_step": want, "error_pct": 100 * (g["bytes_per_step"] / want - 1),
                "within_2pct": abs(g["bytes_per_step"] / want - 1) <= 0.02, "first_bytes": g["bytes"][0],
                "last_bytes": g["bytes"][-1], "cache_bytes_final": g["cache_bytes_final"]}

    run.section("kv_growth", kv_growth)

    def ttft() -> dict:
        res = inference.measure_prefill(model, prompts[:1], s.ttft_lens)
        return {"ttft_ms": {n: t.median_ms for n, t in res.items()},
                "prompt_tokens_per_s": {n: n / t.median_ms * 1e3 for n, t in res.items()}}

    run.section("ttft", ttft, min_left_s=20)

    def quant() -> dict:
        q = quantize.compare(s.model, prompt_len=s.prompt_len, new_tokens=s.quant_new_tokens, ppl_seq_len=s.ppl_seq_len,
                             ppl_blocks=s.ppl_blocks, device=device)
        ref = q["modes"][q["reference"]]
        modes = {}
        for m, info in q["modes"].items():
            modes[m] = {k: info[k] for k in ("weight_bytes", "footprint_bytes", "perplexity", "tokens_per_s", "tpot_ms")}
            modes[m]["memory_saving"] = ref["weight_bytes"] / info["weight_bytes"]
            modes[m]["perplexity_change_pct"] = 100 * (info["perplexity"] / ref["perplexity"] - 1)
        return {"reference": q["reference"], "skipped": q["skipped"], "modes": modes}

    run.section("quantization", quant, min_left_s=60)

    def batching() -> dict:
        deadline = time.perf_counter() + max(0.0, run.left_s() - 45)
        rows = inference.batching_sweep(model, prompts[:, :s.prompt_len], sweep_batches, s.new_tokens,
                                        decoder=state.get("decoder"), deadline=deadline)
        for r in rows:
            if "tokens_per_s" in r:
                r["bandwidth_gbs"] = inference.decode_bytes_per_step(
                    wbr, kvt, r["batch"], inference.mean_context_len(s.prompt_len, s.new_tokens)) * r["tokens_per_s"] / (
                    r["batch"] * GB)
        return {"rows": rows}

    run.section("batching", batching, min_left_s=60)

    def cb() -> dict:
        lengths = [max(4, s.prompt_len // 2 + (37 * i) % s.prompt_len) for i in range(s.cb_requests)]
        reqs = [prompts[i % prompts.shape[0], :n].tolist() for i, n in enumerate(lengths)]
        return inference.continuous_batching(model, reqs, s.new_tokens)

    run.section("continuous_batching", cb, min_left_s=40)
    d = run.res["sections"].get("decode", {}).get("paths", {}).get("fast", {})
    frac = d.get("copy_fraction")
    print(f"done in {run.res['elapsed_s'] if 'elapsed_s' in run.res else '?'} s; fast path "
          f"{d.get('tokens_per_s', float('nan')):.1f} tokens/s = "
          f"{'n/a' if frac is None or not math.isfinite(frac) else f'{frac:.1%}'} of copy bandwidth; wrote {a.out}",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
