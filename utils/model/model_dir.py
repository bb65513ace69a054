"""A servable model directory: a preset's real checkpoint from the hub cache where there is one
(:func:`real_model_dir`), else its shape with random weights and the shipped tokenizer; either
way a generation config that fixes every request's output length.

Which weights: :mod:`utils.model.weights` (``GPULAB_WEIGHTS=random`` forces random ones).

:func:`build_model_dir` holds a preset of ``utils/configs`` with
random weights (honest for speed and memory, meaningless for text), the course's shipped
tokenizer, and a ``generation_config.json`` that makes the output length fixed: no
end-of-sequence token (``transformers serve`` rejects vLLM's ``ignore_eos``/``min_tokens``
with 422: ``transformers/cli/serve.py``) and every token id that cannot be streamed as text on its own
suppressed: special tokens, byte pieces of an incomplete UTF-8 character (the streamer holds
them back: a random model that keeps picking one would stream nothing), and the ids of a
preset's vocabulary beyond the tokenizer's 4096. A random tiny Llama otherwise emits only
its end-of-sequence token (seen with transformers 5.24). vLLM ignores ``suppress_tokens``; its requests
carry the same set as ``allowed_token_ids`` (:meth:`Server.workload_fields`).

A directory not built here (a checkpoint downloaded from the hub) serves too: its
``config.json`` gives the dtype and the context length, and its output may stop early at an
end-of-sequence token unless the workload asks the engine to ignore it.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path

from utils.device import rehearsal
from utils.model import int8_checkpoint
from utils.model.models import (
    MODEL_PRESETS,
    TOKENIZER_FILE,
    build_model,
    choose_weights,
    preset_config_dict,
    shipped_tokenizer,
)

MARKER = "gpulab-served.json"  # written last: a directory without it is incomplete
LAYOUT = 1  # bump when the directory's contents change, so stale caches are rebuilt


class ServeError(Exception):
    """A model directory cannot be built or read, or an engine cannot be started or reached
    (:mod:`utils.serving.serve`); the message is one line."""


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | None = None, engine: str | None = None) -> str:
    """The weights' dtype for ``device`` and ``engine``: on a CPU fp32 for transformers (its
    bf16 matmuls are slow there) and bf16 for vLLM's CPU build (its kernels' native type); on
    a GPU bf16 from Ampere (compute capability 8.0), fp16 before (a T4 has no bf16), and the
    rehearsed card's choice under a forced smaller tier (``utils.device.rehearsal``)."""
    if (device or default_device()) == "cpu":
        return "bf16" if engine == "vllm" else "fp32"
    return rehearsal.half_dtype()


def clean_token_ids(tokenizer) -> list[int]:
    """Ids that stream as text on their own: not special, and decoding to non-empty text
    without a replacement character (a byte piece of a longer UTF-8 character)."""
    special = set(tokenizer.all_special_ids)
    out = []
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i], skip_special_tokens=False)
        if text and "\ufffd" not in text:
            out.append(i)
    return out


def _dir_key(preset: str, dtype: str) -> str:
    h = hashlib.sha256(json.dumps([LAYOUT, preset, dtype, preset_config_dict(preset)], sort_keys=True).encode())
    h.update(TOKENIZER_FILE.read_bytes())
    return h.hexdigest()[:12]


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "gpulab-served"


def read_marker(model_dir: str | os.PathLike) -> dict:
    """What :func:`build_model_dir` wrote about the directory; ServeError if it is not one of its."""
    p = Path(model_dir) / MARKER
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        raise ServeError(f"{model_dir} is not a model directory from utils.serving.serve.build_model_dir "
                         f"(no readable {MARKER}); build one with serve.build_model_dir(preset)") from None


def build_model_dir(preset: str, dtype: str | None = None, *, root: str | os.PathLike | None = None,
                    device: str | None = None, weights: str = "auto") -> Path:
    """A servable directory for ``preset`` (``utils.model.models.MODEL_PRESETS``), built once and cached.

    ``weights="auto"`` serves the preset's real checkpoint where :mod:`utils.model.weights` finds one
    (cached or downloaded; ``GPULAB_WEIGHTS=random`` opts out): :func:`real_model_dir`, whose
    weights are the hub cache's own files. Otherwise (``weights="random"``, offline, a smoke
    preset) the preset's shape with random weights: ``dtype`` (default :func:`default_dtype`),
    built on ``device`` (default: the GPU if there is one: a 1.1B model initializes in seconds
    there) and written as safetensors; the directory name holds a hash of the preset's config,
    the tokenizer and the dtype, so a changed config builds a new one. With ``weights="auto"``
    it prints one line: which weights, and why."""
    if preset not in MODEL_PRESETS:
        raise ServeError(f"unknown preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    if weights not in ("auto", "random"):
        raise ServeError(f"weights must be 'auto' or 'random', got {weights!r}")
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    if dtype not in ("fp32", "bf16", "fp16"):
        raise ServeError(f"dtype must be fp32, bf16 or fp16, got {dtype!r}")
    if weights == "auto":
        try:
            choice = choose_weights(preset)
        except ValueError as e:  # a malformed GPULAB_WEIGHTS or GPULAB_HUB_IDS
            raise ServeError(str(e)) from None
        if choice.real:
            try:
                out = real_model_dir(preset, choice.hub_id, choice.path, dtype, root=root)
            except ServeError as e:
                print(f"{preset}: random weights: {e}")
            else:
                print(choice.line())
                return out
        else:
            print(choice.line())
    base = Path(root) if root is not None else default_root()
    out = base / f"{preset}-{dtype}-{_dir_key(preset, dtype)}"
    if (out / MARKER).is_file():
        return out
    work = _work_dir(base, out.name)
    try:
        marker = _write_model(preset, dtype, device, work)
        (work / MARKER).write_text(json.dumps(marker, indent=1))
        _publish(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _work_dir(base: Path, name: str) -> Path:
    """A fresh folder under ``base`` to build ``name`` in, renamed into place when complete (:func:`_publish`)."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
    except OSError as e:
        raise ServeError(f"cannot write a model directory under {base}: {e.strerror or e}") from None


def _publish(work: Path, out: Path) -> None:
    """Move a finished directory into place in one rename; if another process got there first,
    keep theirs (its marker is written last, so a directory with one is complete)."""
    try:
        work.rename(out)
    except OSError:
        if not (out / MARKER).is_file():
            raise


def _write_model(preset: str, dtype: str, device: str, work: Path) -> dict:
    from transformers.utils import logging as hf_logging

    tok = shipped_tokenizer()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Writing model shards": a widget in Jupyter, stderr elsewhere
    try:
        return _write_files(preset, dtype, device, work, tok)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _write_files(preset: str, dtype: str, device: str, work: Path, tok) -> dict:
    import torch
    from transformers import GenerationConfig

    with contextlib.redirect_stderr(io.StringIO()):
        torch.manual_seed(0)
        model = build_model(preset, dtype=dtype, device=device).eval()
        vocab = int(model.config.vocab_size)
        clean = [i for i in clean_token_ids(tok) if i < vocab]
        model.config.eos_token_id = model.config.bos_token_id = model.config.pad_token_id = None
        model.generation_config = GenerationConfig(
            do_sample=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
            suppress_tokens=sorted(set(range(vocab)) - set(clean)))
        model.save_pretrained(work)
        tok.save_pretrained(work)
    n_params = sum(p.numel() for p in model.parameters())
    max_pos = int(getattr(model.config, "max_position_embeddings", 2048))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    return {"layout": LAYOUT, "preset": preset, "weights": "random", "dtype": dtype, "params": n_params,
            "weight_bytes": weight_bytes, "vocab_size": vocab, "tokenizer_size": len(tok), "allowed_token_ids": clean,
            "max_position_embeddings": max_pos,
            "note": "random weights: honest for speed and memory, not for text; no end-of-sequence token, so "
                    "every request generates exactly max_tokens"}


_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_NOT_LINKED = ("config.json", "generation_config.json", MARKER)


def safetensors_params(path: Path) -> int:
    """Parameters stored in a safetensors file, from its header alone (8 bytes of little-endian
    length, then JSON: name -> dtype, shape, offsets; the safetensors format's README)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def real_model_dir(preset: str, hub_id: str, snapshot: str | os.PathLike, dtype: str, *,
                   root: str | os.PathLike | None = None) -> Path:
    """A servable directory for a real checkpoint: every file of the hub cache's ``snapshot``
    linked (the engine reads the cache's own weights and tokenizer; nothing is copied), and
    two rewritten: ``config.json`` and ``generation_config.json`` without an end-of-sequence
    token and with the special tokens suppressed, so every request generates exactly
    ``max_tokens`` as with random weights (the load tests count on it); and the marker, which
    names ``preset`` (what the lab serves), the ``dtype`` the engine is told to load it in, and
    the weight bytes at that dtype. The name holds a hash of the revision and the dtype."""
    from transformers import AutoTokenizer

    snap = Path(snapshot)
    if not (snap / "config.json").is_file():
        raise ServeError(f"{snap} has no config.json: not a checkpoint")
    shards = sorted(snap.glob("*.safetensors"))
    if not shards:
        raise ServeError(f"{snap} has no safetensors weights")
    if dtype not in _BYTES:
        raise ServeError(f"dtype must be fp32, bf16 or fp16, got {dtype!r}")
    key = hashlib.sha256(json.dumps([LAYOUT, hub_id, snap.name, dtype]).encode()).hexdigest()[:12]
    base = Path(root) if root is not None else default_root()
    out = base / f"{preset}-{dtype}-real-{key}"
    if (out / MARKER).is_file():
        return out
    work = _work_dir(base, out.name)
    try:
        for f in snap.iterdir():
            if f.is_file() and f.name not in _NOT_LINKED:
                (work / f.name).symlink_to(f.absolute())
        cfg = json.loads((snap / "config.json").read_text())
        gen_path = snap / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        with contextlib.redirect_stderr(io.StringIO()):
            tok = AutoTokenizer.from_pretrained(snap, local_files_only=True)
        cfg["eos_token_id"] = None
        gen = {k: v for k, v in gen.items() if k in ("transformers_version", "bos_token_id", "max_length")}
        gen.update(do_sample=False, eos_token_id=None, pad_token_id=None,
                   suppress_tokens=sorted(set(tok.all_special_ids)))
        (work / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (work / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        text = cfg.get("text_config", cfg)
        params = sum(safetensors_params(p) for p in shards)
        marker = {"layout": LAYOUT, "preset": preset, "weights": "real", "hub_id": hub_id, "revision": snap.name,
                  "snapshot": str(snap), "dtype": dtype, "params": params, "weight_bytes": params * _BYTES[dtype],
                  "vocab_size": int(text.get("vocab_size", len(tok))), "tokenizer_size": len(tok),
                  "allowed_token_ids": None, "max_position_embeddings": int(text.get("max_position_embeddings", 2048)),
                  "note": f"real weights of {hub_id}: no end-of-sequence token, so every request generates exactly "
                          "max_tokens"}
        (work / MARKER).write_text(json.dumps(marker, indent=1))
        _publish(work, out)
    except ServeError:
        raise
    except Exception as e:  # an unreadable file, a tokenizer that does not load: one line
        raise ServeError(f"cannot serve {hub_id} from {snap}: {type(e).__name__}: {str(e)[:160]}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def model_facts(model_dir: Path) -> dict:
    """What starting needs to know of a directory: :func:`build_model_dir`'s marker, or, for
    any other checkpoint (real weights from the hub, say), its ``config.json``."""
    if (model_dir / MARKER).is_file():
        return read_marker(model_dir)
    cfg_path = model_dir / "config.json"
    if not model_dir.is_dir():
        raise ServeError(f"{model_dir} is not a directory: pass a model directory (serve.build_model_dir(preset), "
                         "or a downloaded checkpoint)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except OSError:
        raise ServeError(f"{model_dir} has no config.json, so it is not a model directory: build one with "
                         "serve.build_model_dir(preset) or point at a downloaded checkpoint") from None
    except ValueError as e:
        raise ServeError(f"{cfg_path} is not valid JSON ({e}); re-download or rebuild the checkpoint") from None
    text = cfg.get("text_config", cfg)
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(cfg.get("torch_dtype") or cfg.get("dtype")))
    return {"dtype": dtype or "auto", "max_position_embeddings": int(text.get("max_position_embeddings", 2048)),
            "allowed_token_ids": None, "note": "a checkpoint not built by utils.serving.serve: its output may stop at "
                                               "an end-of-sequence token unless the request asks to ignore it"}


def quantized_model_dir(model_dir: str | os.PathLike, fmt: str = "w8a8") -> Path:
    """``model_dir`` with its decoder's linear weights quantized ahead of time
    (:mod:`utils.model.int8_checkpoint`: ``"w8a8"`` int8 weights and activations, ``"w4a16"`` 4-bit
    weights), written once beside it as ``<name>-<fmt>`` and reused. vLLM serves both, its CPU
    build included (compressed-tensors)."""
    src = Path(model_dir).resolve()
    out = src.parent / f"{src.name}-{fmt}"
    if (out / MARKER).is_file():
        return out
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=src.parent))
    try:
        try:
            writer = {"w8a8": int8_checkpoint.write_w8a8, "w4a16": int8_checkpoint.write_w4a16}[fmt]
        except KeyError:
            raise ServeError(f"fmt must be one of w8a8, w4a16, got {fmt!r}") from None
        try:
            writer(src, work)
        except int8_checkpoint.CheckpointError as e:
            raise ServeError(str(e)) from None
        if not (work / MARKER).is_file():
            raise ServeError(f"{src} has no {MARKER}: quantize a directory from build_model_dir")
        _publish(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out

