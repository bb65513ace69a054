"""Lab 00's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``): each value crosses as JSON and
is checked against its spec before any judge sees it. A cell whose function is judged on hidden
cases (``test_intensity``, ``test_rates``, ``test_bound``, ``test_quantization``) reads nothing here:
its function is run by the grader in a sandbox instead (``judges.py``).
"""
from grader.labs import Answer, answers
from grader.schema import TIMING, Count, DictOf, Fields, Label, Nullable, Number, Text, TupleOf

LABELS = ("compute", "memory", "overhead")
KERNELS = ("matmul", "thin_matmul", "elementwise", "tiny_ops")
ROOFS = ("datasheet", "measured")  # the two rooflines each kernel is placed on

STATS = Fields({"mean": Nullable(Number()), "max": Nullable(Number())}, label="{'mean', 'max'}")
MONITOR_DEVICE = Fields({"duration_s": Number("s", at_least=0.0), "samples": Count(),
                         "util_gpu_pct": STATS, "util_mem_pct": STATS, "util_cpu_pct": STATS, "mem_used_gib": STATS,
                         "mem_total_gib": Nullable(Number("GiB"))},
                        optional=("util_gpu_pct", "util_mem_pct", "util_cpu_pct", "mem_used_gib", "mem_total_gib"),
                        label="one device's GpuMonitor summary")
STOPWATCH = Fields({"method": Text(), "steps": Count(1), "median_ms": Number("ms", positive=True),
                    "p20_ms": Number("ms", at_least=0.0), "p80_ms": Number("ms", at_least=0.0),
                    "total_s": Number("s", positive=True), "tokens_per_s": Nullable(Number("tokens/s"))},
                   label="the dict from stopwatch.summary()")
PAIR = TupleOf((Number(), Number()))

ANSWERS = {
    "test_intensity": {},
    "test_rates": {},
    "test_bound": {},
    "test_matmul": answers(matmul_tflops=Number("TFLOP/s"), matmul_time=TIMING, matmul_flops=Count(),
                           matmul_bytes=Count()),
    "test_memory": answers(copy_gbs=Number("GB/s"), copy_time=TIMING, ew_gbs=Number("GB/s"),
                           ew_tflops=Number("TFLOP/s"), ew_time=TIMING, ew_flops=Count(), ew_bytes=Count()),
    "test_roofline": answers(
        placements=DictOf(Label(ROOFS), DictOf(Label(KERNELS), Label(LABELS), keys=KERNELS), keys=ROOFS),
        kernels=DictOf(Label(KERNELS), PAIR, keys=KERNELS), CEILINGS=DictOf(Label(ROOFS), PAIR, keys=ROOFS),
        tiny_tflops=Number("TFLOP/s"), tiny_time=TIMING, tiny_flops=Count(), tiny_bytes=Count(),
        thin_tflops=Number("TFLOP/s"), thin_time=TIMING, thin_flops=Count(), thin_bytes=Count()),
    "test_training": answers(tokens_per_s=Number("tokens/s"), train=STOPWATCH,
                             monitor=Answer(DictOf(Text(), MONITOR_DEVICE), "monitor.summary()"),
                             monitor_s=Answer(Number("s", at_least=0.0), "monitor.duration_s")),
    "test_limiter": answers(LIMITER=Label(LABELS), batch_scaling=Number("x"), fixed_share=Number(),
                            step_tflops=Number("TFLOP/s"), mfu=Number(), full_time=TIMING, small_time=TIMING,
                            small_batch=Count(1), TRAIN_PEAK_TFLOPS=Number("TFLOP/s"), STEP_BYTES=Count(),
                            step_gbs=Number("GB/s"), bandwidth_share=Number(), TRAIN_PEAK_GBS=Number("GB/s")),
    "test_quantization": {},
    "test_sweep": answers(sweep_time=DictOf(Text(), TIMING), sweep_tflops=DictOf(Text(), Number("TFLOP/s")),
                          MAX_ACHIEVABLE_TFLOPS=Number("TFLOP/s"),
                          SWEEP_SHAPES=DictOf(Text(), TupleOf((Count(1), Count(1), Count(1)))), SM_COUNT=Count(1)),
}
