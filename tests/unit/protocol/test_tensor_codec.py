"""Wire bytes and lists <-> numpy arrays (serve_app.protocol.tensor_codec)."""

from __future__ import annotations

import re
import struct
import warnings

import ml_dtypes
import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from serve_app.errors import InvalidArgument
from serve_app.protocol.tensor_codec import (
    array_from_bytes,
    array_from_list,
    array_to_bytes,
    serialize_bytes,
)

FIXED = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [7, 8, 9]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [7, 8, 9]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [7, 8, 9]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [7, 8, 9]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [1, -1, 2]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 0, 2**15 - 1], [1, -1, 2]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [1, -1, 2]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [1, -1, 2]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0], [0.0, 1e-3, 3.0]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38], [0.0, 1e-30, 3.0]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1.7e308], [0.0, 1e-300, 3.0]], dtype=np.float64),
}
STRINGS = np.array([[b"", b"abc", "héllo wörld ✓".encode()], [b"\x00\xff", b"", b"x" * 300]], dtype=object)


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("datatype", sorted(FIXED))
def test_fixed_round_trip_bytes(datatype: str) -> None:
    arr = FIXED[datatype]
    raw = array_to_bytes(datatype, arr)
    assert bytes(raw) == arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    back = array_from_bytes("X", datatype, arr.shape, raw)
    assert back.shape == arr.shape
    assert back.dtype == arr.dtype
    np.testing.assert_array_equal(back, arr)


@pytest.mark.parametrize("datatype", sorted(FIXED))
def test_fixed_round_trip_list(datatype: str) -> None:
    arr = FIXED[datatype]
    back = array_from_list("X", datatype, arr.shape, arr.reshape(-1).tolist())
    assert back.dtype == arr.dtype
    np.testing.assert_array_equal(back, arr)
    nested = array_from_list("X", datatype, arr.shape, arr.tolist())
    np.testing.assert_array_equal(nested, arr)


def test_bf16_binary_round_trip() -> None:
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=ml_dtypes.bfloat16)
    raw = array_to_bytes("BF16", values)  # any 2-byte dtype goes bit for bit
    assert bytes(raw) == values.tobytes()
    back = array_from_bytes("X", "BF16", [2, 2], raw)
    assert back.dtype == np.uint16
    np.testing.assert_array_equal(back.reshape(-1).view(ml_dtypes.bfloat16), values)
    assert bytes(array_to_bytes("BF16", back)) == values.tobytes()


def test_bf16_has_no_list_form() -> None:
    with pytest.raises(InvalidArgument, match="receiving BF16 data via JSON is not supported"):
        array_from_list("X", "BF16", [1], [1.0])


def test_fixed_size_is_zero_copy() -> None:
    buf = bytearray(np.arange(4, dtype=np.float32).tobytes())
    arr = array_from_bytes("X", "FP32", [2, 2], buf)
    buf[0:4] = np.float32(42).tobytes()
    assert arr[0, 0] == 42.0
    ro = array_from_bytes("X", "FP32", [4], bytes(buf))
    assert not ro.flags.writeable


def test_memoryview_slice_is_zero_copy() -> None:
    body = b"HEADER" + np.arange(3, dtype=np.int32).tobytes()
    mv = memoryview(body)[6:]
    arr = array_from_bytes("X", "INT32", [3], mv)
    np.testing.assert_array_equal(arr, [0, 1, 2])
    assert np.shares_memory(arr, np.frombuffer(body, dtype=np.uint8))


def test_bool_nonzero_bytes_read_as_true() -> None:
    arr = array_from_bytes("X", "BOOL", [3], b"\x00\x02\x01")
    assert arr.dtype == np.bool_
    assert arr.tolist() == [False, True, True]


def test_size_mismatch_message() -> None:
    with pytest.raises(InvalidArgument) as e:
        array_from_bytes("INPUT0", "FP32", [1, 16], b"\x00" * 12)
    assert str(e.value) == "unexpected total byte size 12 for input 'INPUT0', expecting 64"


def test_negative_dim_rejected() -> None:
    with pytest.raises(InvalidArgument, match="non-negative"):
        array_from_bytes("X", "FP32", [-1, 4], b"\x00" * 16)
    with pytest.raises(InvalidArgument, match="non-negative"):
        array_from_list("X", "FP32", [-1], [1.0])


def test_unknown_datatype_rejected() -> None:
    with pytest.raises(InvalidArgument, match="invalid datatype 'FP8'"):
        array_from_bytes("X", "FP8", [1], b"\x00")


def test_scalar_and_empty_shapes() -> None:
    assert array_from_bytes("X", "INT32", [], struct.pack("<i", 7)).shape == ()
    assert array_from_bytes("X", "INT32", [0, 3], b"").shape == (0, 3)
    assert array_from_bytes("X", "BYTES", [0], b"").shape == (0,)
    assert array_from_list("X", "FP32", [0], []).shape == (0,)


# --------------------------------------------------------------------------- BYTES


def test_bytes_round_trip() -> None:
    raw = array_to_bytes("BYTES", STRINGS)
    assert isinstance(raw, bytes)
    back = array_from_bytes("X", "BYTES", STRINGS.shape, raw)
    assert back.dtype == object and back.shape == STRINGS.shape
    assert back.tolist() == STRINGS.tolist()
    assert all(type(v) is bytes for v in back.reshape(-1))


def test_bytes_interop_with_tritonclient() -> None:
    theirs = serialize_byte_tensor(STRINGS).item()
    assert array_to_bytes("BYTES", STRINGS) == theirs
    ours = array_from_bytes("X", "BYTES", [6], theirs)
    assert ours.tolist() == deserialize_bytes_tensor(theirs).tolist()


def test_bytes_str_elements_are_utf8_encoded() -> None:
    arr = np.array(["é", "", "ok", 5], dtype=object)
    assert serialize_bytes(arr) == b"".join(struct.pack("<I", len(b)) + b for b in [b"\xc3\xa9", b"", b"ok", b"5"])
    u = np.array(["ab", "✓"])  # numpy unicode array
    assert array_from_bytes("X", "BYTES", [2], array_to_bytes("BYTES", u)).tolist() == [b"ab", "✓".encode()]


def test_bytes_truncated_length_prefix() -> None:
    with pytest.raises(InvalidArgument, match="element byte size indicator exceeds the end of the buffer"):
        array_from_bytes("X", "BYTES", [2], struct.pack("<I", 1) + b"a" + b"\x01\x00")


def test_bytes_truncated_element() -> None:
    with pytest.raises(InvalidArgument, match="exceeds the end of the buffer"):
        array_from_bytes("X", "BYTES", [1], struct.pack("<I", 10) + b"abc")


def test_bytes_too_few_elements() -> None:
    with pytest.raises(InvalidArgument) as e:
        array_from_bytes("INPUT1", "BYTES", [3], struct.pack("<I", 1) + b"a")
    assert str(e.value) == "expected 3 string elements for inference input 'INPUT1', got 1"


def test_bytes_too_many_elements() -> None:
    raw = (struct.pack("<I", 1) + b"a") * 3
    with pytest.raises(InvalidArgument) as e:
        array_from_bytes("INPUT1", "BYTES", [2], raw)
    assert str(e.value) == "unexpected number of string elements 3 for inference input 'INPUT1', expecting 2"


def test_bytes_from_list() -> None:
    arr = array_from_list("X", "BYTES", [2, 2], [["", "héllo"], ["✓", "x"]])
    assert arr.tolist() == [[b"", "héllo".encode()], ["✓".encode(), b"x"]]
    assert array_from_list("X", "BYTES", [1], [b"\xff"]).tolist() == [b"\xff"]  # gRPC bytes_contents


# --------------------------------------------------------------------------- lists


def test_list_wrong_element_count() -> None:
    with pytest.raises(InvalidArgument) as e:
        array_from_list("INPUT0", "INT32", [2, 2], [1, 2, 3])
    assert str(e.value).startswith("unexpected number of elements 3 in 'data' for input 'INPUT0', expecting 4")


def test_list_ragged_nesting_counts_leaves() -> None:
    # Triton only counts elements; the nesting need not follow the shape.
    np.testing.assert_array_equal(array_from_list("X", "INT32", [2, 2], [[1], [2, 3], 4]), [[1, 2], [3, 4]])


@pytest.mark.parametrize(
    ("datatype", "values"),
    [
        ("FP32", ["1.0"]),
        ("FP32", [True]),
        ("FP32", [None]),
        ("INT32", [1.5]),
        ("INT32", [True]),
        ("INT32", ["1"]),
        ("UINT8", [{}]),
        ("BOOL", [1]),
        ("BOOL", ["true"]),
        ("BYTES", [1]),
        ("BYTES", [None]),
    ],
)
def test_list_wrong_value_type(datatype: str, values: list) -> None:
    with pytest.raises(InvalidArgument, match="Unable to parse 'data'"):
        array_from_list("X", datatype, [1], values)


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("INT8", 128), ("INT8", -129), ("UINT8", 256), ("UINT16", -1), ("UINT64", 2**64), ("INT64", 2**63)],
)
def test_list_integer_out_of_range(datatype: str, value: int) -> None:
    with pytest.raises(InvalidArgument, match="out of range"):
        array_from_list("X", datatype, [2], [0, value])


def test_list_float_overflow() -> None:
    with pytest.raises(InvalidArgument, match="out of range"):
        array_from_list("X", "FP64", [1], [10**400])


def test_list_must_be_a_list() -> None:
    with pytest.raises(InvalidArgument, match="expected an array"):
        array_from_list("X", "FP32", [1], 1.0)  # type: ignore[arg-type]


def test_list_deep_nesting_is_not_a_crash() -> None:
    deep: list = [1.0]
    for _ in range(5000):
        deep = [deep]
    np.testing.assert_array_equal(array_from_list("X", "FP32", [1], deep), [1.0])


def test_list_lone_surrogate_rejected() -> None:
    with pytest.raises(InvalidArgument, match="not valid unicode"):
        array_from_list("X", "BYTES", [1], ["\ud800"])


def test_to_bytes_converts_mismatched_dtype() -> None:
    raw = array_to_bytes("FP32", np.array([1.0, 2.0], dtype=np.float64))
    assert bytes(raw) == np.array([1.0, 2.0], dtype=np.float32).tobytes()
    assert bytes(array_to_bytes("BOOL", np.array([0, 3], dtype=np.int32))) == b"\x00\x01"
    strided = np.arange(8, dtype=np.int32)[::2]
    assert bytes(array_to_bytes("INT32", strided)) == strided.copy().tobytes()


@pytest.mark.parametrize("datatype", ["FP16", "FP32"])
def test_floats_beyond_the_type_become_inf_without_a_warning(datatype: str) -> None:
    """As a C cast does (Triton's JSON parser); fuzzing showed numpy warning in the server log on every such request."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arr = array_from_list("X", datatype, [3], [1e308, -1e308, 1.5])
    assert arr.tolist() == [float("inf"), float("-inf"), 1.5]


@pytest.mark.parametrize(
    ("datatype", "values", "named"),
    [
        ("FP32", [1.0, True, "2"], "True (bool)"),
        ("FP32", [1.0, 2, "3"], "'3' (str)"),
        ("INT32", [1, 2.0], "2.0 (float)"),
        ("INT32", [1, False], "False (bool)"),
        ("BOOL", [True, 1], "1 (int)"),
        ("FP64", [[1.0], [None]], "None (NoneType)"),
    ],
)
def test_list_elements_of_another_type_name_the_first(datatype: str, values: list, named: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(f"invalid value {named} for input 'X' of type {datatype}")):
        array_from_list("X", datatype, [len(values)] if not isinstance(values[0], list) else [2, 1], values)


def test_list_floats_at_the_types_largest_stay_finite() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert array_from_list("X", "FP16", [3], [65504.0, -65504, 65519.0]).tolist() == [65504.0, -65504.0, 65504.0]
        assert np.isfinite(array_from_list("X", "FP32", [1], [3.4028234663852886e38])).all()


@pytest.mark.parametrize("shape", [(np.int64(2),), [2], (2,)])
def test_list_shapes_of_any_integer_kind(shape: tuple) -> None:
    arr = array_from_list("X", "INT32", shape, [1, 2])
    assert arr.shape == (2,) and type(arr.shape[0]) is int


@pytest.mark.parametrize("shape", [(-1,), (2**63,), (1.0,), (True,)])
def test_list_shapes_refused(shape: tuple) -> None:
    with pytest.raises(InvalidArgument, match="invalid shape"):
        array_from_list("X", "INT32", shape, [1])
