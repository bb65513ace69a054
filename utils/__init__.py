"""utils: the GPU Utilization Roadmap's measurement package.

Installed with the grader by ``pip install -e .`` (pyproject.toml), or imported from the repository
root; a notebook's setup cell puts the course on the path itself (``utils/course/bootstrap.py``).
Subpackages follow concepts, one concept per module (``docs/architecture.md`` lists them):

- ``utils.device``: the card, NVML, sampling, memory in use, topology;
- ``utils.measure``: timing, FLOPs and MFU, the matmul ceiling, peak memory, the record of a number;
- ``utils.diagnosis``: the profiler and where a step's time goes;
- ``utils.model``, ``utils.train``, ``utils.parallel``: models, one-GPU training, several GPUs;
- ``utils.kv``, ``utils.serving``: the KV cache as engines allocate it, inference and serving;
- ``utils.production``, ``utils.capacity``, ``utils.tpu``: monitoring and deployment, cost, TPUs;
- ``utils.course``: what a lab's notebook needs from the course (setup cell, tier, memory plan);
- ``utils.units``, ``utils.validate``, ``utils.plots``: shared by all of them.

Every module also answers to its bare name under ``utils`` (``utils.kv.kvcache`` is the module
``utils.kv.kvcache``, ``python -m utils.kv.kvcache`` runs it): :class:`_BareNames` maps the one to the
other, so an import or a command line that names a module alone finds the same module object.
``python -m utils`` prints the device report. Modules import torch lazily where they can, so the
pure maths works without it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import pkgutil
import sys
from pathlib import Path

__version__ = "0.1.0"


def _homes() -> dict[str, str]:
    """Each module of a subpackage -> that subpackage, read from the folders themselves, so a module
    added to a subpackage gets its bare name with it. A name that is also a top-level module or
    subpackage keeps its own meaning (tests/utils/test_bare_names.py checks no two modules share one)."""
    here = Path(__file__).parent
    top = {m.name for m in pkgutil.iter_modules([str(here)])}  # utils.plots, utils.kv: never renamed
    homes: dict[str, str] = {}
    for pkg in sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.ispkg):
        for mod in pkgutil.iter_modules([str(here / pkg)]):
            if mod.name not in top:
                homes.setdefault(mod.name, pkg)
    return homes


HOME = _homes()  # module -> the subpackage that holds it


class _BareNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``utils.<module>[.rest]`` -> ``utils.<subpackage>.<module>[.rest]``, the same module object.

    Written by hand: importlib has no alias mechanism. The loader hands back the real module
    (imported under its own name) and runs nothing itself; :meth:`get_code` serves ``runpy``, which
    runs a module given with ``-m`` from its code object."""

    @staticmethod
    def real_name(fullname: str) -> str | None:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in HOME:
            return None
        return ".".join([parts[0], HOME[parts[1]], *parts[1:]])

    def find_spec(self, fullname, path=None, target=None):
        real = self.real_name(fullname)
        spec = importlib.util.find_spec(real) if real else None
        if spec is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=spec.origin,
                                               is_package=spec.submodule_search_locations is not None)

    def create_module(self, spec):
        return importlib.import_module(self.real_name(spec.name))

    def exec_module(self, module):
        """Nothing to run: :meth:`create_module` returned the module, already imported."""

    def get_code(self, fullname):
        real = self.real_name(fullname)
        return importlib.util.find_spec(real).loader.get_code(real)


if not any(isinstance(f, _BareNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _BareNames())
