"""``python -m utils.portfolio NOTEBOOK_OR_RECORD --out DIR [--record FILE]`` (also
``python -m grader report ...``, grader/__main__.py): a lab's results as a README for the
learner's GitHub project.

It is given a lab notebook or a measurement record (``utils/record.py``); which lab, record
and notebook that makes is ``utils/portfolio_inputs.py``'s ``load``. It writes
``DIR/README.md`` with the machine's fingerprint, what each measurement ran (the workload),
the lab's before/after tables (``utils/portfolio_sections.py``), every measurement with its
unit, the figures the record has data for as PNG files (``utils/portfolio_plots.py``; a figure
it lacks the data for is named with the reason), and the learner's own answers: quoted as
written from the notebook (``utils/portfolio_answers.py``), or, given a record with no
notebook beside it, those the record holds.

Every number in the README is the record's, printed by ``utils/portfolio_format.py``'s
``num``. Bad input (no notebook or record, a file that is neither, a record of no lab of this
course or of another lab than the notebook's) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from utils import portfolio_answers as A
from utils.env import repo_root
from utils.portfolio_format import leaves, md_table, num, pairs
from utils.portfolio_inputs import SIGNATURES, Inputs, PortfolioError, load, record_lab  # noqa: F401 (re-exported)
from utils.portfolio_plots import KINDS, find_plots
from utils.portfolio_sections import SECTIONS
from utils.record import Record

# Extras that say what a measurement ran (its workload), beside anything under config/workload/sizes.
WORKLOAD_KEYS = {
    "model", "preset", "engine", "dtype", "precision", "mixed_precision", "quant", "mode", "batch", "batch_size",
    "batch_per_device", "small_batch", "grad_accum", "seq", "seq_len", "prompt_len", "new_tokens", "context_len",
    "input_len", "output_len", "num_requests", "request_rate", "concurrency", "arrival", "tokens_per_step", "steps",
    "warmup", "runs", "n", "k", "bytes", "flops", "world_size", "n_gpus", "nproc", "backend", "tier", "every",
    "price_row", "usd_per_gpu_hour", "slo_ms", "demand_per_s", "prompt_lens", "tokens",
}
DEFINITION_DICTS = {"config", "workload", "sizes", "env"}
NOT_WORKLOAD = {"base_url"}  # a local port: nothing to a reader of the README
FINGERPRINT_ROWS = (
    ("name", "device"), ("kind", "kind"), ("memory_gib", "memory (GiB)"), ("device_count", "devices"),
    ("compute_capability", "compute capability"), ("sm_count", "SMs"), ("sm_clock_mhz", "SM clock (MHz)"),
    ("sm_clock_max_mhz", "SM clock max (MHz)"), ("mem_clock_mhz", "memory clock (MHz)"),
    ("mem_clock_max_mhz", "memory clock max (MHz)"), ("power_limit_w", "power limit (W)"),
    ("throttle_reasons", "throttle reasons"), ("mig_mode", "MIG mode"), ("driver", "driver"), ("cuda", "CUDA"),
    ("cudnn", "cuDNN"), ("torch", "torch"), ("python", "Python"), ("cpu_threads", "CPU threads (torch)"),
    ("platform", "platform"),
)
SMOKE_LINE = ("**Smoke record:** measured in smoke mode, on a CPU with the smoke sizes; these numbers show that "
              "the code runs, they are not GPU numbers.")


def is_smoke(rec: Record, path: Path) -> bool:
    return rec.fingerprint.get("kind") != "gpu" or ".smoke." in path.name


def workload(extra: dict) -> str:
    """What a measurement ran: its top-level workload extras and everything under a
    config/workload/sizes/env dict, each once by name. Where the runs an extra holds (lab 02's
    ``breaks``, lab 04's ``candidates``) differ on one, each run's value, named by its run."""
    found: dict[str, list[tuple[tuple[str, ...], tuple[str, ...], object]]] = {}
    for path, v in leaves(extra):
        if not path or path[-1] in NOT_WORKLOAD or isinstance(v, list) and len(v) > 8:
            continue
        inside = [i for i, p in enumerate(path[:-1]) if p in DEFINITION_DICTS]
        if inside:
            run, name = path[:inside[0]], ".".join(p for p in path[inside[0]:] if p not in DEFINITION_DICTS)
        elif len(path) == 1 and path[0] in WORKLOAD_KEYS:
            run, name = (), path[0]
        else:
            continue
        vs = found.setdefault(name, [])
        if all(v != w for _, _, w in vs):
            vs.append((run, path, v))
    items = []
    for name, vs in found.items():
        if len(vs) == 1:
            items.append((name, vs[0][2]))
            continue
        common = 0
        while all(len(r) > common and r[common] == vs[0][0][common] for r, _, _ in vs):
            common += 1
        if len({r[common:] for r, _, _ in vs}) < len(vs):  # not told apart by run: by where they sit
            items += [(".".join(p), v) for _, p, v in vs]
        else:
            items += [(f"{name} ({'.'.join(r[common:])})", v) for r, _, v in vs]
    return pairs(items) if items else "not in the record"


def _title(nb: dict | None, lab: str) -> str:
    """The notebook's first ``# `` heading; without a notebook, the released one's (notebooks/)."""
    if nb is None:
        try:
            nb = A.load_notebook(repo_root() / "notebooks" / f"{lab}.ipynb")
        except (OSError, ValueError):
            return lab
    for c in nb["cells"]:
        if c.get("cell_type") == "markdown":
            for line in A.source(c).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return lab


def _quote(text: str) -> list[str]:
    return ["> " + line if line.strip() else ">" for line in text.splitlines()]


def _fence(text: str) -> list[str]:
    fence = "~~~~" if "```" in text else "```"
    return [fence + "python", *text.splitlines(), fence]


def _as_recorded(name: str, extras: dict) -> str | None:
    """``- `NAME` as the run recorded it: ...`` for the answer ``name``, if the record holds it."""
    v = A.recorded(name, extras)
    if isinstance(v, dict):
        return f"- `{name}` as the run recorded it: " + pairs(v.items())
    return None if v is None else f"- `{name}` as the run recorded it: {num(v)}"


def recorded_answers_section(lab: str, rec: Record) -> list[str]:
    """The answers without the notebook: the string answers the lab asks for
    (``utils/portfolio_answers.py``'s ``STRING_ANSWERS``) as the record holds them."""
    extras = {k: m.extra for k, m in rec.measurements.items()}
    found = [line for n in A.STRING_ANSWERS.get(lab, ()) if (line := _as_recorded(n, extras))]
    out = ["## My answers", "", "No notebook beside the record, so only the answers the record holds are shown "
           "(give the notebook instead of the record to quote all of them).", ""]
    return out + (found or ["The record holds none of this lab's answers."]) + [""]


def answers_section(nb: dict | None, lab: str, rec: Record) -> list[str]:
    if nb is None:
        return recorded_answers_section(lab, rec)
    found = A.answers(nb, lab)
    extras = {k: m.extra for k, m in rec.measurements.items()}
    out = ["## My answers", ""]
    prose = [a for a in found if a.cell_type == "markdown" and a.answered]
    code = [a for a in found if a.cell_type == "code" and a.answered]
    missing = [a for a in found if not a.answered]
    for a in prose:
        out += [f"### `{a.grade_id}`", "", *_quote(a.prose), ""]
    for a in code:
        out += [f"### `{a.grade_id}`: {', '.join(f'`{n}`' for n in a.names)}", "", "As written:", "",
                *_fence("\n".join(a.statements)), ""]
        out += [line for n in a.names if (line := _as_recorded(n, extras))]
        if a.printed:
            out += ["", "The cell printed:", "", *_quote(a.printed)]
        out.append("")
    if not prose and not code:
        out += ["The notebook has no written answers (prose or string answers) to quote.", ""]
    if missing:
        out += ["Not answered: " + ", ".join(f"`{a.grade_id}` ({a.cell_type})" for a in missing) + ".", ""]
    return out


def render(inp: Inputs, out_dir: Path) -> str:
    """Write the plots into ``out_dir``; return the README's text."""
    nb, lab, rec, record_path = inp.nb, inp.lab, inp.rec, inp.record_path
    fp, smoke = rec.fingerprint, is_smoke(rec, record_path)
    lines = [f"# {_title(nb, lab)}: my measurements", ""]
    if smoke:
        lines += [SMOKE_LINE, ""]
    answers_from = (f"the answers those of the notebook `{inp.notebook.name}`" if inp.notebook is not None
                    else "the answers those the record holds")
    lines += [f"Lab `{lab}` of the GPU Utilization Roadmap. The numbers are those of the measurement record "
              f"`{record_path.name}` (`utils/record.py`), {answers_from}. "
              "Written by `python -m utils.portfolio`.", ""]
    lines += ["## The machine", ""]
    lines += md_table(["fingerprint", "value"],
                      [(label, fp[k]) for k, label in FINGERPRINT_ROWS if k in fp and fp[k] not in (None, "")])
    if rec.utils_sha256:
        lines += ["", f"The `utils/` code that measured: sha256 `{rec.utils_sha256}`."]
    lines += ["", "## The workloads", "", "What each measurement ran (a throughput means nothing without its workload):", ""]
    lines += md_table(["measurement", "workload"], [(k, workload(m.extra)) for k, m in rec.measurements.items()])
    section = SECTIONS.get(lab, lambda r: [])(rec)
    if section:
        lines += ["", "## Results", "", *section]
    lines += ["", "## Every measurement", ""]
    lines += md_table(["measurement", "value", "unit", "spread", "how measured"],
                      [(k, m.value, m.unit, m.spread, m.method) for k, m in rec.measurements.items()])
    lines += ["", "Spread: the relative spread of the repeats, as `utils/record.py` defines it, where there were "
              "repeats.", ""]
    lines += plots_section(rec, out_dir)
    lines += answers_section(nb, lab, rec)
    lines += ["<details><summary>Every number the record holds</summary>", ""]
    for k, m in rec.measurements.items():
        flat = [(".".join(p), v) for p, v in leaves(m.extra) if p]
        lines += [f"- `{k}`: value {num(m.value)} {m.unit}" + (f"; {pairs(flat)}" if flat else "")]
    lines += ["", "</details>", ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def plots_section(rec: Record, out_dir: Path) -> list[str]:
    out, skipped = ["## Plots", ""], []
    for p in find_plots(rec):
        if p.draw is None:
            skipped.append(p)
            continue
        try:
            fig = p.draw()
        except ValueError as exc:  # numbers utils/plots.py cannot draw (a zero on a log axis)
            p.why_not = f"the record's numbers cannot be drawn: {exc}"
            skipped.append(p)
            continue
        fig.savefig(out_dir / p.file, dpi=110)
        caption = p.caption[:1].upper() + p.caption[1:]
        out += [f"### {KINDS[p.kind].capitalize()}", "", f"![{KINDS[p.kind]}]({p.file})", "", caption + ".", ""]
    if skipped:
        out += ["Not drawn, for want of data in the record (none is made up):", ""]
        out += [f"- {KINDS[p.kind]}: {p.why_not}." for p in skipped]
        out.append("")
    return out


def build(path: Path, out_dir: Path, record: Path | None = None) -> Path:
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
    readme = out_dir / "README.md"
    readme.write_text(render(inp, out_dir))
    return readme


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m utils.portfolio", description="a lab's results as a README with "
                                 "plots, from its measurement record and the notebook's answers")
    ap.add_argument("notebook", type=Path, metavar="NOTEBOOK_OR_RECORD",
                    help="the lab notebook (its answers are quoted), or the measurement record a lab wrote "
                    "(<assignment>.record.json; the notebook beside it, if any, gives the answers)")
    ap.add_argument("--out", type=Path, required=True, help="folder for README.md and the PNG plots")
    ap.add_argument("--record", type=Path, help="with a notebook, the measurement record (default: "
                    "<assignment>.record.json beside the notebook, else <assignment>.smoke.record.json)")
    a = ap.parse_args(argv)
    try:
        readme = build(a.notebook, a.out, a.record)
    except PortfolioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
