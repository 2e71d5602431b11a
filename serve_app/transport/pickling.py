"""Cheaper pickles for what every call on a channel carries: arrays, and the executions and their results.

Pickle's default for a slotted dataclass calls ``dataclasses``' Python ``__getstate__``/``__setstate__``, and
its default for an array pickles the dtype as an object and rebuilds the array through a Python function of
numpy's: a Python model's call and its answer cost about 37 µs of pickling across the two processes (measured
on an add_sub call of two 16-element inputs), where the same content as tuples and buffers costs a few. Here a
pickler's own ``dispatch_table`` (pickle's documented hook: nothing changes for other picklers in the process,
Ray's included) reduces the registered dataclasses to their class and field values, and a native-typed
contiguous array to its buffer (still out of band, uncopied), dtype string and shape.
"""

from __future__ import annotations

import dataclasses
import io
import operator
import pickle
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from serve_app.inference.execution import Execution, ExecutionResult, PartResult, RequestPart

Reduced = tuple[Any, ...]
DISPATCH_TABLE: dict[type, Callable[[Any], Reduced | str]] = {}


def register(cls: type) -> type:
    """Pickle dataclass ``cls`` as its class and its ``__init__`` fields' values (every field is one)."""
    fields = dataclasses.fields(cls)
    if not all(f.init for f in fields):
        raise TypeError(f"{cls.__name__} has fields outside __init__: its pickle could not rebuild it")
    values = operator.attrgetter(*(f.name for f in fields))

    def reduce(obj: Any) -> Reduced:
        return cls, values(obj)

    DISPATCH_TABLE[cls] = reduce
    return cls


def _reduce_array(arr: np.ndarray) -> Reduced | str:
    dt = arr.dtype
    if dt.hasobject or dt.isbuiltin != 1 or not arr.flags.c_contiguous:  # BYTES, structured, BF16, strided
        return arr.__reduce_ex__(5)
    buffer = pickle.PickleBuffer(cast(Any, arr))  # numpy's stubs don't declare its buffer protocol
    return rebuild_array, (buffer, dt.str, arr.shape)


def rebuild_array(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array over ``buffer`` (the frame's bytes: no copy)."""
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


DISPATCH_TABLE[np.ndarray] = _reduce_array
for _cls in (Execution, RequestPart, ExecutionResult, PartResult):
    register(_cls)


class _Pickler(pickle.Pickler):
    dispatch_table = DISPATCH_TABLE


def dumps(message: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    """``pickle.dumps(message, protocol=5, buffer_callback=...)`` with the reductions above."""
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffer_callback).dump(message)
    return out.getvalue()
