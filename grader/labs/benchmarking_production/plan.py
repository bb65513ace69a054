"""Lab 04's plan: ``parts`` (what runs on a card), ``moments`` (memory peaks), ``MEASURED_PEAKS``."""
from __future__ import annotations

from utils.course.lab_memory import Context, Moment, Other, engine_gib, serve_gib
from utils.course.tier_plan import FP8_W8A8_MIN, REHEARSED_T4, T4_HOW, T4_RUN, Card, MeasuredPeak, card_dtype

ASSIGNMENT = "04_benchmarking_production"


def moments(s, c: Context) -> list[Moment]:
    """Where this lab's GPU memory peaks at sizes ``s`` in context ``c`` (``utils.course.lab_memory.Context``)."""
    kv_tokens = s.num_requests * s.max_len
    if c.vllm:
        share = engine_gib(c.engine_share * c.card_gib)
        return [Moment("two vLLM engines (the served model and one other configuration, section 6)", 0.0,
                       (Other("vLLM engine", share, True), Other("vLLM engine", share, True)))]
    return [Moment("two transformers serve processes (continuous batching and bnb-4bit, section 6)", 0.0,
                   (Other("transformers serve", serve_gib(s.model, kv_tokens, 2)),
                    Other("transformers serve, bnb-4bit", serve_gib(s.model, kv_tokens, 2, "nf4"))))]


def parts(card: Card, s, ok: bool, why: str):
    """``(runs, skipped, dtype, compiled, compile note)`` of this lab on ``card`` at sizes ``s``; ``ok, why``:
    whether ``torch.compile`` runs there (``utils.course.tier_plan.compile_support``)."""
    d = card_dtype(card)
    skipped = {}
    vllm = card.at_least((7, 0)) and not card.lacks("vllm")
    if vllm:
        runs = [f"vLLM serving {s.model} in {d}; load sweep of {s.sweep_points} rates, {s.num_requests} requests each",
                "candidates: int8 W8A8, fp8 KV cache, fp8 weights"
                + ("" if card.at_least(FP8_W8A8_MIN) else " (weight-only W8A16 below compute capability 8.9)")]
        note = "inside vLLM (torch.compile and CUDA graphs)"
    else:
        runs = [f"transformers serve (continuous batching) of {s.model} in {d}; load sweep of {s.sweep_points} rates",
                "candidates: one request at a time"
                + (", bnb-4bit" if card.gpu and not card.lacks("bitsandbytes") else "")]
        if card.gpu and card.lacks("bitsandbytes"):
            skipped["bnb-4bit candidate"] = card.lacks("bitsandbytes")
        if card.gpu:
            skipped["vLLM"] = ((card.lacks("vllm") if card.at_least((7, 0)) else
                                "its CUDA build needs compute capability 7.0") + "; transformers serve runs the lab instead")
        note = why or "transformers serve does not compile"
    return runs, skipped, d, vllm and ok, note


MEASURED_PEAKS = (
    MeasuredPeak(ASSIGNMENT, REHEARSED_T4, 15028 / 1024, "compare (two vLLM 0.26.0 engines)",
                 T4_HOW, T4_RUN + "t4_memcells_04_benchmarking_production.json"),
)
