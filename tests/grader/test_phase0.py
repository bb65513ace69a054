"""The grader against the phase-0 notebook: real nbgrader runs on CPU (smoke mode).

One ``python -m grader autograde --jobs 2`` batch grades every submission built below and
the assertions share it: the reference solution, the untouched release, hostile and broken
notebooks, four with one wrong roofline placement each, and two measurement records from a
"GPU" (one plausible, one invented). Then ``python -m grader check`` and ``release --check``
run as a self-study reader and CI would. The whole file took 6.7 minutes on the 2-core test
machine with another job running beside it (``pytest tests/grader/test_phase0.py``), before the
matmul sweep's two cells were added; with them, 19.6 minutes there on 2026-12-03 while other jobs
kept the load average between 8 and 19.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nbcells import autograde
from tests.nbcells import cell as _cell
from tests.nbcells import gid as _gid
from tests.nbcells import messages as _messages
from tests.nbcells import scores as _scores
from tests.nbcells import src as _src

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grader" / "source" / "00_foundations" / "00_foundations.ipynb"
RELEASE = ROOT / "notebooks" / "00_foundations.ipynb"
PURE = {"test_intensity": 1.0, "test_rates": 2.0, "test_bound": 2.0, "test_quantization": 2.0}
MEASURED = ("test_matmul", "test_memory", "test_roofline", "test_training", "test_limiter", "test_sweep")
AUTO, MANUAL = 20, 4  # automatic points; the two written answers' points
# one wrong placement a notebook, each kernel once, both rooflines and both wrong labels among them
# (which: the first or second label other than the right one); tests/grader/test_phase0_roofline.py
# tries every wrong placement on the check itself
# one wrong placement graded through the real grader (a whole notebook each, so one); every wrong
# placement of every kernel on both rooflines is caught by direct calls (test_phase0_roofline.py)
MISPLACED = (("measured", "thin_matmul", 1),)
TIMEOUT_S = 40  # per cell: the infinite loop costs this much; a legit smoke cell takes a few seconds, more beside other jobs

pytestmark = pytest.mark.slow


# -- building submissions -------------------------------------------------------------------

def _load(path: Path) -> dict:
    return json.loads(path.read_text())





def _cells(r: dict) -> dict:
    return {c["cell"]: c for c in r["cells"]}


def answered() -> dict:
    """The released notebook with the reference answers typed into its answer cells."""
    from grader.release import reference_submission

    return reference_submission("00_foundations")


def scratch(code: str, cid: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": cid, "metadata": {}, "outputs": [], "source": code}


def insert_after(nb: dict, gid: str, cell: dict) -> None:
    i = next(i for i, c in enumerate(nb["cells"]) if _gid(c) == gid)
    nb["cells"].insert(i + 1, cell)


def prepend(nb: dict, gid: str, code: str) -> None:
    c = _cell(nb, gid)
    c["source"] = code + "\n" + _src(c)


H100_SXM_BF16 = (989.0, 3350.0)  # utils.hardware's H100-SXM row (datasheet): bf16 TFLOP/s, GB/s


def gpu_record(invented: bool = False, placements: dict | None = None) -> dict:
    """A measurement record as an H100 run of the notebook would write it.

    Plausible numbers (below the H100 datasheet, consistent with each other), or invented
    ones: above the datasheet, and a throughput that does not follow from its own step times.
    The plausible matmul and copy put the measured ridge (229 FLOP/B) below the thin matmul's
    241 and the datasheet's (295) above it: compute-bound on one roofline, memory-bound on the
    other. ``placements`` (roof -> kernel -> label) replaces the right ones."""
    from utils.flops import bound, flops_per_token_from_config, step_bound
    from utils.models import preset_config
    from utils.record import Record, utils_hash

    rec = Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1,
                              "compute_capability": "9.0", "torch": "2.11.0"}, utils_sha256=utils_hash())
    n, k, numel, ops = 8192, 256, 1 << 28, 2000
    mm_ms, copy_ms, ew_ms, tiny_ms, full_ms = (0.3, 0.2, 0.21, 12.0, 50.0) if invented else (1.6, 0.716, 0.75, 12.0, 300.0)
    thin_ms = 0.0687

    def t(ms):
        return {"median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01, "runs": 30}

    mm_tf = 2 * n**3 / (mm_ms * 1e-3) / 1e12
    thin_fl, thin_by = 2 * n * k * n, (2 * n * k + n * n) * 2
    thin_tf = thin_fl / (thin_ms * 1e-3) / 1e12
    copy_gbs = 2 * numel * 4 / (copy_ms * 1e-3) / 1e9
    ew_gbs, ew_tf = 2 * numel * 4 / (ew_ms * 1e-3) / 1e9, numel / (ew_ms * 1e-3) / 1e12
    tiny_tf = ops / (tiny_ms * 1e-3) / 1e12
    kernels = {"matmul": (2 * n / 6, mm_tf), "thin_matmul": (thin_fl / thin_by, thin_tf), "elementwise": (0.125, ew_tf),
               "tiny_ops": (0.125, tiny_tf)}
    roofs = {"datasheet": H100_SXM_BF16, "measured": (mm_tf, copy_gbs)}
    place = placements or {roof: {name: bound(i, *roofs[roof], a) for name, (i, a) in kernels.items()} for roof in roofs}

    def placed(name):
        return {roof: place[roof][name] for roof in place}

    rec.add("matmul_tflops", mm_tf, "TFLOP/s", "cuda_events", 0.02, n=n, dtype="bfloat16", flops=2 * n**3,
            bytes=3 * n * n * 2, placements=placed("matmul"), **t(mm_ms))
    rec.add("thin_matmul_tflops", thin_tf, "TFLOP/s", "cuda_events", 0.02, n=n, k=k, dtype="bfloat16", flops=thin_fl,
            bytes=thin_by, placements=placed("thin_matmul"), **t(thin_ms))
    rec.add("copy_gbs", copy_gbs, "GB/s", "cuda_events", 0.02, bytes=2 * numel * 4, **t(copy_ms))
    rec.add("elementwise_gbs", ew_gbs, "GB/s", "cuda_events", 0.02, flops=numel, bytes=2 * numel * 4, tflops=ew_tf,
            placements=placed("elementwise"), **t(ew_ms))
    rec.add("tiny_ops_tflops", tiny_tf, "TFLOP/s", "cuda_events", 0.05, flops=ops, bytes=ops * 8,
            placements=placed("tiny_ops"), **t(tiny_ms))
    steps, total_s, tokens_per_step = 98, 29.4, 16 * 1024
    tps = tokens_per_step * steps / total_s * (20 if invented else 1)
    rec.add("train_tokens_per_s", tps, "tokens/s", "cuda_events", None, tokens_per_step=tokens_per_step, steps=steps,
            total_s=total_s, median_step_ms=300.0, seq_len=1024, model="gpt2-small", monitor_source="nvml",
            util_max_pct=100.0, mem_max_gib=31.5)
    fpt = flops_per_token_from_config(preset_config("gpt2-small"), 1024)
    small, small_ms = 4, 90.0
    r = (16 / full_ms) / (small / small_ms)
    share = (r - 1) / (16 / small - 1)
    step_tf = fpt * tokens_per_step / (full_ms * 1e-3) / 1e12
    mfu = step_tf / 67.0
    step_bytes = 60e9  # made up: what one gpt2-small step's operations might read and write at batch 16 x 1024
    step_gbs = step_bytes / (full_ms * 1e-3) / 1e9
    limiter = step_bound(share, mfu, step_gbs / 3350.0)
    rec.add("train_mfu", mfu, "fraction", "utils.timing.benchmark of train_step", 0.02, step_tflops=step_tf,
            peak_tflops=67.0, flops_per_token=fpt, batch_size=16, small_batch=small, full_median_ms=full_ms,
            small_median_ms=small_ms, batch_scaling=r, fixed_share=share, step_bytes=step_bytes, step_gbs=step_gbs,
            bandwidth_share=step_gbs / 3350.0, peak_gbs=3350.0, limiter=limiter)
    add_sweep(rec, invented)
    return rec.to_dict()


# the sweep's rates in TFLOP/s on the H100 of gpu_record(), made up below its 989 bf16 datasheet peak
SWEEP_TFLOPS = {"half square": 600.0, "square, multiple of 128": 700.0, "square, multiple of 64": 680.0,
                "square, odd": 450.0, "one full wave": 500.0, "one tile past a wave": 260.0}


def add_sweep(rec, invented: bool = False, sm_count: int = 132, rates: dict | None = None) -> None:
    """The sweep of an H100 (132 SMs, tier h100) into ``rec``: each row's median follows from its
    shape and rate; invented, every rate is doubled, the best above the datasheet."""
    from utils.matmul_sweep import sweep_shapes

    rates = {k: v * (2 if invented else 1) for k, v in (rates or SWEEP_TFLOPS).items()}
    rows = {}
    for label, (m, n, k) in sweep_shapes(sm_count, "h100").items():
        ms = 2 * m * n * k / (rates[label] * 1e9)
        rows[label] = {"shape": [m, n, k], "tflops": rates[label], "median_ms": ms, "p20_ms": 0.99 * ms, "p80_ms": 1.01 * ms,
                       "runs": 30}
    best = max(rates, key=rates.get)
    rec.add("sweep_max_tflops", rates[best], "TFLOP/s", "cuda_events", 0.02, sm_count=sm_count, tier="h100",
            dtype="bfloat16", best=best, rows=rows)


# -- the batch ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    subs = tmp_path_factory.mktemp("submissions")
    out = tmp_path_factory.mktemp("graded")

    def put(name: str, nb: dict) -> None:
        (subs / f"{name}.ipynb").write_text(json.dumps(nb, indent=1))

    put("release", _load(RELEASE))  # the reference: graded_reference (tests/conftest.py), graded once per session

    hostile = answered()
    prepend(hostile, "roofline_functions",  # stderr from a learner cell, and from learner functions the tests call
            "import sys, warnings\nwarnings.warn('a learner warning')\nprint('learner debug output', file=sys.stderr)")
    fns = _cell(hostile, "roofline_functions")
    fns["source"] = _src(fns).replace('    """FLOP per byte moved to or from memory."""',
                                      '    """FLOP per byte."""\n    print("called", file=sys.stderr); warnings.warn("noisy")')
    insert_after(hostile, "pytorch_demo", scratch("from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass", "tq"))
    insert_after(hostile, "timing_demo", scratch("while True:\n    pass", "loop"))  # an infinite loop
    _cell(hostile, "test_matmul")["source"] = "pass  # tests edited away"
    _cell(hostile, "test_bound")["source"] = "assert True"
    prepend(hostile, "device", "raise RuntimeError('edited locked cell')")
    # a written answer quoting an MFU the run did not print (far from anything the section prints,
    # so a noisy timing cannot match it within the check's 0.5%): the reviewer's note names it
    _cell(hostile, "limiter_writeup")["source"] = "Overhead-bound: MFU was 0.0007% of the fp32 peak."
    put("hostile", hostile)

    perf = answered()
    prepend(perf, "matmul_answer", "import time as _t\n_real = _t.perf_counter\n_t.perf_counter = lambda: _real() * 0.5")
    put("patched_perf_counter", perf)

    ev = answered()
    prepend(ev, "matmul_answer", "torch.cuda.Event.elapsed_time = lambda self, end: 0.001")
    put("patched_elapsed_time", ev)

    rebind = answered()  # fakes for the names the test cells use, a patched grader, and an invented number
    prepend(rebind, "matmul_answer", "\n".join([
        "import contextlib, grader.checks, grader.phase0",
        "class _Fake:",
        "    def __getattr__(self, name):",
        "        return lambda *a, **k: None",
        "    @contextlib.contextmanager",
        "    def quiet(self):",
        "        try:",
        "            yield",
        "        except Exception:",
        "            pass",
        "checks = phase0 = _Fake()",
        "grader.checks.assert_untampered = lambda: None",
        "grader.phase0.check_matmul = lambda *a, **k: None"]))
    _cell(rebind, "matmul_answer")["source"] = _src(_cell(rebind, "matmul_answer")).replace(
        "### END SOLUTION", "matmul_tflops = 400.0  # invented\n### END SOLUTION")
    put("rebinds_grader", rebind)

    deleted = answered()
    deleted["cells"] = [c for c in deleted["cells"] if _gid(c) not in ("intro", "device", "test_bound")]
    put("deleted_cells", deleted)

    dies = answered()
    prepend(dies, "matmul_answer", "import os\nos._exit(1)")
    put("kernel_dies", dies)

    (subs / "not_json.ipynb").write_text('{"cells": [ this is not json')
    bare = answered()
    for c in bare["cells"]:
        c["metadata"] = {}
    put("no_metadata", bare)

    for roof, kernel, which in MISPLACED:  # one wrong label, put in after the reference placements
        nb = answered()
        c = _cell(nb, "placement_answer")
        c["source"] = _src(c).replace("### END SOLUTION", (
            f"placements[{roof!r}][{kernel!r}] = [label for label in ('compute', 'memory', 'overhead')\n"
            f"                                  if label != placements[{roof!r}][{kernel!r}]][{which}]\n### END SOLUTION"))
        put(f"misplaced_{roof}_{kernel}", nb)

    put("invented_record", answered())
    (subs / "invented_record.record.json").write_text(json.dumps(gpu_record(invented=True)))
    layout = subs / "submitted" / "gpu_record" / "00_foundations"  # nbgrader's submitted/ layout
    layout.mkdir(parents=True)
    (layout / "00_foundations.ipynb").write_text(json.dumps(answered()))
    (layout / "00_foundations.record.json").write_text(json.dumps(gpu_record()))

    # --no-screen: these hostile notebooks test the defences inside the kernel, behind the screen
    # (test_the_screen_holds_the_hostile_ones_before_they_run)
    return autograde(ROOT, "00_foundations", subs, out, "--no-screen", jobs=2, timeout_s=TIMEOUT_S, quiet=False,
                     wait_s=900)


def test_reference_scores_full_marks(graded_reference, batch):
    r = graded_reference("00_foundations")["result"]
    assert r["status"] == "ok"
    assert r["max_score"] == AUTO + MANUAL and r["score"] == r["auto_max_score"] == AUTO, _messages(r)
    assert all(c["mode"] == "measured live" for c in r["cells"] if c["cell"] in MEASURED)
    assert len(r["cells"]) >= 6
    for name in ("limiter_writeup", "sweep_writeup"):  # the written answers: the instructor's
        (w,) = [c for c in r["cells"] if c["cell"] == name]
        assert w["mode"] == "manual" and w["needs_manual_grade"] and w["score"] == 0 and w["points"] == 2
        assert w["message"].startswith("Quoted numbers:"), w
    assert r["manual_points"] == MANUAL
    assert batch["rows"]["hostile"]["needs_manual_grade"] == "limiter_writeup (2 points); sweep_writeup (2 points)"


def test_release_scores_zero(batch):
    r = batch["results"]["release"]
    assert r["status"] == "ok" and r["score"] == 0
    assert all(c["score"] == 0 for c in r["cells"])
    assert _cells(r)["limiter_writeup"]["message"] == "No response: the answer cell is as released."
    assert _cells(r)["sweep_writeup"]["message"] == "No response: the answer cell is as released."


def test_hostile_but_correct_submission_keeps_full_marks(batch):
    # stderr from learner cells and learner functions, a tqdm bar, an infinite loop, edited
    # test and locked cells: the loop times out, the edits are undone, nothing costs points
    r = batch["results"]["hostile"]
    assert r["status"] == "ok"
    assert r["score"] == r["auto_max_score"], _messages(r)
    note = _cells(r)["limiter_writeup"]["message"]
    assert "not found among them: 0.0007%" in note, note
    nb = json.loads((batch["out"] / "autograded" / "hostile" / "00_foundations.ipynb").read_text())
    loop = next(c for c in nb["cells"] if c.get("id") == "loop")
    assert any(o.get("ename") == "CellTimeoutError" for o in loop["outputs"])
    assert "_p0.check_matmul(" in _src(_cell(nb, "test_matmul"))  # hidden test restored
    assert "edited locked cell" not in _src(_cell(nb, "device"))


@pytest.mark.parametrize("student, patched", [("patched_perf_counter", "time.perf_counter"),
                                              ("patched_elapsed_time", "torch.cuda.Event.elapsed_time")])
def test_patched_timers_are_caught(batch, student, patched):
    r = batch["results"][student]
    scores = _scores(r)
    assert all(scores[c] == p for c, p in PURE.items())
    assert all(scores[c] == 0 for c in MEASURED)
    assert patched in _messages(r)


def test_rebinding_or_patching_the_grader_in_the_notebook_changes_nothing(batch):
    # the invented matmul_tflops fails its own cell and the two that use it as the compute ceiling
    r = batch["results"]["rebinds_grader"]
    scores = _scores(r)
    assert all(scores[c] == 0 for c in ("test_matmul", "test_roofline", "test_limiter")), _messages(r)
    assert "matmul_tflops" in _messages(r)
    assert all(scores[c] == 2 for c in ("test_rates", "test_bound", "test_memory", "test_training")), _messages(r)
    assert scores["test_quantization"] == 2 and scores["test_sweep"] == 3, _messages(r)


def test_the_screen_holds_the_hostile_ones_before_they_run(batch):
    from grader.screen import screen_notebook

    release = _load(RELEASE)
    for name in ("patched_perf_counter", "patched_elapsed_time", "rebinds_grader"):
        found = screen_notebook(json.loads((batch["subs"] / f"{name}.ipynb").read_text()), release)
        assert found and all(f.cell == "matmul_answer" for f in found), (name, found)
    assert screen_notebook(answered(), release) == []
    for name in ("kernel_dies", "deleted_cells"):
        assert screen_notebook(json.loads((batch["subs"] / f"{name}.ipynb").read_text()), release) == [], name


def test_deleted_cells_are_restored_with_a_status_line(batch):
    r = batch["results"]["deleted_cells"]
    assert r["status"].startswith("graded; restored 3 deleted cell(s)"), r["status"]
    assert {"intro", "device", "test_bound"} <= set(re.findall(r"[\w]+", r["status"]))
    assert r["score"] == r["auto_max_score"], _messages(r)


def test_unreadable_notebooks_get_a_status_and_the_batch_goes_on(batch):
    rows = batch["rows"]
    assert "not valid JSON" in rows["not_json"]["status"] and float(rows["not_json"]["score"]) == 0
    assert "no nbgrader cells" in rows["no_metadata"]["status"] and float(rows["no_metadata"]["score"]) == 0
    assert float(rows["hostile"]["score"]) == AUTO  # graded after the broken ones


def test_a_dead_kernel_does_not_pass(batch):
    r = batch["results"]["kernel_dies"]
    assert "kernel died" in r["status"]
    assert r["score"] == 0
    assert any("graded again" in n for n in r["notes"]), r["notes"]  # a machine's kill is retried once


def test_gpu_record_is_graded_from_record_on_a_cpu_grader(batch):
    r = batch["results"]["gpu_record"]
    assert r["score"] == r["auto_max_score"], _messages(r)
    assert all(c["mode"] == "graded from record" for c in r["cells"] if c["cell"] in MEASURED)
    html = (batch["out"] / "feedback" / "gpu_record" / "00_foundations.html").read_text()
    assert "graded from record" in html and "no GPU" in html


def test_invented_record_is_caught(batch):
    r = batch["results"]["invented_record"]
    scores = _scores(r)
    assert all(scores[c] == p for c, p in PURE.items())
    assert all(scores[c] == 0 for c in MEASURED), _messages(r)
    assert "not physically possible" in _messages(r)


@pytest.mark.parametrize("roof, kernel, which", MISPLACED)
def test_a_wrong_placement_loses_the_roofline_cell_only(batch, roof, kernel, which):
    r = batch["results"][f"misplaced_{roof}_{kernel}"]
    scores = _scores(r)
    assert scores["test_roofline"] == 0, _messages(r)
    assert r["score"] == r["auto_max_score"] - 2, _messages(r)
    assert f"placements[{roof!r}][{kernel!r}]" in _messages(r)


def test_grades_csv_has_nbgrader_export_columns_and_status(batch):
    rows = batch["rows"]
    first = next(iter(rows.values()))
    for col in ("assignment", "student_id", "raw_score", "score", "max_score", "status"):
        assert col in first
    assert len(rows) == 11 + len(MISPLACED)
    for sid in ("hostile", "release"):
        assert (batch["out"] / "feedback" / sid / "00_foundations.html").is_file()


# -- self-study and release -----------------------------------------------------------------

def test_check_command_on_reference_and_release(graded_reference, tmp_path):
    ref = graded_reference("00_foundations")  # `python -m grader check` on the reference, once per session
    rel = tmp_path / "untouched.ipynb"
    rel.write_text(RELEASE.read_text())
    proc = subprocess.run([sys.executable, "-m", "grader", "check", str(rel), "--json-out", str(tmp_path / "rel.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ref["rc"] == 0, ref["out"] + ref["err"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = ref["result"]
    assert res["score"] == res["auto_max_score"] == AUTO and res["max_score"] == AUTO + MANUAL, res
    assert f"{MANUAL} points of written answers await a manual grade" in ref["out"]
    assert "measured live" in ref["out"] and "test_matmul" in ref["out"]
    assert json.loads((tmp_path / "rel.json").read_text())["score"] == 0


def test_release_is_current_deterministic_and_clean(tmp_path):
    from grader.release import release, released_text

    text = released_text("00_foundations")
    assert text == RELEASE.read_text(), "notebooks/ is stale or the release is not deterministic: run python -m grader release"
    nb = json.loads(text)
    assert all(c.get("outputs", []) == [] and c.get("execution_count") is None for c in nb["cells"] if c["cell_type"] == "code")
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    src = _load(SOURCE)
    hidden, solution, visible = [], [], set()
    for c in src["cells"]:
        keep = None
        for line in _src(c).splitlines():
            if "### BEGIN" in line:
                keep = hidden if "HIDDEN" in line else solution
            elif "### END" in line:
                keep = None
            elif line.strip():
                (keep if keep is not None else []).append(line.strip())
                if keep is None:
                    visible.add(line.strip())
    assert hidden and solution
    released_lines = {ln.strip() for c in nb["cells"] for ln in _src(c).splitlines()}
    leaked = [ln for ln in hidden + solution if ln in released_lines and ln not in visible]
    assert not leaked, f"released notebook contains solution or hidden-test lines: {leaked[:5]}"
    # --check reports a stale copy and a notebook without a source
    (tmp_path / "00_foundations.ipynb").write_text(text.replace("Phase 0", "Phase zero"))
    (tmp_path / "99_orphan.ipynb").write_text(text)
    problems = [p for p in release(check=True, notebooks_dir=tmp_path) if "00_foundations" in p or "99_orphan" in p]
    assert len(problems) == 2 and "out of date" in problems[0] and "no source" in problems[1], problems


def test_release_check_cli_passes_on_the_repository():
    proc = subprocess.run([sys.executable, "-m", "grader", "release", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_source_cell_has_an_nbgrader_id():
    # restoring deleted cells matches them by grade_id; the answer in words is a graded cell too
    assert [c["id"] for c in _load(SOURCE)["cells"] if _gid(c) is None] == []
    assert _gid(_cell(_load(SOURCE), "limiter_writeup")) == "limiter_writeup"
