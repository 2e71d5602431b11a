"""Serve's shutdown hook for deployments that stop asynchronously.

Serve stops a replica by calling its ``__del__`` and awaiting the coroutine that call returns; Python's
garbage collector calls the same method later and drops what it returns.  An ``async def __del__`` hands
the collector a coroutine that is never awaited, so here ``__del__`` returns ``stop()`` only while the stop
has not begun and an event loop runs the caller (Serve's case), and nothing otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class StopsOnShutdown:
    """A deployment whose ``stop_once`` runs once: from Serve's ``__del__`` or from ``stop`` (tests, callers)."""

    _stop_begun = False

    async def stop_once(self) -> None:
        """Release what the deployment holds; subclasses define it."""

    async def stop(self) -> None:
        """Stop now; a second call, or Serve's ``__del__`` after it, does nothing."""
        if self._stop_begun:
            return
        self._stop_begun = True
        await self.stop_once()

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        if self._stop_begun:
            return None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self.stop()
