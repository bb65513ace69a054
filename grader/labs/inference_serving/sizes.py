"""Lab 03, inference's sizes per tier (``utils.env``'s tiers: cpu for smoke mode, t4, a100, h100)."""
from __future__ import annotations

from utils.env import phase_sizes

ASSIGNMENT = "03_inference_serving"


def sizes(tier: str | None = None):
    """The sizes for ``tier`` (default: this device's)."""
    return phase_sizes(ASSIGNMENT, tier)
