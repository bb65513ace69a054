"""The student edition (``python -m grader release --student-repo DIR``, grader/edition.py): what a
class gets holds no solution and no hidden test, and its ``python -m grader check`` runs the
visible tests and says the hidden ones run when the instructor grades.

Two independent searches for leaks: every solution line and every hidden-test line of the
sources (normalised, non-trivial) looked for in every file of the edition; and nbgrader's
markers, the hidden tests' own calls (``__import__("grader").phase(N)``) and the names of the
checks they call, looked for as text.
"""
from __future__ import annotations

import ast
import json
import re
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
# ships byte for byte (a record carries a hash of it, which the grader checks against its own: utils/record.py);
# there each names the library code the exercise asks the learner to write again.
SHARED_BY_DESIGN = {
    "utils/checkpoint.py": "lab 05's capture_rng_state/restore_rng_state are what utils.checkpoint does for its runs",
    "utils/xla.py": "lab 05's bucket_length is the bucket choice utils.xla makes",
    "utils/flops.py": "lab 00's arithmetic_intensity is utils.flops' one-line definition",
    "utils/profile_diagnosis.py": "lab 01's diagnose shares a rule with utils.profile_diagnosis",
    "utils/diagnosis_cases.py": "lab 01's diagnose shares a None check with the cases built for it",
    "grader/phase3_records.py": "save_record records the KV geometry, deriving head_dim with lab 03's one line (kv_args)",
}


def norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def nontrivial(line: str) -> bool:
    return len(line) >= MIN_CHARS and len(re.findall(r"[A-Za-z_]\w*", line)) >= 2


def secret_lines() -> dict[str, str]:
    """``{normalised line: "<lab> solution|hidden test"}`` for every non-trivial line between
    nbgrader's markers (a whole solution cell without markers counts whole) that the source does not also show."""
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


def hidden_check_names() -> set[str]:
    """The names hidden tests call on ``grader.phase(N)`` (``_p2.check_memory`` -> ``check_memory``; through a
    phase's further module, ``_p2.kernels.check_second_fusion`` -> ``check_second_fusion``)."""
    from grader import EXTRA_MODULES

    further = {attr for extra in EXTRA_MODULES.values() for attr in extra}
    names = set()
    for path in SOURCES:
        for c in json.loads(path.read_text())["cells"]:
            text = src(c)
            for block in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", text, re.S):
                for chain in re.findall(r"\b_p\d((?:\.\w+)+)", block):
                    parts = chain.split(".")[1:]
                    if parts[0] in further and len(parts) > 1:
                        names.add(parts[1])
                    elif parts[0] not in {"checks", "records", "remeasure"} | further:
                        names.add(parts[0])
    return names


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
    from grader.course import assignments

    top = {p.name for p in edition.iterdir()}
    assert {"notebooks", "utils", "grader", "deploy", "benchmarks", "README.md", "requirements.txt"} <= top
    assert not {"tests", ".git"} & top and not (edition / "docs" / "grading.md").exists()
    assert sorted(p.stem for p in (edition / "notebooks").glob("*.ipynb")) == assignments()
    shipped = {p.name for p in (edition / "grader").iterdir()}
    assert shipped == {"__init__.py", "__main__.py", "checks.py", "tamper.py", "student_check.py",
                       *(f"phase{n}_records.py" for n in range(6))}
    assert not list(edition.rglob("gradebook.db")) and not (edition / "grader" / "source").exists()
    for name in ("utils", "deploy"):  # byte for byte: a record's hash of utils/ must match the grader's
        mine = {p.relative_to(ROOT / name): p.read_bytes() for p in (ROOT / name).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
        theirs = {p.relative_to(edition / name): p.read_bytes() for p in (edition / name).rglob("*") if p.is_file()}
        assert mine == theirs, name
    for nb in (edition / "notebooks").glob("*.ipynb"):
        assert nb.read_bytes() == (ROOT / "notebooks" / nb.name).read_bytes()


def test_no_solution_or_hidden_test_line_is_in_the_edition(edition):
    secret = secret_lines()
    assert len(secret) > 100, "the sources' solutions and hidden tests were not found"
    found, by_design = [], []
    for path in files(edition):
        if path.suffix not in TEXT:
            continue
        rel = path.relative_to(edition).as_posix()
        for line in edition_lines(path) & secret.keys():
            (by_design if rel in SHARED_BY_DESIGN else found).append(f"{rel}: {secret[line]}: {line[:100]}")
    assert not found, "the edition holds lines of the solutions or hidden tests:\n" + "\n".join(found)
    unused = set(SHARED_BY_DESIGN) - {f.split(":")[0] for f in by_design}
    assert not unused, f"no longer shared with a solution, drop them from the list: {sorted(unused)}"


def test_no_marker_hidden_call_or_hidden_check_is_in_the_edition(edition):
    from grader.edition import MARKERS

    names = hidden_check_names()
    assert len(names) >= 10, names
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    hits = []
    for path in files(edition):
        if path.suffix not in TEXT:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(edition).as_posix()
        hits += [f"{rel}: {m}" for m in (*MARKERS, "BEGIN SOLUTION", "BEGIN HIDDEN TESTS", '__import__("grader").phase(',
                                         "reference_submission") if m in text]
        if path.suffix == ".py":
            tree = ast.parse(text)
            hits += [f"{rel}: defines {n.name}" for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and (n.name in names or (n.name.startswith("reference_") and not rel.startswith("utils/")))]
        if not rel.startswith("utils/"):  # utils' docstrings may name a grader check they feed; its reference_mode is a dtype
            hits += [f"{rel}: names {m.group(1)}" for m in pattern.finditer(text)]
    assert not hits, "\n".join(hits)


def test_the_record_writers_keep_save_record_and_drop_the_checks(edition):
    from grader import edition as E

    for n in range(6):
        text = (edition / "grader" / f"phase{n}_records.py").read_text()
        defs = {node.name for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}
        full = {node.name for node in ast.parse((ROOT / "grader" / f"phase{n}_records.py").read_text()).body
                if isinstance(node, ast.FunctionDef)}
        assert "save_record" in defs and defs < full, (n, defs)
    with pytest.raises(E.C.CourseError, match="has no save_record"):
        E.record_writer("def other():\n    pass\n", "grader/phase9_records.py")


def _run(edition: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=edition, capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})


def test_check_in_the_edition_runs_the_visible_tests_and_names_the_hidden_ones(edition, tmp_path):
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
    assert "Hidden tests run when your instructor grades this notebook" in proc.stdout
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
    assert "Hidden tests run when your instructor grades" in proc.stdout
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [f"{lab}.ipynb", "res.json"]
