"""Lab 03's answers: per graded cell, the names the grader reads from the notebook and their types.

The seam between the notebook and the grader (``grader/schema.py``): each value crosses as JSON and
is checked against its spec before any judge sees it. ``test_kv_calculator`` reads nothing here:
its function is run by the grader on drawn shapes in a sandbox (``judges.py``). The learner's
allocator and scheduler cross the same way, as the schedules they make in a sandbox, never as
objects; the notebook's model, decode paths and engine do not cross at all: the grader builds its
own (``reference.py``).
"""
from grader.labs import answers
from grader.schema import TIMING, Count, DictOf, Fields, Label, ListOf, Nullable, Number, Text

PATHS = ("eager", "static_compiled", "fast")  # utils.serving.decode.decode_paths, in the notebook's order
HALF = ("bf16", "fp16", "fp32")  # utils.model.quantize.reference_mode: the 16-bit dtype, fp32 on a CPU
QUANT_MODES = ("int8", "nf4")  # utils.model.quantize.QUANT_MODES

DECODE_PATH = Fields({"t1": TIMING, "tn": TIMING, "tpot_ms": Number("ms"), "tokens_per_s": Number("tokens/s"),
                      "bandwidth_gbs": Number("GB/s"), "copy_fraction": Number()},
                     label="{'t1', 'tn', 'tpot_ms', 'tokens_per_s', 'bandwidth_gbs', 'copy_fraction'}")
COPY = Fields({"gbs": Number("GB/s", positive=True), "bytes": Count(1), "time": TIMING, "numel": Count(1)},
              label="the dict inference.measure_copy_bandwidth returned")
GROWTH = Fields({"batch": Count(1), "prompt_len": Count(1), "tokens": ListOf(Count(1), min_len=2),
                 "bytes": ListOf(Number("bytes"), min_len=2), "bytes_per_step": Number("bytes"), "source": Text()},
                label="the dict inference.measure_kv_growth returned")
RUN = Fields({"requests": Count(1), "tokens": Count(1), "steps": Count(1), "busy_steps": Count(1),
              "admitted": DictOf(Count(), ListOf(Count())), "num_blocks": Count(1), "time": TIMING,
              "tokens_per_s": Number("tokens/s", positive=True)},
             label="the dict paged_batching.timed_runs returned")
QUANT_MODE = Fields({"weight_bytes": Count(1), "perplexity": Number(positive=True), "tokens_per_s": Number("tokens/s"),
                     "tpot_ms": Number("ms"), "source": Text()}, label="one mode's measurements from quantize.compare")
QUANT = Fields({"reference": Label(HALF), "skipped": Nullable(Text()),
                "modes": DictOf(Label(HALF + QUANT_MODES), QUANT_MODE)}, label="the dict quantize.compare returned")

ANSWERS = {
    "test_decode": answers(BYTES_PER_STEP=Number("bytes"), decode=DictOf(Label(PATHS), DECODE_PATH, keys=PATHS),
                           copy=COPY, copy_gbs=Number("GB/s")),
    "test_kv_calculator": {},
    "test_kv_growth": answers(growth=GROWTH, kv_predicted_bytes_per_step=Number("bytes"), kv_growth_error=Number()),
    "test_batching": answers(POOL_BLOCKS=Count(1), cont_run=RUN, static_run=RUN,
                             throughput_gain=Number("x", positive=True)),
    "test_quantization": answers(quant=QUANT, memory_saving=DictOf(Label(QUANT_MODES), Number("x")),
                                 perplexity_change=DictOf(Label(QUANT_MODES), Number())),
}
