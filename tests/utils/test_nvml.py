"""utils/device/nvml.py, the NVML seam, against a fake NVML (tests/fakes.py) and nvidia-ml-py's own
error codes: device visibility, error names, init failures, throttle-reason bits."""
from __future__ import annotations

import pynvml
import pytest

from tests.fakes import FakeGpu, FakeNvml, installed
from utils.device import nvml

# -- device selection ---------------------------------------------------------------------

@pytest.mark.parametrize("env, expected", [
    (None, [0, 1, 2]),
    ("2,0", [2, 0]),
    ("1,7,0", [1]),  # CUDA stops at the first device that does not exist
    ("GPU-bbbb", [1]),  # a UUID prefix
    ("MIG-xyz,2", [2]),
])
def test_visible_indices(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    gpus = [FakeGpu(uuid="GPU-aaaa-1"), FakeGpu(uuid="GPU-bbbb-2"), FakeGpu(uuid="GPU-cccc-3")]
    with installed(FakeNvml(gpus)):
        assert nvml.visible_indices() == expected


def test_used_gib_reads_the_visible_gpu(monkeypatch):
    gpus = [FakeGpu(mem_used_bytes=10 * 2**30), FakeGpu(mem_used_bytes=3 * 2**30)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with installed(FakeNvml(gpus)):
        assert nvml.used_gib(0) == 3.0  # CUDA's device 0 is NVML's GPU 1 here
        assert nvml.used_gib(1) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with installed(FakeNvml(gpus)):
        assert nvml.used_gib(0) == 10.0
    with installed(FakeNvml(init_error="Driver Not Loaded")):
        assert nvml.used_gib(0) is None


# -- NVML's real error codes (nvidia-ml-py's own exception classes) -------------------------

class RealErrorsNvml(FakeNvml):
    """FakeNvml whose failures are pynvml's: power NOT_SUPPORTED (some GeForce cards), and
    GPU ``lost`` answering NVML_ERROR_GPU_IS_LOST once it has given ``lost_after`` samples."""

    def __init__(self, gpus, *, lost: int | None = None, lost_after: int = 2, init_code: int | None = None):
        super().__init__(gpus)
        self.lost, self.lost_after, self.init_code = lost, lost_after, init_code

    def nvmlInit(self):
        self.inits += 1
        if self.init_code is not None:
            raise pynvml.NVMLError(self.init_code)

    def _dev(self, handle):
        if handle.index == self.lost and self.gpus[handle.index].samples > self.lost_after:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super()._dev(handle)

    def nvmlDeviceGetPowerUsage(self, h):
        self._dev(h)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_error_name_and_last_error():
    assert nvml.error_name(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "NVML_ERROR_GPU_IS_LOST"
    assert nvml.error_name(pynvml.NVMLError_NotSupported()) == "NVML_ERROR_NOT_SUPPORTED"
    assert nvml.error_name(ValueError("x")) == "ValueError"
    with installed(RealErrorsNvml([FakeGpu()])):
        h = nvml.handle(0)
        assert nvml.query("nvmlDeviceGetPowerUsage", h) is nvml.NA
        assert nvml.last_error() == "NVML_ERROR_NOT_SUPPORTED"
        assert nvml.query("nvmlDeviceGetTemperature", h, 0) == 61 and nvml.last_error() == ""


def test_a_module_that_is_not_nvidia_ml_py_is_named():
    from types import SimpleNamespace

    with installed(SimpleNamespace(__name__="pynvml")):  # an old package shadowing pynvml, no nvmlInit
        st = nvml.status()
    assert not st.available and st.error == "AttributeError" and "nvidia-ml-py" in st.reason


def test_the_deprecated_pynvml_package_warns_nothing(monkeypatch, tmp_path, capfd):
    # pynvml >= 12 (a shim over nvidia-ml-py) warns FutureWarning on import; on stderr that
    # costs a graded nbgrader cell its points
    import importlib
    import sys
    import warnings

    (tmp_path / "pynvml.py").write_text(
        "import warnings\n"
        "warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py instead.', FutureWarning)\n"
        "class NVMLError(Exception):\n    pass\n"
        "def nvmlInit():\n    raise NVMLError('Driver Not Loaded')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    importlib.invalidate_caches()
    nvml.set_library(None)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            st = nvml.status()
        assert sys.modules["pynvml"].__file__ == str(tmp_path / "pynvml.py")  # the shim was the one imported
    finally:
        monkeypatch.undo()
        nvml.set_library(None)
    assert not st.available and "Driver Not Loaded" in st.reason
    assert [w for w in caught if issubclass(w.category, FutureWarning)] == []
    assert capfd.readouterr().err == ""




def test_throttle_reason_bits():
    assert nvml.throttle_reasons(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert nvml.throttle_reasons(0) == []
    assert nvml.throttle_reasons(nvml.NA) == []


def test_process_used_gib_counts_only_the_given_processes_on_every_gpu():
    gpus = [FakeGpu(processes={101: 60 * 2**30, 999: 63 * 2**30}), FakeGpu(processes={102: 2**30})]
    with installed(FakeNvml(gpus)):
        assert nvml.process_used_gib([101, 102]) == 61.0  # the engine's two processes, not pid 999
        assert nvml.process_used_gib([5]) is None  # NVML lists none of them (a container's host pids)
    with installed(FakeNvml([FakeGpu()])):
        assert nvml.process_used_gib([101]) is None  # NVML lists no process at all
    with installed(FakeNvml(init_error="Driver Not Loaded")):
        assert nvml.process_used_gib([101]) is None


def test_held_memory_prefers_the_engines_own_processes_over_a_difference():
    """A neighbour that frees 63 GiB while the engine takes 60 leaves the difference at -3: the
    per-process reading is 60. Without a per-process list the difference is the answer, named so."""
    from types import SimpleNamespace

    from utils.serving import inference

    server = SimpleNamespace(device="cuda", process_ids=lambda: [101, 102])
    gpus = [FakeGpu(mem_used_bytes=60 * 2**30, processes={101: 60 * 2**30, 999: 0})]
    with installed(FakeNvml(gpus)):
        gib, how = inference.held_memory_gib(server, used_before_gib=63.0)
        assert (gib, how) == (60.0, "GPU memory NVML accounts to the engine's processes")
    with installed(FakeNvml([FakeGpu(mem_used_bytes=70 * 2**30)])):
        gib, how = inference.held_memory_gib(server, used_before_gib=10.0)
        assert gib == 60.0 and how.startswith("GPU memory in use (NVML), minus")
