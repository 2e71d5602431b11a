"""Hosting the HTTP and metrics apps: uvicorn on a socket shared with SO_REUSEPORT, optional TLS.

Several gateway processes (replicas) bind the same port; the kernel spreads new connections over
them.  Whoever hosts the front ends (the Ray gateway, the local host) calls :func:`serve_http`.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from serve_app.http_server.direct_infer import DirectInferProtocol
from serve_app.http_server.head import BoundedHeadProtocol
from serve_app.http_server.infer_route import FastInfer
from serve_app.security.restricted import RestrictedApis
from serve_app.security.tls import TlsSettings


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose proto
    # says TCP, and with Nagle on, a response written as headers then body waits for the client's delayed
    # ACK (about 40 ms) on every request of a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def uvicorn_tls_options(tls: TlsSettings) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.Config`` that serve HTTPS with these files."""
    tls.check()
    return {
        "ssl_certfile": tls.cert_file,
        "ssl_keyfile": tls.key_file,
        "ssl_ca_certs": tls.ca_file or None,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_NONE,
    }


def serve_http(
    app: ASGIApp,
    sock: socket.socket,
    tls: TlsSettings | None = None,
    *,
    infer: FastInfer | None = None,
    restricted: RestrictedApis | None = None,
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """Serve ``app`` on ``sock`` in the running loop; the server (``should_exit`` stops it) and its task.

    ``infer``: the infer route within ``app``, which the connections then answer without ASGI
    (:mod:`~serve_app.http_server.direct_infer`), checking ``restricted`` as ``app`` does."""
    options = uvicorn_tls_options(tls) if tls is not None else {}
    protocol: Any = BoundedHeadProtocol
    if infer is not None:
        protocol = functools.partial(DirectInferProtocol, route=infer, restricted=restricted or RestrictedApis())
    config = uvicorn.Config(
        app,
        # uvicorn's httptools protocol; a chunked body wins over a Content-Length; the request head is bounded
        http=protocol,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=60,
        **options,
    )
    server = uvicorn.Server(config)
    return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
