"""The trace and logging extensions as both front ends serve them, and the trace decision per request.

A front end decodes a settings request into plain values and calls :meth:`Diagnostics.trace_setting`
or :meth:`Diagnostics.log_settings`; the checks, Triton's messages and the answer are the same for
HTTP and gRPC.  A change is checked here, then handed to the control (:class:`DiagnosticsControl`),
which makes it everywhere it must apply: in this process (``--local``, tests), or, on Ray, through
the model manager to every gateway replica (each applies it with :meth:`apply_trace` /
:meth:`apply_logs`) before the answer is sent.

Per request, :meth:`start_trace` is one dict lookup and a level test while tracing is off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from serve_app.errors import InvalidArgument
from serve_app.observability import python_logging, spans
from serve_app.observability.log_settings import LogSettings, parse_log_update
from serve_app.observability.trace_requests import TraceValues, parse_trace_update, render_setting
from serve_app.observability.trace_settings import NewSetting, TraceLevel, TraceSettingsStore
from serve_app.observability.trace_startup import TraceStartup

TraceAnswer = list[tuple[str, list[str]]]


class DiagnosticsControl(Protocol):
    """Whoever makes a checked change apply: to this process, or to every front-end process."""

    async def update_trace(self, model: str, new: NewSetting) -> None: ...

    async def update_logs(self, settings: LogSettings) -> None: ...


class Diagnostics:
    def __init__(
        self,
        startup: TraceStartup | None = None,
        logs: LogSettings | None = None,
        control: DiagnosticsControl | None = None,
    ) -> None:
        self.startup = startup if startup is not None else TraceStartup()
        self.traces = TraceSettingsStore(self.startup.setting())
        self.logs = logs if logs is not None else LogSettings()
        self.control: DiagnosticsControl = control if control is not None else _InProcess(self)
        self.model_ready: Callable[[str], bool] = lambda name: False
        self.applied = 0  # trace updates applied so far (of the model manager's record, on Ray)
        self._epoch = 0  # which record: a model manager that Serve restarts starts a new one

    # -- per request ------------------------------------------------------------------------
    def tracing(self, model: str) -> bool:
        """Whether requests to ``model`` may be traced now (their level is not OFF): the front ends ask this
        before they look for a trace context."""
        return bool(self.traces.setting_for(model).level)

    def start_trace(self, model: str, traceparent: str | None, start_ns: int) -> spans.ActiveSpan | None:
        """The request's root span when it is traced (sampled, or sent with a trace context), else None."""
        setting = self.traces.setting_for(model)
        if not setting.level:
            return None
        parent = spans.parent_context(traceparent) if traceparent else None
        if not setting.sample(parent is not None):
            return None
        events = bool(setting.level & TraceLevel.TIMESTAMPS)
        return spans.start_request(self.startup.export, events, parent, start_ns)

    # -- the settings extensions -------------------------------------------------------------
    async def trace_setting(self, model: str, values: TraceValues | None, *, http: bool = False) -> TraceAnswer:
        """Triton's trace setting request for ``model`` (``""``: global): ``values`` to change, or None to read."""
        if model and not self.model_ready(model):
            raise InvalidArgument(f"Request for unknown model : {model}")
        if values:
            new = parse_trace_update(values, http=http)
            self.traces.check(model, new)
            await self.control.update_trace(model, new)
        return render_setting(self.traces.setting_for(model), self.startup.export)

    async def log_settings(self, values: dict[str, object] | None, *, http: bool = False) -> LogSettings:
        """Triton's log settings request: ``values`` to change, or None to read."""
        if values:
            await self.control.update_logs(parse_log_update(self.logs, values, http=http))
        return self.logs

    # -- applying a change (from the control) ------------------------------------------------
    def apply_trace(self, model: str, new: NewSetting) -> None:
        self.traces.update(model, new)
        self.applied += 1

    def apply_logs(self, settings: LogSettings) -> None:
        self.logs = settings
        python_logging.apply(settings)

    def catch_up(self, epoch: int, updates: tuple[tuple[str, NewSetting], ...], logs: LogSettings) -> None:
        """Apply the updates of the manager's record this process has not applied yet, and its log settings.
        A new record (the manager was restarted, and lost the old one) continues from the settings here."""
        if epoch != self._epoch:
            self._epoch, self.applied = epoch, 0
        for model, new in updates[self.applied :]:
            try:
                self.apply_trace(model, new)
            except InvalidArgument:  # checked by the manager against the same sequence: can't happen
                self.applied += 1
        if logs != self.logs:
            self.apply_logs(logs)


class _InProcess:
    """One front-end process: a change applies here."""

    def __init__(self, diagnostics: Diagnostics) -> None:
        self._diagnostics = diagnostics

    async def update_trace(self, model: str, new: NewSetting) -> None:
        self._diagnostics.apply_trace(model, new)

    async def update_logs(self, settings: LogSettings) -> None:
        self._diagnostics.apply_logs(settings)


@dataclass
class DiagnosticsLog:
    """The owner's record (on Ray: the model manager's) of every change since start, in order: a front end
    that starts later, or missed a push, replays what it lacks (:meth:`Diagnostics.catch_up`)."""

    startup: TraceStartup
    logs: LogSettings
    updates: list[tuple[str, NewSetting]] = field(default_factory=list)
    epoch: int = field(default_factory=time.time_ns)
    _store: TraceSettingsStore | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_trace(self, model: str, new: NewSetting) -> None:
        """Check ``new`` against the settings so far (raises Triton's error) and record it."""
        with self._lock:
            if self._store is None:
                self._store = TraceSettingsStore(self.startup.setting())
            self._store.update(model, new)
            self.updates.append((model, new))

    def snapshot(self) -> tuple[int, tuple[tuple[str, NewSetting], ...], LogSettings]:
        return self.epoch, tuple(self.updates), self.logs
