"""utils.units: rates from bytes or FLOPs over milliseconds, and GiB (the grader counts with these)."""
import pytest

from utils import units


def test_rates_and_transfer_time():
    assert units.gb_per_s(4.8e9, 1000.0) == pytest.approx(4.8)
    assert units.tflop_per_s(2 * 8192**3, 1.5605) == pytest.approx(704.6, rel=1e-4)  # benchmarks/RESULTS.md's matmul
    assert units.transfer_ms(4.8e9, 4800.0) == pytest.approx(1.0)
    for nbytes, gbs in ((1e6, 20.0), (2.2e9, 4800.0), (123_456_789, 3350.0)):
        assert units.gb_per_s(nbytes, units.transfer_ms(nbytes, gbs)) == pytest.approx(gbs, rel=1e-12)
    assert units.GIB == 1024**3 and units.GB == 1e9 and units.TFLOP == 1e12


def test_gib_print_range():
    lo, hi = units.gib_print_range(3.81)
    assert f"{(lo + 1) / units.GIB:.2f}" == "3.81" and f"{(hi - 1) / units.GIB:.2f}" == "3.81"
    assert f"{(lo - units.GIB // 1000) / units.GIB:.2f}" == "3.80"
    lo1, hi1 = units.gib_print_range(3.8, decimals=1)
    assert hi1 - lo1 == pytest.approx(0.1 * units.GIB, abs=2)
