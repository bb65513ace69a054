"""Which lab, record and notebook a ``python -m utils.portfolio`` README is written from.

The command (``utils/portfolio.py``) is given a notebook or a measurement record
(``utils/record.py``). From a notebook: its lab is the released notebook (``notebooks/``) that
shares most of its cell ids, and its record is ``--record`` or the one beside it, the GPU
``<assignment>.record.json`` before the smoke ``<assignment>.smoke.record.json`` (the names
``grader/checks.py``'s ``record_path`` gives). From a record: its lab is the one whose
measurement names it holds (``SIGNATURES``, from each lab's ``save_record`` in
``grader/phase<N>_records.py``), and the notebook is the ``<assignment>.ipynb`` beside it, if
any. Whatever is wrong with the input is a :class:`PortfolioError` of one line that says what
to pass instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from utils import portfolio_answers as A
from utils.env import repo_root
from utils.notebook_lab import grade_ids, lab_of
from utils.record import Record

# Measurement names that only one lab's record holds (grader/phase<N>_records.py, save_record);
# a name ending in "*" is a prefix.
SIGNATURES = {
    "00_foundations": ("tiny_ops_tflops", "elementwise_gbs", "train_tokens_per_s", "train_mfu", "thin_matmul_tflops"),
    "01_single_gpu": ("baseline_tokens_per_s", "optimized_tokens_per_s", "speedup", "lora_peak_gib", "qlora_peak_gib",
                      "naive_profile_step_ms"),
    "02_multi_gpu": ("busbw_gbs", "scaling_efficiency", "exposed_comm_share"),
    "03_inference_serving": ("kv_growth_bytes_per_step", "quant_*", "ttft_ms_*", "batch_*"),
    "04_benchmarking_production": ("capacity_rps", "goodput_rps", "choice_goodput_rps"),
    "05_hardware_and_cost": ("train_samples_per_s", "usd_per_sample", "usd_per_million_tokens",
                             "right_sizing_usd_per_hour", "checkpoint_sync_save_ms", "jax_compile_ms", "resume_identical"),
}


class PortfolioError(Exception):
    """Bad input, said in one line."""


def notebook_lab(nb: dict, path: Path, notebooks_dir: Path | None = None) -> str:
    """The lab whose released notebook (``notebooks/``) shares most of ``nb``'s cell ids; else
    the lab the file name starts with (:func:`utils.notebook_lab.lab_of`)."""
    folder = notebooks_dir or repo_root() / "notebooks"
    lab = lab_of(grade_ids(nb), {lab: folder / f"{lab}.ipynb" for lab in SIGNATURES}, path.stem)
    if lab is None:
        raise PortfolioError(f"{path} is no lab of this course: its cells match none of {', '.join(SIGNATURES)}")
    return lab


def record_lab(rec: Record) -> str | None:
    """The lab whose measurement names the record holds most of; None if none."""
    def hits(lab: str) -> int:
        return sum(any(n == s or (s.endswith("*") and n.startswith(s[:-1])) for n in rec.measurements)
                   for s in SIGNATURES[lab])
    scores = {lab: hits(lab) for lab in SIGNATURES}
    best = max(scores, key=scores.get)
    return best if scores[best] else None


def find_record(notebook: Path, lab: str) -> Path:
    cands = [notebook.with_name(f"{lab}.record.json"), notebook.with_name(f"{lab}.smoke.record.json")]
    for c in cands:
        if c.is_file():
            return c
    raise PortfolioError(f"no measurement record beside {notebook} (looked for {cands[0].name} and {cands[1].name}): "
                         "run the notebook to its last cell, or pass --record FILE")


@dataclass
class Inputs:
    """What a README is written from: the lab, its record, and the notebook when there is one."""
    lab: str
    rec: Record
    record_path: Path
    nb: dict | None = None
    notebook: Path | None = None


RECORD_HINT = "pass the <assignment>.record.json (or .smoke.record.json) a lab's last cell wrote, or its notebook"


def read_record(path: Path) -> Record:
    """The record at ``path``, checked to hold measurements a README can print; PortfolioError
    (one line) otherwise."""
    if not path.is_file():
        raise PortfolioError(f"no measurement record at {path}" + (" (a folder)" if path.is_dir() else "")
                             + f": {RECORD_HINT}")
    try:
        rec = Record.load(path)
    except (ValueError, TypeError, AttributeError) as exc:
        msg = str(exc) if isinstance(exc, ValueError) else "its measurements are not a dict of measurements"
        raise PortfolioError((msg if str(path) in msg else f"{path}: {msg}") + f"; {RECORD_HINT}") from None
    except OSError as exc:
        raise PortfolioError(f"cannot read {path}: {exc.strerror}") from None
    if not isinstance(rec.fingerprint, dict):
        raise PortfolioError(f"{path} is malformed: its fingerprint is not a dict")
    if not rec.measurements:
        raise PortfolioError(f"{path} holds no measurements: run the notebook to its last cell")
    bad = [k for k, m in rec.measurements.items() if not isinstance(m.extra, dict) or isinstance(m.value, bool)
           or not isinstance(m.value, (int, float)) or not isinstance(m.unit, str)]
    if bad:
        raise PortfolioError(f"{path} is malformed: measurement {bad[0]!r} needs a number, a unit and a dict of extras")
    return rec


def read_notebook(path: Path) -> dict:
    """The notebook at ``path``; PortfolioError (one line) when it is missing or not a notebook."""
    if not path.is_file():
        raise PortfolioError(f"no notebook at {path}" + (" (a folder)" if path.is_dir() else "")
                             + ": pass the lab notebook you ran, or the record it wrote")
    try:
        return A.load_notebook(path)
    except ValueError as exc:
        raise PortfolioError(str(exc)) from None
    except OSError as exc:
        raise PortfolioError(f"cannot read {path}: {exc.strerror}") from None


def _same_lab(rec: Record, path: Path, lab: str, notebook: Path) -> None:
    theirs = record_lab(rec)
    if theirs != lab:
        what = f"a record of lab {theirs}" if theirs else "a record of no lab of this course"
        raise PortfolioError(f"{path} is {what} (it holds {', '.join(sorted(rec.measurements)[:4])}), "
                             f"but {notebook.name} is lab {lab}")


def is_record_path(path: Path) -> bool:
    """A record is named ``*.json`` (``<assignment>.record.json``); a notebook ``*.ipynb``."""
    return path.suffix.lower() != ".ipynb"


def load(path: Path, record: Path | None = None) -> Inputs:
    """The inputs of a README, checked, from a notebook (and ``record``, else the record beside
    it) or from a record (and the ``<assignment>.ipynb`` beside it, if any); PortfolioError otherwise."""
    if is_record_path(path):
        if record is not None:
            raise PortfolioError(f"{path} is already the record: --record goes with a notebook")
        rec = read_record(path)
        lab = record_lab(rec)
        if lab is None:
            raise PortfolioError(f"{path} is a record of no lab of this course (it holds "
                                 f"{', '.join(sorted(rec.measurements)[:4])}; the labs are {', '.join(SIGNATURES)}): "
                                 f"{RECORD_HINT}")
        beside = path.with_name(f"{lab}.ipynb")
        if not beside.is_file():
            return Inputs(lab, rec, path)
        nb = read_notebook(beside)
        _same_lab(rec, path, notebook_lab(nb, beside), beside)
        return Inputs(lab, rec, path, nb, beside)
    nb = read_notebook(path)
    lab = notebook_lab(nb, path)
    record_path = record or find_record(path, lab)
    rec = read_record(record_path)
    _same_lab(rec, record_path, lab, path)
    return Inputs(lab, rec, record_path, nb, path)
