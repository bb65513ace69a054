"""Decoding one token at a time, three ways, from overhead-bound to memory-bound.

Batch-1 decode reads every weight once per token and does two FLOPs per weight, about one
FLOP per byte: far left of every GPU's ridge point (``utils/measure/flops.py``: H200 bf16 about 206 FLOP/byte),
so a token can take no less than ``bytes read / memory bandwidth``. The three paths here are
the same model and the same greedy tokens; what differs is how much else a token costs:

``eager``
    Hugging Face ``generate`` with its default ``DynamicCache``. Every op of every layer is a
    kernel launched from Python (hundreds per token), each paying Python, dispatcher and launch
    time on the host; the cache grows by ``torch.cat`` (new shapes and allocations every step)
    and the stopping check reads a flag on the host. The GPU waits for the host:
    overhead-bound. Measured on one H200 for the 1.1B Llama shape in bf16: 16 tokens/s, 1% of
    copy bandwidth (docs/reference.md).
``static_compiled``
    ``generate(cache_implementation="static")``: a preallocated cache of fixed shape makes every
    step's shapes identical, so transformers compiles the forward with
    ``torch.compile(mode="reduce-overhead")`` (on CUDA only): inductor fuses the elementwise
    ops and CUDA graphs replay each forward. ``generate``'s own Python loop (logits processors,
    stopping criteria, cache bookkeeping) still runs around every step. Same H200: 148
    tokens/s, 8% (docs/reference.md).
``fast``
    :class:`FastDecoder`, gpt-fast's recipe (pytorch-labs/gpt-fast ``generate.py`` and
    ``model.py``): a static KV cache held as module buffers, fused QKV and gate/up weights
    (fewer, larger matrix-vector products), greedy ``argmax`` inside the step, and the whole
    single-token step compiled with ``mode="reduce-overhead"``, so each token is one CUDA
    graph replay: no per-op launches, no host sync until the last token (tokens stay on the
    GPU), no dynamic shapes. Each step's attention reads the cache in bf16 as two small
    matmuls (SDPA's math backend, which gpt-fast decodes under, first copies the whole cache
    to fp32). What is left is reading the weights and the cache. On one H200, with Inductor's
    coordinate-descent tuning as gpt-fast sets it: 933 tokens/s, 45.4% of copy bandwidth
    in one run, 861 tokens/s, 42.1% in the next; with Inductor's defaults (this class's
    default) 777 tokens/s, 38.0% (``benchmarks/decode_tuning.py``, RESULTS.md).

Why a hand-written forward rather than HF's model under ``torch.compile``: compiling HF's
forward with its static cache under ``mode="reduce-overhead"`` failed on the H200 with
"accessing tensor output of CUDAGraphs that has been overwritten" (docs/reference.md); gpt-fast
writes the decoder in about a hundred lines so that the graph holds the cache as buffers
and returns only the next token, which the loop clones before the next replay
(``torch.compiler.cudagraph_mark_step_begin`` marks each step). :class:`FastDecoder` takes
the HF model's own weights (shared, no copy, except the two fused matrices) and its rotary
tables, and supports the Llama family (``llama``, ``mistral`` without a sliding window,
``qwen2``). It imports torch at module level because it is an ``nn.Module``: torch.compile
treats module parameters and buffers as static addresses, which CUDA graphs need (a
plain tensor attribute would be copied into the graph at every replay).

Greedy outputs equal eager ``generate``'s on a CPU in fp32 (``tests/utils/test_inference.py``); in
bf16 on a GPU, kernels that add in a different order can flip a near-tie in random weights,
so :func:`first_mismatch` reports where two paths part.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from utils import validate
from utils.measure.timing import device_sync

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
PATHS = ("eager", "static_compiled", "fast")
COMPILE_MODES = ("reduce-overhead", "max-autotune")
DECODE_ATTENTION = ("matmul", "reduce", "sdpa")


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Attention of one query row per head over the whole static cache, without SDPA.

    ``matmul``: as transformers' eager attention computes it, scores and output as matmuls in
    the cache's dtype (cuBLAS accumulates in fp32), the softmax in fp32. ``reduce``: the two
    products written as a multiply and a sum in fp32, which inductor turns into reductions of
    its own, the casts fused into them. Compiled, neither makes an fp32 copy of the cache, which
    SDPA's math backend (PyTorch 2.5 and later) does: it first copies bf16 and fp16 inputs, the
    whole cache included, to fp32.
    """
    scale = q.shape[-1] ** -0.5
    if how == "matmul":
        scores = (torch.matmul(q, k.transpose(-1, -2)) * scale).float()
    else:
        scores = (q.float().unsqueeze(-2) * k.float().unsqueeze(-3)).sum(-1) * scale
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    if how == "matmul":
        return torch.matmul(p.to(v.dtype), v)
    return (p.unsqueeze(-1) * v.float().unsqueeze(-3)).sum(-2).to(v.dtype)


# -- the hand-written decoder -------------------------------------------------------------------

def _shared(t: torch.Tensor | None) -> nn.Parameter | None:
    """The HF tensor itself as a frozen parameter of this module (same storage, no copy)."""
    return None if t is None else nn.Parameter(t.detach(), requires_grad=False)


def _fused(*ts: torch.Tensor | None) -> nn.Parameter | None:
    """Rows of several weights (or biases) in one tensor: one matmul instead of several."""
    if all(t is None for t in ts):
        return None
    if any(t is None for t in ts):
        raise ValueError("some of the fused projections have a bias and some do not; FastDecoder cannot fuse them")
    with torch.no_grad():
        return nn.Parameter(torch.cat([t.detach() for t in ts]), requires_grad=False)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm, op for op: normalise in fp32, scale in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Layer(nn.Module):
    """One decoder layer: fused QKV, rotary, static-cache attention (GQA without copying K and V
    per query head), output projection, fused gate/up SwiGLU MLP."""

    def __init__(self, hf_layer: Any, n_heads: int, n_kv: int, head_dim: int, eps: float,
                 decode_attention: str = "matmul"):
        super().__init__()
        a, m = hf_layer.self_attn, hf_layer.mlp
        self.n_heads, self.n_kv, self.head_dim, self.eps = n_heads, n_kv, head_dim, eps
        self.attn_norm = _shared(hf_layer.input_layernorm.weight)
        self.wqkv = _fused(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
        self.bqkv = _fused(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)
        self.wo, self.bo = _shared(a.o_proj.weight), _shared(a.o_proj.bias)
        self.mlp_norm = _shared(hf_layer.post_attention_layernorm.weight)
        self.w13 = _fused(m.gate_proj.weight, m.up_proj.weight)
        self.b13 = _fused(m.gate_proj.bias, m.up_proj.bias)
        self.w2, self.b2 = _shared(m.down_proj.weight), _shared(m.down_proj.bias)
        self.register_buffer("k_cache", torch.empty(0), persistent=False)
        self.register_buffer("v_cache", torch.empty(0), persistent=False)
        self.decode_attention = decode_attention

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                input_pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        nq, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        qkv = F.linear(_rms(x, self.attn_norm, self.eps), self.wqkv, self.bqkv)
        q, k, v = qkv.split([nq * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(b, t, nq, hd).transpose(1, 2)
        k = k.view(b, t, nkv, hd).transpose(1, 2)
        v = v.view(b, t, nkv, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        # query head h reads KV head h // g (HF's repeat_kv order): fold the g query heads of each
        # KV head into the query length instead of repeating K and V g times
        g = nq // nkv
        qg = q.reshape(b, nkv, g * t, hd)
        if t == 1 and self.decode_attention != "sdpa":
            o = _decode_attention(qg, self.k_cache, self.v_cache, mask, self.decode_attention)
        else:  # one query row (decode): its mask row broadcasts over the g folded heads, nothing to repeat
            mask = mask if t == 1 else mask.repeat(1, 1, g, 1)
            o = F.scaled_dot_product_attention(qg, self.k_cache, self.v_cache, attn_mask=mask)
        o = o.reshape(b, nq, t, hd)  # SDPA's CUDA kernels may return a non-contiguous o
        o = o.transpose(1, 2).reshape(b, t, nq * hd)
        x = x + F.linear(o, self.wo, self.bo)
        gate, up = F.linear(_rms(x, self.mlp_norm, self.eps), self.w13, self.b13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w2, self.b2)


def _check_supported(cfg: Any) -> None:
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"FastDecoder supports {', '.join(SUPPORTED_MODEL_TYPES)} models, not {kind!r}; "
                         "time eager and static-cache generate for this one")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"FastDecoder implements the SiLU MLP, this model uses {cfg.hidden_act!r}")
    sliding = getattr(cfg, "use_sliding_window", kind == "mistral") and getattr(cfg, "sliding_window", None)
    if sliding:
        raise ValueError("FastDecoder has no sliding-window attention; this config uses a window of "
                         f"{cfg.sliding_window} tokens")


class FastDecoder(nn.Module):
    """A Llama-family decoder over an HF model's weights, with a static KV cache, for fast decode.

    ``decoder.generate(prompt, n)`` returns the ``n`` greedy tokens (a ``(batch, n)`` tensor on
    the device): the prompt is prefilled without compilation (one forward over its tokens), then
    ``n - 1`` single-token steps run through :func:`decode_step`, compiled with
    ``torch.compile(mode="reduce-overhead", fullgraph=True)`` when ``compile`` is true (the
    default on CUDA; a CPU runs the same code uncompiled, and so does a GPU below compute
    capability 7.0, which inductor refuses: ``compile_skipped`` says why). ``suppress_token_ids``
    get ``-inf`` logits, as ``generate(min_new_tokens=n)`` does to the end-of-sequence ids, so
    both produce exactly ``n`` tokens. The cache holds ``max_seq_len`` positions for ``batch`` sequences;
    :meth:`setup_caches` reallocates it for another batch size (a new shape: one recompile).

    Two knobs, measured side by side by ``benchmarks/decode_tuning.py`` (RESULTS.md, phase 3):
    ``decode_attention`` is how the single-token steps attend over the cache (the prefill always
    uses SDPA): ``"matmul"`` (the default, :func:`_decode_attention`), ``"reduce"`` (the same
    products as inductor reductions) or ``"sdpa"`` (``scaled_dot_product_attention`` under its
    math backend, as gpt-fast's ``generate.py`` decodes, which on PyTorch 2.5 and later copies
    the bf16 cache to fp32 every step). On one H200 with coordinate-descent tuning: 1.07, 1.26
    and 1.40 ms per token. ``compile_mode`` is passed to ``torch.compile``:
    ``"reduce-overhead"`` (CUDA graphs) or ``"max-autotune"`` (CUDA graphs and autotuned matmul
    templates; 1.45 ms against 1.35 under ``"reduce-overhead"`` in the same H200 run).
    """

    def __init__(self, model: Any, batch: int = 1, max_seq_len: int | None = None,
                 suppress_token_ids: tuple[int, ...] | list[int] = (), compile: bool | None = None,
                 compile_mode: str = "reduce-overhead", decode_attention: str = "matmul"):
        super().__init__()
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)} (modes that capture CUDA graphs), "
                             f"got {compile_mode!r}")
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, got {decode_attention!r}")
        self.compile_mode = compile_mode
        self.decode_attention = decode_attention
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        _check_supported(cfg)
        base = model.model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.max_seq_len = int(max_seq_len or cfg.max_position_embeddings)
        eps = cfg.rms_norm_eps
        self.embed = _shared(base.embed_tokens.weight)
        self.layers = nn.ModuleList(_Layer(layer, self.n_heads, self.n_kv, self.head_dim, eps, decode_attention)
                                    for layer in base.layers)
        self.norm, self.eps = _shared(base.norm.weight), eps
        self.lm_head = _shared(model.lm_head.weight)
        with torch.no_grad():  # HF's own rotary module, so any rope scaling it applies is applied here too
            positions = torch.arange(self.max_seq_len, device=self.device)[None]
            cos, sin = base.rotary_emb(torch.zeros(1, dtype=self.dtype, device=self.device), positions)
        self.register_buffer("cos", cos[0].to(self.dtype), persistent=False)
        self.register_buffer("sin", sin[0].to(self.dtype), persistent=False)
        mask = torch.ones(self.max_seq_len, self.max_seq_len, dtype=torch.bool, device=self.device).tril()
        self.register_buffer("causal_mask", mask, persistent=False)
        bias = torch.zeros(self.lm_head.shape[0], dtype=torch.float32, device=self.device)
        ids = [int(i) for i in suppress_token_ids if i is not None and 0 <= int(i) < bias.numel()]
        if ids:
            bias[ids] = float("-inf")
        self.register_buffer("logit_bias", bias, persistent=False)
        # a GPU below compute capability 7.0 (a P100) cannot compile at all (utils.course.tier_plan): eager there
        from utils.course.tier_plan import too_old_to_compile

        self.compile_skipped = too_old_to_compile(self.device)
        self.compiled = (self.device.type == "cuda") if compile is None else bool(compile)
        self.compiled = self.compiled and self.compile_skipped is None
        self._step = torch.compile(decode_step, mode=compile_mode, fullgraph=True) if self.compiled else decode_step
        self.batch = 0
        self.setup_caches(batch)

    def setup_caches(self, batch: int) -> None:
        """Zeroed K and V caches of ``(batch, kv_heads, max_seq_len, head_dim)`` per layer,
        marked as static addresses for CUDA graphs (as transformers' ``StaticCache`` does)."""
        validate.positive_int("batch", batch)
        shape = (batch, self.n_kv, self.max_seq_len, self.head_dim)
        for layer in self.layers:
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            torch._dynamo.mark_static_address(layer.k_cache)
            torch._dynamo.mark_static_address(layer.v_cache)
        self.batch = batch

    def cache_bytes(self) -> int:
        return sum(layer.k_cache.nbytes + layer.v_cache.nbytes for layer in self.layers)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``(batch, vocab)`` of the last of ``tokens`` (``(batch, T)``), which sit at
        cache positions ``input_pos`` (``(T,)``); writes their K and V into the cache."""
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[input_pos], self.sin[input_pos]
        mask = self.causal_mask[input_pos][None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        x = _rms(x[:, -1], self.norm, self.eps)
        return F.linear(x, self.lm_head).float() + self.logit_bias

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n: int) -> torch.Tensor:
        b, t = prompt.shape
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive number of tokens, got {n!r}")
        if t + n > self.max_seq_len:
            raise ValueError(f"prompt {t} + {n} new tokens exceed the cache's {self.max_seq_len} positions; "
                             "build the FastDecoder with a larger max_seq_len")
        if b != self.batch:
            self.setup_caches(b)
        out = torch.empty(b, n, dtype=torch.long, device=self.device)
        pos = torch.arange(t, device=self.device)
        tok = self(prompt, pos).argmax(dim=-1, keepdim=True)  # prefill: uncompiled, any length
        out[:, :1] = tok
        pos = pos[-1:] + 1  # on the device: no host-to-device copy, no sync
        # decode_attention="sdpa" decodes as gpt-fast does, under SDPA's math backend (inductor then
        # writes the attention itself); "matmul" and "reduce" call no SDPA in these steps
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            for i in range(1, n):
                if self.compiled:
                    torch.compiler.cudagraph_mark_step_begin()
                tok = self._step(self, tok, pos).clone()  # the graph's output buffer is reused by the next replay
                out[:, i:i + 1] = tok
                pos += 1
        if self.compiled:  # whatever compiled function runs next (generate's, say) starts from its own graphs
            torch.compiler.cudagraph_mark_step_begin()
        return out


def decode_step(decoder: FastDecoder, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """One greedy step: the next token ``(batch, 1)`` after ``token`` at position ``input_pos``.
    This is the function that ``torch.compile`` captures as one CUDA graph."""
    return decoder(token, input_pos).argmax(dim=-1, keepdim=True)


# -- the three paths ------------------------------------------------------------------------------

@dataclass
class DecodePath:
    """One way to decode ``prompt``: ``path(n)`` greedily generates exactly ``n`` new tokens and
    returns them as a ``(batch, n)`` tensor. ``warmup_s`` is the first call's wall time
    (compilation, cache allocation, CUDA-graph capture), left out of every timing."""

    name: str
    model: Any
    prompt: Any
    run: Callable[[int], Any]
    compiled: bool
    warmup_s: float = 0.0
    note: str = ""
    decoder: Any = None  # the FastDecoder behind the "fast" path

    def __call__(self, n: int):
        return self.run(n)

    @property
    def batch(self) -> int:
        return int(self.prompt.shape[0])


def eos_ids(model: Any) -> tuple[int, ...]:
    """The model's end-of-sequence ids (from its generation config, else its config)."""
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def hf_generate(model: Any, prompt: Any, n: int, cache_implementation: str | None = None,
                compile: bool | None = None) -> Any:
    """``model.generate`` for exactly ``n`` greedy tokens (``min_new_tokens=n``: the end-of-sequence
    ids are suppressed), returning only the new tokens."""
    kw: dict[str, Any] = {}
    if cache_implementation is not None:
        kw["cache_implementation"] = cache_implementation
    if compile is False:
        kw["disable_compile"] = True
    eos = eos_ids(model)
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=eos[0] if eos else 0, **kw)
    return out[:, prompt.shape[1]:]


def warm(path: DecodePath, n: int) -> DecodePath:
    """Call ``path(n)`` once (compilation, cache allocation, CUDA-graph capture) and keep its wall
    time in ``path.warmup_s``."""
    t0 = time.perf_counter()
    path(n)
    device_sync(path.prompt.device)
    path.warmup_s = time.perf_counter() - t0
    return path


def eager_path(model: Any, prompt: Any) -> DecodePath:
    return DecodePath("eager", model, prompt, lambda n: hf_generate(model, prompt, n), compiled=False,
                      note="generate, DynamicCache, eager")


def static_path(model: Any, prompt: Any, compile: bool | None = None) -> DecodePath:
    """``generate(cache_implementation="static")``; transformers compiles the forward on CUDA
    (``compile=False`` turns that off; a CPU never compiles, nor a GPU below compute capability
    7.0, where PyTorch's inductor has no Triton: ``utils.course.tier_plan``)."""
    from utils.course.tier_plan import too_old_to_compile

    if too_old_to_compile(prompt.device):  # a P100: transformers would compile and fail at the first call
        compile = False
    compiled = prompt.device.type == "cuda" and compile is not False
    return DecodePath("static_compiled", model, prompt,
                      lambda n: hf_generate(model, prompt, n, cache_implementation="static", compile=compile),
                      compiled=compiled, note="generate, StaticCache" + (", torch.compile (reduce-overhead)" if compiled else
                                                                          ", not compiled"))


def fast_path(model: Any, prompt: Any, max_new_tokens: int, compile: bool | None = None,
              decoder: FastDecoder | None = None, **decoder_kw: Any) -> DecodePath:
    """:class:`FastDecoder` over ``model``'s weights; pass ``decoder`` to reuse one (its compiled
    step and its weights) for another prompt or batch size, or ``decoder_kw`` (``compile_mode``,
    ``decode_attention``) to build one another way."""
    if decoder is None:
        need = prompt.shape[1] + max_new_tokens
        decoder = FastDecoder(model, batch=prompt.shape[0], max_seq_len=-(-need // 64) * 64,
                              suppress_token_ids=eos_ids(model), compile=compile, **decoder_kw)
    elif decoder_kw:
        raise ValueError(f"pass either a decoder or options to build one ({', '.join(decoder_kw)}), not both")
    note = "FastDecoder: static cache, fused QKV and gate/up, " + (
        f"torch.compile(mode={decoder.compile_mode!r}): one CUDA graph per token" if decoder.compiled else "not compiled")
    return DecodePath("fast", model, prompt, lambda n: decoder.generate(prompt, n), compiled=decoder.compiled, note=note,
                      decoder=decoder)


def decode_paths(model: Any, prompt: Any, max_new_tokens: int, compile: bool | None = None,
                 warmup: bool = True) -> dict[str, DecodePath]:
    """The three paths on ``prompt`` (``(batch, T)`` token ids on the model's device), each warmed
    up with ``max_new_tokens`` tokens unless ``warmup=False`` (first calls compile and capture)."""
    if max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be at least 2 (TPOT needs two decode lengths), got {max_new_tokens}")
    paths = {"eager": eager_path(model, prompt), "static_compiled": static_path(model, prompt, compile),
             "fast": fast_path(model, prompt, max_new_tokens, compile)}
    if warmup:
        for p in paths.values():
            warm(p, max_new_tokens)
    return paths


def first_mismatch(a: Any, b: Any) -> int | None:
    """The first token index where two ``(batch, n)`` outputs differ in any row, else None."""
    a, b = torch.as_tensor(a).cpu(), torch.as_tensor(b).cpu()
    if a.shape != b.shape:
        raise ValueError(f"outputs of different shapes {tuple(a.shape)} and {tuple(b.shape)}")
    diff = (a != b).any(dim=0).nonzero()
    return int(diff[0]) if diff.numel() else None


def cache_kwarg(model: Any) -> str:
    """The name of the forward's cache argument: ``cache`` (transformers 5.2x), earlier ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
