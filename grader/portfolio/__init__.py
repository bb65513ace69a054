"""``python -m grader report NOTEBOOK_OR_RECORD --out DIR [--record FILE]`` (also
``python -m grader report``): a lab's results as a README for the learner's GitHub project.

It is given a lab notebook or the measurement record its last cell wrote
(``checks.save_record``, ``grader/answers.py``); which lab, record and notebook that makes is
``grader/portfolio/inputs.py``'s ``load``. It writes ``DIR/README.md``: the machine the record was
measured on, each exercise's answers with their units (``grader/portfolio/sections.py``), the
figures the answers have the data for as PNG files (``grader/portfolio/plots.py``), the exercises
not done yet, named as the notebook names them, and the learner's written answers when the
notebook is there (``grader/portfolio/answers.py``). A partly solved lab renders what it has.

Two lines at the top say where the numbers are not this machine's GPU numbers: a smoke record
(measured on a CPU at the smoke sizes), and a record from another machine than this one (an H200
record opened on a laptop: the numbers are the H200's).

Every number is the record's, printed by ``grader/portfolio/format.py``. Bad input (no notebook or
record, a file that is neither, a record of no lab of this course or of another lab than the
notebook's) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from grader.portfolio import answers as A
from grader.portfolio import sections as S
from grader.portfolio.format import cudnn_version, md_table
from grader.portfolio.inputs import Inputs, PortfolioError, load  # noqa: F401 (re-exported)
from grader.portfolio.plots import KINDS, declutter, find_plots

PROG = "python -m grader report"
FINGERPRINT_ROWS = (
    ("name", "device"), ("memory_gib", "memory (GiB)"), ("device_count", "devices"),
    ("compute_capability", "compute capability"), ("sm_count", "SMs"), ("sm_clock_mhz", "SM clock (MHz)"),
    ("sm_clock_max_mhz", "SM clock max (MHz)"), ("mem_clock_mhz", "memory clock (MHz)"),
    ("mem_clock_max_mhz", "memory clock max (MHz)"), ("power_limit_w", "power limit (W)"),
    ("throttle_reasons", "throttle reasons"), ("mig_mode", "MIG mode"), ("driver", "driver"), ("cuda", "CUDA"),
    ("cudnn", "cuDNN"), ("torch", "torch"), ("python", "Python"), ("cpu_threads", "CPU threads (torch)"),
    ("platform", "platform"),
)
SMOKE_LINE = ("**Smoke record:** measured in smoke mode, on a CPU with the smoke sizes; these numbers show that "
              "the code runs, they are not GPU numbers.")


def is_smoke(data: dict) -> bool:
    return bool(data.get("smoke")) or data["fingerprint"].get("kind") != "gpu"


def _machine(fp: Mapping) -> str:
    name = str(fp.get("name") or "an unnamed device")
    return name if fp.get("kind") == "gpu" else f"a CPU, {name}"


def same_machine(fp: Mapping, here: Mapping) -> bool:
    """Whether the record's fingerprint ``fp`` is this machine's ``here``: the same kind and name
    (and the same GPU, where both know its UUID)."""
    if fp.get("kind") != here.get("kind") or fp.get("name") != here.get("name"):
        return False
    return not (fp.get("uuid") and here.get("uuid") and fp["uuid"] != here["uuid"])


def foreign_line(fp: Mapping, here: Mapping) -> str | None:
    """One line when the record was measured on another machine than this one."""
    if same_machine(fp, here):
        return None
    return (f"**Measured on another machine:** this record comes from {_machine(fp)}, not from this machine "
            f"({_machine(here)}); every number shown is that machine's.")


def fingerprint_value(key: str, v: object) -> object:
    if key == "cudnn":
        return cudnn_version(v)
    if key == "mig_mode" and v in (0, 1):
        return "enabled" if v else "disabled"
    if key == "throttle_reasons" and isinstance(v, list):
        return ", ".join(map(str, v)) or "none"
    return v


def machine_section(data: dict) -> list[str]:
    fp = data["fingerprint"]
    rows = [(label, fingerprint_value(k, fp[k])) for k, label in FINGERPRINT_ROWS if k in fp and fp[k] not in (None, "")]
    rows += [(label, data[k]) for k, label in (("tier", "size tier"), ("dtype", "matmul dtype")) if data.get(k)]
    out = ["## The machine", "", *md_table(["what", "value"], rows)]
    if data.get("utils_sha256"):
        out += ["", f"The `utils/` code that measured: sha256 `{data['utils_sha256']}`."]
    return out + [""]


def _quote(text: str) -> list[str]:
    return ["> " + line if line.strip() else ">" for line in text.splitlines()]


def todo_section(inp: Inputs, unanswered: list[A.Answer]) -> list[str]:
    items = S.todo(inp.lab, inp.data, inp.titles, [(a.title, a.cell_type) for a in unanswered])
    if not items:
        return []
    done, total = S.progress(inp.lab, inp.data)
    return ["## Not yet done", "",
            f"This lab is partly solved: the record holds the answers of {done} of its {total} measured exercises. "
            "Still to do, as the notebook names them:", "",
            *[f"- **{t}**: {what}." for t, what in items], ""]


def written_section(nb: dict | None) -> list[str]:
    if nb is None:
        return []
    prose = [a for a in A.answers(nb) if a.cell_type == "markdown" and a.answered]
    out = ["## My written answers", ""]
    for a in prose:
        out += [f"### {a.title}", "", *_quote(a.prose), ""]
    return out if prose else []


def plots_section(inp: Inputs, out_dir: Path) -> list[str]:
    """The figures the answers draw, saved beside the README, and those the lab makes that are not
    drawn yet, with the exercise to finish first."""
    answers: dict = {}
    for cell_answers in inp.data["answers"].values():
        for k, v in cell_answers.items():
            answers.setdefault(k, v)
    where = {n: inp.titles.get(c, c) for c, specs in reversed(list(S.declared(inp.lab).items())) for n in specs}
    out, waiting = [], []
    for p in find_plots(answers, inp.data["fingerprint"]):
        lacking = [n for n in p.needs if n in where and n not in answers]
        if p.draw is not None:
            try:
                fig = p.draw()
            except ValueError as exc:  # numbers utils/plots.py cannot draw
                waiting.append(f"- {KINDS[p.kind].capitalize()}: your numbers cannot be drawn ({exc}).")
                continue
            declutter(fig)
            fig.savefig(out_dir / p.file, dpi=110, bbox_inches="tight")
            out += [f"### {KINDS[p.kind].capitalize()}", "", f"![{KINDS[p.kind]}]({p.file})", "",
                    p.caption[:1].upper() + p.caption[1:] + ".", ""]
        elif lacking:
            titles = list(dict.fromkeys(where[n] for n in lacking))
            waiting.append(f"- {KINDS[p.kind].capitalize()}: drawn once you finish "
                           + " and ".join(f"*{t}*" for t in titles) + ".")
        elif p.why_not:
            waiting.append(f"- {KINDS[p.kind].capitalize()}: not drawn, because {p.why_not}.")
    if waiting:
        out += ["Not drawn yet:", "", *waiting, ""]
    return ["## Plots", "", *out] if out else []


def render(inp: Inputs, out_dir: Path, here: Mapping | None = None) -> str:
    """Write the plots into ``out_dir``; return the README's text. ``here``: this machine's
    fingerprint (default: ``utils.device.hardware.fingerprint()``)."""
    if here is None:
        from utils.device.hardware import fingerprint

        here = fingerprint()
    data, fp = inp.data, inp.data["fingerprint"]
    lines = [f"# {inp.title}: my measurements", ""]
    foreign = foreign_line(fp, here)
    if foreign:
        lines += [foreign, ""]
    if is_smoke(data):
        lines += [SMOKE_LINE, ""]
    answers_from = (f"the written answers those of the notebook `{inp.notebook.name}`" if inp.notebook is not None
                    else "no notebook beside it, so no written answers")
    lines += [f"Lab `{inp.lab}` of the GPU Utilization Roadmap: the numbers are those of the record "
              f"`{inp.record_path.name}` that the notebook's last cell wrote, {answers_from}. "
              f"Written by `{PROG}`.", ""]
    unanswered = [a for a in A.answers(inp.nb) if not a.answered] if inp.nb is not None else []
    lines += machine_section(data)
    lines += todo_section(inp, unanswered)
    lines += S.results(inp.lab, data, inp.titles)
    lines += plots_section(inp, out_dir)
    lines += written_section(inp.nb)
    lines += S.every_value(inp.lab, data, inp.titles)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def build(path: Path, out_dir: Path, record: Path | None = None, here: Mapping | None = None) -> Path:
    """Check the input (a notebook, or a record; see :func:`load`), write ``out_dir/README.md``
    and its plots; return the README's path."""
    inp = load(Path(path), record)
    if "matplotlib.pyplot" not in sys.modules:  # headless, unless a notebook already chose a backend
        import matplotlib

        matplotlib.use("Agg")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PortfolioError(f"cannot write to {out_dir}: {exc.strerror}") from None
    text = render(inp, out_dir, here)
    readme = out_dir / "README.md"
    readme.write_text(text)
    return readme


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="a lab's results as a README with plots, from the measurement "
                                 "record its last cell wrote and the notebook's written answers")
    ap.add_argument("notebook", type=Path, metavar="NOTEBOOK_OR_RECORD",
                    help="the lab notebook (its written answers are quoted), or the record a lab's last cell wrote "
                    "(<assignment>.record.json; the notebook beside it, if any, gives the written answers)")
    ap.add_argument("--out", type=Path, required=True, help="folder for README.md and the PNG plots")
    ap.add_argument("--record", type=Path, help="with a notebook, the measurement record (default: "
                    "<assignment>.record.json beside the notebook, else <assignment>.smoke.record.json)")
    return ap


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    a = parser(prog).parse_args(argv)
    try:
        readme = build(a.notebook, a.out, a.record)
    except PortfolioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m grader report"))
