"""One error family for the whole server, neutral to any protocol.

Each class fixes a :class:`ErrorCode`; the HTTP and gRPC front ends map the code
once (``serve_app.protocol.status``).  Constructors take only the message so the
errors survive pickling across Ray actors unchanged.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorCode(enum.Enum):
    """Triton's TRITONSERVER_Error_Code, the status every error maps from."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # ours, not Triton's: a request over a server limit (HTTP 413)


class ServeError(Exception):
    """Base of every error the server reports to a client."""

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServeError):
    code = ErrorCode.INVALID_ARG


class NotFound(ServeError):
    code = ErrorCode.NOT_FOUND


class Unavailable(ServeError):
    code = ErrorCode.UNAVAILABLE


class Unsupported(ServeError):
    code = ErrorCode.UNSUPPORTED


class InternalError(ServeError):
    code = ErrorCode.INTERNAL


class AlreadyExists(ServeError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(ServeError):
    code = ErrorCode.CANCELLED


class ResourceExhausted(ServeError):
    """A request larger than the server accepts (its body over ``max_body_bytes``)."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class Draining(Unavailable):
    """An instance that is stopping refused a batch before running it: safe to send elsewhere."""


class InvalidConfig(InvalidArgument):
    """A model configuration (config.pbtxt or generated) that can't be served.

    The message always names the model, the file and the field.
    """


def as_serve_error(exc: BaseException) -> ServeError:
    """The ServeError behind ``exc``: itself, a Ray-wrapped cause, or INTERNAL naming the innermost cause (a
    client never sees Ray's wrapper, its traceback or a process id)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    inner = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ServeError):
            return cur
        seen.add(id(cur))
        inner = cur
        cur = getattr(cur, "cause", None) or cur.__cause__
    if type(inner).__module__.startswith("ray"):  # a Ray error without a cause: its text and name are internals
        return InternalError(f"the server could not complete the request: {_ray_failure(type(inner).__name__)}")
    return InternalError(f"{type(inner).__name__}: {inner}")


def _ray_failure(kind: str) -> str:
    """What a Ray error (by its class name) means to a client, in words that don't name Ray."""
    if "Timeout" in kind:
        return "it timed out"
    if "Cancel" in kind:
        return "it was cancelled"
    if "Actor" in kind or "Worker" in kind or "Node" in kind:
        return "a server process it needed stopped"
    if "Object" in kind or "Owner" in kind:
        return "data it needed was lost"
    return "a server process failed"


_BY_CODE: dict[ErrorCode, type[ServeError]] = {
    ErrorCode.UNKNOWN: ServeError,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.INVALID_ARG: InvalidArgument,
    ErrorCode.UNAVAILABLE: Unavailable,
    ErrorCode.UNSUPPORTED: Unsupported,
    ErrorCode.ALREADY_EXISTS: AlreadyExists,
    ErrorCode.CANCELLED: Cancelled,
    ErrorCode.RESOURCE_EXHAUSTED: ResourceExhausted,
}


def error_of(code: ErrorCode, message: str) -> ServeError:
    """The error of ``code`` with ``message`` (model code names an error by its code)."""
    return _BY_CODE[code](message)
