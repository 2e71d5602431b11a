"""``POST v2/models/{m}[/versions/{v}]/generate`` and ``.../generate_stream``: Triton's generate extension.

``generate`` answers one JSON object (a model that gives other than exactly
one response is an error, in Triton's words); ``generate_stream`` answers
Server-Sent Events, one ``data:`` event per response as the model sends it.
Its status is the first response's (an error before any response is a plain
JSON error); an error after that travels in-band as ``data: {"error": ...}``.
A client that goes away cancels the request on the model's instance.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from serve_app.errors import InvalidArgument, ServeError, Unsupported
from serve_app.inference.types import InferRequest, StreamItem
from serve_app.limits import RequestLimits
from serve_app.protocol import http_codec
from serve_app.protocol.generate_codec import EXACTLY_ONE, decode_generate_request, generate_json, sse_event
from serve_app.protocol.status import http_status
from serve_app.service import InferenceService

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"
Handler = Callable[[Request], Awaitable[Response]]


def generate_routes(
    service: InferenceService,
    limits: RequestLimits,
    read_body: Callable[[Request, RequestLimits], Awaitable[bytes]],
    guarded: Callable[[Handler], Handler],
) -> list[Route]:
    async def decode(request: Request) -> tuple[AsyncGenerator[StreamItem, None], InferRequest]:
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise InvalidArgument("Unsupported content-encoding, only 'identity' is supported.")
        name, version = request.path_params["model"], request.path_params.get("version", "")
        try:
            model = service.model(name, version)
        except ServeError as miss:  # not served: loaded on demand when that is on
            model = await service.model_after_miss(name, version, miss)
        body = await read_body(request, limits)
        req = decode_generate_request(body, model_name=name, model_version=version, sig=model.signature, limits=limits)
        return service.infer_stream(model, req), req

    async def generate(request: Request) -> Response:
        items, _ = await decode(request)
        answers: list[StreamItem] = []
        async with contextlib.aclosing(items):
            async for item in items:
                if item.error is not None and not answers:
                    raise item.error
                if item.response is not None or item.error is not None:
                    answers.append(item)
        if len(answers) != 1:
            raise Unsupported(EXACTLY_ONE)
        only = answers[0]
        if only.error is not None:
            raise only.error
        assert only.response is not None
        return Response(generate_json(only.response), media_type=JSON)

    async def generate_stream(request: Request) -> Response:
        items, _ = await decode(request)
        try:  # the status line is the first response's: wait for it before answering
            first = await anext(items, None)
        except BaseException:
            await items.aclose()
            raise
        status = http_status(first.error.code) if first is not None and first.error is not None else 200
        return StreamingResponse(_events(first, items), status_code=status, media_type=SSE)

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    routes = []
    for prefix in (versioned, model):
        routes += [
            Route(f"{prefix}/generate", guarded(generate), methods=["POST"]),
            Route(f"{prefix}/generate_stream", guarded(generate_stream), methods=["POST"]),
        ]
    return routes


async def _events(first: StreamItem | None, items: AsyncGenerator[StreamItem, None]) -> AsyncIterator[bytes]:
    """The SSE body: each response (or in-band error) as one event; a flag-only final adds nothing."""
    async with contextlib.aclosing(items):
        item = first
        while item is not None:
            if item.error is not None:
                yield sse_event(http_codec.error_body(item.error.message))
            elif item.response is not None:
                try:
                    yield sse_event(generate_json(item.response))
                except ServeError as exc:
                    yield sse_event(http_codec.error_body(exc.message))
            if item.final:
                return
            item = await anext(items, None)
