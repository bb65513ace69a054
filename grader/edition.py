"""``python -m grader release --student-repo DIR``: the repository a class gets.

This repository is the instructors': ``grader/source/`` holds every solution and hidden test,
``grader/release.py`` types the solutions into a notebook (``reference_submission``), and
``grader/phaseN.py`` and the grading half of ``grader/phaseN_records.py`` compute the reference
answers hidden tests compare with. The student edition holds what a learner runs and nothing
that grades:

- ``notebooks/`` as released (nbgrader has stripped solutions and hidden tests);
- ``utils/`` byte for byte: a measurement record carries a hash of ``utils/`` that the grader
  compares with its own (``utils/record.py``, ``docs/grading.md``);
- from ``grader/``: ``__init__.py``, ``checks.py`` and ``tamper.py`` (the notebooks import
  ``grader.checks``), each ``phaseN_records.py`` cut down to ``save_record`` and what it calls
  (:func:`record_writer`), ``student_check.py`` and ``__main__.py``, which runs
  ``student_check`` where there is no ``grader/source/``;
- ``deploy/``, the ``benchmarks/`` scripts the labs launch (any that needs an instructor module
  is left out), ``docs/reference.md``, the requirements, ``course.toml``, ``.gitignore``;
- a README written for learners (:func:`readme`).

Before it returns, the edition is searched for nbgrader's solution and hidden-test markers;
tests/grader/test_student_edition.py also searches it for every solution and hidden-test line.
"""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from grader import NOTEBOOKS_DIR, REPO_ROOT, SOURCE_DIR
from grader import course as C
from grader import release as R

GRADER_AS_IS = ("__init__.py", "__main__.py", "checks.py", "tamper.py", "student_check.py")
RECORDS = tuple(f"phase{n}_records.py" for n in range(6))
TREES = ("utils", "deploy", "benchmarks")
FILES = ("requirements.txt", "environment.yml", "course.toml", ".gitignore", "docs/reference.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.record.json", ".venv*")
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
KEPT = "save_record"


def instructor_modules(root: Path = REPO_ROOT) -> set[str]:
    """The ``grader`` modules the edition does not ship."""
    return {p.stem for p in (root / "grader").glob("*.py")} - {Path(n).stem for n in GRADER_AS_IS + RECORDS}


def needs_instructor_code(text: str, left_out: set[str]) -> str | None:
    """What of the instructors' ``text`` uses: ``grader/source/`` (the solutions), or the first instructor module it
    imports or runs (``grader.release``, ``grader/gpu_check.py``); None when it uses neither."""
    if re.search(r'"grader"\s*/\s*"source"|grader/source/', text):
        return "grader/source/"
    names = re.findall(r"\bgrader[./](\w+)", text) + [n for m in re.findall(r"from grader import ([\w, ]+)", text)
                                                      for n in re.split(r"[ ,]+", m) if n]
    return next((f"grader/{n}.py" for n in names if n in left_out), None)


def _top_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def record_writer(text: str, name: str = "a phase's records module") -> str:
    """A ``phaseN_records.py`` cut down to :data:`KEPT` (``save_record``) and the top-level
    definitions it reaches, with the module's imports; the record checks, where the reference
    computations live, are left out."""
    tree = ast.parse(text)
    defs = {n: node for node in tree.body for n in _top_names(node)}
    if KEPT not in defs:
        raise C.CourseError(f"{name} has no {KEPT}() for the notebooks to write their records with")
    keep, todo = set(), [KEPT]
    while todo:
        n = todo.pop()
        if n in defs and n not in keep:
            keep.add(n)
            todo += [x.id for x in ast.walk(defs[n]) if isinstance(x, ast.Name)]
    doc = (f'"""The measurement-record writer of the instructors\' {name}: ``{KEPT}`` and what it\n'
           'uses. Checking a record is the grader\'s work and is not in the student edition."""')
    lines, imports, body = text.splitlines(), [], []
    for node in tree.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        segment = "\n".join(lines[start - 1:node.end_lineno])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(segment)
        elif _top_names(node) & keep:
            body.append(segment)
    out = doc + "\n" + "\n".join(imports) + "\n\n\n" + "\n\n\n".join(body) + "\n"
    compile(out, name, "exec")
    return out


def check_destination(dest: Path, root: Path = REPO_ROOT) -> Path:
    """``dest`` resolved, if the edition may be written there: a new or empty folder outside the repository."""
    dest = Path(dest).expanduser().resolve()
    if dest == root or root in dest.parents:
        raise C.CourseError(f"{dest} is inside the course repository: write the student edition to a folder outside it")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise C.CourseError(f"{dest} exists and is not an empty folder: the student edition goes into a new or empty one")
    return dest


def readme(pub: R.Published, names: list[str], notebooks_dir: Path = NOTEBOOKS_DIR) -> str:
    """The edition's README.md, for learners."""
    first = names[0] if names else "00_foundations"
    return f"""# GPU Utilization Roadmap: the labs

Six lab notebooks on finding where a GPU sits idle and fixing it: timing and the roofline, one
GPU's training loop, several GPUs, inference and serving, load testing and production metrics,
hardware and cost. Every number you report is measured, by you and again by the grader.

## Open a lab

{R.links(pub, names, notebooks_dir)}

## Your first hour on Colab or Kaggle

Open a lab and run its first cell. It finds the course: in the notebook's own folder, in a zip of
this repository you uploaded (Colab: to `/content/` from the Files panel; Kaggle: to
`/kaggle/working/`, or the repository attached as a dataset with Add Input), in your Google Drive
once it is mounted, or by cloning the repository's address (`os.environ["GPULAB_REPO_URL"] = "..."`
in a cell above sets another one; on Kaggle, cloning and installing need Settings > Internet on).
Then it installs what the runtime lacks, one line per package; an optional package that will not
install costs one line, and the cells that use it say what they do instead. When it cannot find
the course it stops with one line that says what to do. Next pick a GPU (Colab: Runtime > Change
runtime type > T4 GPU; Kaggle: Settings > Accelerator, GPU T4 x2 for lab 02's two GPUs) and run
the cells from the top; on a runtime without a GPU the lab says so and runs in smoke mode (tiny
sizes on the CPU, lenient checks).

## On your own machine

```bash
pip install -r requirements.txt && python -m utils && jupyter lab notebooks/{first}.ipynb
```

`python -m utils` prints what the labs will run on.

## Checking your work

```bash
python -m grader check notebooks/{first}.ipynb
```

runs a copy of the notebook from the top in a fresh kernel (your folder is left as it is) and
prints each graded cell with its visible tests: passed, failed (and why) or graded by your
instructor. The hidden tests run when your instructor grades: they re-measure your numbers on the
grader's machine and try your code on inputs you have not seen, so passing here is necessary,
not sufficient.

## Handing in

Hand in the notebook, and with it the `<lab>.record.json` it wrote beside itself if you ran it on
a GPU: a grader without a GPU grades your measured cells from that record.

## What is here

```
notebooks/   the labs
utils/       the measurement package the labs import
grader/      what the notebooks import from the grader, and `python -m grader check`
benchmarks/  the scripts the labs launch (multi-GPU training, all-reduce, post-training)
deploy/      Dockerfile, Kubernetes manifests, Prometheus config, Grafana dashboard
```
"""


def markers_in(dest: Path) -> list[str]:
    """Files of ``dest`` that hold an nbgrader solution or hidden-test marker."""
    out = []
    for p in sorted(dest.rglob("*")):
        if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".sh", ".txt", ".toml", ".yaml", ".yml", ".json"):
            text = p.read_text(encoding="utf-8", errors="replace")
            out += [f"{p.relative_to(dest)}: {m}" for m in MARKERS if m in text]
    return out


def write_edition(dest: Path, root: Path = REPO_ROOT, notebooks_dir: Path = NOTEBOOKS_DIR,
                  source_dir: Path = SOURCE_DIR, pub: R.Published | None = None) -> list[str]:
    """Write the student edition into ``dest`` (new or empty) from ``notebooks/`` as they are
    (``python -m grader release --student-repo`` releases first); returns what it wrote, one line each."""
    dest = check_destination(dest, root)
    pub = pub or R.published(root / "course.toml")
    names = C.assignments(source_dir)
    missing = [a for a in names if not (notebooks_dir / f"{a}.ipynb").is_file()]
    if not names or missing:
        raise C.CourseError(f"no released notebook for {', '.join(missing) or 'any assignment'}: run `python -m grader release`")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        (dest / "notebooks").mkdir()
        for a in names:
            shutil.copy2(notebooks_dir / f"{a}.ipynb", dest / "notebooks")
        for tree in TREES:
            shutil.copytree(root / tree, dest / tree, ignore=IGNORE)
        left_out, dropped = instructor_modules(root), []
        for p in sorted((dest / "benchmarks").rglob("*")):
            if p.is_file() and p.suffix in (".py", ".sh") and (why := needs_instructor_code(p.read_text(), left_out)):
                p.unlink()
                dropped.append(f"{p.relative_to(dest)} (it needs {why})")
        for rel in FILES:
            if (root / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, dest / rel)
        (dest / "grader").mkdir()
        for name in GRADER_AS_IS:
            shutil.copy2(root / "grader" / name, dest / "grader" / name)
        for name in RECORDS:
            text = (root / "grader" / name).read_text(encoding="utf-8")
            (dest / "grader" / name).write_text(record_writer(text, f"grader/{name}"), encoding="utf-8")
        (dest / "README.md").write_text(readme(pub, names, notebooks_dir), encoding="utf-8")
        leaks = markers_in(dest)
        if leaks:
            raise C.CourseError(f"the edition would hold solution or hidden-test markers ({leaks[0]}): nothing was written")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    files = sum(1 for p in dest.rglob("*") if p.is_file())
    lines = [f"wrote the student edition to {dest} ({files} files): {len(names)} notebooks, utils/, grader/ "
             "(the notebooks' imports and `grader check`), benchmarks/, deploy/, README.md"]
    lines += [f"left out {d}" for d in dropped]
    if not pub.url:
        lines.append("course.toml names no repository yet: its notebooks will not clone it, and its README has no "
                     "Colab or Kaggle links (set [repository] url to where you push it, then release again)")
    return lines
