"""``GpuMonitor``: a background sampler of every visible GPU while a block of code runs.

Every NVML call goes through :func:`utils.device.nvml.query` (``utils/device/nvml.py``), so a failing call
leaves a gap in one field of one sample instead of an exception in the watched loop; what
the numbers mean (utilization is "a kernel ran", not efficiency; units) is in that
module's docstring and docs/reference.md, "What utilization means". Without NVML the
monitor samples the CPU with psutil.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from utils.device.nvml import (
    NA,
    THROTTLE_CALLS,
    constant,
    handle,
    last_error,
    query,
    short_error,
    status,
    throttle_reasons,
    visible_indices,
)
from utils.units import GIB

# Numeric fields of one sample, by source. Units are in the names; energy_total_j is the
# driver's cumulative counter (J since the driver loaded), not the energy of the window.
GPU_FIELDS = ("util_gpu_pct", "util_mem_pct", "mem_used_gib", "mem_total_gib", "power_w",
              "energy_total_j", "temp_c", "sm_clock_mhz", "mem_clock_mhz")
CPU_FIELDS = ("util_cpu_pct", "rss_gib", "mem_used_gib", "mem_total_gib")
_GPU_MEAN_MAX = ("util_gpu_pct", "util_mem_pct", "mem_used_gib", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz")
_CPU_MEAN_MAX = ("util_cpu_pct", "rss_gib", "mem_used_gib")


@dataclass
class _Device:
    label: str  # "gpu0" (NVML index) or "cpu"
    index: int
    handle: Any
    name: str
    throttle_call: str | None = None  # whichever of THROTTLE_CALLS answered first


def _num(value: Any, scale: float = 1.0) -> float | None:
    if value is NA or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) * scale


def _field(obj: Any, name: str, scale: float = 1.0) -> float | None:
    return None if obj is NA else _num(getattr(obj, name, None), scale)


class GpuMonitor:
    """Sample every visible GPU in a background thread while a block of code runs.

    >>> with GpuMonitor(interval_s=0.1) as mon:   # doctest: +SKIP
    ...     train(steps=100)
    ...     mon.mark("eval")
    >>> mon.summary()["gpu0"]["util_gpu_pct"]["mean"]   # doctest: +SKIP

    Per sample and GPU: utilization (``util_gpu_pct``, ``util_mem_pct``), memory
    (``mem_used_gib``, ``mem_total_gib``), ``power_w``, the energy counter
    (``energy_total_j``), ``temp_c``, ``sm_clock_mhz``, ``mem_clock_mhz`` and the names of
    the active throttle (clocks-event) reasons. What the numbers mean: ``utils/device/nvml.py``'s
    docstring and docs/reference.md, "What utilization means". NVML refreshes its counters every 1/6 s to
    1 s (power about 10 Hz), so the default 0.1 s interval is as fast as is useful.

    Without NVML (no driver, no ``nvidia-ml-py``, no GPU) the monitor samples the CPU
    instead (``util_cpu_pct``, process ``rss_gib``, system ``mem_used_gib``) under the label
    ``"cpu"``; :attr:`source` is then ``"cpu"`` and :attr:`reason` says why. It prints
    nothing: a warning on stderr costs a graded nbgrader cell its points.

    It never raises into the code it watches. A failed query leaves ``None`` in that field
    of that sample and the other fields are still read; a sample missing a metric that
    answered elsewhere in the run (an NVML error mid-run, a GPU that fell off the bus)
    counts as a gap in :meth:`summary`. Why a field is missing is kept by NVML call
    (:attr:`nvml_errors`, ``summary()[label]["nvml_errors"]``, the end of :meth:`report`'s
    line): ``NVML_ERROR_NOT_SUPPORTED`` is the board, ``NVML_ERROR_GPU_IS_LOST`` is a GPU
    that fell off the bus. The thread is a daemon and stops on exit even when the block
    raised; the block's exception propagates unchanged. A sampler stuck in an NVML call
    (a hung driver) is abandoned after ``max(1 s, 2 x interval_s)`` and the exit sample is
    skipped, since it would hang the caller on the same driver. A sample is taken on entry
    and on exit, so even a block shorter than the interval gets two, and with ``sync=True``
    the GPU is synchronised first (if torch already initialised CUDA) so the window's energy
    covers the work the block queued, as Zeus does.

    Cost: one tick makes 8 NVML calls per GPU; a utilization + memory + power query took
    10 us on an H200 (docs/reference.md), and ctypes releases the GIL inside the calls, so the
    training thread keeps running while the sampler waits on the driver.
    ``benchmarks/monitor_overhead.py`` measures the slowdown of a real training step;
    :attr:`overhead` reports the sampler's own wall time per tick.
    """

    def __init__(self, interval_s: float = 0.1, devices: Sequence[int] | None = None, *,
                 source: str = "auto", sync: bool = True):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s must be a positive number of seconds (0.1 is NVML's useful limit), got {interval_s!r}")
        if source not in ("auto", "nvml", "cpu"):
            raise ValueError(f"source must be 'auto', 'nvml' or 'cpu', got {source!r}")
        if devices is not None and (isinstance(devices, (str, bytes)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in devices)):
            raise ValueError(f"devices must be a list of NVML indices (non-negative ints), got {devices!r}")
        self.interval_s = float(interval_s)
        self.sync = sync
        self._requested = list(devices) if devices is not None else None
        self._want = source
        self.source = "cpu"
        self.reason = ""
        self.marks: list[tuple[float, str]] = []
        self.errors = 0  # exceptions caught inside the sampler (each became a gap)
        self.last_error = ""
        # device label -> {NVML call: NVML error name of its latest failure} (error_name)
        self.nvml_errors: dict[str, dict[str, str]] = {}
        self._devices: list[_Device] = []
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t_end: float | None = None
        self._ticks = 0
        self._tick_s = 0.0
        self._proc: Any = None
        self._psutil: Any = None
        self._setup_errors: list[tuple[_Device, dict[str, str]]] = []
        self.start_unix: float | None = None

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc: Any) -> bool:
        self.stop()
        return False  # never swallow the block's exception

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> GpuMonitor:
        """Start sampling (what ``with`` does). Starting a running monitor does nothing;
        starting a stopped one begins a fresh timeline."""
        if self._thread is not None:
            return self
        try:
            self._setup()
            self._sync_device()
        except Exception as exc:  # a broken environment must not stop the block from running
            self._note(exc)
        self._rows, self.marks, self._ticks, self._tick_s, self._t_end = [], [], 0, 0.0, None
        self._stop.clear()
        self.nvml_errors = {dev.label: dict(errs) for dev, errs in self._setup_errors}
        self.start_unix = time.time()
        self._t0 = time.perf_counter()
        self._tick()
        thread = threading.Thread(target=self._run, name="GpuMonitor", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": keep the entry and exit samples
            self._note(exc)
        self._thread = thread
        return self

    def stop(self) -> GpuMonitor:
        """Stop sampling and take a final sample. Safe to call twice; never raises."""
        thread = self._thread
        if thread is None:
            return self
        try:
            self._stop.set()
            self._sync_device()
            # A sampler stuck in a hung NVML call is abandoned (daemon), never waited on forever,
            # and the exit sample is skipped: it would block this thread on the same driver.
            if thread.is_alive():
                thread.join(timeout=max(1.0, 2 * self.interval_s))
            if thread.is_alive():
                self._note(TimeoutError("the sampler is stuck in an NVML call (a hung driver?); "
                                        "the exit sample was skipped"))
            else:
                self._tick()
        except Exception as exc:
            self._note(exc)
        self._t_end = time.perf_counter()
        self._thread = None
        return self

    def mark(self, label: str) -> None:
        """Put a named event ("epoch 2", "eval") on the timeline at the current time."""
        self.marks.append((round(time.perf_counter() - self._t0, 6), str(label)))

    def sample(self) -> None:
        """Take one sample now, in the calling thread (the background thread keeps going).
        Useful to pin a sample to an exact point, and in tests."""
        if self._thread is not None:
            self._tick()

    # -- sampling --------------------------------------------------------------------
    def _setup(self) -> None:
        self._devices = []
        self._setup_errors = []
        st = status()
        if self._want != "cpu" and st.available:
            indices = self._requested if self._requested is not None else visible_indices()
            if indices:
                self.source, self.reason = "nvml", ""
                for i in indices:
                    h = handle(i)
                    errs = {} if h is not NA else {"nvmlDeviceGetHandleByIndex": last_error()}
                    name = query("nvmlDeviceGetName", h) if h is not NA else NA
                    dev = _Device(f"gpu{i}", i, h, name if isinstance(name, str) else "unknown")
                    self._devices.append(dev)
                    self._setup_errors.append((dev, errs))
                return
            reason = "NVML sees no GPU visible to this process (check CUDA_VISIBLE_DEVICES)"
        elif self._want == "cpu":
            reason = "CPU sampling was requested (source='cpu')"
        else:
            reason = st.reason
        self.source, self.reason = "cpu", reason
        self._devices = [_Device("cpu", 0, None, "cpu")]
        try:
            import psutil

            self._psutil, self._proc = psutil, psutil.Process()
            psutil.cpu_percent(None)  # the first call only sets psutil's reference point
        except Exception as exc:
            self._psutil = self._proc = None
            self.reason += f"; psutil unavailable ({type(exc).__name__}), CPU samples are empty"

    def _run(self) -> None:
        due = self._t0 + self.interval_s
        while not self._stop.wait(max(0.0, due - time.perf_counter())):
            self._tick()
            due += self.interval_s
            now = time.perf_counter()
            if due < now:  # fell behind (a slow call): skip the missed slots, never burst
                due = now + self.interval_s

    def _tick(self) -> None:
        start = time.perf_counter()
        t_s = round(start - self._t0, 6)
        rows = []
        for dev in self._devices:
            try:
                row = self._read_cpu(dev) if dev.label == "cpu" else self._read_gpu(dev)
            except Exception as exc:  # a bug or a surprise from the library: a gap, not a crash
                self._note(exc)
                fields = CPU_FIELDS if dev.label == "cpu" else GPU_FIELDS + ("throttle_reasons",)
                row = dict.fromkeys(fields)
            rows.append({"t_s": t_s, "device": dev.label, **row})
        with self._lock:
            self._rows.extend(rows)
            self._ticks += 1
            self._tick_s += time.perf_counter() - start

    def _read_gpu(self, dev: _Device) -> dict:
        h = dev.handle
        if h is NA:  # no handle at start (why: in nvml_errors); querying NA would only fail again
            return dict.fromkeys(GPU_FIELDS + ("throttle_reasons",))
        failed: dict[str, str] = {}

        def q(call: str, *args: Any) -> Any:
            value = query(call, h, *args)
            if value is NA:
                failed[call] = last_error()
            return value

        util = q("nvmlDeviceGetUtilizationRates")
        mem = q("nvmlDeviceGetMemoryInfo")
        row = {
            "util_gpu_pct": _field(util, "gpu"),
            "util_mem_pct": _field(util, "memory"),
            "mem_used_gib": _field(mem, "used", 1 / GIB),
            "mem_total_gib": _field(mem, "total", 1 / GIB),
            "power_w": _num(q("nvmlDeviceGetPowerUsage"), 1e-3),  # mW
            "energy_total_j": _num(q("nvmlDeviceGetTotalEnergyConsumption"), 1e-3),  # mJ
            "temp_c": _num(q("nvmlDeviceGetTemperature", constant("NVML_TEMPERATURE_GPU", 0))),
            "sm_clock_mhz": _num(q("nvmlDeviceGetClockInfo", constant("NVML_CLOCK_SM", 1))),
            "mem_clock_mhz": _num(q("nvmlDeviceGetClockInfo", constant("NVML_CLOCK_MEM", 2))),
        }
        mask: Any = NA
        for call in ((dev.throttle_call,) if dev.throttle_call else THROTTLE_CALLS):
            mask = query(call, h)
            if isinstance(mask, int):
                dev.throttle_call = call
                break
        if not isinstance(mask, int):  # the older name answering is no failure; both failing is
            failed[call] = last_error()
        row["throttle_reasons"] = throttle_reasons(mask) if isinstance(mask, int) else None
        if failed:
            with self._lock:
                self.nvml_errors.setdefault(dev.label, {}).update(failed)
        return row

    def _read_cpu(self, dev: _Device) -> dict:
        ps, proc = self._psutil, self._proc
        if ps is None:
            return dict.fromkeys(CPU_FIELDS)
        vm = ps.virtual_memory()
        return {
            "util_cpu_pct": float(ps.cpu_percent(None)),
            "rss_gib": proc.memory_info().rss / GIB,
            "mem_used_gib": vm.used / GIB,
            "mem_total_gib": vm.total / GIB,
        }

    def _sync_device(self) -> None:
        """Wait for queued GPU work, only if torch is loaded and CUDA already initialised
        (the monitor never creates a CUDA context of its own)."""
        torch = sys.modules.get("torch")
        if not self.sync or self.source != "nvml" or torch is None:
            return
        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception as exc:  # a sticky CUDA error from the block: not ours to raise
            self._note(exc)

    def _note(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = short_error(exc)

    # -- results ---------------------------------------------------------------------
    @property
    def samples(self) -> list[dict]:
        """All samples so far, one dict per device per tick (a copy)."""
        with self._lock:
            return [dict(r) for r in self._rows]

    def columns(self, device: str | None = None) -> dict[str, list]:
        """The samples as columns (``{"t_s": [...], "power_w": [...], ...}``), optionally
        for one device label; a missing value is NaN in a numeric column."""
        rows = [r for r in self.samples if device is None or r["device"] == device]
        keys = list(dict.fromkeys(k for r in rows for k in r))
        cols: dict[str, list] = {}
        for k in keys:
            values = [r.get(k) for r in rows]
            numeric = k in GPU_FIELDS or k in CPU_FIELDS or k == "t_s"
            cols[k] = [math.nan if (numeric and v is None) else v for v in values]
        return cols

    @property
    def devices(self) -> list[str]:
        return [d.label for d in self._devices]

    @property
    def duration_s(self) -> float:
        if not self._rows and self._thread is None:
            return 0.0
        end = self._t_end if self._t_end is not None else time.perf_counter()
        return end - self._t0

    @property
    def overhead(self) -> dict:
        """The sampler's own cost: ticks taken and mean wall time per tick (ms)."""
        with self._lock:
            ticks, busy = self._ticks, self._tick_s
        return {"ticks": ticks, "tick_ms_mean": busy / ticks * 1e3 if ticks else None,
                "busy_pct": 100 * busy / self.duration_s if self.duration_s > 0 else None}

    def summary(self) -> dict[str, dict]:
        """Per device label (``"gpu0"``, ..., or ``"cpu"``): ``{"mean", "max"}`` of each
        metric, ``mem_total_gib``, ``energy_j`` over the window with ``energy_method``,
        ``throttle_reasons_pct`` (percent of good samples with each reason active),
        ``duration_s``, ``samples`` and ``gaps``.

        Energy is the counter's last minus first reading (``nvmlDeviceGetTotalEnergyConsumption``,
        Volta and newer); where the counter never answered (Pascal and older) it is the
        trapezoid integral of ``power_w`` over time, and ``energy_method`` says which."""
        rows = self.samples
        with self._lock:
            nvml_errors = {label: dict(errs) for label, errs in self.nvml_errors.items()}
        out: dict[str, dict] = {}
        for dev in self._devices:
            drows = [r for r in rows if r["device"] == dev.label]
            cpu = dev.label == "cpu"
            fields = CPU_FIELDS if cpu else GPU_FIELDS + ("throttle_reasons",)
            s: dict[str, Any] = {"source": self.source, "name": dev.name,
                                 "duration_s": self.duration_s, "samples": len(drows), "gaps": _gaps(drows, fields)}
            for k in _CPU_MEAN_MAX if cpu else _GPU_MEAN_MAX:
                vals = [r[k] for r in drows if r.get(k) is not None]
                s[k] = {"mean": sum(vals) / len(vals), "max": max(vals)} if vals else {"mean": None, "max": None}
            totals = [r["mem_total_gib"] for r in drows if r.get("mem_total_gib") is not None]
            s["mem_total_gib"] = max(totals) if totals else None
            if not cpu:
                s["energy_j"], s["energy_method"] = _energy(drows)
                good = [r["throttle_reasons"] for r in drows if r.get("throttle_reasons") is not None]
                names = sorted({n for reasons in good for n in reasons})
                s["throttle_reasons_pct"] = {n: 100 * sum(n in g for g in good) / len(good) for n in names}
                s["nvml_errors"] = nvml_errors.get(dev.label, {})
            out[dev.label] = s
        return out

    def report(self) -> str:
        """The summary in a few lines of plain text, one per device."""
        lines = [] if self.source == "nvml" else [f"CPU sampling: {self.reason}"]
        for label, s in self.summary().items():
            def f(key: str, stat: str = "mean", fmt: str = ".0f", s: dict = s) -> str:
                v = s[key][stat]
                return "n/a" if v is None else format(v, fmt)

            if label == "cpu":
                body = f"util {f('util_cpu_pct')}% mean, rss {f('rss_gib', 'max', '.2f')} GiB max"
            else:
                energy = "n/a" if s["energy_j"] is None else f"{s['energy_j']:.0f} J"
                body = (f"{s['name']}: util {f('util_gpu_pct')}% mean ({f('util_gpu_pct', 'max')} max), "
                        f"memory {f('mem_used_gib', 'max', '.1f')} GiB max, power {f('power_w')} W mean, energy {energy}")
            errs = s.get("nvml_errors") or {}
            why = "; NVML errors: " + ", ".join(f"{c} {e}" for c, e in sorted(errs.items())) if errs else ""
            lines.append(f"{label} {body}; {s['duration_s']:.1f} s, {s['samples']} samples, {s['gaps']} gaps{why}")
        return "\n".join(lines)

    def plot(self, **kwargs: Any):
        """The utilization timeline of this run (:func:`utils.plots.utilization_timeline`)."""
        from utils import plots

        kwargs.setdefault("marks", self.marks)
        return plots.utilization_timeline(self.samples, **kwargs)

    def __repr__(self) -> str:
        state = "running" if self._thread is not None else "stopped"
        why = f", reason={self.reason!r}" if self.reason else ""
        return (f"GpuMonitor(source={self.source!r}, devices={self.devices}, interval_s={self.interval_s}, "
                f"samples={len(self._rows)}, {state}{why})")


def _gaps(rows: list[dict], fields: Sequence[str]) -> int:
    """Samples with every field missing, or missing a field that answered in another sample
    of the run (a metric the device never supports is not a gap)."""
    supported = [k for k in fields if any(r.get(k) is not None for r in rows)]
    return sum(1 for r in rows
               if all(r.get(k) is None for k in fields) or any(r.get(k) is None for k in supported))


def _energy(rows: list[dict]) -> tuple[float | None, str | None]:
    counter = [r["energy_total_j"] for r in rows if r.get("energy_total_j") is not None]
    if len(counter) >= 2 and counter[-1] >= counter[0]:
        return counter[-1] - counter[0], "counter"
    pts = [(r["t_s"], r["power_w"]) for r in rows if r.get("power_w") is not None]
    if len(pts) >= 2:
        return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:], strict=False)), "power_integral"
    return None, None
