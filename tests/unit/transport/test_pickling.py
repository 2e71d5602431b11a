"""The channel's pickles (serve_app.transport.pickling): compact for executions and arrays, unchanged elsewhere."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np
import pytest

from serve_app.errors import InvalidArgument
from serve_app.hosting.messages import ExecuteOn
from serve_app.inference.cancel import CancelSignal
from serve_app.inference.execution import Execution, ExecutionResult, PartResult, RequestPart
from serve_app.transport import pickling


def roundtrip(message: object) -> tuple[object, int]:
    buffers: list[pickle.PickleBuffer] = []
    blob = pickling.dumps(message, lambda b: buffers.append(b) or False)
    return pickle.loads(blob, buffers=[b.raw() for b in buffers]), len(buffers)


ARRAYS = [
    np.arange(6, dtype=">f4").reshape(2, 3),  # big-endian: rebuilt as numpy pickles it
    np.array(3.5),
    np.zeros((0, 4), np.int64),
    np.array([True, False]),
    np.arange(6, dtype=np.float16)[::2],  # strided
    np.array(["ab", "c"]),
    np.array([b"x", b"yz"], dtype=object),
    np.array(["2020-01-01"], dtype="M8[ns]"),
    np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
    np.asfortranarray(np.arange(6).reshape(2, 3)),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: str(a.dtype))
def test_arrays_come_back_equal(arr: np.ndarray) -> None:
    back, _ = roundtrip(arr)
    assert isinstance(back, np.ndarray)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_a_native_contiguous_array_travels_out_of_band_and_comes_back_writable() -> None:
    back, buffers = roundtrip(np.arange(16, dtype=np.float32).reshape(1, 16))
    assert buffers == 1
    assert isinstance(back, np.ndarray) and back.flags.writeable


def test_a_call_and_its_answer_come_back_equal() -> None:
    a, b = np.arange(16, dtype=np.float32).reshape(1, 16), np.ones((1, 16), np.float32)
    part = RequestPart(1, ("OUTPUT0",), "id-1", {"p": 1}, 7, 1, 100, {"INPUT0": a}, CancelSignal())
    call = ExecuteOn("m:1.0.0.0", [Execution({"INPUT1": b}, ("OUTPUT0",), 1, 1234, (part,))])
    back, buffers = roundtrip(call)
    assert buffers == 2
    assert isinstance(back, ExecuteOn) and back.instance == call.instance
    got = back.executions[0]
    assert (got.outputs, got.batch_size, got.queue_ns) == (("OUTPUT0",), 1, 1234)
    np.testing.assert_array_equal(got.inputs["INPUT1"], b)
    got_part = got.parts[0]
    assert (got_part.rows, got_part.id, got_part.parameters, got_part.correlation_id, got_part.flags) == (
        1, "id-1", {"p": 1}, 7, 1,
    )  # fmt: skip
    assert got_part.inputs is not None
    np.testing.assert_array_equal(got_part.inputs["INPUT0"], a)
    assert isinstance(got_part.cancel, CancelSignal)

    answer = [
        ExecutionResult(wait_ns=5, compute_infer_ns=2, parts=[PartResult({"OUTPUT0": a}, parameters={"x": "y"})]),
        ExecutionResult(error=InvalidArgument("bad")),
    ]
    back, _ = roundtrip(answer)
    assert isinstance(back, list)
    assert back[0].wait_ns == 5 and back[0].parts[0].parameters == {"x": "y"}
    np.testing.assert_array_equal(back[0].parts[0].outputs["OUTPUT0"], a)
    assert isinstance(back[1].error, InvalidArgument) and back[1].error.message == "bad"


def test_other_picklers_are_unchanged() -> None:
    assert b"rebuild_array" not in pickle.dumps(np.zeros(2, np.float32), protocol=5)


def test_a_class_with_a_field_outside_init_is_refused() -> None:
    @dataclass
    class Derived:
        a: int
        b: int = field(init=False, default=0)

    with pytest.raises(TypeError, match="outside __init__"):
        pickling.register(Derived)
