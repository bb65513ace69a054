"""The KV-cache numbers of a vLLM startup log: :func:`parse_vllm_log`.

The token line: ``GPU KV cache size: N tokens`` and ``Maximum concurrency for M tokens per
request: Cx`` as two lines up to 0.27, one line from 0.28 (``update_kv_cache_capacity``; PR
#50462 by an earlier note, not checked against the release); the word ``GPU`` whatever the device up to 0.29, then ``GPU`` for cuda and the
device type upper-cased otherwise (``CPU``, ``XPU``, ...) from 0.30; `` + host`` appended with
a host (hisparse) pool from 0.32 (``_kv_cache_device_name``). The CPU build takes its KV
space from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) or ``--kv-cache-memory-bytes`` instead of a
profiling run and logs it per worker (``Explicitly set (X/Y) GiB for KV cache on node K.``
from 0.20, ``cpu_worker.py``); its default block size is :func:`utils.kv.vllm_releases.vllm_cpu_default_block_size`
(128 for most models from 0.12).

How each logged number is derived: ``utils/kv/vllm_kv.py``; the engine's facts from its log
and ``/metrics``: ``utils/serving/engines.py``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

from utils.kv.kvcache import KVConfigError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"(\d{1,3}(?:,\d{3})+|\d+)"  # 2,042,016 or 2042016
_GIB = r"(-?\d+(?:\.\d+)?)\s*GiB"  # signed: v1 logs a negative budget before its "No available memory" error
_F = r"(-?\d+(?:\.\d+)?)"  # vLLM's format_gib: str(round(bytes / GiB, 2)), e.g. "1.0", "15.96"
_WRAP = 200  # characters either side of a line end searched for a wrapped record
# v0 0.7+: "# %s blocks" with the platform's device_name; the v0 CPU worker logs "# cpu blocks: N,
# # CPU blocks: 0" (its KV pool counted as "GPU" blocks), so lower-case "cpu" only
_DEVICE = r"\b(?:(?i:GPU|cuda|rocm|xpu|hpu|npu|tpu|neuron)|cpu) blocks:"
# "<DEVICE> KV cache size": "GPU" up to 0.29 whatever the device; from 0.30 "GPU" for cuda, else the
# device type upper-cased (CPU, XPU, TPU, ...); 0.32 appends " + host" with a host (hisparse) pool
_KV_DEVICE = r"\b([A-Z][A-Z0-9_]*(?: \+ host)?) KV cache size:\s*"
_PATTERNS = {  # field -> (literal every match contains, to skip lines cheaply; pattern)
    "avail": (("Available KV", re.compile(r"Available KV cache memory:\s*" + _GIB)),
              ("GiB", re.compile(r"(?:kv_cache_size=|reserved for KV Cache is\s*|available_kv_cache_memory[\s=:]*)" + _GIB))),
    "gpu": ((" blocks:", re.compile(_DEVICE + r"\s*" + _NUM + r"(?:,\s*#?\s*CPU blocks:\s*" + _NUM + ")?")),
            ("num_gpu_blocks is", re.compile(r"num_gpu_blocks is:\s*" + _NUM))),
    "override": (("num_gpu_blocks_override=", re.compile(r"Overriding num_gpu_blocks=" + _NUM
                                                         + r" with num_gpu_blocks_override=" + _NUM)),),
    "tokens": (("KV cache size", re.compile(_KV_DEVICE + _NUM + r"\s*tokens")),),
    "conc": (("concurrency for", re.compile(r"Maximum concurrency for\s*" + _NUM
                                             + r"\s*tokens per\s*request:\s*(\d+(?:\.\d+)?)\s*x")),),
    "needed": (("is needed", re.compile(r"\(?(\d+(?:\.\d+)?)\s*GiB KV\s*cache is needed")),),
    "est": (("maximum model length", re.compile(r"[Ee]stimated maximum model length is\s*" + _NUM)),),
    "maxtok": (("stored in KV cache", re.compile(r"maximum number of tokens that can be stored in KV cache \(" + _NUM + r"\)")),),
    "dtype": (("data type to store kv cache", re.compile(r"Using (\S+) data type to store kv cache")),),
    "cpu_set": (("GiB for KV cache on node", re.compile(r"\b(Explicitly|Auto) set \(" + _F + "/" + _F
                                                         + r"\) GiB for KV cache on node (\d+)(?:, with " + _F
                                                         + r" GiB requested memory for the worker\. " + _F
                                                         + r" GiB memory was consumed by non-kv usages)?")),
                ("VLLM_CPU_KVCACHE_SPACE not set", re.compile(r"VLLM_CPU_KVCACHE_SPACE not set\. Using " + _F
                                                              + r" GiB for KV cache")),
                ("is not set, using", re.compile(r"VLLM_CPU_KVCACHE_SPACE \(GiB\) for CPU backend is not set, "
                                                 r"using (\d+) by default"))),
    "cpu_short": (("allocation is less than", re.compile(r"Available memory on node (\d+) \(" + _F + "/" + _F
                                                          + r" GiB\) on kv\s*cache allocation is less than requested "
                                                          r"memory for kv \(" + _F + r"(?:/" + _F + r")? GiB\)")),),
    "autofit": (("Auto-fit max_model_len", re.compile(r"Auto-fit max_model_len: (?:reduced from " + _NUM + " to " + _NUM
                                                      + "|full model context length " + _NUM + " fits)")),),
    "group_bs": (("kv cache group sizes", re.compile(r"kv cache group sizes \(([\d, ]+)\)")),),
    "lcm_bs": (("kv lcm block sizes", re.compile(r"kv lcm block sizes (\d+)")),),
    "forced_bs": (("overriding user-specified block_size", re.compile(
        r"requires block_size=(\d+), overriding user-specified block_size=(\d+)")),),
    "bad_bs": (("No common block size", re.compile(r"No common block size for (\d+) \(")),),
    "batched": (("max_num_batched_tokens=", re.compile(r"Chunked prefill is enabled with max_num_batched_tokens="
                                                        + _NUM)),),
    "version": (("LLM engine (v", re.compile(r"LLM engine \(v(\d+\.\d+[\w.+-]*)\)")),
                ("version", re.compile(r"(?:vLLM API server version |█\s+version\s+)(\d+\.\d+[\w.+-]*)"))),
}


@dataclass(frozen=True)
class VllmLogSummary:
    """The KV-cache numbers of a vLLM startup log, in order of appearance (one per worker
    where each worker logs its own). ``available_kv_gib`` includes the v0 engine's
    ``kv_cache_size=X GiB``, ``the rest of the memory reserved for KV Cache is X GiB`` and
    ``available_kv_cache_memory X GiB``, and keeps the sign of a negative budget.
    ``gpu_blocks`` includes ``# cuda blocks: N`` (v0 0.7+), the v0 CPU worker's ``# cpu
    blocks: N``, the v1 API server's ``num_gpu_blocks is: N`` and the computed N of
    ``Overriding num_gpu_blocks=N with num_gpu_blocks_override=M`` (M in
    ``gpu_blocks_override``). ``kv_cache_device`` has one entry per ``kv_cache_tokens``
    entry: the name the ``<DEVICE> KV cache size`` line gave (``GPU``, ``CPU``, ``XPU``,
    ``GPU + host``, ...).

    The CPU build's KV space (``cpu_*``; one entry per worker line): ``Explicitly set (X/Y)
    GiB for KV cache on node K.`` (0.20+, ``VLLM_CPU_KVCACHE_SPACE`` or
    ``--kv-cache-memory-bytes``; how ``"explicit"``), ``Auto set (X/Y) GiB ... on node K, with
    W GiB requested memory for the worker. C GiB memory was consumed by non-kv usages.``
    (``"auto"``; W and C in ``cpu_worker_memory_gib`` and ``cpu_non_kv_gib``), and the older
    defaults ``VLLM_CPU_KVCACHE_SPACE not set. Using X GiB for KV cache.`` (0.13 to 0.19) and
    ``... is not set, using 4 by default.`` (to 0.12; how ``"default"``, node and Y None).
    ``cpu_kv_short_gib``: (available, requested) of the ``Available memory on node K (A/T
    GiB) on kv cache allocation is less than requested memory for kv (R GiB)`` error.
    ``max_num_batched_tokens``: the scheduler's token budget from ``Chunked prefill is enabled
    with max_num_batched_tokens=N`` (``vllm/config/scheduler.py``), which sizes sliding-window
    and chunked layers (:func:`utils.kv.vllm_releases.vllm_in_flight_tokens`)."""

    available_kv_gib: tuple[float, ...] = ()
    gpu_blocks: tuple[int, ...] = ()
    cpu_blocks: tuple[int, ...] = ()
    kv_cache_tokens: tuple[int, ...] = ()
    concurrency: tuple[tuple[int, float], ...] = ()  # (tokens per request, C)
    concurrency_text: tuple[str, ...] = ()  # C exactly as printed, e.g. "2.31"
    kv_needed_gib: tuple[float, ...] = ()
    estimated_max_model_len: tuple[int, ...] = ()
    max_tokens_in_kv_cache: tuple[int, ...] = ()  # v0 error "... stored in KV cache (N)"
    kv_cache_device: tuple[str, ...] = ()  # "GPU", "CPU", "XPU", "GPU + host", ... per kv_cache_tokens
    kv_cache_dtype: tuple[str, ...] = ()  # "Using fp8 data type to store kv cache"
    gpu_blocks_override: tuple[int, ...] = ()
    cpu_kv_space_gib: tuple[float, ...] = ()
    cpu_node_memory_gib: tuple[float | None, ...] = ()
    cpu_numa_node: tuple[int | None, ...] = ()
    cpu_kv_space_how: tuple[str, ...] = ()  # "explicit", "auto" or "default"
    cpu_worker_memory_gib: tuple[float, ...] = ()  # "auto" lines only
    cpu_non_kv_gib: tuple[float, ...] = ()  # "auto" lines only
    cpu_kv_short_gib: tuple[tuple[float, float], ...] = ()  # (available on the node, requested)
    auto_fit_max_model_len: tuple[tuple[int, int], ...] = ()  # (asked or derived, fitted)
    kv_group_block_sizes: tuple[tuple[int, ...], ...] = ()  # "kv cache group sizes (16, 64)"
    scheduler_block_size: tuple[int, ...] = ()  # "kv lcm block sizes 64"
    forced_block_size: tuple[tuple[int, int], ...] = ()  # (forced, user's): CPU MLA 16, DeepSeek-V4 256
    unsupported_block_size: tuple[int, ...] = ()  # "No common block size for 16 (...)" error
    vllm_version: tuple[str, ...] = ()  # "engine (v0.32.0)", "API server version", the banner
    max_num_batched_tokens: tuple[int, ...] = ()  # "Chunked prefill is enabled with max_num_batched_tokens=N"

    @property
    def min_available_kv_gib(self) -> float | None:
        """The smallest worker's value: vLLM sizes every worker to the smallest pool."""
        return min(self.available_kv_gib) if self.available_kv_gib else None

    @property
    def kv_tokens(self) -> int | None:
        return self.kv_cache_tokens[0] if self.kv_cache_tokens else None

    @property
    def max_model_len(self) -> int | None:
        return self.concurrency[0][0] if self.concurrency else None

    @property
    def max_concurrency(self) -> float | None:
        return self.concurrency[0][1] if self.concurrency else None

    @property
    def version(self) -> str | None:
        """The first vLLM version the log names, for :func:`vllm_formulas`."""
        return self.vllm_version[0] if self.vllm_version else None


_FIELDS = {"avail": "available_kv_gib", "gpu": "gpu_blocks", "tokens": "kv_cache_tokens", "conc": "concurrency",
           "needed": "kv_needed_gib", "est": "estimated_max_model_len", "maxtok": "max_tokens_in_kv_cache",
           "dtype": "kv_cache_dtype", "lcm_bs": "scheduler_block_size", "bad_bs": "unsupported_block_size",
           "version": "vllm_version", "batched": "max_num_batched_tokens"}


def parse_vllm_log(text: str | bytes) -> VllmLogSummary:
    """Parse a vLLM startup log (v0 ``# GPU blocks: N, # CPU blocks: M`` or v1
    ``Available KV cache memory`` / ``<DEVICE> KV cache size`` / ``Maximum concurrency``, the
    CPU build's KV space lines, and the "not enough KV cache" errors; see
    :class:`VllmLogSummary` for every field).

    Tolerates ANSI colours, any prefix (``INFO 05-02 10:11:12 [kv_cache_utils.py:634]``,
    ``(EngineCore_0 pid=123)``, ``(VllmWorker rank=1 pid=7)``, Docker timestamps, structured
    ``msg="..."``), several workers, several records on one line, CRLF line ends, and a
    record that a terminal wrapped onto the next line (``... (4.26 GiB KV cach`` /
    ``e is needed``: matched across one line end). Numbers may carry thousands commas.
    Text without these records gives an empty summary; bytes are decoded as UTF-8 with
    replacement; anything else raises :class:`KVConfigError`."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    elif not isinstance(text, str):
        raise KVConfigError(f"parse_vllm_log needs the log's text (str or bytes), got {type(text).__name__}; "
                            "read the file first, e.g. Path(p).read_text()")
    out: dict[str, list] = {f.name: [] for f in fields(VllmLogSummary)}
    for field, m in _matches(_ANSI.sub("", text).splitlines()):
        _record(out, field, m)
    return VllmLogSummary(**{k: tuple(v) for k, v in out.items()})


def _matches(lines: list[str]):
    """(field, match) in order of appearance. A record that a terminal wrapped at a line end
    is found in the seam (the last _WRAP characters of the line plus the first of the next,
    every pattern being shorter; a device name is never joined across the line end); what it
    covers of the next line is not matched again."""
    carry: dict[re.Pattern, int] = {}  # pattern -> where, in this line, a wrapped match ended
    for i, line in enumerate(lines):
        tail = line[-_WRAP:]
        seam = tail + lines[i + 1][:_WRAP] if i + 1 < len(lines) else ""
        nxt_carry: dict[re.Pattern, int] = {}
        for field, patterns in _PATTERNS.items():
            for key, pat in patterns:
                found = [m for m in pat.finditer(line) if m.start() >= carry.get(pat, 0)] if key in line else []
                if key in seam:
                    starts = {m.start() - (len(line) - len(tail)) for m in found}
                    for m in pat.finditer(seam):
                        # a device name is not split: "... per GPU" / "GPU KV cache size: N tokens"
                        # is two lines, not "GPUGPU KV cache size"
                        if field == "tokens" and m.start(1) < len(tail) < m.end(1):
                            continue
                        if m.start() < len(tail) < m.end() and m.start() not in starts:
                            found.append(m)
                            nxt_carry[pat] = m.end() - len(tail)
                for m in found:
                    yield field, m
        carry = nxt_carry


def _record(out: dict[str, list], field: str, m: re.Match) -> None:
    g = m.groups()
    if field in ("avail", "needed"):
        out[_FIELDS[field]].append(float(g[0]))
    elif field == "conc":
        out["concurrency"].append((_int(g[0]), float(g[1])))
        out["concurrency_text"].append(g[1])
    elif field == "gpu":
        out["gpu_blocks"].append(_int(g[0]))
        if len(g) == 2 and g[1]:
            out["cpu_blocks"].append(_int(g[1]))
    elif field == "tokens":
        out["kv_cache_device"].append(g[0])
        out["kv_cache_tokens"].append(_int(g[1]))
    elif field == "override":
        out["gpu_blocks"].append(_int(g[0]))
        out["gpu_blocks_override"].append(_int(g[1]))
    elif field == "cpu_set":
        if len(g) == 1:  # the older "not set" defaults
            out["cpu_kv_space_gib"].append(float(g[0]))
            out["cpu_node_memory_gib"].append(None)
            out["cpu_numa_node"].append(None)
            out["cpu_kv_space_how"].append("default")
            return
        out["cpu_kv_space_how"].append("explicit" if g[0] == "Explicitly" else "auto")
        out["cpu_kv_space_gib"].append(float(g[1]))
        out["cpu_node_memory_gib"].append(float(g[2]))
        out["cpu_numa_node"].append(int(g[3]))
        if g[4] is not None:
            out["cpu_worker_memory_gib"].append(float(g[4]))
            out["cpu_non_kv_gib"].append(float(g[5]))
    elif field == "cpu_short":
        out["cpu_kv_short_gib"].append((float(g[1]), float(g[3])))
    elif field == "autofit":
        out["auto_fit_max_model_len"].append((_int(g[0]), _int(g[1])) if g[0] else (_int(g[2]), _int(g[2])))
    elif field == "group_bs":
        out["kv_group_block_sizes"].append(tuple(int(s) for s in g[0].replace(" ", "").split(",") if s))
    elif field == "forced_bs":
        out["forced_block_size"].append((int(g[0]), int(g[1])))
    elif field == "version":
        out["vllm_version"].append(g[0].rstrip(".,"))
    elif field == "dtype":
        out["kv_cache_dtype"].append(g[0])
    else:
        out[_FIELDS[field]].append(_int(g[0]))


def _int(s: str) -> int:
    return int(s.replace(",", ""))
