"""A tiny checkpoint written into a local Hugging Face hub cache, in the hub's own layout, so the
real-weights path (``utils.model.weights``, ``utils.model.models.load_model``, ``utils.model.model_dir``) runs
offline under a repository id.

The layout is huggingface_hub's cache (its guide "Manage huggingface_hub cache-system"):
``HF_HOME/hub/models--org--name/`` holds ``blobs/<hash>`` (the files' bytes: a git blob SHA-1
for small files, the SHA-256 for large ones stored in Git LFS, as the hub names them),
``snapshots/<revision>/<file>`` (relative symlinks into ``blobs/``) and ``refs/main`` (the
revision ``main`` points to).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

TINY_REPO = "gpulab-test/tiny-llama"  # a repository id that exists nowhere but in the test's cache
TINY_PRESET = "llama-tiny"
TOKENIZER_VOCAB = 600  # not the shipped tokenizer's 4096: a test can tell the two apart


def _blob_name(data: bytes, lfs: bool) -> str:
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_snapshot(hf_home: Path, repo_id: str, files: dict[str, bytes], revision: str | None = None) -> Path:
    """``files`` (name -> bytes) as the snapshot ``revision`` of ``repo_id`` under ``hf_home``,
    with ``refs/main`` pointing at it; returns the snapshot folder."""
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    revision = revision or hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = _blob_name(data, lfs=name.endswith(".safetensors"))
        (repo / "blobs" / blob).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, link.parent))
    (repo / "refs" / "main").write_text(revision)
    return snap


def write_tiny_llama(hf_home: Path, repo_id: str = TINY_REPO, seed: int = 1234) -> tuple[Path, dict]:
    """A ``llama-tiny`` model with weights drawn from ``seed`` and its own small byte-level BPE
    tokenizer (the model's vocabulary its size), saved by transformers and placed in the cache as ``repo_id``. Returns the
    snapshot folder and the model's state dict (to compare with what a loader loads)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from utils.model.models import EOS_TOKEN, build_model, load_text, train_tokenizer

    torch.manual_seed(seed)
    model = build_model(TINY_PRESET, vocab_size=TOKENIZER_VOCAB)  # a real checkpoint's vocab fits its tokenizer
    tok = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(load_text()[:30_000], TOKENIZER_VOCAB),
                                  eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return write_snapshot(hf_home, repo_id, files), state
