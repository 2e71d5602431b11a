"""Triton's shared memory extension over HTTP: ``v2/systemsharedmemory`` and ``v2/cudasharedmemory``.

``GET [region/{name}/]status`` lists regions (a JSON array), ``POST region/{name}/register`` takes
``{"key", "offset", "byte_size"}`` and ``POST [region/{name}/]unregister`` forgets one region or all; every
answer other than status is an empty 200.  The registry is the service's
(:class:`~serve_app.shared_memory.SharedMemory`); CUDA shared memory answers as a Triton without GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.errors import InvalidArgument
from serve_app.limits import RequestLimits
from serve_app.protocol.http_codec import parse_json
from serve_app.service import InferenceService
from serve_app.shared_memory import cuda

Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"


def _uint(obj: dict[str, object], key: str, required: bool) -> int:
    if key not in obj:
        if required:
            raise InvalidArgument(f"Shared memory register request has no '{key}' field")
        return 0
    value = obj[key]
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"Unable to parse '{key}': expected an unsigned integer")
    return value


def _register_args(body: bytes, limits: RequestLimits) -> tuple[str, int, int]:
    obj = parse_json(body, limits) if body.strip() else {}
    if not isinstance(obj, dict):
        raise InvalidArgument("Shared memory register request must be a JSON object")
    if "key" not in obj:
        raise InvalidArgument("Shared memory register request has no 'key' field")
    key = obj["key"]
    if not isinstance(key, str):
        raise InvalidArgument("Unable to parse 'key': expected a string")
    return key, _uint(obj, "offset", required=False), _uint(obj, "byte_size", required=True)


def _ok() -> Response:
    return Response(status_code=200, media_type=JSON)


def shared_memory_routes(
    service: InferenceService,
    limits: RequestLimits,
    read_body: Callable[[Request, RequestLimits], Awaitable[bytes]],
    guarded: Callable[[Handler], Handler],
) -> list[Route]:
    def region(request: Request) -> str:
        return str(request.path_params.get("region", ""))

    async def system_status(request: Request) -> Response:
        regions = [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in service.shared_memory.status(region(request))
        ]
        return Response(json.dumps(regions, separators=(",", ":")), media_type=JSON)

    async def system_register(request: Request) -> Response:
        key, offset, byte_size = _register_args(await read_body(request, limits), limits)
        service.shared_memory.register(region(request), key, offset, byte_size)
        return _ok()

    async def system_unregister(request: Request) -> Response:
        name = region(request)
        if name:
            service.shared_memory.unregister(name)
        else:
            service.shared_memory.unregister_all()
        return _ok()

    async def cuda_status(request: Request) -> Response:
        return Response(json.dumps(cuda.status(service.shared_memory, region(request))), media_type=JSON)

    async def cuda_register(request: Request) -> Response:
        cuda.register(region(request), name_required=True)
        return _ok()

    async def cuda_unregister(_: Request) -> Response:
        return _ok()  # nothing is ever registered

    routes: list[Route] = []
    for kind, status, register, unregister in (
        ("system", system_status, system_register, system_unregister),
        ("cuda", cuda_status, cuda_register, cuda_unregister),
    ):
        for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
            routes += [
                Route(f"{prefix}/status", guarded(status), methods=["GET"]),
                Route(f"{prefix}/register", guarded(register), methods=["POST"]),
                Route(f"{prefix}/unregister", guarded(unregister), methods=["POST"]),
            ]
    return routes
