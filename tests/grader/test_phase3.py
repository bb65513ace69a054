"""The grader against the phase-3 notebook: real nbgrader runs on CPU (smoke mode), plus the
record-mode and tamper checks called directly.

One ``python -m grader autograde --jobs 2`` batch grades: the reference solution (full marks,
measured cells live), the untouched release (zero), and a hostile submission with a plausible
H100 measurement record (a calculator that stores fp8 in two bytes, stderr noise in an answer
cell): it loses exactly the calculator, which is always checked live; the measured cells are
graded from the record. The record checks on a plausible and on invented records, the pure
checks on wrong arithmetic, and the tamper check on a patched ``utils.decode`` run in this
process. About two minutes on two cores.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from tests.nbcells import assert_release_clean, autograde
from tests.nbcells import cell as _cell
from tests.nbcells import messages as _messages
from tests.nbcells import scores as _scores
from tests.nbcells import src as _src

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "03_inference_serving"
SOURCE = ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_decode": 4, "test_kv_calculator": 3, "test_kv_growth": 3, "test_batching": 4, "test_quantization": 2}
FROM_RECORD = ("test_decode", "test_kv_growth", "test_quantization")
TIMEOUT_S = 900  # per cell: the serving cell starts vLLM's CPU build (50-110 s alone, more beside other kernels)

pytestmark = pytest.mark.slow


def answered() -> dict:
    from grader.release import reference_submission

    return reference_submission(ASSIGNMENT)


def h100_record(invented: str | None = None) -> dict:
    """What an H100 run of the notebook writes (through ``phase3.save_record``), with plausible
    numbers; ``invented`` makes one part impossible: ``"decode"`` (6.9 TB/s of decode on a
    3.35 TB/s card), ``"kv"`` (the cache grows a third more than the calculator says) or
    ``"quant"`` (a 4-bit model saving 1.5x)."""
    from grader import phase3_records as phase3
    from utils import inference, kvcache
    from utils.env import phase_sizes
    from utils.models import build_model
    from utils.record import utils_hash
    from utils.timing import TimingResult

    s = phase_sizes(ASSIGNMENT, "h100")
    model = build_model(s.model, dtype="bf16", device="meta")

    def t(ms):
        return TimingResult.from_times([0.99 * ms, ms, 1.01 * ms], "cuda_events")

    wbr = inference.weight_bytes_read_per_step(model)
    kvt = kvcache.bytes_per_token(inference.kv_spec(model))
    ctx = inference.mean_context_len(s.prompt_len, s.new_tokens)
    bps = inference.decode_bytes_per_step(wbr, kvt, 1, ctx)
    copy_bytes = 8 * s.copy_numel
    copy_gbs = copy_bytes / (t(0.7158).median_ms * 1e-3) / 1e9
    decode = {}
    for name, tpot in (("eager", 50.0), ("static_compiled", 6.0), ("fast", 0.3 if invented == "decode" else 1.3)):
        t1, tn = t(12.0), t(12.0 + tpot * (s.new_tokens - 1))
        tp = (tn.median_ms - t1.median_ms) / (s.new_tokens - 1)
        gbs = bps * (1e3 / tp) / 1e9
        decode[name] = {"t1": t1, "tn": tn, "tpot_ms": tp, "tokens_per_s": 1e3 / tp, "bandwidth_gbs": gbs,
                        "copy_fraction": gbs / copy_gbs}
    pred = 4 * kvt
    measured = pred * (4 / 3 if invented == "kv" else 1.0)
    growth = {"bytes_per_step": measured, "source": "torch.cuda.memory_allocated", "tokens": [129, 192],
              "bytes": [0, 63 * measured], "batch": s.kv_batch}
    ref_bytes = inference.weight_bytes(model) + 16384
    wb = {"bf16": ref_bytes, "int8": 1.23e9, "nf4": 1.5e9 if invented == "quant" else 0.762e9}
    ppl = {"bf16": 32100.0, "int8": 32150.0, "nf4": 32400.0}
    quant = {"reference": "bf16", "skipped": None,
             "modes": {m: {"weight_bytes": wb[m], "perplexity": ppl[m], "tokens_per_s": 16.0, "tpot_ms": 62.5,
                           "source": "torch.cuda.memory_allocated"} for m in wb}}
    ns = {"SIZES": s, "model": model, "copy": {"gbs": copy_gbs, "bytes": copy_bytes, "time": t(0.7158)},
          "copy_gbs": copy_gbs, "decode": decode, "BYTES_PER_STEP": bps, "WEIGHT_BYTES_READ": wbr,
          "KV_BYTES_PER_TOKEN": kvt, "CONTEXT_LEN": ctx, "growth": growth, "kv_predicted_bytes_per_step": pred,
          "kv_growth_error": measured / pred - 1, "quant": quant,
          "memory_saving": {m: wb["bf16"] / wb[m] for m in ("int8", "nf4")},
          "perplexity_change": {m: ppl[m] / ppl["bf16"] - 1 for m in ("int8", "nf4")},
          "ttft": {n: t(0.01 * n) for n in s.ttft_lens},
          "sweep": [{"batch": 1, "tokens_per_s": 769.0, "tpot_ms": 1.3, "ttft_ms": 12.0, "warmup_s": 60.0}]}
    import tempfile

    path = Path(tempfile.mkdtemp()) / "r.json"
    rec = phase3.save_record(ns, path)
    rec.fingerprint = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, "compute_capability": "9.0",
                       "torch": "2.11.0"}
    rec.utils_sha256 = utils_hash()
    return rec.to_dict()


# -- the batch ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")

    def put(name: str, nb: dict) -> None:
        (subs / f"{name}.ipynb").write_text(json.dumps(nb, indent=1))

    put("release", json.loads(RELEASE.read_text()))  # the reference: graded_reference (tests/conftest.py)
    hostile = answered()
    calc = _cell(hostile, "kv_calculator_answer")
    assert '"fp8": 1' in _src(calc)
    calc["source"] = _src(calc).replace('"fp8": 1', '"fp8": 2')
    growth = _cell(hostile, "growth_answer")
    growth["source"] = "import sys, warnings\nwarnings.warn('a learner warning'); print('debug', file=sys.stderr)\n" + _src(growth)
    put("hostile", hostile)  # with a plausible GPU record: its measured cells are graded from that
    (subs / "hostile.record.json").write_text(json.dumps(h100_record()))

    return autograde(ROOT, ASSIGNMENT, subs, out, jobs=2, timeout_s=TIMEOUT_S, wait_s=2400)


def test_reference_scores_full_marks_measured_live(graded_reference):
    r = graded_reference(ASSIGNMENT)["result"]  # graded once per session, beside a busy core (tests/conftest.py)
    assert r["status"] == "ok"
    assert _scores(r) == POINTS, _messages(r)
    assert r["score"] == r["max_score"] == sum(POINTS.values())
    assert all(c["mode"] == "measured live" for c in r["cells"] if c["cell"] in FROM_RECORD)


def test_release_scores_zero(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 for c in r["cells"])


def test_hostile_submission_with_a_gpu_record_loses_exactly_the_calculator(batch):
    r = batch["results"]["hostile"]
    scores = _scores(r)
    assert scores["test_kv_calculator"] == 0, _messages(r)
    assert all(scores[c] == p for c, p in POINTS.items() if c != "test_kv_calculator"), _messages(r)
    assert "fp8" in _messages(r).split("test_kv_calculator:")[1]
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "graded from record" for c in FROM_RECORD), modes
    html = (batch["out"] / "feedback" / "hostile" / f"{ASSIGNMENT}.html").read_text()
    assert "graded from record" in html and "NVIDIA H100 80GB HBM3" in html


def test_grades_csv_lists_every_submission(batch):
    assert set(batch["rows"]) == {"release", "hostile"}
    assert float(batch["rows"]["release"]["max_score"]) == sum(POINTS.values())


# -- record mode and pure checks, called directly -----------------------------------------------

@pytest.fixture()
def phase3(phase):
    return functools.partial(phase, 3)


def _reference_functions() -> dict:
    """The solution's functions, compiled from the source notebook's answer cells."""
    ns = {"math": math}
    src = json.loads(SOURCE.read_text())
    exec(compile(_src(_cell(src, "kv_calculator_answer")).split("\nEXAMPLES")[0], "calc", "exec"), ns)  # noqa: S102
    exec(compile(_src(_cell(src, "decode_answer")).split("\n### BEGIN SOLUTION\nBYTES")[0], "bytes", "exec"), ns)  # noqa: S102
    return ns


def test_plausible_record_passes_every_record_check(phase3, capsys):
    p3, f = phase3(h100_record()), _reference_functions()
    assert p3.checks.grading_mode() == p3.checks.RECORD
    p3.check_decode(f["bytes_per_decode_step"], *([None] * 5))
    p3.check_kv_growth(f["kv_cache_calculator"], *([None] * 4))
    p3.check_quantization(None, None, None)
    out = capsys.readouterr().out
    assert out.count("graded from record") == 3 and "no GPU" in out and "nf4 2.89x smaller" in out


@pytest.mark.parametrize("invented, cell, match", [
    ("decode", "decode", "not physically possible"),
    ("kv", "kv", "more than 2% apart"),
    ("quant", "quant", "below the 2.5x"),
])
def test_invented_record_is_caught(phase3, invented, cell, match):
    p3, f = phase3(h100_record(invented)), _reference_functions()
    calls = {"decode": lambda: p3.check_decode(f["bytes_per_decode_step"], *([None] * 5)),
             "kv": lambda: p3.check_kv_growth(f["kv_cache_calculator"], *([None] * 4)),
             "quant": lambda: p3.check_quantization(None, None, None)}
    with pytest.raises(AssertionError, match=match):
        calls[cell]()


def test_record_from_another_utils_is_refused(phase3):
    rec = h100_record()
    rec["utils_sha256"] = "0" * 64
    p3, f = phase3(rec), _reference_functions()
    with pytest.raises(AssertionError, match="different utils/"):
        p3.check_decode(f["bytes_per_decode_step"], *([None] * 5))


def test_wrong_learner_arithmetic_fails_the_pure_checks(phase3):
    p3, f = phase3(None), _reference_functions()
    p3.check_kv_calculator(f["kv_cache_calculator"])
    calc = f["kv_cache_calculator"]

    def per_query_head(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size=16):
        return calc(layers, kv_heads * 4, head_dim, dtype, batch, context, gib, block_size)  # as if MHA

    def whole_model_pages(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size=16):
        r = dict(calc(layers, kv_heads, head_dim, dtype, batch, context, gib, block_size))
        r["max_concurrency"] = r["num_blocks"] * block_size / context  # vLLM's old token formula
        return r

    for wrong, match in ((per_query_head, "bytes_per_token"), (whole_model_pages, "max_concurrency"),
                         (lambda *a, **k: 1 / 0, "raised ZeroDivisionError")):
        with pytest.raises(AssertionError, match=match):
            p3.check_kv_calculator(wrong)
    with pytest.raises(AssertionError, match="bytes_per_decode_step"):
        p3._bytes_grid(lambda w, kv, b, ctx: w + ctx * kv)  # forgets the batch


def test_live_decode_check_catches_a_patched_utils_decode(phase3, monkeypatch):
    import torch

    from utils import decode, inference
    from utils.env import phase_sizes
    from utils.models import build_model

    p3, f = phase3(None), _reference_functions()
    s = phase_sizes(ASSIGNMENT, "cpu")
    torch.manual_seed(0)
    model = build_model(s.model).eval()
    prompt = torch.randint(1, 4000, (1, s.prompt_len))
    paths = decode.decode_paths(model, prompt, s.new_tokens, warmup=False)
    bps = f["bytes_per_decode_step"](inference.weight_bytes_read_per_step(model), 1024, 1,
                                     inference.mean_context_len(s.prompt_len, s.new_tokens))
    swapped = dict(paths, eager=decode.DecodePath("eager", model, prompt, paths["fast"].run, False))
    with pytest.raises(AssertionError, match=r"paths\['eager'\].run is not the function decode.eager_path made"):
        p3.check_decode(f["bytes_per_decode_step"], bps, {}, swapped, model, 1.0)
    monkeypatch.setattr(decode, "hf_generate", lambda *a, **k: None)  # a "faster" eager generate
    with pytest.raises(AssertionError, match="utils.decode.hf_generate"):
        p3.check_decode(f["bytes_per_decode_step"], bps, {}, paths, model, 1.0)


# -- release --------------------------------------------------------------------------------------

def test_release_is_current_and_leaks_nothing():
    markers = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "_p3.check_", "page_bytes", "allocator.num_free() - owed")
    assert_release_clean(ASSIGNMENT, RELEASE, SOURCE, markers, POINTS)
