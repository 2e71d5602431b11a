"""The model manager's side of shared hosting: the host pools' Serve applications and their content.

Each pool (``placement/pools.py``) is one Serve application of its own with
one deployment of :class:`~serve_app.rayserve.host_replica.HostReplica`.
The manager keeps each pool's *content*, the instance groups of the served
model versions placed there, under a revision: a change is pushed to every
host of the pool (a broadcast that returns once each host has loaded or
removed what changed, with each group's load error), and a host that starts
later fetches it with a long poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray import serve

from serve_app.hosting import InstanceHost, InstanceLoad
from serve_app.placement import HostPool
from serve_app.settings import ServerSettings

logger = logging.getLogger("ray.serve")

WATCH_TIMEOUT_S = 10.0


class PoolContent:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.deployed: dict[str, HostPool] = {}  # pools whose application runs
        self._content: dict[str, dict[str, InstanceLoad]] = {}  # pool -> group id -> load
        self.revision = time.time_ns() // 1_000_000  # grows across manager restarts too
        self._changed = asyncio.Condition()
        # Groups put in a pool none of whose hosts runs yet (gateways that are starting): they load them as
        # they start, and say how it went (ModelManager.hosting_taken).
        self.awaiting: set[str] = set()

    def app_name(self, pool: HostPool) -> str:
        if pool.in_deployment is not None:
            return pool.in_deployment[1]
        return f"{self.settings.app_name}--{pool.deployment}"

    def bound(self, pool: HostPool, token: bytes, manager: Any, options: dict[str, Any]) -> Any:
        """The pool's application, to run (``options``: its deployment's Serve options)."""
        from serve_app.rayserve.host_replica import HostReplica

        return (
            serve.deployment(HostReplica)
            .options(name=pool.deployment, **options)
            .bind(pool, token, manager, self.settings.app_name)
        )

    # -- content -----------------------------------------------------------------------
    def content(self, pool: str) -> tuple[int, tuple[InstanceLoad, ...]]:
        return self.revision, tuple(self._content.get(pool, {}).values())

    async def wait(
        self, pool: str, revision: int, timeout_s: float = WATCH_TIMEOUT_S
    ) -> tuple[int, tuple[InstanceLoad, ...]]:
        """The pool's content once the revision passes ``revision`` (a long poll), or after the timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.revision > revision), timeout_s)
            except asyncio.TimeoutError:
                pass
        return self.content(pool)

    async def add(self, loads: dict[str, list[InstanceLoad]], timeout_s: float) -> dict[str, str]:
        """Put ``loads`` (by pool) in their pools and wait until every host holds them; returns each group's
        load error ("": loaded everywhere), keyed by group id."""
        for pool, group in loads.items():
            for load in group:
                self._content.setdefault(pool, {})[InstanceHost.group_id(load)] = load
        await self._bump()
        wanted = {InstanceHost.group_id(load) for group in loads.values() for load in group}
        answers = await asyncio.gather(*(self._push(pool, timeout_s) for pool in loads))
        errors: dict[str, str] = dict.fromkeys(wanted, "")
        for pool, (replies, problem) in zip(loads, answers, strict=True):
            for load in loads[pool]:
                gid = InstanceHost.group_id(load)
                if problem:
                    errors[gid] = problem
                    continue
                if not replies:
                    self.awaiting.add(gid)
                for reply in replies:
                    if reply.get(gid):
                        errors[gid] = reply[gid]
                        break
                if load.nodes and replies and not any(gid in reply for reply in replies):
                    errors[gid] = f"no host of pool '{pool}' on node {', '.join(load.nodes)} took it"
        return errors

    async def nodes_of(self, deployment: str, app: str) -> list[str]:
        """The addresses of the nodes the running hosts of a pool (its deployment and application) are on (none
        known: an empty list)."""
        try:
            handle = serve.get_deployment_handle(deployment, app)
            answers = await handle.broadcast("host_node").results_async(return_exceptions=True)
        except Exception as exc:
            logger.info("the nodes of %s's hosts are not known: %s", deployment, exc)
            return []
        return sorted({a for a in answers if isinstance(a, str) and a})

    async def remove(self, group_ids: set[str], timeout_s: float) -> None:
        """Take groups out of their pools; returns once the hosts have stopped their instances."""
        pools = [p for p, groups in self._content.items() if group_ids & set(groups)]
        for pool in pools:
            for gid in group_ids & set(self._content[pool]):
                del self._content[pool][gid]
        if pools:
            await self._bump()
            await asyncio.gather(*(self._push(pool, timeout_s) for pool in pools))

    async def _bump(self) -> None:
        self.revision += 1
        async with self._changed:
            self._changed.notify_all()

    async def _push(self, pool: str, timeout_s: float) -> tuple[list[dict[str, str]], str]:
        """The content to every host of ``pool``: (each host's statuses, a problem that left none).

        Gateways that hold instances themselves may not run yet (the server is starting, or Serve is
        replacing one): they load the content as they start and report how it went (``hosting_taken``),
        so finding none is not a failure there."""
        spec = self.deployed.get(pool)
        if spec is None:
            return [], f"its host pool '{pool}' is not running"
        revision, loads = self.content(pool)
        pending_ok = spec.in_deployment is not None
        try:
            handle = serve.get_deployment_handle(spec.deployment, self.app_name(spec))
            call = handle.broadcast("apply", revision, loads).results_async(return_exceptions=True)
            answers = await asyncio.wait_for(call, timeout_s)
        except asyncio.TimeoutError:
            return [], f"its hosts did not load it within {timeout_s:g}s"
        except Exception as exc:
            return [], "" if pending_ok else f"its hosts could not be reached: {exc}"
        replies = [a for a in answers if isinstance(a, dict)]
        failed = [a for a in answers if isinstance(a, BaseException)]
        for problem in failed:
            logger.warning("a host of pool %s did not take revision %d: %s", pool, revision, problem)
        if not replies and not pending_ok:
            return [], "no host of its pool answered"
        return replies, ""

    def models_of(self, pool: str, group_ids: set[str]) -> dict[str, str]:
        """group id -> its model, for groups of ``pool``."""
        return {g: load.key.name for g, load in self._content.get(pool, {}).items() if g in group_ids}
