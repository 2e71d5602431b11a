"""grpc.aio server lifecycle.  SO_REUSEPORT lets one gateway replica per core share the port.

Optional TLS (``serve_app.security.tls``: a secure port instead of an insecure one) and Triton's
restricted protocols (``grpc_server/restricted.py``: an interceptor, installed only when some
category is restricted, so that unrestricted servers pay nothing per call).
"""

from __future__ import annotations

import grpc

from serve_app.grpc_server.restricted import RestrictedProtocolInterceptor
from serve_app.grpc_server.servicer import InferenceServicer, add_inference_service
from serve_app.limits import DEFAULT_LIMITS, GRPC_MAX_MESSAGE_BYTES, RequestLimits
from serve_app.security.restricted import RestrictedApis
from serve_app.security.tls import TlsSettings, read_pem
from serve_app.service import InferenceService

MAX_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES


def grpc_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """Server credentials for ``server.add_secure_port``."""
    tls.check()
    return grpc.ssl_server_credentials(
        [(read_pem("key", tls.key_file), read_pem("certificate", tls.cert_file))],
        root_certificates=read_pem("CA", tls.ca_file) if tls.ca_file else None,
        require_client_auth=tls.require_client_cert,
    )


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
    bound = server.add_secure_port(address, grpc_credentials(tls)) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port}")
    await server.start()
    return server
