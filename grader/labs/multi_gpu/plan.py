"""Lab 02's plan: ``parts`` (what runs on a card), ``moments`` (memory peaks), ``MEASURED_PEAKS``."""
from __future__ import annotations

from utils.course.lab_memory import Context, Moment, Other, dpo_gib, gib_of, shape, train_gib
from utils.course.tier_plan import REHEARSED_T4, T4_HOW, T4_RUN, Card, MeasuredPeak

ASSIGNMENT = "02_multi_gpu"


def sizes_tier(card: Card) -> str:
    """The size tier of this lab's sizes on ``card``: the card's, except on fewer than two GPUs, where
    the multi-process runs are CPU processes at smoke sizes (``utils.parallel.launch``)."""
    return "cpu" if card.gpus < 2 else card.size_tier


def moments(s, c: Context) -> list[Moment]:
    """Where this lab's GPU memory peaks at sizes ``s`` in context ``c`` (``utils.course.lab_memory.Context``)."""
    from utils.parallel.distributed import parse_size_bytes

    # the notebook checks its Triton kernels on 2 x 777 tensors; their timing (utils.train.fused.compare_bias_gelu)
    # runs in the grader's sandbox once the kernel is gone (grader/labs/multi_gpu/judges.py)
    fused = 0.0
    if not c.multi_gpu:
        return [Moment("fused bias + GELU bonus (the multi-process runs are CPU processes)", fused)]
    prec = "bf16" if s.bf16 else "fp32"
    largest = max(parse_size_bytes(x) for x in s.allreduce_sizes.split(","))
    ddp = train_gib(s.model, s.batch_per_device, s.seq_len, prec) + gib_of(shape(s.model).params * 4)  # + DDP buckets
    return [Moment("all-reduce of the largest message, per GPU", 0.0, (Other("torchrun rank", gib_of(2 * largest)),)),
            Moment(f"reference DDP run, {prec}, batch {s.batch_per_device} x {s.seq_len} per GPU", 0.0,
                   (Other("training rank", ddp),)),
            Moment(f"TRL DPO, {prec}, batch {s.post_batch} x {s.post_max_len} per GPU", 0.0,
                   (Other("training rank", dpo_gib(s.model, s.post_batch, s.post_max_len, prec)),)),
            Moment("fused bias + GELU bonus", fused)]


def parts(card: Card, s, ok: bool, why: str):
    """``(runs, skipped, dtype, compiled, compile note)`` of this lab on ``card`` at sizes ``s``; ``ok, why``:
    whether ``torch.compile`` runs there (``utils.course.tier_plan.compile_support``)."""
    skipped = {}
    if card.gpus >= 2 and card.gpu:
        d = "bf16" if s.bf16 else "fp32"
        runs = [f"all-reduce over {card.gpus} GPUs (NCCL), sizes {s.allreduce_sizes}",
                f"DDP 1 -> {card.gpus} GPUs, {s.model} in {d}, batch {s.batch_per_device} x {s.seq_len} per GPU; "
                "FSDP; the scaling breaks", f"TRL SFT and DPO, batch {s.post_batch} x {s.post_max_len} per GPU"]
        if not s.bf16:
            runs[1] += " (no bf16 before compute capability 8.0)"
    else:
        d = "fp32"
        runs = ["the multi-process cells as 2 CPU processes over gloo at smoke sizes (the same scripts, graded as plumbing)"]
        skipped["scaling across GPUs"] = (f"{'one GPU' if card.gpu else 'no GPU'}: DDP needs a process per GPU; "
                                          "Kaggle's GPU T4 x2 has two")
        skipped["FSDP training runs"] = ("Accelerate's FSDP needs CUDA GPUs over NCCL (the ZeRO cell's FSDP2 byte "
                                         "count runs on CPU processes too)")
    if card.gpu and not ok:
        runs.append("your Triton kernels (bonus) under Triton's interpreter on the CPU: Triton does not compile for "
                    f"compute capability {card.capability[0]}.{card.capability[1]}, so their results are graded and "
                    "their speed is not")
    elif card.gpu:
        runs.append("your Triton kernels (bonus), compiled, graded on their results and their speed")
    else:
        runs.append("your Triton kernels (bonus) under Triton's interpreter: results graded, speed not")
    note = "the reference runs are eager (Phase2Sizes.compile: a compile costs a minute per launch)"
    return runs, skipped, d, bool(s.compile and ok), note


MEASURED_PEAKS = (
    MeasuredPeak(ASSIGNMENT, REHEARSED_T4, 621 / 1024,
                 "fused_answer (the 1,253 MiB first read in test_fused_kernel came from a timing of the Triton "
                 "kernel inside the notebook's kernel in that run; the grader's sandbox times it once the kernel is gone)", T4_HOW,
                 T4_RUN + "t4_memcells_02_multi_gpu.json"),
)
