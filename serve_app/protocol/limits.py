"""How large a request the server takes, checked before it allocates for one.

Every limit is checked on what a request declares, before its tensors exist (see ``serve_app/limits.py``
for the limits and their defaults): the body's size before it is read (413 / RESOURCE_EXHAUSTED), JSON
nesting before ``json.loads`` recurses, and shapes and counts before any numpy array is made (400 /
INVALID_ARGUMENT).  Both front ends call the same checks, so HTTP and gRPC answer an oversized request
with one message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from serve_app import datatypes
from serve_app.errors import InvalidArgument, ResourceExhausted
from serve_app.inference.signature import all_ints, format_dims
from serve_app.limits import RequestLimits


def _raise_hint(setting: str) -> str:
    return f"the server's {setting} limit (raise it with --{setting.replace('_', '-')})"


# --------------------------------------------------------------------------- body size


def body_too_large(size: int | None, limits: RequestLimits) -> ResourceExhausted:
    """The 413 for a body of ``size`` bytes (``None``: not known, it grew past the limit while read)."""
    what = f"request body size of {size} bytes" if size is not None else "request body size"
    return ResourceExhausted(
        f"{what} exceeds the maximum allowed value of {limits.max_body_bytes} bytes, {_raise_hint('max_body_bytes')}"
    )


def json_too_large(size: int | None, limits: RequestLimits) -> ResourceExhausted:
    """The 413 for a body that is all JSON (repository, shared memory, trace and log requests), in the
    words of Triton's check on it (``request JSON size ... exceeds the maximum allowed input size``)."""
    what = f"request JSON size of {size} bytes" if size is not None else "request JSON size"
    return ResourceExhausted(
        f"{what} exceeds the maximum allowed input size of {limits.max_body_bytes} bytes, "
        f"{_raise_hint('max_body_bytes')}"
    )


def check_body_size(size: int, limits: RequestLimits) -> None:
    if size > limits.max_body_bytes:
        raise body_too_large(size, limits)


# --------------------------------------------------------------------------- JSON nesting

# A JSON string, escapes included: its brackets are text, not structure.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_CHUNK = 1 << 20


def json_depth(raw: bytes) -> int:
    """Deepest bracket nesting of a JSON text, without parsing it (brackets in strings don't count).

    C-speed passes only (regex, translate, numpy), so a 100,000-deep body costs as little as a flat
    one and never reaches the recursion of :func:`json.loads`.
    """
    stripped = _JSON_STRING.sub(b"", raw) if b'"' in raw else raw
    brackets = np.frombuffer(stripped.translate(None, _NOT_BRACKET), dtype=np.uint8)
    depth, deepest = 0, 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        # '[' 0x5b and '{' 0x7b have bit 1 set, ']' 0x5d and '}' 0x7d don't: +1 / -1.
        steps = (brackets[start : start + _DEPTH_CHUNK] & 2).astype(np.int32) - 1
        levels = np.cumsum(steps, dtype=np.int64) + depth
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
    return deepest


JSON_ENVELOPE = 4  # the request's own levels around a tensor's data: body, inputs, an input, its data list


def check_json_depth(raw: bytes, limits: RequestLimits) -> None:
    """InvalidArgument when ``raw`` nests deeper than ``max_json_depth`` levels of data plus the request's own
    (cheap when it can't), with Triton's message."""
    limit = limits.max_json_depth
    allowed = limit + JSON_ENVELOPE
    if raw.count(b"[") + raw.count(b"{") <= allowed:
        return
    if json_depth(raw) > allowed:
        raise InvalidArgument(
            f"JSON nesting depth exceeds maximum allowed limit ({limit}), {_raise_hint('max_json_depth')}"
        )


# --------------------------------------------------------------------------- tensors


def check_counts(model: str, inputs: int, outputs: int, limits: RequestLimits) -> None:
    """How many inputs and requested outputs a request lists, before any is decoded."""
    if inputs > limits.max_inputs:
        raise InvalidArgument(
            f"request for model '{model}' has {inputs} inputs, more than the maximum allowed value of "
            f"{limits.max_inputs}, {_raise_hint('max_inputs')}"
        )
    if outputs > limits.max_outputs:
        raise InvalidArgument(
            f"request for model '{model}' requests {outputs} outputs, more than the maximum allowed value of "
            f"{limits.max_outputs}, {_raise_hint('max_outputs')}"
        )


INT64_MAX = 2**63 - 1  # Triton counts elements and bytes in int64


class ElementBudget:
    """Tensor elements a request declares, counted input by input before each is decoded."""

    __slots__ = ("_limits", "_model", "total")

    def __init__(self, model: str, limits: RequestLimits) -> None:
        self._model = model
        self._limits = limits
        self.total = 0

    def add(self, name: str, shape: Sequence[int], datatype: str = "") -> None:
        """Count input ``name``'s shape (validated elsewhere: negative dims count as none).  A shape whose
        element count, or byte size for ``datatype``, does not fit in an int64 gets Triton's overflow message
        (its QA pins them), whatever the limit."""
        count = math.prod(shape) if all_ints(shape) and min(shape, default=0) >= 0 else 0
        if not count and shape:  # a dimension that is not an int, or a negative one (counted as none)
            count = math.prod(max(0, int(d)) for d in shape)
        if count > INT64_MAX:
            raise InvalidArgument(
                f"shape {format_dims(shape)} of input '{name}' for model '{self._model}' causes total element "
                f"count to exceed maximum size of {INT64_MAX}"
            )
        itemsize = datatypes.BY_WIRE[datatype].itemsize if datatype in datatypes.BY_WIRE else 0
        if count * itemsize > INT64_MAX:
            raise InvalidArgument(
                f"byte size overflow for input '{name}' for model '{self._model}': {count} elements of "
                f"{datatype} exceed {INT64_MAX} bytes"
            )
        self.total += count
        limit = self._limits.max_tensor_elements
        if self.total > limit:
            raise InvalidArgument(
                f"input '{name}' brings the request for model '{self._model}' to {self.total} tensor elements, "
                f"more than the maximum allowed value of {limit}, {_raise_hint('max_tensor_elements')}"
            )


# --------------------------------------------------------------------------- gRPC message counts

# ModelInferRequest's fields, as the protobuf wire has them: model_name 1, inputs 5, outputs 6,
# raw_input_contents 7, each length-delimited (wire type 2).
_MODEL_NAME, _INPUTS, _OUTPUTS, _RAW = 1, 5, 6, 7
_TAG_BYTES = {_INPUTS: b"\x2a", _OUTPUTS: b"\x32", _RAW: b"\x3a"}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


# Up to this many fields of a kind (or 16 times its limit) protobuf decodes them, a few MiB, and the decoded
# request is refused with its exact counts (the HTTP front end's message); beyond, refused from the bytes.
_DECODED_FIELDS = 65536


def check_infer_message_counts(data: bytes, limits: RequestLimits) -> None:
    """Refuse (INVALID_ARGUMENT) a serialized ModelInferRequest listing far more inputs, outputs or raw input
    contents than the limits allow, before protobuf builds a message for each (an empty input is two bytes on
    the wire and about 80 once decoded: 16 MiB of them cost 0.7 GiB and 4 s of the event loop).

    Counting each field's tag byte is a pass in C and bounds its count from above; only when a bound is over
    the threshold are the top-level fields walked (skipped by their lengths, so a few large raw contents cost
    a few steps), stopping at the first count over it.  Below it the decoded request's counts are checked as
    usual.  Bytes that are not a well-formed message are left to protobuf's own error."""
    bounds = {field: max(_DECODED_FIELDS, 16 * limit) for field, limit in
              ((_INPUTS, limits.max_inputs), (_OUTPUTS, limits.max_outputs), (_RAW, limits.max_inputs))}  # fmt: skip
    if all(data.count(tag) <= bounds[field] for field, tag in _TAG_BYTES.items()):
        return
    counts = dict.fromkeys(bounds, 0)
    model, at, end = "", 0, len(data)
    try:
        while at < end:
            key, at = _varint(data, at)
            field, wire = key >> 3, key & 7
            if wire == 2:
                length, at = _varint(data, at)
                if field == _MODEL_NAME:
                    model = data[at : at + length].decode("utf-8", "replace")
                elif field in counts:
                    counts[field] += 1
                    if counts[field] > bounds[field]:
                        break
                at += length
            elif wire == 0:
                at = _varint(data, at)[1]
            elif wire in (1, 5):
                at += 8 if wire == 1 else 4
            else:
                return
    except IndexError:
        return
    names = {_INPUTS: ("inputs", "max_inputs"), _OUTPUTS: ("outputs", "max_outputs"),
             _RAW: ("raw_input_contents", "max_inputs")}  # fmt: skip
    for field, count in counts.items():
        if count > bounds[field]:
            what, setting = names[field]
            raise InvalidArgument(
                f"request for model '{model}' has over {bounds[field]} {what}, more than the maximum allowed "
                f"value of {getattr(limits, setting)}, {_raise_hint(setting)}"
            )
