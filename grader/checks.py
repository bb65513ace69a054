"""Helpers for hidden tests that grade on measured numbers (docs/grading.md).

The rules (each explained in docs/grading.md, "Bands and tolerances" and "When the grader's own
measurement is bad"): learner code is timed through ``utils.timing`` against a baseline the grader
times in the same run (:func:`timed`, :func:`band`, :func:`assert_in_band`); numbers are checked for
plausibility against ``utils.hardware`` (:func:`assert_not_above`); the measurement code must be
the grader's (:func:`assert_untampered`, :mod:`grader.tamper`); with no GPU here and a GPU record
from the learner, measured cells are graded from the record (:func:`grading_mode`); every call into
learner code goes through :func:`quiet`, since nbgrader scores a test cell 0 on any stderr output;
a bad measurement of the grader's own is measured again, never failed on (:func:`agree`).

Hidden tests do not use the ``grader.checks`` the notebook imported: ``grader.phase(n)`` loads this
file, :mod:`grader.tamper` and the phase's modules afresh, so rebinding ``checks`` or patching its
functions in the notebook changes nothing. What lies beyond a kernel's reach (the import machinery,
IPython, the course on disk, the Python environment): docs/grading.md, "What the screen cannot see".
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import numbers
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from grader import tamper  # grader.phase(n) rebinds it to a fresh copy; look it up at call time

MARK = "grader:"  # grader/worker.py reads these lines from test-cell stdout
RECORD_VAR = "GPULAB_SUBMITTED_RECORD"
GPU_BAND_FLOOR = 0.35  # +-35% at least: clocks, thermals and a few seconds between the two measurements
SMOKE_BAND_FLOOR = 1.5  # x2.5 either way on a CPU: --jobs N shares the cores with other graded notebooks
SPREAD_FACTOR = 3.0  # band = SPREAD_FACTOR x the noisier run's (p80 - p20) / median, when wider than the floor
GPU_BAND_CAP = 1.0  # never wider than x2 either way on a GPU, however noisy: a band must be able to fail
SMOKE_BAND_CAP = 3.0  # x4 either way on a CPU: 500 "TFLOP/s" from a CPU matmul still fails
DATASHEET_SLACK = 1.05  # a measurement may read 5% over a datasheet figure (rounding, boost); more is impossible
LIVE, RECORD = "measured live", "graded from record"
NOISY_RETRIES, NOISY_PAUSE_S = 2, 1.0  # agree(): attempts more after misses that were the machine's, a pause before each
LOAD_BAND_CAP = {True: 7.0, False: 2.0}  # widened, never wider than x8 in smoke mode, x3 on a GPU: 10x still fails
_MINE: list = []  # the grader's own timings (timed()) in this agree(): band() checks their spread
_SLACK = {"factor": 1.0, "why": "", "noisy": ""}  # agree(): slowdown under load and why; why its own runs are in doubt
_REFS: dict[str, list[float]] = {}  # the grader's re-measurements per checked name, over the tries of one agree()


# -- output hygiene -------------------------------------------------------------------------

@contextlib.contextmanager
def quiet():
    """Run learner code with stderr captured and warnings off: a warning or a progress bar on
    stderr would cost the whole test cell its points under nbgrader, wherever it came from. Both levels:
    ``sys.stderr`` and file descriptor 2 (C extensions write there; ipykernel forwards it as stderr)."""
    buf = io.StringIO()
    saved_fd = None
    try:
        sys.stderr.flush()
        saved_fd = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 here: Python-level capture only
        saved_fd = None
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(buf):
            warnings.simplefilter("ignore")
            yield buf
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)


def say(message: str) -> None:
    """One line for the learner's feedback, on stdout (stderr would zero the cell)."""
    print(f"{MARK} {message}", flush=True)


# -- values ---------------------------------------------------------------------------------

def as_number(value: Any, name: str) -> float:
    """``value`` as a float, else a clear AssertionError: built-in and numpy numbers or a one-element
    tensor only, so an object with a doctored ``__eq__`` cannot pass an equality test here."""
    mod = type(value).__module__
    if type(value).__name__ == "Tensor" and mod.startswith("torch") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.detach().cpu().item()
        mod = type(value).__module__
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or mod not in ("builtins", "numpy"):
        raise AssertionError(f"{name} must be a number (a Python float), got {type(value).__name__}: {value!r:.80}")
    if not math.isfinite(v := float(value)):
        raise AssertionError(f"{name} must be a finite number, got {v}")
    return v


def as_label(value: Any, allowed: tuple[str, ...], name: str) -> str:
    if type(value) is not str or value not in allowed:
        raise AssertionError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r:.80}")
    return value


def assert_close(value: Any, expected: float, name: str, rel: float = 1e-6, abs_tol: float = 0.0) -> None:
    if not math.isclose(v := as_number(value, name), expected, rel_tol=rel, abs_tol=abs_tol):
        raise AssertionError(f"{name} = {v:.6g}, expected {expected:.6g}")


def assert_positive(value: Any, name: str) -> float:
    if not (v := as_number(value, name)) > 0:
        raise AssertionError(f"{name} must be positive, got {v:.6g}")
    return v


def assert_untampered(extra_modules: tuple[str, ...] = ()) -> None:
    """AssertionError naming every patched clock or ``utils`` function, ``extra_modules``
    (a phase's own reference modules, beside ``grader.tamper.UTILS_MODULES``) included, and
    the grader's own modules where they are the imported ones (:func:`grader.tamper.tamper_report`)."""
    tamper.assert_environment_unchanged()
    mods = tamper.UTILS_MODULES + tuple(m for m in extra_modules if m not in tamper.UTILS_MODULES)
    bad = tamper.tamper_report(mods, own=(__name__, tamper.__name__))
    if bad:
        raise AssertionError(
            "measurement code was patched in this notebook, so its numbers cannot be graded: "
            + ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
            + ". Remove the cell that replaces them and restart the kernel.")


def assert_constants_unchanged(modules: tuple[str, ...]) -> None:
    """AssertionError if the notebook rebound a constant of ``modules`` (``utils`` modules
    whose names and thresholds the grader's rules read: :func:`grader.tamper.patched_constants`)."""
    bad = [b for name in modules for b in tamper.patched_constants(importlib.import_module(name))]
    if bad:
        raise AssertionError(f"the notebook changed {', '.join(bad)}, which the grading rules read: remove the cell "
                             "that sets it and restart the kernel")


def assert_given(fn: Any, assignment: str, grade_id: str, name: str) -> None:
    """``fn`` must run the code that the locked cell ``grade_id`` of the source notebook
    ``grader/source/<assignment>/<assignment>.ipynb`` defines as ``name``."""
    path = Path(__file__).resolve().parent / "source" / assignment / f"{assignment}.ipynb"
    cell = next(c for c in json.loads(path.read_text())["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    given = [c for c in compile(text, f"<{grade_id}>", "exec").co_consts if getattr(c, "co_name", "") == name]
    code = getattr(fn, "__code__", None)
    if not given or code is None or not tamper.same_code(code, given[0]):
        raise AssertionError(f"{name} is not the one defined in the locked cell: do not redefine it")


# -- where the numbers come from ------------------------------------------------------------

def gpu_here() -> bool:
    torch = sys.modules.get("torch") or importlib.import_module("torch")
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not tamper.function_is_original(torch.cuda.is_available, cuda.__file__, "is_available"):
        raise AssertionError("torch.cuda.is_available was patched in this notebook, so the grader cannot tell whether "
                             "it has a GPU: remove the cell that replaces it and restart the kernel")
    return bool(torch.cuda.is_available())


def smoke() -> bool:
    from utils.env import smoke_mode

    tamper.assert_environment_unchanged()
    return smoke_mode()


def submitted_record():
    """The learner's record (``GPULAB_SUBMITTED_RECORD``) if it came from a GPU, else None; an unreadable
    file is an AssertionError: a broken or edited record must not fall back to something gentler."""
    tamper.assert_environment_unchanged()
    path = os.environ.get(RECORD_VAR, "").strip()
    if not path:
        return None
    from utils.record import Record

    try:
        rec = Record.load(path)
    except (ValueError, OSError, TypeError) as exc:
        raise AssertionError(f"the submitted measurement record cannot be used: {exc}") from None
    fp = rec.fingerprint if isinstance(rec.fingerprint, dict) else {}
    return rec if fp.get("kind") == "gpu" else None


def announce_from_record(what: str) -> None:
    """Say in the feedback that ``what`` is graded from the learner's GPU record, and when it was taken."""
    import datetime

    rec = submitted_record()
    times = [m.time_unix for m in rec.measurements.values() if isinstance(m.time_unix, (int, float))]
    when = (datetime.datetime.fromtimestamp(max(times), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            if times else "time unknown")
    say(f"{RECORD}: {what} from your {rec.fingerprint.get('name')} run ({when}); "
        "not re-measured, this grading machine has no GPU")


def record_ok(what: str) -> None:
    """The feedback line for a recorded number that passed every record check."""
    say(f"  {what}: fingerprint, utils hash, internal consistency and datasheet limits check out")


def device_name() -> str:
    """The GPU the live checks run on, or the CPU in smoke mode, for the feedback."""
    torch = sys.modules.get("torch") or importlib.import_module("torch")
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (smoke mode: lenient bands)"


def begin(what: str, how: str = "re-measured by the grader in this run", where: str | None = None,
          from_record: str | None = None) -> str:
    """Say how this cell is graded (first, so that a failing cell says it too); returns the mode. From the
    record: :func:`announce_from_record`, or ``from_record``; live: ``what`` on ``where``, ``how``."""
    mode = grading_mode()
    if mode == RECORD and from_record:
        say(f"{RECORD}: no GPU on this grading machine; {what} {from_record}")
    elif mode == RECORD:
        announce_from_record(what)
    else:
        say(f"{LIVE} on {where or device_name()}: {what}, {how}")
    return mode


def say_versus(what: str, mine: float, yours: float, unit: str, rel: float) -> None:
    """The feedback line for one banded comparison: the grader's number, the learner's, the band."""
    say(f"  {what}: grader {mine:.4g} {unit}, yours {yours:.4g} {unit} (band +-{100 * rel:.0f}%{widened()})")


def grading_mode() -> str:
    """:data:`RECORD` when this machine has no GPU and the learner's record is from one (both
    reads check the grading environment first)."""
    if gpu_here():
        return LIVE
    return RECORD if submitted_record() is not None else LIVE


def open_record():
    """``(record, spec row)`` of the learner's submitted GPU record."""
    rec = submitted_record()
    return rec, record_spec(rec)


def record_path(assignment: str, smoke: bool) -> Path:
    """Beside the notebook: a GPU run's record, or a smoke record that never overwrites it."""
    return Path(f"{assignment}.smoke.record.json" if smoke else f"{assignment}.record.json")


def save_record(assignment: str, ns: dict, path: str | Path | None = None):
    """Write the notebook's measurement record: ``grader/phaseN_records.py``'s ``save_record``
    for the assignment ``NN_name`` reads the numbers by name from ``ns`` (the notebook's
    ``globals()``) and writes them beside the notebook (:func:`record_path`)."""
    from grader import answers, labs

    if labs.has(assignment, "answers"):
        return answers.save_record(assignment, ns, path)
    return importlib.import_module(f"grader.phase{int(assignment[:2])}_records").save_record(ns, path)


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name ``utils.hardware`` and ``utils.memory`` use."""
    return str(dtype).removeprefix("torch.")


def assert_defined(ns: dict, names: tuple[str, ...]) -> None:
    """NameError naming every one of ``names`` the notebook's ``ns`` lacks (cells not run yet)."""
    missing = [k for k in names if k not in ns]
    if missing:
        raise NameError(f"run every cell above first: {', '.join(missing)} not defined")


def record_spec(rec):
    """The spec row of the record's GPU, after checking the record is ours and untouched.

    Checks: the fingerprint is a GPU's, the ``utils/`` that took the numbers is this grader's
    (``utils_sha256``), and the card is in ``utils.hardware`` (else its peaks are unknown)."""
    from utils.hardware import spec_for_name
    from utils.record import utils_hash

    fp = rec.fingerprint
    name = str(fp.get("name", ""))
    expected = os.environ.get("GPULAB_UTILS_SHA256") or utils_hash()
    if rec.utils_sha256 != expected:
        raise AssertionError(
            f"the record was taken with a different utils/ (sha256 {rec.utils_sha256[:12] or 'missing'}, "
            f"grader has {expected[:12]}): re-run the notebook on a GPU with this version of the course, unmodified")
    spec = spec_for_name(name)
    if spec is None:
        raise AssertionError(f"the record's GPU {name!r} is not in utils/hardware.py, so its numbers cannot be "
                             "checked against a datasheet: grade on a GPU instead (python -m grader check)")
    mem = fp.get("memory_gib")
    # datasheets' "80 GB" is in practice 80 GiB (torch reports 79.1 GiB for an H100 80GB), so compare in GiB
    if isinstance(mem, (int, float)) and spec.memory_gb and mem > spec.memory_gb * DATASHEET_SLACK:
        raise AssertionError(f"the record says {name} has {mem} GiB, more than its datasheet {spec.memory_gb} GB")
    return spec


def recorded(rec, name: str, *fields: str) -> tuple:
    """``(value, extra[f] for f in fields)`` of measurement ``name``; AssertionError if absent."""
    m = rec.measurements.get(name)
    if m is None:
        raise AssertionError(f"the record has no measurement {name!r}: run the whole notebook before saving it")
    missing = [f for f in fields if f not in m.extra]
    if missing:
        raise AssertionError(f"record measurement {name!r} lacks {', '.join(missing)}")
    return (as_number(m.value, f"record {name}"),) + tuple(m.extra[f] for f in fields)


# -- measuring ------------------------------------------------------------------------------

def timed(fn, *args, max_runs: int = 30, budget_s: float = 3.0, **kwargs):
    """``utils.timing.benchmark`` after checking nobody patched it (the grader's baseline, for :func:`band`)."""
    assert_untampered()
    from utils.timing import benchmark

    with quiet():
        return mine(benchmark(fn, *args, max_runs=max_runs, budget_s=budget_s, **kwargs))


def mine(result):
    """``result`` (median/p20/p80 in ms), marked as the grader's own measurement for :func:`band`."""
    _MINE.append(result)
    return result


def agree(compare, attempts: int, load=None):
    """``compare()`` re-measures and asserts; a miss is measured again, up to ``attempts`` times
    in all (a busy core or a clock dip spoils one run, not several). Returns its result.
    A miss that was the machine's (:class:`Unusable`, the grader's runs too spread or its re-measurements of a value
    disagreeing among the tries beyond the band, or a ``load`` window, ``grader.remeasure.Load``, that found it
    loaded) gets :data:`NOISY_RETRIES` more tries, bands widened (:func:`band`); still unusable under load, it is left out."""
    misses, extra, seen_load = 0, 0, load is None  # without a window, an unusable measurement is the machine's
    _REFS.clear()
    try:
        while True:
            window, _ = (load() if load else None), _SLACK.pop("wide", None)
            try:
                return compare()
            except AssertionError as exc:
                busy = window is not None and window.close().loaded
                err, machine = exc, busy or isinstance(exc, Unusable) or "wide" in _SLACK
            if busy:
                seen_load = True
                _SLACK.update(factor=max(_SLACK["factor"], window.slowdown), why=window.describe())
            elif "wide" in _SLACK and not _SLACK["noisy"]:
                _SLACK["noisy"] = _SLACK["wide"]  # its own measurement, not the learner's answer, is in doubt
            misses += 1
            if misses < attempts or (machine and extra < NOISY_RETRIES):
                extra += misses >= attempts
                time.sleep(NOISY_PAUSE_S if machine else 0)
                continue
            where = f" ({window.describe()})" if window else ""
            if isinstance(err, Unusable) and seen_load:
                say(f"  not compared, so not counted against you: {err}, in all {misses} tries{where}")
                return None
            raise AssertionError(f"{err}, in all {misses} tries on a quiet machine{where}") if isinstance(err, Unusable) else err
    finally:
        _SLACK.update(factor=1.0, why="", noisy="")
        _MINE.clear()
        _REFS.clear()


def call(fn, *args, name: str, show_args: bool = True):
    """The learner's ``fn(*args)``, quietly; its exception becomes a one-line AssertionError,
    naming the arguments (their first 120 characters) unless ``show_args`` is False (a long
    trace says nothing in one line: ``name(...)``)."""
    try:
        with quiet():
            return fn(*args)
    except AssertionError:
        raise
    except Exception as exc:
        shown = f"{args!r:.120}" if show_args else "(...)"
        raise AssertionError(f"{name}{shown} raised {type(exc).__name__}: {exc}") from None


def median(result, name: str) -> float:
    """``result.median_ms`` of a timing result, checked positive (p20/p80 checked as numbers)."""
    as_number(result.p20_ms, f"{name}.p20_ms")
    as_number(result.p80_ms, f"{name}.p80_ms")
    return assert_positive(result.median_ms, f"{name}.median_ms")


class Times:
    """median/p20/p80 in ms from a summary dict, for :func:`band` and :func:`spread`."""

    def __init__(self, summary: dict):
        self.median_ms, self.p20_ms, self.p80_ms = summary["median_ms"], summary["p20_ms"], summary["p80_ms"]


def times_dict(result) -> dict:
    """A timing result's median/p20/p80 and run count, as a record stores them."""
    return {"median_ms": result.median_ms, "p20_ms": result.p20_ms, "p80_ms": result.p80_ms, "runs": result.runs}


def spread(result) -> float:
    """Relative spread of a timing result: ``(p80 - p20) / median``."""
    med = as_number(result.median_ms, "median_ms")
    return (as_number(result.p80_ms, "p80_ms") - as_number(result.p20_ms, "p20_ms")) / med if med > 0 else math.inf


def band(*results, smoke_mode: bool | None = None, floor: float | None = None) -> float:
    """Relative tolerance for comparing two measurements of the same thing: the wider of a floor and 3x the
    larger relative spread among ``results`` (median/p20/p80 in ms), capped; after a miss the grader's own
    (:func:`mine`) or the machine's, widened (:func:`agree`; docs/grading.md, "Bands and tolerances")."""
    return _band([(spread(r), _own(r)) for r in results if r is not None], smoke_mode, floor)


def difference_band(*pairs, smoke_mode: bool | None = None, floor: float | None = None) -> float:
    """:func:`band` for a difference of two medians, pairs ``(longer, shorter)`` (TPOT is ``(tn - t1) / (n - 1)``):
    where ``t1`` is half of ``tn``, 5% of noise in each is 15% in the difference (:func:`difference_spread`)."""
    return _band([(difference_spread(hi, lo), _own(hi) or _own(lo)) for hi, lo in pairs], smoke_mode, floor)


def difference_spread(longer, shorter) -> float:
    """Relative spread of ``longer.median - shorter.median``: both ``p80 - p20`` over the difference (inf if <= 0)."""
    diff = as_number(longer.median_ms, "median_ms") - as_number(shorter.median_ms, "median_ms")
    width = sum(as_number(r.p80_ms, "p80_ms") - as_number(r.p20_ms, "p20_ms") for r in (longer, shorter))
    return width / diff if diff > 0 else math.inf


def _own(result) -> bool:  # one of the grader's own timings (mine())
    return any(result is m for m in _MINE)


def _band(spreads: list[tuple[float, bool]], smoke_mode: bool | None, floor: float | None) -> float:
    """The band from ``(relative spread, the grader's own)`` pairs: see :func:`band`."""
    s = smoke() if smoke_mode is None else smoke_mode
    base = floor if floor is not None else (SMOKE_BAND_FLOOR if s else GPU_BAND_FLOOR)
    cap = max(base, SMOKE_BAND_CAP if s else GPU_BAND_CAP)
    for x, own in spreads:
        if own and not SPREAD_FACTOR * x <= cap:
            _SLACK["wide"] = f"the grader's own runs spread {x:.0%} around their median"
    rel = min(cap, max([base] + [SPREAD_FACTOR * x for x, _ in spreads if math.isfinite(x)]))
    if _SLACK["noisy"]:
        rel = max(rel, LOAD_BAND_CAP[s])
    elif _SLACK["factor"] > 1:
        rel = max(rel, min(LOAD_BAND_CAP[s], math.inf if "wide" in _SLACK else (1 + rel) * _SLACK["factor"] - 1))
    return rel


def under_load() -> bool:  # agree() found the machine loaded on an earlier try of this check (bands widened)
    return _SLACK["factor"] > 1


def widened() -> str:  # why this attempt's bands are wider, for a feedback line ("" when they are not)
    if _SLACK["noisy"]:
        return f"; widened: {_SLACK['noisy']}"
    if _SLACK["factor"] <= 1:
        return ""
    how = _SLACK.get("wide") or f"x{_SLACK['factor']:.2g}"
    return f"; widened for load ({how}): {_SLACK['why']}"


def assert_in_band(value: Any, reference: float, rel: float, name: str, unit: str) -> float:
    """``value`` within a factor ``1 + rel`` of the grader's ``reference`` either way (:func:`usable` first)."""
    v = as_number(value, name)
    reference = usable(reference, f"re-measurement of {name}", unit)
    lo, hi = reference / (1 + rel), reference * (1 + rel)
    refs = _REFS.setdefault(name, [])
    refs.append(reference)
    if not lo <= v <= hi:
        if len(refs) > 1 and max(refs) > min(refs) * (1 + rel):
            _SLACK["wide"] = (f"the grader's own re-measurements of {name} ranged {min(refs):.4g} to {max(refs):.4g} "
                              f"{unit} over {len(refs)} tries")
        raise AssertionError(
            f"{name} = {v:.4g} {unit}, but the grader re-measured {reference:.4g} {unit} in this run; "
            f"accepted {lo:.4g} to {hi:.4g} (band +-{100 * rel:.0f}%, from the measured spread{widened()})")
    return v


def usable(value: Any, what: str, unit: str) -> float:
    """``value`` (the grader's own measurement) as a float; :class:`Unusable` unless positive and finite."""
    v = float(value) if isinstance(value, numbers.Real) else math.nan
    if not (math.isfinite(v) and v > 0):
        raise Unusable(f"the grader's own {what} came back {v:.4g} {unit}")
    return v


class Unusable(AssertionError):
    """The grader's own measurement cannot grade anything (:func:`usable`, :func:`band`): never the learner's fault."""


def assert_not_above(value: Any, ceiling: float | None, name: str, unit: str, what: str) -> None:
    """Plausibility: ``value`` may not exceed a datasheet ``ceiling`` (with 5% slack)."""
    v = as_number(value, name)
    if ceiling is not None and v > ceiling * DATASHEET_SLACK:
        u = f" {unit}" if unit else ""
        raise AssertionError(f"{name} = {v:.4g}{u} is above {what} ({ceiling:.4g}{u}): not physically possible")


def assert_utilization(values: Any, name: str) -> None:
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        p = as_number(v, name)
        if not 0 <= p <= 100:
            raise AssertionError(f"{name} has {p:.4g}%: a utilization is between 0 and 100%")


def assert_memory(peak_gib: Any, total_gib: float | None, name: str) -> None:
    if peak_gib is None:
        return
    p = as_number(peak_gib, name)
    if p < 0 or (total_gib and p > total_gib * DATASHEET_SLACK):
        raise AssertionError(f"{name} = {p:.4g} GiB, but the device has {total_gib:.4g} GiB")
