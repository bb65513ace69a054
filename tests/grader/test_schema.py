"""The typed boundary: what crosses from a sandbox is plain data, decoded strictly (grader/schema.py,
grader/answers.py). A value that lies about itself has no JSON form; a bool is not a number; NaN is not
finite; a float subclass with a doctored comparison arrives as 'an object', not a number."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from grader.answers import encode
from grader.schema import (
    TIMING,
    AnswerError,
    Count,
    DictOf,
    Fields,
    Flag,
    Label,
    ListOf,
    Nullable,
    Number,
    Text,
    TupleOf,
    loads,
)


class Liar(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class Anything:
    def __eq__(self, other):
        return True


def cross(value):
    """A value as it arrives in the grader: encoded in the sandbox, sent as JSON text, read back."""
    return loads(json.dumps(encode(value)))


def test_numbers_are_floats_and_never_bools_or_liars():
    assert Number().decode(cross(3), "x") == 3.0 and type(Number().decode(cross(3), "x")) is float
    assert Number().decode(cross(torch.tensor(2.5)), "x") == 2.5  # a one-element tensor is its number
    for bad, why in ((True, "a bool"), ("3", "a string"), (Liar(1.0), "a Liar object"), (Anything(), "an Anything"),
                     (math.nan, "non-finite"), (math.inf, "non-finite"), ([1.0], "a list"), (None, "None")):
        with pytest.raises(AnswerError, match=why.split()[-1] if why != "None" else "None"):
            Number().decode(cross(bad), "matmul_tflops")
    with pytest.raises(AnswerError, match="positive"):
        Number(positive=True).decode(cross(0.0), "x")


def test_counts_labels_and_containers():
    assert Count().decode(cross(2 * 4096**3), "n") == 2 * 4096**3
    assert Count().decode(cross(8.0), "n") == 8  # 2.0 * n**3 written with a float still counts exactly
    with pytest.raises(AnswerError):
        Count().decode(cross(8.5), "n")
    with pytest.raises(AnswerError, match="one of 'compute'"):
        Label(("compute", "memory")).decode(cross("Compute"), "LIMITER")
    assert Flag().decode(cross(torch.tensor(True)), "slow") is True
    with pytest.raises(AnswerError):
        Flag().decode(cross(1), "slow")
    spec = DictOf(Count(), Number(), keys=(1, 8))
    assert spec.decode(cross({1: 2.0, 8: 3.0}), "decode") == {1: 2.0, 8: 3.0}
    with pytest.raises(AnswerError, match="missing 8"):
        spec.decode(cross({1: 2.0}), "decode")
    assert TupleOf((Number(), Text())).decode(cross((1, "a")), "t") == (1.0, "a")
    assert ListOf(Nullable(Number())).decode(cross([None, 2]), "xs") == [None, 2.0]
    with pytest.raises(AnswerError, match="lacks p20_ms"):
        Fields({"median_ms": Number(), "p20_ms": Number()}).decode(cross({"median_ms": 1.0}), "t")


def test_a_timing_crosses_as_its_fields():
    from utils.measure.timing import benchmark

    t = benchmark(lambda: sum(range(100)), max_runs=5, budget_s=0.2)
    got = TIMING.decode(cross(t), "matmul_time")
    assert got["median_ms"] == t.median_ms and got["runs"] == t.runs and set(got) == set(TIMING.fields)

    @dataclasses.dataclass
    class Forged:  # the fields alone, in a class of the learner's: what crosses is the same plain data
        median_ms: float
        p20_ms: float
        p80_ms: float
        runs: int
        method: str

    assert TIMING.decode(cross(Forged(1.0, 0.5, 2.0, 3, "x")), "t")["median_ms"] == 1.0


def test_json_refuses_nan_literals_and_huge_payloads():
    with pytest.raises(ValueError):
        loads('{"x": NaN}')
    with pytest.raises(ValueError, match="items"):
        loads(json.dumps(list(range(300_000))))
    with pytest.raises(ValueError, match="deep"):
        loads("[" * 40 + "]" * 40)
