"""The shared argument checks."""
import math

import pytest

from utils import validate


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "3", None, True])
def test_positive_rejects(bad):
    with pytest.raises(ValueError, match="x must be a positive number"):
        validate.positive("x", bad)


@pytest.mark.parametrize("bad", [-1e-9, math.nan, -math.inf, "0", False])
def test_non_negative_rejects(bad):
    with pytest.raises(ValueError, match="y must be a non-negative number"):
        validate.non_negative("y", bad)


def test_accepts_and_returns_float():
    assert validate.positive("x", 3) == 3.0 and isinstance(validate.positive("x", 3), float)
    assert validate.non_negative("y", 0) == 0.0


def test_numpy_scalars_are_numbers():
    np = pytest.importorskip("numpy")
    assert validate.positive("x", np.int64(3)) == 3.0 and validate.non_negative("y", np.float32(0.5)) == 0.5


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError, match="n must be a positive integer"):
        validate.positive_int("n", bad)


def test_positive_int_and_many_at_once():
    assert validate.positive_int("n", 7) == 7
    validate.positives(a=1, b=2.5)
    validate.non_negatives(a=0, b=3)
    with pytest.raises(ValueError, match="b must be a non-negative number, got -3"):
        validate.non_negatives(a=0, b=-3)


def test_own_error_class():
    class MyError(ValueError):
        pass

    with pytest.raises(MyError, match="k must be a positive number"):
        validate.positives(MyError, k=0)
    with pytest.raises(MyError, match="k must be a positive integer"):
        validate.positive_int("k", 0, MyError)
    with pytest.raises(MyError, match="k must be a non-negative number"):
        validate.non_negative("k", -1, MyError)
