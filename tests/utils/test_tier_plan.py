"""utils/course/tier_plan.py, utils/course/lab_memory.py, grader/tier_table.py and the labs' plan.py: every lab's plan on every tier.

With the device faked (torch.cuda's answers replaced, as tests/utils/test_rehearsal.py does), the
device cell's ``print(SIZES)`` prints the plan of the card it finds: its dtype matches the card
(no bf16 on a T4 or a P100), ``torch.compile`` is off where it cannot run, every skip says why,
the estimated peak fits the card with the stated headroom, and a P100 learner reads first what
each lab gives them. The README's table is the one the code writes, the estimates of single steps
are checked against peaks measured on one H200 (benchmarks/RESULTS.md), and every lab's plan
against its measured device-wide peak (MEASURED_PEAKS in grader/labs/<lab>/plan.py): at or above it, at most 15%
above it.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from grader import labs, tier_table
from grader.labs.multi_gpu.sizes import BY_TIER
from utils.course import env, lab_memory, tier_plan
from utils.course.tier_plan import CARDS, CONTEXT_GIB, MARGIN
from utils.device import rehearsal
from utils.model import quantize
from utils.parallel import launch
from utils.train import training

LABS = labs.assignments()

NAMES = {"t4": "Tesla T4", "t4x2": "Tesla T4", "p100": "Tesla P100-PCIE-16GB", "l4": "NVIDIA L4",
         "a100-40gb": "NVIDIA A100-SXM4-40GB", "h100": "NVIDIA H100 80GB HBM3"}
ARCH_CU126 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
ARCH_CU128 = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # as Kaggle's image warns
TIERS = ["t4", "p100", "l4", "a100-40gb"]  # one GPU; t4x2 is lab 02's
CASES = [(lab, key) for lab in LABS for key in TIERS] + [("02_multi_gpu", "t4x2")]


@pytest.fixture
def device(monkeypatch):
    """``device(key)`` makes torch report the card ``CARDS[key]``: name, capability, memory, count."""
    def install(key: str, arch: list[str] | None = None, gib: float | None = None):
        card = CARDS[key]
        gib = card.memory_gib if gib is None else gib
        props = SimpleNamespace(name=NAMES[key], major=card.capability[0], minor=card.capability[1],
                                total_memory=int(gib * 2**30), multi_processor_count=40)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: card.gpus)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: card.capability)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: NAMES[key])
        monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arch or ARCH_CU126))
        monkeypatch.setattr(rehearsal, "_cuda_available", lambda: True)
        monkeypatch.setattr(rehearsal, "_device_gib", lambda i: gib)
        monkeypatch.setattr(rehearsal, "_applied", {})
        monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: None)
        monkeypatch.setattr(tier_plan, "software_absent", lambda: absent)
        return card

    absent = ()  # a tier's plan: vLLM and bitsandbytes installed, as the lab's setup cell installs them

    monkeypatch.delenv(env.TIER_VAR, raising=False)
    monkeypatch.delenv(env.SMOKE_VAR, raising=False)
    monkeypatch.setattr(labs, "_SAID", set())
    return install


def _device_cell_sizes(lab: str):
    """What the lab's device cell binds to SIZES (lab 02: the launch plan's sizes)."""
    return launch.plan(BY_TIER).sizes if lab == "02_multi_gpu" else labs.sizes(lab)


def _check(plan: tier_plan.LabPlan) -> None:
    card = plan.card
    if not card.at_least(tier_plan.BF16_MIN):
        assert plan.dtype != "bf16", f"{plan.lab} on {card.name}: bf16 on a card without it"
    if plan.lab != "02_multi_gpu":
        assert plan.dtype == tier_plan.card_dtype(card)
    if card.gpu and not card.at_least(tier_plan.COMPILE_MIN):
        assert not plan.compile, f"{plan.lab} on {card.name}: torch.compile cannot run below 7.0"
    for what, why in plan.skipped.items():
        assert isinstance(why, str) and len(why.replace(what, "")) > 20, f"{what}: no reason given ({why!r})"
    moment, peak = plan.peak
    assert peak == pytest.approx(plan.expected_gib(moment)) and peak >= plan.needed_gib(moment)
    assert peak == max(plan.expected_gib(m) for m in plan.moments) and peak <= card.memory_gib
    worst = max(plan.moments, key=plan.needed_gib)
    assert plan.fits and plan.need <= card.memory_gib, \
        f"{plan.lab} on {card.name}: {plan.need:.1f} GiB at {worst.name!r}"


@pytest.mark.parametrize("lab, key", CASES)
def test_the_device_cell_prints_a_plan_that_fits_the_card(device, lab, key):
    card = device(key)
    sizes = _device_cell_sizes(lab)
    text = str(sizes)
    live = tier_plan.current_card(env.smoke_mode())
    assert (live.capability, live.gpus, live.memory_gib) == (card.capability, card.gpus, pytest.approx(card.memory_gib))
    plan = labs.plan_for(lab, live, sizes)
    _check(plan)
    assert text.startswith(f"Plan for {lab}: {NAMES[key]}") and repr(sizes) in text
    assert f"dtype: {plan.dtype} | torch.compile: {'on' if plan.compile else 'off'}" in text
    assert all(f"skipped: {what}: {why}" in text for what, why in plan.skipped.items())
    assert ": fits;" in text and f"{MARGIN:.0%} margin and {CONTEXT_GIB} GiB of CUDA context" in text


@pytest.mark.parametrize("key", tier_table.TABLE_CARDS)
def test_every_lab_fits_every_card_of_the_table(key):
    for lab in LABS:
        _check(tier_table.plan(lab, CARDS[key]))


@pytest.mark.parametrize("key", [k for k, c in CARDS.items() if c.gpu])
def test_lab02_fits_two_of_any_card(key):
    """Lab 02's GPU sizes run on two cards of every tier, not only Kaggle's two T4s."""
    plan = tier_table.plan("02_multi_gpu", dataclasses.replace(CARDS[key], gpus=2))
    assert plan.size_tier == CARDS[key].size_tier and "all-reduce over 2 GPUs (NCCL)" in plan.runs[0]
    _check(plan)


def test_one_gpu_or_none_runs_lab02_as_cpu_processes_and_says_why():
    for key in ("t4", "p100", "l4", "cpu"):
        plan = tier_table.plan("02_multi_gpu", CARDS[key])
        assert plan.size_tier == "cpu" and plan.dtype == "fp32" and "scaling across GPUs" in plan.skipped


def test_a_p100_learner_reads_first_what_each_lab_gives(device):
    device("p100", arch=ARCH_CU128)
    text = str(labs.sizes("00_foundations"))
    first, *rest = text.splitlines()
    assert "NO KERNELS FOR sm_60" in first and "cu126" in first  # before anything else: the build cannot run here
    head = text.split("  sizes:")[0]
    for word in ("no tensor cores and no bf16", "no torch.compile", "no Triton", "no vLLM", "no LLM.int8()",
                 "torch.compile: off"):
        assert word in head, word
    lab_lines = [ln.strip() for ln in rest if ln.strip().startswith(LABS)]
    assert [ln.split(":")[0] for ln in lab_lines] == list(LABS)
    for lab, line in zip(LABS, lab_lines, strict=True):
        plan = tier_table.plan(lab, CARDS["p100"])
        assert line == f"{lab}: {tier_plan.lab_summary(plan)}"
        assert "compile off" in line and "fp16" in line or plan.dtype == "fp32"
    assert "skips: vLLM" in lab_lines[4] and "int8 (LLM.int8)" in lab_lines[3]
    device("p100", arch=ARCH_CU126)  # a CUDA 12.6 build has sm_60 kernels: no warning
    assert str(labs.sizes("00_foundations")).startswith("Plan for 00_foundations")


def test_the_code_follows_a_p100_plan(device, monkeypatch):
    device("p100")
    assert "GPUTooOldForTriton" in tier_plan.too_old_to_compile("cuda")
    assert quantize.usable_modes("cuda") == ("nf4",) and training.best_precision("cuda") == "fp16"
    assert training._torch_half(torch.device("cuda")) is torch.float16
    from utils.train import fused

    with pytest.raises(RuntimeError, match="Triton does not compile for compute capability 6.0"):
        fused._require_capability(torch.device("cuda"))
    device("t4")
    assert tier_plan.too_old_to_compile("cuda") is None and quantize.usable_modes("cuda") == ("int8", "nf4")


def test_a_loop_and_a_decoder_run_eager_where_the_plan_says_no_compile(monkeypatch):
    monkeypatch.setattr(tier_plan, "too_old_to_compile", lambda device=None: "compute capability 6.0")
    cfg = training.LoopConfig(batch_size=2, seq_len=16, compile_mode="default")
    loop = training.build_loop("gpt2-tiny", cfg, device="cpu")
    assert loop.compile_skipped == "compute capability 6.0" and loop.loss_fn == loop._loss
    from utils.model.models import build_model
    from utils.serving import decode

    d = decode.FastDecoder(build_model("llama-tiny").eval(), max_seq_len=16, compile=True)
    assert not d.compiled and d.compile_skipped == "compute capability 6.0"


def test_a_rehearsed_t4_plans_as_a_t4(device, monkeypatch):
    device("h100")
    monkeypatch.setenv(env.TIER_VAR, "t4")
    card = tier_plan.current_card(False)
    assert card.capability == (7, 5) and card.memory_gib == pytest.approx(15.0) and "rehearsed on" in card.name
    assert "fp16" in str(labs.sizes("03_inference_serving"))


def test_sizes_print_their_plan_and_stay_dataclasses():
    for lab in LABS:
        for tier in env.TIERS:
            s = labs.sizes(lab, tier)
            assert repr(s).startswith(type(s).__name__ + "(") and s == labs.sizes(lab, tier)
            assert dataclasses.asdict(s) and str(s).startswith(f"Plan for {lab}")


def test_the_readme_table_is_the_one_the_code_writes():
    assert tier_table.readme_block() == tier_table.readme_section(), "run: python -m grader.tier_table --readme"


# Peaks measured on one H200 (benchmarks/RESULTS.md, with each run's command and raw file there):
# (what, estimate in GiB, measured peak allocated in GiB). The estimates may only err high.
MEASURED = [
    ("lab 01 ladder, batch 32 x 1024, bf16 autocast, eager, training KV cache on",
     lab_memory.train_gib("gpt2-small", 32, 1024, "bf16") + lab_memory.kv_gib("gpt2-small", 32, 1024, 2), 45.6),
    ("train_multi_gpu.py eager, 1 GPU, batch 16 x 1024, bf16", lab_memory.train_gib("gpt2-small", 16, 1024, "bf16"),
     23.09),
    ("lab 01 naive loop, batch 4 x 1024, fp32", lab_memory.train_gib("gpt2-small", 4, 1024, "fp32"), 7.8),
    ("LoRA, batch 8 x 512, non-reentrant checkpointing", lab_memory.lora_gib("llama-1.1b", 8, 512, checkpointing=True),
     4.09),
    ("LoRA without checkpointing", lab_memory.lora_gib("llama-1.1b", 8, 512, checkpointing=False), 14.71),
    ("QLoRA, lean", lab_memory.lora_gib("llama-1.1b", 8, 512, checkpointing=True, quant="nf4"), 2.70),
    ("TRL DPO, 1 GPU, batch 8 x 1024, bf16", lab_memory.dpo_gib("gpt2-small", 8, 1024, "bf16"), 19.52),
    ("vLLM 0.26.0 engine for a 7.5 GiB share (lab 03 rehearsing a T4), NVML's count for its processes",
     lab_memory.engine_gib(0.5 * 15.0), 8.48),
]


@pytest.mark.parametrize("what, estimate, measured", MEASURED, ids=[m[0] for m in MEASURED])
def test_the_estimates_err_high_against_measured_peaks(what, estimate, measured):
    assert 1.0 <= estimate / measured <= 1.5, f"{what}: estimate {estimate:.2f} GiB, measured {measured} GiB"


CALIBRATION = tier_table.calibration()


@pytest.mark.parametrize("record, plan, plan_gib", CALIBRATION,
                         ids=[f"{r.lab}-{r.card.key}-{r.how[:4]}" for r, _, _ in CALIBRATION])
def test_every_plan_covers_its_measured_peak_within_15_percent(record, plan, plan_gib):
    """A plan is never below the lab's measured device-wide peak, and at most 15% above it."""
    assert plan.card is record.card and plan.lab == record.lab
    assert record.gib <= plan_gib <= tier_plan.PLAN_OVER_MEASURED_MAX * record.gib, (
        f"{record.lab} on {record.card.name}: plan {plan_gib:.2f} GiB against {record.gib:.2f} GiB measured "
        f"({record.how}, {record.source or 'no raw file'})")


def test_the_measured_peaks_name_their_raw_files_or_their_machine_and_date():
    from pathlib import Path

    root = Path(tier_plan.__file__).resolve().parents[2]
    assert {r.card.key for r in labs.measured_peaks()} == {"t4", "h100"}
    for r in labs.measured_peaks():
        assert "2026-12-0" in r.how and "nvidia-smi" in r.how
        if r.source:  # the raw file holds the peak: the highest reading of the named cell
            import json

            rows = json.loads((root / r.source).read_text())["rows"]
            cell = r.cell.split(" ")[0]
            assert round(r.gib * 1024) in {row["peak_mib"] for row in rows}, r
            assert any(row["cell"] == cell for row in rows), r


def test_the_readme_marks_the_measured_labs():
    block = tier_table.readme_block()
    for r, _, _ in CALIBRATION:
        row = next(ln for ln in block.splitlines() if ln.startswith(f"| {r.card.key} ("))
        assert f"measured {r.gib:.1f} [" in row, (r.lab, r.card.key)
    assert "2026-12-04" in block and "2026-12-05" in block and "every other cell is an estimate" in block


def test_a_cached_block_counts_up_to_the_card_and_not_in_the_fit():
    """The ladder's unpadded loss blocks stay cached (device-wide peak above the need), but the
    allocator gives them back before it fails: they never make a plan not fit."""
    p = tier_table.plan("01_single_gpu", CARDS["h100"])
    ladder = next(m for m in p.moments if m.cached_gib > 0)
    assert p.expected_gib(ladder) > p.needed_gib(ladder) + 10
    small = dataclasses.replace(CARDS["h100"], memory_gib=60.0)
    q = tier_table.plan("01_single_gpu", small)
    assert q.peak[1] == pytest.approx(60.0) and q.fits


def test_shapes_match_the_presets():
    assert lab_memory.shape("gpt2-small").params == 124_439_808  # GPT-2 124M, tied head counted once
    assert lab_memory.shape("llama-1.1b").params == 1_100_048_384  # TinyLlama 1.1B
    assert lab_memory.shape("gpt2-small").python_gelu and not lab_memory.shape("llama-1.1b").python_gelu


def test_main_prints_a_cards_plans(capsys):
    assert tier_table.main(["01_single_gpu", "--card", "p100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Plan for 01_single_gpu: P100") and "torch.compile of the optimized loop" in out


NO_VLLM = "vLLM is not installed (looked in this interpreter); on a CUDA GPU: pip install vllm"
NO_BNB = "bitsandbytes is not installed (pip install bitsandbytes)"


def test_plan_says_what_this_machine_lacks(device, monkeypatch):
    """A T4 whose runtime could not install vLLM or bitsandbytes (no internet, as on a GPU box
    offline) is told so in the plan, in the lab's own words, instead of a plan that lists vLLM
    and 4-bit runs the lab will then skip; the memory estimate drops the vLLM engines."""
    device("t4")
    full = {lab: labs.plan_for(lab, tier_plan.current_card(False), _device_cell_sizes(lab)) for lab in LABS}
    monkeypatch.setattr(tier_plan, "software_absent", lambda: (("vllm", NO_VLLM), ("bitsandbytes", NO_BNB)))
    card = tier_plan.current_card(False)
    assert card.lacks("vllm") == NO_VLLM and card.lacks("bitsandbytes") == NO_BNB
    bare = {lab: labs.plan_for(lab, card, _device_cell_sizes(lab)) for lab in LABS}
    p3, p4, p1 = bare["03_inference_serving"], bare["04_benchmarking_production"], bare["01_single_gpu"]
    assert NO_VLLM in p3.skipped["vLLM"] and not any("vLLM" in r for r in p3.runs)
    assert NO_BNB in p3.skipped["int8 and NF4 quantization"]
    assert any("vLLM" in r for r in full["03_inference_serving"].runs)
    assert p4.runs[0].startswith("transformers serve") and not p4.compile and NO_VLLM in p4.skipped["vLLM"]
    assert "bnb-4bit" not in p4.runs[1] and p4.skipped["bnb-4bit candidate"] == NO_BNB
    assert full["04_benchmarking_production"].runs[0].startswith("vLLM serving")
    assert NO_BNB in p1.skipped["4-bit QLoRA"] and "4-bit QLoRA" not in full["01_single_gpu"].skipped
    assert p4.peak[1] < full["04_benchmarking_production"].peak[1]  # no vLLM engines in the estimate
    _check(p4)
