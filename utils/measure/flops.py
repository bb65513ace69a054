"""FLOPs per token, MFU and the roofline: numbers in, numbers out.

Units are in the names: ``*_flops`` are floating-point operations (a multiply and an add
count as two), ``*_tflops`` are TFLOP/s (1e12 FLOP per second), ``bandwidth_gbs`` is decimal
GB/s (1e9 bytes per second) as datasheets give it, and intensity is FLOP per byte.

Sources:

* Training FLOPs per token ``6N + 12·L·H·Q·T``: PaLM (arXiv 2204.02311) appendix B, as
  nanoGPT's ``GPT.estimate_mfu`` and torchtitan's ``get_dense_model_nparams_and_flops``
  compute it. ``6N``: every weight does one multiply-add (2 FLOPs) per token in the forward
  pass and two in the backward (input and weight gradients). ``12·L·H·Q·T``: per layer, the
  two attention matmuls (``QK^T`` and ``softmax·V``) cost ``2·2·H·Q·T`` per token forward,
  times 3 for forward plus backward. By convention the causal mask's halving is not taken,
  and activation recomputation is not counted (MFU counts the model's FLOPs, not the
  hardware's). An inference forward is a third of it: ``2N + 4·L·H·Q·T``.
* MFU = achieved FLOP/s / peak FLOP/s of the dtype in use (PaLM appendix B; torchtitan
  skips MFU under FP8 because its peak is bf16).
* Roofline (Williams, Waterman, Patterson, CACM 2009): attainable = min(peak,
  intensity x bandwidth); the ridge point peak / bandwidth is the intensity where the two
  meet (H200 bf16: 989e12 / 4.8e12 = about 206 FLOP/byte, datasheet figures).
* Overhead-bound: Horace He, "Making Deep Learning Go Brrrr From First Principles" (2022):
  time spent neither computing nor moving memory (Python, framework dispatch, kernel
  launches). The roofline cannot show it directly; :func:`bound` infers it from a measured
  throughput far below the roofline ceiling at the kernel's own intensity.
* A whole training step (phase 0, section 5, ``grader/source/00_foundations/00_foundations.ipynb``):
  its fixed cost from timing two batch sizes (:func:`batch_scaling`, :func:`fixed_share`)
  and its MFU decide :func:`step_bound`, in the same order as :func:`bound`.

Written by hand rather than taken from a library: each function is one formula, and the
course wants the formula on the page.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from utils import validate
from utils.units import GB, TFLOP

# Below this fraction of the roofline ceiling a kernel is called overhead-bound (see bound()).
OVERHEAD_FRACTION = 0.1
# A training step is overhead-bound above this fixed share; else limited by the busier unit when that one
# reaches this share of its ceiling (MFU, or the step's bandwidth over the memory ceiling) (step_bound()).
OVERHEAD_SHARE = 0.5
BUSY_SHARE = 0.4


# --------------------------------------------------------------------------- FLOPs per token

def transformer_flops_per_token(
    n_params_non_embedding: float,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    seq_len: int,
    training: bool = True,
) -> float:
    """FLOPs per token of a dense decoder: ``6N + 12·L·H·Q·T`` (training), a third for inference.

    ``N`` is the non-embedding parameter count (see :func:`count_params`), ``L`` layers,
    ``H`` query heads (with grouped-query attention the query heads still each attend), ``Q``
    head dim, ``T`` the sequence length attended over. Training means forward + backward;
    ``training=False`` gives one forward pass, ``2N + 4·L·H·Q·T``.

    >>> transformer_flops_per_token(1_000_000, 2, 4, 16, 128)
    6196608
    """
    validate.non_negatives(n_params_non_embedding=n_params_non_embedding, n_layers=n_layers,
                  n_heads=n_heads, head_dim=head_dim, seq_len=seq_len)
    train = 6 * n_params_non_embedding + 12 * n_layers * n_heads * head_dim * seq_len
    return train if training else train / 3


def count_params(model: Any, exclude_embeddings: bool = True) -> int:
    """Parameters of a torch module, each shared tensor counted once.

    With ``exclude_embeddings=True`` (the ``N`` of :func:`transformer_flops_per_token`) the
    weights of every ``nn.Embedding`` are subtracted (the token embedding and, where the
    model has one, the learned position embedding: lookups, not matmuls), except an embedding
    whose weight is also the output head's weight (tied): that tensor does the LM head's
    matmul, so it stays, counted once. This is nanoGPT's ``get_num_params`` exactly (GPT-2
    is tied: it subtracts ``wpe`` only, 124,439,808 - 786,432 = 123,653,376 for GPT-2 small)
    and torchtitan's rule for untied models (subtract ``tok_embeddings``; ``output`` stays).
    The count is of parameter tensors: registered buffers (masks, rotary tables) are not
    parameters and are not counted. Works on the meta device.
    """
    import torch

    params = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in params.values())
    if not exclude_embeddings:
        return int(total)
    # A weight also registered on a non-embedding module (the LM head) is tied: keep it.
    used_elsewhere = {
        id(p) for m in model.modules() if not isinstance(m, torch.nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    subtracted: set[int] = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            w = m.weight
            if id(w) not in subtracted and id(w) not in used_elsewhere:
                subtracted.add(id(w))
                total -= w.numel()
    return int(total)


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = cfg.get(n) if isinstance(cfg, Mapping) else getattr(cfg, n, None)
        if v is not None:
            return v
    return default


_LLAMA_LIKE = ("llama", "mistral", "qwen2")


def non_embedding_params_from_config(cfg: Any) -> int:
    """``N`` of :func:`count_params` computed from a config alone (no model built).

    Closed forms for ``gpt2`` and the Llama family (``llama``, ``mistral``, ``qwen2``:
    q/k/v/o projections with grouped KV heads, a gated MLP of three matrices, RMSNorms, the
    LM head; ``qwen2`` adds q/k/v biases). Any other ``model_type`` is built on the meta
    device with transformers and counted (no memory, no network). The tests check both
    paths agree with a built model.
    """
    mtype = _get(cfg, "model_type")
    d = _get(cfg, "hidden_size", "n_embd")
    vocab = _get(cfg, "vocab_size")
    layers = _get(cfg, "num_hidden_layers", "n_layer")
    if mtype == "gpt2":
        inner = _get(cfg, "n_inner", default=4 * d)
        per_layer = (d * 3 * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 4 * d
        return int(layers * per_layer + 2 * d + vocab * d)  # + ln_f + tied LM head
    if mtype in _LLAMA_LIKE:
        heads = _get(cfg, "num_attention_heads")
        kv = _get(cfg, "num_key_value_heads", default=heads)
        q = _get(cfg, "head_dim", default=d // heads)
        inter = _get(cfg, "intermediate_size")
        qkv_bias = mtype == "qwen2" or bool(_get(cfg, "attention_bias", default=False))
        attn = d * heads * q + 2 * d * kv * q + heads * q * d + (heads * q + 2 * kv * q if qkv_bias else 0)
        if _get(cfg, "attention_bias", default=False) and mtype != "qwen2":
            attn += d  # o_proj bias in Llama when attention_bias=True
        mlp = 3 * d * inter + (2 * inter + d if _get(cfg, "mlp_bias", default=False) else 0)
        return int(layers * (attn + mlp + 2 * d) + d + vocab * d)  # + final norm + LM head
    return _count_on_meta(cfg)


def _count_on_meta(cfg: Any) -> int:
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
    except ImportError as e:  # pragma: no cover - transformers is a requirement
        raise ValueError(f"model_type {_get(cfg, 'model_type')!r} needs transformers to count parameters") from e
    if not isinstance(cfg, PretrainedConfig):
        data = {k: v for k, v in dict(cfg).items() if not k.startswith("_")}
        if "model_type" not in data:
            raise ValueError("the config has no model_type; pass an HF config or a dict with model_type")
        cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return count_params(model)


def flops_per_token_from_config(cfg: Any, seq_len: int, training: bool = True) -> float:
    """:func:`transformer_flops_per_token` for an HF config (object or ``config.json`` dict).

    ``L`` = ``num_hidden_layers``/``n_layer``, ``H`` = ``num_attention_heads``/``n_head``,
    ``Q`` = ``head_dim`` or hidden/heads, ``N`` from :func:`non_embedding_params_from_config`.
    """
    validate.positives(seq_len=seq_len)
    if _get(cfg, "model_type") is None:
        raise ValueError("the config has no model_type; pass an HF config or a config.json dict")
    d = _get(cfg, "hidden_size", "n_embd")
    heads = _get(cfg, "num_attention_heads", "n_head")
    layers = _get(cfg, "num_hidden_layers", "n_layer")
    if not (d and heads and layers):
        raise ValueError("the config lacks hidden size, heads or layers; is it a decoder LM config?")
    q = _get(cfg, "head_dim", default=d // heads)
    n = non_embedding_params_from_config(cfg)
    return transformer_flops_per_token(n, layers, heads, q, seq_len, training=training)


# --------------------------------------------------------------------------- MFU

def mfu(achieved_flops_per_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilization as a fraction (0.24 means 24%): achieved / peak of the dtype used."""
    validate.non_negatives(achieved_flops_per_s=achieved_flops_per_s)
    validate.positives(peak_tflops=peak_tflops)
    return achieved_flops_per_s / (peak_tflops * TFLOP)


def mfu_from_throughput(tokens_per_s: float, flops_per_token: float, peak_tflops: float) -> float:
    """MFU from a measured throughput: ``tokens_per_s x flops_per_token / peak``."""
    validate.non_negatives(tokens_per_s=tokens_per_s, flops_per_token=flops_per_token)
    return mfu(tokens_per_s * flops_per_token, peak_tflops)


# --------------------------------------------------------------------------- roofline

def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOP per byte moved to or from memory."""
    validate.non_negatives(flops=flops)
    validate.positives(bytes_moved=bytes_moved)
    return flops / bytes_moved


def ridge_point(peak_tflops: float, bandwidth_gbs: float) -> float:
    """The intensity (FLOP/byte) where the roofline bends: ``peak / bandwidth``."""
    validate.positives(peak_tflops=peak_tflops, bandwidth_gbs=bandwidth_gbs)
    return peak_tflops * TFLOP / (bandwidth_gbs * GB)


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """Roofline ceiling in TFLOP/s: ``min(peak, intensity x bandwidth)``."""
    validate.non_negatives(intensity=intensity)
    validate.positives(peak_tflops=peak_tflops, bandwidth_gbs=bandwidth_gbs)
    return min(peak_tflops, intensity * bandwidth_gbs * GB / TFLOP)


def roofline_fraction(achieved_tflops: float, intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """Achieved throughput as a fraction of the roofline ceiling at that intensity.

    Can exceed 1 when the bytes counted overstate the DRAM traffic (data reused from L2);
    a fraction far above 1 means the FLOP or byte count is wrong.
    """
    validate.non_negatives(achieved_tflops=achieved_tflops)
    ceiling = attainable_tflops(intensity, peak_tflops, bandwidth_gbs)
    if ceiling == 0:
        raise ValueError("intensity is 0, so the roofline ceiling is 0; count the kernel's FLOPs")
    return achieved_tflops / ceiling


def _limit(overhead: bool, compute: bool) -> str:
    """The course's one rule for what limits a piece of work, whatever the evidence: overhead
    first (time the roofline does not model), then compute against memory."""
    if overhead:
        return "overhead"
    return "compute" if compute else "memory"


def bound(
    intensity: float,
    peak_tflops: float,
    bandwidth_gbs: float,
    achieved_tflops: float | None = None,
    overhead_fraction: float = OVERHEAD_FRACTION,
) -> str:
    """Which limit applies to one kernel: ``"compute"``, ``"memory"`` or ``"overhead"``.

    The rule, in order:

    1. ``"overhead"`` when a measured ``achieved_tflops`` is given and is below
       ``overhead_fraction`` (default 0.1) of the roofline ceiling
       :func:`attainable_tflops` at this intensity. A kernel that is truly compute- or
       memory-bound reaches a large share of its ceiling (a tuned bf16 matmul about 80% of
       peak, a large copy about 90% of bandwidth: stas00/ml-engineering, and the H200
       figures in benchmarks/RESULTS.md, 71 to 75% of peak with L2 flushed); at under a tenth
       the time must be going to something the roofline does not model: Python, dispatch,
       kernel launches, synchronisation (Horace He's overhead-bound regime). Pass
       ``overhead_fraction=0`` to switch the test off.
    2. otherwise ``"compute"`` when ``intensity >= ridge_point(peak, bandwidth)``,
       ``"memory"`` below it. Without a measurement only this placement is possible.

    :func:`step_bound` applies the same order to a whole training step.
    """
    validate.non_negatives(overhead_fraction=overhead_fraction)
    if overhead_fraction >= 1:
        raise ValueError(f"overhead_fraction must be below 1, got {overhead_fraction!r}")
    ceiling = attainable_tflops(intensity, peak_tflops, bandwidth_gbs)
    if achieved_tflops is not None:
        validate.non_negatives(achieved_tflops=achieved_tflops)
    overhead = achieved_tflops is not None and achieved_tflops < overhead_fraction * ceiling
    return _limit(overhead, intensity >= ridge_point(peak_tflops, bandwidth_gbs))


# --------------------------------------------------------------------------- a whole step: batch scaling

def batch_scaling(full_batch: float, full_ms: float, small_batch: float, small_ms: float) -> float:
    """Tokens/s at the full batch over tokens/s at the small one: ``R = (B / T_B) / (b / T_b)``
    (phase 0, section 5). 1 when throughput does not grow with the batch."""
    validate.positives(full_batch=full_batch, full_ms=full_ms, small_batch=small_batch, small_ms=small_ms)
    return (full_batch / full_ms) / (small_batch / small_ms)


def fixed_share(batch_scaling: float, full_batch: float, small_batch: float) -> float:
    """Share of the full-batch step that is a fixed cost: ``s = (R - 1) / (B / b - 1)``.

    If a step takes ``c + w·batch`` (a fixed cost ``c``, work proportional to the batch), then
    ``R = B (c + w b) / (b (c + w B))`` and solving for ``c / (c + w B)`` gives ``s``: 0 when
    every millisecond is work, 1 when the batch costs nothing. Timing noise can put a
    measured ``s`` slightly outside [0, 1]; it is returned as measured.
    """
    validate.positives(full_batch=full_batch, small_batch=small_batch)
    if full_batch <= small_batch:
        raise ValueError(f"full_batch ({full_batch!r}) must be larger than small_batch ({small_batch!r})")
    return (batch_scaling - 1) / (full_batch / small_batch - 1)


def step_bound(fixed_share: float, mfu: float, bandwidth_share: float, overhead_share: float = OVERHEAD_SHARE,
               busy_share: float = BUSY_SHARE) -> str:
    """Which limit applies to a training step: the order of :func:`bound`, on the evidence a
    whole step gives (phase 0, section 5; a course convention, not a law).

    A step has no single arithmetic intensity, so the roofline's two tests are replaced by
    measurements of the whole step:

    1. ``"overhead"`` when :func:`fixed_share` is above ``overhead_share`` (0.5): more than
       half of the full-batch step does not shrink per token as the batch grows, the cost
       the roofline does not model (launches, Python, the host).
    2. otherwise the busier of the two units, when it reaches ``busy_share`` (0.4) of its
       ceiling: ``"compute"`` when MFU (:func:`mfu`) is at least ``bandwidth_share``, the
       step's bandwidth (its operations' bytes, ``utils.measure.step_traffic``, over its time) as a
       share of the memory ceiling; ``"memory"`` when that share is the larger.
    3. ``"overhead"`` when neither unit reaches ``busy_share``: the time goes neither to
       arithmetic nor to moving bytes at speed (small kernels, the gaps between them, the
       host), which is what the roofline leaves to overhead. Memory is never the verdict by
       default: a memory-bound step shows a measured bandwidth.

    The numbers are taken as measured, without checks, so every input gets a verdict.
    """
    if fixed_share > overhead_share or max(mfu, bandwidth_share) < busy_share:
        return "overhead"
    return "compute" if mfu >= bandwidth_share else "memory"


# --------------------------------------------------------------------------- the course's three kernels

def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of ``(m x k) @ (k x n)``: ``2mnk`` (one multiply and one add per term)."""
    validate.non_negatives(m=m, n=n, k=k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype_bytes: int) -> int:
    """Least memory traffic of that matmul: read A (m·k) and B (k·n) once, write C (m·n) once.

    Real kernels re-read tiles from cache, so DRAM traffic is at least this.
    """
    validate.non_negatives(m=m, n=n, k=k)
    validate.positives(dtype_bytes=dtype_bytes)
    return dtype_bytes * (m * k + k * n + m * n)


def elementwise_bytes(numel: int, dtype_bytes: int, n_inputs: int = 1, n_outputs: int = 1) -> int:
    """Memory traffic of an elementwise op: each input read once, each output written once."""
    validate.non_negatives(numel=numel, n_inputs=n_inputs, n_outputs=n_outputs)
    validate.positives(dtype_bytes=dtype_bytes)
    return numel * dtype_bytes * (n_inputs + n_outputs)


def elementwise_flops(numel: int, flops_per_element: int = 1) -> int:
    """FLOPs of an elementwise op: ``numel x flops_per_element`` (an add or a multiply is 1)."""
    validate.non_negatives(numel=numel, flops_per_element=flops_per_element)
    return numel * flops_per_element
