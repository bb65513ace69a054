"""The measurement record: round trip, validation, the utils hash."""
import json
import math

import pytest

from utils.measure import record


def test_round_trip(tmp_path):
    rec = record.Record.new()
    rec.add("matmul_tflops", 12.5, "TFLOP/s", method="utils.measure.timing.benchmark", spread=0.01, n=256)
    path = rec.save(tmp_path / "rec.json")
    back = record.Record.load(path)
    assert back.value("matmul_tflops") == 12.5
    assert back.measurements["matmul_tflops"].extra == {"n": 256}
    assert back.utils_sha256 == record.utils_hash() and len(back.utils_sha256) == 64
    assert back.fingerprint["kind"] in ("cpu", "gpu")


@pytest.mark.parametrize("bad", [math.nan, math.inf, "12", None, True])
def test_only_finite_numbers_are_recorded(bad):
    with pytest.raises(ValueError, match="finite number"):
        record.Record().add("x", bad, "s")


def test_missing_measurement_names_what_is_there():
    rec = record.Record()
    rec.add("a", 1, "s")
    with pytest.raises(KeyError, match="has: a"):
        rec.value("b")


def test_bad_files_give_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no measurement record"):
        record.Record.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        record.Record.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="not a measurement record"):
        record.Record.load(tmp_path / "other.json")
    (tmp_path / "m.json").write_text(json.dumps({"schema": record.SCHEMA, "measurements": {"a": {"value": 1}}}))
    with pytest.raises(ValueError, match="malformed"):
        record.Record.load(tmp_path / "m.json")


def test_utils_hash_changes_with_the_source(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "a.py").write_text("x = 1\n")
    h1 = record.utils_hash(tmp_path)
    (tmp_path / "utils" / "a.py").write_text("x = 2\n")
    assert record.utils_hash(tmp_path) != h1
    (tmp_path / "utils" / "a.py").write_text("x = 1\r\n")  # line endings do not matter
    assert record.utils_hash(tmp_path) == h1
