"""Spec table, name matching, fingerprint (NVML faked at the one wrapper)."""
import types

import pytest

from utils.device import hardware, nvml


@pytest.mark.parametrize(
    "device_name, row",
    [
        ("Tesla T4", "T4"),
        ("Tesla P100-PCIE-16GB", "P100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H200", "H200"),
    ],
)
def test_names_as_cuda_reports_them_match_their_row(device_name, row):
    assert hardware.spec_for_name(device_name).name == row


def test_unknown_and_lookalike_names_do_not_match():
    assert hardware.spec_for_name("NVIDIA GeForce RTX 4090") is None
    # "A10" must not swallow A100s, "L4" must not swallow L40S
    assert hardware.spec_for_name("NVIDIA A100-SXM4-40GB").name != "A10"
    assert hardware.spec_for_name("NVIDIA L40S").name != "L4"


def test_every_row_has_a_source_and_consistent_peaks():
    for spec in hardware.SPECS.values():
        assert "datasheet" in spec.source
        assert spec.bandwidth_gbs > 0 and spec.memory_gb > 0
        assert spec.fp32_tflops > 0 and spec.fp16_tflops >= spec.fp32_tflops
        if spec.bf16_tflops is not None:
            assert spec.tf32_tflops == pytest.approx(spec.bf16_tflops / 2, rel=0.02)  # datasheets round: L4 60 vs 121, L40S 183 vs 362


def test_ridge_points_match_reference():
    # docs/reference.md: ridge = peak / bandwidth; H200 about 206, H100 about 295, T4 (fp16) about 203
    assert hardware.SPECS["H200"].ridge_flop_per_byte("bf16") == pytest.approx(206, abs=0.5)
    assert hardware.SPECS["H100-SXM"].ridge_flop_per_byte("bf16") == pytest.approx(295, abs=0.5)
    assert hardware.SPECS["T4"].ridge_flop_per_byte("fp16") == pytest.approx(203, abs=0.5)
    assert hardware.SPECS["T4"].ridge_flop_per_byte("bf16") is None  # T4 has no bf16


def test_peak_tflops_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        hardware.SPECS["H200"].peak_tflops("int3")
    assert hardware.SPECS["H200"].peak_tflops("bfloat16") == 989.0


def test_cpu_machine_gets_cpu_row_and_cpu_fingerprint():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CPU-only test")
    assert hardware.current_spec() is hardware.CPU_SPEC
    fp = hardware.fingerprint()
    assert fp["kind"] == "cpu" and fp["torch"] == torch.__version__ and fp["name"]


class _Err(Exception):
    pass


def _fake_nvml(fail=()):
    def make(name, value):
        def fn(*args):
            if name in fail:
                raise _Err(name)
            return value
        return fn

    lib = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2)
    values = {
        "nvmlInit": None,
        "nvmlSystemGetDriverVersion": b"580.159.04",
        "nvmlDeviceGetUUID": "GPU-1234",
        "nvmlDeviceGetClockInfo": 1980,
        "nvmlDeviceGetMaxClockInfo": 1980,
        "nvmlDeviceGetEnforcedPowerLimit": 700000,
        "nvmlDeviceGetMigMode": [0, 0],
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4,
    }
    for k, v in values.items():
        setattr(lib, k, make(k, v))
    return lib


def test_nvml_fingerprint_reads_through_the_wrapper():
    nvml.set_library(_fake_nvml())
    try:
        assert nvml.status().available and nvml.status().driver == "580.159.04"
        fp = hardware.nvml_fingerprint(object())
    finally:
        nvml.set_library(None)
    assert fp["power_limit_w"] == 700.0
    assert fp["throttle_reasons"] == ["sw_power_cap"]
    assert fp["mig_mode"] == 0 and fp["uuid"] == "GPU-1234" and fp["sm_clock_mhz"] == 1980


def test_nvml_failures_become_none_not_exceptions():
    nvml.set_library(_fake_nvml(fail={"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetMigMode", "nvmlDeviceGetUUID"}))
    try:
        fp = hardware.nvml_fingerprint(object())
    finally:
        nvml.set_library(None)
    assert fp["power_limit_w"] is None and fp["mig_mode"] is None and fp["uuid"] is None
    assert fp["sm_clock_mhz"] == 1980
