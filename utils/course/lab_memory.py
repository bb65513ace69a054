"""The terms a lab's peak GPU memory is estimated from, with ``utils.measure.memory``'s formulas: what a tier
plan (``utils.course.tier_plan``) checks against a card.

The numbers are arithmetic on the model shapes in ``utils/configs/`` and a lab's sizes
(``grader/labs/<lab>/sizes.py``); each lab's moments are in its ``plan.py``, built from these terms;
the few constants measured on a GPU say so where they are defined. A lab is a list
of :class:`Moment`: the points where its memory peaks, each with what the notebook's own process
holds then (the tensors still referenced from earlier cells included, since a notebook keeps its
globals), the blocks its caching allocator keeps reserved from earlier cells that it cannot reuse
then (``cached_gib``), and the other processes alive beside it (a serving engine, a training
process per GPU). The terms:

- a training step (:func:`train_gib`): weights, gradients and AdamW state
  (:func:`utils.measure.memory.training_memory_estimate`: 16 bytes per parameter, fp32 weights also
  under autocast), the activations saved for the backward
  (:func:`utils.measure.memory.transformer_activation_bytes`: 4-byte values in fp32, 2-byte under
  16-bit autocast; attention scores are not saved, as SDPA's fused kernels recompute them), and
  the logits with the loss (:func:`loss_bytes`). Two terms on top: GPT-2's
  ``gelu_new`` is transformers' ``NewGELUActivation``, ``0.5 x (1 + tanh(...))`` written as
  PyTorch ops, whose multiplications and tanh save ``x``, ``tanh(u)``, ``0.5 x`` and ``1 + tanh(u)``
  where a fused GeLU saves ``x`` only (three more tensors of the MLP's width per layer; read from
  the code and autograd's rules); and under autocast the 16-bit copy of every weight, which
  autocast casts once and the backward keeps. The activation formula is the GPT one (an MLP of 4x
  the width); for a Llama shape it is used as it is, an approximation.
- a LoRA step (:func:`lora_gib`): 16-bit (or NF4) base weights, fp32 adapters with their AdamW
  state, the activations as above plus the fp32 copy of each adapted layer's input (PEFT keeps
  the adapters in fp32 and casts their input to it), and the logits with the loss.
- a serving engine whose memory is a share of the card that the engine itself enforces (vLLM's
  ``--gpu-memory-utilization``) is that share plus what its processes hold outside it
  (:data:`ENGINE_OUTSIDE_SHARE_GIB`), with no margin: ``fixed``.
- PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) keeps every block it freed
  reserved, and serves a request from a cached block only if the block is at least as large; a
  cached block is given back to the driver only when a ``cudaMalloc`` fails (or on
  ``torch.cuda.empty_cache()``). So a cell whose tensors are each a little larger than an earlier
  cell's (lab 01's ladder after the vocabulary is padded, lab 00's shape sweep) grows the reserve
  by their size while the earlier blocks stay: ``cached_gib``, which a full card takes back.

How close these come to the peaks measured per notebook cell is recorded, with the raw files, in
each lab's ``MEASURED_PEAKS`` (``grader/labs/<lab>/plan.py``) and checked by ``tests/utils/test_tier_plan.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from utils.measure.memory import cross_entropy_bytes, training_memory_estimate, transformer_activation_bytes
from utils.measure.timing import FLUSH_BYTES
from utils.model.models import preset_config_dict
from utils.units import GIB

LORA_R = 16  # utils.train.training.FinetuneRecipe.lora_r, on every linear layer
NF4_BYTES_PER_WEIGHT = 4.127 / 8  # NF4 with double quantization (utils/model/quantize.py)
INT8_BYTES_PER_WEIGHT = 1 + 4 / 2048  # one byte, one fp32 scale per output row of 2048
SERVE_OVERHEAD_GIB = 0.5  # activations and buffers of a serving process beside weights and cache (an estimate)
# What a vLLM engine's processes hold beyond their --gpu-memory-utilization share (their CUDA
# contexts, and what vLLM allocates outside the share it sizes its KV cache from). Measured, not
# derived: NVML accounted 8.48 GiB to the engine of lab 03 for a 7.50 GiB share (vLLM 0.26.0, one
# H200 rehearsing a T4; benchmarks/RESULTS.md, "The labs as a T4 learner runs them"); a T4's
# own CUDA context is smaller than an H200's, so on a T4 this errs high.
ENGINE_OUTSIDE_SHARE_GIB = 1.0
# Lab 04's two engines rehearsing a T4 agree: each held about 0.98 to 0.99 GiB beyond its 6.0 GiB
# share device-wide (7,771 MiB with the first engine alone, of which about 621 MiB is a torch
# process's context; 15,028 - 7,869 MiB for the second;
# benchmarks/results/h200-t4-rehearsal-all-labs-2026-12-04/t4_mem_04_benchmarking_production.txt).
FLUSH_GIB = FLUSH_BYTES / GIB  # utils.measure.timing.benchmark zeroes this buffer before each timed run
GPT2_VOCAB = 50257  # GPT-2's vocabulary before the ladder pads it to a multiple of 64


@dataclass(frozen=True)
class Shape:
    """What the estimates need of a preset (``utils/configs/<preset>.json``)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    params: int  # all parameters, embeddings included, the tied head counted once
    linear_params: int  # in the layers' linear maps (what bitsandbytes quantizes)
    python_gelu: bool = False  # GPT-2's "gelu_new": transformers' NewGELUActivation, written as PyTorch ops

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def lora_params(self, r: int = LORA_R) -> int:
        """LoRA adapters of rank ``r`` on every linear map: ``r x (in + out)`` each."""
        kv = self.kv_heads * self.head_dim
        dims = [(self.hidden, self.hidden), (self.hidden, kv), (self.hidden, kv), (self.hidden, self.hidden)]
        n_mlp = 3 if self.ffn != 4 * self.hidden else 2
        dims += [(self.hidden, self.ffn)] * (n_mlp - 1) + [(self.ffn, self.hidden)]
        return self.layers * sum(r * (i + o) for i, o in dims)


@cache
def shape(preset: str) -> Shape:
    c = preset_config_dict(preset)
    if c.get("model_type") == "gpt2":
        L, h, V, P = c["n_layer"], c["n_embd"], c["vocab_size"], c["n_positions"]
        ffn = c.get("n_inner") or 4 * h
        linear = L * (4 * h * h + 2 * h * ffn)
        params = L * (linear // L + 9 * h + ffn) + V * h + P * h + 2 * h
        return Shape(L, h, c["n_head"], c["n_head"], ffn, V, params, linear,
                     c.get("activation_function", "gelu_new") == "gelu_new")
    L, h, V, ffn = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    kvd = kv * (c.get("head_dim") or h // heads)
    linear = L * (2 * h * h + 2 * h * kvd + 3 * h * ffn)
    head = 0 if c.get("tie_word_embeddings") else V * h
    return Shape(L, h, heads, kv, ffn, V, linear + L * 2 * h + V * h + head + h, linear)


def gib_of(nbytes: float) -> float:
    return nbytes / GIB


def loss_bytes(tokens: int, vocab: int, dtype_bytes: float) -> float:
    """The logits and a causal-LM loss over them at the loss's peak. 16-bit logits:
    :func:`utils.measure.memory.cross_entropy_bytes` (18 bytes per logit, the fp32 upcast counted).
    fp32 logits: 12 bytes per logit. ``loss = model(...).loss`` drops the outputs object, so the
    logits are not kept for the backward (the head's backward needs its input, not its output);
    ``log_softmax`` saves its fp32 output, and the backward holds that output, the gradient
    coming in and the gradient going out (``torch/_refs``'s and autograd's formulas for
    ``log_softmax`` and ``nll_loss``): 4 + 4 + 4 bytes."""
    if dtype_bytes == 4:
        return float(tokens) * vocab * 12
    return cross_entropy_bytes(tokens, vocab, dtype_bytes)


def states_gib(preset: str) -> float:
    """fp32 weights and AdamW's two moments, what a training loop holds between steps."""
    s = shape(preset)
    return gib_of(s.params * 12)


def train_gib(preset: str, batch: int, seq: int, precision: str, *, vocab: int | None = None,
              checkpointing: bool = False) -> float:
    """One training step of ``preset`` (fp32 weights, AdamW), in ``precision`` (``fp32``, or
    ``bf16``/``fp16`` autocast), ``vocab`` the (padded) output width."""
    s = shape(preset)
    d = 4 if precision == "fp32" else 2
    states = training_memory_estimate(s.params, param_dtype="fp32", optimizer="adamw")["total_gib"]
    acts = transformer_activation_bytes(batch, seq, s.hidden, s.layers, s.heads, d, checkpointing,
                                        attention_scores=False)
    if s.python_gelu:  # x, tanh(u), 0.5 x and 1 + tanh(u) saved where a fused GeLU saves x: 3 more 4h-wide tensors
        acts += 3 * s.ffn * d * batch * seq * (1 if checkpointing else s.layers)
    if d == 2:  # autocast saves the 16-bit copy of every weight it cast for the backward
        acts += s.params * 2
    return states + gib_of(acts + loss_bytes(batch * seq, vocab or s.vocab, d))


def lora_gib(preset: str, batch: int, seq: int, *, checkpointing: bool, quant: str = "none") -> float:
    """One LoRA step (``utils.train.training.measure_finetune``): 16-bit or NF4 base weights."""
    s = shape(preset)
    if quant == "nf4":
        weights = s.linear_params * NF4_BYTES_PER_WEIGHT + (s.params - s.linear_params) * 2
    else:
        weights = s.params * 2
    adapters = training_memory_estimate(s.lora_params(), param_dtype="fp32", optimizer="adamw")["total_gib"]
    per_layer_copies = 4.0 * batch * seq * (6 * s.hidden + s.ffn)  # fp32 inputs of q, k, v, o, gate, up, down
    acts = transformer_activation_bytes(batch, seq, s.hidden, s.layers, s.heads, 2, checkpointing, dropout=False,
                                        attention_scores=False)
    acts += per_layer_copies * (1 if checkpointing else s.layers)
    return gib_of(weights + acts + cross_entropy_bytes(batch * seq, s.vocab, 2)) + adapters


def weights_gib(preset: str, dtype_bytes: float) -> float:
    return gib_of(shape(preset).params * dtype_bytes)


def forward_gib(preset: str, tokens: int, dtype_bytes: float) -> float:
    """A forward pass without gradients over ``tokens`` positions: the largest layer's working
    set (input, QKV, MLP) and the logits, with an fp32 copy of them."""
    s = shape(preset)
    layer = tokens * (4 * s.hidden + 3 * s.ffn) * dtype_bytes
    return gib_of(layer + tokens * s.vocab * (dtype_bytes + 4))


def fused_decoder_gib(preset: str, dtype_bytes: float) -> float:
    """``utils.serving.decode.FastDecoder``'s own copies: fused QKV and fused gate/up weights."""
    s = shape(preset)
    kv = s.kv_heads * s.head_dim
    return gib_of(s.layers * s.hidden * (s.hidden + 2 * kv + 2 * s.ffn) * dtype_bytes)


def kv_gib(preset: str, sequences: int, tokens: int, dtype_bytes: float) -> float:
    return gib_of(shape(preset).kv_bytes_per_token(dtype_bytes) * sequences * tokens)


def serve_gib(preset: str, kv_tokens: int, dtype_bytes: float, quant: str = "none") -> float:
    """A ``transformers serve`` process: weights, its bounded KV cache, and buffers."""
    s = shape(preset)
    if quant == "nf4":
        w = gib_of(s.linear_params * NF4_BYTES_PER_WEIGHT + (s.params - s.linear_params) * dtype_bytes)
    else:
        w = weights_gib(preset, dtype_bytes)
    return w + kv_gib(preset, 1, kv_tokens, dtype_bytes) + SERVE_OVERHEAD_GIB


def engine_gib(share_gib: float) -> float:
    """GPU memory a vLLM engine holds for a ``--gpu-memory-utilization`` share of ``share_gib``."""
    return share_gib + ENGINE_OUTSIDE_SHARE_GIB


def dpo_gib(preset: str, batch: int, seq: int, precision: str) -> float:
    """A TRL DPO step: the policy trains on chosen and rejected together (``2 x batch``
    sequences) beside a frozen reference copy that runs the same sequences without gradients."""
    s = shape(preset)
    d = 4 if precision == "fp32" else 2
    ref = gib_of(s.params * 4) + gib_of(2 * batch * seq * s.vocab * (d + 4))
    return train_gib(preset, 2 * batch, seq, precision) + ref


# -- the labs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Other:
    """A process beside the notebook's at a :class:`Moment`, on each GPU it uses."""

    what: str
    gib: float
    fixed: bool = False  # a share the process enforces itself, plus what it holds outside it: no margin


@dataclass(frozen=True)
class Moment:
    """A point where a lab's memory peaks: the notebook process's tensors then, the blocks its
    allocator keeps cached from earlier cells and cannot reuse then (given back when the card is
    full), and the other processes."""

    name: str
    notebook_gib: float
    others: tuple[Other, ...] = ()
    cached_gib: float = 0.0


@dataclass(frozen=True)
class Context:
    """What the moments depend on besides the sizes (``utils.course.tier_plan`` fills it from the card)."""

    half: str  # "bf16" or "fp16": the card's 16-bit dtype
    card_gib: float
    multi_gpu: bool  # lab 02: one training process per GPU over NCCL (else CPU processes)
    vllm: bool  # vLLM's CUDA build runs on this card
    engine_share: float = 0.4  # vLLM's --gpu-memory-utilization in lab 04 (utils.serving.serve.start's default)
    lab03_engine_share: float = 0.5  # the same in lab 03's vLLM cell
    sms: int = 132  # the GPU's SMs: lab 00's shape sweep is sized by them (utils.measure.matmul_sweep.sweep_shapes)
    tier: str = ""  # the utils.course.env size tier of the sizes
