"""Read a submission's own code before it runs, and flag for review what reaches into the kernel or the grader.

A grade is decided outside the learner's kernel (docs/grading.md, "The trust model"): the judges
run in the grader's own process on the typed answers the kernel hands over, so nothing a notebook
does in its kernel changes a verdict. This screen is a tripwire for an instructor, not that
defence. Code that reaches into the interpreter, the kernel or the grader has no place in an
answer: an IPython input transformer that rewrites later cells, a patched builtin, a replaced
``checks`` function, an edited file the grader loads. So the code is read first, as text: every
code cell the learner wrote or changed is parsed (IPython syntax included, through IPython's own
``TransformerManager``, so ``%%time`` bodies and ``!`` commands are read too) and walked, and each
construct on the lists below is a :class:`Finding`. The batch (``grader/batch.py``) grades a
submission with findings all the same, lists every finding in its notes and feedback and flags it
for review (``needs_review`` in ``grades.csv``); ``--no-screen`` skips the screen. The lists are of
what an answer never needs and what could raise a score (a crash, ``os._exit`` included, only
costs the learner: it is not flagged); what a reviewer cannot tell from the text alone
(``docs/grading.md``, "What the screen cannot see") is said there.

Cells that nbgrader restores from the release before grading (the locked cells and the test
cells) are not the learner's and are not read; neither is any cell left as the release has it.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

# Names that hand over the interpreter, the kernel, or code as data.
NAMES = {
    "get_ipython": "reaches into the IPython kernel",
    "__builtins__": "edits the builtins",
    "__import__": "imports by a computed name",
    "exec": "runs code built as data", "eval": "runs code built as data", "compile": "builds code as data",
    "globals": "edits the kernel's namespace", "vars": "reads a namespace as a dict", "breakpoint": "starts a debugger",
}
# Attributes that are the interpreter's own machinery, whatever object they are read from.
ATTRS = {
    "__code__": "rewrites a function's code", "__globals__": "reaches a module's namespace through a function",
    "__closure__": "reaches a function's closure", "__subclasses__": "walks the class tree",
    "__builtins__": "edits the builtins", "__dict__": "edits an object's namespace directly",
    "f_globals": "reads a caller's frame", "f_locals": "reads a caller's frame", "f_back": "reads a caller's frame",
    "f_code": "reads a caller's frame", "gi_frame": "reads a generator's frame", "tb_frame": "reads a frame",
    "_getframe": "reads a caller's frame", "currentframe": "reads a caller's frame",
    "settrace": "installs a tracer that sees every later line", "setprofile": "installs a profiler hook",
    "meta_path": "changes how modules are imported",
    "path_hooks": "changes how modules are imported",
    "displayhook": "replaces the display hook", "excepthook": "replaces the exception hook",
    "audithook": "installs an audit hook", "addaudithook": "installs an audit hook",
    "input_transformers_cleanup": "rewrites later cells", "input_transformers_post": "rewrites later cells",
    "ast_transformers": "rewrites later cells",
    "register_magic_function": "adds a magic", "run_cell": "runs a cell itself",
    "write_text": "writes a file", "write_bytes": "writes a file", "unlink": "deletes a file", "rmtree": "deletes a tree",
    "__setattr__": "sets attributes around their class", "__delattr__": "deletes attributes around their class",
    "__getattribute__": "reads attributes around their class",
}
# Attributes that are machinery only on one module (``sys.path``, ``os.replace``); elsewhere
# (``x.path``, ``s.replace(...)``) they are everyday code.
OWNED = {
    "path": ("sys", "changes where modules are imported from"), "modules": ("sys", "edits the table of loaded modules"),
    "system": ("os", "runs a shell command"), "popen": ("os", "runs a shell command"), "kill": ("os", "signals a process"),
    "killpg": ("os", "signals a process group"), "replace": ("os", "moves a file"), "rename": ("os", "moves a file"),
    "remove": ("os", "deletes a file"), "environ": ("os", "changes the environment the grader reads"),
}
# Special methods that decide how a value compares, converts or computes: a value whose
# ``__eq__`` answers True to anything passes every equality check.
DUNDERS = {f"__{n}__" for n in ("eq ne lt le gt ge bool float int index round abs hash len contains "
                                 "add radd sub rsub mul rmul truediv rtruediv floordiv mod pow neg pos "
                                 "float complex format getitem iter next array array_ufunc array_function "
                                 "instancecheck subclasscheck").split()}
# Modules an answer never needs: they reach into the interpreter, the kernel or the grader.
MODULES = {
    "builtins": "edits the builtins", "gc": "walks every live object", "ctypes": "writes memory directly",
    "inspect": "reads frames and source", "importlib": "imports by a computed name", "types": "builds code objects",
    "marshal": "loads code objects", "dis": "reads bytecode", "IPython": "reaches into the IPython kernel",
    "ipykernel": "reaches into the kernel", "jupyter_client": "talks to the kernel", "traitlets": "edits the kernel's config",
    "grader": "imports the grader", "nbgrader": "imports the grader", "signal": "replaces signal handlers",
    "atexit": "runs code at exit", "subprocess": "starts processes", "shutil": "copies or deletes files",
    "sitecustomize": "changes start-up", "site": "changes where modules are imported from",
    "sqlite3": "writes a database (the gradebook is one)",
}
# The magics an answer may use: they time or show, and run their body (which is read too).
SAFE_MAGICS = {"time", "%time", "timeit", "%timeit", "matplotlib", "pinfo", "pinfo2", "who", "whos", "capture"}
WRITE_MODES = set("wax+")


@dataclass(frozen=True)
class Finding:
    cell: str  # the cell's grade_id, or "cell N" (its index) when it has none
    line: int
    code: str  # the construct, as written
    reason: str

    def __str__(self) -> str:
        return f"{self.cell}, line {self.line}: {self.code} ({self.reason})"


def as_python(source: str) -> str:
    """IPython syntax (magics, ``!`` commands, ``x?``) as the Python IPython itself runs."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def module_aliases(sources: Iterable[str]) -> set[str]:
    """Every name an ``import`` binds to a module in ``sources`` (``import numpy as np`` -> ``np``,
    ``from utils import timing`` -> ``timing``: a name from a package may be a module)."""
    out = set()
    for src in sources:
        try:
            tree = ast.parse(as_python(src))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                out.update(a.asname or a.name for a in node.names)
    return out


class _Reader(ast.NodeVisitor):
    def __init__(self, cell: str, modules: set[str], text: str):
        self.cell, self.modules, self.lines, self.found = cell, modules, text.splitlines(), []
        self._skip: set[int] = set()  # the get_ipython() of a magic already judged as a whole
        self._stored = False  # inside the target of an assignment to a subscript

    def flag(self, node: ast.AST, reason: str) -> None:
        line = getattr(node, "lineno", 1)
        whole = isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef))
        code = self.lines[line - 1].strip() if whole else ast.unparse(node)
        self.found.append(Finding(self.cell, line, code[:80], reason))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if (root := a.name.split(".")[0]) in MODULES:
                self.flag(node, MODULES[root])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        root = (node.module or "").split(".")[0]
        if node.level == 0 and root in MODULES:
            self.flag(node, MODULES[root])
        for a in node.names:
            if a.name in ATTRS or a.name in NAMES:
                self.flag(node, ATTRS.get(a.name) or NAMES[a.name])

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in NAMES:
            self.flag(node, NAMES[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", None)
        if node.attr in ATTRS:
            self.flag(node, ATTRS[node.attr])
        elif node.attr in OWNED and owner == OWNED[node.attr][0] and self._module(node.value):
            if node.attr != "environ" or isinstance(node.ctx, (ast.Store, ast.Del)) or self._stored:
                self.flag(node, OWNED[node.attr][1])
        elif node.attr == "__class__" and isinstance(node.ctx, ast.Store):
            self.flag(node, "changes an object's class")
        elif isinstance(node.ctx, (ast.Store, ast.Del)) and self._module(node.value):
            self.flag(node, "replaces part of an imported module")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in DUNDERS:
            self.flag(node, "defines how a value compares or converts (a value can then equal anything)")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Subscript(self, node: ast.Subscript) -> None:
        """``os.environ["X"] = ...`` changes what the grader's code reads later."""
        self._stored = isinstance(node.ctx, (ast.Store, ast.Del))
        self.generic_visit(node)
        self._stored = False

    def _module(self, node: ast.AST) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.modules

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in ("setattr", "delattr") and node.args and self._module(node.args[0]):
            self.flag(node, "replaces part of an imported module")
        if isinstance(fn, ast.Name) and fn.id == "getattr" and len(node.args) >= 2 and self._module(node.args[0]):
            attr = node.args[1]
            if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                self.flag(node, "reads a module attribute by a computed name")
            elif attr.value in ATTRS or attr.value in NAMES:
                self.flag(node, ATTRS.get(attr.value) or NAMES[attr.value])
        if isinstance(fn, ast.Name) and fn.id == "open" and _writes(node):
            self.flag(node, "opens a file for writing")
        self._magic(node)
        self.generic_visit(node)

    def _magic(self, node: ast.Call) -> None:
        """``get_ipython().run_line_magic(name, ...)`` from ``%name``: a safe magic's body is read
        as a cell of its own; any other magic, and ``!`` commands, are findings."""
        fn = node.func
        if not (isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Call)
                and isinstance(fn.value.func, ast.Name) and fn.value.func.id == "get_ipython"):
            return
        name = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        if fn.attr in ("run_line_magic", "run_cell_magic") and name in SAFE_MAGICS:
            body = node.args[-1] if len(node.args) >= 2 else None
            if isinstance(body, ast.Constant) and isinstance(body.value, str) and body.value.strip():
                self.found.extend(screen_source(body.value, self.cell, self.modules))
            self._skip.add(id(fn.value.func))
        elif fn.attr in ("system", "getoutput"):
            self.flag(node, "runs a shell command")
            self._skip.add(id(fn.value.func))
        else:
            self.flag(node, f"uses the magic %{name}" if name else "reaches into the IPython kernel")
            self._skip.add(id(fn.value.func))

    def visit(self, node: ast.AST):
        if id(node) in self._skip:
            return None
        return super().visit(node)


def _writes(node: ast.Call) -> bool:
    mode = node.args[1] if len(node.args) >= 2 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    if mode is None:
        return False
    return not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not WRITE_MODES & set(mode.value))


def screen_source(source: str, cell: str = "cell", modules: set[str] | None = None) -> list[Finding]:
    """The findings in one cell's source. ``modules``: the names bound to modules anywhere in
    the notebook (:func:`module_aliases`); by default those of this cell."""
    text = as_python(source)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []  # it cannot run, so it reaches nothing: the cell fails when graded, as any error does
    reader = _Reader(cell, module_aliases([source]) if modules is None else modules, text)
    reader.visit(tree)
    return sorted(set(reader.found), key=lambda f: (f.line, f.code))


def _grade_id(cell: dict) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _restored(cell: dict) -> bool:
    """nbgrader's OverwriteCells puts these back from the release: locked cells and test cells."""
    md = cell.get("metadata", {}).get("nbgrader", {})
    return bool(md.get("locked") or (md.get("grade") and not md.get("solution")))


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def screen_notebook(submitted: dict, released: dict) -> list[Finding]:
    """The findings in every code cell of ``submitted`` that the learner wrote or changed.

    Not read: a cell whose grade_id names a locked or test cell of ``released`` (nbgrader puts
    those back whatever the submission holds), and a cell whose source is that of the release's
    cell of the same grade_id, or of any release cell without one. What the submission's own
    metadata says is not trusted. Module names come from every code cell of the submission."""
    rel = [c for c in released.get("cells", []) if c.get("cell_type") == "code"]
    restored = {_grade_id(c) for c in rel if _grade_id(c) and _restored(c)}
    given = {_grade_id(c): _source(c) for c in rel if _grade_id(c)}
    plain = {_source(c) for c in rel if not _grade_id(c)}
    cells = submitted.get("cells", [])
    modules = module_aliases(_source(c) for c in cells if c.get("cell_type") == "code")
    found = []
    for i, c in enumerate(cells):
        if c.get("cell_type") != "code":
            continue
        src, gid = _source(c), _grade_id(c)
        if gid in restored or (gid in given and given[gid] == src) or (gid is None and src in plain):
            continue
        found += screen_source(src, gid or f"cell {i + 1}", modules)
    return found
