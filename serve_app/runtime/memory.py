"""Freed memory goes back to the system, now and then.

glibc keeps the pages of freed buffers in its heap for reuse, and after a large one is freed it raises its
threshold for serving big allocations from the heap: after a burst of large request bodies (or an abusive
client's), a front-end process would keep hundreds of MiB it no longer uses (measured: +220 MiB after the
soak's abuse cases).  ``malloc_trim(0)`` hands the free pages back; it costs milliseconds at most, so the
front ends call it every :data:`TRIM_INTERVAL_S` seconds instead of paying for it per request (a fixed
mmap threshold would return them at once, with a page fault per page of every large body).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

logger = logging.getLogger("serve_app")

TRIM_INTERVAL_S = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def trim_free_memory() -> bool:
    """Return the heap's free pages to the system (False where the C library cannot)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


async def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Trim every ``interval_s`` seconds until cancelled (in a thread: the loop keeps serving meanwhile)."""
    if _TRIM is None:
        return
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(trim_free_memory)
        except Exception:  # never let housekeeping stop the server
            logger.debug("malloc_trim failed", exc_info=True)
