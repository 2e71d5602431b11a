"""How loaded one model instance is, measured by the instance itself.

Gateways send batches to instances over the direct channel, not through Serve
handles, so Serve's own ongoing-request counts never see the traffic.  Each
instance therefore measures its load and reports it through the replica's
``record_autoscaling_stats`` (a Serve custom metric); Serve samples it every few
tenths of a second, keeps ``look_back_period_s`` of samples and hands the
policy (``serve_app.autoscale.policy``) their time-weighted mean per replica.

Pure and driven by an injected clock, so it is tested without sleeping.  The
instance's executor thread and its event loop both touch it, hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# The metric names: the keys of ``LoadMeter.metrics()`` and of the policy's ``ctx.aggregated_metrics``.
BUSY = "busy"  # fraction of the window the instance spent executing, 0..1
QUEUE_DELAY_US = "queue_delay_us"  # mean wait of the executed batches in the gateway's queue
LIVE_SEQUENCES = "live_sequences"  # sequence instances: occupied slots
SLOTS = "slots"  # sequence instances: slots of the instance
BACKLOG = "backlog"  # sequence instances: sequences waiting for a slot, as last known to the instance

METRIC_NAMES = (BUSY, QUEUE_DELAY_US, LIVE_SEQUENCES, SLOTS, BACKLOG)


class LoadMeter:
    """Busy time, queue delay and slot occupancy of one instance over the last ``window_s`` seconds.

    ``busy`` counts the union of executions (robust to overlap, though an
    instance runs one at a time), including one still running.  Until the
    meter is ``window_s`` old the fraction is of the time it has existed, so a
    replica busy from its first second does not read as lightly loaded.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = 5.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self._clock = clock
        self._window_s = float(window_s)
        self._lock = threading.Lock()
        self._created = clock()
        self._active = 0  # executions begun and not ended
        self._busy_since: float | None = None  # start of the busy period in progress
        self._spans: deque[tuple[float, float]] = deque()  # closed busy periods: disjoint, in time order
        self._delays: deque[tuple[float, float]] = deque()  # (when, delay_us) per executed batch
        self._delay_sum = 0.0
        self._slots: tuple[int, int, int] | None = None  # (live, total, backlog) once set

    @property
    def window_s(self) -> float:
        return self._window_s

    def begin(self) -> None:
        """An execution starts."""
        with self._lock:
            if self._active == 0:
                self._busy_since = self._clock()
            self._active += 1

    def end(self) -> None:
        """An execution finished (successfully or not).  An ``end`` without a ``begin`` is ignored."""
        with self._lock:
            if self._active == 0:
                return
            self._active -= 1
            if self._active == 0 and self._busy_since is not None:
                now = self._clock()
                self._spans.append((self._busy_since, now))
                self._busy_since = None
                self._prune(now)

    @contextmanager
    def executing(self) -> Iterator[None]:
        """``begin`` / ``end`` around a block, ``end`` even when it raises."""
        self.begin()
        try:
            yield
        finally:
            self.end()

    def queued(self, *delays_us: float) -> None:
        """Executed batches waited ``delays_us`` in the gateway's queue, one each (negative clock noise counts
        as 0): the batches of one call are counted together, under one lock."""
        with self._lock:
            now = self._clock()
            for delay_us in delays_us:
                delay = max(0.0, float(delay_us))
                self._delays.append((now, delay))
                self._delay_sum += delay
            self._prune(now)

    def set_slots(self, live: int, total: int, backlog: int = 0) -> None:
        """Slot occupancy of a sequence instance; from the first call on, ``metrics`` reports it."""
        if total < 0 or live < 0 or backlog < 0:
            raise ValueError(f"slot counts must not be negative: live={live}, total={total}, backlog={backlog}")
        if live > total:
            raise ValueError(f"live sequences ({live}) exceed the slots ({total})")
        with self._lock:
            self._slots = (int(live), int(total), int(backlog))

    def metrics(self) -> dict[str, float]:
        """The instance's load now: ``busy``, ``queue_delay_us``, and for sequence instances the slot figures."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            out = {BUSY: self._busy(now), QUEUE_DELAY_US: self._delay_sum / len(self._delays) if self._delays else 0.0}
            if self._slots is not None:
                live, total, backlog = self._slots
                out.update({LIVE_SEQUENCES: float(live), SLOTS: float(total), BACKLOG: float(backlog)})
            return out

    def _busy(self, now: float) -> float:
        start = max(now - self._window_s, self._created)
        span = now - start
        if span <= 0:
            return 1.0 if self._active else 0.0
        busy = sum(max(0.0, min(e, now) - max(s, start)) for s, e in self._spans)
        if self._busy_since is not None:
            busy += now - max(self._busy_since, start)
        return min(1.0, max(0.0, busy / span))

    def _prune(self, now: float) -> None:
        horizon = now - self._window_s
        while self._spans and self._spans[0][1] < horizon:
            self._spans.popleft()
        while self._delays and self._delays[0][0] < horizon:
            _, delay = self._delays.popleft()
            self._delay_sum -= delay
        if not self._delays:
            self._delay_sum = 0.0  # no float drift survives an empty window
