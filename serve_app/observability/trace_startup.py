"""The start-up trace settings, from Triton's ``--trace-config`` entries.

An entry is ``<setting>=<value>`` for the general settings (``level``, ``rate``,
``count``, ``mode``) or ``<mode>,<setting>=<value>`` for a mode's own:
``opentelemetry,url=host:port/v1/traces``, ``opentelemetry,resource=key=value``,
``opentelemetry,bsp_max_queue_size=N``, ``bsp_schedule_delay=MS``,
``bsp_max_export_batch_size=N``; ``triton,log-frequency=N`` is kept (and shown
in Triton's mode only), ``triton,file=...`` is accepted and unused.  ``level``
may be given more than once (TIMESTAMPS and TENSORS add up).

Spans go out through OpenTelemetry only: ``mode=triton`` (Triton's JSON trace
files) is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from serve_app.errors import InvalidArgument
from serve_app.observability.trace_settings import (
    DEFAULT_URL,
    MODE_OPENTELEMETRY,
    MODE_TRITON,
    ExportConfig,
    TraceLevel,
    TraceSetting,
)

DEFAULT_RATE = 1000  # Triton's


@dataclass(frozen=True, slots=True)
class TraceStartup:
    level: TraceLevel = TraceLevel.OFF
    rate: int = DEFAULT_RATE
    count: int = -1
    log_frequency: int = 0
    export: ExportConfig = field(default_factory=ExportConfig)

    def setting(self) -> TraceSetting:
        """The global default every update falls back to."""
        return TraceSetting(self.level, self.rate, self.count, self.log_frequency, MODE_OPENTELEMETRY)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TraceStartup:
        """From ``--trace-config`` entries; raises InvalidArgument naming a bad one."""
        level = TraceLevel.OFF
        general: dict[str, int] = {}
        otel: dict[str, int] = {}
        url = DEFAULT_URL
        resource: list[tuple[str, str]] = []
        for entry in entries:
            mode, _, assignment = entry.partition(",") if "," in entry.split("=", 1)[0] else ("", "", entry)
            mode = mode.strip()
            name, eq, value = assignment.partition("=")
            name, value = name.strip(), value.strip()
            if not eq or not name:
                raise InvalidArgument(f"--trace-config '{entry}': expected [<mode>,]<setting>=<value>")
            if mode == "":
                if name == "level":
                    level = _level(level, value, entry)
                elif name == "mode":
                    if value == MODE_TRITON:
                        raise InvalidArgument(
                            "--trace-config mode=triton (Triton's trace files) is not supported: traces are exported "
                            "with OpenTelemetry (mode=opentelemetry)"
                        )
                    if value != MODE_OPENTELEMETRY:
                        raise InvalidArgument(f"--trace-config '{entry}': unknown trace mode '{value}'")
                elif name == "rate":
                    general["rate"] = _integer(value, entry, 0, 2**32 - 1)
                elif name == "count":
                    general["count"] = _integer(value, entry, -1, 2**31 - 1)
                else:
                    raise InvalidArgument(f"--trace-config '{entry}': unknown setting '{name}'")
            elif mode == MODE_TRITON:
                if name == "log-frequency":
                    general["log_frequency"] = _integer(value, entry, 0, 2**32 - 1)
                elif name != "file":
                    raise InvalidArgument(f"--trace-config '{entry}': unknown setting '{name}'")
            elif mode == MODE_OPENTELEMETRY:
                if name == "url":
                    url = value
                elif name == "resource":
                    key, is_pair, attr = value.partition("=")
                    if not is_pair or not key:
                        raise InvalidArgument(f"--trace-config '{entry}': expected resource=<key>=<value>")
                    resource.append((key, attr))
                elif name in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
                    otel[name] = _integer(value, entry, 0 if name == "bsp_schedule_delay" else 1, 2**32 - 1)
                else:
                    raise InvalidArgument(f"--trace-config '{entry}': unknown setting '{name}'")
            else:
                raise InvalidArgument(f"--trace-config '{entry}': unknown trace mode '{mode}'")
        export = ExportConfig(url=url, resource=tuple(resource), **otel)
        if export.bsp_max_export_batch_size > export.bsp_max_queue_size:
            raise InvalidArgument("--trace-config: bsp_max_export_batch_size must not exceed bsp_max_queue_size")
        return cls(level=level, export=export, **general)


def _level(level: TraceLevel, value: str, entry: str) -> TraceLevel:
    upper = value.upper()
    if upper == "OFF":
        return TraceLevel.OFF
    if upper in ("TIMESTAMPS", "TENSORS"):
        return level | TraceLevel[upper]
    raise InvalidArgument(f"--trace-config '{entry}': level must be OFF, TIMESTAMPS or TENSORS")


def _integer(value: str, entry: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgument(f"--trace-config '{entry}': '{value}' is not an integer") from None
    if not low <= number <= high:
        raise InvalidArgument(f"--trace-config '{entry}': {number} is out of range [{low}, {high}]")
    return number
