"""ErrorCode to HTTP and gRPC status: the one mapping table, as Triton does it.

HTTP follows Triton's ``HttpCodeFromError``: only INTERNAL, NOT_FOUND,
UNAVAILABLE and UNSUPPORTED have their own status; every other code is a 400.
RESOURCE_EXHAUSTED (ours: a request over a server limit) is HTTP's 413.
gRPC maps each code to its namesake ``grpc.StatusCode``.
"""

from __future__ import annotations

import grpc

from serve_app.errors import ErrorCode

_TABLE: dict[ErrorCode, tuple[int, grpc.StatusCode]] = {
    ErrorCode.INVALID_ARG: (400, grpc.StatusCode.INVALID_ARGUMENT),
    ErrorCode.NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    ErrorCode.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    ErrorCode.UNSUPPORTED: (501, grpc.StatusCode.UNIMPLEMENTED),
    ErrorCode.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    ErrorCode.ALREADY_EXISTS: (400, grpc.StatusCode.ALREADY_EXISTS),
    ErrorCode.CANCELLED: (400, grpc.StatusCode.CANCELLED),
    ErrorCode.UNKNOWN: (400, grpc.StatusCode.UNKNOWN),
    ErrorCode.RESOURCE_EXHAUSTED: (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
}


def http_status(code: ErrorCode) -> int:
    """HTTP status for ``code`` (400 for anything without a closer match)."""
    entry = _TABLE.get(code)
    return entry[0] if entry else 400


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """gRPC status for ``code`` (UNKNOWN for anything unmapped)."""
    entry = _TABLE.get(code)
    return entry[1] if entry else grpc.StatusCode.UNKNOWN
