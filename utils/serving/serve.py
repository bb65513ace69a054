"""Serve a model with an existing engine (``transformers serve``, vLLM, SGLang), started and stopped from Python.

The course measures engines, it does not write one: this module only builds a model
directory and runs an engine's own OpenAI-compatible server on it as a child process,
waits until it answers, and stops it (process group, SIGTERM then SIGKILL; also at
interpreter exit and, on Linux, when the starting process dies: ``setpriv --pdeathsig``).

    from utils.serving import serve
    d = serve.build_model_dir("llama-tiny")                  # random weights, the preset's shape
    with serve.start(d) as server:                          # transformers serve, continuous batching
        w = loadgen.Workload(**server.workload_fields(), num_requests=8, concurrency=4)

The model directory is :mod:`utils.model.model_dir`'s (:func:`build_model_dir`, re-exported here).

**Engines** (:mod:`utils.serving.engines`: where each is installed, its command line, its start-up
facts). ``transformers serve`` (``pip install 'transformers[serving]'``) runs everywhere, CPU
included. ``--continuous-batching`` interleaves concurrent requests (without it, requests run
one ``generate`` at a time); its memory is bounded here by ``--cb-num-blocks`` (the KV cache)
and ``--cb-max-batch-tokens`` (the tokens of one forward step, which size its activation
buffers): given one of them, or neither, it sizes the rest to fill 80% of the free memory
when logits are processed, as here, else 90% (``generation/continuous_batching/cache.py``).
``--quantization bnb-4bit|bnb-8bit`` quantizes on load with bitsandbytes (GPU only). Flags
checked against transformers 5.17 and 5.24 (``transformers/cli/serve.py``,
``cli/serving/model_manager.py``). vLLM's GPU build on a CUDA GPU (``--quantization fp8``,
``--kv-cache-dtype fp8``), its CPU build on x86 with AVX-512 or AMX (``--kv-cache-dtype fp8``; no fp8 weights; :func:`utils.serving.engines.cpu_fp8_kv_cache_absent`);
SGLang on a CUDA GPU.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from utils.model.model_dir import (  # noqa: F401
    MARKER,
    ServeError,
    build_model_dir,
    clean_token_ids,
    default_device,
    default_dtype,
    default_root,
    model_facts,
    quantized_model_dir,
    read_marker,
)
from utils.serving import engines

ENGINES = engines.ENGINES
QUANTIZATIONS = engines.QUANTIZATIONS
ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


# -- engines ------------------------------------------------------------------------------------

def engine_available(engine: str) -> tuple[bool, str]:
    """``(True, "")`` or ``(False, why, in one line)`` (:func:`utils.serving.engines.available`)."""
    return engines.available(engine)


def default_engine() -> str:
    """vLLM where it can run here (GPU build on a GPU, CPU build anywhere), else ``transformers serve``."""
    return engines.default_engine()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


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
    """A running engine. ``model`` is the name requests must carry; ``facts`` what the engine
    said it allocated (:class:`utils.serving.engines.EngineFacts`). Stop it with :meth:`stop` or a
    ``with`` block (it is also stopped at interpreter exit)."""

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
    install: engines.EngineInstall | None = field(repr=False, default=None)
    options: engines.EngineOptions | None = field(repr=False, default=None)
    facts: engines.EngineFacts | None = None
    _proc: subprocess.Popen | None = field(repr=False, default=None)
    _finalizer: object = field(repr=False, default=None)

    @property
    def label(self) -> str:
        batching = "continuous batching" if self.continuous_batching or self.engine != "transformers" else "sequential"
        kv = f", {self.options.kv_cache_dtype} KV cache" if self.options and self.options.kv_cache_dtype else ""
        weights = self.quantization or (self.marker.get("quantization") or {}).get("format") or self.marker.get("dtype", "?")
        return f"{self.engine} {batching}, {weights}{kv}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        return _log_tail(self.log_path, lines)

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """The engine's Prometheus page (``/metrics``), or "" where it has none."""
        status, body = _get(f"{self.base_url}/metrics", timeout_s)
        return body.decode(errors="replace") if status == 200 else ""

    def process_ids(self) -> list[int]:
        """The engine's process and every process it started (vLLM's engine core and workers)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            return [root.pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.Error:
            return []

    def resident_gib(self) -> float | None:
        """Resident memory of the engine's whole process tree (GiB), the memory it really holds
        on a CPU; shared pages are counted once per process, so this is an upper bound."""
        import psutil

        total = 0
        for pid in self.process_ids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total / 1024**3 if total else None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the engine's process group, SIGKILL after ``timeout_s``; idempotent."""
        if self._proc is not None:
            _kill_group(self._proc, timeout_s)
            self._proc = None  # once its group is gone, its id may name another process's group
        if self._finalizer is not None:
            self._finalizer.detach()

    def workload_fields(self) -> dict:
        """The ``utils.serving.loadgen.Workload`` fields that point a load test at this server:
        ``base_url``, ``model``, ``tokenizer`` (exact prompt lengths), and what fixes the
        output length (vLLM and SGLang: ``ignore_eos``, and for vLLM the first
        :data:`utils.serving.engines.VLLM_MAX_ALLOWED_TOKEN_IDS` of the directory's
        ``allowed_token_ids``; transformers serve: the directory's generation config)."""
        fields = {"base_url": self.base_url, "model": self.model, "tokenizer": str(self.model_dir)}
        if self.engine == "transformers":
            fields.update(fixed_output=False)
        else:
            fields.update(fixed_output=True)
            if self.engine == "vllm" and self.marker.get("allowed_token_ids"):
                allowed = self.marker["allowed_token_ids"][:engines.VLLM_MAX_ALLOWED_TOKEN_IDS]
                fields.update(extra_body={"allowed_token_ids": allowed})
        return fields

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_NOISE = ("it/s]", "%|", "INFO:")
_GENERIC = ("Engine core initialization failed", "WorkerProc initialization failed", "EngineDeadError",
            'RuntimeError("cancelled")', "RuntimeError: cancelled", "See stack trace", "See root cause")
_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)|OutOfMemoryError|AssertionError): (.+)")


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last meaningful lines of a log (progress bars and uvicorn access lines dropped)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [s for s in (ln.strip() for ln in text.replace("\r", "\n").splitlines())
            if s and not any(n in s for n in _NOISE)]
    return " | ".join(keep[-lines:])[:600]


def root_cause(log_text: str) -> str | None:
    """The first specific ``SomethingError: message`` in an engine's log, the cause a crash
    at start-up reports before the generic lines that end it ("Engine core initialization
    failed. See root cause above"). A pydantic ``ValidationError`` (vLLM's config checks)
    gives its reason on the next, indented line: that line is the message."""
    lines = log_text.replace("\r", "\n").splitlines()
    for i, line in enumerate(lines):
        m = _ERROR_LINE.search(line)
        if m and not any(g in line for g in _GENERIC) and "ulimit" not in line:
            msg = m.group(2).strip()
            if m.group(1) == "ValidationError" and i + 1 < len(lines) and lines[i + 1][:1].isspace():
                detail = lines[i + 1].strip().removeprefix("Value error, ")
                msg = f"{msg}: {detail.split(' [type=')[0]}"
            return f"{m.group(1)}: {msg}"[:400]
    return None


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
          kv_cache_dtype: str | None = None, continuous_batching: bool = True, device: str | None = None,
          kv_cache_tokens: int | None = None, kv_cache_gib: float | None = None, max_model_len: int | None = None,
          block_size: int | None = None, gpu_memory_fraction: float = 0.4, enforce_eager: bool = False,
          host: str = "127.0.0.1", port: int | None = None, timeout_s: float | None = None,
          log_dir: str | os.PathLike | None = None, warm_up: bool = True) -> Server:
    """Start ``engine`` on a model directory and wait until it streams text; the one starter of
    the course (labs 03 and 04, the benchmarks, the tests).

    ``engine``: ``"transformers"``, ``"vllm"``, ``"sglang"`` or ``"auto"``
    (:func:`default_engine`). ``quantization``: one of :data:`utils.serving.engines.QUANTIZATIONS`;
    ``kv_cache_dtype``: vLLM ``fp8``, SGLang ``fp8_e4m3``. ``continuous_batching``: transformers
    serve only (vLLM and SGLang always batch). ``kv_cache_tokens``: transformers' cache size
    (None: 80% of free memory); ``kv_cache_gib``: vLLM's CPU build (``VLLM_CPU_KVCACHE_SPACE``,
    whole GiB, default 1); ``gpu_memory_fraction``: vLLM's ``--gpu-memory-utilization`` and
    SGLang's ``--mem-fraction-static``, 0.4 by default so that two engines fit one 15 GiB T4 beside
    the notebook (lab 04 starts a comparison engine while its own is up; each engine also holds
    about 1 GiB outside its share, ``utils.course.lab_memory.ENGINE_OUTSIDE_SHARE_GIB``; with two engines up,
    lab 04 peaked at 15,028 of a T4's 15,360 MiB on an H200 rehearsing a T4, benchmarks/RESULTS.md).
    ``max_model_len`` (default: the model's ``max_position_embeddings``) and ``block_size`` (default: the engine's) go to vLLM and
    SGLang. ``enforce_eager``: vLLM without compile and CUDA graphs (on vLLM 0.32's CPU build
    the worker then dies at the first request: pass ``warm_up=False`` to only read what it
    allocated). ``timeout_s``: default 300 s, 900 s for vLLM and SGLang (compiling, CUDA graphs).

    Raises :class:`ServeError` (one line: the engine's own error from its log where it gave
    one) when the engine is missing, exits, or does not answer in time; the process is stopped
    then. The returned server's ``facts`` hold what the engine allocated."""
    model_dir = Path(model_dir).resolve()
    marker = model_facts(model_dir)
    try:
        engine = default_engine() if engine == "auto" else engine
        install = engines.find(engine)
    except engines.EngineError as e:
        raise ServeError(str(e)) from None
    if install.device == "cuda" and not engines.cuda_visible():
        raise ServeError(engines.available(engine)[1])
    device = "cpu" if install.device == "cpu" else device or default_device()
    port = port or free_port(host)
    if _port_in_use(host, port):
        raise ServeError(f"port {port} on {host} is already in use (another server?): pass another port, or none to "
                         "get a free one")
    opts = engines.EngineOptions(host=host, port=port, device=device, quantization=quantization,
                                 kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len, block_size=block_size,
                                 kv_cache_gib=kv_cache_gib, kv_cache_tokens=kv_cache_tokens,
                                 gpu_memory_fraction=gpu_memory_fraction,
                                 continuous_batching=continuous_batching and engine == "transformers",
                                 enforce_eager=enforce_eager)
    try:
        engines.check_options(engine, opts, device)
    except engines.EngineError as e:
        raise ServeError(str(e)) from None
    timeout_s = timeout_s if timeout_s is not None else 300.0 if engine == "transformers" else 900.0
    logs = Path(log_dir) if log_dir is not None else default_root() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{engine}-{port}.log"
    cmd, extra_env = engines.command(install, model_dir, marker.get("dtype", "auto"),
                                     int(marker.get("max_position_embeddings", 2048)), opts)
    launch = cmd
    if sys.platform.startswith("linux") and shutil.which("setpriv"):
        launch = ["setpriv", "--pdeathsig", "TERM", "--", *cmd]  # dies with the process that started it
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(launch, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV, **extra_env}, start_new_session=True)
    server = Server(engine, model_dir, str(model_dir), f"http://{host}:{port}", port, proc.pid, quantization,
                    opts.continuous_batching, device, log_path, cmd, 0.0, marker, install, opts, None, proc)
    server._finalizer = weakref.finalize(server, _kill_group, proc, 5.0)
    try:
        _wait_ready(server, proc, t0, timeout_s, warm_up)
        server.facts = read_facts(server)
    except BaseException:
        server.stop(timeout_s=5.0)
        raise
    server.ready_s = round(time.perf_counter() - t0, 3)
    return server


def read_facts(server: Server) -> engines.EngineFacts:
    """What the running engine says it allocated (log and, for vLLM, ``/metrics``)."""
    if server.engine == "vllm":
        return engines.vllm_facts(server.install, server.log_text(), server.metrics_text(), server.options)
    if server.engine == "sglang":
        return engines.sglang_facts(server.install, server.log_text(), server.options)
    return engines.transformers_facts(server.install, server.options)


_NAMES = {"transformers": "transformers serve", "vllm": "vLLM", "sglang": "SGLang"}


def _wait_ready(server: Server, proc: subprocess.Popen, t0: float, timeout_s: float, warm_up: bool = True) -> None:
    deadline = t0 + timeout_s
    what = _NAMES[server.engine]

    def fail(msg: str) -> ServeError:
        cause = root_cause(server.log_text())
        said = f"; it said: {cause}" if cause else (f"; its log ends: {server.log_tail()}" if server.log_tail() else "")
        return ServeError(f"{msg}{said} (log: {server.log_path})")

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
    if not warm_up:
        return
    why = None
    for _ in range(2):  # a first request on a fresh engine can fail while it sets up batching
        why = _warm_up(server.base_url, server.model, deadline - time.perf_counter())
        if why is None:
            return
        if proc.poll() is not None:
            break
    raise fail(f"{what} answered /health but its first request failed: {why}")
