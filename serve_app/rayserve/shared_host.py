"""A shared host: one process's part in a host pool, its instance host, its channel, and the pool's content
it follows.

Every host of a pool holds the same content: the model manager pushes it
(``apply``), and a host that starts later, or restarts, fetches it with a long
poll on the manager, as gateways follow the serving state.  The host's one
channel carries every instance's batches, steps and polls.  A pool's own
replicas (``host_replica.py``) are shared hosts and nothing else; a gateway
that holds its node's CPU instances is one too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any

import ray

from serve_app.hosting import HostedInstance, InstanceHost, InstanceLoad
from serve_app.placement import HostPool
from serve_app.rayserve.gateway_link import GatewayLink
from serve_app.rayserve.model_replica import set_visible_devices
from serve_app.transport import ChannelServer

logger = logging.getLogger("serve_app")


class SharedHost:
    def __init__(self, pool: HostPool, manager: Any, *, devices: bool = True, link: Any = None) -> None:
        """``devices``: set ``CUDA_VISIBLE_DEVICES`` for the pool's kind (a process that only hosts); ``link``:
        what Python models held here call the server through."""
        self.pool = pool
        gpu_ids = set_visible_devices(pool.kind, pool.device) if devices else ()
        self.link = link
        self.host = InstanceHost(uuid.uuid4().hex[:12], gpu_ids, self.link)
        self.revision = -1
        self._manager = manager
        self._statuses: dict[str, str] = {}
        self._applying = asyncio.Lock()  # a push and the long poll may bring the same content at once
        self._channel: ChannelServer | None = None
        self.address: tuple[str, int] = ("", 0)
        self._token = b""
        self._node = ""
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, token: bytes) -> None:
        """Open the channel that reaches the instances held here."""
        if isinstance(self.link, GatewayLink):
            self.link.bind(asyncio.get_running_loop())
        self._channel = ChannelServer(self.host.on_channel, token)
        self.address = await self._channel.start(ray.util.get_node_ip_address())
        self._token = token
        self._node = ray.get_runtime_context().get_node_id()

    @property
    def node(self) -> str:
        """The address of the node this host runs on (loads placed on one node name it)."""
        return self.address[0]

    def follow(self) -> None:
        """Keep up with the pool's content from now on (a long poll on the manager)."""
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    @property
    def following(self) -> bool:
        return self._watcher is not None and not self._watcher.done()

    async def apply(self, revision: int, loads: tuple[InstanceLoad, ...]) -> dict[str, str]:
        """Hold ``loads`` meant for this node (if ``revision`` is newer than what is held); each held group's
        load error ("": loaded)."""
        async with self._applying:
            if revision > self.revision:
                self._statuses = await self.host.apply([load for load in loads if load.held_on(self.node)])
                self.revision = revision
            return dict(self._statuses)

    async def _watch(self) -> None:
        while True:
            try:
                revision, loads = await self._manager.wait_hosting.remote(self.pool.name, self.revision)
                await self.apply(revision, loads)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("host %s: waiting for its content failed: %s", self.pool.name, exc)
                await asyncio.sleep(1.0)

    def _held(self, label: str, generation: int) -> list[HostedInstance]:
        return [i for i in self.host.instances() if i.key.label == label and i.key.generation == generation]

    def targets(self, label: str, generation: int, sequences: bool = False) -> list[tuple[str, str, int, str]]:
        """(instance id, host, port, lane) of the instances of one load of one model version held here (with
        ``sequences``, only loaded sequence instances, for the sequence router).  ``lane``: "<node id>:<Unix
        socket path>" where gateways on this node send the instance's batches straight to its thread ("" when
        it has none)."""
        host, port = self.address
        found = []
        for i in self._held(label, generation):
            if sequences and i.sequence is None:
                continue
            path = i.open_lane(self._token)
            found.append((i.id, host, port, f"{self._node}:{path}" if path else ""))
        return found

    def warmup_figures(self, label: str, generation: int) -> list[tuple[int, int, int, int]]:
        """What the warmups of that model version's instances here executed (Triton counts them)."""
        return [f for i in self._held(label, generation) for f in i.warmup_figures]

    def placement(self) -> list[dict[str, object]]:
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

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self.host.stop(unloading=False)
        if self._channel is not None:
            self._channel.close()
