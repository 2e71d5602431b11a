"""Freed memory handed back to the system by the front ends' periodic trim."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serve_app.runtime import memory


def test_trim_runs_where_the_c_library_has_it() -> None:
    assert memory.trim_free_memory() is (memory._TRIM is not None)


async def test_periodic_trim_calls_the_c_library_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = threading.Semaphore(0)

    def recorded(pad: int) -> int:
        assert pad == 0
        calls.release()
        return 1

    monkeypatch.setattr(memory, "_TRIM", recorded)
    task = asyncio.get_running_loop().create_task(memory.trim_periodically(0.001))
    for _ in range(2):
        assert await asyncio.to_thread(calls.acquire, True, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
