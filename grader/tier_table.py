"""The table of tiers in README.md, and the plans of every lab on any card: each lab's plan and sizes
(``grader/labs/<lab>/plan.py``, ``sizes.py``) through ``utils.course.tier_plan``, one source, so the README
cannot drift from what the labs print.

    python -m grader.tier_table                      # the six plans on this machine
    python -m grader.tier_table 03_inference_serving --card p100
    python -m grader.tier_table --readme             # rewrite README.md's table (tests check it)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import labs
from utils.course import env, tier_plan
from utils.course.tier_plan import CARDS, CONTEXT_GIB, MARGIN, Card, LabPlan, MeasuredPeak

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = ("<!-- tier-table: written by `python -m grader.tier_table --readme`; edit the labs' plan.py and sizes.py "
         "or utils/course/tier_plan.py, not this -->")
END = "<!-- /tier-table -->"
TABLE_CARDS = ("t4", "t4x2", "p100", "l4", "a100-40gb", "h100")


def plan(lab: str, card: Card) -> LabPlan:
    """``lab``'s plan on ``card`` at the sizes the lab gives that card."""
    return labs.plan_for(lab, card)


def calibration() -> list[tuple[MeasuredPeak, LabPlan, float]]:
    """Each measured peak (``grader.labs.measured_peaks``: each lab's ``MEASURED_PEAKS``) with the plan on
    the card it was measured on and that plan's device-wide peak in GiB."""
    out = []
    for r in labs.measured_peaks():
        p = plan(r.lab, r.card)
        out.append((r, p, p.peak[1]))
    return out


def text(lab: str, card: Card) -> str:
    """The plan as a learner on ``card`` reads it (the other labs' lines included where it matters)."""
    return plan(lab, card).text(labs.plans_on)


def readme_section() -> str:
    """The README's table of tiers and the reasons behind its skips; a lab whose peak was measured
    on a card of a row says so in its cell, with a letter for the machine and date below."""
    short = {lab: lab.split("_")[0] for lab in labs.assignments()}
    head = "| tier | card | memory (GiB) | dtype | torch.compile | " + " | ".join(f"lab {short[x]}" for x in labs.assignments()) + " |"
    rows = [head, "|" + "---|" * (5 + len(labs.assignments()))]
    reasons: dict[tuple[str, str], list[str]] = {}
    letters: dict[str, str] = {}
    measured = {}
    for r, p, g in calibration():
        measured[(r.card.key, r.lab)] = (r, p, g)
        letters.setdefault(r.how, "abcdefgh"[len(letters)])
    for key in TABLE_CARDS:
        card = CARDS[key]
        cells = []
        for p in (plan(lab, card) for lab in labs.assignments()):
            need = p.peak[1] if p.peak else 0.0
            cell = ("runs all" if not p.skipped else "skips " + ", ".join(p.skipped)) + f"; {need:.1f}"
            if (key, p.lab) in measured:
                r, mp, g = measured[(key, p.lab)]
                cell += f" (measured {r.gib:.1f} [{letters[r.how]}]"
                cell += ")" if abs(g - need) < 0.05 else f" {_difference(r.card, card)}, where the plan is {g:.1f})"
            cells.append(cell)
            for what, why in p.skipped.items():
                named = reasons.setdefault((what, why), [])
                if short[p.lab] not in named:
                    named.append(short[p.lab])
        ok = tier_plan.compile_support(card)[0]
        rows.append(f"| {key} ({card.size_tier} sizes) | {card.name}, {card.where} | {card.memory_gib:.1f} | "
                    f"{tier_plan.card_dtype(card)} | {'yes' if ok else 'no: compute capability below 7.0'} | "
                    + " | ".join(cells) + " |")
    sources = dict.fromkeys(CARDS[k].memory_source for k in TABLE_CARDS)
    out = [BEGIN, *rows, "",
           f"Each lab cell: what it skips, then its peak GiB per GPU as `nvidia-smi` would show it, an estimate "
           f"({MARGIN:.0%} margin and {CONTEXT_GIB} GiB of CUDA context per process included; `utils.course.lab_memory`). "
           "A cell that says \"measured\" also gives the lab's measured device-wide peak on that row's card "
           "(`MEASURED_PEAKS` in each lab's `grader/labs/<lab>/plan.py`; a test holds each plan at or above its measured peak and at most "
           "15% above it); every other cell is an estimate only. A peak equal to the card's memory is the caching "
           "allocator filling the card with blocks it gives back on demand. Measured on: "
           + "; ".join(f"[{x}] {how}" for how, x in letters.items()) + ". Memory: "
           + "; ".join(f"{', '.join(CARDS[k].name for k in TABLE_CARDS if CARDS[k].memory_source == src)}: {src}"
                       for src in sources) + ".", ""]
    for key in TABLE_CARDS:
        out += [f"- **{CARDS[key].name}**: {note}" for note in tier_plan.card_notes(CARDS[key])]
    out += ["", "Why each skip:", ""]
    out += [f"- **{what}** (lab {', '.join(labs)}): {why}" for (what, why), labs in reasons.items()]
    out.append(END)
    return "\n".join(out)


def _difference(measured: Card, card: Card) -> str:
    """How the card a peak was measured on differs from the row's card, in a few words."""
    parts = []
    if measured.sms != card.sms:
        parts.append(f"with {measured.sms} SMs")
    if measured.lacks("vllm") and not card.lacks("vllm"):
        parts.append("without vLLM")
    return ", ".join(parts) or f"on {measured.name}"


def readme_block(path: Path = README) -> str:
    """The table as the README holds it now, markers included."""
    text_ = path.read_text()
    i, j = text_.find(BEGIN), text_.find(END)
    if i < 0 or j < 0:
        raise ValueError(f"{path} has no tier-table markers ({BEGIN!r} ... {END!r})")
    return text_[i:j + len(END)]


def write_readme(path: Path = README) -> bool:
    """Replace the README's table with :func:`readme_section`; True when the file changed."""
    old = path.read_text()
    new = old.replace(readme_block(path), readme_section())
    if new != old:
        path.write_text(new)
    return new != old


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grader.tier_table", description=__doc__.split("\n")[0])
    ap.add_argument("lab", nargs="?", choices=labs.assignments(), help="one lab (default: all six)")
    ap.add_argument("--card", choices=sorted(CARDS), help="a card of the table instead of this machine")
    ap.add_argument("--readme", action="store_true", help="rewrite README.md's table of tiers")
    a = ap.parse_args(argv)
    if a.readme:
        print("README.md " + ("updated" if write_readme() else "already up to date"))
        return 0
    card = CARDS[a.card] if a.card else tier_plan.current_card(env.smoke_mode())
    for lab in [a.lab] if a.lab else labs.assignments():
        print(text(lab, card), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
