"""Observability: Triton's trace and logging extensions, and the spans of traced requests.

- :mod:`.trace_settings`, :mod:`.trace_startup`, :mod:`.trace_requests`: the trace settings (global
  and per model), the start-up ones from ``--trace-config``, a settings request read with Triton's
  rules, and the sampling decision.  Pure code.
- :mod:`.log_settings`, :mod:`.python_logging`: the log settings and their effect on Python's logging.
- :mod:`.diagnostics`: both extensions as the front ends serve them, and the trace decision per request.
- :mod:`.spans`: the spans of traced requests; :mod:`.otel_export` holds the OpenTelemetry SDK, which
  is imported when the first request is traced, so a server (or a core import) that never traces
  loads none of it.

The binding to Ray (one owner of the settings, pushed to every gateway) is
:mod:`serve_app.rayserve.diagnostics`.
"""
