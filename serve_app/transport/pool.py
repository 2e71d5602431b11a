"""Connections to instances and the router, shared by every model version a gateway serves."""

from __future__ import annotations

import asyncio
import os

from serve_app.transport.channel import Address, ChannelBroken, ChannelClient


class ChannelPool:
    """One connection per address, opened on first use and again after it breaks."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._clients: dict[Address, ChannelClient] = {}
        self._locks: dict[Address, asyncio.Lock] = {}

    async def get(self, address: Address) -> ChannelClient:
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
            except ChannelBroken:  # the handshake failed
                raise
            except (OSError, asyncio.TimeoutError) as exc:
                # errno's words only: asyncio's message (str, strerror) names the address
                errno = getattr(exc, "errno", None)
                why = os.strerror(errno) if isinstance(errno, int) else type(exc).__name__
                raise ChannelBroken(f"cannot reach the channel's peer: {why}") from None
            self._clients[address] = client
            return client

    def peek(self, address: Address) -> ChannelClient | None:
        """The open connection to ``address``, if there is one (no waiting)."""
        client = self._clients.get(address)
        return client if client is not None and not client.closed else None

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
