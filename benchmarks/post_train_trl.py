"""Phase 2 post-training on all visible GPUs: TRL's SFTTrainer, then DPOTrainer and GRPOTrainer on the SFT'd model.

    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/post_train_trl.py --out trl2.json --bf16
    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/post_train_trl.py --out cpu.json --smoke          # CPU: two processes over gloo

Post-training as people run it: ``trl.SFTTrainer`` with an ``SFTConfig`` on prompt/completion
pairs (loss on the completion only, TRL's default for that format), then ``trl.DPOTrainer``
with a ``DPOConfig`` on prompt/chosen/rejected triples, starting from the SFT'd weights with a
frozen copy of them as the reference model (DPO, arXiv 2305.18290), then ``trl.GRPOTrainer``
with a ``GRPOConfig``, starting again from the SFT'd weights (GRPO, arXiv 2402.03300; skip it
with ``--no-grpo``). The trainers run their own loops; the distributed engine is whatever
``accelerate launch`` set up (DDP with ``benchmarks/accelerate/ddp.yaml``), so the same script
runs on 1..N GPUs.

Model and data, offline: ``utils.model.models.build_model(preset)`` (random weights) and the shipped
tokenizer; the examples are cut from the shipped book (``utils.model.models.load_text``). A pair is
``prompt`` = a passage, ``completion`` = the passage that follows it; a triple keeps that
continuation as ``chosen`` and takes a passage from elsewhere in the book as ``rejected``.
GRPO gets the same prompts and nothing to imitate: every step it samples ``--num-generations``
completions per prompt from the policy itself (``model.generate``, TRL's path without vLLM),
scores them with :func:`overlap_reward` (the share of a completion's character pairs that also
occur in the book's own continuation: cheap, deterministic, and meaningful for any weights) and
pushes each completion's probability up or down by how its reward compares with the others of
its group. With random weights this is honest for speed and memory (the same shapes run the
same kernels and hold the same bytes: SFT holds one model plus AdamW state, DPO adds a frozen
reference model and runs chosen and rejected through both, GRPO adds no reference (TRL's
default ``beta=0``) but samples every completion token by token before its one forward and
backward), not for quality: the losses, DPO's reward accuracy and GRPO's rewards after a few
steps from random weights say nothing about what post-training teaches.

Throughput: ``tokens_per_s`` counts TRL's own ``num_tokens`` log (gathered over all ranks; for
SFT the attention-mask sum of every batch, for DPO both the chosen and the rejected sequence,
for GRPO every sampled sequence's prompt tokens plus its completion tokens up to and including
the end-of-text token) over the wall time between the end of the last warm-up step and the end
of the last step, with a device sync at both ends; ``tokens_per_s_per_device`` divides it by
the world size, and ``seconds_per_step`` is that wall time over the measured steps. The
trainers already synchronise every step (TRL's metrics call ``.item()``), so this is the rate
the trainer delivers, logging included. ``train_loss`` is the Trainer's ``training_loss``
(mean over all steps, warm-up included). ``peak_mem_gib`` is the largest
``torch.cuda.max_memory_allocated`` over the ranks (per rank in ``peak_mem_gib_per_rank``);
None on a CPU. ``rewards_accuracy`` is the mean of DPO's logged ``rewards/accuracies``.

GRPO's generation share: the script wraps the policy's ``generate`` (the call GRPOTrainer makes
to sample completions, and the one ``use_vllm=True`` hands to a vLLM engine) with a device sync
and a clock at both ends. ``generation_s_per_step`` is the time inside it per measured step,
``other_s_per_step`` the rest of the step (the loss's forward and backward, the optimizer step,
rewards, logging), and ``generation_share`` = generation time / measured wall time (rank 0; per
rank in ``generation_share_per_rank``). ``generated_tokens_per_s_per_device`` is rank 0's
sampled token positions (sequences x new positions, the decoding loop's work) per second
inside ``generate``. ``trl_step_time_s`` is TRL's own ``step_time`` log (mean over the measured
steps: the trainer's ``training_step`` without the optimizer step and without a device sync),
kept as a cross-check; TRL's per-call ``profiling/Time taken`` timings go only to trackers
(wandb, MLflow, Trackio), never to its log history, so they are not used. ``reward_mean`` and
``completion_mean_length`` are the means of TRL's logged ``reward`` and
``completions/mean_length``.

Settings that differ from TRL's defaults, so the run measures what phase 2 compares:
``gradient_checkpointing=False`` (TRL turns it on by default; ``--gradient-checkpointing``
restores it) and ``bf16`` only with ``--bf16`` (TRL defaults to bf16). GRPO samples at most
``--max-length`` less the longest prompt's tokens per completion (``max_completion_length``;
recorded as ``config.completion_length``), so prompt plus completion fit in ``--max-length``
as the SFT and DPO sequences do. No checkpoints are saved, nothing is reported to a tracker,
and progress bars, per-step log prints and library warnings are kept off stderr. Without CUDA
the sizes are the smoke sizes (as ``--smoke``) and the trainers run on the CPU over gloo
(``use_cpu``); launch the DDP config as above, since ``accelerate launch --cpu
--num_processes 2`` starts a single process.
"""
from __future__ import annotations

import os

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"),
               ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1")):
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import copy  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

from utils.parallel.distributed import exit_without_teardown  # noqa: E402
from utils.train.post_training import GenerationTimer, overlap_reward, window_clock  # noqa: E402

PROG = "post_train_trl.py"
# (preset, batch per device, max length, measured steps, warm-up steps, GRPO completions per prompt)
FULL = ("gpt2-small", 8, 1024, 30, 3, 8)
SMOKE = ("gpt2-tiny", 2, 64, 3, 1, 2)
STAGES = ("sft", "dpo", "grpo")


class UsageError(ValueError):
    """Bad input or a missing package: reported as one line, exit status 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON file rank 0 writes")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (automatic without CUDA)")
    p.add_argument("--preset", help=f"model preset (default {FULL[0]}, smoke {SMOKE[0]})")
    p.add_argument("--batch-per-device", type=int,
                   help=f"examples per GPU per step, for GRPO sampled completions "
                        f"(default {FULL[1]}, smoke {SMOKE[1]})")
    p.add_argument("--max-length", type=int, help=f"tokens per sequence (default {FULL[2]}, smoke {SMOKE[2]})")
    p.add_argument("--steps", type=int, help=f"measured steps per trainer (default {FULL[3]}, smoke {SMOKE[3]})")
    p.add_argument("--warmup", type=int, help=f"untimed steps first (default {FULL[4]}, smoke {SMOKE[4]})")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (the Trainer's autocast)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default, off here unless asked")
    p.add_argument("--num-generations", type=int,
                   help=f"GRPO completions sampled per prompt (default {FULL[5]}, smoke {SMOKE[5]}); must divide "
                        "--batch-per-device x processes, the completions per step")
    p.add_argument("--no-grpo", action="store_true", help="skip the GRPO phase (SFT and DPO only)")
    return p.parse_args(argv)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults (full or smoke sizes) and check every argument before any process group starts."""
    from utils.course.env import smoke_mode
    from utils.model.models import MODEL_PRESETS, preset_config_dict

    if args.out is None:
        raise UsageError("--out FILE.json is required")
    if not args.out.parent.is_dir():
        raise UsageError(f"the folder of --out ({args.out.parent}) does not exist; create it first")
    args.smoke = args.smoke or smoke_mode()
    sizes = SMOKE if args.smoke else FULL
    for i, name in enumerate(("preset", "batch_per_device", "max_length", "steps", "warmup")):
        if getattr(args, name) is None:
            setattr(args, name, sizes[i])
    if args.preset not in MODEL_PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    for name, low in (("batch_per_device", 1), ("max_length", 16), ("steps", 1), ("warmup", 0)):
        if getattr(args, name) < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    cfg = preset_config_dict(args.preset)
    positions = cfg.get("n_positions") or cfg.get("max_position_embeddings")
    if positions and args.max_length > positions:
        raise UsageError(f"--max-length {args.max_length} exceeds {args.preset}'s {positions} positions")
    args.grpo = not args.no_grpo
    if args.grpo:
        _resolve_generations(args, sizes[5])
    return args


def _resolve_generations(args: argparse.Namespace, default: int) -> None:
    """GRPO's group size: TRL needs at least 2 completions per prompt and whole groups in every step, so
    ``--num-generations`` must divide the completions per step (``--batch-per-device`` x processes). Without the
    flag the default shrinks to the largest divisor of both it and the completions per step."""
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun
    per_step = args.batch_per_device * world
    where = f"--batch-per-device {args.batch_per_device} x {world} process{'es' if world > 1 else ''} = {per_step}"
    if args.num_generations is None:
        args.num_generations = math.gcd(default, per_step)
        if args.num_generations < 2:
            raise UsageError(f"GRPO needs an even number of completions per step ({where}); "
                             "raise --batch-per-device or pass --no-grpo")
    elif args.num_generations < 2:
        raise UsageError(f"--num-generations must be >= 2 (GRPO compares each completion with the others sampled "
                         f"for its prompt), got {args.num_generations}")
    elif per_step % args.num_generations:
        raise UsageError(f"--num-generations {args.num_generations} must divide the completions per step ({where})")


def _require_trl():
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as exc:
        raise UsageError(f"{exc.name} is not installed: pip install trl datasets (see requirements.txt)") from None
    return trl


def _quiet() -> None:
    """Keep library chatter off stderr (nbgrader scores a cell with stderr output 0)."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    for name in ("trl", "accelerate", "datasets", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(trl|transformers|accelerate|datasets|torch)(\.|$)")


# --------------------------------------------------------------------------- data

def _passages(tokenizer, n_tokens: int) -> list[str]:
    """The shipped book cut into consecutive passages of about ``n_tokens`` tokens, decoded to text.

    Every cut falls where a token starts with a space and a letter or digit (GPT-2-style
    byte-level BPE: ``Ġword``) after a token that does not end in whitespace, so each passage
    starts with " word" and ends inside a word. Tokens never merge across such a cut, so a
    prompt's tokens are a prefix of prompt+completion's, as TRL expects (it warns on every
    example otherwise: a completion starting mid-word trains on a context the model never sees).
    """
    from utils.model.models import encode, load_text

    ids = encode(tokenizer, load_text())
    toks = tokenizer.convert_ids_to_tokens(ids)
    cuts, target = [], 0
    for i in range(1, len(toks)):
        if i >= target and len(toks[i]) > 1 and toks[i][0] == "\u0120" and toks[i][1].isalnum() \
                and toks[i - 1][-1] not in "\u0120\u010a":
            cuts.append(i)
            target = i + n_tokens
    n = len(cuts) - 1
    if n < 4:
        raise UsageError(f"the shipped text holds only {n} passages of {n_tokens} tokens; lower --max-length")
    return [tokenizer.decode(ids[cuts[k]:cuts[k + 1]]) for k in range(n)]


def make_datasets(tokenizer, max_length: int, n_examples: int):
    """SFT pairs {prompt, completion}, DPO triples {prompt, chosen, rejected} and GRPO prompts
    {prompt, reference} from the book.

    Each text is about half of ``max_length`` tokens less a few (TRL appends an EOS, and a cut
    waits for the next word); sequences are truncated to ``max_length`` anyway. ``rejected`` is
    the passage half the book away: fluent text, but not the continuation. GRPO's ``reference``
    is the SFT completion under another name (TRL keeps a ``completion`` column away from reward
    functions): the policy never trains on it, only :func:`overlap_reward` reads it. At most
    ``n_examples`` (at least 64, or all the book holds) examples are kept: the Trainer cycles
    over them for as many steps as asked, and tokenising fewer saves the smoke run seconds.
    """
    from datasets import Dataset

    half = max(4, (max_length - 8) // 2)
    p = _passages(tokenizer, half)
    n = len(p) - 1
    far = [p[(i + 1 + n // 2) % len(p)] for i in range(n)]
    keep = min(n, max(64, n_examples))
    sft = Dataset.from_dict({"prompt": p[:keep], "completion": p[1:keep + 1]})
    dpo = Dataset.from_dict({"prompt": p[:keep], "chosen": p[1:keep + 1], "rejected": far[:keep]})
    grpo = Dataset.from_dict({"prompt": p[:keep], "reference": p[1:keep + 1]})
    return sft, dpo, grpo


def _summary(trainer, out, clock, warmup: int, last: int, world: int) -> dict:
    """This rank's view of a finished trainer: loss, measured tokens/s, peak memory, logged metrics."""
    logs = [h for h in trainer.state.log_history if "step" in h]
    tokens = {h["step"]: h["num_tokens"] for h in logs if "num_tokens" in h}
    if last not in tokens or (warmup and warmup not in tokens):
        raise RuntimeError(f"TRL logged no num_tokens at steps {warmup} and {last}; logged: {sorted(tokens)}")
    measured = tokens[last] - tokens.get(warmup, 0)
    seconds = clock.stamps[last] - clock.stamps[warmup]
    res = {"train_loss": out.training_loss, "steps": last - warmup, "warmup_steps": warmup,
           "world_size": world, "tokens_measured": int(measured), "seconds_measured": seconds,
           "seconds_per_step": seconds / (last - warmup),
           "tokens_per_s": measured / seconds, "tokens_per_s_per_device": measured / seconds / world,
           "last_logged_loss": next((h["loss"] for h in reversed(logs) if "loss" in h), None)}
    acc = [h["rewards/accuracies"] for h in logs if "rewards/accuracies" in h]
    if acc:
        res["rewards_accuracy"] = statistics.fmean(acc)
        res["rewards_margin"] = statistics.fmean(h["rewards/margins"] for h in logs if "rewards/margins" in h)
    for key, name in (("reward", "reward_mean"), ("completions/mean_length", "completion_mean_length")):
        values = [h[key] for h in logs if h.get(key) is not None]
        if values:
            res[name] = statistics.fmean(values)
    step_times = [h["step_time"] for h in logs if "step_time" in h and h["step"] > warmup]
    if step_times:
        res["trl_step_time_s"] = statistics.fmean(step_times)
    return res


def _peak_gib(device) -> float | None:
    import torch

    from utils.units import GIB

    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def _reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --------------------------------------------------------------------------- the run

def _stage(stage: str, model, tok, data, common: dict, args, on_cuda: bool, result: dict):
    """Train one stage (``"sft"``, ``"dpo"`` or ``"grpo"``) with TRL's trainer; returns its summary (rank 0's
    numbers, peak memory and GRPO's generation share over all ranks) and the trained, unwrapped model."""
    from accelerate.utils import gather_object
    from transformers import PrinterCallback, ProgressCallback
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    ref = timer = None
    if stage == "sft":
        trainer = SFTTrainer(model=model, args=SFTConfig(learning_rate=1e-4, **common), train_dataset=data,
                             processing_class=tok)
    elif stage == "dpo":  # the reference is a frozen copy of the SFT'd weights: one more model's memory, no optimizer
        ref = copy.deepcopy(model).eval().requires_grad_(False)
        trainer = DPOTrainer(model=model, ref_model=ref, args=DPOConfig(learning_rate=1e-6, beta=0.1, **common),
                             train_dataset=data, processing_class=tok)
    else:  # beta=0 (TRL's default): no reference model; GRPOConfig has no max_length, the completion length bounds it
        grpo_args = {k: v for k, v in common.items() if k != "max_length"}
        config = GRPOConfig(learning_rate=1e-6, beta=0.0, num_generations=args.num_generations,
                            max_completion_length=args.completion_length, use_vllm=False,
                            generation_kwargs=_sampling_kwargs(model, tok), **grpo_args)
        trainer = GRPOTrainer(model=model, reward_funcs=overlap_reward, args=config, train_dataset=data,
                              processing_class=tok)
    for cb in (PrinterCallback, ProgressCallback):  # per-step prints on stdout, progress bars on stderr
        trainer.remove_callback(cb)
    device = trainer.args.device
    last = args.warmup + args.steps
    clock = window_clock(args.warmup, last, device)
    trainer.add_callback(clock)
    if stage == "grpo":  # the model GRPOTrainer unwraps for generation is this very object
        timer = GenerationTimer(model, device)
    _reset_peak(device)
    try:
        out = trainer.train()
    finally:
        if timer is not None:
            timer.remove()
    world = trainer.accelerator.num_processes
    mine = _summary(trainer, out, clock, args.warmup, last, world)
    mine["peak_mem_gib"] = _peak_gib(device)
    if timer is not None:
        gen = timer.window(clock.stamps[args.warmup], clock.stamps[last])
        mine.update({"generation_calls": gen["calls"], "generation_s": gen["seconds"],
                     "generation_s_per_step": gen["seconds"] / args.steps,
                     "other_s_per_step": (mine["seconds_measured"] - gen["seconds"]) / args.steps,
                     "generation_share": gen["seconds"] / mine["seconds_measured"],
                     "generated_tokens": gen["tokens"],
                     "generated_tokens_per_s_per_device": gen["tokens"] / gen["seconds"] if gen["seconds"] else None})
    ranks = gather_object([mine])
    result["world_size"], result["device"] = world, str(device)
    summary = {**ranks[0], "peak_mem_gib": max(r["peak_mem_gib"] for r in ranks) if on_cuda else None,
               "peak_mem_gib_per_rank": [r["peak_mem_gib"] for r in ranks]}
    if timer is not None:
        summary["generation_share_per_rank"] = [r["generation_share"] for r in ranks]
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.zero_grad(set_to_none=True)
    # drop the accelerator's references (DDP wrapper, optimizer state) so the next stage's peak is its own
    trainer.accelerator.free_memory()
    del trainer, ref
    return summary, model


def _sampling_kwargs(model, tok) -> dict:
    """Generation settings beyond TRL's own (``do_sample``, temperature 1, ``max_new_tokens``): a full preset's
    vocabulary is larger than the shipped tokenizer's, and an id the tokenizer cannot decode would leave the reward
    a shorter text than the policy trains on, so sampling keeps to the tokenizer's ids."""
    extra = range(len(tok), model.config.vocab_size)
    return {"suppress_tokens": list(extra)} if len(extra) else {}


def _completion_length(tok, prompts: list[str], max_length: int) -> int:
    """GRPO's ``max_completion_length``: ``max_length`` less the longest prompt (tokenised as TRL does, without
    truncation), so every prompt plus its sampled completion fits where SFT's and DPO's sequences do."""
    longest = max(len(ids) for ids in tok(text=prompts)["input_ids"])
    if max_length - longest < 1:
        raise UsageError(f"the prompts take {longest} tokens, all of --max-length {max_length}; raise --max-length")
    return max_length - longest


def _checkpointing_kwarg(on: bool) -> dict:
    """transformers renamed ``gradient_checkpointing`` to ``activation_checkpointing`` after 5.17 (the old
    name warns on stderr); the GPU image's 5.17 knows only the old one."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": on}


def run(args: argparse.Namespace) -> dict | None:
    """SFT, then DPO and GRPO from the SFT'd weights, on this rank; rank 0 returns the result (others None)."""
    import torch
    from accelerate import PartialState

    from utils.device.hardware import fingerprint
    from utils.measure.record import utils_hash
    from utils.model.models import build_model, shipped_tokenizer

    on_cuda = torch.cuda.is_available()
    tok = shipped_tokenizer()
    tok.pad_token = tok.eos_token  # the shipped tokenizer has no pad token; TRL needs one
    last = args.warmup + args.steps
    world_env = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun
    sft_data, dpo_data, grpo_data = make_datasets(tok, args.max_length, last * args.batch_per_device * world_env)
    args.completion_length = _completion_length(tok, list(grpo_data["prompt"]), args.max_length) if args.grpo else None
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = build_model(args.preset)
    model.config.pad_token_id = model.config.eos_token_id = model.config.bos_token_id = tok.eos_token_id
    if getattr(model, "generation_config", None) is not None:
        gc_ = model.generation_config
        gc_.pad_token_id = gc_.eos_token_id = gc_.bos_token_id = tok.eos_token_id
    workdir = tempfile.mkdtemp(prefix="post_train_trl_")  # the Trainer wants an output_dir; nothing is saved
    common = dict(output_dir=workdir, max_steps=last, per_device_train_batch_size=args.batch_per_device,
                  gradient_accumulation_steps=1, max_length=args.max_length, bf16=args.bf16,
                  **_checkpointing_kwarg(args.gradient_checkpointing), logging_steps=1, save_strategy="no",
                  report_to="none", disable_tqdm=True, log_level="error", log_level_replica="error",
                  use_cpu=not on_cuda, seed=0, dataloader_num_workers=0,
                  lr_scheduler_type="constant", warmup_steps=0, ddp_find_unused_parameters=False)
    result: dict = {"world_size": None, "device": None}
    data = {"sft": sft_data, "dpo": dpo_data, "grpo": grpo_data}
    sft_state = None
    try:
        for stage in STAGES if args.grpo else STAGES[:2]:
            if stage == "grpo":  # GRPO starts from the SFT'd weights too, not from DPO's
                model.load_state_dict(sft_state)
                sft_state = None
            result[stage], model = _stage(stage, model, tok, data[stage], common, args, on_cuda, result)
            if stage == "sft" and args.grpo:  # a host copy, so it holds no device memory during DPO
                sft_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    state = PartialState()
    state.wait_for_everyone()
    is_main = state.is_main_process
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # every rank: a gloo rank exiting early can abort
    if not is_main:
        return None
    import trl

    result.update({
        "device_name": torch.cuda.get_device_name(0) if on_cuda else "cpu",
        "config": {"preset": args.preset, "batch_per_device": args.batch_per_device, "max_length": args.max_length,
                   "steps": args.steps, "warmup": args.warmup, "bf16": args.bf16, "smoke": args.smoke,
                   "gradient_checkpointing": args.gradient_checkpointing, "examples_sft": len(sft_data),
                   "examples_dpo": len(dpo_data), "weights": "random", "grpo": args.grpo,
                   "examples_grpo": len(grpo_data) if args.grpo else None, "num_generations": args.num_generations,
                   "completion_length": args.completion_length,
                   "reward": "overlap_reward" if args.grpo else None},
        "distributed_type": str(state.distributed_type.value),
        "versions": {"torch": torch.__version__, "trl": trl.__version__,
                     "transformers": sys.modules["transformers"].__version__},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM"))},
        "fingerprint": fingerprint(0), "utils_sha256": utils_hash(),
    })
    return result


def _finite(result: dict) -> bool:
    return all(math.isfinite(result[s]["train_loss"]) for s in STAGES if s in result)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        resolve(args)
        _require_trl()
        _quiet()
        res = run(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if res is not None:
        args.out.write_text(json.dumps(res, indent=1, default=str))
        print(json.dumps({"world_size": res["world_size"], "device": res["device"],
                          **{s: {k: res[s][k] for k in ("train_loss", "seconds_per_step", "tokens_per_s",
                                                        "peak_mem_gib", "rewards_accuracy", "generation_share")
                                 if k in res[s]} for s in STAGES if s in res}}))
        if not _finite(res):
            print(f"{PROG}: error: a loss is not finite (see {args.out})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # gloo's teardown can abort a rank after the results are written
