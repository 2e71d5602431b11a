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
on first use: a server that never traces starts none.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serve_app.observability.trace_settings import ExportConfig, TraceLink

T = TypeVar("T")

SERVICE_NAME = "triton-inference-server"  # Triton's resource service.name (a resource setting may change it)
ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"

_propagator = TraceContextTextMapPropagator()
_current: contextvars.ContextVar[ActiveSpan | None] = contextvars.ContextVar("serve_app_span", default=None)
_providers: dict[ExportConfig, TracerProvider] = {}
_lock = threading.Lock()


def _tracer(export: ExportConfig) -> otel.Tracer:
    provider = _providers.get(export)
    if provider is None:
        with _lock:
            provider = _providers.get(export)
            if provider is None:
                provider = _providers[export] = _provider(export)
    return provider.get_tracer("serve_app")


def _provider(export: ExportConfig) -> TracerProvider:
    url = export.url if "://" in export.url else "http://" + export.url
    attributes: dict[str, str | int] = {"service.name": SERVICE_NAME, "process.pid": os.getpid()}
    attributes.update(export.resource)
    provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create(attributes))
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=url),
        max_queue_size=export.bsp_max_queue_size,
        schedule_delay_millis=max(1, export.bsp_schedule_delay),
        max_export_batch_size=export.bsp_max_export_batch_size,
    )
    provider.add_span_processor(processor)
    return provider


def flush(timeout_ms: int = 5000) -> None:
    """Export what this process's exporters hold (at shutdown; tests)."""
    for provider in list(_providers.values()):
        provider.force_flush(timeout_ms)


def parent_context(traceparent: str | None) -> Context | None:
    """The client's trace context from a W3C ``traceparent`` value, or None (absent or malformed)."""
    if not traceparent:
        return None
    context = _propagator.extract({"traceparent": traceparent})
    return context if otel.get_current_span(context).get_span_context().is_valid else None


class ActiveSpan:
    """One open span of a traced request, and what its children need (exporter, whether to record events)."""

    __slots__ = ("events", "export", "span")

    def __init__(self, span: otel.Span, export: ExportConfig, events: bool) -> None:
        self.span = span
        self.export = export
        self.events = events

    def event(self, name: str, ns: int | None = None) -> None:
        """A Triton timestamp (with TIMESTAMPS in the trace level): ``ns`` wall-clock nanoseconds, or now."""
        if self.events:
            self.span.add_event(name, timestamp=ns if ns is not None else time.time_ns())

    def model_span(self, model: str, version: int, request_id: str) -> ActiveSpan:
        """The span of one model's request (a child of this one), opened with REQUEST_START."""
        now = time.time_ns()
        attributes: dict[str, str | int] = {"triton.model_name": model, "triton.model_version": version}
        if request_id:
            attributes["triton.request_id"] = request_id
        context = otel.set_span_in_context(self.span)
        span = _tracer(self.export).start_span(
            model, context=context, kind=otel.SpanKind.SERVER, attributes=attributes, start_time=now
        )
        child = ActiveSpan(span, self.export, self.events)
        child.event("REQUEST_START", now)
        return child

    def link(self) -> TraceLink:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, otel.set_span_in_context(self.span))
        return TraceLink(carrier["traceparent"], self.export, self.events)

    def end(self, event: str | None = None) -> None:
        now = time.time_ns()
        if event:
            self.event(event, now)
        self.span.end(end_time=now)


def start_request(export: ExportConfig, events: bool, parent: Context | None, start_ns: int) -> ActiveSpan:
    """A traced request's ``InferRequest`` span (the client's span its parent, when it sent one)."""
    span = _tracer(export).start_span(ROOT_SPAN, context=parent, kind=otel.SpanKind.SERVER, start_time=start_ns)
    return ActiveSpan(span, export, events)


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
    input_end = start_ns + timings.get("input", 0)
    output_start = input_end + timings.get("infer", 0)
    end = output_start + timings.get("output", 0)
    for link in links:
        parent = _propagator.extract({"traceparent": link.traceparent})
        span = _tracer(link.export).start_span(
            COMPUTE_SPAN, context=parent, kind=otel.SpanKind.SERVER, start_time=start_ns
        )
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
