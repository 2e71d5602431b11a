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
from serve_app.inference.signature import format_dims
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
