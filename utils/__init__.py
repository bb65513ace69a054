"""utils: the GPU Utilization Roadmap's measurement package.

Installed with the grader by ``pip install -e .`` (pyproject.toml), or imported from the repository
root; a notebook's setup cell puts the course on the path itself (``utils/bootstrap.py``). One concept per module; what each is for,
one line each, is in ``docs/architecture.md``. ``python -m utils`` prints the device report.
Modules import torch lazily where they can, so the pure maths works without it.
"""

__version__ = "0.1.0"
