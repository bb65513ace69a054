"""Peak GPU memory of each lab at its sizes, from ``utils.memory``'s formulas: what a tier plan
(``utils.tier_plan``) checks against a card.

The numbers are arithmetic on the model shapes in ``utils/configs/`` and the sizes in
``utils.env``; the few constants measured on a GPU say so where they are defined. A lab is a list
of :class:`Moment`: the points where its memory peaks, each with what the notebook's own process
holds then (the tensors still referenced from earlier cells included, since a notebook keeps its
globals), the blocks its caching allocator keeps reserved from earlier cells that it cannot reuse
then (``cached_gib``), and the other processes alive beside it (a serving engine, a training
process per GPU). The terms:

- a training step (:func:`train_gib`): weights, gradients and AdamW state
  (:func:`utils.memory.training_memory_estimate`: 16 bytes per parameter, fp32 weights also
  under autocast), the activations saved for the backward
  (:func:`utils.memory.transformer_activation_bytes`: 4-byte values in fp32, 2-byte under
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
``utils.tier_plan.MEASURED_PEAKS`` and checked by ``tests/utils/test_tier_plan.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from utils.memory import cross_entropy_bytes, training_memory_estimate, transformer_activation_bytes
from utils.timing import FLUSH_BYTES
from utils.units import GIB

LORA_R = 16  # utils.training.FinetuneRecipe.lora_r, on every linear layer
NF4_BYTES_PER_WEIGHT = 4.127 / 8  # NF4 with double quantization (utils/quantize.py)
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
FLUSH_GIB = FLUSH_BYTES / GIB  # utils.timing.benchmark zeroes this buffer before each timed run
GPT2_VOCAB = 50257  # GPT-2's vocabulary before the ladder pads it to a multiple of 64
# Tensors a lab held at a measured peak that no term here accounts for, where no per-cell
# reading places them, keyed by (lab, size tier, vLLM run): lab 03 without vLLM at the h100 tier
# peaked at 13.1 GiB device-wide (H100 80GB, nvidia-smi every 0.5 s, lab graded live at the h100
# tier, 2026-12-05), where the terms below reach 7.1 GiB. Its value is that peak less one CUDA
# context (utils.tier_plan.CONTEXT_GIB), over 1 + utils.tier_plan.MARGIN, plus 0.1: a calibration,
# not a cause. benchmarks/memory_h100.sh measures the lab per cell to find the cause.
UNPLACED_GIB = {("03_inference_serving", "h100", False): 10.9}


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
    from utils.models import preset_config_dict

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


def _gib(nbytes: float) -> float:
    return nbytes / GIB


def loss_bytes(tokens: int, vocab: int, dtype_bytes: float) -> float:
    """The logits and a causal-LM loss over them at the loss's peak. 16-bit logits:
    :func:`utils.memory.cross_entropy_bytes` (18 bytes per logit, the fp32 upcast counted).
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
    return _gib(s.params * 12)


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
    return states + _gib(acts + loss_bytes(batch * seq, vocab or s.vocab, d))


def lora_gib(preset: str, batch: int, seq: int, *, checkpointing: bool, quant: str = "none") -> float:
    """One LoRA step (``utils.training.measure_finetune``): 16-bit or NF4 base weights."""
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
    return _gib(weights + acts + cross_entropy_bytes(batch * seq, s.vocab, 2)) + adapters


def weights_gib(preset: str, dtype_bytes: float) -> float:
    return _gib(shape(preset).params * dtype_bytes)


def forward_gib(preset: str, tokens: int, dtype_bytes: float) -> float:
    """A forward pass without gradients over ``tokens`` positions: the largest layer's working
    set (input, QKV, MLP) and the logits, with an fp32 copy of them."""
    s = shape(preset)
    layer = tokens * (4 * s.hidden + 3 * s.ffn) * dtype_bytes
    return _gib(layer + tokens * s.vocab * (dtype_bytes + 4))


def fused_decoder_gib(preset: str, dtype_bytes: float) -> float:
    """``utils.decode.FastDecoder``'s own copies: fused QKV and fused gate/up weights."""
    s = shape(preset)
    kv = s.kv_heads * s.head_dim
    return _gib(s.layers * s.hidden * (s.hidden + 2 * kv + 2 * s.ffn) * dtype_bytes)


def kv_gib(preset: str, sequences: int, tokens: int, dtype_bytes: float) -> float:
    return _gib(shape(preset).kv_bytes_per_token(dtype_bytes) * sequences * tokens)


def serve_gib(preset: str, kv_tokens: int, dtype_bytes: float, quant: str = "none") -> float:
    """A ``transformers serve`` process: weights, its bounded KV cache, and buffers."""
    s = shape(preset)
    if quant == "nf4":
        w = _gib(s.linear_params * NF4_BYTES_PER_WEIGHT + (s.params - s.linear_params) * dtype_bytes)
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
    ref = _gib(s.params * 4) + _gib(2 * batch * seq * s.vocab * (d + 4))
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
    """What the moments depend on besides the sizes (``utils.tier_plan`` fills it from the card)."""

    half: str  # "bf16" or "fp16": the card's 16-bit dtype
    card_gib: float
    multi_gpu: bool  # lab 02: one training process per GPU over NCCL (else CPU processes)
    vllm: bool  # vLLM's CUDA build runs on this card
    engine_share: float = 0.4  # vLLM's --gpu-memory-utilization in lab 04 (utils.serve.start's default)
    lab03_engine_share: float = 0.5  # the same in lab 03's vLLM cell
    sms: int = 132  # the GPU's SMs: lab 00's shape sweep is sized by them (utils.matmul_sweep.sweep_shapes)
    tier: str = ""  # the utils.env size tier of the sizes


def _lab00(s, c: Context) -> list[Moment]:
    from utils.matmul_sweep import sweep_shapes

    matmul = _gib(3 * s.matmul_n**2 * 2) + FLUSH_GIB
    copy = _gib(2 * s.elementwise_numel * 4)
    train = train_gib(s.model, s.batch_size, s.seq_len, "fp32")
    # the sweep's inputs are freed shape by shape; one that is larger than every block cached so far
    # (the largest: a training step's fp32 loss tensor) and than the last such input is a new segment
    largest = _gib(s.batch_size * s.seq_len * shape(s.model).vocab * 4)
    grown = 0.0
    for m, _n, k in sweep_shapes(c.sms, c.tier or "t4").values():
        a = _gib(m * k * 2)
        if a > largest:
            grown, largest = grown + a, a
    return [Moment(f"matmul {s.matmul_n}^3 in {c.half}", matmul),
            Moment(f"copy and x + 1 over {s.elementwise_numel:,} fp32 elements", matmul + copy),
            Moment(f"{s.model} training step, fp32, batch {s.batch_size} x {s.seq_len}", matmul + copy + train),
            Moment("shape sweep after the training (its largest inputs fit no cached block)",
                   matmul + copy + train + grown)]


def _lab01(s, c: Context) -> list[Moment]:
    vocab = -(-shape(s.model).vocab // 64) * 64  # the ladder pads the vocabulary to a multiple of 64
    loop = states_gib(s.model)  # a training loop's weights and AdamW state between steps (grads set to None)
    # ``naive`` stays referenced after its section; each rung's loop holds itself in a reference
    # cycle (``TrainLoop.loss_fn = self._loss``, utils/training.py), so the rung before is freed
    # only when Python's cycle collector runs: two loops beside the rung being measured
    d = 2 if c.half in ("bf16", "fp16") else 4
    unpadded = _gib(loss_bytes(s.big_batch * s.seq_len, GPT2_VOCAB, d))  # cached, each block a little too small
    return [Moment(f"naive loop, fp32, batch {s.naive_batch} x {s.seq_len}",
                   train_gib(s.model, s.naive_batch, s.seq_len, "fp32")),
            Moment(f"ladder at batch {s.big_batch} x {s.seq_len}, {c.half} autocast, eager, vocabulary padded "
                   "(the unpadded rung's loss blocks still cached)",
                   2 * loop + train_gib(s.model, s.big_batch, s.seq_len, c.half, vocab=vocab), cached_gib=unpadded),
            Moment(f"{s.ft_model} LoRA in {c.half} without checkpointing (the eval-mode trap), batch "
                   f"{s.ft_batch} x {s.ft_seq_len}",
                   loop + lora_gib(s.ft_model, s.ft_batch, s.ft_seq_len, checkpointing=False))]


def _lab02(s, c: Context) -> list[Moment]:
    from utils.distributed import parse_size_bytes

    # the notebook checks its Triton kernels on 2 x 777 tensors; their timing (utils.fused.compare_bias_gelu)
    # runs in the grader's sandbox once the kernel is gone (grader/labs/multi_gpu/judges.py)
    fused = 0.0
    if not c.multi_gpu:
        return [Moment("fused bias + GELU bonus (the multi-process runs are CPU processes)", fused)]
    prec = "bf16" if s.bf16 else "fp32"
    largest = max(parse_size_bytes(x) for x in s.allreduce_sizes.split(","))
    ddp = train_gib(s.model, s.batch_per_device, s.seq_len, prec) + _gib(shape(s.model).params * 4)  # + DDP buckets
    return [Moment("all-reduce of the largest message, per GPU", 0.0, (Other("torchrun rank", _gib(2 * largest)),)),
            Moment(f"reference DDP run, {prec}, batch {s.batch_per_device} x {s.seq_len} per GPU", 0.0,
                   (Other("training rank", ddp),)),
            Moment(f"TRL DPO, {prec}, batch {s.post_batch} x {s.post_max_len} per GPU", 0.0,
                   (Other("training rank", dpo_gib(s.model, s.post_batch, s.post_max_len, prec)),)),
            Moment("fused bias + GELU bonus", fused)]


def _lab03(s, c: Context) -> list[Moment]:
    d = 2
    model = weights_gib(s.model, d)
    # the fast path's fused weights and static cache (rounded up to 64 positions) stay referenced
    fast = fused_decoder_gib(s.model, d) + kv_gib(s.model, max(s.batches), s.prompt_len + s.new_tokens + 64, d)
    resident = model + fast
    out = [Moment(f"copy bandwidth over {s.copy_numel:,} fp32 elements",
                  model + _gib(2 * s.copy_numel * 4) + FLUSH_GIB),
           Moment(f"prefill of {max(s.ttft_lens)} tokens", model + forward_gib(s.model, max(s.ttft_lens), d)),
           Moment(f"three decode paths and the batching sweep up to batch {max(s.batches)}",
                  resident + forward_gib(s.model, max(s.batches), d)),
           Moment("quantization comparison: a second 16-bit copy loaded beside the first",
                  resident + model + forward_gib(s.model, s.ppl_seq_len, d))]
    if c.vllm:
        out.append(Moment("vLLM engine beside the notebook's model (the notebook's cache emptied first)", resident,
                          (Other("vLLM engine", engine_gib(c.lab03_engine_share * c.card_gib), fixed=True),)))
    unplaced = UNPLACED_GIB.get(("03_inference_serving", c.tier, c.vllm))
    if unplaced is not None:
        out.append(Moment("the lab's measured peak without vLLM, not yet placed in a cell (UNPLACED_GIB)", unplaced))
    return out


def _lab04(s, c: Context) -> list[Moment]:
    kv_tokens = s.num_requests * s.max_len
    if c.vllm:
        share = engine_gib(c.engine_share * c.card_gib)
        return [Moment("two vLLM engines (the served model and one other configuration, section 6)", 0.0,
                       (Other("vLLM engine", share, True), Other("vLLM engine", share, True)))]
    return [Moment("two transformers serve processes (continuous batching and bnb-4bit, section 6)", 0.0,
                   (Other("transformers serve", serve_gib(s.model, kv_tokens, 2)),
                    Other("transformers serve, bnb-4bit", serve_gib(s.model, kv_tokens, 2, "nf4"))))]


def _lab05(s, c: Context) -> list[Moment]:
    points = _gib(3 * s.matmul_n**2 * 2 + 2 * s.copy_numel * 4) + FLUSH_GIB
    resident = points + states_gib(s.model) + weights_gib(s.model, 4)  # train model + AdamW, decode model
    train = train_gib(s.model, s.train_batch, s.seq_len, "fp32") - states_gib(s.model)
    decode = kv_gib(s.model, max(s.decode_batches), s.prompt_len + s.new_tokens, 4) \
        + forward_gib(s.model, max(s.decode_batches), 4)
    ckpt = train_gib(s.ckpt_model, s.ckpt_batch, s.ckpt_seq_len, "fp32")
    run = Other("checkpointed run", ckpt)
    # utils.kill_harness.kill_and_resume empties the notebook's cache first, then runs the reference
    # and the run it kills side by side (the resuming process starts its CUDA work after the kill)
    return [Moment(f"training step, fp32, batch {s.train_batch} x {s.seq_len}", resident + train),
            Moment(f"decode at batch {max(s.decode_batches)}", resident + decode),
            Moment("kill-and-resume: the reference run and the run to be killed, each in its own process "
                   "(the notebook's cache emptied first)", resident, (run, run)),
            Moment("checkpoint overhead, measured in the notebook's process", resident + ckpt)]


LABS = {"00_foundations": _lab00, "01_single_gpu": _lab01, "02_multi_gpu": _lab02, "03_inference_serving": _lab03,
        "04_benchmarking_production": _lab04, "05_hardware_and_cost": _lab05}


def moments(lab: str, sizes, context: Context) -> list[Moment]:
    """The memory peaks of ``lab`` at ``sizes`` (a ``utils.env`` sizes object)."""
    return LABS[lab](sizes, context)
