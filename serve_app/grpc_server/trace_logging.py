"""gRPC ``TraceSetting`` and ``LogSettings`` over the service, and the trace of a ``ModelInfer`` call.

The messages are decoded into the service's plain values (a trace setting's value list; a log
setting's ``bool_param`` / ``uint32_param`` / ``string_param``); the checks and Triton's messages
are :class:`~serve_app.observability.diagnostics.Diagnostics`', shared with HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from serve_app.observability import spans
from serve_app.observability.log_settings import NO_VALUE
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.service import InferenceService

TRACEPARENT = "traceparent"
T = TypeVar("T")


async def trace_setting(service: InferenceService, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
    values = {name: list(setting.value) for name, setting in request.settings.items()} or None
    answer = await service.diagnostics.trace_setting(request.model_name, values)
    response = pb.TraceSettingResponse()
    for name, value in answer:
        response.settings[name].value.extend(value)
    return response


def _log_value(setting: pb.LogSettingsRequest.SettingValue) -> object:
    kind = setting.WhichOneof("parameter_choice")
    return NO_VALUE if kind is None else getattr(setting, kind)


async def log_settings(service: InferenceService, request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
    values = {name: _log_value(setting) for name, setting in request.settings.items()} or None
    s = await service.diagnostics.log_settings(values)
    response = pb.LogSettingsResponse()
    response.settings["log_file"].string_param = s.log_file
    response.settings["log_info"].bool_param = s.log_info
    response.settings["log_warning"].bool_param = s.log_warning
    response.settings["log_error"].bool_param = s.log_error
    response.settings["log_verbose_level"].uint32_param = s.log_verbose_level
    response.settings["log_format"].string_param = s.log_format
    return response


def start_trace(service: InferenceService, model: str, context: Any) -> spans.ActiveSpan | None:
    """The call's ``InferRequest`` span when it is traced (the handler runs once the message is read)."""
    start = time.time_ns()
    if not service.diagnostics.tracing(model):  # the usual case: no metadata read
        return None
    parent = None
    for key, value in context.invocation_metadata() or ():
        if key == TRACEPARENT and isinstance(value, str):
            parent = value
    trace = service.diagnostics.start_trace(model, parent, start)
    if trace is not None:
        trace.event("GRPC_WAITREAD_START", start)
        trace.event("GRPC_WAITREAD_END", start)
    return trace


async def run_traced(trace: spans.ActiveSpan, call: Awaitable[T]) -> T:
    """Await ``call`` as the traced request's work, then close its span with Triton's send events."""
    result = await spans.run_request(trace, call)
    trace.event("GRPC_SEND_START")
    trace.end("GRPC_SEND_END")
    return result
