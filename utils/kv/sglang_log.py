"""SGLang's KV-cache start-up lines, parsed, and the arithmetic that produces them.

What SGLang (``python -m sglang.launch_server``, sgl-project/sglang) logs at start-up, per
tensor-parallel rank (``[2025-10-16 09:06:22 TP0]``, ``[... DP0 TP0 EP0]``, ``[... PP1 TP0]``;
no tag on one GPU), and where each line comes from:

* ``Load weight begin. avail mem=X GB`` and ``Load weight end. [elapsed=..., ]type=...,
  [dtype=..., ]avail mem=X GB[, mem usage=Y GB].`` (``model_executor/model_runner.py``
  ``load_model``; ``elapsed=`` is 2025-2026, ``mem usage=`` 2025 on; older releases stop at
  ``avail mem``).
* ``Using KV cache dtype: torch.X`` (model_runner.py, 2025) and, from 2026, the dtype inside
  the pool line: ``KV Cache is allocated. dtype: torch.X, #tokens: N, K size: A GB, V size:
  B GB`` (``mem_cache/memory_pool.py`` ``MHATokenToKVPool.__init__``; before the ``dtype:``
  field the line began ``#tokens:``). MLA pools (DeepSeek) log ``#tokens: N, KV size: C GB``
  (``MLATokenToKVPool``). Sizes are ``%.2f`` of bytes / 2**30 (``GB = 1024**3`` there).
  Hybrid pools (``SWAKVPool``, Mamba) log one such line per sub-pool.
* ``Memory pool end. avail mem=X GB`` (model_runner.py ``init_memory_pool``).
* ``max_total_num_tokens=N, chunked_prefill_size=C, max_prefill_tokens=P,
  max_running_requests=R, context_len=L[, available_gpu_mem=X GB]`` (``managers/scheduler.py``;
  ``available_gpu_mem`` appears in the 2025-2026 logs, not in older ones).
* ``server_args=ServerArgs(... kv_cache_dtype='auto', mem_fraction_static=0.8, ...,
  page_size=64, ...)`` (``server_args.py``; its repr, one line).
* Failures: ``max_total_tokens=T is larger than the profiled value N. Use the profiled value
  instead.`` (a negative N means weights left no room), ``RuntimeError: Not enough memory.
  Please try to increase --mem-fraction-static.`` (all versions since 0.1), and 2026's
  ``ValueError: Loaded weights leave no GPU memory for the KV cache under
  --mem-fraction-static=F``.

The arithmetic (read in ``model_executor/model_runner_kv_cache_mixin.py``, 2025-2026; the
same in ``model_runner.py`` before the mixin split):

* ``get_cell_size_per_token``: MHA/GQA ``kv_heads_per_rank x (head_dim + v_head_dim) x layers
  x dtype_bytes``; MLA ``(kv_lora_rank + qk_rope_head_dim) x layers x dtype_bytes``.
* ``profile_max_num_token``: ``rest = avail_after_load - pre_load_avail x (1 -
  mem_fraction_static)`` in GB, ``tokens = int(rest x 2**30) // cell_size``, where
  ``pre_load_avail`` is the free memory before loading (``min_per_gpu_memory`` from
  ``init_torch_distributed``, the minimum over ranks, logged as ``Load weight begin. avail
  mem``) and ``avail_after_load`` is measured again just after loading (about what ``Load
  weight end`` prints).
* ``init_memory``: ``min(tokens, --max-total-tokens)``, then ``// page_size * page_size``.
* ``memory_pool.py``: each layer's K and V buffer has ``tokens + page_size`` rows (the padded
  slot 0; ``tokens + 1`` before paging, the same for page_size 1).

Not modelled: hybrid SWA and Mamba pools (``set_num_tokens_hybrid_swa``,
``handle_max_mamba_cache``), NSA/DSA indexer bytes (DeepSeek V3.2), FP4 KV scale buffers,
speculative draft pools, DP attention, the automatic ``mem_fraction_static`` choice in
``server_args.py``, and the small drift between the logged ``avail mem`` and SGLang's own
second measurement. Written by hand from those files (no SGLang import, no code copied).
Version notes come from the current source and from dated posted logs (v0.1.13 to 2026); the
repository's history was not searched line by line (its snapshot was too large to fetch).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from utils.kv.kvcache import KVConfigError, KVSpec
from utils.units import gib_print_range

GB = 1 << 30  # SGLang's "GB" is 1024**3 bytes (memory_pool.py, model_runner.py)


class SglangLogError(KVConfigError):
    """The parser was given something that is not a log's text."""


# ---------------------------------------------------------------- the calculator
def cell_size_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, *,
                    v_head_dim: int | None = None, mla: bool = False) -> int:
    """KV bytes of one token on one rank, as ``get_cell_size_per_token`` in
    ``model_executor/model_runner_kv_cache_mixin.py``: MHA ``heads x (head_dim +
    v_head_dim) x layers x bytes``; MLA ``head_dim x layers x bytes`` with ``head_dim =
    kv_lora_rank + qk_rope_head_dim`` and no factor 2. ``num_kv_heads`` is per rank."""
    if mla:
        return head_dim * num_layers * dtype_bytes
    return num_kv_heads * (head_dim + (head_dim if v_head_dim is None else v_head_dim)) * num_layers * dtype_bytes


def spec_cell_size(spec: KVSpec, tp_size: int = 1) -> int:
    """:func:`cell_size_bytes` for a :class:`utils.kv.kvcache.KVSpec` on one of ``tp_size``
    ranks (KV heads ``max(1, heads // tp)``, SGLang's ``ModelConfig.get_num_kv_heads``)."""
    gpu = spec.per_gpu(tp_size)
    return cell_size_bytes(gpu.num_layers, gpu.num_kv_heads, gpu.head_dim, gpu.dtype_bytes, mla=gpu.mla)


def profile_max_num_token(avail_after_load_gb: float, pre_load_avail_gb: float, mem_fraction_static: float,
                          cell_size: int) -> int:
    """Tokens before page rounding, as ``profile_max_num_token``
    (``model_runner_kv_cache_mixin.py``): ``int((after - before x (1 - f)) x 2**30) //
    cell_size``. Negative when the weights left less than ``before x (1 - f)`` free."""
    rest_gb = avail_after_load_gb - pre_load_avail_gb * (1 - mem_fraction_static)
    return int(rest_gb * GB) // cell_size


def max_total_num_tokens(profiled: int, page_size: int = 1, max_total_tokens: int | None = None) -> int:
    """``init_memory`` (``model_runner_kv_cache_mixin.py``): cap at ``--max-total-tokens``,
    then round down to whole pages. SGLang raises "Not enough memory" when this is <= 0."""
    tokens = profiled if max_total_tokens is None else min(profiled, max_total_tokens)
    return tokens // page_size * page_size


def kv_buffer_bytes(tokens: int, page_size: int, num_layers: int, row_bytes: int) -> int:
    """One of K, V (or MLA's single latent) over all layers: ``(tokens + page_size) rows x
    row_bytes x layers`` (``MHATokenToKVPool._create_buffers`` / ``MLATokenToKVPool`` in
    ``mem_cache/memory_pool.py``; the extra page is the padded slot 0)."""
    return (tokens + page_size) * row_bytes * num_layers


def spec_kv_sizes(spec: KVSpec, tokens: int, tp_size: int = 1, page_size: int = 1) -> tuple[int, int | None]:
    """``(K bytes, V bytes)`` of an MHA pool, or ``(KV bytes, None)`` of an MLA pool, as
    ``get_kv_size_bytes`` (``memory_pool.py``) sums them for the ``KV Cache is allocated`` line."""
    gpu = spec.per_gpu(tp_size)
    row = gpu.num_kv_heads * gpu.head_dim * gpu.dtype_bytes
    size = kv_buffer_bytes(tokens, page_size, gpu.num_layers, row)
    return (size, None) if gpu.mla else (size, size)


def tokens_range(avail_after_load_gb: float, pre_load_avail_gb: float, mem_fraction_static: float, cell_size: int,
                 *, page_size: int = 1, decimals: int = 2) -> tuple[int, int]:
    """``max_total_num_tokens`` for the lowest and highest memory that prints as the two
    logged ``avail mem`` values (``%.2f``: +-0.005 GB each, :func:`utils.units.gib_print_range`)."""
    a_lo, a_hi = gib_print_range(avail_after_load_gb, decimals)
    b_lo, b_hi = gib_print_range(pre_load_avail_gb, decimals)
    lo = profile_max_num_token(a_lo / GB, b_hi / GB, mem_fraction_static, cell_size)
    hi = profile_max_num_token(a_hi / GB, b_lo / GB, mem_fraction_static, cell_size)
    return max_total_num_tokens(lo, page_size), max_total_num_tokens(hi, page_size)


# ---------------------------------------------------------------- the log parser
@dataclass(frozen=True)
class KVAllocation:
    """One ``KV Cache is allocated`` line. MHA pools give ``k_size_gb``/``v_size_gb``, MLA
    pools ``kv_size_gb``; ``size_text`` is the first size as printed (its decimals fix the
    tolerance)."""

    rank: str | None
    tokens: int
    k_size_gb: float | None = None
    v_size_gb: float | None = None
    kv_size_gb: float | None = None
    dtype: str | None = None
    size_text: str = ""

    @property
    def decimals(self) -> int:
        return len(self.size_text.partition(".")[2])


Ranked = tuple  # tuple[tuple[str | None, value], ...]: (rank tag, value) in order of appearance


@dataclass(frozen=True)
class SglangLogSummary:
    """Every KV-cache fact of an SGLang start-up log, in order of appearance, each with the
    rank tag of its line (``"TP0"``, ``"DP0 TP0"``, ``"PP1 TP0"``, or None)."""

    kv_allocations: tuple[KVAllocation, ...] = ()
    load_begin_avail_gb: Ranked = ()
    load_end_avail_gb: Ranked = ()
    load_end_mem_usage_gb: Ranked = ()
    memory_pool_end_avail_gb: Ranked = ()
    max_total_num_tokens: Ranked = ()
    chunked_prefill_size: Ranked = ()  # scheduler line and server_args
    max_prefill_tokens: Ranked = ()
    max_running_requests: Ranked = ()
    context_len: Ranked = ()
    available_gpu_mem_gb: Ranked = ()
    mem_fraction_static: Ranked = ()  # server_args, or the flag quoted in an error
    page_size: Ranked = ()
    kv_cache_dtype: Ranked = ()  # "Using KV cache dtype", server_args kv_cache_dtype
    profiled_max_total_tokens: Ranked = ()  # "... is larger than the profiled value N"
    errors: Ranked = ()  # "not_enough_memory", "no_memory_for_kv", "negative_profile"

    @property
    def kv_tokens(self) -> int | None:
        return self.kv_allocations[0].tokens if self.kv_allocations else None

    @property
    def ranks(self) -> tuple[str | None, ...]:
        return tuple(dict.fromkeys(a.rank for a in self.kv_allocations))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_F = r"(\d+(?:\.\d+)?)"
_RANK = re.compile(r"\[[^\[\]]*?((?:\b(?:DP|PP|TP|EP|CP|ATTN_CP|MOE_DP)\d+\s*)+)\]")
_WRAP = 160
_PATTERNS: dict[str, tuple[str, re.Pattern]] = {  # field -> (literal every match contains, pattern)
    "kv_mha": ("K size", re.compile(r"KV Cache is allocated\.\s*(?:dtype:\s*([\w.]+),\s*)?#tokens:\s*(\d+),\s*"
                                    r"K size:\s*(\d+\.\d+)\s*GB,\s*V size:\s*(\d+\.\d+)\s*GB")),
    "kv_mla": ("KV size", re.compile(r"KV Cache is allocated\.\s*(?:dtype:\s*([\w.]+),\s*)?#tokens:\s*(\d+),\s*"
                                     r"KV size:\s*(\d+\.\d+)\s*GB")),
    "load_begin_avail_gb": ("Load weight begin", re.compile(r"Load weight begin\.\s*avail mem=" + _F + r"\s*GB")),
    "load_end": ("Load weight end", re.compile(r"Load weight end\.[^\n]*?avail mem=" + _F + r"\s*GB"
                                               r"(?:,\s*mem usage=" + _F + r"\s*GB)?")),
    "memory_pool_end_avail_gb": ("Memory pool end", re.compile(r"Memory pool end\.\s*avail mem=" + _F + r"\s*GB")),
    "max_total_num_tokens": ("max_total_num_tokens", re.compile(r"\bmax_total_num_tokens=(\d+)")),
    "chunked_prefill_size": ("chunked_prefill_size", re.compile(r"\bchunked_prefill_size=(-?\d+)")),
    "max_prefill_tokens": ("max_prefill_tokens", re.compile(r"\bmax_prefill_tokens=(\d+)")),
    "max_running_requests": ("max_running_requests", re.compile(r"\bmax_running_requests=(\d+)")),
    "context_len": ("context_len=", re.compile(r"\bcontext_len=(\d+)")),
    "available_gpu_mem_gb": ("available_gpu_mem", re.compile(r"\bavailable_gpu_mem=" + _F + r"\s*GB")),
    "mem_fraction_static": ("fraction", re.compile(r"mem[_-]fraction[_-]static=(\d*\.\d+|[01])\b")),
    "page_size": ("page_size", re.compile(r"\bpage_size=(\d+)")),
    "dtype_line": ("KV cache dtype", re.compile(r"Using KV cache dtype:\s*(torch\.\w+)")),
    "dtype_args": ("kv_cache_dtype", re.compile(r"\bkv_cache_dtype='(\w+)'")),
    "profiled": ("profiled value", re.compile(r"max_total_tokens=\d+ is larger than the profiled value\s*(-?\d+)")),
    "not_enough_memory": ("Not enough memory", re.compile(r"Not enough memory\.\s*Please try to increase "
                                                          r"--mem-fraction-static")),
    "no_memory_for_kv": ("leave no GPU", re.compile(r"Loaded weights leave no GPU memory for the KV cache")),
}


def parse_sglang_log(text: str | bytes) -> SglangLogSummary:
    """Parse an SGLang start-up log (any version from 0.1 to 2026; the lines are listed in
    the module docstring). Tolerates ANSI colours, timestamps and any prefix (Docker, k8s,
    ``[2025-03-06 06:14:53 TP0]``), several ranks, CRLF or CR line ends, and a record that a
    terminal wrapped onto the next line (matched across one line end, once). Text without
    these lines gives an empty summary; bytes are decoded as UTF-8 with replacement; any
    other type raises :class:`SglangLogError`."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    elif not isinstance(text, str):
        raise SglangLogError(f"parse_sglang_log needs the log's text (str or bytes), got {type(text).__name__}; "
                             "read the file first, e.g. Path(p).read_text()")
    out: dict[str, list] = {f: [] for f in SglangLogSummary.__dataclass_fields__}
    for field, rank, m in _matches(_ANSI.sub("", text).splitlines()):
        _record(out, field, rank, m)
    return SglangLogSummary(**{k: tuple(v) for k, v in out.items()})


def _rank_of(prefix: str) -> str | None:
    found = _RANK.findall(prefix)
    return " ".join(found[-1].split()) if found else None


def _matches(lines: list[str]):
    """(field, rank, match) in order; a record wrapped at a line end is found in the seam
    (end of this line + start of the next) and what it covers of the next line is skipped."""
    carry: dict[str, int] = {}
    prev_rank = None  # the continuation of a wrapped line has no tag of its own: it inherits
    for i, line in enumerate(lines):
        tail = line[-_WRAP:]
        seam = tail + lines[i + 1][:_WRAP] if i + 1 < len(lines) else ""
        nxt: dict[str, int] = {}
        found = []
        for field, (key, pat) in _PATTERNS.items():
            hits = [(m.start(), m) for m in pat.finditer(line) if m.start() >= carry.get(field, 0)] if key in line else []
            if key in seam:
                starts = {s - (len(line) - len(tail)) for s, _ in hits}
                for m in pat.finditer(seam):
                    if m.start() < len(tail) < m.end() and m.start() not in starts:
                        hits.append((len(line) - len(tail) + m.start(), m))
                        nxt[field] = m.end() - len(tail)
            found += [(pos, field, m) for pos, m in hits]
        for pos, field, m in sorted(found, key=lambda t: t[0]):
            rank = _rank_of(line[:pos])
            yield field, rank if rank or "[" in line[:pos] else prev_rank, m
        own = _rank_of(line[:_WRAP])
        prev_rank = own if own or "[" in line[:_WRAP] else prev_rank
        carry = nxt


def _record(out: dict[str, list], field: str, rank: str | None, m: re.Match) -> None:
    if field in ("kv_mha", "kv_mla"):
        dtype, tokens = m.group(1), int(m.group(2))
        if field == "kv_mha":
            alloc = KVAllocation(rank, tokens, float(m.group(3)), float(m.group(4)), None, dtype, m.group(3))
        else:
            alloc = KVAllocation(rank, tokens, None, None, float(m.group(3)), dtype, m.group(3))
        out["kv_allocations"].append(alloc)
        if dtype:
            out["kv_cache_dtype"].append((rank, dtype))
    elif field == "load_end":
        out["load_end_avail_gb"].append((rank, float(m.group(1))))
        if m.group(2):
            out["load_end_mem_usage_gb"].append((rank, float(m.group(2))))
    elif field in ("dtype_line", "dtype_args"):
        out["kv_cache_dtype"].append((rank, m.group(1)))
    elif field == "profiled":
        out["profiled_max_total_tokens"].append((rank, int(m.group(1))))
        if int(m.group(1)) <= 0:
            out["errors"].append((rank, "negative_profile"))
    elif field in ("not_enough_memory", "no_memory_for_kv"):
        out["errors"].append((rank, field))
    else:
        value = m.group(1)
        out[field].append((rank, float(value) if field.endswith("_gb") or field == "mem_fraction_static" else int(value)))


# ---------------------------------------------------------------- calculator beside a log
def _first(pairs: Ranked, rank: str | None = None):
    for r, v in pairs:
        if rank is None or r == rank:
            return v
    return None


def pre_load_avail_gb(s: SglangLogSummary) -> float | None:
    """Free memory before weights, as SGLang sizes with it: the minimum over ranks of
    ``Load weight begin. avail mem``, else of ``Load weight end``'s ``avail mem + mem usage``
    (``load_model`` in ``model_runner.py`` logs ``mem usage`` as before - after loading)."""
    if s.load_begin_avail_gb:
        return min(v for _, v in s.load_begin_avail_gb)
    usage = dict(s.load_end_mem_usage_gb)
    est = [v + usage[r] for r, v in s.load_end_avail_gb if r in usage]
    return min(est) if est else None


def sglang_kv_check(log_text: str | bytes, spec: KVSpec, *, tp_size: int = 1, page_size: int | None = None,
                    mem_fraction_static: float | None = None) -> dict:
    """Put the calculator beside a parsed log, for every ``KV Cache is allocated`` line.

    * sizes: the K/V (or MLA KV) bytes SGLang allocates for the logged ``#tokens``
      (:func:`spec_kv_sizes`) must print as the logged value, within half a unit of its
      last printed decimal (:func:`utils.units.gib_print_range`);
    * tokens, when the log also gives ``Load weight begin``/``end`` ``avail mem`` and
      ``mem_fraction_static`` (or it is passed): the logged ``#tokens`` must lie in
      :func:`tokens_range` (pre-load memory: the minimum over ranks, as SGLang takes it).

    ``page_size`` and ``mem_fraction_static`` default to the log's server_args (else 1 and
    not checked). ``agrees`` is True when at least one check ran and all passed; hybrid
    pools (several KV lines per rank) are outside the model and will not agree."""
    s = parse_sglang_log(log_text)
    page = page_size or _first(s.page_size) or 1
    mfs = mem_fraction_static if mem_fraction_static is not None else _first(s.mem_fraction_static)
    cell = spec_cell_size(spec, tp_size)
    checks = []
    pre = pre_load_avail_gb(s)
    for a in s.kv_allocations:
        want, want_v = spec_kv_sizes(spec, a.tokens, tp_size, page)
        logged = a.kv_size_gb if a.kv_size_gb is not None else a.k_size_gb
        lo, hi = gib_print_range(logged, a.decimals)
        ok = lo <= want <= hi and (want_v is None or a.v_size_gb is None
                                  or gib_print_range(a.v_size_gb, a.decimals)[0] <= want_v
                                  <= gib_print_range(a.v_size_gb, a.decimals)[1])
        checks.append({"check": "size", "rank": a.rank, "tokens": a.tokens, "logged_gb": logged,
                       "predicted_bytes": want, "predicted_gb": round(want / GB, 4), "ok": ok})
        after = _first(s.load_end_avail_gb, a.rank) if a.rank is not None else _first(s.load_end_avail_gb)
        if after is not None and pre is not None and mfs is not None:
            t_lo, t_hi = tokens_range(after, pre, mfs, cell, page_size=page)
            checks.append({"check": "tokens", "rank": a.rank, "tokens": a.tokens, "predicted_range": (t_lo, t_hi),
                           "ok": t_lo <= a.tokens <= t_hi})
    for rank, n in s.max_total_num_tokens:
        pool = next((a.tokens for a in s.kv_allocations if rank is None or a.rank in (rank, None)), None)
        if pool is not None:
            checks.append({"check": "scheduler", "rank": rank, "tokens": n, "ok": n == pool})
    return {"agrees": bool(checks) and all(c["ok"] for c in checks), "cell_size_bytes": cell, "page_size": page,
            "mem_fraction_static": mfs, "kv_tokens": s.kv_tokens, "checks": checks, "summary": s}
