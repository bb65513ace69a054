"""One line, not a traceback, when a cell fails only because an exercise above it is not done yet.

A released notebook (``notebooks/<lab>.ipynb``, written by ``python -m grader release``) holds its
exercises as nbgrader solution cells whose answers are replaced by ``raise NotImplementedError()``
(``grader/nbgrader_config.py``: ``ClearSolutions.code_stub``), and function stubs whose bodies raise
the same. Run top to bottom before the exercises are done, each exercise cell stops, and every
course cell below that uses what an exercise defines fails too, with a NameError on a name the
learner never typed. :func:`install` (called from ``utils/course/bootstrap.py`` under IPython) turns those
into one line each:

- in a course cell, or any cell that is not the exercise itself, a NameError on a name an
  exercise defines (or on a name a course cell defines from an exercise's names), and a
  NotImplementedError raised by an exercise's function stub, print one line naming the exercise to
  finish first, by the heading above it and its cell's grade id;
- in the exercise's own cell, a NotImplementedError prints ``exercise ...: not done yet ...``;
- any other error in a course cell that needs an open exercise (a dict entry the exercise's cell
  would have added, a child process that ran a stub) names the exercise, and keeps the error's type
  and first line;
- anything else (a typo's NameError, an error inside the learner's own code, a library's
  NotImplementedError) keeps IPython's traceback.

Which names an exercise defines is read from the released notebook alone (:func:`build`): the
names a cell binds at module level (``symtable``), and the names a cell reads that no cell of the
release binds, which the nearest exercise cell at or above it must define; the graded cells' answer
names (``grader/labs/<lab>/answers.py``) join the same way. A cell that reads a name an exercise cell
above it fills in (an item or attribute assigned there) needs that exercise too. Which cell runs is told by the cell id
Jupyter sends (ipykernel passes it to ``pre_run_cell``'s ``ExecutionInfo.cell_id``), else by the
cell's text: a course cell's text matches the release exactly; an exercise cell is the one whose
own lines (those no other cell has) the running cell keeps.

The failing cell still fails: IPython sets ``error_in_exec`` before it calls the handler
(``InteractiveShell.run_code`` in IPython/core/interactiveshell.py), so the kernel answers with an
error, the cell is marked failed and "Run All" stops there as it would without the hint; the error
output keeps its ``ename`` and ``evalue``, only its traceback text is the one line. Nothing is
installed while a grader runs the notebook (``GPULAB_GRADING``, ``utils/course/bootstrap.py``).
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import re
import symtable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CODE_STUB = "raise NotImplementedError()"  # grader/nbgrader_config.py ClearSolutions.code_stub, its second line
STUB_MARK = "# YOUR CODE HERE"
# names IPython and ipykernel put in the notebook's namespace: no cell defines them
SHELL_NAMES = frozenset({"get_ipython", "display", "In", "Out", "exit", "quit", "_", "__", "___", "_i", "_ii", "_iii",
                         "_oh", "_dh", "_ih"})
BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__builtins__", "__doc__"}
_NAME_IN_MESSAGE = re.compile(r"^name '(\w+)' is not defined")  # NameError's text, where it has no .name
MIN_OWN_LINE = 12  # characters: shorter lines ("else:", "return t") tell no exercise apart


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise cell of a released notebook."""

    grade_id: str
    heading: str  # the heading above it, as the learner reads it ("" if none)
    names: frozenset[str]  # what finishing it defines
    exports: frozenset[str]  # those of its names that a later cell or a graded answer reads
    stubs: frozenset[str]  # the functions (and classes) the release gives as stubs

    @property
    def label(self) -> str:
        return f'"{self.heading}" ({self.grade_id})' if self.heading else self.grade_id


@dataclasses.dataclass(frozen=True)
class NotebookMap:
    """What :func:`build` reads from a released notebook."""

    lab: str
    exercises: dict[str, Exercise]  # grade id -> exercise, in the notebook's order
    owner: dict[str, str]  # name -> grade id of the exercise that defines it
    course_defs: dict[str, str]  # name -> id of the course cell that first binds it
    needs: dict[str, tuple[str, ...]]  # cell id -> the exercises it depends on, through course cells too, in order
    course_text: dict[str, str]  # a course cell's stripped text -> its id
    exercise_text: dict[str, str]  # an exercise cell's stripped released text -> its grade id
    own_lines: dict[str, frozenset[str]]  # grade id -> lines of its released text no other cell has

    def exercise_of(self, name: str) -> Exercise | None:
        gid = self.owner.get(name)
        return self.exercises.get(gid) if gid else None

    def which_cell(self, raw: str, cell_id: str | None = None) -> tuple[str, str | None]:
        """``("course" | "exercise" | "other", id)`` of the cell whose text is ``raw``."""
        if cell_id and cell_id in self.exercises:
            return "exercise", cell_id
        if cell_id and cell_id in self.needs:
            return "course", cell_id
        text = raw.strip()
        if text in self.course_text:
            return "course", self.course_text[text]
        if text in self.exercise_text:
            return "exercise", self.exercise_text[text]
        lines = {ln.strip() for ln in raw.splitlines()}
        best, best_n = None, 0
        for gid, own in self.own_lines.items():
            n = len(own & lines)
            if own and n * 2 >= len(own) and n > best_n:
                best, best_n = gid, n
        return ("exercise", best) if best else ("other", None)


def _source(cell: Mapping) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _gid(cell: Mapping) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def _python(text: str) -> str:
    """The cell as plain Python: IPython's own transforms (magics, ``!`` lines) where IPython is here."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return text
    try:
        return TransformerManager().transform_cell(text)
    except Exception:  # a cell IPython itself cannot transform: read it as it is
        return text


def scan(text: str) -> tuple[set[str], set[str], set[str]]:
    """``(binds, reads, reads_now)`` of one cell: the names it binds in the notebook's namespace, the
    global names it or any function in it reads, and those it reads at module level (when it runs).
    A cell that is not Python reads and binds nothing."""
    try:
        top = symtable.symtable(_python(text), "<cell>", "exec")
    except (SyntaxError, ValueError):
        return set(), set(), set()
    binds, reads_now = set(), set()
    for s in top.get_symbols():
        if s.is_assigned() or s.is_imported():
            binds.add(s.get_name())
        elif s.is_referenced():
            reads_now.add(s.get_name())
    reads = set(reads_now)
    stack = list(top.get_children())
    while stack:
        t = stack.pop()
        stack.extend(t.get_children())
        for s in t.get_symbols():
            if s.is_declared_global() and s.is_assigned():
                binds.add(s.get_name())
            elif s.is_global() and s.is_referenced():
                reads.add(s.get_name())
    ignore = BUILTINS | SHELL_NAMES
    return binds - ignore, reads - ignore - binds, reads_now - ignore - binds


def _stub_names(text: str) -> set[str]:
    """Top-level functions and classes of a released exercise cell with a ``raise NotImplementedError``
    in their body: the stubs the learner fills in."""
    try:
        tree = ast.parse(_python(text))
    except (SyntaxError, ValueError):
        return set()

    def raises_stub(node: ast.AST) -> bool:
        for n in ast.walk(node):
            exc = n.exc if isinstance(n, ast.Raise) else None
            exc = exc.func if isinstance(exc, ast.Call) else exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                return True
        return False

    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and raises_stub(node)}


def _changed(text: str) -> set[str]:
    """Names whose contents a cell changes where it runs, without binding them: the root name of an item or
    attribute it assigns or deletes at module level (``rows["optimized"] = row``, ``cfg.batch = 8``). A
    later cell that reads such a name needs that cell to have run to its end, as it needs the cell that
    binds it."""
    try:
        tree = ast.parse(_python(text))
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue  # runs later, if at all
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, (ast.Subscript, ast.Attribute)):
                    root = t.value
                    while isinstance(root, (ast.Subscript, ast.Attribute)):
                        root = root.value
                    if isinstance(root, ast.Name):
                        out.add(root.id)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _heading(markdown: str) -> str | None:
    heads = [ln.lstrip("#").strip() for ln in markdown.splitlines() if ln.startswith("#")]
    if not heads:
        return None
    head = heads[-1]
    return head[len("Exercise:"):].strip() if head.lower().startswith("exercise:") else head


def build(nb: Mapping, lab: str = "", answers: Mapping[str, Any] | None = None) -> NotebookMap:
    """The exercises of a released notebook ``nb`` (its JSON as a dict) and who defines each name.

    ``answers`` (graded cell -> the names the grader reads there: :func:`answer_names` of
    ``grader/labs/<lab>/answers.py``'s ``ANSWERS``) adds those names: one that no cell binds belongs
    to the nearest exercise at or above its graded cell, as a name a cell reads does."""
    cells = []  # (id, kind, text)
    heading, head_of = "", {}
    for i, c in enumerate(nb.get("cells", [])):
        meta = c.get("metadata", {}).get("nbgrader", {})
        text = _source(c)
        cid = _gid(c) or c.get("id") or f"cell{i}"
        if c.get("cell_type") == "markdown":
            heading = _heading(text) or heading
            continue
        if c.get("cell_type") != "code":
            continue
        kind = "exercise" if meta.get("solution") else "course"
        cells.append((cid, kind, text))
        head_of[cid] = heading
    scanned = {cid: scan(text) for cid, _, text in cells}
    first_bind: dict[str, str] = {}
    for cid, _, _ in cells:
        for name in sorted(scanned[cid][0]):
            first_bind.setdefault(name, cid)
    kinds = {cid: kind for cid, kind, _ in cells}
    owner = {n: cid for n, cid in first_bind.items() if kinds[cid] == "exercise"}
    course_defs = {n: cid for n, cid in first_bind.items() if kinds[cid] == "course"}
    exports: dict[str, set[str]] = {}
    nearest = None
    for cid, kind, _ in cells:
        if kind == "exercise":
            nearest = cid
        binds, reads, _ = scanned[cid]
        wanted = set(reads) | set((answers or {}).get(cid, {}))
        for name in sorted(wanted):
            if name not in first_bind and name not in owner and nearest is not None:
                owner[name] = nearest  # no cell binds it: the exercise above must
            g = owner.get(name)
            if g is not None and (g != cid or name in (answers or {}).get(cid, {})):
                exports.setdefault(g, set()).add(name)
    changed = {cid: _changed(text) for cid, _, text in cells}
    needs: dict[str, tuple[str, ...]] = {}
    order = [cid for cid, _, _ in cells]
    for i, (cid, _, _) in enumerate(cells):
        found: set[str] = set()
        for name in scanned[cid][1] | set((answers or {}).get(cid, {})):
            if owner.get(name) not in (None, cid):
                found.add(owner[name])
            elif name in course_defs and course_defs[name] != cid and course_defs[name] in needs:
                found.update(needs[course_defs[name]])
            for above, _, _ in cells[:i]:  # a cell above that fills it in: an exercise, or a course cell waiting on one
                if name in changed[above]:
                    found.update({above} if kinds[above] == "exercise" else needs[above])
        needs[cid] = tuple(sorted(found, key=order.index))
    exercises = {}
    for cid, kind, text in cells:
        if kind == "exercise":
            names = frozenset(n for n, g in owner.items() if g == cid)
            exercises[cid] = Exercise(cid, head_of[cid], names, frozenset(exports.get(cid, set())), frozenset(_stub_names(text)))
    line_count: dict[str, int] = {}
    for _, _, text in cells:
        for ln in {ln.strip() for ln in text.splitlines()}:
            line_count[ln] = line_count.get(ln, 0) + 1
    own_lines = {cid: frozenset(ln for ln in {x.strip() for x in text.splitlines()}
                                if len(ln) >= MIN_OWN_LINE and line_count[ln] == 1 and ln not in (STUB_MARK, CODE_STUB))
                 for cid, kind, text in cells if kind == "exercise"}
    return NotebookMap(lab, exercises, owner, course_defs, needs,
                       {text.strip(): cid for cid, kind, text in cells if kind == "course" and text.strip()},
                       {text.strip(): cid for cid, kind, text in cells if kind == "exercise" and text.strip()},
                       own_lines)


def load(lab: str, repo: str | Path) -> NotebookMap:
    """:func:`build` of ``repo/notebooks/<lab>.ipynb``, with the lab's answers specs where ``grader`` imports."""
    nb = json.loads((Path(repo) / "notebooks" / f"{lab}.ipynb").read_text(encoding="utf-8"))
    try:
        from grader import labs

        specs = labs.load(lab).answers
    except (ImportError, KeyError):  # a copy of the course without grader/: the notebook alone
        return build(nb, lab)
    return build(nb, lab, {cell: answer_names(names) for cell, names in specs.items()})


def answer_names(answers: Mapping[str, Any]) -> set[str]:
    """The names a graded cell's answers read: each answer's name, and the names its expression
    (``grader/labs/__init__.py``: ``Answer.expr``, such as ``monitor.summary()``) reads."""
    out = set()
    for name, answer in answers.items():
        out.add(name)
        try:
            tree = ast.parse(getattr(answer, "expr", "") or name, mode="eval")
        except SyntaxError:
            continue
        out.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return out


def is_stub(obj: Any) -> bool:
    """Whether ``obj`` is still a function stub: its code names nothing but NotImplementedError."""
    code = getattr(obj, "__code__", None)
    names = set(getattr(code, "co_names", ()) or ())
    return "NotImplementedError" in names and names <= {"NotImplementedError"}


def done(ex: Exercise, ns: Mapping[str, Any]) -> bool:
    """Whether the exercise has run to the end: what later cells read from it is defined, and none
    of its functions is still the stub."""
    needed = ex.exports or ex.names
    if any(n not in ns for n in needed):
        return False
    for n in ex.stubs:
        obj = ns.get(n)
        if obj is None or is_stub(obj):
            return False
        if isinstance(obj, type) and any(is_stub(v) for v in vars(obj).values()):
            return False
    return True


def open_exercises(m: NotebookMap, names: list[str], ns: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(open exercise grade ids in notebook order, names no open exercise explains)`` for names
    missing from ``ns``."""
    found: set[str] = set()
    rest = []
    for name in names:
        ex = m.exercise_of(name)
        if ex is not None and not done(ex, ns):
            found.add(ex.grade_id)
            continue
        if name in m.course_defs:
            gone = [g for g in m.needs.get(m.course_defs[name], ()) if not done(m.exercises[g], ns)]
            if gone:
                found.update(gone)
                continue
        rest.append(name)
    order = list(m.exercises)
    return sorted(found, key=order.index), rest


# -- the IPython side ----------------------------------------------------------------------------------

def _innermost(tb):
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _in_cell(shell, code) -> bool:
    """Whether ``code`` was compiled from a notebook cell (IPython's compiler keeps those file names)."""
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(names, Mapping) and code.co_filename in names:
        return True
    return code.co_filename.startswith("<ipython-input-")


@dataclasses.dataclass
class Hints:
    """The state :func:`install` keeps: the lab's map and the cell running now."""

    map: NotebookMap
    cell: tuple[str, str | None] = ("other", None)

    def pre_run_cell(self, info) -> None:
        self.cell = self.map.which_cell(getattr(info, "raw_cell", "") or "", getattr(info, "cell_id", None))

    def line(self, value: BaseException, tb, ns: Mapping[str, Any], shell=None) -> str | None:
        """The one line for this exception in the cell running now, or None for IPython's traceback.

        Past the NameError and NotImplementedError cases of the module docstring, any other error in a
        course cell that needs an open exercise (``rows["optimized"]`` missing because the exercise
        that fills it stopped; a child process failing on a stub) names that exercise, and keeps the
        error's own type and first line in the message."""
        line = self._specific(value, tb, ns, shell)
        if line is not False:
            return line
        kind, cid = self.cell
        if kind != "course" or cid not in self.map.needs:
            return None
        gone = [g for g in self.map.needs[cid] if not done(self.map.exercises[g], ns)]
        if not gone:
            return None  # every exercise it needs is done: a real error, with its traceback
        first = self.map.exercises[gone[0]]
        more = f" ({len(gone) - 1} more open exercise{'s' if len(gone) > 2 else ''} above this cell)" \
            if len(gone) > 1 else ""
        said = (str(value).strip().splitlines() or [""])[0][:160]
        return (f"this cell needs the exercise {first.label}, which is not done yet{more}: finish it and run the "
                f"cells from there down (the error here: {type(value).__name__}{': ' + said if said else ''})")

    def _specific(self, value: BaseException, tb, ns: Mapping[str, Any], shell=None) -> str | None | bool:
        """The NameError and NotImplementedError cases: a line, None for the traceback, False for neither
        (a NotImplementedError no stub explains is left to the course-cell rule of :meth:`line`)."""
        kind, cid = self.cell
        m = self.map
        if type(value) is NameError:
            name = getattr(value, "name", None) or next(iter(_NAME_IN_MESSAGE.findall(str(value))), None)
            if not name or name in ns:
                return None
            ex = m.exercise_of(name)
            if ex is not None:
                if kind == "exercise" and cid == ex.grade_id:
                    return None  # the learner's own cell: their own code's error
                return (f"{name} is defined by the exercise {ex.label}, which is not done yet: "
                        "finish it and run its cell, then this one")
            if name in m.course_defs:
                gone = [g for g in m.needs.get(m.course_defs[name], ())
                        if not done(m.exercises[g], ns) and not (kind == "exercise" and cid == g)]
                if gone:
                    first = m.exercises[gone[0]]
                    more = f" ({len(gone) - 1} more open exercise{'s' if len(gone) > 2 else ''} above this cell)" \
                        if len(gone) > 1 else ""
                    return (f"{name} comes from a cell that needs the exercise {first.label}, which is not done "
                            f"yet{more}: finish it and run the cells from there down")
            return None  # a name no exercise explains (a typo in an edited cell): the traceback
        if type(value) is NotImplementedError:
            last = _innermost(tb)
            if last is None:
                return False
            code = last.tb_frame.f_code
            in_cell = _in_cell(shell, code) if shell is not None else code.co_filename.startswith("<")
            if not in_cell:
                return False  # a library's NotImplementedError: a course cell waiting on an exercise says so
            if code.co_name == "<module>":
                if kind == "exercise":
                    ex = m.exercises[cid]
                    return f"exercise {ex.label}: not done yet: write your answer in place of `{CODE_STUB}`, then run this cell"
                return False
            qual = getattr(code, "co_qualname", code.co_name)
            top = qual.split(".")[0]
            ex = m.exercise_of(top)
            if ex is None or top not in ex.stubs:
                return False
            obj = ns.get(top)
            if isinstance(obj, type):  # a method of a class the exercise stubs
                obj = vars(obj).get(code.co_name)
            if getattr(obj, "__code__", None) is not code:
                return False  # not the function of that name the notebook holds now
            if kind == "exercise" and cid == ex.grade_id:
                return f"exercise {ex.label}: not done yet: {qual} still raises NotImplementedError; write its body, then run this cell"
            return (f"{qual} is still the stub of the exercise {ex.label}, which is not done yet: "
                    "finish it and run its cell, then this one")
        return False


def _handler(hints: Hints):
    def handler(shell, etype, value, tb, tb_offset=None):
        try:
            text = hints.line(value, tb, shell.user_ns, shell)
        except Exception:  # the hint is a courtesy: whatever goes wrong in it, the learner gets the traceback
            text = None
        if text is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        else:
            try:  # keeps the exception for %debug and sys.last_traceback, as showtraceback does
                shell._get_exc_info((etype, value, tb))
            except AttributeError:  # an IPython without it: only %debug misses the exception
                pass
            shell._showtraceback(etype, value, [f"{etype.__name__}: {text}"])
        return None

    return handler


def install(lab: str, repo: str | Path, shell=None) -> Hints | None:
    """Turn on the hints for ``lab`` in the running IPython (``shell``, default the current one).

    Returns None, installing nothing, outside IPython, when the released notebook cannot be read,
    or when something else already handles exceptions in this shell."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return None
    try:
        hints = Hints(load(lab, repo))
    except (OSError, ValueError, KeyError):
        return None
    previous = getattr(shell, "_gpulab_hints", None)
    if tuple(getattr(shell, "custom_exceptions", ()) or ()) and previous is None:
        return None  # another handler is set: leave it
    if previous is not None:  # the setup cell run again, or another lab's: one handler, the latest lab's
        shell.events.unregister("pre_run_cell", previous.pre_run_cell)
    shell.events.register("pre_run_cell", hints.pre_run_cell)
    handler = _handler(hints)
    shell.set_custom_exc((Exception,), handler)
    shell._gpulab_hints = hints
    return hints
