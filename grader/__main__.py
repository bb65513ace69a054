"""The grader's command line: ``python -m grader {release,check,autograde,merge,gradebook,report} ...``.

A thin argparse layer over functions the tests call too (release.release,
selfcheck.check_notebook, batch.grade_batch). Errors a user can fix are one line on stderr
and exit status 2. ``release --student-repo DIR`` then writes the student edition
(grader/edition.py); in that edition, which has no ``grader/source/``, this command line is
grader/student_check.py's (the visible tests only).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grader.startup import skip_iri_grammars

skip_iri_grammars()  # before anything imports nbformat (grader/startup.py)


def _cmd_release(a) -> int:
    from grader.release import release

    dest = None
    if a.student_repo is not None:
        from grader.edition import check_destination

        dest = check_destination(a.student_repo)  # before the release's minutes, not after
    lines = release(check=a.check)
    for line in lines:
        print(line)
    if a.check:
        if lines:
            return 1
        print("notebooks/ is up to date with grader/source/")
    elif not lines:
        print("notebooks/ was already up to date")
    if dest is not None:
        from grader.edition import write_edition

        for line in write_edition(dest):
            print(line)
    return 0


def _cmd_check(a) -> int:
    from grader.submissions import read_notebook

    read_notebook(a.notebook)  # a file that is no notebook: one line now, before anything heavy loads
    from grader.selfcheck import check_notebook, format_table

    res = check_notebook(a.notebook, assignment=a.assignment, record=a.record, timeout_s=a.timeout, out_dir=a.out,
                         screen=not a.no_screen, count_provisional=a.count_provisional)
    print(format_table(res))
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(res, indent=1, default=str))
    if not res["cells"] or not (res["status"] == "ok" or res["status"].startswith("graded;")):
        return 2
    return 0 if res["passed"] else 1


def _cmd_autograde(a) -> int:
    from grader import gpus, shard
    from grader.batch import grade_batch
    from grader.course import notebook_name
    from grader.submissions import find_submissions

    notebook_name(a.assignment)  # a clear error for an unknown assignment
    subs = find_submissions(a.submissions, a.assignment)
    if not subs:
        print(f"no submissions of {a.assignment} in {a.submissions} (expected <student>.ipynb or "
              f"submitted/<student>/{a.assignment}/{a.assignment}.ipynb)", file=sys.stderr)
        return 2
    class_size, positions = len(subs), None
    if a.shard:
        k, n = shard.parse(a.shard)
        picked = shard.select(subs, k, n)
        positions = {s.student_id: i for i, s in picked}
        subs = [s for _, s in picked]
    plan = gpus.plan(a.jobs, share=a.share_gpus)
    results = grade_batch(a.assignment, subs, a.out, jobs=plan.jobs, timeout_s=a.timeout, progress=not a.quiet,
                          screen=not a.no_screen, gpu_plan=plan, count_provisional=a.count_provisional,
                          seed=a.seed) if subs else []
    if positions is not None:
        if not subs:
            grade_batch_outputs_empty(a.out)
        shard.write_manifest(a.out, a.assignment, k, n, class_size, positions)
    for r in results:
        print(f"{r['student_id']:<24} {r['score']:>6g} / {r['max_score']:<6g} {r['status']}")
    print(f"wrote {a.out / 'grades.csv'} and feedback under {a.out / 'feedback'}")
    return 0


def grade_batch_outputs_empty(out: Path) -> None:
    """A shard with no submissions (more shards than students) still writes its outputs."""
    import csv

    from grader.batch import CSV_COLUMNS

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grades.csv", "w", newline="") as fh:
        csv.DictWriter(fh, fieldnames=CSV_COLUMNS).writeheader()
    (out / "results.json").write_text("[]")


def _cmd_report(a) -> int:
    from grader import portfolio

    return portfolio.main(a.args, prog="python -m grader report")


def _cmd_merge(a) -> int:
    from grader import shard

    s = shard.merge(a.outputs, a.out)
    print(f"merged {s['shards']} shards of {s['assignment']}: {s['students']} submissions; wrote "
          f"{a.out / 'grades.csv'} and feedback under {a.out / 'feedback'}")
    return 0


def _cmd_gradebook(a) -> int:
    from grader import COURSE_ROOT, REPO_ROOT
    from grader.formgrade import load_class

    s = load_class(a.out, a.course)
    print(f"loaded {len(s['loaded'])} graded submissions of {s['assignment']} into {a.course / 'gradebook.db'}"
          + (f"; skipped {len(s['skipped'])} not graded" if s["skipped"] else ""))
    for sid, why in s["skipped"].items():
        print(f"  {sid}: {why}")
    # nbgrader 0.9 has no formgrader command: the formgrader is a Jupyter server extension, served at /formgrader
    path = "" if Path(a.course).resolve() == COURSE_ROOT.resolve() else f"PYTHONPATH={REPO_ROOT} "
    print(f"grade the written answers: cd {a.course} && {path}jupyter server (or jupyter lab), then open the address "
          "it prints with /formgrader in place of /tree or /lab (Manual Grading)")
    print(f"then: python -m grader feedback {a.out}" + ("" if not path else f" --course {a.course}")
          + " (feedback HTML and grades.csv with your grades), and python -m grader export "
          + f"{a.out}" + ("" if not path else f" --course {a.course}") + " --out GRADES.csv "
          "(--format canvas|moodle --roster ROSTER.csv for a learning-management system)")
    return 0


def _course(a) -> Path:
    from grader import COURSE_ROOT

    return a.course if a.course is not None else COURSE_ROOT


def _cmd_feedback(a) -> int:
    from grader.formgrade import sync

    s = sync(a.out, _course(a))
    print(f"{s['assignment']}: feedback and grades.csv brought up to date from {_course(a) / 'gradebook.db'} for "
          f"{len(s['synced'])} student{'' if len(s['synced']) == 1 else 's'}" + (f"; {len(s['skipped'])} skipped" if s["skipped"] else ""))
    for sid, why in s["skipped"].items():
        print(f"  {sid}: {why}")
    print(f"wrote {a.out / 'grades.csv'} and feedback under {a.out / 'feedback'}")
    return 0


def _cmd_export(a) -> int:
    from grader.lms import export

    s = export(a.outputs, a.to, fmt=a.format, roster=a.roster, course=_course(a))
    print(f"wrote {a.to}: {s['format']}, {s['students']} students, {', '.join(s['assignments'])}")
    if s["identifier"]:
        col, field = s["identifier"]
        print(f"in Moodle's CSV import, map from \"{col}\" to \"{field}\", and each assignment column to its grade item")
    for sid, assignment, why in s["blank"]:
        print(f"  no grade: {sid} {assignment}: {why}")
    if s["off_roster"]:
        print(f"not on the roster, left out: {', '.join(s['off_roster'])}", file=sys.stderr)
    return 0


def _cmd_k8s_manifest(a) -> int:
    from grader.shard import k8s_manifests

    text = k8s_manifests(shards=a.shards, assignment=a.assignment, image=a.image, storage=a.storage, cpus=a.cpus,
                         tries=a.tries, wait_h=a.wait_h)
    if a.to is None:
        sys.stdout.write(text)
    else:
        a.to.write_text(text)
        print(f"wrote {a.to}: {a.shards} shards of {a.assignment}; kubectl apply -f {a.to}, then deploy/README.md's steps")
    return 0


def main(argv: list[str] | None = None) -> int:
    from grader import SOURCE_DIR

    if not SOURCE_DIR.is_dir():  # the student edition: nothing to grade against here, only the visible tests
        from grader.student_check import main as student_main

        return student_main(argv)
    p = argparse.ArgumentParser(prog="python -m grader", description="Release and grade the course notebooks.")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("release", help="write notebooks/ from grader/source/ (nbgrader generate_assignment)")
    r.add_argument("--check", action="store_true", help="exit 1 if notebooks/ is out of date; write nothing")
    r.add_argument("--student-repo", type=Path, metavar="DIR",
                   help="then write the student edition (no solutions, no grader internals) into DIR, a new or empty folder")
    r.set_defaults(fn=_cmd_release)

    c = sub.add_parser("check", help="grade one notebook as the instructor's batch would, every check included (self-study)")
    c.add_argument("notebook", type=Path)
    c.add_argument("--json-out", type=Path, help="write score, max_score and per-cell results here")
    c.add_argument("--assignment", help="assignment id (default: guessed from the notebook's cells)")
    c.add_argument("--record", type=Path, help="measurement record (default: <assignment>.record.json beside the notebook)")
    c.add_argument("--timeout", type=int, help="seconds per cell (default: 600 on a GPU; in smoke mode 60, or 900 for a serving lab with vLLM, scaled by this machine's measured speed and load)")
    c.add_argument("--out", type=Path, help="keep the graded notebook, its record and feedback HTML here")
    c.add_argument("--no-screen", action="store_true",
                   help="run a notebook even when its code reaches into the kernel or the grader (after review)")
    c.add_argument("--count-provisional", action="store_true",
                   help="count the points judged from your measurement record (this machine has no GPU)")
    c.set_defaults(fn=_cmd_check)

    g = sub.add_parser("autograde", help="grade every submission in a folder (instructors)")
    g.add_argument("--assignment", required=True)
    g.add_argument("--submissions", type=Path, required=True,
                   help="folder of <student>.ipynb, or nbgrader's [submitted/]<student>/<assignment>/ layout")
    g.add_argument("--out", type=Path, required=True, help="grades.csv, results.json, feedback/ go here")
    g.add_argument("--jobs", type=int, default=None,
                   help="submissions graded at once, each in its own kernel (default: one per visible GPU, each pinned "
                        "to its own; 1 without a GPU)")
    g.add_argument("--share-gpus", action="store_true",
                   help="allow more jobs than GPUs (their measurements disturb each other; the feedback says so)")
    g.add_argument("--shard", metavar="K/N", help="grade only the K-th of N shares of the class (merge them after)")
    g.add_argument("--timeout", type=int, help="seconds per cell (default: 600 on a GPU; in smoke mode 60, or 900 for a serving lab with vLLM, scaled by this machine's measured speed and load)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--no-screen", action="store_true",
                   help="grade flagged submissions too (after reviewing their findings in results.json)")
    g.add_argument("--count-provisional", action="store_true",
                   help="count points judged from learners' measurement records where this machine has no GPU "
                        "(a record is checked for consistency, not re-measured: grades.csv lists them apart either way)")
    g.add_argument("--seed", type=int, help="the seed of the hidden cases (default: a new secret one per submission, "
                                            "kept in results.json; give it to grade again on the same cases)")
    g.set_defaults(fn=_cmd_autograde)

    rp = sub.add_parser("report", add_help=False,
                        help="a lab's results as a project README with plots (python -m grader report --help)")
    rp.add_argument("args", nargs=argparse.REMAINDER)
    rp.set_defaults(fn=_cmd_report)

    m = sub.add_parser("merge", help="combine the outputs of autograde --shard K/N into one grades.csv")
    m.add_argument("outputs", type=Path, nargs="+", help="the --out folder of every shard")
    m.add_argument("--out", type=Path, required=True, help="where the merged grades.csv, results.json, feedback/ go")
    m.set_defaults(fn=_cmd_merge)

    gb = sub.add_parser("gradebook", help="load a graded class (autograde or merge --out) into nbgrader's gradebook "
                                          "for the formgrader")
    gb.add_argument("out", type=Path, help="the --out folder of autograde or merge")
    gb.add_argument("--course", type=Path, default=None, help="the nbgrader course root (default: this repository's grader/)")
    gb.set_defaults(fn=_cmd_gradebook)

    fb = sub.add_parser("feedback", help="after manual grading: regenerate each student's feedback HTML and grades.csv "
                                         "from the gradebook (the formgrader's grades included)")
    fb.add_argument("out", type=Path, help="the --out folder of autograde or merge, loaded with `gradebook`")
    fb.add_argument("--course", type=Path, default=None, help="the nbgrader course root (default: this repository's grader/)")
    fb.set_defaults(fn=_cmd_feedback)

    ex = sub.add_parser("export", help="grades of one or more graded classes with each student's status, or a file "
                                       "Canvas or Moodle imports")
    ex.add_argument("outputs", type=Path, nargs="+", help="the --out folder of autograde or merge, one per assignment")
    ex.add_argument("--format", choices=["csv", "canvas", "moodle"], default="csv",
                    help="csv: one row per student and assignment, with status and why (default); canvas, moodle: their "
                         "gradebook import files, one row per student, a column per assignment")
    ex.add_argument("--roster", type=Path, help="CSV with student_id and name, email, sis_id, ... (needed for canvas "
                                                "and moodle; docs/grading.md)")
    ex.add_argument("--course", type=Path, default=None,
                    help="the nbgrader course root whose gradebook holds the manual grades (default: this repository's grader/)")
    ex.add_argument("--out", dest="to", type=Path, required=True, help="the file to write")
    ex.set_defaults(fn=_cmd_export)

    km = sub.add_parser("k8s-manifest", help="the Kubernetes manifests for grading a class in N shards "
                                             "(deploy/README.md)")
    km.add_argument("--shards", type=int, required=True, help="shards, one pod and one GPU each")
    km.add_argument("--assignment", required=True)
    km.add_argument("--image", required=True, help="the grading image (deploy/Dockerfile --target grade) in your registry")
    km.add_argument("--storage", default="20Gi", help="size of the volume for the class and its results (default 20Gi)")
    km.add_argument("--cpus", type=int, default=2, help="CPUs each shard requests (default 2, as the Slurm scripts ask)")
    km.add_argument("--tries", type=int, default=2, help="tries per shard before the merge names it failed (default 2)")
    km.add_argument("--wait-h", type=float, default=24.0,
                    help="hours the merge waits for a shard that never reports (default 24)")
    km.add_argument("--out", dest="to", type=Path, help="write here (default: standard output)")
    km.set_defaults(fn=_cmd_k8s_manifest)

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["report"]:  # its own parser: argparse's REMAINDER drops a leading --help
        return _cmd_report(argparse.Namespace(args=argv[1:]))
    a = p.parse_args(argv)
    if getattr(a, "check", False) and getattr(a, "student_repo", None) is not None:
        p.error("--student-repo writes files and --check writes none: use one or the other")
    if (getattr(a, "jobs", None) or 1) < 1:
        p.error("--jobs must be at least 1")
    if getattr(a, "timeout", None) is not None and a.timeout <= 0:
        p.error("--timeout must be a positive number of seconds")
    from grader.course import CourseError
    from grader.errors import Interrupted
    from grader.gpus import GpuPlanError
    from grader.shard import ShardError
    from grader.submissions import SubmissionError

    if getattr(a, "cmd", None) == "gradebook" and a.course is None:
        from grader import COURSE_ROOT

        a.course = COURSE_ROOT
    try:
        return a.fn(a)
    except SubmissionError as exc:
        path = getattr(a, "notebook", None)
        print(f"error: {path.name + ' ' if path is not None else ''}{exc}", file=sys.stderr)
        return 2
    except (CourseError, ShardError, GpuPlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(exc, file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
