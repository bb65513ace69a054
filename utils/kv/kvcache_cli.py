"""``python -m utils.kv.kvcache``: the KV-cache calculator on the command line.

From a Hugging Face ``config.json`` (``--config``) or three numbers (``--layers``,
``--kv-heads``, ``--head-dim``): KV bytes per token (``utils/kv/kvcache.py``) and vLLM's
blocks, tokens and concurrency (``utils/kv/vllm_kv.py``), as a table or ``--json``, for one vLLM
release: ``--vllm-version``, else the vLLM ``utils.serving.engines`` finds here, else the newest
release the calculator knows. The output names the release and where it came from. Without
``--max-model-len`` a config's requests are as long as that release makes them when the flag is left
out (``utils/kv/vllm_max_model_len.py``), and a longer one is refused as vLLM refuses it.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from utils import validate
from utils.kv.kvcache import SLIDING, KVConfigError, KVSpec, dtype_bytes, from_hf_config
from utils.kv.vllm_kv import VllmPlan, vllm_available_kv_bytes, vllm_plan
from utils.kv.vllm_max_model_len import vllm_max_model_len
from utils.kv.vllm_releases import vllm_default_block_size, vllm_default_max_num_batched_tokens, vllm_release
from utils.serving import engines
from utils.units import GIB


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as argparse but without the usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m utils.kv.kvcache", description="KV-cache size per token and vLLM's block, token and "
                "concurrency arithmetic, from a Hugging Face config.json or from numbers, for one vLLM release.")
    src = p.add_argument_group("model (a config, or the three numbers)")
    src.add_argument("--config", type=Path, help="Hugging Face config.json")
    src.add_argument("--layers", type=int, help="decoder layers")
    src.add_argument("--kv-heads", type=int, help="KV heads (1 for MQA, = attention heads for MHA)")
    src.add_argument("--head-dim", type=int, help="head dimension")
    src.add_argument("--sliding-window", type=int, help="every layer attends to this many tokens (overrides the config)")
    rel = p.add_argument_group("vLLM (default: the one installed here, else the newest release the calculator knows)")
    rel.add_argument("--vllm-version", help="the vLLM release to model, e.g. 0.27.0 (vllm --version)")
    rel.add_argument("--device", choices=["cuda", "cpu"], help="GPU build or CPU build (default: the installed "
                     "vLLM's, else cuda); sets the default block size, token budget and async scheduling")
    p.add_argument("--kv-dtype", choices=["bf16", "fp16", "fp32", "fp8"], help="KV cache dtype (default: the config's, else bf16)")
    p.add_argument("--block-size", type=int, help="tokens per block (default: vLLM's for the device: 16 on GPUs, "
                   "the CPU build's own otherwise)")
    p.add_argument("--max-model-len", type=int, help="tokens per request (default: what the release derives from the "
                   "config, as vllm serve does without --max-model-len)")
    p.add_argument("--allow-long-max-model-len", action="store_true", help="accept a --max-model-len longer than the "
                   "config allows, as vLLM does with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    p.add_argument("--batch", type=int, default=1, help="requests of --max-model-len to check for fit (default 1)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs splitting the KV heads (default 1)")
    p.add_argument("--max-num-batched-tokens", type=int, help="scheduler token budget, which sizes sliding and chunked "
                   "layers (default: vllm serve's for the release and device)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="two batches in flight (vLLM 0.26 on; default: on for GPUs, off in the CPU build)")
    p.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="allocate sliding layers of a mixed model as full attention (vLLM's flag; also vLLM before its hybrid allocator)")
    mem = p.add_argument_group("memory (per GPU; give --kv-memory-gib, or --gpu-memory-gib with --weights-gib)")
    mem.add_argument("--kv-memory-gib", type=float, help="available KV memory, as vLLM logs it (the CPU build: "
                     "VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes)")
    mem.add_argument("--gpu-memory-gib", type=float, help="total GPU memory")
    mem.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction vLLM may use (default 0.9)")
    mem.add_argument("--weights-gib", type=float, help="model weights on this GPU")
    mem.add_argument("--activation-gib", type=float, default=None, help="activation peak estimate (default: not subtracted)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _spec_from_args(args, p, release) -> KVSpec:
    numbers = (args.layers, args.kv_heads, args.head_dim)
    if args.config is not None:
        if any(v is not None for v in numbers):
            p.error("give --config or --layers/--kv-heads/--head-dim, not both")
        spec = from_hf_config(args.config, kv_dtype=args.kv_dtype, vllm_version=release)
        if args.sliding_window is not None:
            spec = replace(spec, sliding_window=args.sliding_window, layer_types=None, attention_chunk_size=None)
        return spec
    if any(v is None for v in numbers):
        p.error("give --config PATH, or all of --layers, --kv-heads and --head-dim")
    return KVSpec(args.layers, args.kv_heads, args.head_dim, dtype_bytes(args.kv_dtype or "bf16"),
                  sliding_window=args.sliding_window)


def _available_from_args(args, p) -> tuple[int | None, str]:
    if args.kv_memory_gib is not None:
        if args.gpu_memory_gib is not None or args.weights_gib is not None:
            p.error("give --kv-memory-gib, or --gpu-memory-gib with --weights-gib, not both")
        validate.non_negative("kv_memory_gib", args.kv_memory_gib, KVConfigError)
        return int(args.kv_memory_gib * GIB), "given"
    if args.gpu_memory_gib is None:
        if args.weights_gib is not None or args.activation_gib is not None:
            p.error("--weights-gib and --activation-gib need --gpu-memory-gib")
        return None, "not given"
    if args.weights_gib is None:
        p.error("--gpu-memory-gib needs --weights-gib (the model weights on one GPU)")
    act = args.activation_gib or 0.0
    avail = vllm_available_kv_bytes(args.gpu_memory_gib * GIB, args.weights_gib * GIB,
                                    gpu_memory_utilization=args.gpu_memory_utilization, activation_bytes=act * GIB)
    how = (f"ESTIMATE: {args.gpu_memory_gib:g} x {args.gpu_memory_utilization:g} - {args.weights_gib:g} weights"
           + (f" - {act:g} activation" if args.activation_gib is not None else
              "; activation peak not subtracted, so an upper bound"))
    return avail, how


def _release_from_args(args) -> tuple:
    """``(release, device, where)``: ``--vllm-version``/``--device``, else the installed vLLM's."""
    if args.vllm_version is not None:
        release = vllm_release(args.vllm_version)
        return release, args.device or engines.vllm_release_here()[1], "--vllm-version"
    release, device, where = engines.vllm_release_here()
    return release, args.device or device, where


def main(argv: list[str] | None = None) -> int:
    p = _build_parser()
    args = p.parse_args(argv)
    try:
        for name in ("batch", "tensor_parallel_size"):
            validate.positive(name.replace("_", "-"), getattr(args, name), KVConfigError)
        for name in ("block_size", "max_num_batched_tokens"):
            if getattr(args, name) is not None:
                validate.positive(name.replace("_", "-"), getattr(args, name), KVConfigError)
        for name in ("kv_memory_gib", "gpu_memory_gib", "weights_gib", "activation_gib", "max_model_len",
                     "layers", "kv_heads", "head_dim", "sliding_window"):
            v = getattr(args, name)
            if v is not None and v < 0:
                p.error(f"--{name.replace('_', '-')} must not be negative, got {v:g}")
        if not 0 < args.gpu_memory_utilization <= 1:
            p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization:g}")
        release, device, where = _release_from_args(args)
        spec = _spec_from_args(args, p, release)
        if args.max_model_len == 0:
            p.error("--max-model-len must be positive, got 0")
        max_len, len_source = args.max_model_len, "given"
        if args.config is not None:
            lengths = vllm_max_model_len(args.config, vllm_version=release)
            if max_len:
                lengths.check(max_len, allow_long=args.allow_long_max_model_len)
            elif lengths.default is None:
                p.error(f"--max-model-len is required: {lengths.how}")
            else:
                max_len, len_source = lengths.default, f"vLLM {release.version}'s default for this config: {lengths.how}"
        if not max_len:
            p.error("--max-model-len is required with --layers/--kv-heads/--head-dim")
        avail, how = _available_from_args(args, p)
        block_size = args.block_size or vllm_default_block_size(release, device, mla=spec.mla)
        budget = args.max_num_batched_tokens or vllm_default_max_num_batched_tokens(
            release, device, gpu_memory_gib=args.gpu_memory_gib)
        plan = vllm_plan(spec, max_len, avail, batch=args.batch, block_size=block_size,
                         tensor_parallel_size=args.tensor_parallel_size, max_num_batched_tokens=budget,
                         hybrid=not args.disable_hybrid_kv_cache_manager, release=release, device=device,
                         async_scheduling=args.async_scheduling)
    except KVConfigError as e:
        p.error(str(e))
    defaults = {"max_model_len": len_source,
                "block_size": "given" if args.block_size else f"vLLM {release.version}'s default on {device}",
                "max_num_batched_tokens": "given" if args.max_num_batched_tokens else
                f"vllm serve's default for vLLM {release.version} on {device}"}
    if args.json:
        out = asdict(plan) | {"attention": spec.attention, "num_layers": spec.num_layers,
                              "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                              "kv_dtype_bytes": spec.dtype_bytes, "available_kv_source": how,
                              "vllm_release": release.version, "vllm_release_source": where, "device": device,
                              "defaults": defaults}
        print(json.dumps(out, indent=2))
        return 0
    print(_table(spec, plan, how, release, device, where, defaults))
    return 0


def _table(spec: KVSpec, plan: VllmPlan, how: str, release, device: str, where: str, defaults: dict) -> str:
    def gib(b):
        return f"{b / GIB:,.2f} GiB"

    window = f", sliding window {spec.sliding_window}" if spec.sliding_window and SLIDING in spec.kinds() else ""
    head = (f"{spec.model_type or 'model'}: {spec.attention}, {spec.num_layers} layers x {spec.num_kv_heads} KV heads x "
            f"{spec.head_dim} head dim x {spec.dtype_bytes} B{window}")
    groups = ", ".join(f"{k} {n}" for k, n in plan.groups)
    rows = [("modelled release", f"{release.describe()} on {device} ({where})"),
            ("KV bytes per token", f"{plan.bytes_per_token:,} ({plan.bytes_per_token / 1024:,.1f} KiB)"),
            (f"  per GPU (TP {plan.tensor_parallel_size})", f"{plan.bytes_per_token_per_gpu:,}"),
            (f"page (1 layer, {plan.block_size} tokens)", f"{plan.page_bytes:,} B; block size {defaults['block_size']}"),
            ("KV-cache groups", f"{plan.num_groups} of {plan.group_size} layers ({groups})"),
            ("token budget", f"{plan.max_num_batched_tokens:,} ({defaults['max_num_batched_tokens']}); "
                             f"{plan.in_flight_tokens:,} in flight"),
            ("max_model_len", f"{plan.max_model_len:,} ({defaults['max_model_len']})"),
            (f"one request of {plan.max_model_len:,} tokens", f"{plan.blocks_per_request:,} blocks, {gib(plan.request_bytes)}")]
    if plan.num_blocks is None:
        rows.append(("available KV memory", "not given (--kv-memory-gib or --gpu-memory-gib)"))
    else:
        rows += [("available KV memory", f"{gib(plan.available_kv_bytes)} ({how})"),
                 ("vLLM blocks", f"{plan.num_blocks:,}"),
                 ("KV cache size", f"{plan.kv_tokens:,} tokens"),
                 (f"max concurrency @ {plan.max_model_len:,}", f"{plan.max_concurrency:.2f}x")]
    verdict = "" if plan.fits is None else ("  fits" if plan.fits else "  does NOT fit")
    rows.append((f"batch {plan.batch} x {plan.max_model_len:,} tokens", f"{gib(plan.batch_kv_bytes_needed)} per GPU{verdict}"))
    width = max(len(k) for k, _ in rows)
    lines = [head] + [f"  {k:<{width}}  {v}" for k, v in rows] + [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
