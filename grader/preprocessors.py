"""The grader's steps in nbgrader's own pipeline (``Autograde``'s preprocessors, ``grader/nbgrader_config.py``).

After nbgrader's sanitizing steps (locked and test cells put back from the gradebook):

- :class:`InsertExports` puts an export cell before each graded cell of a lab that has judges: it
  prints the cell's answers as one JSON line (``grader/answers.py``). It also takes the learner's
  measurement record, read before any of the notebook's code runs.

Then, in the autograding steps:

- :class:`GuardedExecute` is nbgrader's ``Execute`` with guards from outside the kernel: this process
  cannot be traced or read by the notebook's processes (``PR_SET_DUMPABLE``), an error or stderr line
  in a test cell counts even if the notebook cleared it, and everything the notebook started is killed
  when its kernel stops.
- :class:`JudgeCells` then grades, in this process, with no kernel left: the export lines become
  decoded answers, the learner's functions run on hidden cases in sandboxes, the grader measures, and
  each check's judge decides (``grader/judging.py``). It writes each verdict into its graded cell's
  outputs in the form nbgrader's ``SaveAutoGrades`` reads: no error for full points, an error for
  none, a number for partial or provisional ones. The visible tests' own output stays as feedback
  and never decides.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbu
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Integer, Unicode

from grader import REPO_ROOT, definitions, labs, processes
from grader.names import ANSWERS_MARK, KEEP_DIRS_VAR

CODE = definitions.read_code(REPO_ROOT)  # the course code sandboxes run on, read before any notebook ran
TAG = "gpulab"  # cell and notebook metadata this module writes, removed again before grades are saved


def no_tracing() -> None:
    """Make this process's memory, environment and working directory unreadable to other processes of
    the same user (Linux ``PR_SET_DUMPABLE`` = 0: prctl(2)): a sandbox cannot read the grader's state."""
    processes.prctl(processes.PR_SET_DUMPABLE, 0)


def graded_code(cell) -> bool:
    return cell.cell_type == "code" and nbu.is_grade(cell) and not nbu.is_solution(cell)


def judged(assignment: str) -> bool:
    """Whether ``assignment`` is judged outside the kernel (a registered lab whose folder has judges)."""
    return labs.has(assignment, "judges")


def preload(assignment: str) -> None:
    """Import everything the judges of ``assignment`` run, now, before any notebook runs: a module
    imported later could come from course files a notebook rewrote."""
    import grader.context  # noqa: F401
    import grader.expect  # noqa: F401
    import grader.judging  # noqa: F401
    import grader.sandbox  # noqa: F401

    if judged(assignment):
        lab = labs.load(assignment)
        for part in ("answers", "judges", "reference", "harness", "sizes"):
            lab.part(part)


class _Preload(threading.Thread):
    def __init__(self, assignment: str):
        super().__init__(name=f"preload-{assignment}", daemon=True)
        self.assignment, self.error = assignment, None

    def run(self) -> None:
        try:
            preload(self.assignment)
        except BaseException as exc:  # re-raised where the grader waits for it
            self.error = exc


_PRELOADS: dict[str, _Preload] = {}


def start_preload(assignment: str) -> None:
    """:func:`preload` in a thread, so that the judges' imports (torch, transformers: 2 to 4 s on the
    2-core CI machine) overlap nbgrader's sanitizing steps and the kernel's start, which run no
    notebook code. :func:`wait_preloaded` is called before the first cell runs."""
    if assignment not in _PRELOADS:
        _PRELOADS[assignment] = _Preload(assignment)
        _PRELOADS[assignment].start()


def wait_preloaded(assignment: str) -> None:
    """Return once :func:`preload` of ``assignment`` is done (run here if no thread started it);
    its exception, if it raised."""
    thread = _PRELOADS.get(assignment)
    if thread is None:
        preload(assignment)
        return
    thread.join()
    if thread.error is not None:
        raise thread.error


class InsertExports(NbGraderPreprocessor):
    """Before each graded code cell of a judged lab, the cell that prints its answers (see module docstring)."""

    def preprocess(self, nb, resources):
        assignment = resources["nbgrader"]["assignment"]
        if not judged(assignment):
            return nb, resources
        lab = labs.load(assignment)
        cells = []
        for cell in nb.cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if graded_code(cell) and gid in lab.answers:
                cells.append(NotebookNode(cell_type="code", execution_count=None, outputs=[], id=f"gpulab-export-{gid}",
                                          metadata=NotebookNode({TAG: {"export": gid}}),
                                          source=f"# the grader reads this cell's answers (not graded)\n"
                                                 f"__import__('grader.answers', fromlist=['export']).export("
                                                 f"{assignment!r}, {gid!r}, globals())"))
            cells.append(cell)
        nb.cells = cells
        folder = Path(resources.get("metadata", {}).get("path") or ".")
        record = folder / f"{assignment}.record.json"
        if record.is_file() and record.stat().st_size < 64 * 2**20:  # read now, before any of the notebook's code runs
            nb.metadata[TAG] = {"record": record.read_text(encoding="utf-8", errors="replace")}
        return nb, resources


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` with the guards of the module docstring."""

    def preprocess(self, nb, resources=None, km=None):
        from grader.processes import descendants, kill_descendants

        no_tracing()
        self._seen = {}
        self._assignment = (resources or {}).get("nbgrader", {}).get("assignment")
        before = descendants()
        try:
            return super().preprocess(nb, resources, km)
        finally:
            kill_descendants(spare=before)

    def preprocess_cell(self, cell, resources, index):
        if self._assignment:  # the judges' code is in memory before the notebook's first cell runs
            wait_preloaded(self._assignment)
        return super().preprocess_cell(cell, resources, index)

    def process_message(self, msg, cell, cell_index):
        t, content = msg.get("msg_type"), msg.get("content", {})
        if graded_code(cell) and (t == "error" or (t == "stream" and content.get("name") == "stderr")):
            out = NotebookNode(output_type=t, **{k: content.get(k) for k in (
                ("ename", "evalue", "traceback") if t == "error" else ("name", "text"))})
            self._seen.setdefault(cell_index, []).append(out)
        return super().process_message(msg, cell, cell_index)

    def on_cell_executed(self, **kwargs):
        super().on_cell_executed(**kwargs)
        cell, index = kwargs["cell"], kwargs["cell_index"]
        if not graded_code(cell):
            return
        for o in cell.outputs:
            if o.get("output_type") == "execute_result":  # nbgrader would read a number here as the score
                o.output_type = "display_data"
                o.pop("execution_count", None)
        seen = self._seen.get(index, [])
        failing = [o for o in cell.outputs if o.get("output_type") == "error"
                   or (o.get("output_type") == "stream" and o.get("name") == "stderr")]
        if seen and not failing:
            cell.outputs.extend(seen)  # the notebook cleared them: they still count


def export_line(cell) -> str | None:
    """The answers line an export cell printed, or None: exactly one line with the mark, else None
    (two such lines are two claims, and neither is taken)."""
    lines = [ln for o in cell.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == "stdout"
             for ln in "".join(o.get("text", "")).splitlines() if ln.startswith(ANSWERS_MARK)]
    return lines[0][len(ANSWERS_MARK):] if len(lines) == 1 else None


def _kernel_said(cell) -> str:
    """The first line of what the visible tests raised or wrote to stderr in the kernel, or ""."""
    for o in cell.get("outputs", []):
        if o.get("output_type") == "error":
            return f"{o.get('ename', 'Error')}: {str(o.get('evalue', '')).strip().splitlines()[0] if o.get('evalue') else ''}"
        if o.get("output_type") == "stream" and o.get("name") == "stderr":
            text = "".join(o.get("text", "")).strip()
            if text:
                return f"wrote to stderr: {text.splitlines()[0][:200]}"
    return ""


def apply(cell, verdict, count_provisional: bool) -> None:
    """Write ``verdict`` (:class:`grader.judging.Verdict`) into the graded cell's outputs, for
    ``SaveAutoGrades`` and the feedback."""
    kept = [o for o in cell.outputs if o.get("output_type") in ("stream", "display_data")
            and not (o.get("output_type") == "stream" and o.get("name") == "stderr")]
    said = _kernel_said(cell)
    lines = [f"grader: {verdict.mode}" + (" (provisional)" if verdict.provisional else "")]
    lines += [f"  {n}" for n in verdict.notes]
    if said:
        lines.append(f"  your visible tests in the notebook said: {said} (feedback only: the grader's judge decides)")
    counted = verdict.points if (not verdict.provisional or count_provisional) else 0.0
    if verdict.provisional and not count_provisional and verdict.points:
        lines.append(f"  {verdict.points:g} of {verdict.max_points:g} points from your record: provisional, not counted "
                     "unless your instructor counts provisional points")
    outputs = kept + [NotebookNode(output_type="stream", name="stdout", text="\n".join(lines) + "\n")]
    if verdict.message:
        outputs.append(NotebookNode(output_type="error", ename="NotPassed", evalue=verdict.message,
                                    traceback=[f"NotPassed: {verdict.message}"]))
    elif counted < verdict.max_points:
        outputs.append(NotebookNode(output_type="execute_result", execution_count=None, metadata={},
                                    data={"text/plain": f"{counted:g}"}))
    cell.outputs = outputs


def _locked_ids(resources) -> frozenset:
    """The grade ids of the notebook's locked cells, from the gradebook (the release's, not the submission's)."""
    from nbgrader.api import Gradebook, MissingEntry

    ids = resources["nbgrader"]
    try:
        with Gradebook(ids["db_url"]) as gb:
            return frozenset(c.name for c in gb.find_notebook(ids["notebook"], ids["assignment"]).source_cells
                             if c.locked)
    except (MissingEntry, KeyError):
        return frozenset()


class JudgeCells(NbGraderPreprocessor):
    """Grade every graded code cell of a judged lab in this process (see the module docstring)."""

    count_provisional = Bool(False, help="count points judged from a learner's record (no GPU here)").tag(config=True)
    seed = Integer(-1, help="the hidden cases' seed; -1: drawn afresh, after the notebook's kernel has gone").tag(config=True)
    verdicts_path = Unicode("", help="write the verdicts here as JSON (python -m grader's worker reads them)").tag(config=True)

    def preprocess(self, nb, resources):
        from grader import context
        from grader.judging import Run, judge_all

        assignment = resources["nbgrader"]["assignment"]
        if not judged(assignment):
            return nb, resources
        wait_preloaded(assignment)
        lab = labs.load(assignment)
        exports, cells = {}, []
        for cell in nb.cells:
            gid = cell.get("metadata", {}).get(TAG, {}).get("export")
            if gid:
                exports[gid] = export_line(cell)
            else:
                cells.append(cell)
        nb.cells = cells
        record_text = nb.metadata.pop(TAG, {}).get("record")
        seed = self.seed if self.seed >= 0 else secrets.randbits(62)
        points = {c.metadata.nbgrader.grade_id: float(c.metadata.nbgrader.points) for c in nb.cells if graded_code(c)}
        live = context.live(assignment)
        record, record_ctx, problem = None, None, ""
        if record_text is not None and live.smoke:
            work_rec = Path(tempfile.mkdtemp(prefix="gpulab-record-")) / f"{assignment}.record.json"
            work_rec.write_text(record_text)
            record, record_ctx, problem = context.read_record(work_rec, assignment)
            shutil.rmtree(work_rec.parent, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix="gpulab-judge-"))
        try:
            job = definitions.job(nb, _locked_ids(resources))
            run = Run(lab, points, exports, live, job, CODE, work, seed, record, record_ctx, problem)
            verdicts = judge_all(run)
        finally:
            if os.environ.get(KEEP_DIRS_VAR) != "1":
                shutil.rmtree(work, ignore_errors=True)
        for cell in nb.cells:
            if graded_code(cell) and cell.metadata.nbgrader.grade_id in verdicts:
                apply(cell, verdicts[cell.metadata.nbgrader.grade_id], self.count_provisional)
        if self.verdicts_path:
            Path(self.verdicts_path).write_text(json.dumps(
                {"seed": seed, "record_used": record is not None, "record_problem": problem,
                 "count_provisional": self.count_provisional, "calls_s": round(run.calls_s, 2),
                 "verdicts": {k: v.to_dict() for k, v in verdicts.items()}}, indent=1))
        return nb, resources
