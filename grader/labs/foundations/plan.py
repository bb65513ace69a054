"""Lab 00's plan: ``parts`` (what runs on a card), ``moments`` (memory peaks), ``MEASURED_PEAKS``."""
from __future__ import annotations

from utils.course.lab_memory import FLUSH_GIB, Context, Moment, gib_of, shape, train_gib
from utils.course.tier_plan import H100_HOW, H100_NO_VLLM, REHEARSED_T4, T4_FP16, T4_HOW, Card, MeasuredPeak, card_dtype

ASSIGNMENT = "00_foundations"


def moments(s, c: Context) -> list[Moment]:
    """Where this lab's GPU memory peaks at sizes ``s`` in context ``c`` (``utils.course.lab_memory.Context``)."""
    from utils.measure.matmul_sweep import sweep_shapes

    matmul = gib_of(3 * s.matmul_n**2 * 2) + FLUSH_GIB
    copy = gib_of(2 * s.elementwise_numel * 4)
    train = train_gib(s.model, s.batch_size, s.seq_len, "fp32")
    # the sweep's inputs are freed shape by shape; one that is larger than every block cached so far
    # (the largest: a training step's fp32 loss tensor) and than the last such input is a new segment
    largest = gib_of(s.batch_size * s.seq_len * shape(s.model).vocab * 4)
    grown = 0.0
    for m, _n, k in sweep_shapes(c.sms, c.tier or "t4").values():
        a = gib_of(m * k * 2)
        if a > largest:
            grown, largest = grown + a, a
    return [Moment(f"matmul {s.matmul_n}^3 in {c.half}", matmul),
            Moment(f"copy and x + 1 over {s.elementwise_numel:,} fp32 elements", matmul + copy),
            Moment(f"{s.model} training step, fp32, batch {s.batch_size} x {s.seq_len}", matmul + copy + train),
            Moment("shape sweep after the training (its largest inputs fit no cached block)",
                   matmul + copy + train + grown)]


def parts(card: Card, s, ok: bool, why: str):
    """``(runs, skipped, dtype, compiled, compile note)`` of this lab on ``card`` at sizes ``s``; ``ok, why``:
    whether ``torch.compile`` runs there (``utils.course.tier_plan.compile_support``)."""
    d = card_dtype(card)
    runs = [f"matmul {s.matmul_n}^3 in {d}, copy and x + 1 over {s.elementwise_numel:,} fp32 elements, "
            f"{s.tiny_ops:,} tiny ops", f"{s.model} training in fp32, batch {s.batch_size} x {s.seq_len}, "
            f"{s.train_steps} steps, under the GPU monitor"]
    return runs, {}, d, False, "not used in this lab"


MEASURED_PEAKS = (
    MeasuredPeak(ASSIGNMENT, REHEARSED_T4, 7985 / 1024, "sweep_answer", T4_HOW,
                 T4_FP16 + "t4_memcells_00_foundations.json"),
    MeasuredPeak(ASSIGNMENT, H100_NO_VLLM, 33.3, "", H100_HOW, ""),
)
