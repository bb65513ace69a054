"""The written answers: manually graded cells, and the automatic check of the numbers they quote.

Four labs end a section with a write-up (phase 0's limiter, phase 1's before/after report,
phase 2's scaling explanation, phase 4's deployment choice): an nbgrader "manually graded
answer" cell (a markdown cell with ``solution`` and ``grade`` set, ``docs/grading.md``), with
its rubric in the locked cell above it. An instructor grades it in nbgrader's formgrader; the
grader never gives it points on its own, and every result lists it as needing a manual grade.

What can be checked without a reader is whether the numbers an answer quotes are numbers this
run measured. :class:`QuotedNumbers`, an nbgrader preprocessor that runs after nbgrader's
``SaveAutoGrades`` (``grader/nbgrader_config.py``), reads every number in each write-up,
compares it with the numbers the executed notebook printed in the write-up's section (its code
cells' outputs, where every lab prints what it measured), and writes the verdict as the cell's automatic comment in the
gradebook. The formgrader shows that comment beside the answer, and ``grader check`` and
``grades.csv`` carry it. A quoted number matches a printed one within the rounding the quote
shows (``26,300`` matches 26,328; ``34.8%`` matches 0.3481), or 0.5%.

Not counted as quotes: bare integers up to 16 (counts, ranks, list items) and numbers the
course's own text states (thresholds such as 0.5, figures quoted from RESULTS.md). The check
reads the learner's outputs, which the learner's code printed: it tells a reviewer whether prose
and printout agree, and the lab's judges, against the grader's own measurements, decide whether the
printout is true.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

STUB = "YOUR ANSWER HERE"  # grader/nbgrader_config.py: ClearSolutions.text_stub
SMALL_INT = 16  # bare integers up to this are counts, not measurements
REL_TOL = 0.005

# 1,234.5 | 1234.5 | 1.2e-3, then an optional magnitude or unit that changes the value
_NUMBER = re.compile(r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
                     r"(?P<suffix>\s?%|[kKMG](?![a-zA-Z])|[x×](?![a-zA-Z]))?")
_MAGNITUDE = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


@dataclass(frozen=True)
class Quote:
    """One number in a text: its value as written, whether it was a percentage, and the
    rounding the writing shows (half a unit of its last significant digit)."""

    text: str
    value: float
    percent: bool
    half_unit: float

    def matches(self, printed: Quote) -> bool:
        """Whether this quote is ``printed`` rounded (a percentage may be a printed fraction)."""
        candidates = [printed.value]
        if self.percent and not printed.percent:
            candidates.append(printed.value * 100)
        if printed.percent and not self.percent:
            candidates.append(printed.value / 100)
        return any(abs(self.value - v) <= max(self.half_unit, REL_TOL * abs(v)) + 1e-12 for v in candidates)


def quotes(text: str) -> list[Quote]:
    """Every number in ``text`` (markdown or printed output), in order."""
    out = []
    for m in _NUMBER.finditer(text):
        raw, suffix = m["num"], (m["suffix"] or "").strip()
        value = float(raw.replace(",", ""))
        digits = raw.replace(",", "").split("e")[0].split("E")[0]
        if "." in digits:
            half = 0.5 * 10 ** -len(digits.split(".")[1])
        else:
            half = 0.5 * 10 ** (len(digits) - len(digits.rstrip("0"))) if digits.strip("0") else 0.5
        if "e" in raw.lower():
            exp = int(re.split("[eE]", raw)[1])
            half *= 10 ** exp
        scale = _MAGNITUDE.get(suffix, 1.0)
        out.append(Quote(m.group(0), value * scale, suffix == "%", half * scale))
    return out


@dataclass
class Verdict:
    """What :func:`check` found in one answer."""

    answered: bool
    matched: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    def note(self) -> str:
        """One line for the reviewer (the formgrader's automatic comment)."""
        if not self.answered:
            return "No response: the answer cell is as released."
        n = len(self.matched) + len(self.unmatched)
        if n == 0:
            return "Quoted numbers: none (the rubric asks for the measurements)."
        if not self.unmatched:
            return f"Quoted numbers: {n}, all printed by this run's cells ({', '.join(self.matched)})."
        return (f"Quoted numbers: {n}, {len(self.matched)} printed by this run's cells; not found among them: "
                f"{', '.join(self.unmatched)}.")


def _counts(q: Quote) -> bool:
    bare_int = float(q.value).is_integer() and not q.percent and not re.search(r"[.,eE%kKMGx×]", q.text)
    return not (bare_int and q.value <= SMALL_INT) and math.isfinite(q.value)


def check(answer: str, printed: list[Quote], course_text: list[Quote] = ()) -> Verdict:
    """The numbers ``answer`` quotes against those the run ``printed`` (``course_text``: numbers the
    lab's own text states, which an answer may repeat without their being measurements)."""
    text = answer.strip()
    if not text or text == STUB:
        return Verdict(False)
    v = Verdict(True)
    for q in quotes(text):
        if not _counts(q) or any(q.matches(c) for c in course_text):
            continue
        (v.matched if any(q.matches(p) for p in printed) else v.unmatched).append(q.text.strip())
    return v


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _outputs_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(_source({"source": o.get("text", "")}))
        elif o.get("output_type") in ("execute_result", "display_data"):
            data = o.get("data", {})
            parts.append(_source({"source": data.get("text/plain", "")}))
            parts.append(_source({"source": data.get("text/markdown", "")}))
    return "\n".join(parts)


def is_writeup(cell) -> bool:
    """An nbgrader manually graded answer cell: markdown, ``solution`` and ``grade`` set."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "markdown" and bool(meta.get("solution")) and bool(meta.get("grade"))


def _section_start(cells, i: int) -> int:
    """Index of the level-2 heading (``## ``) that opens the section holding cell ``i``."""
    for k in range(i, -1, -1):
        c = cells[k]
        if c.get("cell_type") == "markdown" and not is_writeup(c) and re.match(r"\s*## ", _source(c)):
            return k
    return 0


def notes(nb) -> dict[str, str]:
    """``grade_id`` -> the reviewer's note, for every write-up in the executed notebook ``nb``. A
    write-up's numbers are looked for in what its own section's code cells printed (a lab prints
    hundreds of numbers: over all of them, a short quote would often match one by chance)."""
    cells = nb["cells"]
    course = [q for c in cells if c.get("cell_type") == "markdown" and not is_writeup(c) for q in quotes(_source(c))]
    out = {}
    for i, c in enumerate(cells):
        if is_writeup(c):
            printed = [q for d in cells[_section_start(cells, i):i] if d.get("cell_type") == "code"
                       for q in quotes(_outputs_text(d))]
            out[c["metadata"]["nbgrader"]["grade_id"]] = check(_source(c), printed, course).note()
    return out


def _preprocessor_base():
    from nbgrader.preprocessors import NbGraderPreprocessor

    return NbGraderPreprocessor


class QuotedNumbers(_preprocessor_base()):
    """nbgrader preprocessor (after ``SaveAutoGrades``): each write-up's :func:`notes` verdict
    becomes its automatic comment in the gradebook, which the formgrader shows the reviewer."""

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry

        found = notes(nb)
        if not found:
            return nb, resources
        ids = resources["nbgrader"]
        with Gradebook(ids["db_url"]) as gb:
            for grade_id, note in found.items():
                try:
                    comment = gb.find_comment(grade_id, ids["notebook"], ids["assignment"], ids["student"])
                except MissingEntry:
                    continue
                comment.auto_comment = note
            gb.db.commit()
        return nb, resources
