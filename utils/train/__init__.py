"""Training on one GPU: the naive loop and its fixes, LoRA/QLoRA, checkpoints that resume bit-identical, fused kernels,
post-training.

- ``training``: training loops for phase 1: a deliberately naive one, the fixes one at a time, and LoRA/QLoRA
  recipes.
- ``checkpoint``: checkpoints of a training run that resume bit-identical: RNG state, DCP save/load, digests.
- ``checkpointed_run``: the checkpointed training run: a resumable loader, the loop, its checkpoint cost, its
  command line.
- ``kill_harness``: the fault-tolerance experiment: run the checkpointed loop, SIGKILL it, resume it, compare.
- ``post_training``: what ``benchmarks/post_train_trl.py`` adds to TRL's trainers: GRPO's reward, and the two clocks
  its timings come from (a step-window clock, a timer around the policy's sampling call).
- ``fused``: fusing bias + GELU in Triton (lab 02's bonus): the arithmetic, the setup and the timing harness.
"""
