"""InflightLimiter (an ensemble step's max_inflight_requests): slots first come first served, a cancelled
waiter takes none (and passes on one handed to it), a wait past the timeout starts anyway as Triton's does."""

from __future__ import annotations

import asyncio
import logging

import pytest

from serve_app.scheduling.inflight_limiter import InflightLimiter


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_requests_over_the_limit_wait_and_get_freed_slots_in_arrival_order() -> None:
    limiter = InflightLimiter(2)
    await limiter.acquire("e", 0)
    await limiter.acquire("e", 0)
    order: list[int] = []

    async def take(n: int) -> None:
        await limiter.acquire("e", 0)
        order.append(n)

    waiters = [asyncio.ensure_future(take(n)) for n in range(3)]
    await settle()
    assert order == [] and limiter.waiting == 3 and limiter.inflight == 2
    limiter.release()
    await settle()
    assert order == [0] and limiter.inflight == 2
    limiter.release()
    limiter.release()
    await settle()
    assert order == [0, 1, 2] and limiter.inflight == 2 and limiter.waiting == 0
    await asyncio.gather(*waiters)


async def test_a_cancelled_waiter_takes_no_slot() -> None:
    limiter = InflightLimiter(1)
    await limiter.acquire("e", 0)
    first = asyncio.ensure_future(limiter.acquire("e", 0))
    second = asyncio.ensure_future(limiter.acquire("e", 0))
    await settle()
    first.cancel()
    await settle()
    limiter.release()
    await settle()
    assert second.done() and first.cancelled() and limiter.inflight == 1


async def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on() -> None:
    limiter = InflightLimiter(1)
    await limiter.acquire("e", 0)
    first = asyncio.ensure_future(limiter.acquire("e", 0))
    second = asyncio.ensure_future(limiter.acquire("e", 0))
    await settle()
    limiter.release()  # hands the slot to the first waiter...
    first.cancel()  # ...which is cancelled before it runs
    await settle()
    assert first.cancelled() and second.done() and limiter.inflight == 1


async def test_a_wait_past_the_timeout_starts_anyway_with_an_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    limiter = InflightLimiter(1, timeout_s=0.01)
    await limiter.acquire("ens", 1)
    with caplog.at_level(logging.ERROR, logger="serve_app"):
        await asyncio.wait_for(limiter.acquire("ens", 1), 60)
    assert limiter.inflight == 2
    assert "Ensemble 'ens' unable to schedule step 1 (inflight: 1 >= limit: 1)" in caplog.text
    limiter.release()
    limiter.release()
    assert limiter.inflight == 0


async def test_no_limit_never_waits() -> None:
    limiter = InflightLimiter(0)
    for _ in range(100):
        await limiter.acquire("e", 0)
    limiter.release()
    assert limiter.inflight == 0 and limiter.waiting == 0
