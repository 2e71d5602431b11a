"""cancel_on_disconnect: an HTTP client that closes its connection cancels the work it waits for."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from serve_app.errors import Cancelled
from serve_app.http_server.disconnect import DISCONNECTED, cancel_on_disconnect


class Connection:
    """The ASGI ``receive`` of a request whose body was read: it answers only when the client goes away."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.waiting = 0

    async def receive(self) -> Message:
        self.waiting += 1
        await self.closed.wait()
        return {"type": "http.disconnect"}


async def test_a_disconnect_cancels_the_work_and_reports_cancelled() -> None:
    conn = Connection()
    started = asyncio.Event()
    outcome: list[str] = []

    async def work() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        return "never"

    handler = asyncio.ensure_future(cancel_on_disconnect(conn.receive, work()))
    await started.wait()
    conn.closed.set()
    with pytest.raises(Cancelled) as info:
        await handler
    assert info.value.message == DISCONNECTED
    assert outcome == ["cancelled"]
    assert not handler.cancelled()  # the handler itself goes on (its error answer goes nowhere)


async def test_work_that_finishes_first_returns_and_stops_listening() -> None:
    conn = Connection()

    async def work() -> str:
        await asyncio.sleep(0)
        return "done"

    assert await cancel_on_disconnect(conn.receive, work()) == "done"
    await asyncio.sleep(0)
    assert conn.waiting == 1
    conn.closed.set()  # a disconnect after the answer changes nothing
    await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    conn = Connection()
    started = asyncio.Event()

    async def work() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    handler = asyncio.ensure_future(cancel_on_disconnect(conn.receive, work()))
    await started.wait()
    handler.cancel()  # the server stopping, not the client
    with pytest.raises(asyncio.CancelledError):
        await handler


async def test_other_messages_before_the_disconnect_are_ignored() -> None:
    messages: list[Message] = [{"type": "http.request", "body": b"", "more_body": False}, {"type": "http.disconnect"}]
    gate = asyncio.Event()

    async def receive() -> Message:
        await gate.wait()
        return messages.pop(0)

    async def work() -> str:
        gate.set()
        await asyncio.Event().wait()
        return "never"

    with pytest.raises(Cancelled):
        await cancel_on_disconnect(receive, work())
    assert messages == []
