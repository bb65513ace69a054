"""Write a compressed-tensors INT8 W8A8 (or 4-bit W4A16) checkpoint from a 16-bit model directory.

No calibration, no model hub: a pure-torch rewrite of a directory that
:func:`utils.serving.serve.build_model_dir` made, into the layout vLLM's compressed-tensors loader
reads, so vLLM's CPU build (and its GPU build) serves it with its int8 kernels.

* ``w8a8`` (:func:`write_w8a8`; compressed-tensors format ``int-quantized``): every Linear
  weight of the decoder layers becomes int8 with one fp32 scale per output row,
  ``scale = max|w_row| / 127``, ``q = round(w / scale)``; activations are quantized to int8
  per token *at run time* (``dynamic: true``), from each token's own absmax, and the matmul
  runs int8 x int8 -> int32 (oneDNN or the SGLang AMX/AVX-512 kernel on CPU, cutlass on GPU).
  Weights are quantized from themselves and activations at run time, so no calibration data
  is needed: calibration is only for *static* activation scales (or GPTQ/AWQ's error
  correction). About 1 byte per weight plus 4 bytes per output row.
* ``w4a16`` (:func:`write_w4a16`; format ``pack-quantized``): symmetric 4-bit weights, one
  16-bit scale per group of 32-128 input columns, eight values packed per int32 (offset by 8,
  vLLM's ``uint4b8``); activations stay 16-bit and the kernel dequantizes inside the matmul
  (``CPUWNA16LinearKernel`` on CPU). Round-to-nearest: no GPTQ/AWQ error correction.

What stays 16-bit: the token embedding, ``lm_head``, the norms and any bias; so a model with
a large vocabulary saves less than 2x (4x) overall. The scales and the rounding follow
compressed-tensors except that the symmetric step is ``absmax / 127`` (vLLM's own dynamic
activation step) where compressed-tensors' observer uses ``absmax / 127.5``: both load the same.

Sources (vLLM 0.32.0, compressed-tensors 0.17.0):
  vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py
    (``from_config``, ``_quantization_scheme_map_from_config``, ``_is_dynamic_token_w8a8``,
    ``_is_wNa16_group_channel``, target "Linear" matched by class name, ``ignore``);
  .../compressed_tensors/schemes/compressed_tensors_w8a8_int8.py (``weight`` int8 [out, in],
  ``weight_scale`` fp32 [out, 1] for strategy "channel");
  .../schemes/compressed_tensors_wNa16.py (``weight_packed`` int32 [out, in/8],
  ``weight_scale`` [out, in/group], ``weight_shape`` int64 [2]);
  vllm/model_executor/kernels/linear/scaled_mm/cpu.py (``CPUInt8ScaledMMLinearKernel``) and
  .../mixed_precision/cpu.py (``CPUWNA16LinearKernel``: uint4b8, sizes multiples of 32);
  compressed_tensors/quantization/quant_scheme.py (``INT8_W8A8``, ``W4A16`` presets),
  compressed_tensors/config/base.py (``CompressionFormat``),
  compressed_tensors/compressors/pack_quantized/helpers.py (``pack_to_int32``).
The JSON is written by hand, so the course needs neither vLLM nor compressed-tensors to write it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

CT_VERSION = "0.17.0"  # the compressed-tensors version whose schema this follows
FORMATS = {"w8a8": "int-quantized", "w4a16": "pack-quantized"}
MARKER = "gpulab-served.json"


class CheckpointError(ValueError):
    """A source directory this writer cannot convert (one line, no traceback needed)."""


def _args(num_bits: int, strategy: str, *, dynamic: bool = False, group_size: int | None = None) -> dict:
    """compressed-tensors ``QuantizationArgs`` as JSON (quantization/quant_args.py)."""
    return {"num_bits": num_bits, "type": "int", "symmetric": True, "group_size": group_size,
            "strategy": strategy, "block_structure": None, "dynamic": dynamic, "actorder": None,
            "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def quantization_config(fmt: str, group_size: int | None = None) -> dict:
    """The ``quantization_config`` block of config.json for ``fmt`` (``w8a8`` or ``w4a16``)."""
    if fmt == "w8a8":  # compressed_tensors.quantization.quant_scheme.INT8_W8A8
        group = {"weights": _args(8, "channel"), "input_activations": _args(8, "token", dynamic=True)}
    elif fmt == "w4a16":  # quant_scheme.W4A16, with our group size
        group = {"weights": _args(4, "group", group_size=group_size), "input_activations": None}
    else:
        raise CheckpointError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    group.update(targets=["Linear"], output_activations=None, format=FORMATS[fmt])
    return {"quant_method": "compressed-tensors", "format": FORMATS[fmt], "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None,
            "global_compression_ratio": None, "sparsity_config": {}, "version": CT_VERSION}


def is_quantized_linear(name: str, tensor) -> bool:
    """A decoder layer's Linear weight: 2-D ``*.weight`` under ``*.layers.N.``; norms are 1-D,
    the embedding and lm_head live outside the layers."""
    return ".layers." in f".{name}" and name.endswith(".weight") and tensor.ndim == 2


def quantize_int8(w):
    """``(q, scale)``: int8 [out, in] and fp32 [out, 1], symmetric per output row."""
    import torch

    w = w.float()
    absmax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax))
    q = torch.clamp(torch.round(w / scale), -127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w, group_size: int):
    """``(q, scale)``: int8 values in [-8, 7] [out, in] and ``w.dtype`` scales [out, in/group]."""
    import torch

    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    absmax = g.abs().amax(dim=2, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 7.0, torch.ones_like(absmax)).to(w.dtype)  # stored 16-bit
    q = torch.clamp(torch.round(g / scale.float()), -8, 7).to(torch.int8)
    return q.reshape(out_f, in_f), scale.reshape(out_f, -1)


def pack_int4(q):
    """Eight 4-bit values per int32 along the input dim, value + 8, the first in the low bits
    (compressed-tensors' ``pack_to_int32`` with ``packed_dim=1``)."""
    import torch

    u = (q.to(torch.int64) + 8).reshape(q.shape[0], -1, 8)
    p = (u << (torch.arange(8, dtype=torch.int64) * 4)).sum(dim=2)
    return torch.where(p >= 2**31, p - 2**32, p).to(torch.int32)  # the same 32 bits, signed


def unpack_int4(packed, in_features: int):
    """The inverse of :func:`pack_int4`: int8 values in [-8, 7], [out, in_features]."""
    import torch

    shifts = torch.arange(8, dtype=torch.int32) * 4
    u = (packed.unsqueeze(-1) >> shifts) & 0xF
    return (u.reshape(packed.shape[0], -1)[:, :in_features] - 8).to(torch.int8)


def write_w8a8(src_dir, out_dir) -> dict:
    """INT8 W8A8 (int8 per-channel weights, dynamic per-token int8 activations); see the module."""
    return _write(src_dir, out_dir, "w8a8")


def write_w4a16(src_dir, out_dir, group_size: int | None = None) -> dict:
    """4-bit symmetric weight-only, grouped; ``group_size`` default: the largest of 128, 64, 32
    that divides every quantized layer's input size."""
    return _write(src_dir, out_dir, "w4a16", group_size)


def _load_source(src: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    if not (src / "config.json").is_file():
        raise CheckpointError(f"{src} is not a model directory (no config.json)")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{src} has no *.safetensors weights")
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise CheckpointError(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})")
    if config.get("model_type") == "gpt2":
        raise CheckpointError("GPT-2 stores its projections as Conv1D [in, out]; use a Llama or Qwen2 preset")
    tensors: dict = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    return config, tensors


def _write(src_dir, out_dir, fmt: str, group_size: int | None = None) -> dict:
    from safetensors.torch import save_file

    src, out = Path(src_dir), Path(out_dir)
    if not src.is_dir():
        raise CheckpointError(f"no model directory at {src}")
    if out.resolve() == src.resolve():
        raise CheckpointError("out_dir must differ from src_dir")
    config, tensors = _load_source(src)
    linear = [n for n, t in tensors.items() if is_quantized_linear(n, t)]
    if not linear:
        raise CheckpointError(f"no decoder-layer Linear weights (*.layers.N.*.weight) in {src}")
    if fmt == "w4a16":
        sizes = {tensors[n].shape[1] for n in linear} | {tensors[n].shape[0] for n in linear}
        fits = [g for g in (128, 64, 32) if all(s % g == 0 for s in sizes)]
        group_size = group_size or (fits[0] if fits else None)
        if not group_size or any(s % group_size or s % 32 for s in sizes):
            raise CheckpointError(f"w4a16 needs every Linear size a multiple of 32 and of the group size; got {sorted(sizes)}")
    before = sum(t.numel() * t.element_size() for t in tensors.values())
    new: dict = {}
    for name, t in tensors.items():
        if name not in linear:
            new[name] = t.contiguous()
            continue
        base = name[: -len(".weight")]
        if fmt == "w8a8":
            new[name], new[f"{base}.weight_scale"] = quantize_int8(t)
        else:
            import torch

            q, new[f"{base}.weight_scale"] = quantize_int4(t, group_size)
            new[f"{base}.weight_packed"] = pack_int4(q)
            new[f"{base}.weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
    after = sum(t.numel() * t.element_size() for t in new.values())

    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # tokenizer, generation_config.json, marker, ...: copied as they are
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (
                "config.json", "model.safetensors.index.json", MARKER):
            shutil.copy2(f, out / f.name)
    save_file(new, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(fmt, group_size)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    info = {"format": fmt, "format_name": f"compressed-tensors {FORMATS[fmt]} "
            + ("W8A8 int8 (per-channel weights, dynamic per-token activations)" if fmt == "w8a8"
               else f"W4A16 int4 (symmetric, group {group_size})"),
            "layers_quantized": len(linear), "weight_bytes_before": before, "weight_bytes_after": after,
            "group_size": group_size, "src_dir": str(src), "out_dir": str(out)}
    if (src / MARKER).is_file():  # the served-model marker, with the new weight bytes
        marker = json.loads((src / MARKER).read_text())
        marker.update(weight_bytes=after, quantization=info)
        (out / MARKER).write_text(json.dumps(marker, indent=1))
    return info
