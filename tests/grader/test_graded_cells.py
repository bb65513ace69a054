"""Wrong answers to graded cells, caught by the real grader code, and the table of every graded
cell (docs/graded-cells.md) held to the source notebooks.

The negatives here are for the graded cells that no other test showed failing a wrong answer,
for lab 05's two always-live cells, whose only negatives graded whole notebooks, and for lab
01's cause cell with a GPU record submitted (it passed any answer until grader/phase1.py
checked it live there too). Each builds a wrong answer of a
kind learners give (wrong arithmetic, a number off by a factor, a constant, a figure copied from
the text, a number consistent only with itself) and shows the cell's hidden test fails it:
lab 00's pure cells run their inline hidden test as nbgrader does, from the source notebook;
the others call the phase's checks loaded as the hidden tests load them (the ``phase``
fixture). Each group also passes the reference answer through the same check, so that a
failure is the wrong answer's and not the harness's, except lab 01's baseline: a reference
timed while the shared test machine was busier than when the grader re-times it can fall
outside the band, so there each wrong answer is matched by the message of the check it fails. On a CPU (smoke mode) the pure cells take
milliseconds and the measured ones a few seconds each.

The table test parses docs/graded-cells.md and fails when a graded cell of a source notebook
has no row, a row's points differ from the notebook's, a row names a cell the notebook does not
grade, or a row names a test that does not exist: the table cannot go stale.
"""
from __future__ import annotations

import ast
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from tests.nbcells import cell, gid, src

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "graded-cells.md"
SOURCES = sorted((ROOT / "grader" / "source").glob("*/*.ipynb"))
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS\n?", re.S)


def notebook(assignment: str) -> dict:
    """The source notebook of ``assignment``, read now (new cells are seen at once)."""
    return json.loads((ROOT / "grader" / "source" / assignment / f"{assignment}.ipynb").read_text())


def solution(assignment: str, grade_id: str, namespace: dict | None = None) -> dict:
    """The source notebook's answer cell ``grade_id``, run up to its last ``### END SOLUTION``
    (what follows prints and plots), in ``namespace``; returns the namespace."""
    text = src(cell(notebook(assignment), grade_id))
    if "### END SOLUTION" in text:
        text = text[: text.rindex("### END SOLUTION")]
    ns = {} if namespace is None else namespace
    exec(compile(text, grade_id, "exec"), ns)  # noqa: S102 (the course's own solution cells)
    return ns


def cell_parts(assignment: str, grade_id: str) -> tuple[str, str]:
    """``(visible part, hidden part)`` of a graded test cell of the source notebook."""
    text = src(cell(notebook(assignment), grade_id))
    hidden = HIDDEN.search(text)
    assert hidden, f"{assignment} {grade_id} has no hidden tests"
    return HIDDEN.sub("", text), hidden.group(1)


def run_part(assignment: str, grade_id: str, part: str, names: dict) -> None:
    """Run the ``part`` ("visible" or "hidden") of test cell ``grade_id`` with the answers
    ``names`` defined, as nbgrader runs it in the learner's kernel (the visible part uses the
    ``checks`` the notebook imported; the hidden part loads ``grader.phase(N)`` itself)."""
    from grader import checks

    visible, hidden = cell_parts(assignment, grade_id)
    exec(compile(visible if part == "visible" else hidden, f"{grade_id} ({part})", "exec"),  # noqa: S102
         {"checks": checks, **names})


# -- lab 01: rates, the baseline, LoRA memory and the cause -------------------------------------------

LAB1 = "01_single_gpu"
H200_NAIVE_TOKENS_PER_S = 42.1e3  # the text's reference naive throughput on an H200 (optimized_md)
H200_LORA_GIB, H200_QLORA_GIB, H200_TRAP_GIB = 4.09, 2.70, 11.81  # the text's H200 table (lora_md)


def lab1_namespace() -> dict:
    """What the locked setup cell of lab 01 defines for the answer cells."""
    from utils import env, timing, training
    from utils.monitor import GpuMonitor

    return {"SIZES": env.phase_sizes(LAB1), "training": training, "timing": timing, "GpuMonitor": GpuMonitor}


def gpu_record() -> dict:
    """A measurement record as an H100 run writes its header: this course's ``utils``, a card in
    ``utils.hardware``. With it submitted on this machine (no GPU), cells are graded from it."""
    from utils.record import Record, utils_hash

    return Record(fingerprint={"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1,
                               "compute_capability": "9.0"}, utils_sha256=utils_hash()).to_dict()


@pytest.fixture(scope="module")
def lab1_rates() -> dict:
    """The reference ``tokens_per_second``, ``mfu`` and ``full_finetune_gib`` of lab 01."""
    return solution(LAB1, "rates_functions")


def test_lab01_reference_rates_pass(phase, lab1_rates):
    """The reference rate functions pass ``check_rates``: the negatives below fail for their wrong
    function alone."""
    phase(1).check_rates(lab1_rates["tokens_per_second"], lab1_rates["mfu"], lab1_rates["full_finetune_gib"])


@pytest.mark.parametrize("name, wrong, match", [
    ("tokens_per_second", lambda tokens, step_ms: tokens / step_ms,  # milliseconds taken as seconds
     r"tokens_per_second\(4096, 100\.0\) = 40\.96, expected 40960"),
    ("mfu", lambda tps, flops_per_token, peak: tps * flops_per_token / (peak * 1e15),  # the peak read as PFLOP/s
     r"mfu\(381765\.0, 857000000\.0, 989\.0\) = 0\.000330812, expected 0\.330812"),
    ("full_finetune_gib", lambda n_params: 16.0,  # the visible example's answer, for every model
     r"full_finetune_gib\(1100048384\) = 16, expected 16\.392$"),
], ids=["tokens_ms_as_s", "mfu_peak_as_pflops", "finetune_constant"])
def test_lab01_rates_wrong_arithmetic_fails(phase, lab1_rates, name, wrong, match):
    """``test_rates`` (lab 01): a factor of 1000 in tokens/s or MFU, and the visible example's
    16 GiB returned as a constant (it passes the visible test), fail ``check_rates``."""
    fns = {**lab1_rates, name: wrong}
    if name == "full_finetune_gib":
        run_part(LAB1, "test_rates", "visible", fns)
    with pytest.raises(AssertionError, match=match):
        phase(1).check_rates(fns["tokens_per_second"], fns["mfu"], fns["full_finetune_gib"])


@pytest.fixture(scope="module")
def lab1_baseline() -> dict:
    """The reference answer of the baseline cell, run here: the naive loop timed under a monitor."""
    return solution(LAB1, "baseline_answer", lab1_namespace())


@pytest.mark.slow
def test_lab01_baseline_copied_from_the_text_or_in_the_wrong_unit_fails(phase, lab1_baseline):
    """``test_baseline``: the text's H200 figure typed in for ``baseline_tps`` does not match the
    learner's own stopwatch; tokens per millisecond given as tokens/s (1000x too small), with
    the summary edited to agree, is outside the band of the grader's timing of the naive loop,
    even widened for a loaded machine (x8 at most in smoke mode, x3 on a GPU)."""
    g = lab1_baseline
    with pytest.raises(AssertionError, match=r"baseline_tps vs stopwatch.summary\(\) = 42100, expected"):
        phase(1).check_baseline(H200_NAIVE_TOKENS_PER_S, g["baseline"], g["naive"], g["monitor"])
    per_ms = g["baseline_tps"] / 1000
    edited = {**g["baseline"], "tokens_per_s": per_ms}
    with pytest.raises(AssertionError, match=r"baseline_tps = .* tokens/s, but the grader re-measured"):
        phase(1).check_baseline(per_ms, edited, g["naive"], g["monitor"])


@pytest.mark.slow
def test_lab01_baseline_of_another_loop_fails(phase, lab1_baseline):
    """``test_baseline``: a baseline timed on a loop other than the given naive one (the big batch
    of section 4) is not the baseline, whatever its numbers."""
    from utils import training

    g, s = lab1_baseline, lab1_baseline["SIZES"]
    other = training.build_loop(s.model, training.with_changes(training.naive_config(s.naive_batch, s.seq_len),
                                                               batch_size=s.big_batch))
    with pytest.raises(AssertionError, match="naive must be training.build_loop"):
        phase(1).check_baseline(g["baseline_tps"], g["baseline"], other, g["monitor"])


@pytest.fixture(scope="module")
def lab1_finetune() -> dict:
    """The reference answer of the LoRA/QLoRA cell, run here: both lean recipes measured."""
    return solution(LAB1, "finetune_answer", lab1_namespace())


@pytest.mark.slow
def test_lab01_reference_finetune_passes(phase, lab1_finetune):
    """The reference recipes and their peaks pass ``check_finetune``, re-measured here."""
    g = lab1_finetune
    phase(1).check_finetune(g["LEAN_LORA"], g["LEAN_QLORA"], g["lora_peak_gib"], g["qlora_peak_gib"])


@pytest.mark.slow
def test_lab01_finetune_peaks_copied_from_the_text_fail(phase, lab1_finetune):
    """``test_finetune``: the H200 table's 4.09 and 2.70 GiB typed in for the learner's peaks are
    not what the grader measures for the recipes here (within 10%)."""
    g = lab1_finetune
    with pytest.raises(AssertionError, match=r"lora_peak_gib = 4\.09 GiB, but the grader re-measured"):
        phase(1).check_finetune(g["LEAN_LORA"], g["LEAN_QLORA"], H200_LORA_GIB, H200_QLORA_GIB)


@pytest.mark.slow
def test_lab01_finetune_recipes_that_are_not_the_lean_ones_fail(phase, lab1_finetune):
    """``test_finetune``: the eval-mode trap recipe given as LEAN_LORA, with its own honestly
    measured peak, is heavier than the course's lean recipe; a LEAN_QLORA left unquantized is
    not QLoRA."""
    from utils import training

    g, s = lab1_finetune, lab1_finetune["SIZES"]
    trap = training.replace(training.RECIPES["lora_bf16_autocast_eval"], quant="none")
    trap_peak = training.measure_finetune(s.ft_model, trap, s.ft_batch, s.ft_seq_len)["peak_gib"]
    with pytest.raises(AssertionError, match="LEAN_LORA peaks at .* more than the lean recipe's"):
        phase(1).check_finetune(trap, g["LEAN_QLORA"], trap_peak, g["qlora_peak_gib"])
    with pytest.raises(AssertionError, match="LEAN_QLORA must be a training.FinetuneRecipe with quant='nf4'"):
        phase(1).check_finetune(g["LEAN_LORA"], g["LEAN_LORA"], g["lora_peak_gib"], g["lora_peak_gib"])


@pytest.fixture(scope="module")
def lab1_cause() -> dict:
    """The reference answer of the cause cell, run here: the lean and heavy peaks, and each
    single change to the lean recipe."""
    return solution(LAB1, "cause_answer", lab1_namespace())


@pytest.mark.slow
def test_lab01_cause_is_checked_live_with_a_gpu_record_too(phase, lab1_cause, capsys):
    """``test_cause`` with a GPU record submitted: the record holds nothing about the cause, and
    the notebook measured its peaks in this kernel, so the cell is checked live here as without
    a record. The reference passes; blaming autocast fails, and so do peaks copied from the
    text's H200 table. (The check used to return at once when a record was submitted, passing
    any answer.)"""
    g = lab1_cause
    p1 = phase(1, record=gpu_record())
    assert p1.checks.grading_mode() == p1.checks.RECORD
    p1.check_cause(g["CAUSE"], g["trap_peak_gib"], g["lean_peak_gib"])
    assert "measured live" in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"CAUSE = 'autocast', but of the single changes only \['eval_mode'\]"):
        p1.check_cause("autocast", g["trap_peak_gib"], g["lean_peak_gib"])
    with pytest.raises(AssertionError, match=r"lean_peak_gib = 4\.09 GiB, but the grader re-measured"):
        p1.check_cause(g["CAUSE"], H200_TRAP_GIB, H200_LORA_GIB)


# -- lab 05: the two always-live cells, called directly ------------------------------------------------

LAB5 = "05_hardware_and_cost"


@pytest.fixture(scope="module")
def lab5_rng() -> dict:
    """The reference ``capture_rng_state`` and ``restore_rng_state`` of lab 05."""
    import torch

    return solution(LAB5, "rng_answer", {"torch": torch, "random": random, "np": np})


def test_lab05_a_restore_that_forgets_a_generator_fails(phase, lab5_rng):
    """``test_resume``: a restore that leaves Python's ``random`` where it is fails the grader's
    round trip, which names that generator, before any kill-and-resume run starts; the
    reference round-trips every generator."""
    p5 = phase(5)
    p5._rng_round_trip(lab5_rng["capture_rng_state"], lab5_rng["restore_rng_state"])
    ref_restore = lab5_rng["restore_rng_state"]

    def restore_but_python(state):
        ref_restore({**state, "python": random.getstate()})

    with pytest.raises(AssertionError, match=r"do not repeat their draws: python:"):
        p5.check_resume(lab5_rng["capture_rng_state"], restore_but_python)


@pytest.fixture(scope="module")
def lab5_xla() -> dict:
    """The reference answer of the recompilation cell, run here after the locked setup cell."""
    from utils import env, xla

    ns = {"np": np, "math": math, "xla": xla, "env": env, "SIZES": env.phase_sizes(LAB5)}
    solution(LAB5, "xla_setup", ns)
    return solution(LAB5, "xla_answer", ns)


def recompile_answers(g: dict, **change) -> dict:
    """The arguments the hidden test of ``test_recompiles`` passes, from the namespace ``g``."""
    keys = ("bucket_length", "compiles_unpadded", "compiles_bucketed", "compile_ms", "run_ms", "eager_ms", "break_even_calls")
    return {**{k: g[k] for k in keys}, **change}


@pytest.mark.slow
def test_lab05_wrong_compile_counts_fail(phase, lab5_xla):
    """``test_recompiles``: one compile per call (the repeated lengths counted again) passes the
    visible test but not the grader's fresh count; a ``bucket_length`` that clamps to the
    largest bucket instead of raising fails too. The reference passes."""
    pytest.importorskip("jax")
    g, p5 = lab5_xla, phase(5)
    p5.check_recompiles(**recompile_answers(g))
    per_call = recompile_answers(g, compiles_unpadded=len(g["LENGTHS"]))
    assert per_call["compiles_unpadded"] > g["compiles_unpadded"]
    run_part(LAB5, "test_recompiles", "visible", {**g, **per_call})
    with pytest.raises(AssertionError, match=rf"compiles_unpadded = {len(g['LENGTHS'])}, but the grader counted "
                                             rf"{g['compiles_unpadded']} compilations"):
        p5.check_recompiles(**per_call)

    def clamped(n, buckets):
        return min([b for b in buckets if b >= n] or [max(buckets)])

    with pytest.raises(AssertionError, match=r"no bucket holds it, raise ValueError"):
        p5.check_recompiles(**recompile_answers(g, bucket_length=clamped))


# -- the table of graded cells ----------------------------------------------------------------------

ROW = re.compile(r"^\|\s*`(?P<cell>\w+)`\s*\((?P<points>\d+(?:\.\d+)?) points?\)\s*\|(?P<rest>.*)\|\s*$")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
MANUAL = "manual (rubric)"


def graded_cells(nb: dict) -> dict[str, dict]:
    """``{grade_id: {"points", "manual"}}`` of a notebook's graded cells; manual ones are the
    answer cells an instructor grades with a rubric (nbgrader ``solution`` and ``grade``)."""
    out = {}
    for c in nb["cells"]:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            out[gid(c)] = {"points": float(meta.get("points", 0)), "manual": bool(meta.get("solution"))}
    return out


def table_rows(text: str) -> dict[str, dict[str, dict]]:
    """``{assignment: {grade_id: {"points", "columns"}}}`` from the doc: one section per lab,
    its heading naming the assignment in backticks, one table row per graded cell."""
    rows: dict[str, dict[str, dict]] = {}
    lab = None
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.search(r"`(\d\d_\w+)`", line)
            lab = m.group(1) if m else None
            if lab:
                rows.setdefault(lab, {})
        elif lab and (m := ROW.match(line)):
            rows[lab][m["cell"]] = {"points": float(m["points"]),
                                    "columns": [c.strip() for c in m["rest"].split("|")]}
    return rows


def defined_tests(path: Path) -> set[str]:
    """Names of the module-level functions of a test file."""
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def table_problems(text: str, notebooks: dict[str, dict]) -> list[str]:
    """What is wrong with the table ``text`` against ``notebooks`` (``{assignment: notebook}``):
    a graded cell without a row or with other points, a row for a cell that is not graded, a
    manual cell not marked as such, an automatic cell with no test, a test that does not exist."""
    rows, problems = table_rows(text), []
    for lab, nb in notebooks.items():
        cells, have = graded_cells(nb), rows.get(lab)
        if have is None:
            problems.append(f"{lab}: no section")
            continue
        for cid, meta in cells.items():
            row = have.get(cid)
            if row is None:
                problems.append(f"{lab} {cid}: no row")
                continue
            if row["points"] != meta["points"]:
                problems.append(f"{lab} {cid}: {row['points']:g} points in the table, {meta['points']:g} in the notebook")
            if len(row["columns"]) != 3:
                problems.append(f"{lab} {cid}: {len(row['columns']) + 1} columns, not 4")
                continue
            checks_col, _, tests_col = row["columns"]
            refs = TEST_REF.findall(tests_col)
            if meta["manual"] and not checks_col.startswith(MANUAL):
                problems.append(f"{lab} {cid}: a manually graded cell, but its row does not say {MANUAL!r}")
            if not meta["manual"] and checks_col.startswith(MANUAL):
                problems.append(f"{lab} {cid}: graded automatically, but its row says {MANUAL!r}")
            if not refs and not (meta["manual"] and tests_col == "manual"):
                problems.append(f"{lab} {cid}: names no test" + (" (write 'manual' if none)" if meta["manual"] else ""))
            for file, name in refs:
                path = ROOT / file
                if not path.is_file():
                    problems.append(f"{lab} {cid}: {file} does not exist")
                elif name not in defined_tests(path):
                    problems.append(f"{lab} {cid}: {file} defines no {name}")
        problems += [f"{lab} {cid}: a row, but the notebook grades no such cell" for cid in have if cid not in cells]
    problems += [f"{lab}: a section for a lab that has no source notebook" for lab in rows if lab not in notebooks]
    return problems


def source_notebooks() -> dict[str, dict]:
    """``{assignment: notebook}`` of every source notebook."""
    return {p.stem: json.loads(p.read_text()) for p in SOURCES}


def test_the_table_has_every_graded_cell_with_its_points_and_existing_tests():
    """docs/graded-cells.md against the source notebooks as they are now: every graded cell of
    every lab has its row and points, manual cells are marked, and every test named exists."""
    nbs = source_notebooks()
    assert len(nbs) == 6 and sum(len(graded_cells(nb)) for nb in nbs.values()) >= 44
    problems = table_problems(DOC.read_text(), nbs)
    assert not problems, "docs/graded-cells.md is out of date:\n" + "\n".join(problems)


def test_the_table_check_finds_a_missing_row_wrong_points_and_a_test_that_does_not_exist():
    """The checker above, on the doc with one row dropped, one row's points changed and one test
    renamed to one that does not exist: it reports each, naming the cell."""
    nbs = source_notebooks()
    text = DOC.read_text()
    lines = text.splitlines()
    row_of = {m["cell"]: i for i, line in enumerate(lines) if (m := ROW.match(line))}
    assert {"test_intensity", "test_percentile", "test_speedup"} <= set(row_of)
    lines[row_of["test_percentile"]] = ""  # lab 04's percentile cell loses its row
    lines[row_of["test_speedup"]] = lines[row_of["test_speedup"]].replace("(1 point)", "(3 points)", 1)
    lines[row_of["test_intensity"]] = re.sub(r"::(\w+)`", r"::\1_renamed`", lines[row_of["test_intensity"]])
    problems = table_problems("\n".join(lines), nbs)
    assert "04_benchmarking_production test_percentile: no row" in problems
    assert "05_hardware_and_cost test_speedup: 3 points in the table, 1 in the notebook" in problems
    assert any(p.startswith("00_foundations test_intensity:") and "_renamed" in p for p in problems), problems


def test_the_table_check_holds_manual_cells_to_their_own_rule():
    """A manually graded cell (nbgrader ``solution`` and ``grade``) needs a row saying
    "manual (rubric)" and names its number check's test or "manual"; an automatic cell may not
    say "manual (rubric)" and must name a test. Checked on a made-up lab, whose wrong rows the
    real labs' table cannot hold."""
    def graded(cid, points, manual):
        return {"cell_type": "markdown", "source": "", "metadata": {"nbgrader": {
            "grade": True, "solution": manual, "grade_id": cid, "points": points}}}

    nbs = {"99_made_up": {"cells": [graded("why_answer", 3, True), graded("test_sum", 1, False),
                                    graded("plan_answer", 2, True)]}}
    head = "## Lab 99 (`99_made_up`)\n\n| cell | what it checks | what a wrong answer looks like | test |\n|---|---|---|---|\n"
    ok = head + ("| `why_answer` (3 points) | manual (rubric): why the step is slow | a guess | manual |\n"
                 "| `test_sum` (1 point) | a sum | off by one | `tests/grader/test_graded_cells.py::test_lab01_reference_rates_pass` |\n"
                 "| `plan_answer` (2 points) | manual (rubric): the plan, its numbers checked | none | "
                 "`tests/grader/test_graded_cells.py::test_lab00_rates_wrong_units_fail_the_hidden_test` |\n")
    assert table_problems(ok, nbs) == []
    bad = head + ("| `why_answer` (3 points) | why the step is slow | a guess | manual |\n"
                  "| `test_sum` (1 point) | manual (rubric): a sum | off by one | manual |\n"
                  "| `plan_answer` (2 points) | manual (rubric): the plan | none | none yet |\n")
    assert table_problems(bad, nbs) == [
        "99_made_up why_answer: a manually graded cell, but its row does not say 'manual (rubric)'",
        "99_made_up test_sum: graded automatically, but its row says 'manual (rubric)'",
        "99_made_up test_sum: names no test",
        "99_made_up plan_answer: names no test (write 'manual' if none)",
    ]


def lab1_gpu_record(baseline=42_104.0, optimized=406_572.0, speedup=None, lora=4.04, qlora=2.70) -> dict:
    """A phase-1 record as an H100 run writes its measured numbers (the H200 run's, in
    benchmarks/RESULTS.md: 42,104 and 406,572 tokens/s, 4.04 and 2.70 GiB)."""
    from utils.record import Record

    rec = Record.from_dict(gpu_record())
    rec.add("baseline_tokens_per_s", baseline, "tokens/s", "utils.timing.Stopwatch", None)
    rec.add("optimized_tokens_per_s", optimized, "tokens/s", "utils.training.measure_loop", None)
    rec.add("speedup", optimized / baseline if speedup is None else speedup, "x", "optimized / naive tokens/s", None)
    rec.add("lora_peak_gib", lora, "GiB", "torch.cuda.max_memory_allocated", None)
    rec.add("qlora_peak_gib", qlora, "GiB", "torch.cuda.max_memory_allocated", None)
    return rec.to_dict()


def test_lab01_an_honest_gpu_record_passes_beside_this_machines_own_numbers(phase, capsys):
    """With a GPU record on a grader without a GPU, the notebook ran again here (on the CPU): its
    tokens/s and peaks are this machine's. The record's numbers pass on their own; the
    notebook's CPU numbers are not held against them."""
    p1 = phase(1, record=lab1_gpu_record())
    p1.check_baseline(1234.5, None, None, None)
    p1.check_finetune(None, None, 0.05, 0.05)  # the optimized loop's record: tests/grader/test_phase1_loop.py
    assert capsys.readouterr().out.count("graded from record") >= 2


@pytest.mark.parametrize("record, check, match", [
    ({"speedup": 20.0}, "optimized", "speedup vs its optimized / baseline"),
    ({"optimized": 200_000.0}, "optimized", "below 6"),  # 4.75x: under the H100 tier's 6x, above the CPU tier's
    ({"qlora": 4.0}, "finetune", "QLoRA peak"),
    ({"baseline": -5.0, "speedup": 1.0}, "baseline", "baseline_tokens_per_s"),
])
def test_lab01_a_record_that_contradicts_itself_or_its_tier_fails(phase, record, check, match):
    """A record whose speedup is not its own ratio, whose speedup is below its card's tier (not
    the grading machine's smoke tier), whose QLoRA peak is not below 0.7x LoRA's, or whose
    baseline is not positive."""
    p1 = phase(1, record=lab1_gpu_record(**record))
    call = {"baseline": lambda: p1.check_baseline(1.0, None, None, None),
            "optimized": lambda: p1.check_optimized(1.0, 1.0, 1.0, None, None),
            "finetune": lambda: p1.check_finetune(None, None, 1.0, 1.0)}[check]
    with pytest.raises(AssertionError, match=match):
        call()
