"""Triton's trace extension, without OpenTelemetry: settings, their updates and the sampling decision.

Pure code: what the trace settings are (global, and per model over them, as Triton's
TraceManager keeps them), how a request through either protocol changes them, and whether a
request is traced.  Spans themselves are made in :mod:`serve_app.telemetry`.
"""

from serve_app.tracing.settings import (
    DEFAULT_URL,
    ExportConfig,
    NewSetting,
    TraceLevel,
    TraceLink,
    TraceSetting,
    TraceSettingsStore,
)
from serve_app.tracing.startup import TraceStartup

__all__ = [
    "DEFAULT_URL",
    "ExportConfig",
    "NewSetting",
    "TraceLevel",
    "TraceLink",
    "TraceSetting",
    "TraceSettingsStore",
    "TraceStartup",
]
