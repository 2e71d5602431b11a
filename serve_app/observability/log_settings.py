"""The log settings Triton's logging extension reads and writes, with its rules and messages.

``log_file`` is set at start only (a request naming it is refused, as Triton refuses it); the
others change at run time.  The front ends hand over ``{name: value}`` as their protocol types
it: HTTP's JSON values (null: leave the setting alone), gRPC's ``bool_param`` / ``uint32_param`` /
``string_param`` (a value without one of them is :data:`NO_VALUE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from serve_app.errors import InvalidArgument, Unavailable, Unsupported

LOG_FILE_FIXED = "log file location can not be updated through network protocol"
FORMATS = ("default", "ISO8601")
NO_VALUE = object()  # a gRPC setting value with no parameter set


@dataclass(frozen=True, slots=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def __post_init__(self) -> None:
        if self.log_format not in FORMATS:
            raise InvalidArgument(f"invalid argument for --log-format, got: {self.log_format}")
        if self.log_verbose_level < 0:
            raise InvalidArgument("log_verbose_level must not be negative")


_TYPES = {"log_info": bool, "log_warning": bool, "log_error": bool, "log_verbose_level": int, "log_format": str}
_GRPC_NAMES = {bool: "boolean", int: "int32", str: "string"}
_JSON_NAMES = {bool: "boolean", int: "unsigned-integer", str: "string"}  # TritonJson's words


def parse_log_update(current: LogSettings, values: Mapping[str, object], *, http: bool = False) -> LogSettings:
    """``current`` with what ``values`` change; raises Triton's error for the first bad one."""
    if "log_file" in values and (values["log_file"] is not None or not http):
        raise Unsupported(LOG_FILE_FIXED)
    changes: dict[str, object] = {}
    for name, kind in _TYPES.items():
        if name not in values:
            continue
        value = values[name]
        if value is None and http:
            continue
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is int and ok and value < 0:  # type: ignore[operator]
            ok = False
        if not ok:
            if http:
                raise InvalidArgument(f"attempt to access JSON non-{_JSON_NAMES[kind]} as {_JSON_NAMES[kind]}")
            raise InvalidArgument(f"expect {_GRPC_NAMES[kind]} for '{name}'")
        if name == "log_format" and value not in FORMATS:
            if http:  # Triton's HTTP endpoint answers this one with UNAVAILABLE (still a 400 there)
                raise Unavailable(f"invalid argument for --log_format, got: {value}")
            raise InvalidArgument(f"invalid argument for log_format, got: {value}")
        changes[name] = value
    return replace(current, **changes)  # type: ignore[arg-type]
