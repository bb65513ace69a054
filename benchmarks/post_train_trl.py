"""Phase 2 post-training on all visible GPUs: TRL's SFTTrainer, then DPOTrainer on the SFT'd model.

    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/post_train_trl.py --out trl2.json --bf16
    accelerate launch --config_file benchmarks/accelerate/ddp.yaml --num_processes 2 \\
        benchmarks/post_train_trl.py --out cpu.json --smoke          # CPU: two processes over gloo

Post-training as people run it: ``trl.SFTTrainer`` with an ``SFTConfig`` on prompt/completion
pairs (loss on the completion only, TRL's default for that format), then ``trl.DPOTrainer``
with a ``DPOConfig`` on prompt/chosen/rejected triples, starting from the SFT'd weights with a
frozen copy of them as the reference model (DPO, arXiv 2305.18290). The trainers run their own
loops; the distributed engine is whatever ``accelerate launch`` set up (DDP with
``benchmarks/accelerate/ddp.yaml``), so the same script runs on 1..N GPUs.

Model and data, offline: ``utils.models.build_model(preset)`` (random weights) and the shipped
tokenizer; the examples are cut from the shipped book (``utils.models.load_text``). A pair is
``prompt`` = a passage, ``completion`` = the passage that follows it; a triple keeps that
continuation as ``chosen`` and takes a passage from elsewhere in the book as ``rejected``.
With random weights this is honest for speed and memory (the same shapes run the same kernels
and hold the same bytes: SFT holds one model plus AdamW state, DPO adds a frozen reference
model and runs chosen and rejected through both), not for quality: the losses and DPO's reward
accuracy after a few steps from random weights say nothing about what post-training teaches.

Throughput: ``tokens_per_s`` counts TRL's own ``num_tokens`` log (the attention-mask sum of
every batch, gathered over all ranks; for DPO both the chosen and the rejected sequence) over
the wall time between the end of the last warm-up step and the end of the last step, with a
device sync at both ends; ``tokens_per_s_per_device`` divides it by the world size. The
trainers already synchronise every step (TRL's metrics call ``.item()``), so this is the rate
the trainer delivers, logging included. ``train_loss`` is the Trainer's ``training_loss``
(mean over all steps, warm-up included). ``peak_mem_gib`` is the largest
``torch.cuda.max_memory_allocated`` over the ranks (per rank in ``peak_mem_gib_per_rank``);
None on a CPU. ``rewards_accuracy`` is the mean of TRL's logged ``rewards/accuracies``.

Settings that differ from TRL's defaults, so the run measures what phase 2 compares:
``gradient_checkpointing=False`` (TRL turns it on by default; ``--gradient-checkpointing``
restores it) and ``bf16`` only with ``--bf16`` (TRL defaults to bf16). No checkpoints are
saved, nothing is reported to a tracker, and progress bars, per-step log prints and library
warnings are kept off stderr. Without CUDA the sizes are the smoke sizes (as ``--smoke``) and
the trainers run on the CPU over gloo (``use_cpu``); launch the DDP config as above, since
``accelerate launch --cpu --num_processes 2`` starts a single process.
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
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROG = "post_train_trl.py"
# (preset, batch per device, max length, measured steps, warm-up steps)
FULL = ("gpt2-small", 8, 1024, 30, 3)
SMOKE = ("gpt2-tiny", 2, 64, 3, 1)


class UsageError(ValueError):
    """Bad input or a missing package: reported as one line, exit status 2."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="JSON file rank 0 writes")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (automatic without CUDA)")
    p.add_argument("--preset", help=f"model preset (default {FULL[0]}, smoke {SMOKE[0]})")
    p.add_argument("--batch-per-device", type=int, help=f"examples per GPU per step (default {FULL[1]}, smoke {SMOKE[1]})")
    p.add_argument("--max-length", type=int, help=f"tokens per sequence (default {FULL[2]}, smoke {SMOKE[2]})")
    p.add_argument("--steps", type=int, help=f"measured steps per trainer (default {FULL[3]}, smoke {SMOKE[3]})")
    p.add_argument("--warmup", type=int, help=f"untimed steps first (default {FULL[4]}, smoke {SMOKE[4]})")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (the Trainer's autocast)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default, off here unless asked")
    return p.parse_args(argv)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults (full or smoke sizes) and check every argument before any process group starts."""
    from utils.env import smoke_mode
    from utils.models import MODEL_PRESETS, preset_config_dict

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
    return args


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
    from utils.models import encode, load_text

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
    """SFT pairs {prompt, completion} and DPO triples {prompt, chosen, rejected} from the book.

    Each text is about half of ``max_length`` tokens less a few (TRL appends an EOS, and a cut
    waits for the next word); sequences are truncated to ``max_length`` anyway. ``rejected`` is
    the passage half the book away: fluent text, but not the continuation. At most
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
    return sft, dpo


# --------------------------------------------------------------------------- timing

def _window_clock(warmup: int, last: int, device):
    """A TrainerCallback that stamps the wall clock, after a device sync, at the end of step
    ``warmup`` (or at train begin when there is no warm-up) and at the end of step ``last``."""
    from transformers import TrainerCallback

    from utils.timing import device_sync

    class WindowClock(TrainerCallback):
        def __init__(self):
            self.stamps: dict[int, float] = {}

        def _stamp(self, step: int) -> None:
            device_sync(device)
            self.stamps[step] = time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            if warmup == 0:
                self._stamp(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, last):
                self._stamp(state.global_step)

    return WindowClock()


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
           "tokens_per_s": measured / seconds, "tokens_per_s_per_device": measured / seconds / world,
           "last_logged_loss": next((h["loss"] for h in reversed(logs) if "loss" in h), None)}
    acc = [h["rewards/accuracies"] for h in logs if "rewards/accuracies" in h]
    if acc:
        res["rewards_accuracy"] = statistics.fmean(acc)
        res["rewards_margin"] = statistics.fmean(h["rewards/margins"] for h in logs if "rewards/margins" in h)
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
    """Train one stage (``"sft"`` or ``"dpo"``) with TRL's trainer; returns its summary (rank 0's
    numbers, peak memory over all ranks) and the trained, unwrapped model."""
    from accelerate.utils import gather_object
    from transformers import PrinterCallback, ProgressCallback
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    ref = None
    if stage == "sft":
        trainer = SFTTrainer(model=model, args=SFTConfig(learning_rate=1e-4, **common), train_dataset=data,
                             processing_class=tok)
    else:  # the reference is a frozen copy of the SFT'd weights: one more model's memory, no optimizer state
        ref = copy.deepcopy(model).eval().requires_grad_(False)
        trainer = DPOTrainer(model=model, ref_model=ref, args=DPOConfig(learning_rate=1e-6, beta=0.1, **common),
                             train_dataset=data, processing_class=tok)
    for cb in (PrinterCallback, ProgressCallback):  # per-step prints on stdout, progress bars on stderr
        trainer.remove_callback(cb)
    device = trainer.args.device
    last = args.warmup + args.steps
    clock = _window_clock(args.warmup, last, device)
    trainer.add_callback(clock)
    _reset_peak(device)
    out = trainer.train()
    world = trainer.accelerator.num_processes
    mine = _summary(trainer, out, clock, args.warmup, last, world)
    mine["peak_mem_gib"] = _peak_gib(device)
    ranks = gather_object([mine])
    result["world_size"], result["device"] = world, str(device)
    summary = {**ranks[0], "peak_mem_gib": max(r["peak_mem_gib"] for r in ranks) if on_cuda else None,
               "peak_mem_gib_per_rank": [r["peak_mem_gib"] for r in ranks]}
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.zero_grad(set_to_none=True)
    # drop the accelerator's references (DDP wrapper, optimizer state) so the next stage's peak is its own
    trainer.accelerator.free_memory()
    del trainer, ref
    return summary, model


def _checkpointing_kwarg(on: bool) -> dict:
    """transformers renamed ``gradient_checkpointing`` to ``activation_checkpointing`` after 5.17 (the old
    name warns on stderr); the GPU image's 5.17 knows only the old one."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": on}


def run(args: argparse.Namespace) -> dict | None:
    """SFT then DPO on this rank; rank 0 returns the result (others None)."""
    import torch
    from accelerate import PartialState

    from utils.hardware import fingerprint
    from utils.models import build_model, shipped_tokenizer
    from utils.record import utils_hash

    on_cuda = torch.cuda.is_available()
    tok = shipped_tokenizer()
    tok.pad_token = tok.eos_token  # the shipped tokenizer has no pad token; TRL needs one
    last = args.warmup + args.steps
    world_env = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun
    sft_data, dpo_data = make_datasets(tok, args.max_length, last * args.batch_per_device * world_env)
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
    try:
        for stage in ("sft", "dpo"):
            result[stage], model = _stage(stage, model, tok, sft_data if stage == "sft" else dpo_data, common, args,
                                          on_cuda, result)
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
                   "examples_dpo": len(dpo_data), "weights": "random"},
        "distributed_type": str(state.distributed_type.value),
        "versions": {"torch": torch.__version__, "trl": trl.__version__,
                     "transformers": sys.modules["transformers"].__version__},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM"))},
        "fingerprint": fingerprint(0), "utils_sha256": utils_hash(),
    })
    return result


def _finite(result: dict) -> bool:
    return all(math.isfinite(result[s]["train_loss"]) for s in ("sft", "dpo"))


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
                          **{s: {k: res[s][k] for k in ("train_loss", "tokens_per_s", "peak_mem_gib",
                                                        "rewards_accuracy") if k in res[s]} for s in ("sft", "dpo")}}))
        if not _finite(res):
            print(f"{PROG}: error: a loss is not finite (see {args.out})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
