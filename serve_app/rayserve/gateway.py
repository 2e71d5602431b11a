"""The gateway deployment: our own HTTP, gRPC and metrics servers inside a Serve replica.

Ray's HTTP/gRPC proxy would add a Ray hop per request (measured at several
milliseconds on 2 cores), so the gateway serves the v2 protocols itself on the
Triton ports (SO_REUSEPORT: several gateway replicas may share them), decodes,
validates and batches in place (each model version's scheduler lives here),
and crosses Ray once per batch to the model deployments.  See README,
"Architecture".
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
from serve_app.service.catalog import FailedModel, ensemble_readiness
from serve_app.service.inference_service import StatsKey
from serve_app.settings import ServerSettings
from serve_app.stats import ModelStats

logger = logging.getLogger("serve_app")


@dataclass(frozen=True, slots=True)
class ServedVersion:
    name: str
    version: int
    config_bytes: bytes
    deployments: tuple[str, ...]  # Serve deployment names of its instance groups
    replicas: tuple[int, ...] = ()  # replicas of each deployment
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (output, class labels)


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    settings: ServerSettings
    served: tuple[ServedVersion, ...]
    failed: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (model, reason)
    channel_token: bytes = b""  # shared with the model replicas and the sequence router


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _uvicorn(app: Any, sock: socket.socket) -> tuple[Any, asyncio.Task[None]]:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=60)
    server = uvicorn.Server(config)
    return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))


class Gateway:
    async def __init__(self, spec: GatewaySpec, handles: dict[str, Any], router: Any = None) -> None:
        from serve_app.grpc_server import start_grpc_server
        from serve_app.http_server import build_http_app, build_metrics_app

        self.spec = spec
        catalog = ModelCatalog()
        groups: dict[tuple[str, int], list[tuple[str, Any, int]]] = {}
        for sv in spec.served:
            config = mc.ModelConfig.FromString(sv.config_bytes)
            catalog.add(
                ModelVersionEntry(
                    name=sv.name,
                    version=sv.version,
                    config=config,
                    signature=ModelSignature.from_config(config, str(sv.version)),
                    state=ModelState.LOADING,
                    labels=dict(sv.labels),
                )
            )
            replicas = sv.replicas or (1,) * len(sv.deployments)
            groups[(sv.name, sv.version)] = [(d, handles[d], n) for d, n in zip(sv.deployments, replicas, strict=True)]
        for name, reason in spec.failed:
            catalog.add_failed(FailedModel(name, reason))
        self._groups = groups
        self.catalog = catalog
        s = spec.settings
        self.executor = RayModelExecutor(
            groups,
            inflight_per_instance=s.max_inflight_per_instance,
            channel_token=spec.channel_token,
            direct=s.direct_channel,
            router=router,
        )
        self.service = InferenceService(catalog, self.executor)
        if s.gateway_replicas > 1:
            self.service.stats_source = self._cluster_stats
        self._http, self._http_task = _uvicorn(build_http_app(self.service), reuse_port_socket(s.host, s.http_port))
        self._metrics, self._metrics_task = _uvicorn(
            build_metrics_app(self.service), reuse_port_socket(s.host, s.metrics_port)
        )
        self._grpc = await start_grpc_server(self.service, s.host, s.grpc_port)
        await self._refresh_states()
        await self.executor.start()

    async def _refresh_states(self) -> None:
        """Ask each model deployment whether its instances loaded."""
        for (name, version), targets in self._groups.items():
            entry = self.catalog.resolve(name, str(version))
            reasons = []
            for _, handle, _ in targets:
                ok, reason = await handle.status.remote()
                if not ok:
                    reasons.append(reason)
            entry.state = ModelState.UNAVAILABLE if reasons else ModelState.READY
            entry.reason = "; ".join(reasons)
        ensemble_readiness(self.catalog)
        if self.spec.settings.gateway_replicas == 1 or await self._first_gateway():
            await self._count_warmups()

    async def _first_gateway(self) -> bool:
        """With several gateways, the one of rank 0 counts the warmups (statistics are summed over all)."""
        from ray import serve

        try:
            rank = serve.get_replica_context().rank
            return int(getattr(rank, "rank", rank)) == 0
        except Exception:
            return False

    async def _count_warmups(self) -> None:
        """Triton counts warmup executions in the statistics: fold in what every instance ran at load."""
        for (name, version), targets in self._groups.items():
            entry = self.catalog.resolve(name, str(version))
            for _, handle, _ in targets:
                answers = await handle.broadcast("warmup_figures").results_async(return_exceptions=True)
                figures = [f for a in answers if isinstance(a, list) for f in a]
                if figures:
                    self.service.record_warmup(entry, figures)

    async def _cluster_stats(self) -> dict[StatsKey, ModelStats]:
        """Every gateway replica's figures, added up: each replica batches its own share of requests."""
        from ray import serve

        app = self.spec.settings.app_name
        handle = serve.get_deployment_handle("gateway", app)
        parts = await handle.broadcast("local_stats").results_async(return_exceptions=True)
        total: dict[StatsKey, ModelStats] = {}
        for part in parts:
            if isinstance(part, BaseException):
                logger.warning("statistics of a gateway replica are missing: %s", part)
                continue
            for key, stats in part.items():
                if key in total:
                    total[key].merge(stats)
                else:
                    total[key] = stats
        return total

    async def local_stats(self) -> dict[StatsKey, ModelStats]:
        return self.service.local_stats()

    async def model_states(self) -> list[tuple[str, int, str, str]]:
        return [(e.name, e.version, e.state.value, e.reason) for e in self.catalog.all_entries()]

    async def check_health(self) -> None:
        if self._http_task.done():
            raise RuntimeError("HTTP server stopped")
        if self._metrics_task.done():
            raise RuntimeError("metrics server stopped")

    async def __del__(self) -> None:
        self._http.should_exit = True
        self._metrics.should_exit = True
        self.executor.close()
        await self._grpc.stop(grace=1.0)
