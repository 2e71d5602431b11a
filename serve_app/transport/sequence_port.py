"""A gateway's way to the sequence router and to sequence instances, over direct channels.

Steps go straight to the instance that holds their sequence (one write on a
connection shared by every sequence of that instance); only STARTs and steps
whose place the gateway does not know ask the router.  The router's address
is resolved again (through Serve) whenever its channel breaks, so a restarted
router is found without restarting gateways.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from serve_app.errors import Unavailable
from serve_app.inference.sequence import (
    Assignment,
    AssignRequest,
    CorrId,
    LookupRequest,
    RecoverRequest,
    Recovery,
    SequenceStep,
    StateBackup,
    StateBackups,
    StepResult,
)
from serve_app.transport.channel import ChannelBroken, ChannelClient

logger = logging.getLogger("serve_app")

ROUTER_RETRY_S = 60.0  # how long a call waits for an unreachable router (e.g. while Ray restarts it)


class ChannelPool:
    """One connection per address, opened on first use and again after it breaks."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._clients: dict[tuple[str, int], ChannelClient] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def get(self, address: tuple[str, int]) -> ChannelClient:
        client = self._clients.get(address)
        if client is not None and not client.closed:
            return client
        lock = self._locks.setdefault(address, asyncio.Lock())
        async with lock:
            client = self._clients.get(address)
            if client is not None and not client.closed:
                return client
            client = ChannelClient(address)
            try:
                await client.connect(self._token)
            except (OSError, asyncio.TimeoutError) as exc:
                raise ChannelBroken(f"cannot reach {address[0]}:{address[1]}: {exc}") from None
            self._clients[address] = client
            return client

    def peek(self, address: tuple[str, int]) -> ChannelClient | None:
        """The open connection to ``address``, if there is one (no waiting)."""
        client = self._clients.get(address)
        return client if client is not None and not client.closed else None

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


class RouterLink:
    """Calls to the sequence router, retried while it is unreachable."""

    def __init__(self, resolve: Callable[[], Awaitable[tuple[str, int]]], pool: ChannelPool) -> None:
        self._resolve = resolve
        self._pool = pool
        self._address: tuple[str, int] | None = None
        self._posts: set[asyncio.Task[None]] = set()

    def post(self, message: Any) -> None:
        """Send ``message`` without waiting for its answer, in order with calls on the same connection.  If
        the router is unreachable now it is dropped (what it carries must not be needed; see state backups)."""
        client = self._pool.peek(self._address) if self._address is not None else None
        if client is None:
            task = asyncio.get_running_loop().create_task(self._post_later(message))
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)
            return
        try:
            client.post(message)
        except ChannelBroken:
            self._address = None

    async def _post_later(self, message: Any) -> None:
        try:
            if self._address is None:
                self._address = tuple(await self._resolve())  # type: ignore[assignment]
            client = await self._pool.get(self._address)  # type: ignore[arg-type]
            client.post(message)
        except ChannelBroken as exc:
            self._address = None  # resolved again next time: a restarted router listens elsewhere
            logger.debug("posting to the sequence router failed: %s", exc.message)
        except Exception as exc:
            logger.debug("posting to the sequence router failed: %s", exc)

    async def call(self, message: Any) -> Any:
        deadline = time.monotonic() + ROUTER_RETRY_S
        delay = 0.05
        while True:
            try:
                if self._address is None:
                    self._address = tuple(await self._resolve())  # type: ignore[assignment]
                client = await self._pool.get(self._address)  # type: ignore[arg-type]
                return await client.call(message)
            except ChannelBroken as exc:
                self._address = None
                if time.monotonic() > deadline:
                    raise Unavailable(f"the sequence router is unavailable: {exc.message}") from None
                logger.warning("sequence router unreachable (%s); retrying", exc.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class ChannelSequencePort:
    """:class:`~serve_app.scheduling.sequence_scheduler.SequencePort` for one model version."""

    def __init__(self, key: str, router: RouterLink, pool: ChannelPool) -> None:
        self._key = key
        self._router = router
        self._pool = pool
        self._backups: list[StateBackup] = []

    def backup(self, backup: StateBackup) -> None:
        """Pass a step's state on to the router; the backups of one event-loop turn travel as one message."""
        if not self._backups:
            asyncio.get_running_loop().call_soon(self._flush)
        self._backups.append(backup)

    def _flush(self) -> None:
        backups, self._backups = tuple(self._backups), []
        self._router.post(StateBackups(self._key, backups))

    async def assign(self, corr_id: CorrId) -> Assignment:
        result: Assignment = await self._router.call(AssignRequest(self._key, corr_id))
        return result

    async def lookup(self, corr_id: CorrId) -> Assignment:
        result: Assignment = await self._router.call(LookupRequest(self._key, corr_id))
        return result

    async def recover(self, corr_id: CorrId, failed_instance: str, step_id: int) -> Recovery:
        result: Recovery = await self._router.call(RecoverRequest(self._key, corr_id, failed_instance, step_id))
        return result

    async def dispatch(self, assignment: Assignment, step: SequenceStep) -> asyncio.Future[StepResult]:
        client = await self._pool.get(assignment.address)
        return client.send(step)
