"""The shape of the tree, checked: each module one concept (no seam between groups of definitions
that never refer to each other), no import cycle between the course's own modules, every module
described in docs/architecture.md, every repository path a file names exists, and no file points at
the project's tracker or at documents that are not in the repository.

These are the rules of ``docs/architecture.md``; a failure names the file and the line.
"""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("utils", "grader")
MIN_SEAM_LINES = 120  # two groups of definitions this long that never refer to each other are two modules
# Modules that hold a seam today, each with the split it asks for; the test fails once the seam is gone too.
KNOWN_SEAMS = {
    "utils.train.training": "the training loops (LoopConfig, build_loop, measure_loop) and the fine-tuning recipes "
                      "(FinetuneRecipe, RECIPES, measure_finetune) in a module of their own; utils/ ships byte for byte and "
                      "its hash is in every record, so it moves with a release",
    "grader.labs.multi_gpu.harness": "the seed-bound checksums of the sync and scaling harnesses, and the Triton "
                                     "kernels' launch counting: a harness_kernels.py beside it",
}
# Projects whose own issue trackers a citation may name ("vLLM issue 21348", "NVIDIA/nccl issue #1453").
EXTERNAL = re.compile(r"[\w.-]+/[\w.-]+|\b(vllm|sglang|nccl|prometheus|pytorch|torch|transformers|nbgrader|mellea|"
                      r"github|deepspeed|accelerate|trl|peft|jupyter|triton|dcgm)\b", re.IGNORECASE)
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
REPO_PATH = re.compile(r"(?<![\w./-])((?:utils|grader|benchmarks|deploy|docs|tests|notebooks|\.ci)/[\w./-]*\w)")
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg"}


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    # the project's own files: not a virtualenv or other tool state someone left unignored
    return [ROOT / p for p in out if (ROOT / p).is_file() and (not p.startswith(".") or p.startswith(".ci/"))]


def text_files() -> list[Path]:
    return [p for p in tracked() if p.suffix in TEXT_SUFFIXES and "data" not in p.relative_to(ROOT).parts[:2]
            and p.relative_to(ROOT).parts[:2] != ("benchmarks", "results")]


def modules() -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the course's packages and the benchmarks."""
    out = {}
    for p in tracked():
        rel = p.relative_to(ROOT)
        if p.suffix == ".py" and rel.parts[0] in (*PACKAGES, "benchmarks"):
            name = ".".join(rel.with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """``{name: statement}`` of a module's top-level definitions: functions, classes, assigned names."""
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        else:
            names = []
        defs.update(dict.fromkeys(names, node))
    return defs


def seams(text: str) -> list[int]:
    """The sizes in lines, largest first, of the groups a module's top-level definitions fall into when
    two definitions are in one group if either names the other (a function calling another, a class
    using a constant): groups that never refer to each other are separate concepts."""
    defs = _top_level(ast.parse(text))
    nodes = list({id(n): n for n in defs.values()}.values())
    group = {id(n): i for i, n in enumerate(nodes)}

    def root(i: int) -> int:
        while group[id(nodes[i])] != i:
            i = group[id(nodes[i])]
        return i

    for n in nodes:
        used = {x.id for x in ast.walk(n) if isinstance(x, ast.Name)} | {
            x.attr for x in ast.walk(n) if isinstance(x, ast.Attribute)}
        for name in used & defs.keys():
            a, b = root(group[id(n)]), root(group[id(defs[name])])
            group[id(nodes[a])] = b
    sizes: dict[int, int] = {}
    for i, n in enumerate(nodes):
        sizes[root(i)] = sizes.get(root(i), 0) + n.end_lineno - n.lineno + 1
    return sorted(sizes.values(), reverse=True)


def test_seams_are_found_between_groups_that_never_refer_to_each_other():
    a = "\n".join(f"    x{i} = {i}" for i in range(MIN_SEAM_LINES))
    two = f"LIMIT = 3\ndef f():\n{a}\n    return LIMIT\nclass G:\n{a}\n"
    assert seams(two) == [MIN_SEAM_LINES + 3, MIN_SEAM_LINES + 1]  # f and LIMIT; G alone
    one = two + "def h():\n    return f(), G()\n"  # h names both: one concept again
    assert seams(one) == [2 * MIN_SEAM_LINES + 6]


def test_each_module_is_one_concept():
    """A module whose top-level definitions fall into two or more groups of at least MIN_SEAM_LINES
    lines that never refer to each other holds two things: split it along that seam. (A line quota
    said nothing about that: a 600-line module of one rule is fine, a 300-line one of two is not.)"""
    found = {name: s for name, p in modules().items()
             if len(s := [n for n in seams(p.read_text()) if n >= MIN_SEAM_LINES]) > 1}
    new = {n: s for n, s in found.items() if n not in KNOWN_SEAMS}
    assert not new, f"modules with a seam (line counts of the groups that never refer to each other): {new}"
    healed = sorted(set(KNOWN_SEAMS) - set(found))
    assert not healed, f"no seam left in {healed}: drop them from KNOWN_SEAMS"


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The course modules ``name`` imports anywhere in its file (a function-level import that
    only hides a cycle is still a cycle)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for main in [n for n in tree.body if _is_main_block(n)]:
        tree.body.remove(main)  # what runs as ``python -m`` is not imported by anyone
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _is_main_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    mods = modules()
    known = set(mods)
    # a package's __init__ importing its own submodules is how packages are built, not a cycle
    graph = {n: {m for m in _imports(n, p, known) if not (p.name == "__init__.py" and m.startswith(n + "."))}
             for n, p in mods.items()}
    assert not _cycles(graph), f"modules that import each other, directly or around a loop: {_cycles(graph)}"


def _lines(p: Path):
    text = p.read_text(errors="replace")
    yield from enumerate(text.splitlines(), 1)


def test_every_repository_path_a_file_names_exists():
    missing = []
    for p in text_files():
        for no, line in _lines(p):
            for m in REPO_PATH.finditer(line):
                ref = m.group(1).rstrip(".")
                after, before = line[m.end():m.end() + 1], line[:m.start()]
                if after in ("*", "{") or "<" in line[m.end():m.end() + 2] or ".." in ref or re.search(r"[a-z]N(\b|_)", ref):
                    continue  # a pattern or a placeholder, not one path
                if EXTERNAL.search(before[-40:]) or (p.suffix == ".py" and before[-1:] in ("'", '"')):
                    continue  # another project's file ("vLLM's benchmarks/serve.py"), or a string in code
                if not (ROOT / ref).exists():
                    missing.append(f"{p.relative_to(ROOT)}:{no}: {ref}")
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_no_file_cites_the_tracker_or_documents_outside_the_repository():
    bad = []
    for p in text_files():
        if p == Path(__file__):
            continue
        for no, line in _lines(p):
            if re.search(r"\b(DESIGN|REFERENCE)\.md\b", line):
                bad.append(f"{p.relative_to(ROOT)}:{no}: cites a document not in the repository (docs/ has it)")
            for m in ISSUE.finditer(line):
                if not EXTERNAL.search(line):
                    bad.append(f"{p.relative_to(ROOT)}:{no}: {m.group(0)!r} names the project's tracker")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line, cites_tracker", [
    ("QLORA_RATIO = 0.7  # (issue 4)", True),
    ("Issue 7's setting: a local server", True),
    ("NVIDIA/nccl issue #1453 'Poor NCCL allreduce performance'", False),
    ("vLLM issue 21348: #tokens 367404 on TP4", False),
])
def test_tracker_rule(line, cites_tracker):
    assert bool(ISSUE.search(line) and not EXTERNAL.search(line)) is cites_tracker


PACKAGE_SECTION = re.compile(r"^## (utils|grader|benchmarks)/\s*$")


def described(doc: str) -> set[str]:
    """The repository paths of the ``.py`` and ``.sh`` files docs/architecture.md describes under its
    package sections (``## utils/``, ``## grader/``, ``## benchmarks/``): a name there is relative to
    that package (``labs/foundations/judges.py`` is ``grader/labs/foundations/judges.py``)."""
    out, prefix = set(), None
    for line in doc.splitlines():
        if line.startswith("## "):
            m = PACKAGE_SECTION.match(line)
            prefix = m.group(1) if m else None
        elif prefix:
            out |= {n if n.split("/")[0] in (*PACKAGES, "benchmarks") else f"{prefix}/{n}"
                    for n in re.findall(r"`([\w/]+\.(?:py|sh))`", line)}
    return out


def test_the_architecture_doc_names_every_module_and_only_those():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = described(doc)
    files = {p.relative_to(ROOT).as_posix() for p in tracked() if p.suffix in (".py", ".sh")
             and p.relative_to(ROOT).parts[0] in (*PACKAGES, "benchmarks")}
    missing = sorted(files - named)
    assert not missing, f"modules docs/architecture.md does not describe: {missing}"
    gone = sorted(named - files)
    assert not gone, f"docs/architecture.md describes files that are not in the repository: {gone}"


def test_a_module_is_described_by_its_path_within_its_package():
    doc = "## grader/\n| `answers.py` | x |\n| `labs/foundations/answers.py` | y |\n## tests/\n`test_x.py`\n"
    assert described(doc) == {"grader/answers.py", "grader/labs/foundations/answers.py"}


def test_no_module_edits_the_import_path():
    """`pip install -e .` puts the packages on the path; a script that inserts the repository itself
    imports a second copy wherever it is run from. nbgrader's config is the exception: nbgrader runs
    it inside a course copy (grader/course.py), whose own grader/ it must import, not the installed one."""
    allowed = {"grader/nbgrader_config.py"}
    found = []
    for p in tracked():
        rel = p.relative_to(ROOT).as_posix()
        if p.suffix == ".py" and rel.split("/")[0] in (*PACKAGES, "benchmarks") and rel not in allowed:
            tree = ast.parse(p.read_text(encoding="utf-8"))
            found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr in ("insert", "append")
                      and ast.unparse(n.func.value) == "sys.path"]
    assert not found, f"modules that edit sys.path: {found}"
