"""The student edition (``python -m grader release --student-repo DIR``, grader/edition.py): what a
class gets holds no solution and nothing that grades, keeps the records a learner hands in, offers
no Validate button, and its ``python -m grader check`` runs the visible tests.

Two independent searches for leaks: every solution line of the sources (normalised, non-trivial)
looked for in every file of the edition; and every line of the modules a lab keeps private
(judges, reference, harness, rules: ``grader.labs.PRIVATE``) and of the grader's own modules that
do not ship, with nbgrader's markers and the names those modules define, looked for as text.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.nbcells import src

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "grader" / "source").glob("*/*.ipynb"))
TEXT = (".py", ".ipynb", ".md", ".sh", ".txt", ".toml", ".yaml", ".yml", ".json", ".cfg")
MIN_CHARS = 20  # a normalised line shorter than this ("return out", "x = x.cuda()") says nothing of a solution
# Lines of a solution that a shipped file holds as well, each with the reason it ships all the same. utils/
# ships byte for byte (a record carries a hash of it, which the grader checks against its own: utils/measure/record.py);
# there each names the library code the exercise asks the learner to write again.
SHARED_BY_DESIGN = {
    "utils/train/checkpoint.py": "lab 05's capture_rng_state/restore_rng_state are what utils.train.checkpoint does for its runs",
    "utils/tpu/xla.py": "lab 05's bucket_length is the bucket choice utils.tpu.xla makes",
    "utils/measure/flops.py": "lab 00's arithmetic_intensity is utils.measure.flops' one-line definition",
    "utils/diagnosis/profile_diagnosis.py": "lab 01's diagnose shares a rule with utils.diagnosis.profile_diagnosis",
    "utils/diagnosis/diagnosis_cases.py": "lab 01's diagnose shares a None check with the cases built for it",
}


def norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def nontrivial(line: str) -> bool:
    return len(line) >= MIN_CHARS and len(re.findall(r"[A-Za-z_]\w*", line)) >= 2


def secret_lines() -> dict[str, str]:
    """``{normalised line: "<lab> solution"}`` for every non-trivial line between nbgrader's solution
    markers (a whole solution cell without markers counts whole) that the source does not also show."""
    secret, visible = {}, set()
    for path in SOURCES:
        for c in json.loads(path.read_text())["cells"]:
            meta = c.get("metadata", {}).get("nbgrader", {})
            text = src(c)
            keep = "solution" if meta.get("solution") and "### BEGIN SOLUTION" not in text else None
            for line in text.splitlines():
                if "### BEGIN" in line:
                    keep = "hidden test" if "HIDDEN" in line else "solution"
                elif "### END" in line:
                    keep = None
                elif keep is None:
                    visible.add(norm(line))
                elif nontrivial(norm(line)):
                    secret.setdefault(norm(line), f"{path.stem} {keep}")
    return {line: what for line, what in secret.items() if line not in visible}


def grading_modules() -> list[Path]:
    """The grader's files the edition must not hold: every lab's private modules and the grader's
    own modules that do not ship (grader/edition.py, ``instructor_modules``), but the edition's
    writer itself, whose README template is the edition's README."""
    from grader.edition import instructor_modules

    return [ROOT / "grader" / f"{m.replace('.', '/')}.py" for m in sorted(instructor_modules())
            if (ROOT / "grader" / f"{m.replace('.', '/')}.py").is_file() and m != "edition"]  # it writes the README


def public_lines() -> set[str]:
    """Every line of the files the edition ships from the repository (its utils/, the public grader
    modules, the notebooks): a grading module's line found there too is shared, not a leak."""
    from grader.edition import GRADER_AS_IS, lab_files

    paths = [p for tree in ("utils", "deploy", "benchmarks") for p in (ROOT / tree).rglob("*")
             if p.is_file() and p.suffix in TEXT and "results" not in p.relative_to(ROOT).parts]
    paths += [ROOT / "grader" / n for n in (*GRADER_AS_IS, *lab_files())] + list((ROOT / "notebooks").glob("*.ipynb"))
    return set().union(*(edition_lines(p) for p in paths))


def grading_lines() -> dict[str, str]:
    """``{normalised line: file}`` of every non-trivial line of the grading modules that no shipped file holds."""
    public, out = public_lines(), {}
    for p in grading_modules():
        for line in edition_lines(p):
            if nontrivial(line) and line not in public:
                out.setdefault(line, str(p.relative_to(ROOT)))
    return out


def grading_names() -> set[str]:
    """Top-level functions and classes the lab's private modules define (``check_matmul``, ``measure``,
    ``from_record``, ``Reference``), except names a shipped grader module defines too."""
    from grader import labs

    def defined(p: Path) -> set[str]:
        return {n.name for n in ast.parse(p.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}

    private = [p for p in grading_modules() if p.parent.parent.name == "labs" and p.stem in labs.PRIVATE]
    shipped = set().union(*(defined(p) for p in (ROOT / "grader").rglob("*.py") if p not in grading_modules()
                            and "source" not in p.parts))
    return set().union(*(defined(p) for p in private)) - shipped


def edition_lines(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".ipynb":
        text = "\n".join(src(c) for c in json.loads(text)["cells"])
    return {norm(line) for line in text.splitlines()}


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    from grader.edition import write_edition

    dest = tmp_path_factory.mktemp("students") / "edition"
    lines = write_edition(dest)
    assert lines[0].startswith(f"wrote the student edition to {dest}")
    return dest


def files(edition: Path) -> list[Path]:
    return [p for p in sorted(edition.rglob("*")) if p.is_file()]


def test_the_edition_has_what_a_learner_runs_and_nothing_that_grades(edition):
    from grader import labs
    from grader.course import assignments
    from grader.edition import GRADER_AS_IS

    top = {p.name for p in edition.iterdir()}
    assert {"notebooks", "utils", "grader", "deploy", "benchmarks", "jupyter", "README.md", "requirements.txt", "pyproject.toml"} <= top
    assert not {"tests", ".git"} & top and not (edition / "docs" / "grading.md").exists()
    assert sorted(p.stem for p in (edition / "notebooks").glob("*.ipynb")) == assignments()
    shipped = {p.relative_to(edition / "grader").as_posix() for p in (edition / "grader").rglob("*") if p.is_file()}
    public = {f"labs/{pkg}/{m}.py" for pkg in labs.REGISTRY.values() for m in ("__init__", "answers", "sizes", "setup", "plan")}
    assert shipped == set(GRADER_AS_IS) | public, shipped ^ (set(GRADER_AS_IS) | public)
    assert not [p for p in (edition / "grader").rglob("*.py") if p.stem in labs.PRIVATE]
    assert not list(edition.rglob("gradebook.db")) and not (edition / "grader" / "source").exists()
    assert not (edition / "benchmarks" / "results").exists() and not list(edition.rglob("*.record.json"))
    assert not {"RESULTS.md", "HISTORY.md"} & {p.name for p in (edition / "benchmarks").iterdir()}
    for name in ("utils", "deploy"):  # byte for byte: a record's hash of utils/ must match the grader's
        mine = {p.relative_to(ROOT / name): p.read_bytes() for p in (ROOT / name).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
        theirs = {p.relative_to(edition / name): p.read_bytes() for p in (edition / name).rglob("*") if p.is_file()}
        assert mine == theirs, name
    for nb in (edition / "notebooks").glob("*.ipynb"):
        assert nb.read_bytes() == (ROOT / "notebooks" / nb.name).read_bytes()


def test_no_solution_line_is_in_the_edition(edition):
    secret = secret_lines()
    assert len(secret) > 100, "the sources' solutions were not found"
    found, by_design = [], []
    for path in files(edition):
        if path.suffix not in TEXT:
            continue
        rel = path.relative_to(edition).as_posix()
        for line in edition_lines(path) & secret.keys():
            (by_design if rel in SHARED_BY_DESIGN else found).append(f"{rel}: {secret[line]}: {line[:100]}")
    assert not found, "the edition holds lines of the solutions:\n" + "\n".join(found)
    unused = set(SHARED_BY_DESIGN) - {f.split(":")[0] for f in by_design}
    assert not unused, f"no longer shared with a solution, drop them from the list: {sorted(unused)}"


def grader_imports(text: str) -> set[str]:
    """The ``grader`` modules a Python file imports, dotted below ``grader`` (``from grader.labs.x import
    judges`` -> ``labs.x``, ``labs.x.judges``)."""
    out = set()
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, ast.Import):
            out |= {a.name.removeprefix("grader.") for a in n.names if a.name.startswith("grader.")}
        elif isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "grader":
            base = n.module.removeprefix("grader").lstrip(".")
            out |= {f"{base}.{a.name}".lstrip(".") for a in n.names} | ({base} if base else set())
    return out


def test_no_line_definition_import_or_marker_of_the_grading_code_is_in_the_edition(edition):
    """Nothing of the judges, the references, the harnesses, the rules or the grader's pipeline: none of
    their lines (those no shipped file shares), no definition of a name the labs' private modules define
    in the edition's grader/, no import of a module that does not ship, no nbgrader marker."""
    from grader.edition import MARKERS, instructor_modules

    lines, names = grading_lines(), grading_names()
    assert len(lines) > 1000 and {"measure", "from_record"} <= names, (len(lines), sorted(names)[:20])
    left_out, hits = instructor_modules(), []
    for path in files(edition):
        if path.suffix not in TEXT:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(edition).as_posix()
        hits += [f"{rel}: {m}" for m in (*MARKERS, "BEGIN SOLUTION", "reference_submission") if m in text]
        hits += [f"{rel}: {lines[line]}: {line[:100]}" for line in edition_lines(path) & lines.keys()]
        if path.suffix == ".py":
            hits += [f"{rel}: defines {n.name}" for n in ast.parse(text).body
                     if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names and rel.startswith("grader/")]
            if rel != "grader/__main__.py":  # it hands the edition to student_check before importing any of them
                hits += [f"{rel}: imports grader.{m}" for m in sorted(grader_imports(text) & left_out)]
    assert not hits, "\n".join(hits)


def test_instructor_code_is_recognised_through_a_lab_and_a_plain_module():
    from grader.edition import instructor_modules, needs_instructor_code

    left_out = instructor_modules()
    assert needs_instructor_code("from grader.labs.foundations.judges import CHECKS", left_out) == \
        "grader/labs/foundations/judges.py"
    assert needs_instructor_code("python -m grader.gpu_check OUT", left_out) == "grader/gpu_check.py"
    assert needs_instructor_code("from grader import release", left_out) == "grader/release.py"
    assert needs_instructor_code("from grader.labs.single_gpu import answers, harness", left_out) == \
        "grader/labs/single_gpu/harness.py"
    assert needs_instructor_code('ROOT / "grader" / "source"', left_out) == "grader/source/"
    assert needs_instructor_code("from grader.labs.foundations import answers\nfrom grader import checks", left_out) is None


def test_the_edition_keeps_records_for_git_and_offers_no_validate_button(edition, tmp_path):
    """A learner commits ``<lab>.record.json`` with the notebook: git ignores nothing of the kind there.
    Jupyter started the README's way (``JUPYTER_CONFIG_PATH`` at the edition's ``jupyter/``) has nbgrader's
    validate_assignment server extension off and its validate-assignment lab plugin disabled, as
    ``jupyter server extension disable`` / ``jupyter labextension disable`` would set them, even though
    nbgrader's installation enables both."""
    from grader.edition import VALIDATE_LAB, VALIDATE_SERVER

    repo = tmp_path / "clone"
    shutil.copytree(edition, repo, ignore=shutil.ignore_patterns("utils", "benchmarks", "deploy"))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for rec in ("notebooks/00_foundations.record.json", "00_foundations.record.json",
                "notebooks/00_foundations.smoke.record.json"):
        assert subprocess.run(["git", "check-ignore", "-q", rec], cwd=repo).returncode == 1, rec
    assert subprocess.run(["git", "check-ignore", "-q", "grader/__pycache__/x.pyc"], cwd=repo).returncode == 0
    probe = ("import json\n"
             "from jupyter_core.paths import jupyter_config_path\n"
             "from jupyter_server.extension.config import ExtensionConfigManager\n"
             "from jupyterlab_server.config import get_static_page_config\n"
             "ext = ExtensionConfigManager(read_config_path=jupyter_config_path()).get_jpserver_extensions()\n"
             "print(json.dumps([ext, get_static_page_config(level='all').get('disabledExtensions', {})]))\n")
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(edition / "jupyter")}
    ext, disabled = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                              check=True, timeout=120).stdout)
    assert ext.get(VALIDATE_SERVER) is False and disabled.get(VALIDATE_LAB) is True, (ext, disabled)
    assert 'JUPYTER_CONFIG_PATH="$PWD/jupyter" jupyter lab' in (edition / "README.md").read_text()


def test_the_edition_writes_a_record_with_its_public_grader_alone(edition, tmp_path):
    """The record cell (``checks.save_record``) runs in the edition: the labs' answers schemas and the
    typed boundary ship, the judges do not, and a lab not answered yet is recorded as far as it is."""
    code = ("from grader import checks, labs\n"
            "saved = checks.save_record('00_foundations', {'SIZES': None})\n"
            "print(saved.path, len(saved.incomplete))\n"
            "try:\n    labs.load('00_foundations').judges\nexcept labs.LabError as exc:\n    print('no judges:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(edition),
                               "GPULAB_SMOKE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads((tmp_path / "00_foundations.smoke.record.json").read_text())
    assert rec["assignment"] == "00_foundations" and rec["missing"] and "no judges:" in proc.stdout


def _run(edition: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=edition, capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def test_check_in_the_edition_runs_the_visible_tests_and_says_who_decides(edition, tmp_path):
    nb = nbformat.v4.new_notebook()

    def graded(source, grade_id, points=1, solution=False, kind="code"):
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        c = make(source)
        c.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": not solution, "points": points,
                                  "schema_version": 3, "solution": solution, "task": False}
        return c

    nb.cells = [nbformat.v4.new_code_cell("from grader import checks\nx = 2"),
                graded("checks.assert_close(x, 2.0, 'x')", "test_ok"),
                graded("assert x == 3, 'x should be 3'", "test_wrong", 2),
                graded("import sys\nprint('careful', file=sys.stderr)", "test_stderr"),
                graded("YOUR ANSWER HERE", "words", 3, solution=True, kind="markdown")]
    path = tmp_path / "mine.ipynb"
    nbformat.write(nb, path)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _run(edition, "check", str(path), "--json-out", str(tmp_path / "out" / "res.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "out" / "res.json").read_text())
    assert {c["cell"]: c["status"] for c in res["cells"]} == {"test_ok": "passed", "test_wrong": "failed",
                                                              "test_stderr": "failed", "words": "instructor"}
    assert "AssertionError: x should be 3" in proc.stdout and "wrote to stderr" in proc.stdout
    assert "visible tests passed in 1 of 3 test cells; 1 cell graded by your instructor" in proc.stdout
    assert "Your grade is decided when your instructor grades this notebook" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "out"])  # ran in a scratch copy


def test_check_in_the_edition_refuses_with_one_line(edition, tmp_path):
    (tmp_path / "junk.ipynb").write_text("not json")
    for args, words in ((["check", str(tmp_path / "junk.ipynb")], "is not a notebook"),
                        (["check", str(tmp_path / "absent.ipynb")], "no notebook at"),
                        (["autograde", "--assignment", "00_foundations"], "this is the student edition"),
                        (["release"], "this is the student edition")):
        proc = _run(edition, *args, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_report_in_the_edition_writes_a_labs_readme_from_the_learners_record(edition, tmp_path, monkeypatch):
    from tests import portfolio_records as R

    proc = _run(edition, "report", "--help", timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m grader report "), proc.stdout[:300]
    record = R.write("00_foundations", tmp_path / "00_foundations.record.json", R.namespace("00_foundations"), R.H200,
                     monkeypatch)
    proc = _run(edition, "report", str(record), "--out", str(tmp_path / "out"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "00_foundations" in (tmp_path / "out" / "README.md").read_text()
    proc = _run(edition, "report", str(tmp_path / "absent.json"), "--out", str(tmp_path / "out2"), timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_full_repository_keeps_its_own_check_and_refuses_a_bad_edition_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grader", "check", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--no-screen" in proc.stdout and "--assignment" in proc.stdout
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    for args, words in ((["--student-repo", str(tmp_path / "taken")], "is not an empty folder"),
                        (["--student-repo", str(ROOT / "edition")], "inside the course repository"),
                        (["--check", "--student-repo", str(tmp_path / "new")], "use one or the other")):
        proc = subprocess.run([sys.executable, "-m", "grader", "release", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert not (ROOT / "edition").exists() and not (tmp_path / "new").exists()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_lab_answered_right_passes_every_visible_test_in_the_edition(edition, tmp_path):
    from grader.release import reference_submission

    lab = "05_hardware_and_cost"
    path = tmp_path / f"{lab}.ipynb"
    path.write_text(json.dumps(reference_submission(lab)))
    before = path.read_bytes()
    proc = _run(edition, "check", str(path), "--json-out", str(tmp_path / "res.json"), timeout=3000)
    res = json.loads((tmp_path / "res.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert res["cells"] and all(c["status"] == ("passed" if c["auto"] else "instructor") for c in res["cells"]), res
    assert "Your grade is decided when your instructor grades" in proc.stdout
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [f"{lab}.ipynb", "res.json"]
