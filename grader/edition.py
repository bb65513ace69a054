"""``python -m grader release --student-repo DIR``: the repository a class gets.

This repository is the instructors': ``grader/source/`` holds every solution, ``grader/release.py``
types the solutions into a notebook (``reference_submission``), and each lab's judges, reference
measurements and sandbox harnesses (``grader/labs/<lab>/``: the modules :data:`grader.labs.PRIVATE`
names) decide the grades. The student edition holds what a learner runs and nothing that grades:

- ``notebooks/`` as released (nbgrader has stripped the solutions);
- ``utils/`` byte for byte: a measurement record carries a hash of ``utils/`` that the grader
  compares with its own (``utils/measure/record.py``, ``docs/grading.md``);
- the public half of ``grader/`` (:data:`GRADER_AS_IS`): the notebooks' ``grader.checks``, the
  typed boundary they write their answers and records through (``names.py``, ``schema.py``,
  ``answers.py``), ``grader/labs/__init__.py`` and each lab's public modules (its answers schema,
  its sizes, plan and install needs; never its judges, reference, harness or rules: :func:`lab_files`),
  ``grader/portfolio/`` (``python -m grader report``: a lab's README from the learner's own record),
  ``student_check.py`` and ``__main__.py``, which runs ``student_check`` where there is no ``grader/source/``;
- ``deploy/``, the ``benchmarks/`` scripts the labs launch (any that needs an instructor module is
  left out; no measured results), ``docs/reference.md``, the requirements, ``pyproject.toml`` (so
  ``pip install -e .`` installs ``utils`` and ``grader``), ``course.toml``;
- a ``.gitignore`` that keeps the records a learner hands in (:func:`gitignore`);
- ``jupyter/``: Jupyter configuration that turns off nbgrader's Validate button (its
  ``validate_assignment`` server extension and ``@jupyter/nbgrader:validate-assignment`` lab
  plugin, which nbgrader's package enables on install): it would run the visible tests in the
  learner's own server and call that validation, while the grade is decided by the judges
  (:data:`JUPYTER_CONFIG`; the README starts Jupyter with ``JUPYTER_CONFIG_PATH`` pointing there);
- a README written for learners (:func:`readme`).

Before it returns, the edition is searched for nbgrader's solution markers and for any module a
lab keeps private; tests/grader/test_student_edition.py also searches it for every solution line.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from grader import NOTEBOOKS_DIR, REPO_ROOT, SOURCE_DIR, labs
from grader import course as C
from grader import release as R

GRADER_AS_IS = ("__init__.py", "__main__.py", "checks.py", "student_check.py", "names.py", "schema.py", "answers.py",
                "labs/__init__.py", *(f"portfolio/{m}.py" for m in ("__init__", "__main__", "answers", "format", "inputs",
                                                                    "plots", "sections")))
TREES = ("utils", "deploy", "benchmarks")
FILES = ("requirements.txt", "environment.yml", "pyproject.toml", "course.toml", "docs/reference.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.record.json", ".venv*")
BENCHMARK_RESULTS = ("results", "RESULTS.md", "HISTORY.md")  # measured on the course's GPUs: not the learner's to see
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
VALIDATE_SERVER = "nbgrader.server_extensions.validate_assignment"
VALIDATE_LAB = "@jupyter/nbgrader:validate-assignment"
JUPYTER_CONFIG = {  # under jupyter/ in the edition; what `jupyter server extension disable` and `jupyter labextension
    # disable` write (nbgrader's installation guide), read first where JUPYTER_CONFIG_PATH names the folder
    "jupyter_server_config.d/gpulab-no-validate.json": {"ServerApp": {"jpserver_extensions": {VALIDATE_SERVER: False}}},
    "labconfig/page_config.json": {"disabledExtensions": {VALIDATE_LAB: True}},
}


def lab_files(root: Path = REPO_ROOT) -> list[str]:
    """The public modules of every registered lab's folder, relative to ``grader/``: all but
    :data:`grader.labs.PRIVATE` (judges, reference, harness, rules)."""
    out = []
    for package in labs.REGISTRY.values():
        for p in sorted((root / "grader" / "labs" / package).glob("*.py")):
            if p.stem not in labs.PRIVATE:
                out.append(f"labs/{package}/{p.name}")
    return out


def instructor_modules(root: Path = REPO_ROOT) -> set[str]:
    """The ``grader`` modules the edition does not ship, dotted below ``grader`` (``batch``,
    ``labs.foundations.judges``)."""
    shipped = {n.removesuffix(".py").replace("/", ".") for n in GRADER_AS_IS + tuple(lab_files(root))}
    every = {".".join(p.relative_to(root / "grader").with_suffix("").parts) for p in (root / "grader").rglob("*.py")
             if "source" not in p.relative_to(root / "grader").parts[:1]}
    return {m.removesuffix(".__init__") for m in every - shipped}


def needs_instructor_code(text: str, left_out: set[str]) -> str | None:
    """What of the instructors' ``text`` uses: ``grader/source/`` (the solutions), or the first instructor module it
    imports or runs (``grader.release``, ``grader/gpu_check.py``, ``grader.labs.foundations.judges``); None when
    it uses neither."""
    if re.search(r'"grader"\s*/\s*"source"|grader/source/', text):
        return "grader/source/"
    names = [n.replace("/", ".") for n in re.findall(r"\bgrader[./]((?:\w+[./])*\w+)", text)]
    names += [f"{base.lstrip('.')}.{n}".lstrip(".") for base, m in re.findall(r"from grader((?:\.\w+)*) import ([\w, ]+)", text)
              for n in re.split(r"[ ,]+", m) if n]
    for n in names:
        parts = n.split(".")
        hit = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in left_out), None)
        if hit:
            return f"grader/{hit.replace('.', '/')}.py"
    return None


def gitignore(text: str) -> str:
    """The repository's ``.gitignore`` for the edition: without its rules for measurement records
    (``*.record.json``), which a learner commits and hands in with the notebook."""
    return "".join(line for line in text.splitlines(keepends=True) if "record.json" not in line)


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
pip install -r requirements.txt -e . && python -m utils
JUPYTER_CONFIG_PATH="$PWD/jupyter" jupyter lab notebooks/{first}.ipynb
```

`python -m utils` prints what the labs will run on. `JUPYTER_CONFIG_PATH` points Jupyter at this
repository's `jupyter/` settings, which turn off nbgrader's Validate button: validating in your own
server is not grading (see below); `python -m grader check` is what checks your work here.

## Checking your work

```bash
python -m grader check notebooks/{first}.ipynb
```

runs a copy of the notebook from the top in a fresh kernel (your folder is left as it is) and
prints each graded cell with its visible tests: passed, failed (and why) or graded by your
instructor. The visible tests are feedback; your grade is decided when your instructor grades,
outside your notebook: the grader re-measures your numbers on its own machine and tries your
functions on inputs drawn then, which you have not seen. Passing here is necessary, not
sufficient.

## Handing in

Hand in the notebook, and with it the `<lab>.record.json` it wrote beside itself if you ran it on
a GPU (this repository's `.gitignore` keeps records, so you can commit it): a grader without a GPU
judges your measured cells from that record, provisionally, until your instructor counts them.

## What is here

```
notebooks/   the labs
utils/       the measurement package the labs import
grader/      what the notebooks import from the grader (their answers and records), `python -m grader check`
benchmarks/  the scripts the labs launch (multi-GPU training, all-reduce, post-training)
deploy/      Dockerfile, Kubernetes manifests, Prometheus config, Grafana dashboard
jupyter/     Jupyter settings for this repository (nbgrader's Validate button off)
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
        for name in BENCHMARK_RESULTS:
            shutil.rmtree(dest / "benchmarks" / name, ignore_errors=True)
            (dest / "benchmarks" / name).unlink(missing_ok=True)
        left_out, dropped = instructor_modules(root), []
        for p in sorted((dest / "benchmarks").rglob("*")):
            if p.is_file() and p.suffix in (".py", ".sh") and (why := needs_instructor_code(p.read_text(), left_out)):
                p.unlink()
                dropped.append(f"{p.relative_to(dest)} (it needs {why})")
        for rel in FILES:
            if (root / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, dest / rel)
        if (root / ".gitignore").is_file():
            (dest / ".gitignore").write_text(gitignore((root / ".gitignore").read_text()), encoding="utf-8")
        for name in GRADER_AS_IS + tuple(lab_files(root)):
            (dest / "grader" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / "grader" / name, dest / "grader" / name)
        for rel, config in JUPYTER_CONFIG.items():
            (dest / "jupyter" / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / "jupyter" / rel).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (dest / "README.md").write_text(readme(pub, names, notebooks_dir), encoding="utf-8")
        leaks = markers_in(dest) + [f"grader/{m.replace('.', '/')}.py" for m in instructor_modules(root)
                                    if (dest / "grader" / f"{m.replace('.', '/')}.py").exists()]
        if leaks:
            raise C.CourseError(f"the edition would hold solution markers or grading code ({leaks[0]}): nothing was written")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    files = sum(1 for p in dest.rglob("*") if p.is_file())
    lines = [f"wrote the student edition to {dest} ({files} files): {len(names)} notebooks, utils/, grader/ "
             "(the notebooks' imports, the labs' answers schemas and `grader check`), benchmarks/, deploy/, jupyter/ "
             "(no Validate button), README.md"]
    lines += [f"left out {d}" for d in dropped]
    if not pub.url:
        lines.append("course.toml names no repository yet: its notebooks will not clone it, and its README has no "
                     "Colab or Kaggle links (set [repository] url to where you push it, then release again)")
    return lines
