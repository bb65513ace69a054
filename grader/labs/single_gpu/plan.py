"""Lab 01's plan: ``parts`` (what runs on a card), ``moments`` (memory peaks), ``MEASURED_PEAKS``."""
from __future__ import annotations

from utils.course.lab_memory import (
    GPT2_VOCAB,
    Context,
    Moment,
    gib_of,
    lora_gib,
    loss_bytes,
    shape,
    states_gib,
    train_gib,
)
from utils.course.tier_plan import (
    H100_LIVE_HOW,
    H100_NO_VLLM,
    H100_RUN,
    REHEARSED_T4,
    T4_HOW,
    T4_RUN,
    Card,
    MeasuredPeak,
    card_dtype,
)

ASSIGNMENT = "01_single_gpu"


def moments(s, c: Context) -> list[Moment]:
    """Where this lab's GPU memory peaks at sizes ``s`` in context ``c`` (``utils.course.lab_memory.Context``)."""
    vocab = -(-shape(s.model).vocab // 64) * 64  # the ladder pads the vocabulary to a multiple of 64
    loop = states_gib(s.model)  # a training loop's weights and AdamW state between steps (grads set to None)
    # ``naive`` stays referenced after its section; each rung's loop holds itself in a reference
    # cycle (``TrainLoop.loss_fn = self._loss``, utils/train/training.py), so the rung before is freed
    # only when Python's cycle collector runs: two loops beside the rung being measured
    d = 2 if c.half in ("bf16", "fp16") else 4
    unpadded = gib_of(loss_bytes(s.big_batch * s.seq_len, GPT2_VOCAB, d))  # cached, each block a little too small
    return [Moment(f"naive loop, fp32, batch {s.naive_batch} x {s.seq_len}",
                   train_gib(s.model, s.naive_batch, s.seq_len, "fp32")),
            Moment(f"ladder at batch {s.big_batch} x {s.seq_len}, {c.half} autocast, eager, vocabulary padded "
                   "(the unpadded rung's loss blocks still cached)",
                   2 * loop + train_gib(s.model, s.big_batch, s.seq_len, c.half, vocab=vocab), cached_gib=unpadded),
            Moment(f"{s.ft_model} LoRA in {c.half} without checkpointing (the eval-mode trap), batch "
                   f"{s.ft_batch} x {s.ft_seq_len}",
                   loop + lora_gib(s.ft_model, s.ft_batch, s.ft_seq_len, checkpointing=False))]


def parts(card: Card, s, ok: bool, why: str):
    """``(runs, skipped, dtype, compiled, compile note)`` of this lab on ``card`` at sizes ``s``; ``ok, why``:
    whether ``torch.compile`` runs there (``utils.course.tier_plan.compile_support``)."""
    d = card_dtype(card)
    amp = f"{d} autocast" if card.gpu else "fp32: autocast adds only casts on a CPU"
    runs = [f"naive loop (fp32, batch {s.naive_batch} x {s.seq_len}) and the ladder of fixes up to batch "
            f"{s.big_batch} ({amp})", f"{s.ft_model} LoRA and QLoRA, batch {s.ft_batch} x {s.ft_seq_len}, in "
            f"{d if card.gpu else 'bf16'}"]
    skipped = {}
    if not card.gpu:
        skipped["4-bit QLoRA"] = "bitsandbytes' kernels need a CUDA GPU: it falls back to LoRA and says so"
    elif card.lacks("bitsandbytes"):
        skipped["4-bit QLoRA"] = card.lacks("bitsandbytes") + ": it falls back to LoRA and says so"
    if card.gpu and not ok:
        skipped["torch.compile of the optimized loop"] = why + f"; the graded speedup ({s.min_speedup}x) is eager's"
    note = "the optimized loop's loss, mode 'default'" if ok else why
    return runs, skipped, d, ok, note


MEASURED_PEAKS = (
    MeasuredPeak(ASSIGNMENT, REHEARSED_T4, 14373 / 1024, "ladder (14,371 MiB; 14,373 in test_optimized)", T4_HOW,
                 T4_RUN + "t4_memcells_01_single_gpu.json"),
    MeasuredPeak(ASSIGNMENT, H100_NO_VLLM, 72257 / 1024, "ladder", H100_LIVE_HOW,
                 H100_RUN + "h100_memcells_01_single_gpu.json"),
)
