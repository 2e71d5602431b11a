"""A shared host: one Serve replica holding instances of many models (a host pool's deployment).

All it does is hold its pool's content (``shared_host.py``): the model manager
pushes it, a replica Serve starts later or restarts fetches it.
"""

from __future__ import annotations

from typing import Any

from serve_app.hosting import InstanceLoad
from serve_app.observability import python_logging
from serve_app.placement import HostPool
from serve_app.rayserve.gateway_link import GatewayLink
from serve_app.rayserve.shared_host import SharedHost
from serve_app.rayserve.shutdown import StopsOnShutdown


class HostReplica(StopsOnShutdown):
    # Ray Serve awaits a deployment's async __init__ (mypy wants __init__ to return None, hence the ignore)
    async def __init__(self, pool: HostPool, token: bytes, manager: Any, server_app: str) -> None:  # type: ignore[misc]
        """``server_app``: the server's Serve application (its gateways answer Python models' BLS calls)."""
        python_logging.install_from_env()  # the models' log (pb_utils.Logger) as the server's settings say
        # SharedHost sets the process's devices first
        self.hosting = SharedHost(pool, manager, link=GatewayLink(server_app, token))
        await self.hosting.start(token)
        self.hosting.follow()

    async def apply(self, revision: int, loads: tuple[InstanceLoad, ...]) -> dict[str, str]:
        return await self.hosting.apply(revision, loads)

    async def host_node(self) -> str:
        return self.hosting.node

    async def targets(self, label: str, generation: int, sequences: bool = False) -> list[tuple[str, str, int, str]]:
        return self.hosting.targets(label, generation, sequences)

    async def warmup_figures(self, label: str, generation: int) -> list[tuple[int, int, int, int]]:
        return self.hosting.warmup_figures(label, generation)

    async def placement(self) -> list[dict[str, object]]:
        return self.hosting.placement()

    async def check_health(self) -> None:
        if not self.hosting.following:
            raise RuntimeError("the host stopped following its content")

    async def stop_once(self) -> None:
        await self.hosting.stop()
