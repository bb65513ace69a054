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
