"""Carry many requests in one call across an expensive hop.

A Ray hop costs milliseconds of CPU on our machines, whatever it carries.  The
coalescer keeps at most ``max_inflight`` calls outstanding; requests that
arrive while that many are in flight wait and leave together in the next call.
At low load every request leaves at once (no added delay); under load one hop
carries many requests, which the model replica then schedules (and batches)
as Triton would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from serve_app.errors import ServeError, as_serve_error

T = TypeVar("T")
R = TypeVar("R")

SendFn = Callable[[list[T]], Awaitable[Sequence[R | ServeError]]]


class Coalescer(Generic[T, R]):
    def __init__(self, send: SendFn[T, R], *, max_inflight: int = 2, max_items: int = 256) -> None:
        if max_inflight < 1 or max_items < 1:
            raise ValueError("max_inflight and max_items must be >= 1")
        self._send = send
        self.max_inflight = max_inflight
        self.max_items = max_items
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self.inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def submit(self, item: T) -> R:
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self.inflight < self.max_inflight:
            self._flush()
        return await fut

    def _flush(self) -> None:
        while self._pending and self.inflight < self.max_inflight:
            batch, self._pending = self._pending[: self.max_items], self._pending[self.max_items :]
            self.inflight += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._send([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"send returned {len(results)} results for {len(batch)} requests")
            for (_, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
        except BaseException as exc:  # every request of a failed call gets the error
            err = as_serve_error(exc)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.inflight -= 1
            if self._pending:
                self._flush()
