"""The table of tiers in README.md, and the plans of every lab on any card, from ``utils.tier_plan``
and the sizes of ``utils.env``: one source, so the README cannot drift from what the labs print.

    python -m utils.tier_table                      # the six plans on this machine
    python -m utils.tier_table 03_inference_serving --card p100
    python -m utils.tier_table --readme             # rewrite README.md's table (tests check it)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils import env, tier_plan
from utils.tier_plan import CARDS, CONTEXT_GIB, LABS, MARGIN, Card, LabPlan

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- tier-table: written by `python -m utils.tier_table --readme`; edit utils/tier_plan.py, not this -->"
END = "<!-- /tier-table -->"
TABLE_CARDS = ("t4", "t4x2", "p100", "l4", "a100-40gb", "h100")


def plan(lab: str, card: Card) -> LabPlan:
    """``lab``'s plan on ``card`` at the sizes ``utils.env`` gives that card."""
    tier = tier_plan.sizes_tier(lab, card)
    return tier_plan.plan_for(lab, card, env.phase_sizes(lab, tier), tier)


def text(lab: str, card: Card) -> str:
    """The plan as a learner on ``card`` reads it (the other labs' lines included where it matters)."""
    return plan(lab, card).text(env.phase_sizes)


def readme_section() -> str:
    """The README's table of tiers and the reasons behind its skips."""
    short = {lab: lab.split("_")[0] for lab in LABS}
    head = "| tier | card | memory (GiB) | dtype | torch.compile | " + " | ".join(f"lab {short[x]}" for x in LABS) + " |"
    rows = [head, "|" + "---|" * (5 + len(LABS))]
    reasons: dict[tuple[str, str], list[str]] = {}
    for key in TABLE_CARDS:
        card = CARDS[key]
        cells = []
        for p in (plan(lab, card) for lab in LABS):
            need = p.peak[1] if p.peak else 0.0
            cells.append(("runs all" if not p.skipped else "skips " + ", ".join(p.skipped)) + f"; {need:.1f}")
            for what, why in p.skipped.items():
                labs = reasons.setdefault((what, why), [])
                if short[p.lab] not in labs:
                    labs.append(short[p.lab])
        ok = tier_plan.compile_support(card)[0]
        rows.append(f"| {key} ({card.size_tier} sizes) | {card.name}, {card.where} | {card.memory_gib:.1f} | "
                    f"{tier_plan.card_dtype(card)} | {'yes' if ok else 'no: compute capability below 7.0'} | "
                    + " | ".join(cells) + " |")
    sources = dict.fromkeys(CARDS[k].memory_source for k in TABLE_CARDS)
    out = [BEGIN, *rows, "",
           f"Each lab cell: what it skips, then its estimated peak GiB per GPU ({MARGIN:.0%} margin and "
           f"{CONTEXT_GIB} GiB of CUDA context per process included; `utils.lab_memory`). Memory: "
           + "; ".join(f"{', '.join(CARDS[k].name for k in TABLE_CARDS if CARDS[k].memory_source == src)}: {src}"
                       for src in sources) + ".", ""]
    for key in TABLE_CARDS:
        out += [f"- **{CARDS[key].name}**: {note}" for note in tier_plan.card_notes(CARDS[key])]
    out += ["", "Why each skip:", ""]
    out += [f"- **{what}** (lab {', '.join(labs)}): {why}" for (what, why), labs in reasons.items()]
    out.append(END)
    return "\n".join(out)


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
    ap = argparse.ArgumentParser(prog="python -m utils.tier_table", description=__doc__.split("\n")[0])
    ap.add_argument("lab", nargs="?", choices=LABS, help="one lab (default: all six)")
    ap.add_argument("--card", choices=sorted(CARDS), help="a card of the table instead of this machine")
    ap.add_argument("--readme", action="store_true", help="rewrite README.md's table of tiers")
    a = ap.parse_args(argv)
    if a.readme:
        print("README.md " + ("updated" if write_readme() else "already up to date"))
        return 0
    card = CARDS[a.card] if a.card else tier_plan.current_card(env.smoke_mode())
    for lab in [a.lab] if a.lab else LABS:
        print(text(lab, card), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
