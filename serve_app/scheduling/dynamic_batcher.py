"""Batch formation with Triton's dynamic-batcher rules, as a pure function of
the queue and the time.

Asked for a batch when a model instance is free, the batcher walks the queue in
scheduling order and gathers requests while their batch sizes fit in
``max_batch_size`` and their non-batch shapes agree with the first one's:

- if the walk reached a preferred batch size, the largest one reached is sent
  at once (unless the queue delay of the oldest request has expired, in which
  case everything gathered goes);
- otherwise, with no queue delay configured, or once the oldest gathered
  request has waited ``max_queue_delay``, or when the batch can't grow any
  more, everything gathered is sent;
- otherwise nothing is sent, and the caller asks again after ``wait_ns`` (the
  rest of the delay, or sooner if a request's timeout comes first) or when a
  new request arrives.

A batch is always a prefix of the queue's scheduling order.  The default
scheduler (no ``dynamic_batching``) is the same machine with
``max_batch_size`` 1: every request is its own execution, in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.priority_queue import PriorityQueue, QueuedRequest

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    max_batch_size: int = 1  # >= 1; a model that does not batch executes one request at a time
    preferred: tuple[int, ...] = ()  # ascending
    max_queue_delay_ns: int = 0
    enforce_equal_shapes: bool = True
    preserve_ordering: bool = False

    @classmethod
    def from_model_config(cls, config: mc.ModelConfig) -> BatchingConfig:
        """The dynamic batcher of ``config``, or the default scheduler when it has none."""
        if not config.HasField("dynamic_batching"):
            return cls()
        db = config.dynamic_batching
        batching = config.max_batch_size > 0
        return cls(
            max_batch_size=max(1, config.max_batch_size),
            preferred=tuple(sorted(set(db.preferred_batch_size))) if batching else (),
            max_queue_delay_ns=db.max_queue_delay_microseconds * 1000,
            enforce_equal_shapes=True,
            preserve_ordering=db.preserve_ordering,
        )

    @property
    def batches(self) -> bool:
        return self.max_batch_size > 1


@dataclass(slots=True)
class Decision(Generic[T]):
    batch: list[QueuedRequest[T]] = field(default_factory=list)
    rejected: list[QueuedRequest[T]] = field(default_factory=list)  # timed out under REJECT
    wait_ns: int = 0  # when nothing is sent but requests wait: ask again after this long


class DynamicBatcher(Generic[T]):
    def __init__(self, config: BatchingConfig, queue: PriorityQueue[T]) -> None:
        self.config = config
        self.queue = queue
        # No preferred sizes means max_batch_size is the one (Triton's config normalization).
        self._max_preferred = max(config.preferred, default=config.max_batch_size)
        self._preferred = frozenset(config.preferred)

    def next_batch(self, now_ns: int) -> Decision[T]:
        """The batch to execute now on a free instance (possibly empty), per the rules above."""
        cfg = self.config
        decision: Decision[T] = Decision(rejected=self.queue.expire(now_ns))
        if not len(self.queue):
            return decision
        count = size = 0
        best_count = 0  # requests in the largest preferred batch seen (or the largest below max preferred)
        send_now = False
        first_key: object = None
        oldest = now_ns
        for entry in self.queue:
            if count:
                grown = size + entry.batch_size
                if grown > self._max_preferred and not best_count:
                    best_count = count
                if grown > cfg.max_batch_size or (cfg.enforce_equal_shapes and entry.shape_key != first_key):
                    send_now = True
                    break
            else:
                first_key = entry.shape_key
            count += 1
            size += entry.batch_size
            oldest = min(oldest, entry.enqueue_ns)
            if size in self._preferred:
                best_count = count
        delay_exceeded = cfg.max_queue_delay_ns > 0 and now_ns - oldest >= cfg.max_queue_delay_ns
        if best_count and not delay_exceeded:
            decision.batch = self.queue.pop_front(best_count)
        elif send_now or size >= self._max_preferred or delay_exceeded or cfg.max_queue_delay_ns == 0:
            decision.batch = self.queue.pop_front(count)
        else:
            wait = cfg.max_queue_delay_ns - (now_ns - oldest)
            deadline = self.queue.next_deadline()
            if deadline:
                wait = min(wait, max(deadline - now_ns, 1_000))
            decision.wait_ns = wait
        return decision

    def expiry_wait_ns(self, now_ns: int) -> int:
        """How long until the next queued request times out (0: none will), for timely rejection."""
        deadline = self.queue.next_deadline()
        return max(deadline - now_ns, 1_000) if deadline else 0
