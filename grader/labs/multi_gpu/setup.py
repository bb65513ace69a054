"""Lab 02's install needs: what its setup cell (``utils.course.bootstrap.setup("02_multi_gpu", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

import importlib.util

from utils.course.bootstrap import LabNeeds


def _trl_note() -> str:
    found = importlib.util.find_spec("trl") is not None
    return "TRL (section 7): " + ("installed" if found else "not installed (pip install trl)")


NEEDS = LabNeeds({"accelerate": "accelerate"}, note=_trl_note)
