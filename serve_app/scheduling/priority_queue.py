"""Triton's scheduling queue: priority levels, each with its own queue policy.

Level 1 is the highest priority.  Within a level requests keep arrival order;
a request whose timeout expired under a DELAY policy moves behind the level's
unexpired requests, one whose timeout expired under REJECT leaves the queue and
is handed back to the caller to be failed.  A request whose client went away
is taken out wherever it waits (:meth:`PriorityQueue.remove`).  Time is passed in (``now_ns``) so
every rule is testable without sleeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from serve_app.errors import Unavailable
from serve_app.protos import model_config_pb2 as mc

T = TypeVar("T")

QUEUE_FULL_MESSAGE = "Exceeds maximum queue size"
TIMEOUT_MESSAGE = "Request timeout expired"
CANCELLED_MESSAGE = "Request cancelled"  # seen only in logs: the client that cancelled reads no answer


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """ModelQueuePolicy, resolved once."""

    max_queue_size: int = 0  # 0: unbounded
    default_timeout_us: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # TimeoutAction DELAY; REJECT otherwise

    @classmethod
    def from_proto(cls, p: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=p.max_queue_size,
            default_timeout_us=p.default_timeout_microseconds,
            allow_timeout_override=p.allow_timeout_override,
            delay_on_timeout=p.timeout_action == mc.ModelQueuePolicy.DELAY,
        )

    def timeout_us(self, requested_us: int) -> int:
        """A request may only shorten the default timeout, and only when allowed (as Triton)."""
        if self.allow_timeout_override and 0 < requested_us < self.default_timeout_us:
            return requested_us
        return self.default_timeout_us


@dataclass(slots=True, eq=False)
class QueuedRequest(Generic[T]):
    item: T
    batch_size: int  # >= 1
    shape_key: Hashable  # requests batch together only when their keys are equal
    level: int
    enqueue_ns: int
    deadline_ns: int = 0  # 0: never expires


class _Level(Generic[T]):
    __slots__ = ("delayed", "policy", "queue")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.queue: deque[QueuedRequest[T]] = deque()
        self.delayed: deque[QueuedRequest[T]] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class PriorityQueue(Generic[T]):
    def __init__(
        self,
        default_policy: QueuePolicy | None = None,
        *,
        levels: int = 0,
        default_level: int = 0,
        level_policies: Mapping[int, QueuePolicy] | None = None,
        max_total: int = 0,
    ) -> None:
        """``max_total``: requests held across all levels before new ones are refused (0: no bound), the
        server's guard against queueing without bound where the model sets no ``max_queue_size``."""
        default_policy = default_policy or QueuePolicy()
        self.max_total = max_total
        policies = dict(level_policies or {})
        self._levels_count = levels
        self._default_level = default_level if levels else 0
        numbers = range(1, levels + 1) if levels else (0,)
        self._levels: dict[int, _Level[T]] = {n: _Level(policies.get(n, default_policy)) for n in numbers}
        self._order = sorted(self._levels)
        self._size = 0
        self._with_deadline = 0

    @classmethod
    def from_config(cls, db: mc.ModelDynamicBatching, max_total: int = 0) -> PriorityQueue[T]:
        return cls(
            QueuePolicy.from_proto(db.default_queue_policy),
            levels=db.priority_levels,
            default_level=db.default_priority_level,
            level_policies={k: QueuePolicy.from_proto(v) for k, v in db.priority_queue_policy.items()},
            max_total=max_total,
        )

    def __len__(self) -> int:
        return self._size

    def level_of(self, priority: int) -> int:
        """Triton's rule: 0 or a level the model doesn't have means the default level."""
        if not self._levels_count:
            return 0
        if priority <= 0 or priority > self._levels_count:
            return self._default_level
        return priority

    def push(
        self, item: T, *, batch_size: int, shape_key: Hashable, priority: int, timeout_us: int, now_ns: int
    ) -> QueuedRequest[T]:
        """Enqueue, or raise Unavailable when the level's queue is full."""
        level = self.level_of(priority)
        lv = self._levels[level]
        if lv.policy.max_queue_size and len(lv) >= lv.policy.max_queue_size:
            raise Unavailable(QUEUE_FULL_MESSAGE)
        if self.max_total and self._size >= self.max_total:
            raise Unavailable(QUEUE_FULL_MESSAGE)
        timeout = lv.policy.timeout_us(timeout_us)
        deadline = now_ns + timeout * 1000 if timeout else 0
        entry = QueuedRequest(item, max(1, batch_size), shape_key, level, now_ns, deadline)
        lv.queue.append(entry)
        self._size += 1
        if deadline:
            self._with_deadline += 1
        return entry

    def expire(self, now_ns: int) -> list[QueuedRequest[T]]:
        """Apply the timeout actions; return the rejected requests (already removed)."""
        if not self._with_deadline:
            return []
        rejected: list[QueuedRequest[T]] = []
        for lv in self._levels.values():
            if not lv.queue:
                continue
            keep: deque[QueuedRequest[T]] = deque()
            for entry in lv.queue:
                if entry.deadline_ns and now_ns > entry.deadline_ns:
                    self._with_deadline -= 1
                    entry.deadline_ns = 0
                    if lv.policy.delay_on_timeout:
                        lv.delayed.append(entry)
                    else:
                        rejected.append(entry)
                        self._size -= 1
                else:
                    keep.append(entry)
            lv.queue = keep
        return rejected

    def remove(self, entry: QueuedRequest[T]) -> bool:
        """Take ``entry`` out of the queue (its client cancelled it); False when it already left."""
        lv = self._levels.get(entry.level)
        if lv is None:
            return False
        for dq in (lv.queue, lv.delayed):
            try:
                dq.remove(entry)
            except ValueError:
                continue
            if entry.deadline_ns:
                self._with_deadline -= 1
                entry.deadline_ns = 0
            self._size -= 1
            return True
        return False

    def next_deadline(self) -> int:
        """The earliest deadline still pending (0 when none)."""
        if not self._with_deadline:
            return 0
        return min((e.deadline_ns for lv in self._levels.values() for e in lv.queue if e.deadline_ns), default=0)

    def __iter__(self) -> Iterator[QueuedRequest[T]]:
        """Scheduling order: by level, each level's unexpired requests before its delayed ones."""
        for n in self._order:
            lv = self._levels[n]
            yield from lv.queue
            yield from lv.delayed

    def pop_front(self, count: int) -> list[QueuedRequest[T]]:
        """Remove the first ``count`` requests in scheduling order."""
        out: list[QueuedRequest[T]] = []
        for n in self._order:
            lv = self._levels[n]
            for dq in (lv.queue, lv.delayed):
                while dq and len(out) < count:
                    entry = dq.popleft()
                    if entry.deadline_ns:
                        self._with_deadline -= 1
                    out.append(entry)
            if len(out) == count:
                break
        self._size -= len(out)
        return out
