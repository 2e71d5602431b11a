"""Calls and one-way posts to the sequence router, over a channel, retried while it is unreachable.

The router's address is resolved again (through the callable given, a Serve
call in the gateway) whenever its channel breaks, so a restarted router is
found without restarting gateways.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from serve_app.errors import Unavailable
from serve_app.transport.channel import ChannelBroken
from serve_app.transport.pool import ChannelPool

logger = logging.getLogger("serve_app")

ROUTER_RETRY_S = 60.0  # how long a call waits for an unreachable router (e.g. while Ray restarts it)


class RouterClient:
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
                self._address = cast(tuple[str, int], tuple(await self._resolve()))  # tuple() loses the pair type
            client = await self._pool.get(self._address)
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
                    self._address = cast(tuple[str, int], tuple(await self._resolve()))  # tuple() loses the pair type
                client = await self._pool.get(self._address)
                return await client.call(message)
            except ChannelBroken as exc:
                self._address = None
                if time.monotonic() > deadline:
                    raise Unavailable(f"the sequence router is unavailable: {exc.message}") from None
                logger.warning("sequence router unreachable (%s); retrying", exc.message)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
