"""Grade many submissions: one course copy and one worker process per student.

``grade_batch`` releases the assignment once into a master course copy (its gradebook then
holds the source cells and their checksums), copies that per student, repairs and
places each notebook in nbgrader's ``submitted/`` layout, and runs ``grader.worker`` for
each, ``jobs`` at a time. A submission that cannot be read, crashes its kernel or runs past
its time limit gets a score of 0 and a one-line ``status``; the others are unaffected.

Each worker, and the kernel it starts, runs on a private copy of the course code (``utils/``,
``grader/``, ``benchmarks/``, ``deploy/``: what the notebooks read from the repository), written
from the bytes read once when the batch starts, just before the worker and deleted after it. A
notebook that rewrites a file there (``grader/answers.py`` so that its export cells print what it
likes, ``utils/measure/timing.py`` so that timings shrink) changes nothing for the other students, and is
caught: every file and folder's inode, size, mtime and ctime are compared before and after
(ctime cannot be set back, so putting the original back does not hide the edit; bytecode
caches are off, so nothing there changes legitimately). Such a submission scores 0 with a
status naming the files. A notebook that goes looking for the repository itself and edits it
there cannot be named, but the batch says on stderr which files changed.

Outputs (``out_dir``): ``grades.csv`` (nbgrader's ``export`` columns plus ``status``),
``results.json`` (per-cell detail), ``feedback/<student>/<assignment>.html`` and
``autograded/<student>/<assignment>.ipynb``.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from grader import REPO_ROOT, SOURCE_DIR, resume
from grader import course as C
from grader.errors import Interrupted
from grader.submissions import MAX_FILE_MB, Submission, SubmissionError, file_problem, prepare

CSV_COLUMNS = [  # nbgrader's CsvExportPlugin columns, in its order, then ours
    "assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
    "raw_score", "late_submission_penalty", "score", "max_score", "status", "needs_manual_grade",
    "verified_score", "provisional_score", "needs_review",
]
KEEP_ENV = "GPULAB_KEEP_GRADING_DIRS"  # set to 1 to keep the temporary course copies for debugging
CODE_DIRS = ("utils", "grader", "benchmarks", "deploy")  # what a kernel reads from the repository: copied per student


def _zero(sub: Submission, assignment: str, max_score: float, status: str, cells: list[dict]) -> dict:
    return {
        "student_id": sub.student_id, "assignment": assignment, "score": 0.0, "max_score": max_score,
        "status": status, "notes": [], "timestamp": "", "duedate": None,
        "cells": [dict({k: v for k, v in c.items() if k != "manual"}, score=0.0, passed=False, needs_manual_grade=False,
                       mode="manual" if c.get("manual") else "-", message="not graded") for c in cells],
    }


def _screened(submitted: Path, released: Path) -> list[str]:
    """What the screen (:mod:`grader.screen`) finds in a submission's own code, as notes for review."""
    from grader.screen import screen_notebook

    return [f"screen: {f}" for f in screen_notebook(json.loads(submitted.read_text()), json.loads(released.read_text()))]


def _kernel_env(smoke: bool, utils_sha256: str) -> dict:
    """The environment every grading kernel inherits.

    In smoke mode each kernel gets one CPU thread: torch's OpenMP threads spin-wait, and two
    notebooks (or a notebook and anything else) sharing two cores with two threads each slow
    down tenfold at random, which no band survives. One thread each is slower, and steady."""
    env = dict(os.environ)
    env["GPULAB_UTILS_SHA256"] = utils_sha256
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the code copy: any file appearing there is the notebook's
    from utils.serving import engines

    ok, _ = engines.available("vllm")  # the kernel runs in a copy of the course: point it at the engine found here
    if ok:
        env.setdefault("GPULAB_VLLM_PYTHON", engines.find("vllm").python)
    if smoke:
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
    return env


def read_code(root: Path = REPO_ROOT) -> dict[str, tuple[bytes, int]]:
    """``{relative path: (bytes, mode)}`` of the course code under ``root`` (``CODE_DIRS``, no bytecode)."""
    files = {}
    for d in CODE_DIRS:
        for p in sorted((root / d).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                files[p.relative_to(root).as_posix()] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return files


def _write_code(files: dict[str, tuple[bytes, int]], dest: Path) -> Path:
    for rel, (data, mode) in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    return dest


def repo_changes(files: dict[str, tuple[bytes, int]], root: Path = REPO_ROOT) -> list[str]:
    """Files of ``files`` that differ in (or vanished from) the repository at ``root`` now."""
    now = read_code(root)
    return sorted(rel for rel in files.keys() | now.keys() if files.get(rel, (None,))[0] != now.get(rel, (None,))[0])


def _file_states(root: Path) -> dict[str, tuple]:
    """``(is folder, inode, size, mtime, ctime)`` of every file and folder under ``root``, by relative path."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (".", *dirnames, *filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.normpath(os.path.relpath(path, root))] = (
                stat.S_ISDIR(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def changed_files(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Paths added, removed or touched between two ``_file_states``: the files, or the folders
    when no file changed (a folder changes whenever an entry in it does)."""
    paths = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    files = [p for p in paths if not (before.get(p) or after.get(p))[0]]
    return files or paths


_RUNNING: set = set()  # the worker processes running now: a Ctrl-C kills them (Interrupted)
_RUNNING_LOCK = threading.Lock()


def _kill_running() -> int:
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for p in procs:
        _kill_tree(p.pid)
    return len(procs)


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it. The kernel runs in a session of its own, so
    killing the worker's process group alone would leave it (and whatever it started) running."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    psutil.wait_procs(procs, timeout=10)


def _log_tail(path: Path, limit: int = 65536) -> str:
    """The last line of a log, reading at most its last ``limit`` bytes (a kernel may write gigabytes)."""
    with open(path, "rb") as fh:
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
        lines = fh.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no output"


def _run_worker(work: Path, assignment: str, sub: Submission, timeout: C.CellTimeout, total_timeout_s: float,
                feedback: bool, base_env: dict, code_files: dict, worker_args: tuple = ()) -> dict:
    course = work / sub.student_id
    result_file = course / "result.json"
    code = _write_code(code_files, course / "code")
    before = _file_states(code)
    cmd = [sys.executable, "-m", "grader.worker", "--course", str(course), "--assignment", assignment,
           "--student", sub.student_id, "--timeout", str(timeout.seconds), "--iopub-timeout", str(timeout.iopub_s),
           "--startup-timeout", str(timeout.startup_s), "--timeout-why", timeout.why, "--result", str(result_file),
           *worker_args]
    if not feedback:
        cmd.append("--no-feedback")
    try:
        with open(course / "worker.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=code, env=base_env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            with _RUNNING_LOCK:
                _RUNNING.add(proc)
            try:
                proc.wait(timeout=total_timeout_s)
            except subprocess.TimeoutExpired:
                _kill_tree(proc.pid)  # the worker, the kernel it started, and anything the notebook started
                proc.wait()
                return {"status": f"grading took longer than {total_timeout_s:.0f} s and was stopped"}
            finally:
                with _RUNNING_LOCK:
                    _RUNNING.discard(proc)
        changed = changed_files(before, _file_states(code))
        if changed:
            return {"status": "the notebook changed the course's own files while it was graded "
                              f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}): not graded"}
        if not result_file.is_file():
            return {"status": f"grader worker failed (exit {proc.returncode}): {_log_tail(course / 'worker.log')[:200]}"}
        return json.loads(result_file.read_text())
    finally:
        shutil.rmtree(code, ignore_errors=True)


def _pinned_worker(gpu_plan, work: Path, assignment: str, sub: Submission, timeout, total_timeout_s: float,
                   feedback: bool, base_env: dict, code_files: dict, worker_args: tuple = ()) -> dict:
    """:func:`_run_worker` on a GPU of the plan's, held for as long as the worker runs."""
    with gpu_plan.device() as device:
        env = base_env if device is None else {**base_env, "CUDA_VISIBLE_DEVICES": device}
        r = _run_worker(work, assignment, sub, timeout, total_timeout_s, feedback, env, code_files, worker_args)
        if device is not None:
            r.setdefault("gpu", device)
        return r


def grade_batch(
    assignment: str,
    subs: list[Submission],
    out_dir: Path | None,
    *,
    jobs: int = 1,
    timeout_s: int | None = None,
    total_timeout_s: float | None = None,
    feedback: bool = True,
    progress: bool = True,
    source_dir: Path = SOURCE_DIR,
    screen: bool = True,
    gpu_plan=None,
    count_provisional: bool = False,
    seed: int | None = None,
) -> list[dict]:
    """Grade ``subs``; write the outputs to ``out_dir`` (if given); return one dict each.

    With ``screen`` (the default), a submission whose own code reaches into the kernel or the
    grader (:mod:`grader.screen`) is graded all the same (the judges decide, outside its kernel)
    and flagged for review (``needs_review``), its findings listed in the notes.
    ``gpu_plan`` (:func:`grader.gpus.plan`) pins each worker to a GPU of its own; default: one
    job per visible GPU, or ``jobs`` on a machine without one."""
    from grader import gpus
    from utils.measure.record import utils_hash

    probe = gpus.Probe()  # torch's import, in a process of its own while the course is released below
    code_files = read_code()
    work = Path(tempfile.mkdtemp(prefix="gpulab-grade-"))
    try:
        master = C.make_course(work / "_master", assignment, source_dir)
        smoke, devices = probe.result()
        if gpu_plan is None:
            gpu_plan = gpus.plan(min(jobs, len(devices)) if devices else jobs, devices=devices)
        jobs = gpu_plan.jobs
        timeout = C.cell_timeout(assignment, jobs, timeout_s, smoke)  # measures this machine's speed and load, once
        base_env = _kernel_env(smoke, utils_hash())
        released = C.released_path(master, assignment)
        base = C.read_grades(master, assignment, "_nobody_")
        max_score, cell_list = base["max_score"], _grade_cells(released)
        n_code = sum(1 for c in json.loads(released.read_text())["cells"] if c["cell_type"] == "code")
        total = total_timeout_s or (timeout.seconds * n_code + 120)

        results: dict[str, dict] = dict(kept := resume.saved(out_dir and Path(out_dir), subs))
        if kept:
            print(f"resuming: {len(kept)} of {len(subs)} submissions already graded in {out_dir} (kept; a changed "
                  f"submission is graded again); grading the other {len(subs) - len(kept)}", file=sys.stderr)
        runnable, flagged = [], set()
        for sub in subs:
            if sub.student_id in kept:
                continue
            course = work / sub.student_id
            shutil.copytree(master, course, ignore=shutil.ignore_patterns("autograded", "feedback", "submitted"))
            dest = C.submitted_dir(course, assignment, sub.student_id)
            name = sub.notebook.name if sub.notebook else sub.student_id
            try:
                notes = prepare(sub, released, dest, f"{assignment}.ipynb")
                if sub.record is not None:
                    if why := file_problem(sub.record):
                        raise SubmissionError(f"its record {sub.record.name} {why}")
                    # beside the notebook, read before any of its code runs (grader.preprocessors.InsertExports)
                    shutil.copyfile(sub.record, dest / f"{assignment}.record.json")
            except SubmissionError as exc:
                results[sub.student_id] = _zero(sub, assignment, max_score, f"{name} {exc}" if sub.notebook else str(exc), cell_list)
                continue
            except Exception as exc:  # anything else a broken file can raise: this submission only, the batch goes on
                why = str(exc).splitlines()[0][:200] if str(exc) else ""
                results[sub.student_id] = _zero(sub, assignment, max_score, f"{name} could not be prepared for grading "
                                                f"({type(exc).__name__}: {why})", cell_list)
                continue
            if screen and (found := _screened(dest / f"{assignment}.ipynb", released)):
                notes = notes + found  # a tripwire for review: the judges decide, outside the kernel
                flagged.add(sub.student_id)
            runnable.append((sub, notes))

        bar = _progress(len(subs), progress)
        bar.update(len(results))
        failed = 0
        for sid, r in results.items():
            if sid not in kept and not r["status"].startswith(("ok", "graded")):
                failed += 1
                if progress:
                    bar.write(f"{sid}: 0 / {r['max_score']:g}: {r['status'][:300]}")
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            worker_args = (("--count-provisional",) if count_provisional else ()) + (
                ("--seed", str(seed)) if seed is not None else ())
            futures = {pool.submit(_pinned_worker, gpu_plan, work, assignment, sub, timeout, total, feedback,
                                   base_env, code_files, worker_args): (sub, notes) for sub, notes in runnable}
            for fut in as_completed(futures):
                sub, notes = futures[fut]
                r = fut.result()
                if "cells" not in r:  # the worker never finished
                    r = _zero(sub, assignment, max_score, r["status"], cell_list)
                r.setdefault("timeout_s", timeout.seconds)
                r.setdefault("timeout_why", timeout.why)
                _trust_master_points(r, cell_list, max_score)
                r["notes"] = notes + r.get("notes", []) + ([gpu_plan.note()] if gpu_plan.note() else [])
                if sub.student_id in flagged:
                    r["needs_review"] = True
                if r["status"] == "ok" and r["notes"]:
                    r["status"] = "graded; " + "; ".join(r["notes"])
                results[sub.student_id] = r
                sid = sub.student_id
                resume.save(out_dir and Path(out_dir), sub, r, C.feedback_path(work / sid, assignment, sid),
                            C.autograded_path(work / sid, assignment, sid))
                if not r["status"].startswith(("ok", "graded")):
                    failed += 1
                    if progress:
                        bar.write(f"{sid}: {r['score']:g} / {r['max_score']:g}: {r['status'][:300]}")
                bar.update(1)
                bar.set_postfix_str(f"{failed} not graded")
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            _kill_running()  # the workers, their kernels and what the notebooks started; their threads then return
            bar.close()
            done = len([r for sid, r in results.items() if sid not in kept]) + len(kept)
            where = (f"; the {done} graded are kept in {Path(out_dir) / 'partial'}: run the same command again to grade "
                     f"the other {len(subs) - done}") if out_dir is not None else ""
            raise Interrupted(f"interrupted: {done} of {len(subs)} submissions graded{where}") from None
        pool.shutdown(wait=True)
        bar.close()
        if changed := repo_changes(code_files):
            print(f"warning: the course code in {REPO_ROOT} changed while this batch was graded: "
                  f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''} (a notebook, or an edit meanwhile; "
                  "each notebook was graded on the code as it was when the batch started)", file=sys.stderr)
        ordered = [results[s.student_id] for s in subs]
        if out_dir is not None:
            _write_outputs(Path(out_dir), work, assignment, ordered)
            resume.finish(Path(out_dir))
        return ordered
    finally:
        probe.close()
        if os.environ.get(KEEP_ENV, "") in ("", "0"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"grading folders kept in {work}", file=sys.stderr)


def _trust_master_points(r: dict, cell_list: list[dict], max_score: float) -> None:
    """Points and maximum from the master copy, made before any notebook ran: a notebook can
    write its own course copy's gradebook while it runs (lower a cell's maximum, say), so the
    worker's numbers are capped by these and the total is summed again."""
    points = {c["cell"]: c["points"] for c in cell_list}
    manual = {c["cell"] for c in cell_list if c.get("manual")}
    r["cells"] = [c for c in r["cells"] if c["cell"] in points and (c.get("mode") == "manual") == (c["cell"] in manual)]
    for c in r["cells"]:
        c["points"] = points[c["cell"]]
        c["score"] = 0.0 if c["cell"] in manual else min(max(float(c["score"]), 0.0), c["points"])
        c["passed"] = c["cell"] not in manual and c["points"] > 0 and c["score"] >= c["points"]
    r["score"] = sum(c["score"] for c in r["cells"])
    r["raw_score"], r["max_score"] = r["score"], max_score
    r["auto_max_score"] = sum(c["points"] for c in cell_list if not c.get("manual"))
    r["manual_points"] = C.manual_points(r["cells"])


def _grade_cells(released: Path) -> list[dict]:
    cells = []
    for c in json.loads(released.read_text())["cells"]:
        md = c["metadata"].get("nbgrader", {})
        if md.get("grade") and c["cell_type"] == "code":
            cells.append({"cell": md["grade_id"], "points": float(md.get("points", 0))})
        elif md.get("grade") and md.get("solution"):  # a written answer, graded by hand (grader/writeups.py)
            cells.append({"cell": md["grade_id"], "points": float(md.get("points", 0)), "manual": True})
    return cells


def manual_summary(r: dict) -> str:
    """grades.csv's ``needs_manual_grade``: the written answers an instructor still grades, with points."""
    return "; ".join(f"{c['cell']} ({c['points']:g} points)" for c in r.get("cells", [])
                     if c.get("mode") == "manual" and c.get("needs_manual_grade"))


def _progress(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="grading", unit=" submissions", unit_scale=False, disable=not enabled,
                    file=sys.stderr, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
    except ImportError:  # tqdm is a requirement; stay usable without it
        class _Null:
            def update(self, n): pass
            def close(self): pass
            def set_postfix_str(self, s): pass
            def write(self, s): print(s, file=sys.stderr)
        return _Null()


def _write_outputs(out: Path, work: Path, assignment: str, results: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in results:
            w.writerow({
                "assignment": assignment, "duedate": r.get("duedate") or "", "timestamp": r.get("timestamp", ""),
                "student_id": r["student_id"], "last_name": "", "first_name": "", "email": "",
                "raw_score": r.get("raw_score", r["score"]), "late_submission_penalty": r.get("late_submission_penalty", 0.0),
                "score": r["score"], "max_score": r["max_score"], "status": r["status"],
                "needs_manual_grade": manual_summary(r),
                "verified_score": r.get("verified_score", r["score"]), "provisional_score": r.get("provisional_score", 0.0),
                "needs_review": "yes" if r.get("needs_review") else "",
            })
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    for r in results:
        sid = r["student_id"]
        fb = C.feedback_path(work / sid, assignment, sid)
        if fb.is_file():
            (out / "feedback" / sid).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fb, out / "feedback" / sid / f"{assignment}.html")
        elif not r["status"].startswith(("ok", "graded")) and not (out / "autograded" / sid / f"{assignment}.ipynb").is_file():
            # not graded (unreadable, its course copy changed, past its time): a feedback file that says why, in one line
            import html

            (out / "feedback" / sid).mkdir(parents=True, exist_ok=True)
            (out / "feedback" / sid / f"{assignment}.html").write_text(
                f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(assignment)}: "
                f"{html.escape(sid)}</title></head>\n<body><h1>{html.escape(assignment)}: not graded</h1>\n"
                f"<p>{html.escape(r['status'])}</p>\n<p>Score: {r['score']:g} / {r['max_score']:g}</p></body></html>\n",
                encoding="utf-8")
        ag = C.autograded_path(work / sid, assignment, sid)
        if ag.is_file():
            (out / "autograded" / sid).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ag, out / "autograded" / sid / f"{assignment}.ipynb")
            for rec in ag.parent.glob("*.record.json"):  # the record the notebook wrote while it was graded
                if not rec.is_symlink() and rec.is_file() and rec.stat().st_size <= MAX_FILE_MB * 2**20:
                    shutil.copyfile(rec, out / "autograded" / sid / rec.name)
