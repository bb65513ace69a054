"""Which weights a lab's model gets: a real open-weights checkpoint from the Hugging Face hub, or
random weights in the same shape, and the one line that says which and why.

Labs 01, 03 and 04 build published shapes (TinyLlama-1.1B, Qwen2.5-0.5B, GPT-2: the presets of
:mod:`utils.model.models`). Where the runtime can reach the hub, they load the real checkpoint of
that shape, so a fine-tune starts from a language model's loss on real text, quantization
changes the perplexity of a real model, and a served model writes text. Elsewhere they fall
back to random weights (honest for speed and memory, meaningless for text) and say so in one
line. The graded checks measure speed and memory, which depend on the shapes, not on the
values, so they hold with either kind.

The choice, in order (:func:`choose`):

1. ``GPULAB_WEIGHTS=random``: random weights, always (``auto``, the default, lets the rest decide);
2. a preset without a checkpoint on the hub (the CPU smoke presets): random weights, unless
   ``GPULAB_HUB_IDS`` names one for it (``llama-tiny=org/name,gpt2-tiny=org/other``: how the
   tests cover the real-weights path with a tiny checkpoint);
3. the checkpoint complete in the local hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``,
   else ``~/.cache/huggingface/hub``; ``models--org--name/snapshots/<revision>/`` as
   ``refs/main`` names it): real weights, with no network, also under ``HF_HUB_OFFLINE=1``;
4. ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``), or the hub unreachable
   (:func:`hub_reachable`): random weights;
5. otherwise the checkpoint is downloaded into that cache (config, safetensors weights,
   tokenizer files: :data:`ALLOW_PATTERNS`); a failed download is one line and random weights.

Cache layout and environment variables: huggingface_hub's "Manage huggingface_hub cache-system"
guide and ``huggingface_hub/constants.py``. They are read here at each call, not at import,
so a test (or a notebook cell) that sets them later is obeyed.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WEIGHTS_VAR = "GPULAB_WEIGHTS"  # auto (default) or random
HUB_IDS_VAR = "GPULAB_HUB_IDS"  # preset=org/name pairs, comma-separated: a checkpoint for a preset without one
WEIGHTS_MODES = ("auto", "random")
# what a causal LM needs from a repository: no TF/Flax/ONNX copies, no pickled .bin weights
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.tiktoken"]


@dataclass(frozen=True)
class WeightsChoice:
    """The weights ``preset`` gets: ``kind`` ``"real"`` (``path`` is the checkpoint's snapshot
    folder) or ``"random"``; ``reason`` says why, in a few words."""

    preset: str
    kind: str
    hub_id: str | None
    path: Path | None
    reason: str

    @property
    def real(self) -> bool:
        return self.kind == "real"

    def line(self) -> str:
        """The one line a lab prints about its model's weights."""
        if self.real:
            return f"{self.preset}: real weights {self.hub_id} {self.reason}"
        return f"{self.preset}: random weights: {self.reason} (honest for speed and memory, not for text)"


def _flag(name: str) -> bool:
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


def offline_var() -> str | None:
    """``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` when either is set to 1, else None."""
    return next((v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if _flag(v)), None)


def is_offline(offline: bool | None = None) -> bool:
    """``offline`` when given; else True under ``HF_HUB_OFFLINE=1`` or when the hub is unreachable."""
    if offline is not None:
        return bool(offline)
    return offline_var() is not None or not hub_reachable()


def weights_mode() -> str:
    """``GPULAB_WEIGHTS``, checked: ``auto`` (the default) or ``random``."""
    mode = os.environ.get(WEIGHTS_VAR, "").strip().lower() or "auto"
    if mode not in WEIGHTS_MODES:
        raise ValueError(f"{WEIGHTS_VAR}={os.environ[WEIGHTS_VAR]!r} is not one of {', '.join(WEIGHTS_MODES)}")
    return mode


def hub_id_overrides() -> dict[str, str]:
    """``GPULAB_HUB_IDS`` as ``{preset: hub_id}``; a malformed entry is a one-line ValueError."""
    out = {}
    for item in filter(None, (s.strip() for s in os.environ.get(HUB_IDS_VAR, "").split(","))):
        preset, sep, hub_id = (s.strip() for s in item.partition("="))
        if not sep or not preset or hub_id.count("/") != 1 or not all(hub_id.split("/")):
            raise ValueError(f"{HUB_IDS_VAR} entry {item!r} is not preset=org/name")
        out[preset] = hub_id
    return out


def hub_id_for(preset: str, default: str | None) -> str | None:
    """The hub repository of ``preset``'s checkpoint: ``GPULAB_HUB_IDS`` first, else ``default``
    (the preset's own, :data:`utils.model.models.MODEL_PRESETS`)."""
    return hub_id_overrides().get(preset) or default


def hub_cache_dir() -> Path:
    """The hub cache as huggingface_hub resolves it, read from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def complete(snapshot: Path) -> bool:
    """A snapshot folder holds a loadable causal LM: ``config.json`` and safetensors weights
    (every shard an index names, when there is an index)."""
    if not (snapshot / "config.json").is_file():
        return False
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError):
            return False
        return bool(shards) and all((snapshot / s).is_file() for s in shards)
    return (snapshot / "model.safetensors").is_file()


def cached_snapshot(hub_id: str) -> Path | None:
    """The complete snapshot of ``hub_id`` at ``refs/main`` in the local cache, or None; no network."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(hub_id, cache_dir=hub_cache_dir(), local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError), a bad id, an unreadable cache: not there
        return None
    return path if complete(path) else None


def _download(hub_id: str) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(hub_id, cache_dir=hub_cache_dir(), allow_patterns=ALLOW_PATTERNS))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def choose(preset: str, hub_id: str | None, download: bool = True) -> WeightsChoice:
    """The weights ``preset`` gets, ``hub_id`` being its own checkpoint (None: none), in the
    order of the module's docstring. ``download=False`` stops at step 4: the cache or random
    weights, never the network."""
    mode = weights_mode()
    hub_id = hub_id_for(preset, hub_id)
    if mode == "random":
        return WeightsChoice(preset, "random", hub_id, None, f"{WEIGHTS_VAR}=random")
    if hub_id is None:
        return WeightsChoice(preset, "random", None, None,
                             f"{preset} is a smoke-size shape with no checkpoint on the hub")
    snap = cached_snapshot(hub_id)
    if snap is not None:
        return WeightsChoice(preset, "real", hub_id, snap, "from the local hub cache")
    var = offline_var()
    if var:
        return WeightsChoice(preset, "random", hub_id, None, f"offline ({var}=1) and {hub_id} is not in the local hub cache")
    if not download:
        return WeightsChoice(preset, "random", hub_id, None, f"{hub_id} is not in the local hub cache")
    if not hub_reachable():
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        return WeightsChoice(preset, "random", hub_id, None, f"offline (the hub at {endpoint} is unreachable)")
    try:
        snap = _download(hub_id)
    except Exception as exc:  # network, authorisation, disk: one line, then random weights
        return WeightsChoice(preset, "random", hub_id, None, f"downloading {hub_id} failed ({_one_line(exc)})")
    if not complete(snap):
        return WeightsChoice(preset, "random", hub_id, None,
                             f"{hub_id} has no config.json and safetensors weights to load")
    return WeightsChoice(preset, "real", hub_id, snap, "from the hub")
