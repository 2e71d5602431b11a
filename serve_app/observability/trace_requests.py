"""A trace setting request, as both protocols carry it, read with Triton's rules and messages.

The front ends hand over ``{name: values}``: a list of strings per setting, or None to clear it
(HTTP's null, gRPC's empty value list).  Unknown names and unknown level names are ignored, as
Triton ignores them; ``trace_file`` can't be changed at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from serve_app.errors import InvalidArgument, Unsupported
from serve_app.observability.trace_settings import (
    MIN_TRACE_COUNT,
    MODE_TRITON,
    ExportConfig,
    NewSetting,
    TraceLevel,
    TraceSetting,
)

TRACE_FILE_FIXED = "trace file location can not be updated through network protocol"
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")

TraceValues = Mapping[str, Sequence[str] | None]


def parse_trace_update(values: TraceValues, *, http: bool = False) -> NewSetting:
    """The update ``values`` ask for; raises Triton's error for the first bad one."""
    if "trace_file" in values:
        raise Unsupported(TRACE_FILE_FIXED)
    fields: dict[str, object] = {}
    if "trace_level" in values:
        levels = values["trace_level"]
        if not levels:
            fields["clear_level"] = True
        else:
            level: TraceLevel | None = None
            for name in levels:
                if name == "OFF":
                    if len(levels) != 1:
                        raise InvalidArgument("Expect only one trace level 'OFF' is specified")
                    level = TraceLevel.OFF
                elif name in ("TIMESTAMPS", "TENSORS"):
                    level = (level or TraceLevel.OFF) | TraceLevel[name]
            if level is not None:
                fields["level"] = level
    for name, field, low, high in (
        ("trace_rate", "rate", 0, UINT32_MAX),
        ("trace_count", "count", MIN_TRACE_COUNT, INT32_MAX),
        ("log_frequency", "log_frequency", 0, UINT32_MAX),
    ):
        if name not in values:
            continue
        given = values[name]
        if not given:
            fields[f"clear_{field}"] = True
            continue
        if len(given) != 1:
            raise InvalidArgument(f"expect only 1 value for '{name}'")
        number = _stoi(name, given[0], low, high)
        if field == "count":
            if number < MIN_TRACE_COUNT:
                got = "got:" if http else "got: "
                raise InvalidArgument(
                    f"Unable to parse '{name}'. Expecting value >= {MIN_TRACE_COUNT}, {got}{given[0]}"
                )
        else:
            number &= UINT32_MAX  # as C++ stores stoi's int in a uint32_t
        fields[field] = number
    return NewSetting(**fields)  # type: ignore[arg-type]


def _stoi(name: str, text: str, low: int, high: int) -> int:
    """C++'s std::stoi: leading blanks and a sign, then digits; what follows them is ignored."""
    match = _LEADING_INT.match(text)
    if match is None:
        raise InvalidArgument(f"Unable to parse '{name}', got: {text}")
    number = int(match.group(1))
    if not -(2**31) <= number <= INT32_MAX:
        raise InvalidArgument(f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text}")
    return number


def render_setting(setting: TraceSetting, export: ExportConfig) -> list[tuple[str, list[str]]]:
    """A setting as Triton answers it, in its order: each name with its values (one, but for the level)."""
    out = [
        ("trace_level", setting.level.names()),
        ("trace_rate", [str(setting.rate)]),
        ("trace_count", [str(setting.count)]),
    ]
    if setting.mode == MODE_TRITON:
        out += [("log_frequency", [str(setting.log_frequency)]), ("trace_file", [setting.file])]
    out.append(("trace_mode", [setting.mode]))
    merged: dict[str, list[str]] = {}
    for key, value in export.entries():
        merged.setdefault(key, []).append(value)
    return out + list(merged.items())
