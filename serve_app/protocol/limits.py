"""How large a request the server takes, checked before it allocates for one.

A request's cost is decided by what it declares (Content-Length, JSON nesting, shapes, how many
inputs and outputs) long before its tensors exist, so every limit is checked on the declaration:
the body's size before it is read (413 / RESOURCE_EXHAUSTED), JSON nesting before ``json.loads``
recurses, and shapes and counts before any numpy array is made (400 / INVALID_ARGUMENT).  Both
front ends call the same checks, so HTTP and gRPC answer an oversized request with one message.

Defaults:

- ``max_body_bytes`` 256 MiB.  Triton's HTTP default is 64 MiB (``--http-max-input-size``) but its
  gRPC takes up to 2 GiB, and this one limit covers both protocols (gRPC's max receive message
  size follows it): 256 MiB keeps large-tensor gRPC clients working while bounding what one request
  can make a gateway hold (a JSON body expands several times once parsed).
- ``max_tensor_elements`` 2**28: what a 256 MiB body can carry in one-byte elements, so with the
  default body limit it only refuses shapes no body could fill; lower it to cap memory per request.
- ``max_json_depth`` 64: a request nests 4 levels plus one per tensor dimension of nested ``data``.
- ``max_inputs`` / ``max_outputs`` 1024: far above real models (wide recommender models have a few
  hundred inputs), far below what a body could list.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from serve_app.errors import InvalidArgument, ResourceExhausted

MiB = 2**20
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # grpc's own ceiling for a message size option


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_body_bytes: int = 256 * MiB
    max_tensor_elements: int = 2**28
    max_json_depth: int = 64
    max_inputs: int = 1024
    max_outputs: int = 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"request limit {f.name} must be a positive integer, got {value!r}")

    @property
    def grpc_max_receive_bytes(self) -> int:
        """The gRPC server's max receive message size: the body limit, within grpc's own range."""
        return min(self.max_body_bytes, GRPC_MAX_MESSAGE_BYTES)


DEFAULT_LIMITS = RequestLimits()


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


def check_json_depth(raw: bytes, limits: RequestLimits) -> None:
    """InvalidArgument when ``raw`` nests deeper than ``max_json_depth`` (cheap when it can't)."""
    limit = limits.max_json_depth
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    depth = json_depth(raw)
    if depth > limit:
        raise InvalidArgument(
            f"failed to parse the request JSON buffer: nesting depth {depth} exceeds the maximum allowed value "
            f"of {limit}, {_raise_hint('max_json_depth')}"
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


class ElementBudget:
    """Tensor elements a request declares, counted input by input before each is decoded."""

    __slots__ = ("_limits", "_model", "total")

    def __init__(self, model: str, limits: RequestLimits) -> None:
        self._model = model
        self._limits = limits
        self.total = 0

    def add(self, name: str, shape: Sequence[int]) -> None:
        """Count input ``name``'s shape (validated elsewhere: negative dims count as none)."""
        count = math.prod(max(0, int(d)) for d in shape)
        self.total += count
        limit = self._limits.max_tensor_elements
        if self.total > limit:
            raise InvalidArgument(
                f"input '{name}' brings the request for model '{self._model}' to {self.total} tensor elements, "
                f"more than the maximum allowed value of {limit}, {_raise_hint('max_tensor_elements')}"
            )
