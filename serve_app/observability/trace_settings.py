"""Trace settings, global and per model, with Triton's TraceManager rules.

A model's setting names the fields it *specifies*; the others follow the global
setting, also when the global one changes later.  Clearing a field (null over
HTTP, an empty value list over gRPC) makes it follow again; a model with no field
of its own left uses the global setting object itself.  An update replaces the
setting object, so its sampling counters start again, as Triton's do.

Sampling (:meth:`TraceSetting.sample`) is Triton's: every ``rate``-th request is
traced while ``count`` (-1: no limit) lasts; a request that carries a trace
context of its own is traced whenever tracing is on (its level is not OFF), even
with ``rate`` 0 or no ``count`` left.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from serve_app.errors import InvalidArgument

DEFAULT_URL = "http://localhost:4318/v1/traces"  # the OTLP/HTTP exporter's default, as Triton's
MODE_OPENTELEMETRY = "opentelemetry"
MODE_TRITON = "triton"
MIN_TRACE_COUNT = -1


class TraceLevel(enum.IntFlag):
    """Triton's TRITONSERVER_InferenceTraceLevel bits."""

    OFF = 0
    TIMESTAMPS = 0x4
    TENSORS = 0x8

    def names(self) -> list[str]:
        """As Triton lists a level: ["OFF"], or the bits that are set."""
        if not self:
            return ["OFF"]
        bits = ((TraceLevel.TIMESTAMPS, "TIMESTAMPS"), (TraceLevel.TENSORS, "TENSORS"))
        return [name for bit, name in bits if bit & self]


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """Where and how spans are exported (Triton's ``--trace-config opentelemetry,<setting>=<value>``).

    Plain data: it travels with each traced batch, so the process that runs the batch exports its
    spans to the same place without being configured itself."""

    url: str = DEFAULT_URL
    resource: tuple[tuple[str, str], ...] = ()  # resource attributes besides service.name
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # milliseconds
    bsp_max_export_batch_size: int = 512

    def entries(self) -> list[tuple[str, str]]:
        """The settings as Triton reports them after the general ones (``resource`` once per attribute)."""
        out = [("url", self.url)]
        out += [("resource", f"{k}={v}") for k, v in self.resource]
        out += [
            ("bsp_max_queue_size", str(self.bsp_max_queue_size)),
            ("bsp_schedule_delay", str(self.bsp_schedule_delay)),
            ("bsp_max_export_batch_size", str(self.bsp_max_export_batch_size)),
        ]
        return out


@dataclass(frozen=True, slots=True)
class TraceLink:
    """What crosses the hop with a traced batch: the W3C ``traceparent`` of the request's model span (the
    parent of the compute span the instance records), and where to export that span."""

    traceparent: str
    export: ExportConfig
    events: bool = True  # TIMESTAMPS: the compute span gets Triton's COMPUTE_* events


@dataclass(eq=False, slots=True)
class TraceSetting:
    """One setting object: its values, which of them the owner specified, and its sampling counters."""

    level: TraceLevel
    rate: int
    count: int
    log_frequency: int
    mode: str = MODE_OPENTELEMETRY
    file: str = ""
    level_specified: bool = False
    rate_specified: bool = False
    count_specified: bool = False
    log_frequency_specified: bool = False
    seen: int = 0  # requests sampled against this setting (Triton's sample_)

    def invalid_reason(self) -> str:
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode == MODE_TRITON and not self.file:
            return "trace file name is not given"
        return ""

    def sample(self, propagated: bool = False) -> bool:
        """Whether this request is traced (and the counters moved), as Triton's SampleTrace decides.
        ``propagated``: the request carries a trace context (only passed while the level is not OFF)."""
        hit = False
        if self.rate != 0:
            if (self.invalid_reason() or self.count == 0) and not propagated:
                return False
            self.seen += 1
            hit = self.seen % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
            elif hit and self.count == 0:
                hit = False
        return hit or propagated


@dataclass(frozen=True, slots=True)
class NewSetting:
    """An update: the fields given (None: unchanged) and the fields cleared (they follow the global one)."""

    level: TraceLevel | None = None
    rate: int | None = None
    count: int | None = None
    log_frequency: int | None = None
    clear_level: bool = False
    clear_rate: bool = False
    clear_count: bool = False
    clear_log_frequency: bool = False


class TraceSettingsStore:
    """The global setting, the start-up default it falls back to, and the models' own settings."""

    def __init__(self, default: TraceSetting) -> None:
        self.default = replace(default)
        self.global_setting = replace(default)
        self.models: dict[str, TraceSetting] = {}
        self._following: set[str] = set()  # models whose setting mirrors some global fields

    def setting_for(self, model: str) -> TraceSetting:
        """The setting a request to ``model`` samples against (the hot path: one dict lookup)."""
        return self.models.get(model, self.global_setting)

    def check(self, model: str, new: NewSetting) -> None:
        """Raise Triton's error if ``new`` would make an invalid setting; change nothing."""
        self._compute(model, new)

    def update(self, model: str, new: NewSetting) -> None:
        """Apply ``new`` to ``model``'s setting (``""``: the global one, and the fields models take from it)."""
        self._store(model, self._compute(model, new))
        if not model:
            for name in sorted(self._following):
                self._store(name, self._compute(name, NewSetting()))

    def _store(self, model: str, setting: TraceSetting | None) -> None:
        if not model:
            assert setting is not None
            self.global_setting = setting
        elif setting is None:
            self.models.pop(model, None)
            self._following.discard(model)
        else:
            self.models[model] = setting
            self._following.add(model)

    def _compute(self, model: str, new: NewSetting) -> TraceSetting | None:
        """The setting ``model`` gets (None: it has nothing of its own and uses the global one)."""
        current = self.models.get(model) if model else self.global_setting
        fallback = self.global_setting if model else self.default

        def specified(clear: bool, given: object, was: bool) -> bool:
            return False if clear else (given is not None or (current is not None and was))

        level_s = specified(new.clear_level, new.level, current is not None and current.level_specified)
        rate_s = specified(new.clear_rate, new.rate, current is not None and current.rate_specified)
        count_s = specified(new.clear_count, new.count, current is not None and current.count_specified)
        freq_s = specified(
            new.clear_log_frequency, new.log_frequency, current is not None and current.log_frequency_specified
        )
        if model and not (level_s or rate_s or count_s or freq_s):
            return None

        def pick(is_specified: bool, given: int | None, mine: int, theirs: int) -> int:
            if not is_specified:
                return theirs
            return given if given is not None else mine

        mine = current if current is not None else fallback
        setting = TraceSetting(
            level=TraceLevel(pick(level_s, new.level, mine.level, fallback.level)),
            rate=pick(rate_s, new.rate, mine.rate, fallback.rate),
            count=pick(count_s, new.count, mine.count, fallback.count),
            log_frequency=pick(freq_s, new.log_frequency, mine.log_frequency, fallback.log_frequency),
            mode=fallback.mode,
            file=fallback.file,
            level_specified=level_s,
            rate_specified=rate_s,
            count_specified=count_s,
            log_frequency_specified=freq_s,
        )
        reason = setting.invalid_reason()
        if reason and setting.level:
            raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")
        return setting
