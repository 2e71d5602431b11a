"""Tensor bytes and lists to numpy arrays and back: the one place data is decoded.

HTTP binary data, gRPC ``raw_input_contents`` and the raw binary request all
carry the same layout (row-major, little-endian, no padding; BOOL one byte per
element; BYTES as a 4-byte little-endian length before each element), so one
decoder serves them all.  Fixed-size tensors are zero-copy views of the buffer
they came in (read-only when the buffer is ``bytes``); a consumer that writes
must copy.  JSON ``data`` and gRPC typed ``contents`` arrive as Python lists and
go through :func:`array_from_list`.

Every malformed input raises :class:`~serve_app.errors.InvalidArgument` with a
message in Triton's words; nothing here raises anything else for bad data.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from serve_app import datatypes
from serve_app.datatypes import DataType
from serve_app.errors import InvalidArgument
from serve_app.inference.signature import INT_ONLY, all_ints

_LEN = struct.Struct("<I")
_MAX_DIM = 2**63 - 1  # shapes are int64 on the wire
# Per float size in bytes: values of smaller magnitude convert without overflow (FP16's and FP32's largest).
_FINITE_BELOW = {2: 65504.0, 4: 3.4028234663852886e38}


def _checked_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints, or InvalidArgument."""
    out = tuple(shape)
    if all_ints(out) and (not out or (min(out) >= 0 and max(out) <= _MAX_DIM)):
        return out  # the usual case, checked in C
    checked: tuple[object, ...] = out  # the dimensions come from a request: each is checked whatever its type
    for d in checked:
        if type(d) is not int and not isinstance(d, np.integer):
            raise InvalidArgument(f"invalid shape {list(out)} for input '{name}': dimensions must be integers")
        if d < 0 or d > _MAX_DIM:
            raise InvalidArgument(f"invalid shape {list(out)} for input '{name}': dimensions must be non-negative")
    return tuple(int(d) for d in out)


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a (validated) shape; 1 for a scalar ``[]``."""
    return math.prod(shape)


@functools.cache
def _wire_dtype(dt: DataType) -> np.dtype:
    # Explicit little-endian so the decode is right whatever the host order.
    return cast(np.dtype, dt.numpy.newbyteorder("<"))  # numpy's stubs give Any for dtype[Any].newbyteorder


def _reshape(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return arr.reshape(shape)
    except ValueError as e:  # e.g. a zero-size tensor with an absurd dimension
        raise InvalidArgument(f"invalid shape {list(shape)} for input '{name}': {e}") from None


# --------------------------------------------------------------------------- bytes -> array


def array_from_bytes(name: str, datatype: str, shape: Sequence[int], buf: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode one tensor's wire bytes into an array of ``shape``.

    Fixed-size types are a zero-copy ``np.frombuffer`` view; BOOL bytes other
    than 0/1 are read as true (a copy then).  BYTES becomes an object array of
    ``bytes``, one per length-prefixed element.
    """
    dt = datatypes.from_wire(datatype)
    dims = _checked_shape(name, shape)
    count = element_count(dims)
    if dt.itemsize == 0:
        return _reshape(name, _bytes_elements(name, buf, count), dims)

    expected = count * dt.itemsize
    size = len(buf) if not isinstance(buf, memoryview) else buf.nbytes
    if size != expected:
        raise InvalidArgument(f"unexpected total byte size {size} for input '{name}', expecting {expected}")
    if dt.wire_name == "BOOL":
        raw = np.frombuffer(buf, dtype=np.uint8)
        arr = raw.view(np.bool_) if count == 0 or int(raw.max()) <= 1 else raw != 0
    else:
        arr = np.frombuffer(buf, dtype=_wire_dtype(dt))
    return _reshape(name, arr, dims)


def _bytes_elements(name: str, buf: bytes | bytearray | memoryview, count: int) -> np.ndarray:
    """Parse ``count`` length-prefixed elements that must fill ``buf`` exactly."""
    mv = memoryview(buf).cast("B") if isinstance(buf, memoryview) else memoryview(buf)
    total = len(mv)
    items: list[bytes] = []
    append = items.append
    off = 0
    for i in range(count):
        if off == total:
            raise InvalidArgument(f"expected {count} string elements for inference input '{name}', got {i}")
        if off + 4 > total:
            raise InvalidArgument(f"element byte size indicator exceeds the end of the buffer for input '{name}'")
        (n,) = _LEN.unpack_from(mv, off)
        off += 4
        if off + n > total:
            raise InvalidArgument(
                f"element {i} of input '{name}' has byte size {n}, which exceeds the end of the buffer"
            )
        append(bytes(mv[off : off + n]))
        off += n
    if off != total:
        raise InvalidArgument(
            f"unexpected number of string elements {count + 1} for inference input '{name}', expecting {count}"
        )
    arr = np.empty(count, dtype=object)
    arr[:] = items
    return arr


# --------------------------------------------------------------------------- array -> bytes


def array_to_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """Wire bytes of ``array`` as ``datatype``: the inverse of :func:`array_from_bytes`.

    Fixed-size types come back as a memoryview over the (made contiguous,
    little-endian) array when no conversion was needed.  An array whose dtype
    differs from ``datatype`` is converted (``astype``), except BF16 which takes
    any 2-byte dtype bit for bit.  BYTES elements that are ``str`` are UTF-8
    encoded; other non-bytes objects are encoded via ``str()`` like tritonclient.
    """
    dt = datatypes.from_wire(datatype)
    if dt.itemsize == 0:
        return serialize_bytes(array)
    arr = np.asarray(array)
    if dt.wire_name == "BOOL":
        if arr.dtype != np.bool_:
            arr = arr != 0
    elif dt.wire_name == "BF16":
        if arr.dtype.itemsize != 2:
            raise InvalidArgument(f"cannot send an array of dtype {arr.dtype} as BF16")
        arr = arr.view(np.uint16)
    target = _wire_dtype(dt)
    if arr.dtype != target:
        arr = arr.astype(target)
    elif arr.flags.c_contiguous and arr.size:  # the usual case: the bytes as they are
        return memoryview(arr).cast("B")  # type: ignore[arg-type]
    arr = np.ascontiguousarray(arr).reshape(-1)
    # ndarray has the buffer protocol, but numpy's stubs declare its __buffer__ only for Python >= 3.12
    return memoryview(arr).cast("B")  # type: ignore[arg-type]


def _as_bytes(obj: object) -> bytes:
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    return str(obj).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES layout for every element of ``array`` in row-major order."""
    parts: list[bytes] = []
    append = parts.append
    pack = _LEN.pack
    for obj in np.asarray(array, dtype=object).reshape(-1).tolist():
        b = _as_bytes(obj)
        append(pack(len(b)))
        append(b)
    return b"".join(parts)


# --------------------------------------------------------------------------- list -> array


def _flatten(values: list[Any]) -> list[Any]:
    """Row-major leaves of a nested list (iterative: JSON may nest deeply)."""
    out: list[Any] = []
    stack = [iter(values)]
    while stack:
        for v in stack[-1]:
            if type(v) is list:
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


# The element types each kind of tensor takes from a list (exact types: a bool is not an integer here).
_BOOL: frozenset[type] = frozenset({bool})
_NUMBER: frozenset[type] = frozenset({int, float})


def _first_not_of(allowed: frozenset[type], name: str, datatype: str, flat: list[Any]) -> InvalidArgument:
    """The error for the first element whose type ``allowed`` does not hold."""
    return _type_error(name, datatype, next(v for v in flat if type(v) not in allowed))


def _type_error(name: str, datatype: str, value: object) -> InvalidArgument:
    return InvalidArgument(
        f"Unable to parse 'data': invalid value {value!r} ({type(value).__name__}) "
        f"for input '{name}' of type {datatype}"
    )


# Triton's words (``http_server.cc`` ReadDataFromJson) for JSON 'data' with fewer, or more, elements than its shape.
FEWER_THAN_SHAPE = "Failed to parse 'data' field: shape does not match true shape"
MORE_THAN_SHAPE = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def array_from_list(
    name: str, datatype: str, shape: Sequence[int], values: list[Any], *, json_data: bool = False
) -> np.ndarray:
    """Array of ``shape`` from JSON ``data`` (flat or nested) or gRPC typed contents.

    ``json_data``: the values are an HTTP request's ``data`` (a count that doesn't match gets Triton's
    message).  Values must have the right kind: bools for BOOL, integers (no bools, no
    floats) in range for integer types, numbers for floating types, strings
    (UTF-8 encoded) or bytes for BYTES.  BF16 has no list form: Triton only
    accepts it as binary data.
    """
    dt = datatypes.from_wire(datatype)
    dims = _checked_shape(name, shape)
    if dt.wire_name == "BF16":
        raise InvalidArgument(
            "receiving BF16 data via JSON is not supported. Please use the binary data format for input " + name
        )
    if not isinstance(values, list):
        raise InvalidArgument(f"Unable to parse 'data': expected an array for input '{name}'")
    # The element types, gathered in one C-level pass: they say whether to flatten and what to refuse.
    types = set(map(type, values))
    flat = values
    if list in types:
        flat = _flatten(values)
        types = set(map(type, flat))
    expected = element_count(dims)
    if len(flat) != expected and json_data:  # an HTTP request's 'data': Triton's QA checks these verbatim
        raise InvalidArgument(FEWER_THAN_SHAPE if len(flat) < expected else MORE_THAN_SHAPE)
    if len(flat) != expected:
        raise InvalidArgument(
            f"unexpected number of elements {len(flat)} in 'data' for input '{name}', expecting {expected} "
            f"for shape {list(dims)}"
        )
    kind = dt.numpy.kind
    if dt.itemsize == 0:
        arr = np.empty(expected, dtype=object)
        arr[:] = _encode_strings(name, flat)
    elif kind == "b":
        if not _BOOL.issuperset(types):
            raise _first_not_of(_BOOL, name, datatype, flat)
        arr = np.array(flat, dtype=np.bool_)
    elif kind in "iu":
        if not INT_ONLY.issuperset(types):
            raise _first_not_of(INT_ONLY, name, datatype, flat)
        if flat:
            info = np.iinfo(dt.numpy)
            lo, hi = min(flat), max(flat)
            if lo < info.min or hi > info.max:
                bad = lo if lo < info.min else hi
                raise InvalidArgument(
                    f"Unable to parse 'data': value {bad} is out of range for input '{name}' of type {datatype}"
                )
        arr = np.array(flat, dtype=dt.numpy)
    else:
        if not _NUMBER.issuperset(types):
            raise _first_not_of(_NUMBER, name, datatype, flat)
        try:
            bound = _FINITE_BELOW.get(dt.itemsize)
            if bound is None or not flat or -bound < min(flat) <= max(flat) < bound:
                arr = np.array(flat, dtype=dt.numpy)  # no value to overflow: numpy's error state need not change
            else:
                with np.errstate(over="ignore"):  # a double beyond FP16/FP32's range becomes inf, as a C cast does
                    arr = np.array(flat, dtype=dt.numpy)
        except OverflowError:
            raise InvalidArgument(
                f"Unable to parse 'data': value out of range for input '{name}' of type {datatype}"
            ) from None
    return _reshape(name, arr, dims)


def _encode_strings(name: str, flat: list[Any]) -> list[bytes]:
    out: list[bytes] = []
    append = out.append
    for v in flat:
        if type(v) is str:
            try:
                append(v.encode("utf-8"))
            except UnicodeEncodeError:  # lone surrogates from a JSON "\ud800"
                raise InvalidArgument(
                    f"Unable to parse 'data': string element for input '{name}' is not valid unicode"
                ) from None
        elif isinstance(v, bytes):
            append(bytes(v))
        else:
            raise _type_error(name, "BYTES", v)
    return out
