"""The request parameters the scheduler reads: ``priority`` and ``timeout``.

Both protocols carry them in the request's ``parameters`` (tritonclient sends
``priority`` as uint64 and ``timeout``, in microseconds, as int64 over gRPC;
numbers over HTTP).  They are checked with the rest of the request, before it
is queued, so a bad value is a 400 / INVALID_ARGUMENT that counts nowhere.
"""

from __future__ import annotations

from serve_app.errors import InvalidArgument
from serve_app.inference.types import InferRequest

_UINT64_MAX = 2**64 - 1


def _unsigned(request: InferRequest, key: str) -> int:
    value = request.parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
        raise InvalidArgument(
            f"parameter '{key}' of the request for model '{request.model_name}' must be an unsigned integer, "
            f"got {value!r}"
        )
    return value


def request_priority(request: InferRequest) -> int:
    """0 (the default) or the requested priority level; levels out of range mean the default."""
    return _unsigned(request, "priority")


def request_timeout_us(request: InferRequest) -> int:
    """The request's queue timeout in microseconds; 0 means none."""
    return _unsigned(request, "timeout")
