"""Weight-only quantization with bitsandbytes: 8-bit and 4-bit NF4 against the 16-bit model.

* ``int8``: LLM.int8() (Dettmers et al. 2022, arXiv 2208.07339): int8 weights with one fp32
  scale per output row; activation columns above a threshold (6.0) run in 16 bits beside the
  int8 matmul. About 1 byte per weight.
* ``nf4``: 4-bit NormalFloat with double quantization (QLoRA, arXiv 2305.14314): blocks of 64
  weights share an 8-bit absmax, itself quantized in blocks of 256 with an fp32 scale, so
  ``4 + 8/64 + 32/(64 x 256)`` = about 4.127 bits per weight; dequantized to the compute dtype
  inside each matmul.

bitsandbytes quantizes the ``nn.Linear`` layers only: the embedding table, the output head
and the norms stay in 16 bits, which is why a 1.1B model saves less than 4x at 4 bits.

Weight memory is measured, not counted: on CUDA, ``torch.cuda.memory_allocated`` before and
after loading (quantization state included); on a CPU, where bitsandbytes is not used here,
the bytes of the parameters and buffers. Perplexity is measured on held-out shipped text
(the last 10% of the book's tokens). The course's models have random weights, so their
perplexity is near the vocabulary size and says nothing about language; the *change* from
the 16-bit model to a quantized one is the quantization error on the same weights, and that
is what the comparison shows. Where the runtime can download the preset's real checkpoint (or
has it cached: :mod:`utils.model.weights`), every mode loads that, and perplexity is measured with
its own tokenizer, so the change is a real model's; otherwise every mode loads the same random
checkpoint saved to disk. Either way from ``from_pretrained``
(:func:`utils.model.models.checkpoint_dir`), as a hub model loads.
"""
from __future__ import annotations

import gc
import math
from typing import Any

from utils.device import rehearsal
from utils.model.models import (
    _dtype_kwarg,
    _torch_dtype,
    checkpoint_dir,
    choice_tokenizer,
    encode,
    load_text,
    shipped_tokenizer,
)
from utils.serving.inference import measure_decode
from utils.train.training import bitsandbytes_usable

QUANT_MODES = ("int8", "nf4")
HELD_OUT_FRACTION = 0.1


def reference_mode(device: Any = None) -> str:
    """The 16-bit dtype the quantized models are compared with: bf16 on Ampere and newer,
    fp16 before (a T4 has no bf16; also when one is rehearsed: ``utils.device.rehearsal``), fp32 on a CPU."""
    import torch

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return "fp32"
    return rehearsal.half_dtype(device.index or 0)


INT8_MIN_CAPABILITY = (7, 5)  # LLM.int8(); NF4 runs from 6.0 (bitsandbytes' installation guide, "NVIDIA CUDA")


def usable_modes(device: Any = None) -> tuple[str, ...]:
    """The quantized modes bitsandbytes runs on ``device``: int8 and nf4 from compute capability
    7.5, nf4 alone below (a P100 is 6.0), none off CUDA."""
    import torch

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return ()
    cap = tuple(rehearsal.capability(device.index or 0))
    return tuple(m for m in QUANT_MODES if m != "int8" or cap >= INT8_MIN_CAPABILITY)


def load(preset: str, mode: str, device: Any = None):
    """``preset``'s random checkpoint loaded in ``mode`` (``bf16``, ``fp16``, ``fp32``, ``int8``,
    ``nf4``), in eval mode. A quantized mode without a usable bitsandbytes is a one-line error."""
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if mode not in QUANT_MODES + ("bf16", "fp16", "fp32"):
        raise ValueError(f"unknown mode {mode!r}; use bf16, fp16, fp32, int8 or nf4")
    path, choice = checkpoint_dir(preset)
    where = {"device_map": {"": device.index or 0}} if device.type == "cuda" else {}
    if mode in QUANT_MODES:
        ok, why = bitsandbytes_usable()
        if not ok or device.type != "cuda":
            raise RuntimeError(f"{mode} needs bitsandbytes on a CUDA GPU: {why}")
        from transformers import BitsAndBytesConfig

        compute = _torch_dtype(reference_mode(device))
        q = (BitsAndBytesConfig(load_in_8bit=True) if mode == "int8" else
             BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=compute))
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=q, **_dtype_kwarg(compute), **where)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **_dtype_kwarg(_torch_dtype(mode)), **where)
        model = model.to(device)
    model.gpulab_weights = choice
    return model.eval()


def measure_weights(preset: str, mode: str, device: Any = None) -> tuple[Any, dict]:
    """``(model, info)``: the model loaded in ``mode`` and the memory its weights take.

    ``info``: ``weight_bytes`` (CUDA: allocated bytes added by loading; CPU: parameter and
    buffer bytes), ``footprint_bytes`` (transformers' ``get_memory_footprint``), ``source``."""
    import torch

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
    model = load(preset, mode, device)
    if cuda:
        torch.cuda.synchronize(device)
        used = torch.cuda.memory_allocated(device) - base
    else:
        used = sum(t.numel() * t.element_size() for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values())
    return model, {"mode": mode, "weight_bytes": int(used), "footprint_bytes": int(model.get_memory_footprint()),
                   "source": "torch.cuda.memory_allocated" if cuda else "parameter and buffer bytes (CPU)"}


def held_out_ids(fraction: float = HELD_OUT_FRACTION, tokenizer: Any = None):
    """Token ids of the last ``fraction`` of the shipped book, in ``tokenizer`` (default: the
    shipped one; pass the model's own, :func:`utils.model.models.model_tokenizer`, for real weights)."""
    import torch

    ids = encode(tokenizer if tokenizer is not None else shipped_tokenizer(), load_text())
    return torch.tensor(ids[int(len(ids) * (1 - fraction)):], dtype=torch.long)


def perplexity(model: Any, ids: Any, seq_len: int, max_blocks: int) -> float:
    """``exp`` of the mean next-token loss over up to ``max_blocks`` non-overlapping blocks of
    ``seq_len`` tokens of ``ids``."""
    import torch

    n = min(max_blocks, ids.numel() // seq_len)
    if n < 1:
        raise ValueError(f"{ids.numel()} tokens hold no block of {seq_len}")
    dev = next(model.parameters()).device
    nll = 0.0
    with torch.no_grad():
        for block in ids[: n * seq_len].view(n, seq_len):
            x = block[None].to(dev)
            nll += float(model(input_ids=x, labels=x).loss) * (seq_len - 1)
    return math.exp(nll / (n * (seq_len - 1)))


def compare(preset: str, *, prompt_len: int, new_tokens: int, ppl_seq_len: int, ppl_blocks: int,
            modes: tuple[str, ...] = QUANT_MODES, device: Any = None, max_runs: int = 10, budget_s: float = 3.0) -> dict:
    """Weight memory, decode tokens/s (eager ``generate``, batch 1, TPOT as in
    :func:`utils.serving.inference.measure_decode`) and held-out perplexity of the reference dtype
    and each of ``modes``, one model in memory at a time.

    Returns ``{"reference": mode, "skipped": reason or None, "modes": {mode: {...}}, "not_run":
    {mode: reason}, "weights": line}``; without a usable bitsandbytes only the reference is
    measured and ``skipped`` says why; a mode this GPU cannot run (int8 below compute capability
    7.5) is in ``not_run``; ``weights`` says whether they were real or random, and why."""
    import torch

    from utils.serving.decode import eager_path

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    ref = reference_mode(device)
    ok, why = bitsandbytes_usable()
    if ok and device.type != "cuda":
        ok, why = False, f"the model runs on {device.type}, and bitsandbytes' 8-bit and 4-bit layers on a CUDA GPU"
    usable = usable_modes(device) if ok else ()
    not_run = {m: "bitsandbytes' LLM.int8() needs compute capability 7.5" for m in modes if ok and m not in usable}
    todo = [ref] + ([m for m in modes if m != ref and m in usable] if ok else [])
    _, choice = checkpoint_dir(preset)
    ids = held_out_ids(tokenizer=choice_tokenizer(choice))
    prompt = ids[:prompt_len][None].to(device)
    out: dict[str, Any] = {"reference": ref, "skipped": None if len(todo) > 1 else why, "modes": {}, "not_run": not_run,
                           "weights": choice.line()}
    for mode in todo:
        model, info = measure_weights(preset, mode, device)
        info["perplexity"] = perplexity(model, ids[prompt_len:], ppl_seq_len, ppl_blocks)
        d = measure_decode(eager_path(model, prompt), new_tokens, max_runs=max_runs, budget_s=budget_s)
        info.update({k: d[k] for k in ("t1", "tn", "tpot_ms", "tokens_per_s")})
        out["modes"][mode] = info
        del model, d
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out
