"""Models, tokenizers and text for the labs: real checkpoints from the Hugging Face hub where
the runtime can download them, the same shapes with random weights from the repo otherwise.

:func:`load_model` (the labs' call) and :func:`load_causal_lm` load a preset's real
open-weights checkpoint and its own tokenizer when :mod:`utils.model.weights` finds one (in the
local hub cache, or downloaded); offline (``HF_HUB_OFFLINE=1`` with nothing cached, the hub
unreachable, a failed download) or under ``GPULAB_WEIGHTS=random`` they build the same
architecture from a config shipped in ``utils/configs/`` with random weights, and use the
byte-level BPE tokenizer shipped in ``utils/data/``; :func:`load_model` prints one line
saying which and why. :func:`build_model` is always random. Random weights are honest for
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

import argparse
import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from utils.model import weights as W
from utils.model.weights import hub_reachable, is_offline  # noqa: F401  (re-exported: the labs' and tests' names)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
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
    weights: str  # "pretrained" (a hub checkpoint, downloaded or cached) or "random" (built from a shipped config)
    line: str = ""  # the one line saying which weights and why (utils.model.weights.WeightsChoice.line)


def choose_weights(name: str, download: bool = True) -> W.WeightsChoice:
    """The weights preset ``name`` gets (:func:`utils.model.weights.choose`: ``GPULAB_WEIGHTS``, the
    local hub cache, offline or not); a hub id that is not a preset is its own checkpoint."""
    preset = MODEL_PRESETS.get(name)
    return W.choose(name, preset.hub_id if preset else name, download=download)


@contextmanager
def _quiet():
    """No transformers progress bar ("Loading weights", "Writing model shards") and nothing else
    on stderr: a test cell that writes to stderr scores 0 under nbgrader."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save_quietly(model, path: Path) -> None:
    with _quiet():
        model.save_pretrained(path)


def _load_checkpoint(path: Path, dtype: Any, device: Any, attn_implementation: str):
    """A causal LM from a local snapshot folder, quietly, on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation,
                                                     local_files_only=True, **_dtype_kwarg(_torch_dtype(dtype)))
    return _set_loss_type(model.to(torch.device(device)))


def load_causal_lm(name: str, dtype: Any = "fp32", device: Any = "cpu", attn_implementation: str = "sdpa",
                   offline: bool | None = None, weights: str = "auto") -> LoadedModel:
    """A causal LM and its own tokenizer: the real checkpoint where :func:`choose_weights` finds
    one, random weights from the shipped config otherwise.

    ``name`` is a preset (:data:`MODEL_PRESETS`) or any hub id (real weights only: it has no
    shipped config). ``weights``: ``"auto"`` (:mod:`utils.model.weights` decides), ``"random"``
    (always the shipped config), ``"pretrained"`` (real weights or a one-line ValueError saying
    why not). ``offline=True`` never downloads (a cached checkpoint is still used). A checkpoint
    that does not load falls back to random weights, and ``.line`` says so. Check ``.weights``
    before quoting a loss: from random weights it is noise.
    """
    if weights not in ("auto", "random", "pretrained"):
        raise ValueError(f"weights must be 'auto', 'random' or 'pretrained', got {weights!r}")
    preset = MODEL_PRESETS.get(name)
    if weights == "random":
        choice = W.WeightsChoice(name, "random", preset.hub_id if preset else name, None, "weights='random'")
    else:
        choice = choose_weights(name, download=offline is not True)
    if choice.real:
        try:
            model = _load_checkpoint(choice.path, dtype, device, attn_implementation)
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(choice.path, local_files_only=True)
        except Exception as exc:  # a corrupt or unsupported checkpoint: one line, then random weights
            choice = W.WeightsChoice(name, "random", choice.hub_id, None,
                                     f"loading {choice.hub_id} failed ({W._one_line(exc)})")
        else:
            model.gpulab_weights = choice
            return LoadedModel(model, tokenizer, "pretrained", choice.line())
    if weights == "pretrained":
        raise ValueError(f"no real weights for {name!r}: {choice.reason}")
    if preset is None:
        raise ValueError(f"{name!r} has no shipped config ({choice.reason}, so it needs a preset): "
                         f"use one of {', '.join(MODEL_PRESETS)}")
    model = build_model(name, dtype=dtype, device=device, attn_implementation=attn_implementation)
    model.gpulab_weights = choice
    return LoadedModel(model, shipped_tokenizer(), "random", choice.line())


def load_model(preset: str, dtype: Any = "fp32", device: Any = "cpu", attn_implementation: str = "sdpa"):
    """The labs' model: :func:`load_causal_lm`'s, after printing its one line (which weights,
    and why). Where :func:`build_model` always gives random weights, this gives the real
    checkpoint of the same shape when the runtime can download it or has it cached
    (``GPULAB_WEIGHTS=random`` to opt out: :mod:`utils.model.weights`). Its tokenizer:
    :func:`model_tokenizer`."""
    lm = load_causal_lm(preset, dtype=dtype, device=device, attn_implementation=attn_implementation)
    print(lm.line)
    return lm.model


_RANDOM_DIRS: dict[str, Path] = {}


def checkpoint_dir(preset: str) -> tuple[Path, W.WeightsChoice]:
    """``(folder, choice)``: where ``from_pretrained`` loads ``preset`` from (with a
    quantization config, say), for code that cannot start from a built model. The real
    checkpoint's snapshot when :func:`choose_weights` finds one; else the preset with random
    bf16 weights (seed 0), saved once per process, so that both load the same way."""
    import torch

    choice = choose_weights(preset)
    if choice.real:
        return choice.path, choice
    if preset not in _RANDOM_DIRS:
        path = Path(tempfile.mkdtemp(prefix=f"gpulab-{preset}-"))
        torch.manual_seed(0)
        model = build_model(preset, dtype="bf16", device="cuda" if torch.cuda.is_available() else "cpu")
        _save_quietly(model, path)
        del model
        _RANDOM_DIRS[preset] = path
    return _RANDOM_DIRS[preset], choice


def choice_tokenizer(choice: W.WeightsChoice | None):
    """The tokenizer that goes with weights ``choice``: the real checkpoint's own, or the
    shipped one (4096 ids) for random weights and ``None``."""
    if isinstance(choice, W.WeightsChoice) and choice.real:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(choice.path, local_files_only=True)
    return shipped_tokenizer()


def model_tokenizer(model: Any = None):
    """The tokenizer that goes with ``model``: its checkpoint's own when :func:`load_model`
    (or ``utils.train.training``, ``utils.model.quantize``) loaded real weights, the shipped one otherwise
    or for ``None``."""
    return choice_tokenizer(getattr(model, "gpulab_weights", None))


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
    ``python -m utils.model.models make-tokenizer`` rebuilds ``utils/data/tokenizer.json`` this way.
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
    """The hub tokenizer of a preset or hub id: from the local hub cache when it is there, from
    the hub when online; the shipped one otherwise and under ``GPULAB_WEIGHTS=random``.

    ``None`` and the smoke presets (without a ``GPULAB_HUB_IDS`` entry) always give the
    shipped tokenizer (4096 ids).
    """
    if preset_or_name is None:
        return shipped_tokenizer()
    preset = MODEL_PRESETS.get(preset_or_name)
    hub_id = W.hub_id_for(preset_or_name, preset.tokenizer_hub_id if preset else preset_or_name)
    if hub_id is None or W.weights_mode() == "random":
        return shipped_tokenizer()
    from transformers import AutoTokenizer

    snap = W.cached_snapshot(hub_id)
    if snap is not None:
        return AutoTokenizer.from_pretrained(snap, local_files_only=True)
    if is_offline(offline):
        return shipped_tokenizer()
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
    parser = argparse.ArgumentParser(prog="python -m utils.model.models", description=__doc__.splitlines()[0])
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
