"""The gateway deployment: our own HTTP and gRPC servers inside a Serve replica.

Ray's HTTP/gRPC proxy would add a Ray hop per request (measured at several
milliseconds on 2 cores), so the gateway serves the v2 protocols itself on the
Triton ports (SO_REUSEPORT: several gateway replicas may share them), decodes
and validates in place, and crosses Ray once per coalesced group of requests to
the model deployments.  See README, "Architecture".
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

from serve_app.inference.signature import ModelSignature
from serve_app.protos import model_config_pb2 as mc
from serve_app.rayserve.executor import RayModelExecutor
from serve_app.service import InferenceService, ModelCatalog, ModelState, ModelVersionEntry
from serve_app.service.catalog import FailedModel
from serve_app.settings import ServerSettings

logger = logging.getLogger("serve_app")


@dataclass(frozen=True, slots=True)
class ServedVersion:
    name: str
    version: int
    config_bytes: bytes
    deployments: tuple[str, ...]  # Serve deployment names of its instance groups


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    settings: ServerSettings
    served: tuple[ServedVersion, ...]
    failed: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (model, reason)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Gateway:
    async def __init__(self, spec: GatewaySpec, handles: dict[str, Any]) -> None:
        import uvicorn

        from serve_app.grpc_server import start_grpc_server
        from serve_app.http_server import build_http_app

        self.spec = spec
        catalog = ModelCatalog()
        by_key: dict[tuple[str, int], list[Any]] = {}
        for sv in spec.served:
            config = mc.ModelConfig.FromString(sv.config_bytes)
            catalog.add(
                ModelVersionEntry(
                    name=sv.name,
                    version=sv.version,
                    config=config,
                    signature=ModelSignature.from_config(config, str(sv.version)),
                    state=ModelState.LOADING,
                )
            )
            by_key[(sv.name, sv.version)] = [handles[d] for d in sv.deployments]
        for name, reason in spec.failed:
            catalog.add_failed(FailedModel(name, reason))
        self._handles = by_key
        self.catalog = catalog
        self.service = InferenceService(
            catalog,
            RayModelExecutor(by_key, max_inflight=spec.settings.max_inflight_per_deployment),
        )
        s = spec.settings
        self._http_sock = reuse_port_socket(s.host, s.http_port)
        config = uvicorn.Config(
            build_http_app(self.service),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=60,
        )
        self._http = uvicorn.Server(config)
        self._http_task = asyncio.get_running_loop().create_task(self._http.serve(sockets=[self._http_sock]))
        self._grpc = await start_grpc_server(self.service, s.host, s.grpc_port)
        await self._refresh_states()

    async def _refresh_states(self) -> None:
        """Ask each model deployment whether its instances loaded."""
        for (name, version), hs in self._handles.items():
            entry = self.catalog.resolve(name, str(version))
            reasons = []
            for h in hs:
                ok, reason = await h.status.remote()
                if not ok:
                    reasons.append(reason)
            entry.state = ModelState.UNAVAILABLE if reasons else ModelState.READY
            entry.reason = "; ".join(reasons)

    async def model_states(self) -> list[tuple[str, int, str, str]]:
        return [(e.name, e.version, e.state.value, e.reason) for e in self.catalog.all_entries()]

    async def check_health(self) -> None:
        if self._http_task.done():
            raise RuntimeError("HTTP server stopped")

    async def __del__(self) -> None:
        self._http.should_exit = True
        await self._grpc.stop(grace=1.0)
