"""grpc.aio server lifecycle.  SO_REUSEPORT lets one gateway replica per core share the port.

Optional TLS (``serve_app.security.tls``: a secure port instead of an insecure one) and Triton's
restricted protocols (``serve_app.security.restricted``: an interceptor, installed only when some
category is restricted, so that unrestricted servers pay nothing per call).
"""

from __future__ import annotations

import grpc

from serve_app.grpc_server.servicer import InferenceServicer, add_inference_service
from serve_app.protocol.limits import DEFAULT_LIMITS, GRPC_MAX_MESSAGE_BYTES, RequestLimits
from serve_app.security.restricted import RestrictedApis, RestrictedProtocolInterceptor
from serve_app.security.tls import TlsSettings
from serve_app.service import InferenceService

MAX_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES


async def start_grpc_server(
    service: InferenceService,
    host: str,
    port: int,
    *,
    tls: TlsSettings | None = None,
    restricted: RestrictedApis | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> grpc.aio.Server:
    """Serve ``service`` on ``host:port``.  A message over ``limits.max_body_bytes`` is refused by grpc
    (RESOURCE_EXHAUSTED) before it is parsed; the other limits are checked as requests are decoded."""
    server = grpc.aio.server(
        interceptors=[RestrictedProtocolInterceptor(restricted)] if restricted else None,
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", limits.grpc_max_receive_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    add_inference_service(InferenceServicer(service, limits), server)
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, tls.grpc_credentials()) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port}")
    await server.start()
    return server
