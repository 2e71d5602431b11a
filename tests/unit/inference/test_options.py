"""sequence_flags: the sequence parameters of a request (sequence_id, sequence_start, sequence_end), checked with
Triton's messages; and the plain messages of serve_app.sequence.messages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from serve_app.errors import InvalidArgument, ServeError
from serve_app.inference.options import SequenceFlags, sequence_flags
from serve_app.inference.types import InferRequest, ParamValue
from serve_app.sequence.messages import Assignment, SequenceStep, StepResult

NON_ZERO = "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"


def flags(**params: ParamValue) -> SequenceFlags:
    return sequence_flags(InferRequest("seq", parameters=dict(params)))


def rejected(**params: ParamValue) -> str:
    with pytest.raises(InvalidArgument) as exc:
        flags(**params)
    return exc.value.message


@pytest.mark.parametrize("corr", [1, 42, 2**31, 2**32 + 5, 2**63, 2**64 - 1])
def test_integer_ids_in_the_uint64_range(corr: int) -> None:
    assert flags(sequence_id=corr) == SequenceFlags(corr, False, False)


@pytest.mark.parametrize("corr", ["a", "seq-1", "0", " ", "ünïcode"])
def test_string_ids(corr: str) -> None:
    # "0" is a non-empty string: a valid string ID, not the integer zero.
    assert flags(sequence_id=corr, sequence_start=True) == SequenceFlags(corr, True, False)


@pytest.mark.parametrize(("start", "end"), [(False, False), (True, False), (False, True), (True, True)])
def test_start_and_end_flags(start: bool, end: bool) -> None:
    assert flags(sequence_id=3, sequence_start=start, sequence_end=end) == SequenceFlags(3, start, end)


def test_flags_default_to_false() -> None:
    f = flags(sequence_id=3)
    assert (f.start, f.end) == (False, False)


@pytest.mark.parametrize("params", [{}, {"sequence_id": 0}, {"sequence_id": ""}, {"sequence_start": True}])
def test_zero_or_empty_id_rejected_with_tritons_message(params: dict[str, ParamValue]) -> None:
    assert rejected(**params) == NON_ZERO


@pytest.mark.parametrize("corr", [-1, 2**64, -(2**63)])
def test_integer_ids_outside_uint64_rejected(corr: int) -> None:
    msg = rejected(sequence_id=corr)
    assert "'sequence_id'" in msg and "unsigned 64-bit" in msg and str(corr) in msg


@pytest.mark.parametrize("corr", [True, False, 1.0, 0.5])
def test_bool_and_float_ids_rejected(corr: ParamValue) -> None:
    msg = rejected(sequence_id=corr)
    assert "'sequence_id'" in msg and "must be an unsigned integer or a string" in msg and "'seq'" in msg


@pytest.mark.parametrize("key", ["sequence_start", "sequence_end"])
@pytest.mark.parametrize("value", [1, 0, "true", 1.0])
def test_start_and_end_must_be_booleans(key: str, value: ParamValue) -> None:
    msg = rejected(sequence_id=5, **{key: value})
    assert f"parameter '{key}'" in msg and "must be a boolean" in msg and repr(value) in msg


def test_flag_type_checked_even_without_an_id() -> None:
    # The flags are checked before the ID: a malformed flag is reported as such.
    assert "must be a boolean" in rejected(sequence_start="yes")


def test_errors_are_invalid_argument() -> None:
    with pytest.raises(ServeError) as exc:
        flags(sequence_id=0)
    assert isinstance(exc.value, InvalidArgument)


def test_step_and_result_survive_pickling() -> None:
    step = SequenceStep("s", 2, 99, True, False, {"IN": np.arange(3, dtype=np.int32)}, ("OUT",), 1)
    back = pickle.loads(pickle.dumps(step))
    assert (back.corr_id, back.slot, back.slot_token, back.start, back.end, back.outputs, back.batch_size) == (
        "s",
        2,
        99,
        True,
        False,
        ("OUT",),
        1,
    )
    np.testing.assert_array_equal(back.inputs["IN"], step.inputs["IN"])
    result = pickle.loads(pickle.dumps(StepResult(error=InvalidArgument("boom"), not_here=True)))
    assert isinstance(result.error, InvalidArgument) and result.error.message == "boom" and result.not_here
    a = Assignment("i", ("h", 1), 0, 5)
    assert pickle.loads(pickle.dumps(a)) == a
