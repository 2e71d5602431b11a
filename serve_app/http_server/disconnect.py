"""A request whose HTTP client closes its connection is cancelled, as a cancelled gRPC call is.

gRPC cancels the handler of a call its client cancelled; an ASGI server only
tells the application, through ``receive()``, that the connection is gone.
:func:`cancel_on_disconnect` listens for that while the work runs (the body is
read by then, so the next message is the disconnect) and cancels the handler's
own task, so the request leaves whatever queue it waits in and counts as
CANCELED, as with gRPC.  The work runs in the handler's task (its context,
tracing included, unchanged); only the listener is a task of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.types import Receive

from serve_app.errors import Cancelled

T = TypeVar("T")

DISCONNECTED = "the client closed its connection before the response"


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result; Cancelled when the client disconnected first (``work`` was cancelled)."""
    task = asyncio.current_task()
    assert task is not None  # called from a request handler
    gone = asyncio.Event()

    async def listen() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        task.cancel()

    listener = asyncio.get_running_loop().create_task(listen())
    try:
        return await work
    except asyncio.CancelledError:
        if gone.is_set() and withdraw_cancel(task) == 0:  # our cancellation, not (also) the server's
            raise Cancelled(DISCONNECTED) from None
        raise
    finally:
        listener.cancel()


def withdraw_cancel(task: asyncio.Task[Any]) -> int:
    """Withdraw one cancellation request of ``task`` (Python 3.11+); the requests still pending (0 before 3.11,
    which does not count them)."""
    uncancel: Callable[[], int] | None = getattr(task, "uncancel", None)
    return uncancel() if uncancel is not None else 0
