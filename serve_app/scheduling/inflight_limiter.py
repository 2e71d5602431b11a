"""An ensemble step's limit on its requests in flight (``ensemble_scheduling { max_inflight_requests: N }``).

Triton keeps one limiter per step of an ensemble, shared by all the
ensemble's requests: a step request starts only while fewer than N of that
step's requests are in flight, so a decoupled step that answers faster than
the steps after it can consume is held back instead of queueing requests
without bound.  A slot is held from the step request's start to its final
response.  One that waits longer than ``timeout_s`` (Triton's 300 s) starts
anyway, with an error in the log, so a mistaken limit can't hang a request
for ever; a waiting request its client cancelled stops waiting.  0: no limit.
"""

from __future__ import annotations

import asyncio
import collections
import logging

logger = logging.getLogger("serve_app")

# Triton's wait before a step starts over its limit (kMutexTimeoutSeconds).
WAIT_TIMEOUT_S = 300.0


class InflightLimiter:
    def __init__(self, limit: int, *, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        self.limit = limit
        self.inflight = 0
        self._timeout = timeout_s
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, ensemble: str, step: int) -> None:
        """Take a slot, waiting (first come, first served) while the step is at its limit; ``ensemble`` and
        ``step`` name it in the log line of a wait that timed out (Triton's)."""
        if not self.limit:
            return
        if self.inflight >= self.limit or self._waiters:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[bool] = loop.create_future()  # True: handed a slot, False: timed out
            self._waiters.append(waiter)
            timer = loop.call_later(self._timeout, self._expire, waiter)
            try:
                granted = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.result():  # handed one: pass it on
                    self.inflight -= 1
                    self._wake()
                raise
            finally:
                timer.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if granted:
                return  # counted by release()
            logger.error(
                "[Internal Error] Ensemble '%s' unable to schedule step %d (inflight: %d >= limit: %d) for %g "
                "seconds. Proceeding to avoid deadlock.",
                ensemble, step, self.inflight, self.limit, self._timeout,
            )  # fmt: skip
        self.inflight += 1

    def release(self) -> None:
        """Give a slot back: the next waiter gets it."""
        if not self.limit:
            return
        if self.inflight <= 0:
            logger.error("step inflight request limiter underflow")
            return
        self.inflight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.inflight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.inflight += 1  # counted for the waiter, which returns without counting again
                waiter.set_result(True)

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._waiters.remove(waiter)
            waiter.set_result(False)
