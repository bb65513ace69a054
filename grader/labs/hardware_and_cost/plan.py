"""Lab 05's plan: ``parts`` (what runs on a card), ``moments`` (memory peaks), ``MEASURED_PEAKS``."""
from __future__ import annotations

from utils.course.lab_memory import (
    FLUSH_GIB,
    Context,
    Moment,
    Other,
    forward_gib,
    gib_of,
    kv_gib,
    states_gib,
    train_gib,
    weights_gib,
)
from utils.course.tier_plan import H100_HOW, H100_NO_VLLM, REHEARSED_T4, T4_FP16, T4_HOW, Card, MeasuredPeak, card_dtype

ASSIGNMENT = "05_hardware_and_cost"


def moments(s, c: Context) -> list[Moment]:
    """Where this lab's GPU memory peaks at sizes ``s`` in context ``c`` (``utils.course.lab_memory.Context``)."""
    points = gib_of(3 * s.matmul_n**2 * 2 + 2 * s.copy_numel * 4) + FLUSH_GIB
    resident = points + states_gib(s.model) + weights_gib(s.model, 4)  # train model + AdamW, decode model
    train = train_gib(s.model, s.train_batch, s.seq_len, "fp32") - states_gib(s.model)
    decode = kv_gib(s.model, max(s.decode_batches), s.prompt_len + s.new_tokens, 4) \
        + forward_gib(s.model, max(s.decode_batches), 4)
    ckpt = train_gib(s.ckpt_model, s.ckpt_batch, s.ckpt_seq_len, "fp32")
    run = Other("checkpointed run", ckpt)
    # utils.train.kill_harness.kill_and_resume empties the notebook's cache first, then runs the reference
    # and the run it kills side by side (the resuming process starts its CUDA work after the kill)
    return [Moment(f"training step, fp32, batch {s.train_batch} x {s.seq_len}", resident + train),
            Moment(f"decode at batch {max(s.decode_batches)}", resident + decode),
            Moment("kill-and-resume: the reference run and the run to be killed, each in its own process "
                   "(the notebook's cache emptied first)", resident, (run, run)),
            Moment("checkpoint overhead, measured in the notebook's process", resident + ckpt)]


def parts(card: Card, s, ok: bool, why: str):
    """``(runs, skipped, dtype, compiled, compile note)`` of this lab on ``card`` at sizes ``s``; ``ok, why``:
    whether ``torch.compile`` runs there (``utils.course.tier_plan.compile_support``)."""
    d = card_dtype(card)
    runs = [f"roofline points (matmul {s.matmul_n}^3 in {d}), {s.model} training and decode up to batch "
            f"{max(s.decode_batches)} in fp32, cost per token", f"SIGKILL and resume of a {s.ckpt_model} run, "
            "checkpoint overhead; XLA recompilation on JAX's backend"]
    return runs, {}, d, False, "not used in this lab (JAX's jit is XLA's)"


MEASURED_PEAKS = (
    MeasuredPeak(ASSIGNMENT, REHEARSED_T4, 10775 / 1024, "resume_run (10,774 MiB; 10,775 in test_resume)",
                 T4_HOW, T4_FP16 + "t4_memcells_05_hardware_and_cost.json"),
    MeasuredPeak(ASSIGNMENT, H100_NO_VLLM, 33.6, "", H100_HOW, ""),
)
