"""Models, tokenizers and text for the labs: from the Hugging Face hub online, from the repo offline.

Online, :func:`load_causal_lm` loads pretrained weights and the model's own tokenizer from
the hub. Offline (``HF_HUB_OFFLINE=1``, the hub unreachable, or ``offline=True``) it builds
the same architecture from a config shipped in ``utils/configs/`` with random weights, and
uses the byte-level BPE tokenizer shipped in ``utils/data/``. Random weights are honest for
speed and memory (the same shapes run the same kernels and hold the same bytes) and say
nothing about quality: loss, perplexity and generated text from them are noise.

Presets (:data:`MODEL_PRESETS`): ``gpt2-small`` (GPT-2 124M), ``llama-1.1b`` (TinyLlama
1.1B shape: 22 layers, hidden 2048, MLP 5632, 32 heads, 4 KV heads, vocab 32000),
``qwen2.5-0.5b`` (Qwen2.5-0.5B shape), and CPU smoke versions ``gpt2-tiny``,
``llama-tiny``, ``qwen-tiny`` (2 layers, width 128, vocab 4096). Every config names its
source in its ``_source`` key and in ``utils/configs/README.md``.

Token ids and vocab sizes: the shipped tokenizer has 4096 ids, which the tiny presets'
vocab equals and every full preset's vocab exceeds, so its ids are always valid embedding
rows. A hub tokenizer goes only with its own model. :func:`token_batches` and
:class:`TokenBlocks` take ``vocab_size`` and refuse ids at or above it, so a mismatch is a
one-line error instead of a CUDA device-side assert. The special token ids in a full
preset's config (GPT-2's eos 50256, say) are the hub tokenizer's; with the shipped tokenizer
its ``<|endoftext|>`` is id 0.

The text is Project Gutenberg eBook #8868, *Botchan (Master Darling)* by Natsume Soseki,
translated by Yasotaro Morri, revised by J. R. Kennedy (1919; public domain in the USA);
``utils/data/README.md`` says where the copy comes from.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DATA_DIR = Path(__file__).resolve().parent / "data"
TEXT_FILE = DATA_DIR / "botchan.txt"
TOKENIZER_FILE = DATA_DIR / "tokenizer.json"
SHIPPED_VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class ModelPreset:
    config_file: str  # under utils/configs/
    hub_id: str | None  # pretrained weights on the hub; None for the smoke presets
    tokenizer_hub_id: str | None  # None: always the shipped tokenizer
    description: str


MODEL_PRESETS: dict[str, ModelPreset] = {
    "gpt2-small": ModelPreset("gpt2-small.json", "openai-community/gpt2", "openai-community/gpt2",
                              "GPT-2 124M: 12 layers, width 768, 12 heads, tied embeddings"),
    "llama-1.1b": ModelPreset("llama-1.1b.json", "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                              "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                              "TinyLlama 1.1B: 22 layers, hidden 2048, 32 heads, 4 KV heads"),
    "qwen2.5-0.5b": ModelPreset("qwen2.5-0.5b.json", "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B",
                                "Qwen2.5 0.5B: 24 layers, hidden 896, 14 heads, 2 KV heads, tied"),
    "gpt2-tiny": ModelPreset("gpt2-tiny.json", None, None, "GPT-2 shape, 2 layers, width 128 (CPU smoke)"),
    "llama-tiny": ModelPreset("llama-tiny.json", None, None, "Llama shape, 2 layers, hidden 128 (CPU smoke)"),
    "qwen-tiny": ModelPreset("qwen-tiny.json", None, None, "Qwen2 shape, 2 layers, hidden 128 (CPU smoke)"),
}


def _preset(name: str) -> ModelPreset:
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


# --------------------------------------------------------------------------- online or offline

def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to the hub (``HF_ENDPOINT``, default huggingface.co:443) opens
    within ``timeout_s``.

    A socket probe, because a failing download retries for much longer. It runs in a daemon
    thread so that a hanging DNS lookup (which the socket timeout does not cover) is bounded
    too. Cached per process.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host.partition(":")
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, int(port or 443)), timeout=timeout_s):
                result.append(True)
        except (OSError, ValueError):
            result.append(False)

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return bool(result and result[0])


def is_offline(offline: bool | None = None) -> bool:
    """``offline`` when given; else True under ``HF_HUB_OFFLINE=1`` or when the hub is unreachable."""
    if offline is not None:
        return bool(offline)
    return _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE") or not hub_reachable()


# --------------------------------------------------------------------------- configs and models

def preset_config_dict(preset: str) -> dict:
    """The shipped ``config.json`` of ``preset`` (without the ``_source`` note)."""
    data = json.loads((CONFIG_DIR / _preset(preset).config_file).read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def preset_config(preset: str, **overrides: Any):
    """A transformers config for ``preset`` built offline (``AutoConfig.for_model``)."""
    from transformers import AutoConfig

    data = preset_config_dict(preset)
    data.update(overrides)
    return AutoConfig.for_model(data.pop("model_type"), **data)


def _torch_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use a torch dtype or one of bf16, fp16, fp32")
    return names[dtype]


def _dtype_kwarg(dtype) -> dict:
    """transformers renamed ``torch_dtype`` to ``dtype`` in 4.56; the old name warns on stderr."""
    import transformers
    from packaging.version import Version

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {key: dtype}


def build_model(preset: str, dtype: Any = "fp32", device: Any = "cpu", attn_implementation: str = "sdpa",
                **config_overrides: Any):
    """The preset's architecture with random weights, from the shipped config (no network).

    Random weights are honest for speed and memory, not for quality. ``device="meta"``
    builds shapes only (no memory, instant): use it to count parameters of the large presets.
    The model is built directly on ``device`` (a ``torch.device`` context), so a 1.1B model
    never passes through host memory in fp32. ``config_overrides`` change config fields,
    e.g. ``num_hidden_layers=4``. The model comes in train mode (dropout on where the config
    has it); call ``.eval()`` for inference timing.
    """
    import torch
    from transformers import AutoModelForCausalLM

    cfg = preset_config(preset, **config_overrides)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation,
                                                 **_dtype_kwarg(_torch_dtype(dtype)))
    return _set_loss_type(model)


def _set_loss_type(model):
    """GPT2LMHeadModel's class name matches no entry of transformers' loss table, so its first
    loss logs "loss_type=None ... unrecognized" on stderr (a zero under nbgrader). Its loss is
    the plain causal-LM loss; name it."""
    if hasattr(model, "loss_type") and model.loss_type is None:
        model.loss_type = "ForCausalLM"
    return model


class LoadedModel(NamedTuple):
    model: Any
    tokenizer: Any
    weights: str  # "pretrained" (from the hub or its cache) or "random" (built from a shipped config)


def load_causal_lm(name: str, dtype: Any = "fp32", device: Any = "cpu", attn_implementation: str = "sdpa",
                   offline: bool | None = None, weights: str = "auto") -> LoadedModel:
    """A causal LM and its tokenizer: pretrained from the hub online, random from a shipped config offline.

    ``name`` is a preset (:data:`MODEL_PRESETS`) or, online only, any hub id.
    ``weights``: ``"auto"`` (pretrained online, random offline), ``"random"`` (always the
    shipped config), ``"pretrained"`` (from the hub; with ``HF_HUB_OFFLINE=1`` transformers
    reads only its local cache, so this is how to use cached weights offline). Smoke presets
    have no hub weights and are always random. Check ``.weights`` before quoting a loss.
    """
    if weights not in ("auto", "random", "pretrained"):
        raise ValueError(f"weights must be 'auto', 'random' or 'pretrained', got {weights!r}")
    preset = MODEL_PRESETS.get(name)
    hub_id = preset.hub_id if preset else name
    use_hub = hub_id is not None and (weights == "pretrained" or (weights == "auto" and not is_offline(offline)))
    if not use_hub:
        if preset is None:
            why = "weights='random' needs" if weights == "random" else "the hub is offline, so it needs"
            raise ValueError(f"{name!r} has no shipped config ({why} a preset): use one of {', '.join(MODEL_PRESETS)}")
        model = build_model(name, dtype=dtype, device=device, attn_implementation=attn_implementation)
        return LoadedModel(model, get_tokenizer(name, offline=True), "random")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hub_id, attn_implementation=attn_implementation,
                                                 **_dtype_kwarg(_torch_dtype(dtype)))
    model = _set_loss_type(model.to(torch.device(device)))
    tok_id = preset.tokenizer_hub_id if preset else hub_id
    return LoadedModel(model, get_tokenizer(tok_id, offline=False), "pretrained")


# --------------------------------------------------------------------------- text and tokenizer

def load_text(full: bool = False) -> str:
    """The shipped public-domain book, with Unix newlines.

    By default only the book: the text between Project Gutenberg's ``*** START`` and
    ``*** END`` lines. ``full=True`` returns the file as shipped, licence included.
    """
    raw = TEXT_FILE.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    if full:
        return raw
    start = raw.index("\n", raw.index("*** START OF")) + 1
    end = raw.index("*** END OF")
    trailer = raw.find("\nEnd of Project Gutenberg", start, end)
    return raw[start:trailer if trailer != -1 else end].strip("\n") + "\n"



def train_tokenizer(text: str, vocab_size: int = SHIPPED_VOCAB_SIZE):
    """A byte-level BPE tokenizer (``tokenizers``) trained on ``text``; ``<|endoftext|>`` is id 0.

    Byte-level, as GPT-2's: any UTF-8 text encodes, and decoding returns it unchanged.
    ``python -m utils.models make-tokenizer`` rebuilds ``utils/data/tokenizer.json`` this way.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def shipped_tokenizer():
    """The shipped tokenizer as a transformers fast tokenizer (same interface as a hub one)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_FILE), eos_token=EOS_TOKEN,
                                   bos_token=EOS_TOKEN, unk_token=EOS_TOKEN, model_max_length=1 << 30)


def get_tokenizer(preset_or_name: str | None = None, offline: bool | None = None):
    """The hub tokenizer of a preset or hub id when online; the shipped one otherwise.

    ``None`` and the smoke presets always give the shipped tokenizer (4096 ids).
    """
    if preset_or_name is None:
        return shipped_tokenizer()
    preset = MODEL_PRESETS.get(preset_or_name)
    hub_id = preset.tokenizer_hub_id if preset else preset_or_name
    if hub_id is None or is_offline(offline):
        return shipped_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hub_id)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens and without the too-long-sequence warning
    (a warning on stderr costs a test cell its points under nbgrader)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.encode(text, add_special_tokens=False).ids
    if hasattr(tokenizer, "encode") and hasattr(tokenizer, "get_vocab_size"):  # a tokenizers.Tokenizer
        return tokenizer.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


# --------------------------------------------------------------------------- training batches

def _token_tensor(tokenizer: Any, text: str | None, vocab_size: int | None):
    import torch

    ids = torch.tensor(encode(tokenizer, load_text() if text is None else text), dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("the text encodes to no tokens")
    if vocab_size is not None and int(ids.max()) >= vocab_size:
        raise ValueError(f"token id {int(ids.max())} >= vocab_size {vocab_size}: this tokenizer does not fit the model; "
                         "use the model's own tokenizer or get_tokenizer(None)")
    return ids


class TokenBlocks:
    """A torch-style Dataset of non-overlapping token blocks: ``ds[i] -> (input_ids, labels)``.

    Hugging Face convention by default: ``labels`` equals ``input_ids`` (``seq_len`` long) and
    the model shifts them inside its loss; passing already-shifted labels to an HF model
    would train it to predict two tokens ahead. ``shifted=True`` gives nanoGPT's convention
    instead: ``input_ids = block[:-1]``, ``labels = block[1:]``. The text is tokenized once.
    """

    def __init__(self, tokenizer: Any, text: str | None = None, seq_len: int = 128,
                 vocab_size: int | None = None, shifted: bool = False):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.ids = _token_tensor(tokenizer, text, vocab_size)
        self.seq_len, self.shifted = seq_len, shifted
        self.block = seq_len + 1 if shifted else seq_len
        if self.ids.numel() < self.block:
            raise ValueError(f"the text has {self.ids.numel()} tokens, fewer than one block of {self.block}; "
                             "use a shorter seq_len or more text")

    def __len__(self) -> int:
        return self.ids.numel() // self.block

    def __getitem__(self, i: int):
        if not -len(self) <= i < len(self):
            raise IndexError(f"block {i} out of range for {len(self)} blocks")
        i %= len(self)
        block = self.ids[i * self.block:(i + 1) * self.block]
        if self.shifted:
            return block[:-1].clone(), block[1:].clone()
        return block.clone(), block.clone()


def token_batches(tokenizer: Any, text: str | None, batch_size: int, seq_len: int, device: Any = None,
                  vocab_size: int | None = None, steps: int | None = None,
                  shifted: bool = False) -> Iterator[tuple[Any, Any]]:
    """Batches ``(input_ids, labels)`` of shape ``(batch_size, seq_len)``, in text order.

    Cycles over :class:`TokenBlocks` (wrapping around the text) forever, or for ``steps``
    batches. ``text=None`` uses :func:`load_text`. Moved with a plain ``.to(device)``:
    pinned memory and overlap are the lesson of phase 1, not a default here.
    """
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ds = TokenBlocks(tokenizer, text, seq_len, vocab_size=vocab_size, shifted=shifted)
    n, step, cursor = len(ds), 0, 0
    while steps is None or step < steps:
        pairs = [ds[(cursor + j) % n] for j in range(batch_size)]
        cursor = (cursor + batch_size) % n
        x = torch.stack([p[0] for p in pairs])
        y = torch.stack([p[1] for p in pairs])
        if device is not None:
            x, y = x.to(device), y.to(device)
        yield x, y
        step += 1


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.models", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-tokenizer", help="retrain utils/data/tokenizer.json from the shipped text")
    mk.add_argument("--vocab-size", type=int, default=SHIPPED_VOCAB_SIZE)
    mk.add_argument("--out", type=Path, default=TOKENIZER_FILE)
    sub.add_parser("presets", help="list the presets")
    args = parser.parse_args(argv)
    if args.cmd == "make-tokenizer":
        train_tokenizer(load_text(), args.vocab_size).save(str(args.out))
        print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    else:
        for name, p in MODEL_PRESETS.items():
            print(f"{name:14s} {p.hub_id or '(random only)':40s} {p.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
