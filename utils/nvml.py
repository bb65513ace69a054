"""The one wrapper around NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call in this project goes through :func:`query`. A failing call returns a
sentinel (:data:`NA`) instead of raising, so a monitor can never crash the loop it
watches, and tests fake NVML in exactly one place (:func:`set_library`). The pattern is
nvitop's ``nvmlQuery(func, *args, default=NA)``.

NVML facts used here (NVIDIA NVML API reference; REFERENCE.md, "What utilization means"):
``nvmlDeviceGetUtilizationRates().gpu`` is the percent of the last sample period (1/6 s
to 1 s by product) in which at least one kernel ran; it is not efficiency. Power is in
mW, energy (``nvmlDeviceGetTotalEnergyConsumption``, Volta and newer) in mJ, memory in
bytes, clocks in MHz.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable


class _NotAvailable:
    """Falsy sentinel for a value NVML could not give (``N/A`` in nvidia-smi)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"

    def __reduce__(self):
        return (_NotAvailable, ())


NA: Any = _NotAvailable()


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str  # why not, in one line; "" when available
    driver: str = ""


_lock = threading.Lock()
_lib: Any = None
_status: NvmlStatus | None = None


def set_library(lib: Any | None) -> None:
    """Use ``lib`` as the NVML module (a fake in tests); ``None`` forgets it so the next
    call loads the real ``pynvml`` again."""
    global _lib, _status
    with _lock:
        _lib, _status = lib, None


def _load() -> tuple[Any, NvmlStatus]:
    global _lib, _status
    with _lock:
        if _status is not None:
            return _lib, _status
        lib = _lib
        if lib is None:
            try:
                import pynvml as lib  # nvidia-ml-py
            except ImportError:
                _status = NvmlStatus(False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
                return None, _status
        try:
            lib.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            _lib, _status = lib, NvmlStatus(False, f"NVML did not initialise: {_short(exc)} (no NVIDIA driver here?)")
            return lib, _status
        driver = _call(lib, "nvmlSystemGetDriverVersion", (), "")
        _lib, _status = lib, NvmlStatus(True, "", _text(driver))
        return lib, _status


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _call(lib: Any, name: str, args: tuple, default: Any) -> Any:
    try:
        return _text(getattr(lib, name)(*args))
    except Exception:
        return default


def status() -> NvmlStatus:
    """Whether NVML answers here, and why not (one line) when it does not."""
    return _load()[1]


def query(name: str | Callable, *args: Any, default: Any = NA) -> Any:
    """Call ``pynvml.<name>(*args)``; on any failure return ``default``.

    ``name`` may also be a callable taking the library as its only argument, for a
    query that reads several fields (``lambda lib: lib.NVML_TEMPERATURE_GPU``)."""
    lib, st = _load()
    if not st.available:
        return default
    if callable(name):
        try:
            return name(lib)
        except Exception:
            return default
    return _call(lib, name, args, default)


def constant(name: str, default: Any = NA) -> Any:
    """A constant of the NVML module (``NVML_TEMPERATURE_GPU``), or ``default``."""
    lib, st = _load()
    return getattr(lib, name, default) if st.available else default


def device_count() -> int:
    count = query("nvmlDeviceGetCount", default=0)
    return count if isinstance(count, int) else 0


def handle(index: int) -> Any:
    """The NVML handle of device ``index`` (NVML's own order, not CUDA_VISIBLE_DEVICES')."""
    return query("nvmlDeviceGetHandleByIndex", index)
