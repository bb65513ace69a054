"""Lab 00's install needs: what its setup cell (``utils.course.bootstrap.setup("00_foundations", ...)``) installs
when the runtime lacks it, beyond what every lab imports, and the optional packages it runs without."""
from __future__ import annotations

from utils.course.bootstrap import LabNeeds

NEEDS = LabNeeds({})
