"""Training loops for phase 1: a deliberately naive one, the fixes one at a time, and LoRA/QLoRA recipes.

A :class:`LoopConfig` names every choice the phase-1 notebook teaches (precision, DataLoader
workers, pinned memory, a host sync per step, batch size, ``torch.compile``, fused AdamW,
gradient accumulation, activation checkpointing, vocabulary padding); :func:`build_loop`
turns one into a :class:`TrainLoop` whose ``step()`` runs one optimizer step. The naive
baseline and the optimized loop are the same code with different switches, so a
before/after comparison changes one thing at a time.

:class:`FinetuneRecipe` and :func:`measure_finetune` do the same for parameter-efficient
fine-tuning of a 1B+ model with PEFT (LoRA) and bitsandbytes (4-bit NF4, QLoRA: Dettmers
et al. 2023, arXiv 2305.14314): peak memory split into weights, optimizer state, gradients
and activations, throughput, trainable parameters, and whether every LoRA adapter actually
received a gradient (a recipe that is lean because it trains nothing is not lean).

Memory on a CPU is accounted, not measured: there is no allocator peak to read, so
:func:`measure_finetune` sums parameter, optimizer-state and gradient bytes and the bytes
autograd saved for the backward pass (:func:`utils.measure.memory.count_saved_bytes`). On
CUDA the peak is ``torch.cuda.max_memory_allocated`` and the saved bytes are reported too.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from utils import validate
from utils.device import rehearsal
from utils.device.hardware import current_spec
from utils.device.monitor import GpuMonitor
from utils.measure.flops import flops_per_token_from_config, mfu_from_throughput
from utils.measure.memory import count_saved_bytes, tensor_bytes, training_memory_estimate, transformer_activation_bytes
from utils.measure.timing import Stopwatch, device_sync
from utils.model.models import (
    TokenBlocks,
    _load_checkpoint,
    build_model,
    checkpoint_dir,
    choose_weights,
    get_tokenizer,
    model_tokenizer,
    preset_config,
    token_batches,
)
from utils.units import GIB

PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "reentrant", "non-reentrant")


# --------------------------------------------------------------------------- the loop

@dataclass(frozen=True)
class LoopConfig:
    """Every switch of a training loop that phase 1 measures. Defaults are the naive baseline."""
    batch_size: int = 4
    seq_len: int = 256
    precision: str = "fp32"  # fp32, bf16 (autocast), fp16 (autocast + GradScaler)
    num_workers: int = 0  # DataLoader worker processes
    pin_memory: bool = False  # page-locked host batches, needed for a truly asynchronous copy
    non_blocking: bool = False  # .to(device, non_blocking=True)
    sync_every_step: bool = True  # loss.item() each step: a host sync, as a logging line often does
    compile_mode: str | None = None  # None: eager; else a torch.compile mode ("default", "max-autotune-no-cudagraphs")
    fused_adamw: bool = False  # one fused kernel for the whole AdamW update instead of a foreach/loop
    grad_accum: int = 1  # micro-batches per optimizer step
    checkpointing: bool = False  # recompute each layer's activations in the backward (non-reentrant)
    pad_vocab_to: int = 1  # round the vocabulary up to a multiple of this (64: tensor-core friendly shapes)
    dropout: float | None = None  # None: the preset's dropout; 0.0 turns it off (a modelling choice, not a fix)
    lr: float = 3e-4

    def __post_init__(self):
        for name in ("batch_size", "seq_len", "grad_accum", "pad_vocab_to"):
            validate.positive_int(f"LoopConfig.{name}", getattr(self, name))
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"LoopConfig.num_workers must be an integer >= 0, got {self.num_workers!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"LoopConfig.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    def to_dict(self) -> dict:
        return asdict(self)


def naive_config(batch_size: int, seq_len: int) -> LoopConfig:
    """The baseline: fp32, no workers, pageable memory, a host sync every step, eager, for-loop AdamW."""
    return LoopConfig(batch_size=batch_size, seq_len=seq_len)


def best_precision(device: Any = None) -> str:
    """``bf16`` on Ampere and newer (compute capability 8+), ``fp16`` on older GPUs (T4, V100:
    no bf16 tensor cores, or one rehearsed: ``utils.device.rehearsal``), ``fp32`` on a CPU (no tensor
    cores; autocast only adds casts)."""
    import torch

    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda":
        return "fp32"
    return rehearsal.half_dtype(dev.index or 0)


def autocast_dtype(precision: str):
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to ``multiple`` (GPT-2: 50257 -> 50304 for 64)."""
    return int(math.ceil(vocab_size / multiple) * multiple)


class RepeatedBlocks:
    """A map-style dataset of ``length`` token blocks that wraps around :class:`utils.model.models.TokenBlocks`,
    so an epoch is long enough that worker processes are not restarted every few batches."""

    def __init__(self, blocks, length: int):
        self.blocks, self.length = blocks, int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.blocks[i % len(self.blocks)]


def make_loader(config: LoopConfig, vocab_size: int, steps_per_epoch: int = 1000):
    """A ``torch.utils.data.DataLoader`` of ``(input_ids, labels)`` over the shipped text, with
    the config's workers and pinned memory. Workers persist across epochs."""
    import torch

    blocks = TokenBlocks(get_tokenizer(None), None, config.seq_len, vocab_size=vocab_size)
    ds = RepeatedBlocks(blocks, steps_per_epoch * config.batch_size)
    return torch.utils.data.DataLoader(ds, batch_size=config.batch_size, shuffle=False, drop_last=True,
                                       num_workers=config.num_workers, pin_memory=config.pin_memory,
                                       persistent_workers=config.num_workers > 0)


def _forever(loader):
    while True:
        yield from loader


class TrainLoop:
    """A model, its optimizer and its batches, built from a :class:`LoopConfig`; ``step()`` is one
    optimizer step (``grad_accum`` micro-batches). ``flops_per_token`` counts the unpadded
    model (PaLM's 6N + 12LHQT, ``utils.measure.flops``): padding the vocabulary adds work, not useful FLOPs."""

    def __init__(self, preset: str, config: LoopConfig, device: Any = None, seed: int = 0):
        import torch

        self.preset, self.config = preset, config
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        base_cfg = preset_config(preset)
        self.vocab_size = base_cfg.vocab_size
        overrides = {}
        if config.pad_vocab_to > 1:
            overrides["vocab_size"] = padded_vocab(self.vocab_size, config.pad_vocab_to)
        if config.dropout is not None:
            for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout"):
                if hasattr(base_cfg, key):
                    overrides[key] = config.dropout
        torch.manual_seed(seed)
        self.model = build_model(preset, device=self.device, **overrides)
        # a training step needs no KV cache; HF builds one whenever config.use_cache is on
        # (GPT-2's default), holding every layer's keys and values until the step ends
        self.model.config.use_cache = False
        if config.checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        kw = {"fused": True} if config.fused_adamw else {"foreach": False}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, **kw)
        self.scaler = torch.amp.GradScaler(self.device.type) if config.precision == "fp16" else None
        # torch.compile wraps the loss, not the model: compiled, the model's every output leaves the
        # graph, the [batch, seq, vocab] logits included, and its backward then gets a zero gradient
        # of the logits' shape (autograd materializes unused grads: set_materialize_grads). On an
        # H200 that cost 13% of the step and 3.07 GiB (GPT-2-small, batch 16 x 1024; RESULTS.md)
        # a GPU below compute capability 7.0 (a P100) cannot compile (utils.course.tier_plan): eager, as its plan says
        from utils.course.tier_plan import too_old_to_compile

        self.compile_skipped = too_old_to_compile(self.device) if config.compile_mode else None
        compiled = bool(config.compile_mode) and self.compile_skipped is None
        self.loss_fn = torch.compile(self._loss, mode=config.compile_mode) if compiled else self._loss
        self.loader = make_loader(config, self.vocab_size)
        self._batches = _forever(self.loader)
        self.flops_per_token = flops_per_token_from_config(base_cfg, config.seq_len)
        self.last_loss = None

    @property
    def tokens_per_step(self) -> int:
        return self.config.tokens_per_step

    def _loss(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels).loss

    def _autocast(self):
        import torch

        dtype = autocast_dtype(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def step(self):
        """One optimizer step; returns the loss (a float when the config syncs every step, else a tensor)."""
        c = self.config
        loss = None
        for _ in range(c.grad_accum):
            x, y = next(self._batches)
            x = x.to(self.device, non_blocking=c.non_blocking)
            y = y.to(self.device, non_blocking=c.non_blocking)
            with self._autocast():
                loss = self.loss_fn(x, y) / c.grad_accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = loss.detach() * c.grad_accum
        return self.last_loss.item() if c.sync_every_step else self.last_loss


def build_loop(preset: str, config: LoopConfig, device: Any = None, seed: int = 0) -> TrainLoop:
    return TrainLoop(preset, config, device, seed)


def peak_tflops_for(precision: str, spec=None) -> float | None:
    """The datasheet peak that MFU divides by: the dtype in use (fp32 as TF32 only if enabled)."""
    import torch

    spec = spec or current_spec()
    if spec.kind != "gpu":
        return None
    if precision == "fp32":
        return spec.peak_tflops("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    return spec.peak_tflops(precision)


def measure_loop(loop: TrainLoop, steps: int, warmup_steps: int = 3, monitor: bool = True) -> dict:
    """Run ``warmup_steps + steps`` steps under a ``utils.measure.timing.Stopwatch``, the measured
    ``steps`` also under a GpuMonitor (so its utilization covers only them);
    returns tokens/s, step times, the model FLOP/s they make (``achieved_tflops``, from the loop's
    ``flops_per_token``), MFU against the datasheet peak of the loop's precision (None on a CPU;
    ``utils.measure.matmul_ceiling.fraction`` reads ``achieved_tflops`` against the matmul ceiling measured
    on the device instead), mean GPU utilization and peak allocated memory (CUDA)."""
    import torch

    if loop.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(loop.device)
    sw = Stopwatch(warmup_steps=warmup_steps, tokens_per_step=loop.tokens_per_step, device=loop.device)
    mon = GpuMonitor(interval_s=0.1) if monitor else contextlib.nullcontext()
    for _ in range(warmup_steps):  # compilation and allocator growth stay outside the monitor:
        with sw.step():             # inside it, 30 s of compiling read as 4.5% utilization
            loop.step()
    device_sync(loop.device)
    with mon:
        for _ in range(steps):
            with sw.step():
                loop.step()
    s = sw.summary()
    peak = peak_tflops_for(loop.config.precision)
    out = {"tokens_per_s": s["tokens_per_s"], "median_ms": s["median_ms"], "p20_ms": s["p20_ms"],
           "p80_ms": s["p80_ms"], "steps": s["steps"], "method": s["method"],
           "flops_per_token": loop.flops_per_token, "achieved_tflops": s["tokens_per_s"] * loop.flops_per_token / 1e12,
           "mfu": mfu_from_throughput(s["tokens_per_s"], loop.flops_per_token, peak) if peak else None,
           "peak_tflops": peak, "util_gpu_pct": None, "peak_allocated_gib": None}
    if monitor:
        stats = next(iter(mon.summary().values()), {})
        util = stats.get("util_gpu_pct") or {}
        out["util_gpu_pct"] = util.get("mean")
    if loop.device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(loop.device) / GIB
    return out


# --------------------------------------------------------------------------- LoRA and QLoRA

@dataclass(frozen=True)
class FinetuneRecipe:
    """How a LoRA fine-tune is set up. The fields are the knobs whose defaults differ between
    tutorials, and which change peak memory by several times at the same batch and sequence."""
    quant: str = "none"  # "none": 16-bit base weights (bf16; fp16 on a GPU without bf16); "nf4": 4-bit NF4 (QLoRA)
    checkpointing: str = "non-reentrant"  # "none", "reentrant" (torch's old default), "non-reentrant"
    autocast: bool = False  # wrap forward in torch.autocast (bf16; fp16 on a GPU without bf16)
    prepare_kbit: bool = False  # peft.prepare_model_for_kbit_training (upcasts non-4-bit params to fp32)
    lora_r: int = 16
    lora_alpha: int = 32
    target_modules: str = "all-linear"
    train_mode: bool = True  # False: left in eval mode, as from_pretrained returns a model; checkpointing is then off

    def __post_init__(self):
        if self.quant not in ("none", "nf4"):
            raise ValueError(f"FinetuneRecipe.quant must be 'none' or 'nf4', got {self.quant!r}")
        if self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"FinetuneRecipe.checkpointing must be one of {', '.join(CHECKPOINTING)}, "
                             f"got {self.checkpointing!r}")


RECIPES = {
    "lora_bf16_lean": FinetuneRecipe(),
    "lora_bf16_reentrant": FinetuneRecipe(checkpointing="reentrant"),
    "lora_bf16_autocast": FinetuneRecipe(autocast=True),
    "lora_bf16_no_ckpt": FinetuneRecipe(checkpointing="none"),
    "qlora_lean": FinetuneRecipe(quant="nf4"),
    "qlora_autocast": FinetuneRecipe(quant="nf4", autocast=True),
    "qlora_prepare_kbit": FinetuneRecipe(quant="nf4", checkpointing="reentrant", prepare_kbit=True),
    "lora_bf16_autocast_eval": FinetuneRecipe(autocast=True, train_mode=False),
    "qlora_autocast_eval": FinetuneRecipe(quant="nf4", autocast=True, train_mode=False),
    "qlora_prepare_kbit_eval": FinetuneRecipe(quant="nf4", checkpointing="reentrant", prepare_kbit=True,
                                              train_mode=False),
}


def bitsandbytes_usable() -> tuple[bool, str]:
    """(usable, reason): 4-bit needs a CUDA GPU and an importable bitsandbytes."""
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA GPU: bitsandbytes 4-bit layers run on a GPU"
    if importlib.util.find_spec("bitsandbytes") is None:
        return False, "bitsandbytes is not installed (pip install bitsandbytes)"
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:  # a broken binary install raises all sorts of things
        return False, f"bitsandbytes does not import: {type(exc).__name__}: {str(exc)[:120]}"
    return True, "ok"


def _torch_half(device):
    """The 16-bit dtype of the LoRA recipes on ``device``: bf16, except fp16 on a GPU without bf16
    (a T4, a P100, where cuBLAS has no bf16 GEMMs: ``utils.course.tier_plan``); the recipes' names say bf16."""
    import torch

    return torch.float16 if device.type == "cuda" and best_precision(device) == "fp16" else torch.bfloat16


def build_finetune(preset: str, recipe: FinetuneRecipe, device: Any = None):
    """``(peft_model, note)``: the preset, 16-bit (bf16; fp16 on a GPU without bf16) or 4-bit,
    LoRA on ``target_modules``; its real checkpoint where ``utils.model.weights`` finds one, else random
    weights (``model.gpulab_weights.line()`` says which).

    A 4-bit recipe without a usable bitsandbytes falls back to bf16 LoRA and says so in ``note``."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    half = _torch_half(device)
    note = ""
    quant = recipe.quant
    if quant == "nf4":
        ok, why = bitsandbytes_usable()
        if not ok or device.type != "cuda":
            note = f"4-bit QLoRA fell back to bf16 LoRA: {why}"
            quant = "none"
    if quant == "nf4":
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=half)
        path, choice = checkpoint_dir(preset)
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=bnb,
                                                     dtype=half, device_map={"": device.index or 0})
    else:
        choice = choose_weights(preset)
        if choice.real:
            model = _load_checkpoint(choice.path, half, device, "sdpa")
        else:
            torch.manual_seed(0)
            model = build_model(preset, dtype=half, device=device)
    model.gpulab_weights = choice
    model.config.use_cache = False
    if recipe.prepare_kbit:
        kw = {"use_reentrant": recipe.checkpointing != "non-reentrant"}
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.checkpointing != "none",
                                                gradient_checkpointing_kwargs=kw)
    elif recipe.checkpointing != "none":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": recipe.checkpointing == "reentrant"})
        model.enable_input_require_grads()  # reentrant checkpointing needs an input that requires grad
    lora = LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, target_modules=recipe.target_modules,
                      lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train(recipe.train_mode)
    return model, note


def lora_grads_ok(model) -> bool:
    """Every trainable (LoRA) parameter has a non-zero-size gradient after a backward pass."""
    params = [p for p in model.parameters() if p.requires_grad]
    return bool(params) and all(p.grad is not None for p in params)


def measure_finetune(preset: str, recipe: FinetuneRecipe, batch_size: int, seq_len: int, steps: int = 3,
                     device: Any = None) -> dict:
    """Build the recipe, run ``steps`` optimizer steps at ``batch_size x seq_len``, report memory and speed.

    Keys (GiB unless named otherwise): ``weights_gib`` (allocated after building: base weights
    + adapters), ``optimizer_gib`` (AdamW states), ``gradients_gib`` (adapter gradients),
    ``saved_activations_gib`` (bytes autograd saved in one forward), ``peak_gib`` (CUDA: peak
    allocated during a steady-state step; CPU: the sum of the four, an account not a
    measurement), ``activations_gib`` (peak minus weights, optimizer and gradients: saved
    activations plus the transient working set, logits included), ``tokens_per_s``,
    ``trainable_params``, ``total_params``, ``lora_grads_ok``, ``quant`` (what actually ran),
    ``note`` (why a 4-bit recipe fell back), ``peak_source``, ``weights`` (the line saying
    real or random weights, and why: :mod:`utils.model.weights`), ``losses`` (each step's loss; every
    step trains on the same batch, the shipped book's first blocks in the model's own tokenizer,
    so with real weights the loss falls as the adapters fit that text; from random weights it
    starts near ln(vocab)).
    """
    import torch

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    if cuda:
        # collect garbage first: a model from an earlier measurement that sits in a reference
        # cycle is otherwise counted in ``base`` and freed mid-run, and the peak reads low
        # (a re-measurement in the grader read 2.23 GiB against the notebook's 2.71 on one H200)
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
    model, note = build_finetune(preset, recipe, device)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    weights_b = (torch.cuda.memory_allocated(device) - base) if cuda else tensor_bytes(params)
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    choice = model.gpulab_weights
    x, _ = next(token_batches(model_tokenizer(model), None, batch_size, seq_len, device=device,
                              vocab_size=model.config.vocab_size))
    losses = []
    ac = torch.autocast(device.type, dtype=_torch_half(device)) if recipe.autocast else contextlib.nullcontext()
    sw = Stopwatch(warmup_steps=1, tokens_per_step=batch_size * seq_len, device=device)
    saved: dict = {}
    grads_ok, peak_b, opt_b, grad_b = False, 0, 0, 0
    for i in range(max(2, steps + 1)):
        if cuda and i == 1:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with sw.step():
            with ac, (count_saved_bytes(saved) if i == 1 else contextlib.nullcontext()):
                loss = model(input_ids=x, labels=x).loss
            loss.backward()
            losses.append(loss.detach())  # read after the loop: no host sync inside a timed step
            if i == 1:
                grads_ok = lora_grads_ok(model)
                grad_b = tensor_bytes(p.grad for p in trainable)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if cuda and i == 1:
            torch.cuda.synchronize(device)
            peak_b = torch.cuda.max_memory_allocated(device) - base
    opt_b = tensor_bytes(t for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
    if not cuda:
        peak_b = weights_b + opt_b + grad_b + saved.get("saved", 0)
    s = sw.summary()
    quant = "nf4" if recipe.quant == "nf4" and not note else "none"
    out = {"recipe": asdict(recipe), "quant": quant, "note": note, "batch_size": batch_size, "seq_len": seq_len,
           "weights_gib": weights_b / GIB, "optimizer_gib": opt_b / GIB, "gradients_gib": grad_b / GIB,
           "saved_activations_gib": saved.get("saved", 0) / GIB, "peak_gib": peak_b / GIB,
           "activations_gib": max(0.0, peak_b - weights_b - opt_b - grad_b) / GIB,
           "tokens_per_s": s["tokens_per_s"], "trainable_params": sum(p.numel() for p in trainable),
           "total_params": sum(p.numel() for p in params), "lora_grads_ok": grads_ok,
           "peak_source": "torch.cuda.max_memory_allocated" if cuda else "accounted (CPU: tensor bytes, not measured)",
           "weights": choice.line(), "losses": [float(v) for v in losses]}
    del model, opt, loss
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def full_finetune_estimate(n_params: int, batch_size: int, seq_len: int, cfg) -> dict:
    """What a full fine-tune of the same model would need (an estimate, ``utils.measure.memory``): bf16
    weights and gradients with fp32 master weights and AdamW moments (16 bytes/param), plus
    activations with full checkpointing (Korthikanti et al. 2022)."""
    acts = transformer_activation_bytes(batch_size, seq_len, cfg.hidden_size, cfg.num_hidden_layers,
                                        cfg.num_attention_heads, 2, checkpointing=True, dropout=False,
                                        attention_scores=False)
    return training_memory_estimate(n_params, param_dtype="bf16", master_weights=True, activation_bytes=acts)


def with_changes(config: LoopConfig, **changes: Any) -> LoopConfig:
    """``config`` with some fields changed (``dataclasses.replace``), for a one-fix-at-a-time ladder."""
    return replace(config, **changes)
