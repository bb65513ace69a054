"""Lab 01's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``): each value crosses as JSON and
is checked against its spec before any judge sees it. Course objects cross as their fields: the
naive loop's ``LoopConfig`` (``naive.config``), the profile (a ``ProfileSummary``), the LoRA recipes
(``FinetuneRecipe``), the audit of the optimized loop (``audited.report``). The cells whose functions
are judged on hidden cases (``test_rates``, ``test_unseen``) read nothing here: the grader runs the
learner's functions in a sandbox instead (``judges.py``).
"""
from grader.labs import Answer, answers
from grader.schema import Count, DictOf, Fields, Flag, Label, ListOf, Nullable, Number, Text

BOTTLENECKS = ("data-loading-bound", "copy-bound", "host-sync-bound", "overhead-bound (launch/Python)",
               "idle GPU, cause not named", "compute-bound", "memory-bound", "cpu-bound (no GPU in the trace)")
FIXES = ("num_workers", "pin_memory", "non_blocking", "sync_every_step", "batch_size", "compile_mode", "fused_adamw",
         "precision")  # the LoopConfig fields a first fix names (the notebook's table)
CAUSES = ("autocast", "eval_mode", "reentrant_checkpointing", "fp32_upcast")
PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "reentrant", "non-reentrant")

FRACTION = Number(at_least=0.0, at_most=1.0)
MS = Number("ms", at_least=0.0)
STATS = Fields({"mean": Nullable(Number()), "max": Nullable(Number())}, label="{'mean', 'max'}")
MONITOR_DEVICE = Fields({"duration_s": Number("s", at_least=0.0), "samples": Count(),
                         "util_gpu_pct": STATS, "util_mem_pct": STATS, "util_cpu_pct": STATS, "mem_used_gib": STATS,
                         "mem_total_gib": Nullable(Number("GiB"))},
                        optional=("util_gpu_pct", "util_mem_pct", "util_cpu_pct", "mem_used_gib", "mem_total_gib"),
                        label="one device's GpuMonitor summary")
STOPWATCH = Fields({"method": Text(), "steps": Count(1), "median_ms": Number("ms", positive=True),
                    "p20_ms": MS, "p80_ms": MS, "total_s": Number("s", positive=True),
                    "tokens_per_s": Nullable(Number("tokens/s"))},
                   label="the dict from stopwatch.summary()")
LOOP_CONFIG = Fields({"batch_size": Count(1), "seq_len": Count(1), "precision": Label(PRECISIONS),
                      "num_workers": Count(), "pin_memory": Flag(), "non_blocking": Flag(), "sync_every_step": Flag(),
                      "compile_mode": Nullable(Text()), "fused_adamw": Flag(), "grad_accum": Count(1),
                      "checkpointing": Flag(), "pad_vocab_to": Count(1), "dropout": Nullable(Number()),
                      "lr": Number(positive=True)}, label="a training.LoopConfig")
OPSTAT = Fields({"name": Text(), "calls": Count(), "total_ms": MS, "share": Number(at_least=0.0)},
                label="an OpStat of a ProfileSummary's top list")
PROFILE = Fields({"device": Label(("cuda", "cpu")), "steps": Count(1), "step_time_ms": Number("ms", positive=True),
                  "cpu_step_ms": MS, "gpu_idle_fraction": Nullable(FRACTION), "gpu_busy_ms_per_step": Nullable(MS),
                  "mean_kernel_us": Nullable(Number("us", at_least=0.0)), "matmul_share": Nullable(FRACTION),
                  "loader_wait_ms_per_step": MS, "loader_wait_fraction": Number(at_least=0.0),
                  "h2d_copies_per_step": Number(at_least=0.0), "h2d_bytes_per_step": Number(at_least=0.0),
                  "h2d_ms_per_step": MS, "h2d_copies_by_source": DictOf(Text(), Number(at_least=0.0)),
                  "launches_per_step": Number(at_least=0.0), "host_syncs_per_step": Number(at_least=0.0),
                  "sync_wait_ms_per_step": MS, "cpu_work_ms_per_step": MS, "top_label": Text(),
                  "top": ListOf(OPSTAT, max_len=100), "diagnosis": Label(BOTTLENECKS), "explanation": Text(),
                  "suggestion": Text(), "findings": ListOf(Label(BOTTLENECKS), max_len=len(BOTTLENECKS)),
                  "trace_path": Nullable(Text())},
                 optional=("trace_path",), label="the ProfileSummary that utils.diagnosis.profiling.profile_steps returned")
OPT_ROW = Fields({"tokens_per_s": Number("tokens/s", positive=True), "median_ms": Number("ms", positive=True),
                  "p20_ms": MS, "p80_ms": MS, "steps": Count(1), "method": Text(), "mfu": Nullable(Number()),
                  "tokens_per_step_claimed": Count(1), "tokens_per_step_counted": Number(at_least=0.0)},
                 label="the dict audited.measure(...) returned")
AUDIT = Fields({"steps": Count(1), "warmup_steps": Count(), "precision": Label(PRECISIONS),
                "tokens_per_step_claimed": Count(1), "tokens_per_step_counted": ListOf(Count(), max_len=1000),
                "steps_that_updated": Count(), "host_syncs": Count(), "reference_host_syncs": Count(),
                "fixed_loss_before": Number(), "fixed_loss_after": Number(), "reference_fixed_loss_before": Number(),
                "reference_fixed_loss_after": Number(), "first_loss_reported": Number(), "first_loss_grader": Number()},
               label="the report of loop_audit.audit(FastLoop, ...)")
RECIPE = Fields({"quant": Label(("none", "nf4")), "checkpointing": Label(CHECKPOINTING), "autocast": Flag(),
                 "prepare_kbit": Flag(), "lora_r": Count(1), "lora_alpha": Number(positive=True),
                 "target_modules": Text(), "train_mode": Flag()}, label="a training.FinetuneRecipe")
GIB = Number("GiB", at_least=0.0)
FINETUNE = Fields({"recipe": RECIPE, "quant": Label(("none", "nf4")), "note": Text(), "peak_gib": GIB,
                   "weights_gib": GIB, "optimizer_gib": GIB, "gradients_gib": GIB, "activations_gib": GIB,
                   "lora_grads_ok": Flag(), "peak_source": Text()},
                  label="the dict training.measure_finetune returned")

ANSWERS = {
    "test_rates": {},
    "test_baseline": answers(baseline_tps=Number("tokens/s", positive=True), baseline=STOPWATCH,
                             naive_preset=Answer(Text(), "naive.preset"),
                             naive_config=Answer(LOOP_CONFIG, "naive.config"),
                             naive_tokens_per_step=Answer(Count(1), "naive.tokens_per_step"),
                             monitor=Answer(DictOf(Text(), MONITOR_DEVICE), "monitor.summary()"),
                             monitor_s=Answer(Number("s", at_least=0.0), "monitor.duration_s")),
    "test_diagnosis": answers(profile=PROFILE, BOTTLENECK=Label(BOTTLENECKS), FIRST_FIX=Nullable(Label(FIXES))),
    "test_unseen": {},
    "test_optimized": answers(speedup=Number("x", positive=True), optimized_tps=Number("tokens/s", positive=True),
                              baseline_tps=Number("tokens/s", positive=True), opt_row=OPT_ROW,
                              audit=Answer(AUDIT, "audited.report")),
    "test_finetune": answers(LEAN_LORA=RECIPE, LEAN_QLORA=RECIPE, lora_peak_gib=GIB, qlora_peak_gib=GIB,
                             lora=FINETUNE, qlora=FINETUNE),
    "test_cause": answers(CAUSE=Label(CAUSES), trap_peak_gib=GIB, lean_peak_gib=GIB),
}
