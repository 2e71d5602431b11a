"""The gRPC server's lifecycle: a listening socket (SO_REUSEPORT, so one gateway replica per core can
share the port), optional TLS with ALPN ``h2``, and one :class:`GrpcConnection` per client connection.

Triton's restricted protocols (``security/restricted.py``) are checked when a call's headers arrive,
before its request is read; unrestricted servers pay nothing per call.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

from serve_app.errors import InvalidArgument
from serve_app.grpc_server.http2 import GrpcConnection, ServerState
from serve_app.grpc_server.servicer import InferenceServicer, method_table
from serve_app.limits import DEFAULT_LIMITS, GRPC_MAX_MESSAGE_BYTES, RequestLimits
from serve_app.security.restricted import RestrictedApis
from serve_app.security.tls import TlsSettings
from serve_app.service import InferenceService

MAX_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES


def grpc_ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """A server context offering HTTP/2 by ALPN, as gRPC clients require."""
    tls.check()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.ca_file:
            context.load_verify_locations(tls.ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise InvalidArgument(f"TLS files cannot be used: {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


class GrpcServer:
    """A running server: ``stop`` refuses new calls, lets calls under way finish for ``grace`` seconds,
    then closes every connection."""

    def __init__(self, server: asyncio.AbstractServer, connections: set[GrpcConnection]) -> None:
        self._server = server
        self._connections = connections

    async def stop(self, grace: float | None = None) -> None:
        self._server.close()
        for connection in list(self._connections):
            connection.drain()
        if grace:
            deadline = asyncio.get_running_loop().time() + grace
            while any(c.calls for c in self._connections) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
        for connection in list(self._connections):
            connection.close()
        await asyncio.sleep(0)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, so that asyncio turns Nagle off on the sockets it accepts.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise OSError(f"could not bind gRPC port {host}:{port}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def start_grpc_server(
    service: InferenceService,
    host: str,
    port: int,
    *,
    tls: TlsSettings | None = None,
    restricted: RestrictedApis | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
    sock: socket.socket | None = None,
) -> GrpcServer:
    """Serve ``service`` on ``host:port`` (or on ``sock``, already bound).  A message over
    ``limits.grpc_max_receive_bytes`` is refused from its length prefix (RESOURCE_EXHAUSTED), before it
    is buffered; the other limits are checked as requests are decoded."""
    context = grpc_ssl_context(tls) if tls is not None else None
    state = ServerState(
        methods=method_table(InferenceServicer(service, limits)),
        max_message_bytes=limits.grpc_max_receive_bytes,
        restricted=restricted,
    )
    connections: set[GrpcConnection] = set()
    listening = sock if sock is not None else listening_socket(host, port)
    server = await asyncio.get_running_loop().create_server(
        lambda: GrpcConnection(state, connections), sock=listening, ssl=context
    )
    return GrpcServer(server, connections)
