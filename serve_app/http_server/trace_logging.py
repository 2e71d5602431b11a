"""HTTP routes of Triton's trace and logging extensions, and the trace of an HTTP inference request.

``GET/POST v2/trace/setting`` and ``v2/models/{model}/trace/setting``; ``GET/POST v2/logging``.  The
body is decoded here into the service's plain values (JSON types checked with TritonJson's
messages); everything else is :class:`~serve_app.observability.diagnostics.Diagnostics`.  Triton answers
every error of these endpoints with 400.

:func:`traced_infer` wraps the infer route: while tracing is off it adds one lookup per request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.errors import InvalidArgument, as_serve_error
from serve_app.limits import RequestLimits
from serve_app.observability import spans
from serve_app.observability.log_settings import LogSettings
from serve_app.protocol import http_codec
from serve_app.service import InferenceService

Handler = Callable[[Request], Awaitable[Response]]
BodyReader = Callable[[Request, RequestLimits], Awaitable[bytes]]
TRACEPARENT = "traceparent"


def _json(obj: Any) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), media_type="application/json")


def _bad_request(exc: BaseException) -> Response:
    return Response(http_codec.error_body(as_serve_error(exc).message), status_code=400, media_type="application/json")


async def _body_object(request: Request, limits: RequestLimits, read_body: BodyReader) -> dict[str, Any] | None:
    """The POST body's settings (None for a GET); JSON that is not an object names none, as Triton reads it."""
    if request.method != "POST":
        return None
    obj = http_codec.parse_json(await read_body(request, limits), limits)
    return obj if isinstance(obj, dict) else {}


def _trace_values(body: dict[str, Any]) -> dict[str, list[str] | None]:
    """Triton's HTTP trace settings: strings, ``trace_level`` an array of them, null clears."""
    values: dict[str, list[str] | None] = {}
    for name, value in body.items():
        if value is None:
            values[name] = None
        elif name == "trace_level":
            if not isinstance(value, list):
                raise InvalidArgument("attempt to access JSON non-array as array")
            if not all(isinstance(v, str) for v in value):
                raise InvalidArgument("attempt to access JSON non-string as string")
            if value:  # an empty array changes nothing (null clears)
                values[name] = list(value)
        elif name in ("trace_rate", "trace_count", "log_frequency"):
            if not isinstance(value, str):
                raise InvalidArgument("attempt to access JSON non-string as string")
            values[name] = [value]
        else:
            values[name] = [value] if isinstance(value, str) else []
    return values


def _trace_json(answer: list[tuple[str, list[str]]]) -> dict[str, Any]:
    return {name: value if name == "trace_level" else value[-1] for name, value in answer}


def log_json(settings: LogSettings) -> dict[str, Any]:
    return {
        "log_file": settings.log_file,
        "log_info": settings.log_info,
        "log_warning": settings.log_warning,
        "log_error": settings.log_error,
        "log_verbose_level": settings.log_verbose_level,
        "log_format": settings.log_format,
    }


def trace_logging_routes(service: InferenceService, limits: RequestLimits, read_body: BodyReader) -> list[Route]:
    diagnostics = service.diagnostics

    async def trace_setting(request: Request) -> Response:
        try:
            body = await _body_object(request, limits, read_body)
            model = request.path_params.get("model", "")
            values = _trace_values(body) if body is not None else None
            return _json(_trace_json(await diagnostics.trace_setting(model, values, http=True)))
        except Exception as exc:
            return _bad_request(exc)

    async def logging(request: Request) -> Response:
        try:
            body = await _body_object(request, limits, read_body)
            return _json(log_json(await diagnostics.log_settings(body, http=True)))
        except Exception as exc:
            return _bad_request(exc)

    methods = ["GET", "POST"]
    return [
        Route("/v2/trace/setting", trace_setting, methods=methods),
        Route("/v2/models/{model}/trace/setting", trace_setting, methods=methods),
        Route("/v2/logging", logging, methods=methods),
    ]


def traced_infer(service: InferenceService, infer: Handler) -> Handler:
    """The infer route, traced when the request is sampled (or sent a ``traceparent``): the request's
    ``InferRequest`` span with Triton's HTTP events around the model's spans."""
    diagnostics = service.diagnostics

    async def handler(request: Request) -> Response:
        start = time.time_ns()
        model = request.path_params["model"]
        if not diagnostics.tracing(model):  # the usual case: no header read
            return await infer(request)
        trace = diagnostics.start_trace(model, request.headers.get(TRACEPARENT), start)
        if trace is None:
            return await infer(request)
        trace.event("HTTP_RECV_START", start)
        response = await spans.run_request(trace, infer(request))
        trace.event("HTTP_SEND_START")
        response.background = BackgroundTask(trace.end, "HTTP_SEND_END")  # once the response is written
        return response

    return handler


def mark_received() -> None:
    """HTTP_RECV_END on the request's span, when it is traced (the body is read)."""
    trace = spans.current()
    if trace is not None:
        trace.event("HTTP_RECV_END")
