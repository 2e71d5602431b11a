"""The gateway deployment: our own HTTP, gRPC and metrics servers inside a Serve replica.

Ray's HTTP/gRPC proxy would add a Ray hop per request (measured at several
milliseconds on 2 cores), so the gateway serves the v2 protocols itself on the
Triton ports (SO_REUSEPORT: several gateway replicas may share them), decodes,
validates and batches in place (each model version's scheduler lives here),
and crosses Ray once per batch to the model deployments.  See README,
"Architecture".

What it serves comes from the model manager (:class:`ServingState`): pulled at
start, pushed on every change, and long-polled in case a push was missed.  A
replaced model version is retired only after its scheduler has drained, so
a reload loses no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

from serve_app.front_ends import start_front_ends
from serve_app.hosting import InstanceLoad
from serve_app.inference.types import InferRequest, InferResponse, StreamItem
from serve_app.keys import ModelKey
from serve_app.observability import python_logging, spans
from serve_app.observability.diagnostics import Diagnostics
from serve_app.observability.log_settings import LogSettings
from serve_app.observability.trace_settings import NewSetting
from serve_app.placement import KIND_CPU, HostPool, gateway_pool
from serve_app.rayserve.console import quiet_router
from serve_app.rayserve.diagnostics import ManagerDiagnostics
from serve_app.rayserve.executor import RayModelExecutor
from serve_app.rayserve.manager_client import ManagerClient
from serve_app.rayserve.shared_host import SharedHost
from serve_app.rayserve.shutdown import StopsOnShutdown
from serve_app.service import InferenceService, ModelRegistry, ModelState, ServedModel
from serve_app.service.server_link import ServiceLink
from serve_app.service.serving_state import ServingState
from serve_app.settings import ServerSettings
from serve_app.shared_memory import DirectoryStore, SharedMemory, node_directory
from serve_app.stats import ModelStats
from serve_app.stats.on_demand import OnDemandStats
from serve_app.transport import ChannelServer

logger = logging.getLogger("serve_app")

DRAIN_TIMEOUT_S = 30.0


def _node_id() -> str:
    """This process's Ray node: what a per-node registry is keyed by (nodes may share a hostname and /tmp)."""
    import ray

    return str(ray.get_runtime_context().get_node_id())


class Gateway(StopsOnShutdown):
    # Ray Serve awaits a deployment's async __init__ (mypy wants __init__ to return None, hence the ignore)
    async def __init__(self, settings: ServerSettings, token: bytes, manager: Any, router: Any) -> None:  # type: ignore[misc]
        # A gateway asks Ray for no GPU, and Ray leaves such an actor the node's CUDA_VISIBLE_DEVICES: hide every
        # GPU, so that nothing in the gateway (its CPU instances included) opens a CUDA context on one.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self.settings = settings
        python_logging.install(settings.log_settings())
        quiet_router(settings)
        self.registry = ModelRegistry()
        self._manager = manager
        self.link = ServiceLink()  # Python models' BLS calls: from instances held here, and from other processes
        self.link.loop = asyncio.get_running_loop()
        self._token = token if settings.direct_channel else b""
        self._bls_channel: ChannelServer | None = None
        self._bls_at: tuple[str, int] | None = None
        # The node's shared CPU instances live here when the gateways hold them (no hop to them).
        self.hosting: SharedHost | None = None
        if settings.cpu_instances_in_gateway and settings.shared_hosts and settings.direct_channel:
            gateways = gateway_pool(settings)
            assert gateways is not None
            pool = HostPool("cpu", KIND_CPU, gateways[2], 0.0, in_deployment=(gateways[0], gateways[1]))
            self.hosting = SharedHost(pool, manager, devices=False, link=self.link)
            await self.hosting.start(token)
        self.executor = RayModelExecutor(
            inflight_per_instance=settings.max_inflight_per_instance,
            channel_token=token,
            direct=settings.direct_channel,
            router=router,
            on_capacity=self._capacity_changed,
            call_timeout_s=settings.instance_timeout_s,
            local=self.hosting.host if self.hosting is not None else None,
        )
        self.executor.own = ("gateway", settings.app_name)
        self.service = InferenceService(
            self.registry,
            self.executor,
            server_name=settings.server_name,
            repository=ManagerClient(manager),
            max_queued=settings.max_queue_size,
            metrics=settings.metrics_options(),
            cache=settings.response_cache(),
            rate_limits=settings.rate_limit_resources(),
            stats_source=self._cluster_stats if settings.gateway_replicas > 1 else None,
            # the gateways of a node share the registry: a region registered with one serves requests to any
            shared_memory=SharedMemory(DirectoryStore(node_directory(token, _node_id())))
            if settings.allow_client_shm
            else None,
            diagnostics=Diagnostics(settings.trace_startup(), settings.log_settings(), ManagerDiagnostics(manager)),
            strict_readiness=settings.strict_readiness,
        )
        self.link.service = self.service
        self._demands: dict[str, asyncio.Task[None]] = {}  # one load on demand per model at a time, shared
        if settings.load_on_demand:
            self.service.on_demand = self._demand
            self.service.on_demand_stats = self._on_demand_stats
        self.executor.logs = lambda: self.service.diagnostics.logs  # changes reach the models' processes
        self._apply_lock = asyncio.Lock()
        if self.hosting is not None:
            await self._take_content()
        await self.apply_state(await manager.state.remote())
        await self.apply_diagnostics(*await manager.diagnostics.remote())
        if self.hosting is not None:
            self.hosting.follow()
        self._front = await start_front_ends(self.service, settings)
        self.executor.started = True
        self._watcher = asyncio.get_running_loop().create_task(self._watch_state())

    async def _take_content(self) -> None:
        """Load the CPU instances this gateway holds before it serves, and tell the manager how it went: the
        models whose instances failed to load fail (the manager unloads them, as a failed load)."""
        assert self.hosting is not None
        revision, loads = await self._manager.hosting.remote(self.hosting.pool.name)
        statuses = await self.hosting.apply(revision, loads)
        await self._manager.hosting_taken.remote(self.hosting.pool.name, statuses)

    # -- what Python models elsewhere call (BLS and model control through the schedulers here) ---------
    async def bls_infer(self, request: InferRequest) -> InferResponse:
        return await self.link.infer(request)

    async def bls_stream(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        async with contextlib.aclosing(self.link.infer_stream(request)) as items:
            async for item in items:
                yield item

    async def bls_address(self) -> tuple[str, int] | None:
        """Where Python models in other processes send BLS requests (a direct channel; opened on first ask)."""
        if not self._token:
            return None
        if self._bls_channel is None:
            import ray

            self._bls_channel = ChannelServer(self.link.on_channel, self._token)
            self._bls_at = await self._bls_channel.start(ray.util.get_node_ip_address())
        return self._bls_at

    async def bls_load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        await self.link.load(name, config, files)

    async def bls_unload(self, name: str, unload_dependents: bool) -> None:
        await self.link.unload(name, unload_dependents)

    async def bls_is_ready(self, name: str, version: str) -> bool:
        return await self.link.is_ready(name, version)

    # -- load on demand ------------------------------------------------------------------------
    async def _demand(self, name: str) -> None:
        """Ask the manager to load ``name`` (one ask per model from this gateway) and wait until it serves here."""
        task = self._demands.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._demand_once(name))
            self._demands[name] = task
            task.add_done_callback(lambda _: self._demands.pop(name, None))
        await asyncio.shield(task)

    async def _demand_once(self, name: str) -> None:
        await self._manager.demand.remote(name)
        if not self.registry.versions(name):  # the manager's push has not landed yet: take the state now
            await self.apply_state(await self._manager.state.remote())

    async def _on_demand_stats(self) -> OnDemandStats:
        """The manager's loads and evictions, with the requests that waited here (and at the other gateways)."""
        stats: OnDemandStats = await self._manager.on_demand_stats.remote()
        answers: list[object] = [self.service.waited_for_load]
        if self.settings.gateway_replicas > 1:
            from ray import serve

            handle = serve.get_deployment_handle("gateway", self.settings.app_name)
            answers = await handle.broadcast("waited_for_load").results_async(return_exceptions=True)
        for answer in answers:
            if isinstance(answer, dict):
                for model, count in answer.items():
                    stats.of(model).waited += count
        return stats

    async def waited_for_load(self) -> dict[str, int]:
        return dict(self.service.waited_for_load)

    async def usage(self) -> dict[str, tuple[float | None, bool, int]]:
        """Each served model's use as this gateway sees it: its last request (seconds since the epoch), whether
        requests are in flight or queued, its live sequences (the manager's eviction policy reads it)."""
        return self.service.usage()

    # -- holding instances (the Serve calls a host pool answers) --------------------------------
    async def apply(self, revision: int, loads: tuple[InstanceLoad, ...]) -> dict[str, str]:
        return await self.hosting.apply(revision, loads) if self.hosting is not None else {}

    async def host_node(self) -> str:
        """The node whose instances this gateway holds ("" when it holds none)."""
        return self.hosting.node if self.hosting is not None else ""

    async def targets(self, label: str, generation: int, sequences: bool = False) -> list[tuple[str, str, int, str]]:
        return self.hosting.targets(label, generation, sequences) if self.hosting is not None else []

    async def warmup_figures(self, label: str, generation: int) -> list[tuple[int, int, int, int]]:
        return self.hosting.warmup_figures(label, generation) if self.hosting is not None else []

    async def placement(self) -> list[dict[str, object]]:
        return self.hosting.placement() if self.hosting is not None else []

    # -- what it serves ----------------------------------------------------------------------
    async def apply_state(self, state: ServingState) -> int:
        """Serve ``state`` if it is newer; returns once replaced or removed versions have drained."""
        async with self._apply_lock:
            if state.revision <= self.registry.revision:
                return self.registry.revision
            changes = self.registry.plan(state)
            for model, deployments in changes.added:
                if deployments:  # channels first: a version is served only once it can run
                    await self.executor.add_version(model.key, deployments)
            self.registry.apply(changes)
        self.service.prepare(self.registry.all_models())  # versions added, and those that became ready
        added = [model for model, _ in changes.added]
        if added:
            await self._count_warmups(added, await self._first_gateway())
        await asyncio.gather(*(self._retire(m) for m in changes.retired))
        return self.registry.revision

    async def _retire(self, model: ServedModel) -> None:
        """Let the old version's queued and in-flight batches finish, then drop its channels."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while model.scheduler is not None and not model.scheduler.drained() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.executor.remove_version(model.key)

    async def _watch_state(self) -> None:
        """Catch up with changes a push missed (this replica was starting, or a push failed)."""
        while True:
            try:
                state = await self._manager.wait_state.remote(self.registry.revision)
                await self.apply_state(state)
                await self.apply_diagnostics(*await self._manager.diagnostics.remote())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("waiting for the model manager's state failed: %s", exc)
                await asyncio.sleep(1.0)

    async def apply_diagnostics(
        self, epoch: int, updates: tuple[tuple[str, NewSetting], ...], logs: LogSettings
    ) -> None:
        """The manager's record of trace and log setting changes: apply those not applied here yet."""
        self.service.diagnostics.catch_up(epoch, updates, logs)

    def _capacity_changed(self, key: ModelKey, capacity: int) -> None:
        self.service.set_capacity(key, capacity)

    async def _first_gateway(self) -> bool:
        """With several gateways, the one of rank 0 counts the warmups (statistics are summed over all)."""
        if self.settings.gateway_replicas == 1:
            return True
        from ray import serve

        try:
            rank = serve.get_replica_context().rank
            return int(getattr(rank, "rank", rank)) == 0
        except Exception:
            return False

    async def _count_warmups(self, models: list[ServedModel], first: bool) -> None:
        """Triton counts warmup executions in the statistics: fold in what every instance ran at load.  Each
        gateway counts those of the instances it holds; the first gateway those of the other processes."""
        me = ("gateway", self.settings.app_name)
        for model in models:
            figures = self.hosting.warmup_figures(model.key.label, model.key.generation) if self.hosting else []
            for handle in self.executor.handles(model.key, skip=me) if first else ():
                call = handle.broadcast("warmup_figures", model.key.label, model.key.generation)
                answers = await call.results_async(return_exceptions=True)
                figures += [f for a in answers if isinstance(a, list) for f in a]
            if figures:
                self.service.record_warmup(model, figures)

    async def _cluster_stats(self) -> dict[ModelKey, ModelStats]:
        """Every gateway replica's figures, added up: each replica batches its own share of requests."""
        from ray import serve

        app = self.settings.app_name
        handle = serve.get_deployment_handle("gateway", app)
        parts = await handle.broadcast("local_stats").results_async(return_exceptions=True)
        total: dict[ModelKey, ModelStats] = {}
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

    async def local_stats(self) -> dict[ModelKey, ModelStats]:
        return self.service.local_stats()

    async def model_states(self) -> list[tuple[str, int | str, str, str]]:
        """Every served version's state, and the models with none served (and why)."""
        out: list[tuple[str, int | str, str, str]] = []
        for name in self.registry.names():
            versions = self.registry.versions(name)
            failed = self.registry.failed(name)
            out += [(m.name, m.version, m.state.value, m.reason) for m in versions]
            if not versions and failed is not None:
                out.append((name, "-", ModelState.UNAVAILABLE.value, failed.reason))
        return out

    async def drain(self, timeout_s: float) -> int:
        """Shutting down: answer 503 from now on and wait for the requests in progress (their count left)."""
        return await self.service.drain(timeout_s)

    async def check_health(self) -> None:
        self._front.check()
        if self.hosting is not None and not self.hosting.following:
            raise RuntimeError("the gateway stopped following the CPU instances it holds")

    async def stop_once(self) -> None:
        """Also runs after a constructor that failed half-way: stop whatever was started."""
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.cancel()
        if hasattr(self, "executor"):
            self.executor.close()
        front = getattr(self, "_front", None)
        if front is not None:
            await front.stop(grace_s=1.0)
        hosting = getattr(self, "hosting", None)
        if hosting is not None:
            await hosting.stop()
        bls = getattr(self, "_bls_channel", None)
        if bls is not None:
            bls.close()
        service = getattr(self, "service", None)
        if service is not None:  # registrations outlive a restarted replica, not the server's shutdown (drain)
            service.shared_memory.close(forget=not service.accepting)
        spans.flush(1000)  # the traces of the last requests
