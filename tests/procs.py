"""Helpers for tests that start processes: a free local port, the ``accelerate launch``
command, and a benchmark script loaded as a module (so its functions can be called directly)."""
from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

# the code behind the `accelerate launch` command, found through this interpreter (no PATH lookup)
ACCELERATE_LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_script(path: Path, name: str | None = None):
    """The script at ``path`` imported as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(name or Path(path).stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
