"""The one datatype table: config enum name, v2 wire name, numpy dtype, size.

Triton's names differ by place (``TYPE_FP32`` in config.pbtxt, ``FP32`` on the
wire, ``TYPE_STRING``/``BYTES`` for strings); everything converts through here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serve_app.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class DataType:
    config_name: str  # e.g. "TYPE_FP32"
    wire_name: str  # e.g. "FP32"
    numpy: np.dtype  # object dtype for BYTES; uint16 storage for BF16
    itemsize: int  # bytes per element on the wire; 0 = variable (BYTES)


def _dt(config: str, wire: str, np_type: str, size: int) -> DataType:
    return DataType(config, wire, np.dtype(np_type), size)


_TABLE: tuple[DataType, ...] = (
    _dt("TYPE_BOOL", "BOOL", "bool", 1),
    _dt("TYPE_UINT8", "UINT8", "uint8", 1),
    _dt("TYPE_UINT16", "UINT16", "uint16", 2),
    _dt("TYPE_UINT32", "UINT32", "uint32", 4),
    _dt("TYPE_UINT64", "UINT64", "uint64", 8),
    _dt("TYPE_INT8", "INT8", "int8", 1),
    _dt("TYPE_INT16", "INT16", "int16", 2),
    _dt("TYPE_INT32", "INT32", "int32", 4),
    _dt("TYPE_INT64", "INT64", "int64", 8),
    _dt("TYPE_FP16", "FP16", "float16", 2),
    _dt("TYPE_FP32", "FP32", "float32", 4),
    _dt("TYPE_FP64", "FP64", "float64", 8),
    _dt("TYPE_STRING", "BYTES", "object", 0),
    # numpy has no bfloat16: BF16 travels as its raw 16-bit pattern.
    _dt("TYPE_BF16", "BF16", "uint16", 2),
)

BY_CONFIG: dict[str, DataType] = {d.config_name: d for d in _TABLE}
BY_WIRE: dict[str, DataType] = {d.wire_name: d for d in _TABLE}
BYTES = BY_WIRE["BYTES"]


def from_config(name: str) -> DataType:
    try:
        return BY_CONFIG[name]
    except KeyError:
        raise InvalidArgument(f"unknown data type '{name}'") from None


def from_wire(name: str) -> DataType:
    try:
        return BY_WIRE[name]
    except KeyError:
        raise InvalidArgument(f"invalid datatype '{name}'") from None


def from_numpy(dtype: np.dtype) -> DataType:
    """The wire type of a numpy array a backend produced."""
    if dtype.kind in ("O", "S", "U"):
        return BYTES
    for d in _TABLE:
        if d.numpy == dtype and d.wire_name != "BF16":
            return d
    raise InvalidArgument(f"unsupported numpy dtype '{dtype}'")
