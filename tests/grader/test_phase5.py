"""The grader against the phase-5 notebook: real nbgrader runs on CPU (smoke mode), plus the
record-mode checks called directly.

One ``python -m grader autograde --jobs 2`` batch grades: the reference solution (full marks,
measured cells live), the untouched release (zero), and a hostile submission with a plausible
H100 measurement record (a restore that forgets Python's RNG, a patched ``utils.xla``, stderr
noise: exactly the resume and recompilation cells lose their points, which a record cannot
stand in for; the other measured cells are graded from the record). The record checks on a
plausible and an invented record run in this process, cell by cell. About two minutes on two
cores.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.nbcells import assert_release_clean, autograde
from tests.nbcells import cell as _cell
from tests.nbcells import messages as _messages
from tests.nbcells import scores as _scores
from tests.nbcells import src as _src

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = "05_hardware_and_cost"
SOURCE = ROOT / "grader" / "source" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RELEASE = ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb"
POINTS = {"test_speedup": 1, "test_points": 2, "test_cost_functions": 2, "test_measured_costs": 2, "test_right_sizing": 3,
          "test_beyond_gpus": 1, "test_resume": 3, "test_checkpoint_overhead": 2, "test_spot": 2, "test_recompiles": 3, "test_topology": 1,
          "test_pod_sharding": 2, "test_shard_bytes": 2}
FROM_RECORD = ("test_points", "test_measured_costs", "test_right_sizing", "test_checkpoint_overhead")
ALWAYS_LIVE = ("test_resume", "test_recompiles")
# per cell: a bound for a stuck cell, not a budget. The kill-and-resume cells run three training processes on
# shared cores, and a loaded CI machine makes that several times longer
# (docs/grading.md#cell-timeouts-from-the-machines-speed)
TIMEOUT_S = 600

pytestmark = pytest.mark.slow





def answered() -> dict:
    from grader.release import reference_submission

    return reference_submission(ASSIGNMENT)


def prepend(nb: dict, gid: str, code: str) -> None:
    c = _cell(nb, gid)
    c["source"] = code + "\n" + _src(c)


def h100_record(invented: bool = False) -> dict:
    """A measurement record as an H100 run of the notebook would write it: plausible numbers
    (below the datasheet, each derived number consistent with its raw fields), or invented
    ones (a matmul and decode above the datasheet, a checkpoint smaller than the model)."""
    from grader import phase5_records as R
    from utils import cost
    from utils.env import phase_sizes
    from utils.hardware import SPECS
    from utils.models import build_model
    from utils.record import Record, utils_hash

    s = phase_sizes(ASSIGNMENT, "h100")
    spec = SPECS["H100-SXM"]
    rec = Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1,
                              "compute_capability": "9.0", "torch": "2.11.0"}, utils_sha256=utils_hash())

    def t(ms):
        return {"median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01, "runs": 10}

    n = s.matmul_n
    mm_ms = 0.5 if invented else 1.4  # 0.5 ms is 2200 TFLOP/s, over twice the H100's bf16 peak
    rec.add("matmul_tflops", 2 * n**3 / (mm_ms * 1e-3) / 1e12, "TFLOP/s", "cuda_events", 0.02, n=n, dtype="bfloat16",
            flops=2 * n**3, **t(mm_ms))
    copy_ms = 0.716
    rec.add("copy_gbs", 8 * s.copy_numel / (copy_ms * 1e-3) / 1e9, "GB/s", "cuda_events", 0.02, bytes=8 * s.copy_numel,
            **t(copy_ms))
    tps_train = 60e3
    rec.add("train_samples_per_s", tps_train / s.seq_len, "samples/s", "cuda_events", None, tokens_per_s=tps_train,
            batch=s.train_batch, seq_len=s.seq_len, model=s.model, steps=28, total_s=28 * 16 * 1024 / tps_train,
            median_ms=273.0, p20_ms=270.0, p80_ms=276.0)
    weights = R.weight_bytes(build_model(s.model, device="meta"))
    tpot, tps = {}, {}
    for b, ms in zip(s.decode_batches, (8.0, 8.5, 10.0, 15.0), strict=True):
        if invented:
            ms /= 100  # 0.08 ms per step reads 0.5 GB of weights: 6 TB/s, above the 3.35 TB/s datasheet
        t1 = 12.0
        tn = t1 + ms * (s.new_tokens - 1)
        tpot[b], tps[b] = ms, b * 1e3 / ms
        rec.add(f"decode_b{b}", tps[b], "tokens/s", "cuda_events", 0.02, batch=b, tpot_ms=ms, new_tokens=s.new_tokens,
                prompt_len=s.prompt_len, model=s.model, weight_bytes=weights, t1=t(t1), tn=t(tn))
    row, price = R.device_price(spec)
    best = max(s.decode_batches)
    rec.add("usd_per_sample", cost.cost_per_sample_usd(tps_train / s.seq_len, price), "USD", "", None, price_row=row,
            usd_per_gpu_hour=price, samples_per_s=tps_train / s.seq_len)
    rec.add("usd_per_million_tokens", cost.cost_per_million_tokens_usd(tps[best], price), "USD", "", None, price_row=row,
            usd_per_gpu_hour=price, batch=best, tokens_per_s=tps[best])
    slo, demand = R.slo_and_demand(tpot, tps)
    cands = R.reference_candidates(tpot, spec.bandwidth_gbs, weights, spec)
    ans = cost.right_size(cands, latency_slo_ms=slo, demand_per_s=demand)
    rec.add("right_sizing_usd_per_hour", ans.usd_per_hour, "USD/h", "", None, choice=ans.choice.name, n_gpus=ans.n_gpus,
            slo_ms=slo, demand_per_s=demand, my_bandwidth_gbs=spec.bandwidth_gbs, bytes_per_step=weights,
            candidates=[R._as_dict(c) for c in cands])
    step, sync, block = 300.0, 1500.0, 200.0
    rec.add("checkpoint_sync_save_ms", sync, "ms", "perf_counter+sync", 0.02, step=t(step), sync_save=t(sync),
            async_blocking=t(block), async_total=t(1600.0), every=s.ckpt_every, model=s.ckpt_model,
            checkpoint_bytes=(1e6 if invented else 3.02 * weights), sync_pct=100 * sync / (s.ckpt_every * step),
            async_pct=100 * block / (s.ckpt_every * step))
    rec.add("jax_compile_ms", 180.0, "ms", "", None, run_ms=0.2, eager_ms=0.9, compiles_unpadded=9, compiles_bucketed=4)
    rec.add("resume_identical", 1.0, "bool", "", None, differing=[], killed_after_step=6, resumed_from=4)
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
    rng = _cell(hostile, "rng_answer")
    rng["source"] = _src(rng).replace('    random.setstate(state["python"])\n', "")
    prepend(hostile, "xla_answer", "\n".join([
        "import sys, warnings, utils.xla as _x",
        "warnings.warn('a learner warning'); print('learner debug output', file=sys.stderr)",
        "_real = _x.count_compiles",
        "def _counted(fn, calls, **kw):",
        "    r = _real(fn, calls, **kw)",
        "    r.compiles = r.distinct_shapes",
        "    return r",
        "_x.count_compiles = _counted"]))
    put("hostile", hostile)  # with a plausible GPU record: its measured cells are graded from that
    (subs / "hostile.record.json").write_text(json.dumps(h100_record()))

    # --no-screen: the patched utils.xla tests the defences inside the kernel, behind the screen
    return autograde(ROOT, ASSIGNMENT, subs, out, "--no-screen", jobs=2, timeout_s=TIMEOUT_S)


def test_reference_scores_full_marks_measured_live(graded_reference):
    r = graded_reference(ASSIGNMENT)["result"]  # graded once per session, beside a busy core (tests/conftest.py)
    assert r["status"] == "ok"
    assert _scores(r) == POINTS, _messages(r)
    assert r["score"] == r["max_score"] == sum(POINTS.values())
    assert all(c["mode"] == "measured live" for c in r["cells"] if c["cell"] in FROM_RECORD + ALWAYS_LIVE)


def test_release_scores_zero(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 for c in r["cells"])


def test_hostile_submission_with_a_gpu_record_loses_exactly_the_cells_it_broke(batch):
    # a restore that forgets Python's RNG, a patched utils.xla, stderr noise; an H100 record
    r = batch["results"]["hostile"]
    scores = _scores(r)
    assert scores["test_resume"] == 0 and scores["test_recompiles"] == 0, _messages(r)
    assert all(scores[c] == p for c, p in POINTS.items() if c not in ("test_resume", "test_recompiles")), _messages(r)
    msgs = _messages(r)
    assert "python" in msgs.split("test_resume:")[1]  # the generator it forgot is named
    assert "utils.xla.count_compiles" in msgs
    modes = {c["cell"]: c["mode"] for c in r["cells"]}
    assert all(modes[c] == "graded from record" for c in FROM_RECORD), modes
    assert modes["test_recompiles"] == "measured live", modes  # a record cannot stand in for the counts
    html = (batch["out"] / "feedback" / "hostile" / f"{ASSIGNMENT}.html").read_text()
    assert "graded from record" in html and "NVIDIA H100 80GB HBM3" in html


def test_the_screen_holds_the_patched_module_before_it_runs(batch):
    from grader.screen import screen_notebook

    release = json.loads(RELEASE.read_text())
    found = screen_notebook(json.loads((batch["subs"] / "hostile.ipynb").read_text()), release)
    assert [f.code for f in found] == ["_x.count_compiles"], found
    assert screen_notebook(answered(), release) == []


def test_grades_csv_lists_every_submission(batch):
    assert set(batch["rows"]) == {"release", "hostile"}
    assert float(batch["rows"]["release"]["max_score"]) == sum(POINTS.values())


# -- record mode, called directly ---------------------------------------------------------------

@pytest.fixture()
def phase5(phase):
    return functools.partial(phase, 5)


def _reference_functions() -> dict:
    """The solution's functions, compiled from the source notebook's answer cells."""
    ns = {"math": __import__("math"), "hardware": __import__("utils.hardware", fromlist=["x"])}
    src = json.loads(SOURCE.read_text())
    for gid in ("cost_functions", "estimate_answer", "overhead_answer"):
        text = _src(_cell(src, gid)).split("### BEGIN SOLUTION\nstep_ms")[0]
        exec(compile(text, gid, "exec"), ns)  # noqa: S102 (the course's own solution cells)
    return ns


def test_plausible_record_passes_every_record_check(phase5, capsys):
    p5, f = phase5(h100_record()), _reference_functions()
    assert p5.checks.grading_mode() == p5.checks.RECORD
    p5.check_points(None, None, None, None)
    p5.check_measured_costs(None, None, None, None, None, f["cost_per_sample_usd"], f["cost_per_million_tokens_usd"],
                            None, None, None, None, None)
    p5.check_right_sizing(f["estimate_tpot_ms"], *([None] * 9))
    p5.check_checkpoint_overhead(f["checkpoint_overhead_pct"], None, None, None)
    out = capsys.readouterr().out
    assert out.count("graded from record") == 4 and "no GPU" in out


@pytest.mark.parametrize("cell, match", [
    ("points", "not physically possible"),
    ("costs", "not physically possible"),
    ("right_sizing", "not physically possible"),
    ("overhead", "less than weights and AdamW"),
])
def test_invented_record_is_caught(phase5, cell, match):
    p5, f = phase5(h100_record(invented=True)), _reference_functions()
    calls = {
        "points": lambda: p5.check_points(None, None, None, None),
        "costs": lambda: p5.check_measured_costs(None, None, None, None, None, f["cost_per_sample_usd"],
                                                 f["cost_per_million_tokens_usd"], None, None, None, None, None),
        "right_sizing": lambda: p5.check_right_sizing(f["estimate_tpot_ms"], *([None] * 9)),
        "overhead": lambda: p5.check_checkpoint_overhead(f["checkpoint_overhead_pct"], None, None, None),
    }
    with pytest.raises(AssertionError, match=match):
        calls[cell]()


def test_record_from_another_utils_is_refused(phase5):
    rec = h100_record()
    rec["utils_sha256"] = "0" * 64
    p5 = phase5(rec)
    with pytest.raises(AssertionError, match="different utils/"):
        p5.check_points(None, None, None, None)


def test_wrong_learner_arithmetic_fails_the_pure_checks(phase5):
    p5, f = phase5(None), _reference_functions()
    p5.check_cost_functions(f["cost_per_sample_usd"], f["cost_per_million_tokens_usd"])
    with pytest.raises(AssertionError, match="cost_per_million_tokens_usd"):
        p5.check_cost_functions(f["cost_per_sample_usd"], lambda tps, usd: usd * 1e6 / tps / 60)
    with pytest.raises(AssertionError, match="never finishes: return math.inf"):
        p5.check_spot(lambda w, usd, tau, d, r, lam: w * (1 + d / tau) / max(1e-9, 1 - lam * (tau / 2 + r)) * usd)
    with pytest.raises(AssertionError, match="slowest_gpu_link"):
        p5.check_topology(lambda topo: topo.link("GPU0", "GPU1"))
    with pytest.raises(AssertionError, match="attainable_speedup"):
        p5.check_speedup(lambda i, a, b, dtype="bf16": b.peak_tflops(dtype) / a.peak_tflops(dtype))
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        p5.check_speedup(lambda i, a, b, dtype="bf16": 1 / 0)


def test_beyond_gpus_takes_the_right_numbers_or_fails(phase5):
    """The pure check on the exercise's inputs: the answer as the notebook builds it passes, and
    each wrong choice of input (the largest batch's TPOT, a 30-day month, half the weights, another
    bandwidth, a hand-made result) fails with what is wrong."""
    from utils import accelerators

    p5 = phase5(None)
    decode = {1: {"tpot_ms": 9.0}, 4: {"tpot_ms": 10.0}, 16: {"tpot_ms": 14.0}}
    slo, demand, nbytes, bw = 12.5, 4000.0, 2.5e8, 300.0
    month = demand * 730 * 3600

    def beyond(batch=4, tokens=month, model_bytes=nbytes, bandwidth=bw):
        return accelerators.cheapest_for_slo(measured_tpot_ms=decode[batch]["tpot_ms"], batch_size=batch,
                                             slo_tpot_ms=slo, output_tokens_per_month=tokens,
                                             model_bytes=model_bytes, measured_bandwidth_gbs=bandwidth)

    p5.check_beyond_gpus(beyond(), month, decode, slo, demand, nbytes, bw)
    with pytest.raises(AssertionError, match="MONTHLY_TOKENS"):
        p5.check_beyond_gpus(beyond(tokens=demand * 720 * 3600), demand * 720 * 3600, decode, slo, demand, nbytes, bw)
    with pytest.raises(AssertionError, match="demand"):
        p5.check_beyond_gpus(beyond(tokens=demand * 720 * 3600), month, decode, slo, demand, nbytes, bw)
    with pytest.raises(AssertionError, match="b4: its TPOT at batch 4|scaled TPOT"):
        p5.check_beyond_gpus(beyond(batch=16), month, decode, slo, demand, nbytes, bw)
    with pytest.raises(AssertionError, match="measured bandwidth"):
        p5.check_beyond_gpus(beyond(bandwidth=2 * bw), month, decode, slo, demand, nbytes, bw)
    big = 4e10  # 40 GB of weights: chips of 16 to 32 GB no longer hold it
    with pytest.raises(AssertionError, match="qualifies"):
        p5.check_beyond_gpus(beyond(model_bytes=big / 2), month, decode, slo, demand, big, bw)
    with pytest.raises(AssertionError, match="BEYOND must be what accelerators.cheapest_for_slo returns"):
        p5.check_beyond_gpus({"cheapest": "inf2"}, month, decode, slo, demand, nbytes, bw)


# -- release --------------------------------------------------------------------------------------

def test_release_is_current_and_leaks_nothing():
    markers = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "_p5.check_", "random.setstate")
    assert_release_clean(ASSIGNMENT, RELEASE, SOURCE, markers, POINTS)
