"""The coalescer: at most max_inflight calls; waiting requests share the next call."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.errors import InvalidArgument, ServeError, Unavailable
from serve_app.scheduling.coalescer import Coalescer


class GatedSend:
    """A send function whose calls complete only when the test releases them."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gates: list[asyncio.Event] = []

    async def __call__(self, batch: list[int]) -> list[int | ServeError]:
        self.calls.append(batch)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return [InvalidArgument(f"bad {x}") if x < 0 else x * 10 for x in batch]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_single_request_leaves_at_once() -> None:
    send = GatedSend()
    c: Coalescer[int, int] = Coalescer(send, max_inflight=2)
    task = asyncio.create_task(c.submit(1))
    await settle()
    assert send.calls == [[1]]
    send.gates[0].set()
    assert await task == 10


async def test_requests_beyond_inflight_share_the_next_call() -> None:
    send = GatedSend()
    c: Coalescer[int, int] = Coalescer(send, max_inflight=2)
    tasks = [asyncio.create_task(c.submit(i)) for i in range(6)]
    await settle()
    assert send.calls == [[0], [1]]
    assert c.pending == 4
    send.gates[0].set()
    await settle()
    assert send.calls[2] == [2, 3, 4, 5]
    for g in send.gates:
        g.set()
    assert await asyncio.gather(*tasks) == [0, 10, 20, 30, 40, 50]
    assert c.inflight == 0


async def test_per_request_errors_stay_per_request() -> None:
    send = GatedSend()
    c: Coalescer[int, int] = Coalescer(send, max_inflight=1)
    t1 = asyncio.create_task(c.submit(1))
    t2 = asyncio.create_task(c.submit(-2))
    t3 = asyncio.create_task(c.submit(3))
    await settle()
    send.gates[0].set()
    await settle()
    send.gates[1].set()
    assert await t1 == 10
    with pytest.raises(InvalidArgument, match="bad -2"):
        await t2
    assert await t3 == 30


async def test_failed_call_fails_every_request_in_it() -> None:
    async def send(batch: list[int]) -> list[int]:
        raise Unavailable("replica died")

    c: Coalescer[int, int] = Coalescer(send, max_inflight=1)
    results = await asyncio.gather(*(c.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    assert c.inflight == 0 and c.pending == 0


async def test_max_items_splits_calls() -> None:
    send = GatedSend()
    c: Coalescer[int, int] = Coalescer(send, max_inflight=1, max_items=2)
    tasks = [asyncio.create_task(c.submit(i)) for i in range(5)]
    await settle()
    for _ in range(4):
        for g in send.gates:
            g.set()
        await settle()
    assert await asyncio.gather(*tasks) == [0, 10, 20, 30, 40]
    assert [len(b) for b in send.calls] == [1, 2, 2]


def test_rejects_bad_limits() -> None:
    async def send(batch: list[int]) -> list[int]:
        return batch

    with pytest.raises(ValueError):
        Coalescer(send, max_inflight=0)
