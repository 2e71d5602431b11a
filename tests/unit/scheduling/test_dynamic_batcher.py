"""Batch formation: Triton's dynamic-batcher rules (preferred sizes, queue delay, shapes) and the default scheduler."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from google.protobuf import text_format

from serve_app.config.autocomplete import normalize_config
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.dynamic_batcher import BatchingConfig, Decision, DynamicBatcher
from serve_app.scheduling.priority_queue import PriorityQueue, QueuePolicy

MS = 1_000_000  # nanoseconds per millisecond
US = 1_000  # nanoseconds per microsecond


def batcher(
    max_batch_size: int = 16,
    preferred: tuple[int, ...] = (),
    delay_ns: int = 0,
    queue: PriorityQueue[str] | None = None,
) -> DynamicBatcher[str]:
    config = BatchingConfig(max_batch_size=max_batch_size, preferred=preferred, max_queue_delay_ns=delay_ns)
    return DynamicBatcher(config, queue if queue is not None else PriorityQueue())


def enqueue(
    b: DynamicBatcher[str],
    count: int,
    *,
    prefix: str = "r",
    batch_size: int = 1,
    shape_key: Hashable = "k",
    priority: int = 0,
    now_ns: int = 0,
) -> list[str]:
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        b.queue.push(name, batch_size=batch_size, shape_key=shape_key, priority=priority, timeout_us=0, now_ns=now_ns)
    return names


def enqueue_sizes(b: DynamicBatcher[str], sizes: Sequence[int], now_ns: int = 0) -> list[str]:
    names = [f"s{i}" for i in range(len(sizes))]
    for name, size in zip(names, sizes, strict=True):
        b.queue.push(name, batch_size=size, shape_key="k", priority=0, timeout_us=0, now_ns=now_ns)
    return names


def sent(decision: Decision[str]) -> list[str]:
    return [e.item for e in decision.batch]


def model_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


# -- configuration -------------------------------------------------------------------
def test_config_without_dynamic_batching_is_the_default_scheduler() -> None:
    config = model_config('name: "m" max_batch_size: 8')
    assert BatchingConfig.from_model_config(config) == BatchingConfig()
    assert BatchingConfig() == BatchingConfig(
        max_batch_size=1, preferred=(), max_queue_delay_ns=0, enforce_equal_shapes=True, preserve_ordering=False
    )
    assert not BatchingConfig().batches


def test_config_from_dynamic_batching() -> None:
    config = model_config(
        """
        name: "m"
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [8, 4, 8]
          max_queue_delay_microseconds: 250
          preserve_ordering: true
        }
        """
    )
    cfg = BatchingConfig.from_model_config(config)
    assert cfg == BatchingConfig(
        max_batch_size=16, preferred=(4, 8), max_queue_delay_ns=250 * US, enforce_equal_shapes=True,
        preserve_ordering=True,
    )  # fmt: skip
    assert cfg.batches


def test_config_reads_preferred_sizes_as_given() -> None:
    config = model_config('name: "m" max_batch_size: 8 dynamic_batching { }')
    assert BatchingConfig.from_model_config(config).preferred == ()
    normalize_config(config)  # what the server does on load
    assert BatchingConfig.from_model_config(config) == BatchingConfig(max_batch_size=8, preferred=(8,))


def test_config_of_non_batching_model_with_dynamic_batching() -> None:
    config = model_config('name: "m" max_batch_size: 0 dynamic_batching { preserve_ordering: true }')
    cfg = BatchingConfig.from_model_config(config)
    assert cfg.max_batch_size == 1
    assert cfg.preferred == ()
    assert cfg.preserve_ordering
    assert not cfg.batches


# -- preferred batch sizes -------------------------------------------------------------
def test_empty_queue_sends_nothing_and_does_not_wait() -> None:
    b = batcher(preferred=(4, 8), delay_ns=MS)
    d = b.next_batch(0)
    assert d.batch == []
    assert d.rejected == []
    assert d.wait_ns == 0


def test_preferred_size_reached_is_sent() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue(b, 6)
    d = b.next_batch(0)
    assert sent(d) == names[:4]
    assert d.wait_ns == 0
    assert len(b.queue) == 2
    # the rest can't reach a preferred size and there is no delay: sent as they are
    assert sent(b.next_batch(0)) == names[4:]
    assert len(b.queue) == 0


def test_below_preferred_without_delay_sends_everything() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue(b, 3)
    d = b.next_batch(0)
    assert sent(d) == names
    assert d.wait_ns == 0


def test_largest_preferred_size_reached_is_sent() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue(b, 10)
    assert sent(b.next_batch(0)) == names[:8]
    assert sent(b.next_batch(0)) == names[8:]


def test_exactly_a_preferred_size() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue(b, 8)
    assert sent(b.next_batch(0)) == names


def test_preferred_sizes_count_batch_sizes_not_requests() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue_sizes(b, [2, 2, 3, 1, 5])
    # 2, 4 (preferred), 7, 8 (preferred), 13: the largest preferred reached is 8
    assert sent(b.next_batch(0)) == names[:4]
    assert sent(b.next_batch(0)) == names[4:]


def test_walk_stops_at_max_batch_size() -> None:
    b = batcher(max_batch_size=6, preferred=(6,))
    names = enqueue_sizes(b, [4, 4])
    assert sent(b.next_batch(0)) == names[:1]  # 8 doesn't fit
    assert sent(b.next_batch(0)) == names[1:]


def test_batch_never_exceeds_max_batch_size() -> None:
    b = batcher(max_batch_size=4, preferred=(4,))
    enqueue(b, 11)
    sizes = []
    while len(b.queue):
        sizes.append(len(b.next_batch(0).batch))
    assert sizes == [4, 4, 3]


def test_preferred_size_with_unexpired_delay_is_sent_at_once() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8), delay_ns=MS)
    names = enqueue(b, 5)
    d = b.next_batch(0)
    assert sent(d) == names[:4]
    assert d.wait_ns == 0


def test_expired_delay_sends_everything_gathered_even_past_a_preferred_size() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8), delay_ns=MS)
    names = enqueue(b, 6, now_ns=0)
    d = b.next_batch(MS)
    assert sent(d) == names


def test_past_largest_preferred_sends_the_part_below_it() -> None:
    # Triton: when the next request would take the batch past the largest preferred size, the batch gathered so
    # far is marked and sent (while the delay has not expired), even though no preferred size was hit exactly.
    b = batcher(max_batch_size=16, preferred=(4, 8))
    names = enqueue_sizes(b, [3, 3, 3])
    assert sent(b.next_batch(0)) == names[:2]


def test_request_larger_than_largest_preferred_goes_at_once_despite_delay() -> None:
    b = batcher(max_batch_size=16, preferred=(4,), delay_ns=MS)
    names = enqueue_sizes(b, [5])
    d = b.next_batch(0)
    assert sent(d) == names
    assert d.wait_ns == 0


def test_no_preferred_sizes_without_delay_sends_everything_gathered() -> None:
    # Module docstring: no preferred size reached and no queue delay -> everything gathered is sent.
    b = batcher(max_batch_size=8, preferred=())
    names = enqueue(b, 5)
    assert sent(b.next_batch(0)) == names


# -- queue delay --------------------------------------------------------------------------
def test_delay_holds_a_small_batch() -> None:
    b = batcher(max_batch_size=16, preferred=(4, 8), delay_ns=MS)
    names = enqueue(b, 3, now_ns=0)
    d = b.next_batch(0)
    assert d.batch == []
    assert d.wait_ns == MS
    assert len(b.queue) == 3
    d = b.next_batch(MS // 4)
    assert d.batch == []
    assert d.wait_ns == MS - MS // 4
    d = b.next_batch(MS)
    assert sent(d) == names
    assert d.wait_ns == 0
    assert len(b.queue) == 0


def test_delay_counts_from_the_oldest_request() -> None:
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS)
    enqueue(b, 1, prefix="old", now_ns=0)
    enqueue(b, 1, prefix="new", now_ns=MS // 2)
    d = b.next_batch(3 * MS // 4)
    assert d.batch == []
    assert d.wait_ns == MS // 4
    assert sent(b.next_batch(MS)) == ["old0", "new0"]


def test_delay_filled_to_preferred_size_by_new_arrivals() -> None:
    b = batcher(max_batch_size=16, preferred=(4,), delay_ns=MS)
    first = enqueue(b, 2, prefix="a", now_ns=0)
    assert b.next_batch(0).batch == []
    second = enqueue(b, 2, prefix="b", now_ns=MS // 10)
    assert sent(b.next_batch(MS // 10)) == first + second


def test_wait_is_shortened_by_a_sooner_request_timeout() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=300))
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS, queue=queue)
    enqueue(b, 2, now_ns=0)
    d = b.next_batch(100 * US)
    assert d.batch == []
    assert d.wait_ns == 200 * US


def test_wait_is_not_lengthened_by_a_later_request_timeout() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=5_000))
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS, queue=queue)
    enqueue(b, 2, now_ns=0)
    assert b.next_batch(0).wait_ns == MS


def test_wait_for_an_imminent_timeout_is_at_least_a_microsecond() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS, queue=queue)
    enqueue(b, 1, now_ns=0)
    d = b.next_batch(100 * US)  # exactly at the deadline: not expired yet
    assert d.batch == []
    assert d.wait_ns == US


# -- shapes ----------------------------------------------------------------------------------
def test_batch_stops_at_a_different_shape() -> None:
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS)
    a = enqueue(b, 2, prefix="a", shape_key="x")
    c = enqueue(b, 3, prefix="c", shape_key="y")
    d = b.next_batch(0)  # can't grow: sent despite the delay
    assert sent(d) == a
    d = b.next_batch(0)  # the last shape could still grow: waits
    assert d.batch == []
    assert d.wait_ns == MS
    assert sent(b.next_batch(MS)) == c


def test_same_shape_later_in_queue_does_not_join() -> None:
    b = batcher(max_batch_size=16, preferred=(8,))
    b.queue.push("x1", batch_size=1, shape_key="x", priority=0, timeout_us=0, now_ns=0)
    b.queue.push("y1", batch_size=1, shape_key="y", priority=0, timeout_us=0, now_ns=0)
    b.queue.push("x2", batch_size=1, shape_key="x", priority=0, timeout_us=0, now_ns=0)
    assert sent(b.next_batch(0)) == ["x1"]  # a batch is a prefix of the queue
    assert sent(b.next_batch(0)) == ["y1"]
    assert sent(b.next_batch(0)) == ["x2"]


def test_batch_that_cannot_fit_next_request_is_sent_despite_delay() -> None:
    b = batcher(max_batch_size=8, preferred=(8,), delay_ns=MS)
    names = enqueue_sizes(b, [3, 6])
    # 3 + 6 > 8: the first can't grow (and 9 is past the largest preferred size)
    d = b.next_batch(0)
    assert sent(d) == names[:1]


# -- priorities and timeouts --------------------------------------------------------------------
def test_batch_follows_priority_order() -> None:
    queue: PriorityQueue[str] = PriorityQueue(levels=2, default_level=2)
    b = batcher(max_batch_size=16, preferred=(3,), queue=queue)
    low = enqueue(b, 2, prefix="low", priority=2)
    high = enqueue(b, 2, prefix="high", priority=1)
    assert sent(b.next_batch(0)) == [*high, low[0]]
    assert sent(b.next_batch(0)) == low[1:]


def test_rejected_requests_are_reported_and_not_batched() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    b = batcher(max_batch_size=16, preferred=(8,), queue=queue)
    old = enqueue(b, 2, prefix="old", now_ns=0)
    new = enqueue(b, 1, prefix="new", now_ns=50 * US)
    d = b.next_batch(101 * US)
    assert [e.item for e in d.rejected] == old
    assert sent(d) == new


def test_only_rejections_when_everything_timed_out() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    b = batcher(max_batch_size=16, preferred=(8,), delay_ns=MS, queue=queue)
    names = enqueue(b, 2, now_ns=0)
    d = b.next_batch(101 * US)
    assert [e.item for e in d.rejected] == names
    assert d.batch == []
    assert d.wait_ns == 0
    assert len(b.queue) == 0


def test_delayed_requests_are_batched_after_the_others() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100, delay_on_timeout=True))
    b = batcher(max_batch_size=16, preferred=(8,), queue=queue)
    old = enqueue(b, 1, prefix="old", now_ns=0)
    new = enqueue(b, 1, prefix="new", now_ns=90 * US)
    d = b.next_batch(101 * US)
    assert d.rejected == []
    assert sent(d) == new + old


def test_expiry_wait() -> None:
    queue: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    b = batcher(queue=queue)
    assert b.expiry_wait_ns(0) == 0
    enqueue(b, 1, now_ns=0)
    assert b.expiry_wait_ns(40 * US) == 60 * US
    assert b.expiry_wait_ns(100 * US) == US  # at least a microsecond


def test_expiry_wait_without_timeouts() -> None:
    b = batcher()
    enqueue(b, 3)
    assert b.expiry_wait_ns(0) == 0


# -- the default scheduler -------------------------------------------------------------------------
def test_default_scheduler_sends_each_request_alone_in_arrival_order() -> None:
    config = model_config('name: "m" max_batch_size: 8')
    b: DynamicBatcher[str] = DynamicBatcher(BatchingConfig.from_model_config(config), PriorityQueue())
    names = enqueue(b, 4, priority=3)
    got = []
    while len(b.queue):
        d = b.next_batch(0)
        assert d.wait_ns == 0
        got.append(sent(d))
    assert got == [[n] for n in names]


def test_default_scheduler_sends_each_request_alone_whatever_its_size() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(BatchingConfig(), PriorityQueue())
    names = enqueue_sizes(b, [4, 1, 2])
    assert [sent(b.next_batch(0)) for _ in names] == [[n] for n in names]


def test_batcher_from_model_config() -> None:
    config = model_config(
        'name: "m" max_batch_size: 4 '
        "dynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 100 }"
    )
    b: DynamicBatcher[str] = DynamicBatcher(BatchingConfig.from_model_config(config), PriorityQueue())
    names = enqueue(b, 3, now_ns=0)
    assert sent(b.next_batch(0)) == names[:2]
    d = b.next_batch(0)
    assert d.batch == []
    assert d.wait_ns == 100 * US
    assert sent(b.next_batch(100 * US)) == names[2:]
