"""utils: the GPU Utilization Roadmap's measurement package.

Imported from the repository root (``import utils``). One concept per module; what each is for,
one line each, is in ``docs/architecture.md``. ``python -m utils`` prints the device report.
Modules import torch lazily where they can, so the pure maths works without it.
"""

__version__ = "0.1.0"
