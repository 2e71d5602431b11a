"""The servers of one front-end process: HTTP, gRPC, metrics and (when on) OpenAI, as the settings configure them.

The Ray gateway and the local host serve a :class:`InferenceService` the same
way: TLS and Triton's restricted APIs on HTTP and gRPC, the request limits,
and a plain metrics port (as Triton's).  Ports are bound with SO_REUSEPORT,
so several processes may share them.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serve_app.grpc_server import GrpcServer, start_grpc_server
from serve_app.http_server import build_http_app, build_metrics_app
from serve_app.http_server.restricted import restrict_http_app
from serve_app.http_server.server import reuse_port_socket, serve_http
from serve_app.openai_api.app import build_openai_app
from serve_app.runtime.memory import trim_periodically
from serve_app.service import InferenceService
from serve_app.settings import ServerSettings

if TYPE_CHECKING:
    import uvicorn


@dataclass
class FrontEnds:
    http: uvicorn.Server
    http_task: asyncio.Task[None]
    metrics: uvicorn.Server
    metrics_task: asyncio.Task[None]
    grpc: GrpcServer
    trimmer: asyncio.Task[None]  # freed memory back to the system now and then (runtime/memory.py)
    openai: tuple[uvicorn.Server, asyncio.Task[None]] | None = None  # the OpenAI port, when it is on

    def check(self) -> None:
        """Raise if a server stopped by itself."""
        if self.http_task.done():
            raise RuntimeError("HTTP server stopped")
        if self.metrics_task.done():
            raise RuntimeError("metrics server stopped")
        if self.openai is not None and self.openai[1].done():
            raise RuntimeError("OpenAI server stopped")

    async def stop(self, grace_s: float = 1.0) -> None:
        self.trimmer.cancel()
        self.http.should_exit = True
        self.metrics.should_exit = True
        if self.openai is not None:
            self.openai[0].should_exit = True
        await self.grpc.stop(grace=grace_s)


async def start_front_ends(service: InferenceService, settings: ServerSettings) -> FrontEnds:
    """Serve ``service`` on the settings' ports (raises OSError naming a port that can't be bound)."""
    s = settings
    tls = s.tls()
    if tls is not None:
        tls.check()
    http_apis, grpc_apis = s.restricted_apis()
    limits = s.limits()
    http_sock = _bind(s.host, s.http_port, "HTTP")
    metrics_sock = _bind(s.host, s.metrics_port, "metrics")
    grpc_sock = _bind(s.host, s.grpc_port, "gRPC")
    openai_sock = _bind(s.host, s.openai_port, "OpenAI") if s.openai_port else None
    infer_app = build_http_app(service, limits=limits)
    http_app = restrict_http_app(infer_app, http_apis)
    http, http_task = serve_http(http_app, http_sock, tls, infer=infer_app, restricted=http_apis)
    metrics, metrics_task = serve_http(build_metrics_app(service), metrics_sock)
    openai = None
    if openai_sock is not None:
        app = build_openai_app(
            service, limits=limits, tokenizer=s.openai_tokenizer, model_repository=s.model_repository
        )
        openai = serve_http(app, openai_sock, tls)
    try:
        server = await start_grpc_server(
            service, s.host, s.grpc_port, tls=tls, restricted=grpc_apis, limits=limits, sock=grpc_sock
        )
    except BaseException:
        http.should_exit = metrics.should_exit = True
        if openai is not None:
            openai[0].should_exit = True
        raise
    trimmer = asyncio.get_running_loop().create_task(trim_periodically())
    return FrontEnds(http, http_task, metrics, metrics_task, server, trimmer, openai)


def _bind(host: str, port: int, what: str) -> socket.socket:
    try:
        return reuse_port_socket(host, port)
    except OSError as exc:
        raise OSError(f"could not bind the {what} port {host}:{port}: {exc.strerror or exc}") from None


def check_ports_free(settings: ServerSettings) -> None:
    """Raise OSError naming the first of the settings' ports another process listens on.

    The gateways bind with SO_REUSEPORT so that several share a port; a port another server holds would
    then either refuse them (after Serve's retries, as a failed deployment) or, worse, be shared with it.
    Checked before anything starts, by binding each port exclusively for a moment."""
    ports = [("HTTP", settings.http_port), ("gRPC", settings.grpc_port), ("metrics", settings.metrics_port)]
    if settings.openai_port:
        ports.append(("OpenAI", settings.openai_port))
    for what, port in ports:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((settings.host, port))
            except OSError as exc:
                raise OSError(
                    f"the {what} port {port} on {settings.host} is in use ({exc.strerror or exc}): stop what holds "
                    f"it, or choose another with --{what.lower()}-port"
                ) from None
