"""ModelExecutor for the gateway: one call per batch, to the least busy model instance.

Calls go over each instance's direct channel (serve_app.transport) when the
gateway holds one, else through the deployment's Serve handle.  The gateway
learns the channel addresses with a Serve broadcast when a model version is
added, every ``REFRESH_S`` seconds (new or replaced replicas; more often for
autoscaled ones), and soon after a channel fails.  A batch whose channel
breaks mid-call fails with UNAVAILABLE: it is not re-run, as its instance may
have executed it.  A batch a stopping instance refused (``Draining``) never
ran, so it goes to another instance.

Model versions come and go as the model manager loads and unloads them; each
is keyed by (model, version, generation), so a reload's new instances serve
beside the old ones until the old scheduler has drained.

Sequence models always use channels (a step must reach one particular
replica, which a Serve handle call can't name): their ports ask the sequence
router for places and send steps straight to the instances.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from serve_app.errors import Draining, InternalError, Unavailable
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.keys import ModelKey
from serve_app.sequence.port import ChannelSequencePort
from serve_app.service.serving_state import DeploymentRef
from serve_app.transport import ChannelClient
from serve_app.transport.pool import ChannelPool
from serve_app.transport.router_client import RouterClient

logger = logging.getLogger("serve_app")

REFRESH_S = 10.0
AUTOSCALED_REFRESH_S = 2.0  # replicas come and go: find new ones quickly
RETRY_REFRESH_S = 1.0
MAX_DRAINING_RETRIES = 4


class _Group:
    """One Serve deployment (an instance group) of a model version, and channels to its replicas."""

    def __init__(self, name: str, handle: Any, replicas: int, autoscaled: bool = False) -> None:
        self.name = name
        self.handle = handle
        self.replicas = max(1, replicas)
        self.autoscaled = autoscaled
        self.serve_inflight = 0
        self.clients: dict[tuple[str, int], ChannelClient] = {}
        self.refreshed_at = 0.0
        self.refreshing: asyncio.Task[None] | None = None

    def load(self) -> float:
        return (self.serve_inflight + sum(c.inflight for c in self.clients.values())) / self.replicas

    def live(self) -> int:
        """Replicas it can take batches on now (the starting count until channels are known)."""
        open_clients = sum(1 for c in self.clients.values() if not c.closed)
        return open_clients if self.autoscaled and open_clients else self.replicas

    def pick(self) -> ChannelClient | None:
        best: ChannelClient | None = None
        for c in self.clients.values():
            if not c.closed and (best is None or c.inflight < best.inflight):
                best = c
        return best


class RayModelExecutor:
    def __init__(
        self,
        *,
        inflight_per_instance: int,
        channel_token: bytes = b"",
        direct: bool = True,
        router: Any = None,
        on_capacity: Callable[[ModelKey, int], None] | None = None,
        call_timeout_s: float = 0.0,
    ) -> None:
        """``direct``: batches go over channels (else Serve handles); ``router``: the sequence router's
        handle; ``on_capacity``: told when a version's instance count changes (autoscaling)."""
        self._groups: dict[ModelKey, list[_Group]] = {}
        self._per_instance = max(1, inflight_per_instance)
        self._token = channel_token if direct else b""
        self._refresher: asyncio.Task[None] | None = None
        self._pool = ChannelPool(channel_token)
        self._router = RouterClient(self._router_address, self._pool) if router is not None else None
        self._router_handle = router
        self._on_capacity = on_capacity
        self._call_timeout = call_timeout_s if call_timeout_s > 0 else None

    async def _router_address(self) -> tuple[str, int]:
        address: tuple[str, int] = await self._router_handle.address.remote()
        return address

    def sequence_port(self, key: ModelKey) -> ChannelSequencePort:
        if self._router is None:
            raise InternalError(f"model '{key.name}' has sequence batching but no sequence router runs")
        return ChannelSequencePort(key.label, self._router, self._pool)

    async def add_version(self, key: ModelKey, refs: tuple[DeploymentRef, ...]) -> None:
        """Serve a model version's deployments: open channels to their replicas."""
        from ray import serve

        groups = [_Group(r.name, serve.get_deployment_handle(r.name, r.app), r.replicas, r.autoscaled) for r in refs]
        self._groups[key] = groups
        if self._token:
            await asyncio.gather(*(self._refresh(g) for g in groups))
        if self._refresher is None and self._token:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    def remove_version(self, key: ModelKey) -> None:
        for g in self._groups.pop(key, ()):
            for c in g.clients.values():
                c.close()

    def handles(self, key: ModelKey) -> list[Any]:
        return [g.handle for g in self._groups.get(key, ())]

    def instances(self, key: ModelKey) -> int:
        """Instances of the version this gateway can reach now (channels; the planned count without)."""
        return sum(g.live() if self._token else g.replicas for g in self._groups.get(key, ()))

    def capacity(self, key: ModelKey) -> int:
        return sum(g.live() for g in self._groups.get(key, ())) * self._per_instance

    async def execute(self, key: ModelKey, executions: list[Execution]) -> list[ExecutionResult]:
        groups = self._groups.get(key)
        if not groups:
            raise InternalError(f"no deployment serves model '{key.name}' version {key.version}")
        group = groups[0] if len(groups) == 1 else min(groups, key=_Group.load)
        for _ in range(MAX_DRAINING_RETRIES):
            client = group.pick() if self._token else None
            if client is None:
                break
            try:
                result: list[ExecutionResult] = await asyncio.wait_for(client.call(executions), self._call_timeout)
                return result
            except asyncio.TimeoutError:
                # A hung instance (a dead one breaks its channel at once): its callers don't wait for ever.
                self._refresh_soon(group)
                raise Unavailable(
                    f"model '{key.name}' version {key.version}: its instance did not answer within "
                    f"{self._call_timeout:g}s"
                ) from None
            except Draining:
                # Stopping (scaled down or replaced) before it ran the batch: another instance takes it.
                client.close()
                group.clients = {a: c for a, c in group.clients.items() if c is not client}
                self._refresh_soon(group)
            except Unavailable:
                self._refresh_soon(group)
                raise
        if self._token:
            self._refresh_soon(group)
        group.serve_inflight += 1
        try:
            result = await asyncio.wait_for(group.handle.execute.remote(executions), self._call_timeout)
            return result
        except asyncio.TimeoutError:
            raise Unavailable(
                f"model '{key.name}' version {key.version}: its instance did not answer within {self._call_timeout:g}s"
            ) from None
        finally:
            group.serve_inflight -= 1

    # -- channel upkeep -------------------------------------------------------------
    def _refresh_soon(self, group: _Group) -> None:
        if group.refreshing is not None or time.monotonic() - group.refreshed_at < RETRY_REFRESH_S:
            return
        group.refreshing = asyncio.get_running_loop().create_task(self._refresh(group))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(AUTOSCALED_REFRESH_S)
            now = time.monotonic()
            for key, gs in list(self._groups.items()):
                before = sum(g.live() for g in gs)
                for g in gs:
                    due = AUTOSCALED_REFRESH_S if g.autoscaled else REFRESH_S
                    if now - g.refreshed_at < due or g.refreshing is not None:
                        continue
                    try:
                        await self._refresh(g)
                    except Exception:
                        logger.exception("refreshing the channels of %s failed", g.name)
                after = sum(g.live() for g in gs)
                if after != before and self._on_capacity is not None and key in self._groups:
                    self._on_capacity(key, after * self._per_instance)

    async def _refresh(self, group: _Group) -> None:
        try:
            group.refreshed_at = time.monotonic()
            answers = await group.handle.broadcast("channel_address").results_async(return_exceptions=True)
            live = {tuple(a) for a in answers if isinstance(a, (tuple, list)) and len(a) == 2}
            for addr, client in list(group.clients.items()):
                if client.closed or addr not in live:
                    client.close()
                    del group.clients[addr]
            for addr in live - set(group.clients):
                client = ChannelClient((str(addr[0]), int(addr[1])))
                try:
                    await client.connect(self._token)
                except (OSError, asyncio.TimeoutError) as exc:
                    logger.warning("no channel to %s replica at %s: %s", group.name, addr, exc)
                    continue
                group.clients[addr] = client
        finally:
            group.refreshed_at = time.monotonic()
            group.refreshing = None

    def close(self) -> None:
        self._pool.close()
        if self._refresher is not None:
            self._refresher.cancel()
        for gs in self._groups.values():
            for g in gs:
                for c in g.clients.values():
                    c.close()
