"""Which lab, record and notebook a ``python -m grader report`` README is written from.

The command (``grader/portfolio/__init__.py``) is given a notebook or a measurement record: the JSON a lab's
last cell writes with ``checks.save_record("<assignment>", globals())`` (``grader/answers.py``,
schema :data:`grader.names.RECORD_SCHEMA`): the answers of every graded cell, the names still
missing, the machine's fingerprint, its size tier and matmul dtype. From a record, the lab is the
record's ``assignment`` and the notebook is the ``<assignment>.ipynb`` beside it, if any. From a
notebook, the lab is the released notebook (``notebooks/``) that shares most of its cell ids, and
its record is ``--record`` or the one beside it, the GPU ``<assignment>.record.json`` before the
smoke ``<assignment>.smoke.record.json`` (``grader.answers.record_path``). Whatever is wrong with
the input is a :class:`PortfolioError` of one line that says what to pass instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from grader import labs
from grader.answers import record_path
from grader.names import RECORD_SCHEMA
from grader.portfolio import answers as A
from utils.course.env import repo_root
from utils.course.notebook_lab import grade_ids, lab_of

LABS = labs.assignments()
RECORD_HINT = "pass the <assignment>.record.json (or .smoke.record.json) a lab's last cell wrote, or its notebook"


class PortfolioError(Exception):
    """Bad input, said in one line."""


@dataclass
class Inputs:
    """What a README is written from: the lab, its record (as read), and the notebook when there is one."""
    lab: str
    data: dict
    record_path: Path
    nb: dict | None = None
    notebook: Path | None = None
    titles: dict[str, str] = field(default_factory=dict)  # grade_id -> the exercise's heading
    title: str = ""  # the notebook's own title


def released_notebook(lab: str) -> dict | None:
    """The released notebook of ``lab`` (``notebooks/``), or None where this copy has none."""
    try:
        return A.load_notebook(repo_root() / "notebooks" / f"{lab}.ipynb")
    except (OSError, ValueError):
        return None


def notebook_lab(nb: dict, path: Path, notebooks_dir: Path | None = None) -> str:
    """The lab whose released notebook shares most of ``nb``'s cell ids; else the lab the file
    name starts with (:func:`utils.course.notebook_lab.lab_of`)."""
    folder = notebooks_dir or repo_root() / "notebooks"
    lab = lab_of(grade_ids(nb), {lab: folder / f"{lab}.ipynb" for lab in LABS}, path.stem)
    if lab is None:
        raise PortfolioError(f"{path} is no lab of this course: its cells match none of {', '.join(LABS)}")
    return lab


def find_record(notebook: Path, lab: str) -> Path:
    cands = [record_path(lab, False, notebook.parent), record_path(lab, True, notebook.parent)]
    for c in cands:
        if c.is_file():
            return c
    raise PortfolioError(f"no measurement record beside {notebook} (looked for {cands[0].name} and {cands[1].name}): "
                         "run the notebook's last cell (it writes the record even with exercises left to do), "
                         "or pass --record FILE")


def read_record(path: Path) -> dict:
    """The record at ``path``, checked to be a record of a lab of this course that a README can
    print; PortfolioError (one line) otherwise."""
    if not path.is_file():
        raise PortfolioError(f"no measurement record at {path}" + (" (a folder)" if path.is_dir() else "")
                             + f": {RECORD_HINT}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PortfolioError(f"cannot read {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PortfolioError(f"{path} is not a measurement record (not JSON: {str(exc).splitlines()[0][:80]}); "
                             f"{RECORD_HINT}") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema == "gpulab.record/1":
        raise PortfolioError(f"{path} was written by an older version of the course (gpulab.record/1): run the "
                             "notebook's last cell again to write the record this version reads")
    if schema != RECORD_SCHEMA:
        raise PortfolioError(f"{path} is not a measurement record of this course (schema {RECORD_SCHEMA}); {RECORD_HINT}")
    lab = data.get("assignment")
    if lab not in LABS:
        raise PortfolioError(f"{path} is a record of {lab!r}, no lab of this course (the labs are {', '.join(LABS)})")
    if not isinstance(data.get("fingerprint"), dict):
        raise PortfolioError(f"{path} is malformed: its fingerprint is not a dict")
    answers, missing = data.get("answers"), data.get("missing", {})
    if not isinstance(answers, dict) or not all(isinstance(v, dict) for v in answers.values()):
        raise PortfolioError(f"{path} is malformed: its answers are not a dict of each graded cell's answers")
    if not isinstance(missing, dict) or not all(isinstance(v, list) for v in missing.values()):
        raise PortfolioError(f"{path} is malformed: its missing answers are not a dict of lists")
    return data


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


def is_record_path(path: Path) -> bool:
    """A record is named ``*.json`` (``<assignment>.record.json``); a notebook ``*.ipynb``."""
    return path.suffix.lower() != ".ipynb"


def _inputs(lab: str, data: dict, path: Path, nb: dict | None, notebook: Path | None) -> Inputs:
    named = nb if nb is not None else released_notebook(lab)
    titles = A.exercise_titles(named) if named is not None else {}
    return Inputs(lab, data, path, nb, notebook, titles, (A.title(named) if named is not None else None) or lab)


def load(path: Path, record: Path | None = None) -> Inputs:
    """The inputs of a README, checked, from a notebook (and ``record``, else the record beside
    it) or from a record (and the ``<assignment>.ipynb`` beside it, if any); PortfolioError otherwise."""
    if is_record_path(path):
        if record is not None:
            raise PortfolioError(f"{path} is already the record: --record goes with a notebook")
        data = read_record(path)
        lab = data["assignment"]
        beside = path.with_name(f"{lab}.ipynb")
        if not beside.is_file():
            return _inputs(lab, data, path, None, None)
        nb = read_notebook(beside)
        if notebook_lab(nb, beside) != lab:
            raise PortfolioError(f"{beside.name} beside {path.name} is lab {notebook_lab(nb, beside)}, not {lab}: "
                                 "move one of them, or pass the notebook with --record")
        return _inputs(lab, data, path, nb, beside)
    nb = read_notebook(path)
    lab = notebook_lab(nb, path)
    rpath = record or find_record(path, lab)
    data = read_record(rpath)
    if data["assignment"] != lab:
        raise PortfolioError(f"{rpath} is the record of lab {data['assignment']}, but {path.name} is lab {lab}")
    return _inputs(lab, data, rpath, nb, path)
