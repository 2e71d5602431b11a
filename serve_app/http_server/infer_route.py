"""The infer route without the framework: ``POST /v2/models/{m}[/versions/{v}]/infer`` straight from ASGI.

Why: it is the route that carries the load, and Starlette's routing (a regex per route, in order),
``Request`` and ``Response`` objects cost about as much CPU per request as our decode, validation and
encode together.  Here one regex picks the route and the bytes go to the same :func:`infer_bytes` as the
Starlette route's.  A traced request takes the Starlette route, whose spans and events it needs; every
other path goes to the Starlette app unchanged.  The servers the front ends start go one step further
down: their connections call :meth:`FastInfer.respond` themselves, without ASGI
(:mod:`~serve_app.http_server.direct_infer`); this ASGI form serves any other host of the app.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import Cancelled, InvalidArgument, ServeError, Unsupported, as_serve_error
from serve_app.http_server.disconnect import cancel_on_disconnect
from serve_app.http_server.object_count import check_object_count
from serve_app.limits import RequestLimits
from serve_app.protocol import http_codec
from serve_app.protocol.limits import body_too_large, check_body_size
from serve_app.protocol.status import http_status
from serve_app.service import InferenceService
from serve_app.service.registry import ServedModel

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
HEADER_LENGTH = "Inference-Header-Content-Length"
DECOUPLED_HTTP = "HTTP end point doesn't support models with decoupled transaction policy"
_JSON = b"application/json"
_BINARY = b"application/octet-stream"


async def infer_bytes(
    service: InferenceService,
    model: ServedModel,
    name: str,
    version: str,
    body: bytes,
    header_length: str | None,
    limits: RequestLimits,
    receive: Receive | None = None,
) -> tuple[bytes, int | None]:
    """One inference from a request body: the response body, and its JSON header's length when binary
    outputs follow it (``None``: all JSON).  With the request's ``receive``, a client that closes its
    connection meanwhile cancels the inference (it leaves the queue, counted CANCELED)."""
    check_object_count(body, header_length, name, limits)
    req = http_codec.decode_infer_request(
        body,
        header_length,
        model_name=name,
        model_version=version,
        sig=model.signature,
        limits=limits,
        shm=service.shared_memory,
    )
    work = service.infer(model, req)
    resp = await (cancel_on_disconnect(receive, work) if receive is not None else work)
    payload, json_length = http_codec.encode_infer_response(resp, req, service.shared_memory)
    return (payload if isinstance(payload, bytes) else b"".join(payload)), json_length


def check_not_decoupled(model: ServedModel) -> None:
    if model.is_decoupled:  # before the body is read, as Triton checks
        raise Unsupported(DECOUPLED_HTTP)


def declared_length(text: str | None, limits: RequestLimits) -> None:
    """A Content-Length is digits and within the body limit (413 before the body is read)."""
    if text is None:
        return
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit():
        raise InvalidArgument(f"invalid Content-Length header: {text!r}")
    check_body_size(int(stripped), limits)


class FastInfer:
    """ASGI: the infer route served here, every other request by ``app``."""

    def __init__(self, app: ASGIApp, service: InferenceService, limits: RequestLimits) -> None:
        self.app = app
        self.service = service
        self.limits = limits
        self.tracing = service.diagnostics.tracing

    def untraced(self, scope: Scope) -> tuple[str, str] | None:
        """The model name and version of an untraced infer request, or None for any other request."""
        if scope["method"] != "POST":
            return None
        match = INFER_PATH.fullmatch(scope["path"])
        if match is None or self.tracing(match[1]):
            return None
        return match[1], match[2] or ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = self.untraced(scope)
            if target is not None:
                status, headers, body = await self.respond(*target, scope, receive, receive)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    async def respond(
        self, name: str, version: str, scope: Scope, receive: Receive, disconnect: Receive | None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The status, headers and body of the response (errors included).  ``disconnect``: the ``receive``
        that reports the client's disconnect while the inference runs (None: the caller cancels instead)."""
        try:
            try:
                model = self.service.model(name, version)
            except ServeError as miss:  # not served: loaded on demand when that is on
                model = await self.service.model_after_miss(name, version, miss)
            check_not_decoupled(model)
            content_length: str | None = None
            header_length: str | None = None
            for key, value in scope["headers"]:
                if key == b"content-length":
                    content_length = value.decode("latin-1")
                elif key == b"inference-header-content-length":
                    header_length = value.decode("latin-1")
            declared_length(content_length, self.limits)
            body = await _read_body(receive, self.limits)
            content, json_length = await infer_bytes(
                self.service, model, name, version, body, header_length, self.limits, disconnect
            )
        except Exception as exc:  # never a bare 500 page: always {"error": ...}
            err = as_serve_error(exc)
            content = http_codec.error_body(err.message)
            return http_status(err.code), _headers(_JSON, len(content)), content
        if json_length is None:
            return 200, _headers(_JSON, len(content)), content
        headers = _headers(_BINARY, len(content))
        headers.append((b"inference-header-content-length", str(json_length).encode()))
        return 200, headers, content


def _headers(content_type: bytes, length: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", content_type), (b"content-length", str(length).encode())]


async def _read_body(receive: Receive, limits: RequestLimits) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise Cancelled("the client disconnected while sending the request body")
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise body_too_large(None, limits)
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
