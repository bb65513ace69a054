"""Serve a model with an existing engine: ``transformers serve`` or vLLM, started and stopped from Python.

The course measures engines, it does not write one: this module only builds a model
directory and runs an engine's own OpenAI-compatible server on it as a child process,
waits until it answers, and stops it (process group, SIGTERM then SIGKILL; also at
interpreter exit and, on Linux, when the starting process dies: ``setpriv --pdeathsig``).

    from utils import serve
    d = serve.build_model_dir("llama-tiny")                  # random weights, the preset's shape
    with serve.start(d) as server:                          # transformers serve, continuous batching
        w = loadgen.Workload(**server.workload_fields(), num_requests=8, concurrency=4)

**The model directory** (:func:`build_model_dir`) holds a preset of ``utils/configs`` with
random weights (honest for speed and memory, meaningless for text), the course's shipped
tokenizer, and a ``generation_config.json`` that makes the output length fixed: no
end-of-sequence token (``transformers serve`` rejects vLLM's ``ignore_eos``/``min_tokens``
with 422, REFERENCE.md) and every token id that cannot be streamed as text on its own
suppressed: special tokens, byte pieces of an incomplete UTF-8 character (the streamer holds
them back: a random model that keeps picking one would stream nothing), and the ids of a
preset's vocabulary beyond the tokenizer's 4096. A random tiny Llama otherwise emits only
its end-of-sequence token (REFERENCE.md). vLLM ignores ``suppress_tokens``; its requests
carry the same set as ``allowed_token_ids`` (:meth:`Server.workload_fields`).

**Engines.** ``transformers serve`` (``pip install 'transformers[serving]'``) runs everywhere,
CPU included. ``--continuous-batching`` interleaves concurrent requests (without it, requests
run one ``generate`` at a time); its memory is bounded here by ``--cb-num-blocks`` (the KV
cache) and ``--cb-max-batch-tokens`` (the tokens of one forward step, which size its
activation buffers): given one of them, or neither, it sizes the rest to fill 80% of the free
memory when logits are processed, as here, else 90% (``generation/continuous_batching/cache.py``).
``--quantization bnb-4bit|bnb-8bit`` quantizes on load with bitsandbytes (GPU only). vLLM
where it is installed, on a GPU (``--quantization fp8``). Flags checked against transformers
5.17 and 5.24 (``transformers/cli/serve.py``, ``cli/serving/model_manager.py``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path

ENGINES = ("transformers", "vllm")
QUANTIZATIONS = {"transformers": ("bnb-4bit", "bnb-8bit"), "vllm": ("fp8",)}
MARKER = "gpulab-served.json"  # written last: a directory without it is incomplete
LAYOUT = 1  # bump when the directory's contents change, so stale caches are rebuilt
KV_BLOCK_TOKENS = 256  # transformers' ContinuousBatchingConfig.block_size default
MAX_BATCH_TOKENS = 8192  # transformers' default tokens per forward step of continuous batching (cache.py)
ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class ServeError(Exception):
    """The engine could not be built, started or reached; the message is one line."""


# -- the model directory ------------------------------------------------------------------------

def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | None = None) -> str:
    """fp32 on a CPU (bf16 matmuls are slow there), bf16 on Ampere and newer, fp16 before."""
    import torch

    if (device or default_device()) == "cpu":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp16"


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
    from utils.models import TOKENIZER_FILE, preset_config_dict

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
        raise ServeError(f"{model_dir} is not a model directory from utils.serve.build_model_dir "
                         f"(no readable {MARKER}); build one with serve.build_model_dir(preset)") from None


def build_model_dir(preset: str, dtype: str | None = None, *, root: str | os.PathLike | None = None,
                    device: str | None = None) -> Path:
    """A servable directory for ``preset`` (``utils.models.MODEL_PRESETS``), built once and cached.

    ``dtype``: the weights' dtype (default :func:`default_dtype`). The weights are built on
    ``device`` (default: the GPU if there is one: a 1.1B model initializes in seconds there)
    and written as safetensors; the directory name holds a hash of the preset's config, the
    tokenizer and the dtype, so a changed config builds a new one."""
    from utils.models import MODEL_PRESETS

    if preset not in MODEL_PRESETS:
        raise ServeError(f"unknown preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    if dtype not in ("fp32", "bf16", "fp16"):
        raise ServeError(f"dtype must be fp32, bf16 or fp16, got {dtype!r}")
    base = Path(root) if root is not None else default_root()
    out = base / f"{preset}-{dtype}-{_dir_key(preset, dtype)}"
    if (out / MARKER).is_file():
        return out
    try:
        base.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=base))
    except OSError as e:
        raise ServeError(f"cannot write a model directory under {base}: {e.strerror or e}") from None
    try:
        marker = _write_model(preset, dtype, device, work)
        (work / MARKER).write_text(json.dumps(marker, indent=1))
        try:
            work.rename(out)
        except OSError:  # another process built it meanwhile: use theirs
            if not (out / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _write_model(preset: str, dtype: str, device: str, work: Path) -> dict:
    from transformers.utils import logging as hf_logging

    from utils.models import shipped_tokenizer

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

    from utils.models import build_model

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
    return {"layout": LAYOUT, "preset": preset, "dtype": dtype, "params": n_params, "weight_bytes": weight_bytes,
            "vocab_size": vocab, "tokenizer_size": len(tok), "allowed_token_ids": clean,
            "max_position_embeddings": max_pos,
            "note": "random weights: honest for speed and memory, not for text; no end-of-sequence token, so "
                    "every request generates exactly max_tokens"}


# -- engines ------------------------------------------------------------------------------------

def engine_available(engine: str) -> tuple[bool, str]:
    """``(True, "")`` or ``(False, why, in one line)``."""
    if engine == "transformers":
        try:
            from transformers.utils.import_utils import is_serve_available
        except ImportError:
            return False, "transformers is not installed (pip install 'transformers[serving]')"
        if not is_serve_available():
            return False, "transformers serve needs its extras: pip install 'transformers[serving]'"
        return True, ""
    if engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            return False, "vLLM is not installed (pip install vllm; GPU only)"
        if default_device() != "cuda":
            return False, "vLLM needs a CUDA GPU here"
        return True, ""
    return False, f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}"


def default_engine() -> str:
    """vLLM where it is installed and a GPU is visible, else ``transformers serve``."""
    return "vllm" if engine_available("vllm")[0] else "transformers"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _torch_dtype_name(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]


def engine_command(engine: str, model_dir: Path, marker: dict, *, host: str, port: int, device: str,
                   quantization: str | None, continuous_batching: bool, kv_cache_tokens: int | None,
                   gpu_memory_fraction: float) -> list[str]:
    """The command line that starts ``engine`` (a pure function: tests read it)."""
    model = str(model_dir)
    if engine == "transformers":
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--host", host,
               "--port", str(port), "--device", device, "--dtype", _torch_dtype_name(marker["dtype"]),
               "--log-level", "warning"]
        if continuous_batching:
            cmd.append("--continuous-batching")
            if kv_cache_tokens:  # both, or the engine sizes the other to fill 80% of the free memory
                cmd += ["--cb-num-blocks", str(math.ceil(kv_cache_tokens / KV_BLOCK_TOKENS)),
                        "--cb-max-batch-tokens", str(min(kv_cache_tokens, MAX_BATCH_TOKENS))]
        if quantization:
            cmd += ["--quantization", quantization]
        return cmd
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", model,
           "--host", host, "--port", str(port), "--dtype", _torch_dtype_name(marker["dtype"]),
           "--max-model-len", str(marker["max_position_embeddings"]),
           "--gpu-memory-utilization", f"{gpu_memory_fraction:g}"]
    if quantization:
        cmd += ["--quantization", quantization]
    return cmd


# -- a running server ---------------------------------------------------------------------------

def _kill_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM to the engine's process group (the engine and the workers it spawned, such as
    vLLM's engine core), SIGKILL to what is left after ``timeout_s``; returns when none is left."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the whole group is gone
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or it stays in the group as a zombie
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(1.0)


@dataclass
class Server:
    """A running engine. ``model`` is the name requests must carry; stop it with :meth:`stop`
    or a ``with`` block (it is also stopped at interpreter exit)."""

    engine: str
    model_dir: Path
    model: str
    base_url: str
    port: int
    pid: int
    quantization: str | None
    continuous_batching: bool
    device: str
    log_path: Path
    command: list[str]
    ready_s: float  # start -> answering a request
    marker: dict = field(repr=False, default_factory=dict)
    _proc: subprocess.Popen | None = field(repr=False, default=None)
    _finalizer: object = field(repr=False, default=None)

    @property
    def label(self) -> str:
        batching = "continuous batching" if self.continuous_batching or self.engine == "vllm" else "sequential"
        return f"{self.engine} {batching}, {self.quantization or self.marker.get('dtype', '?')}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        return _log_tail(self.log_path, lines)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the engine's process group, SIGKILL after ``timeout_s``; idempotent."""
        if self._proc is not None:
            _kill_group(self._proc, timeout_s)
        if self._finalizer is not None:
            self._finalizer.detach()

    def workload_fields(self) -> dict:
        """The ``utils.loadgen.Workload`` fields that point a load test at this server:
        ``base_url``, ``model``, ``tokenizer`` (exact prompt lengths), and what fixes the
        output length (vLLM: ``ignore_eos`` and ``allowed_token_ids``; transformers serve:
        the directory's generation config)."""
        fields = {"base_url": self.base_url, "model": self.model, "tokenizer": str(self.model_dir)}
        if self.engine == "vllm":
            fields.update(fixed_output=True, extra_body={"allowed_token_ids": self.marker["allowed_token_ids"]})
        else:
            fields.update(fixed_output=False)
        return fields

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last meaningful lines of a log (progress bars and uvicorn access lines dropped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = []
    for line in text.replace("\r", "\n").splitlines():
        s = line.strip()
        if not s or "it/s]" in s or "%|" in s or s.startswith("INFO:"):
            continue
        keep.append(s)
    return " | ".join(keep[-lines:])[:600]


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 (a local URL we built)
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _warm_up(base_url: str, model: str, timeout_s: float) -> str | None:
    """One streamed 2-token request (it initializes continuous batching); None when it
    streamed text, else why not."""
    body = json.dumps({"model": model, "prompt": "the", "max_tokens": 2, "stream": True}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=max(timeout_s, 1.0)) as r:  # noqa: S310
            text = r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
    except (urllib.error.URLError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None if '"text":' in text or '"content":' in text else f"no generated text in the answer: {text[:200]!r}"


def start(model_dir: str | os.PathLike, *, engine: str = "auto", quantization: str | None = None,
          continuous_batching: bool = True, device: str | None = None, kv_cache_tokens: int | None = None,
          gpu_memory_fraction: float = 0.45, host: str = "127.0.0.1", port: int | None = None,
          timeout_s: float = 300.0, log_dir: str | os.PathLike | None = None) -> Server:
    """Start ``engine`` on a directory from :func:`build_model_dir` and wait until it streams text.

    ``engine``: ``"transformers"``, ``"vllm"`` or ``"auto"`` (:func:`default_engine`).
    ``quantization``: one of :data:`QUANTIZATIONS` for the engine, or None. ``continuous_batching``:
    transformers serve only (vLLM always batches). ``kv_cache_tokens``: KV-cache size for
    transformers' continuous batching (None: the engine's default, 80% of free memory).
    ``gpu_memory_fraction``: vLLM's ``--gpu-memory-utilization``. Raises :class:`ServeError`
    (one line, with the last lines of the engine's log) when the engine exits, or does not
    answer within ``timeout_s``; the process is stopped then."""
    model_dir = Path(model_dir).resolve()
    marker = read_marker(model_dir)
    engine = default_engine() if engine == "auto" else engine
    ok, why = engine_available(engine)
    if not ok:
        raise ServeError(why)
    device = device or default_device()
    if quantization is not None:
        if quantization not in QUANTIZATIONS[engine]:
            raise ServeError(f"{engine} quantization must be one of {', '.join(QUANTIZATIONS[engine])}, got {quantization!r}")
        if device == "cpu":
            raise ServeError(f"{quantization} needs a CUDA GPU (bitsandbytes and fp8 kernels); this run is on the CPU")
        if engine == "transformers" and importlib.util.find_spec("bitsandbytes") is None:
            raise ServeError(f"{quantization} needs bitsandbytes: pip install bitsandbytes")
    if not 0 < gpu_memory_fraction <= 1:
        raise ServeError(f"gpu_memory_fraction must be in (0, 1], got {gpu_memory_fraction}")
    port = port or free_port(host)
    logs = Path(log_dir) if log_dir is not None else default_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{engine}-{port}.log"
    cmd = engine_command(engine, model_dir, marker, host=host, port=port, device=device, quantization=quantization,
                         continuous_batching=continuous_batching, kv_cache_tokens=kv_cache_tokens,
                         gpu_memory_fraction=gpu_memory_fraction)
    launch = cmd
    if sys.platform.startswith("linux") and shutil.which("setpriv"):
        launch = ["setpriv", "--pdeathsig", "TERM", "--", *cmd]  # dies with the process that started it
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(launch, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, start_new_session=True)
    base_url = f"http://{host}:{port}"
    server = Server(engine, model_dir, str(model_dir), base_url, port, proc.pid, quantization,
                    continuous_batching and engine == "transformers", device, log_path, cmd, 0.0, marker, proc)
    server._finalizer = weakref.finalize(server, _kill_group, proc, 5.0)
    try:
        _wait_ready(server, proc, t0, timeout_s)
    except BaseException:
        server.stop(timeout_s=5.0)
        raise
    server.ready_s = round(time.perf_counter() - t0, 3)
    return server


def _wait_ready(server: Server, proc: subprocess.Popen, t0: float, timeout_s: float) -> None:
    deadline = t0 + timeout_s
    what = f"{server.engine} serve" if server.engine == "transformers" else "vLLM"

    def fail(msg: str) -> ServeError:
        tail = server.log_tail()
        return ServeError(f"{msg}" + (f"; its log ends: {tail}" if tail else "") + f" (log: {server.log_path})")

    while True:
        if proc.poll() is not None:
            raise fail(f"{what} exited with status {proc.returncode} before it was ready")
        if _get(f"{server.base_url}/health", 1.0)[0] == 200:
            break
        if time.perf_counter() > deadline:
            raise fail(f"{what} did not answer /health within {timeout_s:g} s (pass a larger timeout_s on a slow machine)")
        time.sleep(0.25)
    # A listing that names other models means another server answers on this port. An error or an
    # empty list proves nothing: transformers serve 5.17 lists the Hub cache only and answers 500
    # when there is none (seen on an offline H200), though it serves any local directory; the
    # warm-up request below is the real test.
    status, body = _get(f"{server.base_url}/v1/models", 5.0)
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
    except (ValueError, AttributeError):
        ids = []
    if ids and server.model not in ids:
        raise fail(f"{what} is up but serves other models, not {server.model} (GET /v1/models: {ids})")
    why = None
    for _ in range(2):  # a first request on a fresh engine can fail while it sets up batching
        why = _warm_up(server.base_url, server.model, deadline - time.perf_counter())
        if why is None:
            return
        if proc.poll() is not None:
            break
    raise fail(f"{what} answered /health but its first request failed: {why}")
