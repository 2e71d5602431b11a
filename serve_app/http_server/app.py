"""The v2 HTTP route table.  Handlers decode, call the service, encode.

Errors of every kind are turned into ``{"error": msg}`` with the status from
:mod:`serve_app.protocol.status`, in one exception handler.  Bodies are read
through :func:`read_body`, which refuses one over ``max_body_bytes`` before
holding it (413).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.config import config_to_json
from serve_app.errors import Cancelled, InvalidArgument, ResourceExhausted, ServeError, as_serve_error
from serve_app.http_server.generate import generate_routes
from serve_app.http_server.infer_route import (
    HEADER_LENGTH,
    FastInfer,
    check_not_decoupled,
    declared_length,
    infer_bytes,
)
from serve_app.http_server.shared_memory import shared_memory_routes
from serve_app.http_server.trace_logging import mark_received, trace_logging_routes, traced_infer
from serve_app.limits import DEFAULT_LIMITS, RequestLimits
from serve_app.protocol import http_codec, repository_codec, stats_codec
from serve_app.protocol.limits import json_too_large
from serve_app.protocol.status import http_status
from serve_app.service import InferenceService
from serve_app.service.inference_service import ModelMetadata

JSON = "application/json"


def _json(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status_code=status, media_type=JSON)


def error_response(exc: BaseException) -> Response:
    err = as_serve_error(exc)
    return Response(http_codec.error_body(err.message), status_code=http_status(err.code), media_type=JSON)


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (404 no such route, 405 wrong method) in the server's ``{"error": ...}`` form."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    headers = exc.headers if isinstance(exc, HTTPException) else None
    return Response(http_codec.error_body(detail), status_code=status, media_type=JSON, headers=headers)


INVALID_READY = "Invalid value for 'ready': expected a boolean"
# A repository index body whose 'ready' is an array or an object: not a boolean, however deep it nests.
_READY_NOT_A_BOOLEAN = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


async def read_body(request: Request, limits: RequestLimits) -> bytes:
    """A JSON request body, refused (413, in the words of Triton's check) when its Content-Length or,
    lacking one, its bytes pass the limit.

    The rest of a refused body is left to the HTTP server, which discards it unread (uvicorn does) and keeps
    the connection: closing it instead would reset it under a client still sending, which then never reads
    the 413.
    """
    try:
        declared_length(request.headers.get("content-length"), limits)
    except ResourceExhausted:
        raise json_too_large(int(request.headers["content-length"].strip()), limits) from None
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise json_too_large(None, limits)
            chunks.append(chunk)
    except ClientDisconnect:
        raise Cancelled("the client disconnected while sending the request body") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _metadata_json(md: ModelMetadata) -> dict[str, Any]:
    def tensors(ts: list[Any]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in ts]

    return {
        "name": md.name,
        "versions": md.versions,
        "platform": md.platform,
        "inputs": tensors(md.inputs),
        "outputs": tensors(md.outputs),
    }


def build_http_app(
    service: InferenceService, *, limits: RequestLimits = DEFAULT_LIMITS, extra_routes: list[Route] | None = None
) -> FastInfer:
    """Every v2 route: Starlette's routing, with the infer route taken before it by :class:`FastInfer`."""

    def model_args(request: Request) -> tuple[str, str]:
        return request.path_params["model"], request.path_params.get("version", "")

    async def live(_: Request) -> Response:
        return Response(status_code=200 if service.live() else 400)

    async def ready(_: Request) -> Response:
        return Response(status_code=200 if service.ready() else 400)

    async def server_metadata(_: Request) -> Response:
        md = service.server_metadata()
        return _json({"name": md.name, "version": md.version, "extensions": md.extensions})

    async def model_ready(request: Request) -> Response:
        return Response(status_code=200 if service.model_ready(*model_args(request)) else 400)

    async def model_metadata(request: Request) -> Response:
        return _json(_metadata_json(service.model_metadata(*model_args(request))))

    async def model_config(request: Request) -> Response:
        return _json(config_to_json(service.model_config(*model_args(request))))

    async def infer(request: Request) -> Response:
        """The infer route of traced requests (the others take :class:`FastInfer`, with the same steps)."""
        name, version = model_args(request)
        try:
            model = service.model(name, version)
        except ServeError as miss:  # not served: loaded on demand when that is on
            model = await service.model_after_miss(name, version, miss)
        check_not_decoupled(model)
        body = await read_body(request, limits)
        mark_received()
        content, json_length = await infer_bytes(
            service, model, name, version, body, request.headers.get(HEADER_LENGTH), limits, request.receive
        )
        if json_length is None:
            return Response(content, media_type=JSON)
        return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_length)})

    async def model_stats(request: Request) -> Response:
        name = request.path_params.get("model", "")
        version = request.path_params.get("version", "")
        return _json(stats_codec.stats_to_json(await service.model_statistics(name, version)))

    async def repository_index(request: Request) -> Response:
        body = await read_body(request, limits)
        ready_only = False
        if body.strip():
            if _READY_NOT_A_BOOLEAN.match(body):  # Triton's check, which it reaches whatever the value's depth
                raise InvalidArgument(INVALID_READY)
            obj = http_codec.parse_json(body, limits)
            if not isinstance(obj, dict):
                raise InvalidArgument("repository index request must be a JSON object")
            ready = obj.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgument(INVALID_READY)
            ready_only = ready
        entries = await service.repository_index_async(ready_only)
        out = []
        for e in entries:
            item: dict[str, str] = {"name": e.name}
            if e.version:
                item["version"] = e.version
            item["state"] = e.state
            if e.reason:
                item["reason"] = e.reason
            out.append(item)
        return _json(out)

    async def repository_load(request: Request) -> Response:
        repository_codec.check_repository_name(request.path_params.get("repository", ""))
        params = repository_codec.http_load_parameters(await read_body(request, limits), limits)
        await service.repository_load(request.path_params["model"], params)
        return Response(status_code=200, media_type=JSON)  # Triton: 200, JSON content type, empty body

    async def repository_unload(request: Request) -> Response:
        repository_codec.check_repository_name(request.path_params.get("repository", ""))
        unload_dependents = repository_codec.http_unload_dependents(await read_body(request, limits), limits)
        await service.repository_unload(request.path_params["model"], unload_dependents)
        return Response(status_code=200, media_type=JSON)

    def guarded(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            try:
                return await fn(request)
            except ServeError as exc:
                return error_response(exc)
            except Exception as exc:  # never a bare 500 page: always {"error": ...}
                return error_response(exc)

        return handler

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2/health/live", guarded(live), methods=["GET"]),
        Route("/v2/health/ready", guarded(ready), methods=["GET"]),
        Route("/v2", guarded(server_metadata), methods=["GET"]),
        Route("/v2/repository/index", guarded(repository_index), methods=["POST"]),
        # Triton's URL may name a repository: ignored by the index, refused by load / unload.
        Route("/v2/repository/{repository}/index", guarded(repository_index), methods=["POST"]),
        Route("/v2/models/stats", guarded(model_stats), methods=["GET"]),
    ]
    for prefix in (versioned, model):
        routes += [
            Route(f"{prefix}/ready", guarded(model_ready), methods=["GET"]),
            Route(f"{prefix}/config", guarded(model_config), methods=["GET"]),
            Route(f"{prefix}/infer", guarded(traced_infer(service, infer)), methods=["POST"]),
            Route(f"{prefix}/stats", guarded(model_stats), methods=["GET"]),
            Route(prefix, guarded(model_metadata), methods=["GET"]),
        ]
    for prefix in ("/v2/repository/models/{model}", "/v2/repository/{repository}/models/{model}"):
        routes += [
            Route(f"{prefix}/load", guarded(repository_load), methods=["POST"]),
            Route(f"{prefix}/unload", guarded(repository_unload), methods=["POST"]),
        ]
    routes += generate_routes(service, limits, read_body, guarded)
    routes += shared_memory_routes(service, limits, read_body, guarded)
    routes += trace_logging_routes(service, limits, read_body)
    routes += extra_routes or []
    app = Starlette(routes=routes, exception_handlers={HTTPException: _routing_error})
    return FastInfer(app, service, limits)
