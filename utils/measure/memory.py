"""Peak-memory measurement, and estimates of what training needs (weights, gradients,
optimizer state, activations) by dtype.

Three numbers answer "how much memory did that take?" on a GPU, and they differ:
``torch.cuda.max_memory_allocated`` (tensors PyTorch handed out), ``max_memory_reserved``
(what its caching allocator holds from the driver: allocated plus cached free blocks), and
NVML's used memory (what ``nvidia-smi`` shows: reserved plus the CUDA context, several
hundred MB, plus any other process on the card). :class:`PeakMemory` reports all three.

The estimates are arithmetic, checked against ``accelerate estimate-memory`` and the ZeRO
paper (Rajbhandari et al. 2020, arXiv 1910.02054, section 3.1): Adam training needs about
16 bytes per parameter whether in fp32 (4 weights + 4 gradients + 8 moments) or in mixed
precision (2 + 2 + 12: fp32 master weights and moments) (docs/reference.md).
Activations follow Korthikanti et al. 2022 (arXiv 2205.05198).
"""
from __future__ import annotations

import contextlib
import gc
import sys
from typing import Any

from utils import validate
from utils.device import nvml
from utils.device.monitor import GpuMonitor
from utils.measure.timing import _device_type, _find_device, device_sync
from utils.units import GIB

_DTYPE_BYTES = {
    "float64": 8, "fp64": 8, "double": 8, "int64": 8, "long": 8, "uint64": 8, "complex64": 8,
    "float32": 4, "fp32": 4, "float": 4, "tf32": 4, "int32": 4, "int": 4, "uint32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "int16": 2, "short": 2, "uint16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "fp8": 1, "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "e4m3": 1, "e5m2": 1,
    "int4": 0.5, "uint4": 0.5, "nf4": 0.5, "fp4": 0.5, "float4_e2m1fn_x2": 1,
}


def bytes_per_dtype(dtype: Any) -> float:
    """Bytes per element of ``dtype``: a ``torch.dtype`` or a name (``"bf16"``,
    ``"float32"``, ``"torch.float16"``, ``"fp8"``, ``"nf4"``). 4-bit types give 0.5
    (their per-block scales, about 0.5 bits per weight in QLoRA's NF4, are not included)."""
    size = getattr(dtype, "itemsize", None)  # torch.dtype (torch >= 2.1), numpy dtype
    if isinstance(size, int) and not isinstance(dtype, str):
        return size
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: use a torch.dtype or one of bf16, fp16, fp32, fp8, int8, nf4, ...")
    return _DTYPE_BYTES[key]


# Optimizer states per trainable parameter: (number of state tensors, bytes each or None =
# the state dtype). torch.optim keeps its states in the parameter's dtype.
_OPTIMIZERS: dict[str, tuple[int, float | None]] = {
    "adamw": (2, None), "adam": (2, None),  # exp_avg, exp_avg_sq
    "sgd": (0, None),
    "sgd_momentum": (1, None),  # momentum_buffer
    "lion": (1, None),  # exp_avg
    "adamw_8bit": (2, 1), "adam_8bit": (2, 1),  # bitsandbytes: 1 byte per state (+ small block scales)
}


def training_memory_estimate(n_params: int, *, param_dtype: Any = "fp32", grad_dtype: Any = None,
                             optimizer: str = "adamw", master_weights: bool = False, state_dtype: Any = None,
                             trainable_params: int | None = None, activation_bytes: float = 0) -> dict[str, float]:
    """Memory a training step needs, in GiB: ``weights_gib``, ``gradients_gib``,
    ``optimizer_gib`` (master weights plus optimizer states), ``activations_gib`` and
    ``total_gib``. An estimate: it leaves out the CUDA context, allocator fragmentation and
    temporary buffers, which together often add 10-20% (a rule of thumb, not measured here).

    - ``param_dtype``: dtype the weights are stored in; ``grad_dtype`` defaults to it.
    - ``master_weights``: an fp32 copy of the trainable weights held by the optimizer, as
      in mixed-precision training with 16-bit weights (Megatron, DeepSpeed). Not needed
      with ``torch.autocast``, where the weights themselves stay fp32.
    - ``state_dtype``: dtype of the optimizer states; default fp32 with master weights,
      else ``param_dtype`` (``torch.optim`` creates states like its parameters).
    - ``trainable_params``: parameters that get gradients and optimizer state (LoRA
      adapters); default all ``n_params``.
    - ``activation_bytes``: saved activations, e.g. from :func:`transformer_activation_bytes`.

    1e9 parameters, fp32 AdamW: 4 + 4 + 8 = 16 bytes/param, 14.9 GiB before activations.
    """
    for name, value in (("n_params", n_params), ("trainable_params", trainable_params)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"{name} must be a non-negative number of parameters, got {value!r}")
    key = optimizer.lower().replace("-", "_")
    if key not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(_OPTIMIZERS)}")
    trainable = n_params if trainable_params is None else trainable_params
    if trainable > n_params:
        raise ValueError(f"trainable_params ({trainable}) cannot exceed n_params ({n_params})")
    p_bytes = bytes_per_dtype(param_dtype)
    g_bytes = bytes_per_dtype(grad_dtype) if grad_dtype is not None else p_bytes
    n_states, fixed = _OPTIMIZERS[key]
    if fixed is not None:
        s_bytes = fixed
    elif state_dtype is not None:
        s_bytes = bytes_per_dtype(state_dtype)
    else:
        s_bytes = 4 if master_weights else p_bytes
    weights = n_params * p_bytes
    grads = trainable * g_bytes
    opt = trainable * ((4 if master_weights else 0) + n_states * s_bytes)
    acts = float(activation_bytes)
    out = {"weights_gib": weights / GIB, "gradients_gib": grads / GIB, "optimizer_gib": opt / GIB,
           "activations_gib": acts / GIB}
    out["total_gib"] = sum(out.values())
    out["bytes_per_param"] = (weights + grads + opt) / n_params if n_params else 0.0
    return out


def transformer_activation_bytes(batch: int, seq: int, d_model: int, n_layers: int, n_heads: int,
                                 dtype_bytes: float = 2, checkpointing: bool = False, *,
                                 dropout: bool = True, attention_scores: bool = True) -> float:
    """Bytes of activations a GPT-style transformer saves for the backward pass.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (arXiv 2205.05198), eq. 1: per layer, with 16-bit activations, no tensor or
    sequence parallelism and no recomputation, ``s*b*h*(34 + 5*a*s/h)`` bytes (s sequence,
    b batch, h hidden size, a heads). The 34 sbh are 11 (attention block) + 19 (MLP) + 4
    (two layer norms); the 5 a s^2 b are the attention scores, softmax output and its
    dropout (2 + 2 + 1 bytes per element).

    Generalised here by splitting 2-byte values from 1-byte dropout masks: per layer
    ``sbh*(16*d + 2) + a*s^2*b*(2*d + 1)`` for ``d = dtype_bytes``, which is eq. 1 at
    d = 2. ``dropout=False`` drops the three masks (2 sbh + a s^2 b); most LLM training
    today uses no dropout. ``attention_scores=False`` drops the a s^2 b term entirely, as
    FlashAttention/SDPA's fused kernels recompute the scores instead of saving them.

    ``checkpointing=True``: full recomputation saves only each layer's input, ``2*s*b*h``
    bytes per layer at d = 2 (the paper, section 4), and the backward pass rebuilds one
    layer's activations at a time, so one layer's full activations are added as the
    working set of the recomputation.

    Embeddings, the final norm and the logits are not included; the logits
    (``batch * seq * vocab`` values, often upcast to fp32 for the loss) can exceed all
    the layers for a small model with a large vocabulary.
    """
    for name, value in (("batch", batch), ("seq", seq), ("d_model", d_model), ("n_layers", n_layers), ("n_heads", n_heads)):
        validate.positive_int(name, value)
    if not isinstance(dtype_bytes, (int, float)) or dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes must be positive (2 for bf16/fp16), got {dtype_bytes!r}")
    s, b, h, a, d = seq, batch, d_model, n_heads, dtype_bytes
    mask = 1 if dropout else 0
    linear = s * b * h * (16 * d + 2 * mask)
    scores = a * s * s * b * (2 * d + mask) if attention_scores else 0
    per_layer = linear + scores
    if checkpointing:
        return n_layers * s * b * h * d + per_layer
    return n_layers * per_layer


def cross_entropy_bytes(tokens: int, vocab: int, logits_bytes: float = 2) -> float:
    """Bytes the logits and a causal-LM loss over them hold at the loss's peak (the backward of
    its log-softmax), for ``tokens`` positions and a ``vocab``-wide output head.

    Per logit: the logits in their dtype (``logits_bytes``), an fp32 copy when they are 16-bit
    (Hugging Face's loss calls ``logits.float()``; Accelerate's mixed precision returns fp32
    outputs too), the fp32 log-softmax output saved for the backward, and that backward's fp32
    gradient in and out: ``logits_bytes + 4 + 4 + 4 + 4`` for 16-bit logits (18 bytes),
    ``4 + 4 + 4 + 4`` for fp32 (16). An estimate: the upcast copy is counted as alive at the
    peak, which holds where the outputs keep it and over-counts by 4 bytes where they do not.
    For a small model with a large vocabulary this is the largest term of a training step
    (GPT-2 small, batch 16 x 1024: 13.8 GiB of logits and loss against 4.8 GiB of saved
    activations by :func:`transformer_activation_bytes`)."""
    validate.positive_int("tokens", tokens)
    validate.positive_int("vocab", vocab)
    if logits_bytes not in (2, 4):
        raise ValueError(f"logits_bytes must be 2 (bf16/fp16) or 4 (fp32), got {logits_bytes!r}")
    per_logit = logits_bytes + (4 if logits_bytes < 4 else 0) + 12
    return float(tokens) * vocab * per_logit


# -- accounting tensors ----------------------------------------------------------------------

def tensor_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors`` (``None`` entries skipped), each storage
    once: views and shared tensors are not counted twice. A CPU has no allocator peak, so
    this is how ``utils.train.training.measure_finetune`` accounts weights, gradients and state."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = (t.untyped_storage().data_ptr(), t.device) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


@contextlib.contextmanager
def count_saved_bytes(out: dict):
    """Sum the bytes autograd saves for the backward pass inside the block into ``out['saved']``
    (each storage once; ``torch.autograd.graph.saved_tensors_hooks``). Checkpointed layers
    save only their inputs, so this is what a recipe's activations cost before the backward
    recomputes them."""
    import torch

    seen: set = set()
    out.setdefault("saved", 0)

    def pack(t):
        try:
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen and t.device.type != "meta":
                seen.add(key)
                out["saved"] += t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a plain storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


# -- measuring peaks -------------------------------------------------------------------------

class PeakMemory:
    """Peak memory of a block of code.

    >>> with PeakMemory() as pm:        # doctest: +SKIP
    ...     loss = model(x).loss; loss.backward()
    >>> pm.peak_allocated_gib, pm.peak_reserved_gib, pm.device_used_gib  # doctest: +SKIP

    On CUDA: resets PyTorch's peak statistics on entry and reads them on exit
    (``peak_allocated_gib``, ``peak_reserved_gib``; ``baseline_allocated_gib`` is what was
    allocated on entry, so ``increase_gib`` is the block's own peak), and samples NVML's
    used memory of the device every ``interval_s`` (``device_used_gib``, the maximum seen,
    what ``nvidia-smi`` would show; None without NVML). Resetting the peak statistics is
    global, so do not nest two of these on one device.

    On a CPU: the process's resident set size (RSS, via psutil), sampled every
    ``interval_s`` and on entry and exit (``peak_rss_gib``; ``source`` is
    ``"psutil_rss"``). A spike shorter than the interval between samples can be missed.
    """

    def __init__(self, device: Any = None, *, interval_s: float = 0.1):
        self.device = device
        self.interval_s = interval_s
        self.source = ""
        self.peak_allocated_gib: float | None = None
        self.peak_reserved_gib: float | None = None
        self.baseline_allocated_gib: float | None = None
        self.device_used_gib: float | None = None
        self.peak_rss_gib: float | None = None
        self._monitor: Any = None
        self._torch: Any = None

    def __enter__(self) -> PeakMemory:
        self.device = _find_device(self.device, ())
        if _device_type(self.device) == "cuda":
            import torch

            self._torch = torch
            self.source = "torch.cuda"
            gc.collect()  # garbage in a reference cycle would count in the baseline, then be freed
            device_sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_allocated_gib = torch.cuda.memory_allocated(self.device) / GIB
            index = _nvml_index(self.device)
            self._monitor = GpuMonitor(self.interval_s, devices=[index]) if index is not None else None
        else:
            self.source = "psutil_rss"
            self._monitor = GpuMonitor(self.interval_s, source="cpu")
        if self._monitor is not None:
            self._monitor.start()
        return self

    def __exit__(self, *exc: Any) -> bool:
        mon = self._monitor
        if self._torch is not None:
            torch = self._torch
            from utils.measure.timing import device_sync

            device_sync(self.device)
            self.peak_allocated_gib = torch.cuda.max_memory_allocated(self.device) / GIB
            self.peak_reserved_gib = torch.cuda.max_memory_reserved(self.device) / GIB
        if mon is not None:
            mon.stop()
            stats = next(iter(mon.summary().values()), {})
            key = "rss_gib" if self.source == "psutil_rss" else "mem_used_gib"
            peak = (stats.get(key) or {}).get("max")
            if self.source == "psutil_rss":
                self.peak_rss_gib = peak
            elif mon.source == "nvml":
                self.device_used_gib = peak
        return False

    @property
    def increase_gib(self) -> float | None:
        """Peak allocated minus what was allocated on entry (CUDA only)."""
        if self.peak_allocated_gib is None or self.baseline_allocated_gib is None:
            return None
        return self.peak_allocated_gib - self.baseline_allocated_gib

    @property
    def peak_gib(self) -> float | None:
        """The headline number: peak allocated on CUDA, peak RSS on a CPU (see ``source``)."""
        return self.peak_allocated_gib if self.source == "torch.cuda" else self.peak_rss_gib

    def to_dict(self) -> dict:
        return {"source": self.source, "device": str(self.device), "peak_allocated_gib": self.peak_allocated_gib,
                "peak_reserved_gib": self.peak_reserved_gib, "baseline_allocated_gib": self.baseline_allocated_gib,
                "increase_gib": self.increase_gib, "device_used_gib": self.device_used_gib,
                "peak_rss_gib": self.peak_rss_gib}

    def __str__(self) -> str:
        def g(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f} GiB"

        if self.source == "psutil_rss":
            return f"peak RSS {g(self.peak_rss_gib)} (CPU process memory, sampled every {self.interval_s} s)"
        return (f"peak allocated {g(self.peak_allocated_gib)} (+{g(self.increase_gib)} in the block), "
                f"reserved {g(self.peak_reserved_gib)}, device used {g(self.device_used_gib)} (NVML)")


def _nvml_index(device: Any) -> int | None:
    """NVML's index for a torch CUDA device, matched by PCI bus id (None without NVML)."""
    if not nvml.status().available:
        return None
    try:
        from utils.device.hardware import nvml_handle_for_torch

        torch = sys.modules["torch"]
        index = torch.device(device).index
        h = nvml_handle_for_torch(torch.cuda.current_device() if index is None else index)
        i = nvml.query("nvmlDeviceGetIndex", h)
        return i if isinstance(i, int) else None
    except Exception:
        return None
