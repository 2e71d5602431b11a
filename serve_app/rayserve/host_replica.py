"""A shared host: one Serve replica holding instances of many models (a pool's deployment).

Every host of a pool holds the same content, which the model manager pushes
(``apply``) and which a host Serve starts later, or restarts, fetches itself
(a long poll on the manager, as gateways follow the serving state).  The
host's one channel carries every instance's batches, steps and polls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import ray

from serve_app.hosting import InstanceHost, InstanceLoad
from serve_app.placement import HostPool
from serve_app.rayserve.model_replica import set_visible_devices
from serve_app.transport import ChannelServer

logger = logging.getLogger("serve_app")

WATCH_TIMEOUT_S = 10.0


class HostReplica:
    # Ray Serve awaits a deployment's async __init__ (mypy wants __init__ to return None, hence the ignore)
    async def __init__(self, pool: HostPool, token: bytes, manager: Any) -> None:  # type: ignore[misc]
        self.pool = pool
        gpu_ids = set_visible_devices(pool.kind, pool.device)  # before anything initialises CUDA here
        self.host = InstanceHost(uuid.uuid4().hex[:12], gpu_ids)
        self._manager = manager
        self._revision = -1
        self._channel = ChannelServer(self.host.on_channel, token)
        self._address = await self._channel.start(ray.util.get_node_ip_address())
        self._statuses: dict[str, str] = {}
        self._applying = asyncio.Lock()  # a push and the long poll may bring the same content at once
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def apply(self, revision: int, loads: tuple[InstanceLoad, ...]) -> dict[str, str]:
        """Hold ``loads`` (if ``revision`` is newer than what is held); each group's load error ("": loaded)."""
        async with self._applying:
            if revision > self._revision:
                self._statuses = await self.host.apply(list(loads))
                self._revision = revision
            return dict(self._statuses)

    async def _watch(self) -> None:
        """Follow the pool's content: a host started after the manager pushed it gets it here."""
        while True:
            try:
                revision, loads = await self._manager.wait_hosting.remote(self.pool.name, self._revision)
                await self.apply(revision, loads)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("host %s: waiting for its content failed: %s", self.pool.name, exc)
                await asyncio.sleep(1.0)

    async def targets(self, label: str, generation: int, sequences: bool = False) -> list[tuple[str, str, int]]:
        """(instance id, host, port) of the instances of one load of one model version held here (with
        ``sequences``, only loaded sequence instances, for the sequence router)."""
        host, port = self._address
        return [
            (i.id, host, port)
            for i in self.host.instances()
            if i.key.label == label and i.key.generation == generation and (not sequences or i.sequence is not None)
        ]

    async def warmup_figures(self, label: str, generation: int) -> list[tuple[int, int, int, int]]:
        """What the warmups of that model version's instances here executed (Triton counts them)."""
        return [
            f
            for i in self.host.instances()
            if i.key.label == label and i.key.generation == generation
            for f in i.warmup_figures
        ]

    async def placement(self) -> list[dict[str, object]]:
        """Where each instance held here runs (for operators and tests)."""
        ctx = ray.get_runtime_context()
        return [
            {
                "model": i.key.name,
                "version": i.key.version,
                "group": i.load.spec.group_name,
                "instance_name": i.name,
                "kind": i.load.kind,
                "device": self.pool.device,
                "gpu_ids": list(self.host.gpu_ids),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "node_id": ctx.get_node_id(),
                "node_ip": ray.util.get_node_ip_address(),
                "host": self.host.host_id,
                "loaded": i.instance is not None,
            }
            for i in self.host.instances()
        ]

    async def check_health(self) -> None:
        if self._watcher.done():
            raise RuntimeError("the host stopped following its content")

    async def __del__(self) -> None:
        self._watcher.cancel()
        await self.host.stop(unloading=False)
        self._channel.close()
