"""Where a grade is decided: each graded cell's judge, run in the grader's own process.

This process never imports or calls learner code. It has, per graded cell:

- the cell's **answers**: the one JSON line the notebook's kernel printed for it
  (``grader/answers.py``), decoded strictly by the lab's answers schema (``grader/schema.py``);
- the learner's functions **on hidden inputs**: a :class:`Check` names a function and a generator
  of cases; the cases are drawn from a seed made in this process after the kernel is gone, sent to a
  sandbox (``grader/sandbox.py``) that holds the learner's definitions alone, and only the outputs
  come back. The expected values are computed here and never leave;
- a **harness** run in a sandbox, timed from here where the learner's code is timed;
- a **reference** from one of two providers: the grader's own re-measurement on this machine
  (``measure`` in the lab's ``reference.py``: live), or the learner's measurement record where this
  machine has no GPU and the record came from one (``from_record``: provisional, docs/grading.md).

A judge is a pure function ``judge(answers, reference)`` (``grader/expect.py`` for its vocabulary).
A measured cell that misses is measured again (a busy core spoils one run, not three); after a miss
on a loaded machine its bands widen by the slowdown measured; a measurement of the grader's own that
stays unusable on a loaded machine is left out and says so, never failed on.
"""
from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader import expect
from grader.names import COMPUTED, LIVE, RECORD
from grader.remeasure import Load
from grader.schema import NONFINITE, AnswerError, loads

ATTEMPTS = 3  # a measured cell that misses is measured again, up to this many times in all
NOISY_RETRIES = 2  # more tries after misses that were the machine's (loaded, or unusable)
NOISY_PAUSE_S = 1.0


@dataclasses.dataclass(frozen=True)
class Check:
    """How one graded cell is judged (declared in the lab's ``judges.py``, in :data:`CHECKS`).

    ``judge(answers, reference)`` returns feedback lines or raises :class:`grader.expect.Fail`.
    ``calls``: function name -> ``cases(rng, ctx)``, a list of argument lists for the learner's
    function, drawn from the secret seed; their results arrive as ``answers.calls[name]``.
    ``forbid``: the course's implementations of the rule (``"utils.measure.flops:bound"``), unavailable in
    the sandbox. ``measures``: what the reference must hold (empty: nothing to measure, the cell is
    judged on the rule alone). ``harness``: ``"module:function"`` run in a sandbox of its own, its
    parameters from ``harness_params(ctx, answers)``, its result as ``answers.harness``.
    ``setup``: course code the sandbox runs before the learner's definitions (``SIZES = ...``)."""

    cell: str
    judge: Callable[..., Any]
    calls: dict = dataclasses.field(default_factory=dict)
    forbid: tuple[str, ...] = ()
    measures: tuple[str, ...] = ()
    harness: str = ""
    harness_params: Callable[..., dict] | None = None
    setup: str = ""
    imports: tuple[str, ...] = ()
    timeout_s: float = 300.0
    always_live: bool = False  # judged on this machine even where a record stands in for measurements
    # (its reference runs on a CPU as well: a count, a resume on the grader's own run)
    per_call_s: float = 30.0  # the most one hidden case may take in the sandbox
    strict: bool | None = None  # the sandbox refuses processes, ctypes, gc walks, off-machine connections;
    # default: strict where ``forbid`` names a ground truth (a check whose answers need a compiler, Triton on
    # a GPU say, sets False: its ground truth is still a tripwire, its source unreadable)

    @property
    def strict_sandbox(self) -> bool:
        return bool(self.forbid) if self.strict is None else self.strict


@dataclasses.dataclass(frozen=True)
class Context:
    """Where a lab is judged: the size tier and its sizes, smoke mode, the device and its spec row
    (None on a CPU or a GPU missing from ``utils.device.hardware``), the matmul dtype's name."""

    assignment: str
    tier: str
    sizes: Any
    smoke: bool
    device: str
    device_name: str
    spec: Any
    dtype: str
    fingerprint: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Case:
    """One hidden case's result from the sandbox: ``value`` when ``ok``, else ``error``."""

    ok: bool
    value: Any = None
    error: str = ""


class Answers:
    """A cell's decoded answers by attribute (``a.matmul_tflops``), the learner's functions on hidden
    cases (``a.calls["classify_bound"]``: :class:`Case` list, in the order the cases were drawn,
    ``a.inputs[name]`` the cases themselves, for the judge's expected values) and a harness's result."""

    def __init__(self, values: dict, calls: dict | None = None, inputs: dict | None = None,
                 harness: Any = None, sections: dict | None = None, ground_truth: tuple = ()):
        self.values, self.calls, self.inputs = values, calls or {}, inputs or {}
        self.harness, self.sections, self.ground_truth = harness, sections or {}, ground_truth

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)


@dataclasses.dataclass
class Verdict:
    """The grade of one cell: points earned of ``max_points``, how it was graded, the message (a
    failure's reason) and the lines of feedback. ``provisional``: judged from a record, so it counts
    only where the instructor allows (``--count-provisional``)."""

    cell: str
    points: float
    max_points: float
    mode: str
    message: str = ""
    notes: list = dataclasses.field(default_factory=list)
    provisional: bool = False
    seconds: float = 0.0  # the grader's time on this cell: its harness, its measurements and its judge

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points > 0

    def to_dict(self) -> dict:
        return {"cell": self.cell, "points": self.points, "max_points": self.max_points, "mode": self.mode,
                "message": self.message, "notes": list(self.notes), "provisional": self.provisional,
                "passed": self.passed, "seconds": round(self.seconds, 2)}


def plain(value: Any) -> Any:
    """A sandbox's JSON value with the non-finite markers read back as floats."""
    if isinstance(value, dict):
        if set(value) == {NONFINITE}:
            return float(value[NONFINITE])
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def parse_export(text: str | None, cell: str) -> dict:
    """The export line's payload (``{"values", "missing", "errors"}``); ValueError when it is not one."""
    if text is None:
        raise ValueError("the notebook did not reach this cell (an earlier cell stopped it, or it timed out)")
    data = loads(text)
    if not isinstance(data, dict) or data.get("cell") != cell or not isinstance(data.get("values"), dict):
        raise ValueError("the answers of this cell could not be read")
    return data


def decode(specs: dict, payload: dict) -> Answers:
    """The cell's answers decoded by its specs; AnswerError for the first missing or malformed one."""
    missing = [n for n in specs if n in (payload.get("missing") or [])]
    if missing:
        raise AnswerError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not defined when this cell "
                          "runs: run the cells above it (an exercise left unsolved stops them)")
    errors = payload.get("errors") or {}
    for name in specs:
        if name in errors:
            raise AnswerError(f"reading {name} raised {errors[name]}")
    values = payload["values"]
    out = {}
    for name, answer in specs.items():
        if name not in values:
            raise AnswerError(f"{name} is not defined when this cell runs")
        out[name] = answer.spec.decode(values[name], name)
    return Answers(out)


def cell_seed(seed: int, cell: str, name: str) -> random.Random:
    """The random source of one check's hidden cases: the run's secret seed, the cell and the function."""
    return random.Random(f"{seed}:{cell}:{name}")


@dataclasses.dataclass
class Run:
    """One grading of one notebook: what :func:`judge_all` needs besides the checks."""

    lab: Any
    points: dict  # grade_id -> max points, from the notebook's nbgrader metadata
    exports: dict  # grade_id -> the export line's JSON text (None where the cell was not reached)
    live: Context
    definitions: dict  # grader.definitions.job of the screened notebook
    code: dict  # grader.definitions.read_code, read before any learner code ran
    work: Path  # where sandbox code copies and logs go
    seed: int
    record: dict | None = None  # a GPU record, judged where this machine has no GPU
    record_context: Context | None = None
    record_problem: str = ""  # why a submitted record is not used, for the feedback
    calls_s: float = 0.0  # what :func:`judge_all` spent running the learner's functions on the drawn cases


def _sandbox_job(run: Run, checks: list[Check], strict: bool) -> dict:
    return {"prelude": run.definitions["prelude"], "definitions": run.definitions["definitions"],
            "setup": "\n".join(dict.fromkeys(c.setup for c in checks if c.setup)),
            "imports": sorted({m for c in checks for m in c.imports}),
            "policy": {"forbid": sorted({f for c in checks for f in c.forbid}), "strict": strict}}


def _new_sandbox(run: Run, checks: list[Check], strict: bool, tag: str):
    from grader.definitions import write_code
    from grader.sandbox import Sandbox

    code_dir = write_code(run.code, run.work / f"sandbox-{tag}" / "code")
    cwd = run.work / f"sandbox-{tag}" / "cwd"  # its own empty folder: nothing another sandbox wrote is beside it
    cwd.mkdir(parents=True)
    return Sandbox(_sandbox_job(run, checks, strict), code_dir, run.work / f"sandbox-{tag}" / "log", cwd=cwd)


def _calls(run: Run, checks: list[Check], answers: dict, problems: dict) -> None:
    """Every check's hidden cases: one sandbox for the strict checks (it forbids every strict check's
    ground truth at once), one for the others."""
    for strict in (True, False):
        group = [c for c in checks if c.calls and c.cell in answers and c.strict_sandbox == strict]
        if group:
            _call_group(run, group, answers, problems, strict)


def _call_group(run: Run, todo: list[Check], answers: dict, problems: dict, strict: bool) -> None:
    from grader.sandbox import SandboxError

    try:
        box = _new_sandbox(run, todo, strict=strict, tag="calls-strict" if strict else "calls")
    except SandboxError as exc:
        for c in todo:
            problems[c.cell] = f"your definitions could not be loaded on their own: {exc}"
        return
    with box:
        broken = box.started.definition_errors
        for c in todo:
            a = answers[c.cell]
            for name, make in c.calls.items():
                cases = make(cell_seed(run.seed, c.cell, name), run.live)
                before = len(box.ground_truth)
                try:
                    got = box.call(name, cases, timeout_s=c.timeout_s, per_call_s=c.per_call_s)
                except SandboxError as exc:
                    got = [{"error": str(exc)}] * len(cases)
                a.inputs[name] = cases
                a.calls[name] = [Case(True, plain(r["ok"])) if "ok" in r else Case(False, error=str(r["error"]))
                                 for r in got]
                if len(box.ground_truth) > before:
                    a.ground_truth = tuple(a.ground_truth) + tuple(box.ground_truth[before:])
                if all(not r.ok and "is not defined by your definitions" in r.error for r in a.calls[name]) and broken:
                    problems.setdefault(c.cell, f"{name} could not be defined on its own: {broken[0]}")


def _harness(run: Run, check: Check, a: Answers, ctx: Context) -> None:
    from grader.sandbox import SandboxError

    params = check.harness_params(ctx, a) if check.harness_params else {}
    with _new_sandbox(run, [check], strict=check.strict_sandbox, tag=check.cell) as box:
        try:
            result, sections = box.harness(check.harness, params, timeout_s=check.timeout_s)
        except SandboxError as exc:
            raise expect.RuleFail(f"your code, run by the grader on its own inputs, failed: {exc}") from None
        finally:
            reached = list(box.ground_truth)
    if reached:
        raise expect.RuleFail(f"your answer called {reached[0].replace(':', '.')}, the course's own implementation "
                              "of the rule this cell asks you to write: it earns no points")
    a.harness, a.sections = plain(result), {k: dataclasses.replace(v, outputs=plain(v.outputs)) for k, v in sections.items()}


def _lines(out: Any) -> list[str]:
    return [str(x) for x in out] if isinstance(out, (list, tuple)) else ([str(out)] if out else [])


def _judge_measured(check: Check, a: Answers, ctx: Context, measure: Callable, shared: dict) -> tuple[list[str], str]:
    """The judge against the grader's own measurement, measured again after a miss (see the module
    docstring); returns the feedback lines and how the cell came out ("" when passed)."""
    misses, extra, seen_load, slowdown = 0, 0, False, 1.0
    while True:
        window = Load()
        try:  # the first try shares the measurements other cells took; a try after a miss measures afresh
            ref = measure(ctx, frozenset(check.measures), slowdown, shared if misses == 0 else {})
            window.close()
            return _lines(check.judge(a, ref)) + ([f"measured on a loaded machine ({window.describe()})"]
                                                   if window.loaded else []), ""
        except expect.RuleFail as exc:  # the answer's own mistake: a new measurement cannot change it
            if not window.closed:
                window.close()
            return [], str(exc)
        except expect.Fail as exc:
            if not window.closed:
                window.close()
            err, busy = exc, window.loaded
            machine = busy or isinstance(exc, expect.Unusable)
        if busy:
            seen_load, slowdown = True, max(slowdown, window.slowdown)
        misses += 1
        if misses < ATTEMPTS or (machine and extra < NOISY_RETRIES):
            extra += misses >= ATTEMPTS
            time.sleep(NOISY_PAUSE_S if machine else 0)
            continue
        where = f" ({window.describe()})"
        if isinstance(err, expect.Unusable) and seen_load:
            return [f"not compared, so not counted against you: {err}, in all {misses} tries{where}"], ""
        if isinstance(err, expect.Unusable):
            return [], f"{err}, in all {misses} tries on a quiet machine{where}"
        return [], str(err) + (f" (measured {misses} times; the machine was loaded{where})" if seen_load else "")


def judge_all(run: Run) -> dict[str, Verdict]:
    """The verdict of every graded code cell of ``run.lab`` (cells its judges do not list are failed
    with a message: a lab must judge every graded cell)."""
    judges, reference = run.lab.judges, run.lab.part("reference")
    specs = run.lab.answers
    checks = {c.cell: c for c in judges.CHECKS}
    verdicts, answers, problems, shared = {}, {}, {}, {}
    use_record = run.record is not None and run.record_context is not None
    for cell, max_points in run.points.items():
        check = checks.get(cell)
        if check is None:
            verdicts[cell] = Verdict(cell, 0.0, max_points, COMPUTED, f"no judge for {cell}: a fault of the course")
            continue
        recorded = use_record and bool(check.measures) and not check.always_live
        try:
            if recorded:
                payload = {"values": run.record.get("answers", {}).get(cell, {}),
                           "missing": run.record.get("missing", {}).get(cell, [])}
            else:
                payload = parse_export(run.exports.get(cell), cell)
            answers[cell] = decode(specs.get(cell, {}), payload)
        except (ValueError, AnswerError) as exc:
            verdicts[cell] = Verdict(cell, 0.0, max_points, RECORD if recorded else (LIVE if check.measures else COMPUTED),
                                     str(exc), provisional=recorded)
    todo = [checks[c] for c in run.points if c in answers]
    t0 = time.perf_counter()
    _calls(run, todo, answers, problems)
    run.calls_s = time.perf_counter() - t0
    for check in todo:
        started = time.perf_counter()
        cell, a, max_points = check.cell, answers[check.cell], run.points[check.cell]
        recorded = use_record and bool(check.measures) and not check.always_live
        mode = RECORD if recorded else (LIVE if check.measures else COMPUTED)
        ctx = run.record_context if recorded else run.live
        notes, message = [], ""
        try:
            if cell in problems:
                raise expect.RuleFail(problems[cell])
            if a.ground_truth:
                name = a.ground_truth[0].replace(":", ".")
                raise expect.RuleFail(f"your answer called {name}, the course's own implementation of the rule this "
                                  "cell asks you to write: it earns no points")
            if check.harness:
                _harness(run, check, a, ctx)
            if not check.measures:
                notes = _lines(check.judge(a, None))
            elif recorded:
                notes = _lines(check.judge(a, reference.from_record(ctx, run.record)))
            else:
                notes, message = _judge_measured(check, a, ctx, reference.measure, shared)
        except expect.Fail as exc:
            message = str(exc)
        except Exception as exc:  # a judge's own fault: say so, never a traceback in the feedback
            message = f"the grader could not judge this cell ({type(exc).__name__}: {exc}): a fault of the course"
        if recorded:
            notes.insert(0, f"from your record of {ctx.device_name}: checked for consistency and against the "
                            "datasheet, not re-measured (this grading machine has no GPU); provisional")
        elif run.record_problem and check.measures:
            notes.insert(0, run.record_problem)
        verdicts[cell] = Verdict(cell, 0.0 if message else max_points, max_points, mode, message, notes,
                                 provisional=recorded, seconds=time.perf_counter() - started)
    return {c: verdicts[c] for c in run.points if c in verdicts}
