"""Spans through OpenTelemetry, shaped as Triton's OpenTelemetry trace mode shapes them.

A traced request is one trace: an ``InferRequest`` span (the front end: Triton's
``HTTP_RECV_START`` ... ``HTTP_SEND_END`` or ``GRPC_WAITREAD_START`` ... ``GRPC_SEND_END``
events, and ``INFER_RESPONSE_COMPLETE``), a child span named after the model
(``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``; the steps of an ensemble are
children of the ensemble's span), and under each model span that ran a batch a
``compute`` span (``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``,
``COMPUTE_END``), recorded by the process that holds the instance.

The request's current span rides a context variable from the front end through the
service and the schedulers (ensemble steps inherit it); to the instance it travels
in the batch as a W3C ``traceparent`` (:class:`~serve_app.observability.trace_settings.TraceLink`).
Each process exports through one OTLP/HTTP exporter per export configuration, made
on first use (:mod:`.otel_export`): a server that never traces starts none, and imports
no OpenTelemetry module either, so that the schedulers, the instances and the front ends,
which all ask for the current span, stay free of the SDK.
"""

from __future__ import annotations

import contextvars
import sys
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, TypeVar

from serve_app.observability.trace_settings import ExportConfig, TraceLink

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

T = TypeVar("T")

ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
_SDK = "serve_app.observability.otel_export"

_current: contextvars.ContextVar[ActiveSpan | None] = contextvars.ContextVar("serve_app_span", default=None)


def flush(timeout_ms: int = 5000) -> None:
    """Export what this process's exporters hold (at shutdown; tests).  Nothing traced here: nothing to do,
    and the SDK stays unloaded."""
    if _SDK in sys.modules:
        from serve_app.observability import otel_export

        otel_export.flush(timeout_ms)


def parent_context(traceparent: str | None) -> Context | None:
    """The client's trace context from a W3C ``traceparent`` value, or None (absent or malformed)."""
    if not traceparent:
        return None
    from serve_app.observability import otel_export

    context = otel_export.extract(traceparent)
    return context if otel_export.is_valid(context) else None


class ActiveSpan:
    """One open span of a traced request, and what its children need (exporter, whether to record events)."""

    __slots__ = ("events", "export", "span")

    def __init__(self, span: Span, export: ExportConfig, events: bool) -> None:
        self.span = span
        self.export = export
        self.events = events

    def event(self, name: str, ns: int | None = None) -> None:
        """A Triton timestamp (with TIMESTAMPS in the trace level): ``ns`` wall-clock nanoseconds, or now."""
        if self.events:
            self.span.add_event(name, timestamp=ns if ns is not None else time.time_ns())

    def model_span(self, model: str, version: int, request_id: str) -> ActiveSpan:
        """The span of one model's request (a child of this one), opened with REQUEST_START."""
        from serve_app.observability import otel_export

        now = time.time_ns()
        attributes: dict[str, str | int] = {"triton.model_name": model, "triton.model_version": version}
        if request_id:
            attributes["triton.request_id"] = request_id
        span = otel_export.start_span(self.export, model, now, parent=self.span, attributes=attributes)
        child = ActiveSpan(span, self.export, self.events)
        child.event("REQUEST_START", now)
        return child

    def link(self) -> TraceLink:
        from serve_app.observability import otel_export

        return TraceLink(otel_export.traceparent(self.span), self.export, self.events)

    def end(self, event: str | None = None) -> None:
        now = time.time_ns()
        if event:
            self.event(event, now)
        self.span.end(end_time=now)


def start_request(export: ExportConfig, events: bool, parent: Context | None, start_ns: int) -> ActiveSpan:
    """A traced request's ``InferRequest`` span (the client's span its parent, when it sent one)."""
    from serve_app.observability import otel_export

    return ActiveSpan(otel_export.start_span(export, ROOT_SPAN, start_ns, parent=parent), export, events)


def current() -> ActiveSpan | None:
    """The span of the request being served here, or None (not traced: the usual case, one lookup)."""
    return _current.get()


def current_link() -> TraceLink | None:
    span = _current.get()
    return span.link() if span is not None else None


def activate(span: ActiveSpan) -> contextvars.Token[ActiveSpan | None]:
    return _current.set(span)


def deactivate(token: contextvars.Token[ActiveSpan | None]) -> None:
    _current.reset(token)


def record_compute(links: tuple[TraceLink, ...], start_ns: int, timings: Mapping[str, int]) -> None:
    """Where a traced batch ran: one ``compute`` span under each traced request's model span.
    ``timings``: the compute_input / compute_infer / compute_output nanoseconds of the execution."""
    from serve_app.observability import otel_export

    input_end = start_ns + timings.get("input", 0)
    output_start = input_end + timings.get("infer", 0)
    end = output_start + timings.get("output", 0)
    for link in links:
        parent = otel_export.extract(link.traceparent)
        span = otel_export.start_span(link.export, COMPUTE_SPAN, start_ns, parent=parent)
        if link.events:
            for name, ns in (
                ("COMPUTE_START", start_ns),
                ("COMPUTE_INPUT_END", input_end),
                ("COMPUTE_OUTPUT_START", output_start),
                ("COMPUTE_END", end),
            ):
                span.add_event(name, timestamp=ns)
        span.end(end_time=end)


async def run_request(trace: ActiveSpan, call: Awaitable[T]) -> T:
    """Await a traced request's work with ``trace`` current (its model spans become children): a failure
    ends the span, a success marks ``INFER_RESPONSE_COMPLETE`` and leaves the send events to the front end."""
    token = activate(trace)
    try:
        result = await call
    except BaseException:
        trace.end()
        raise
    finally:
        deactivate(token)
    trace.event("INFER_RESPONSE_COMPLETE")
    return result
