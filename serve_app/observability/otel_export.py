"""The OpenTelemetry SDK: tracer providers, their OTLP/HTTP exporters, and the W3C trace context.

The only module that imports OpenTelemetry.  :mod:`.spans` imports it when a request is first
traced (or a client's trace context is read), so a process that never traces loads none of the SDK.
Each process exports through one provider per export configuration, made on first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serve_app.observability.trace_settings import ExportConfig

SERVICE_NAME = "triton-inference-server"  # Triton's resource service.name (a resource setting may change it)

_propagator = TraceContextTextMapPropagator()
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


def flush(timeout_ms: int) -> None:
    """Export what this process's exporters hold."""
    for provider in list(_providers.values()):
        provider.force_flush(timeout_ms)


def extract(traceparent: str) -> Context:
    """The trace context a W3C ``traceparent`` value carries (empty when malformed)."""
    return _propagator.extract({"traceparent": traceparent})


def is_valid(context: Context) -> bool:
    return otel.get_current_span(context).get_span_context().is_valid


def traceparent(span: otel.Span) -> str:
    """``span``'s W3C ``traceparent``: how its children find it in another process."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, otel.set_span_in_context(span))
    return carrier["traceparent"]


def start_span(
    export: ExportConfig,
    name: str,
    start_ns: int,
    parent: Context | otel.Span | None = None,
    attributes: Mapping[str, str | int] | None = None,
) -> otel.Span:
    """A server span exported as ``export`` says, under ``parent`` (a context, a span, or none: a new trace)."""
    context = otel.set_span_in_context(parent) if isinstance(parent, otel.Span) else parent
    return _tracer(export).start_span(
        name, context=context, kind=otel.SpanKind.SERVER, attributes=attributes, start_time=start_ns
    )
