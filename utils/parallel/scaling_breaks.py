"""The names lab 02 gives to the ways data-parallel scaling breaks, and to their causes.

``SCENARIOS`` are the runs of the notebook's section 4 (a small per-device batch, gradient
accumulation that all-reduces every micro-batch, peer-to-peer transfers disabled);
``CAUSES`` are the answers its explanation may give, and ``NEAR_LINEAR`` the efficiency loss
below which a run counts as scaling near linearly (the notebook's rule, section 5).
The grader reads the same names (``grader/labs/multi_gpu/answers.py``).
"""
from __future__ import annotations

SCENARIOS = ("small_batch", "accum_without_no_sync", "p2p_disabled")
CAUSES = ("near_linear", "exposed_communication", "other_overhead")
NEAR_LINEAR = 0.05  # an efficiency loss under 5% has no dominant cause worth naming
