"""The scheduling queue: priority levels, FIFO order, queue policies (size limit, timeouts, REJECT/DELAY)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from serve_app.errors import Unavailable
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.priority_queue import (
    QUEUE_FULL_MESSAGE,
    TIMEOUT_MESSAGE,
    PriorityQueue,
    QueuedRequest,
    QueuePolicy,
)

US = 1_000  # nanoseconds per microsecond


def push(
    q: PriorityQueue[str],
    item: str,
    *,
    priority: int = 0,
    timeout_us: int = 0,
    now_ns: int = 0,
    batch_size: int = 1,
    shape_key: object = "k",
) -> QueuedRequest[str]:
    return q.push(
        item, batch_size=batch_size, shape_key=shape_key, priority=priority, timeout_us=timeout_us, now_ns=now_ns
    )


def items(q: PriorityQueue[str]) -> list[str]:
    return [e.item for e in q]


def dynamic_batching(text: str) -> mc.ModelDynamicBatching:
    return text_format.Parse(text, mc.ModelDynamicBatching())


def test_messages_are_tritons() -> None:
    assert QUEUE_FULL_MESSAGE == "Exceeds maximum queue size"
    assert TIMEOUT_MESSAGE == "Request timeout expired"


# -- levels ------------------------------------------------------------------------
def test_without_levels_everything_is_level_zero() -> None:
    q: PriorityQueue[str] = PriorityQueue()
    for p in (0, 1, 5, 100):
        assert q.level_of(p) == 0
    assert push(q, "a", priority=3).level == 0


def test_without_levels_default_level_is_ignored() -> None:
    q: PriorityQueue[str] = PriorityQueue(levels=0, default_level=2)
    assert q.level_of(0) == 0
    assert q.level_of(2) == 0
    push(q, "a", priority=2)
    assert items(q) == ["a"]


def test_level_of_with_levels() -> None:
    q: PriorityQueue[str] = PriorityQueue(levels=3, default_level=2)
    assert q.level_of(1) == 1
    assert q.level_of(2) == 2
    assert q.level_of(3) == 3
    assert q.level_of(0) == 2  # 0: the default level
    assert q.level_of(4) == 2  # beyond the configured levels: the default level
    assert q.level_of(2**64 - 1) == 2


def test_fifo_within_a_level() -> None:
    q: PriorityQueue[str] = PriorityQueue()
    for name in "abcde":
        push(q, name)
    assert items(q) == list("abcde")
    assert len(q) == 5


def test_level_one_is_highest() -> None:
    q: PriorityQueue[str] = PriorityQueue(levels=3, default_level=3)
    push(q, "low1", priority=3)
    push(q, "mid1", priority=2)
    push(q, "high1", priority=1)
    push(q, "low2", priority=3)
    push(q, "high2", priority=1)
    push(q, "default", priority=0)
    push(q, "out_of_range", priority=9)
    assert items(q) == ["high1", "high2", "mid1", "low1", "low2", "default", "out_of_range"]
    assert [e.level for e in q] == [1, 1, 2, 3, 3, 3, 3]


def test_push_returns_the_entry() -> None:
    q: PriorityQueue[str] = PriorityQueue(levels=2, default_level=1)
    entry = push(q, "a", priority=2, now_ns=123, batch_size=4, shape_key=("X", (3,)))
    assert entry.item == "a"
    assert entry.batch_size == 4
    assert entry.shape_key == ("X", (3,))
    assert entry.level == 2
    assert entry.enqueue_ns == 123
    assert entry.deadline_ns == 0
    assert list(q) == [entry]


def test_batch_size_is_at_least_one() -> None:
    q: PriorityQueue[str] = PriorityQueue()
    assert push(q, "a", batch_size=0).batch_size == 1


# -- pop_front -----------------------------------------------------------------------
def test_pop_front_takes_scheduling_order_across_levels() -> None:
    q: PriorityQueue[str] = PriorityQueue(levels=2, default_level=2)
    push(q, "b1", priority=2)
    push(q, "a1", priority=1)
    push(q, "b2", priority=2)
    push(q, "a2", priority=1)
    assert [e.item for e in q.pop_front(3)] == ["a1", "a2", "b1"]
    assert len(q) == 1
    assert items(q) == ["b2"]
    assert [e.item for e in q.pop_front(5)] == ["b2"]
    assert len(q) == 0
    assert q.pop_front(1) == []


def test_pop_front_zero() -> None:
    q: PriorityQueue[str] = PriorityQueue()
    push(q, "a")
    assert q.pop_front(0) == []
    assert len(q) == 1


# -- max_queue_size ------------------------------------------------------------------
def test_max_queue_size_rejects_push_when_full() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(max_queue_size=2))
    push(q, "a")
    push(q, "b")
    with pytest.raises(Unavailable) as info:
        push(q, "c")
    assert str(info.value) == "Exceeds maximum queue size"
    assert items(q) == ["a", "b"]
    assert len(q) == 2


def test_max_queue_size_frees_up_after_pop() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(max_queue_size=1))
    push(q, "a")
    with pytest.raises(Unavailable):
        push(q, "b")
    q.pop_front(1)
    push(q, "c")
    assert items(q) == ["c"]


def test_zero_max_queue_size_is_unbounded() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(max_queue_size=0))
    for i in range(1000):
        push(q, str(i))
    assert len(q) == 1000


def test_max_queue_size_is_per_level() -> None:
    q: PriorityQueue[str] = PriorityQueue(
        QueuePolicy(),
        levels=2,
        default_level=2,
        level_policies={1: QueuePolicy(max_queue_size=1)},
    )
    push(q, "high", priority=1)
    with pytest.raises(Unavailable, match="Exceeds maximum queue size"):
        push(q, "high2", priority=1)
    for i in range(5):  # level 2 keeps the (unbounded) default policy
        push(q, f"low{i}", priority=2)
    assert len(q) == 6


def test_default_policy_applies_to_each_level_separately() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(max_queue_size=1), levels=2, default_level=2)
    push(q, "high", priority=1)
    push(q, "low", priority=2)
    with pytest.raises(Unavailable):
        push(q, "low2", priority=0)  # the default level, 2, is full
    with pytest.raises(Unavailable):
        push(q, "high2", priority=1)
    assert items(q) == ["high", "low"]


def test_max_queue_size_counts_delayed_requests() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(max_queue_size=1, default_timeout_us=10, delay_on_timeout=True))
    push(q, "a", now_ns=0)
    assert q.expire(now_ns=11 * US) == []  # delayed, still queued
    with pytest.raises(Unavailable):
        push(q, "b", now_ns=11 * US)


# -- timeouts ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "requested", "expected"),
    [
        (QueuePolicy(default_timeout_us=100), 0, 100),
        (QueuePolicy(default_timeout_us=100), 50, 100),  # override not allowed
        (QueuePolicy(default_timeout_us=100, allow_timeout_override=True), 50, 50),
        (QueuePolicy(default_timeout_us=100, allow_timeout_override=True), 0, 100),  # zero: not requested
        (QueuePolicy(default_timeout_us=100, allow_timeout_override=True), 100, 100),
        (QueuePolicy(default_timeout_us=100, allow_timeout_override=True), 500, 100),  # may only shorten
        (QueuePolicy(default_timeout_us=0, allow_timeout_override=True), 500, 0),  # can't add a timeout
        (QueuePolicy(), 0, 0),
    ],
)
def test_timeout_us(policy: QueuePolicy, requested: int, expected: int) -> None:
    assert policy.timeout_us(requested) == expected


def test_deadline_from_default_timeout() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    assert push(q, "a", now_ns=5_000).deadline_ns == 5_000 + 100 * US
    assert q.next_deadline() == 5_000 + 100 * US


def test_deadline_from_override() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100, allow_timeout_override=True))
    assert push(q, "a", timeout_us=30, now_ns=1_000).deadline_ns == 1_000 + 30 * US
    assert push(q, "b", timeout_us=300, now_ns=1_000).deadline_ns == 1_000 + 100 * US


def test_request_timeout_ignored_without_default_timeout() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(allow_timeout_override=True))
    entry = push(q, "a", timeout_us=10, now_ns=0)
    assert entry.deadline_ns == 0
    assert q.next_deadline() == 0
    assert q.expire(now_ns=10**15) == []
    assert items(q) == ["a"]


def test_expire_without_timeouts_returns_nothing() -> None:
    q: PriorityQueue[str] = PriorityQueue()
    push(q, "a")
    assert q.expire(now_ns=10**18) == []
    assert len(q) == 1


def test_reject_removes_and_returns_expired_requests() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    push(q, "a", now_ns=0)
    push(q, "b", now_ns=50 * US)
    push(q, "c", now_ns=0)
    assert q.expire(now_ns=100 * US - 1) == []
    rejected = q.expire(now_ns=100 * US + 1)
    assert [e.item for e in rejected] == ["a", "c"]
    assert items(q) == ["b"]
    assert len(q) == 1
    assert q.next_deadline() == 150 * US
    assert [e.item for e in q.expire(now_ns=150 * US + 1)] == ["b"]
    assert len(q) == 0
    assert q.next_deadline() == 0


def test_expired_request_is_rejected_only_once() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=10))
    push(q, "a", now_ns=0)
    assert len(q.expire(now_ns=11 * US)) == 1
    assert q.expire(now_ns=20 * US) == []


def test_delay_moves_expired_request_behind_unexpired_ones() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100, delay_on_timeout=True))
    push(q, "a", now_ns=0)
    push(q, "b", now_ns=50 * US)
    push(q, "c", now_ns=60 * US)
    assert q.expire(now_ns=101 * US) == []
    assert items(q) == ["b", "c", "a"]
    assert len(q) == 3
    delayed = list(q)[-1]
    assert delayed.deadline_ns == 0  # expired once, never again
    assert q.next_deadline() == 150 * US


def test_delayed_requests_keep_their_expiry_order_and_still_run() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100, delay_on_timeout=True))
    push(q, "a", now_ns=0)
    push(q, "b", now_ns=10 * US)
    push(q, "c", now_ns=500 * US)
    q.expire(now_ns=105 * US)  # a expires
    q.expire(now_ns=115 * US)  # b expires
    push(q, "d", now_ns=200 * US)
    assert items(q) == ["c", "d", "a", "b"]
    assert [e.item for e in q.pop_front(4)] == ["c", "d", "a", "b"]
    assert len(q) == 0


def test_delayed_request_of_a_high_level_stays_ahead_of_lower_levels() -> None:
    q: PriorityQueue[str] = PriorityQueue(
        QueuePolicy(),
        levels=2,
        default_level=2,
        level_policies={1: QueuePolicy(default_timeout_us=10, delay_on_timeout=True)},
    )
    push(q, "low", priority=2, now_ns=0)
    push(q, "high_old", priority=1, now_ns=0)
    push(q, "high_new", priority=1, now_ns=15 * US)
    assert q.expire(now_ns=11 * US) == []
    assert items(q) == ["high_new", "high_old", "low"]


def test_timeout_action_is_per_level() -> None:
    q: PriorityQueue[str] = PriorityQueue(
        QueuePolicy(default_timeout_us=10),  # REJECT
        levels=2,
        default_level=2,
        level_policies={1: QueuePolicy(default_timeout_us=10, delay_on_timeout=True)},
    )
    push(q, "high", priority=1, now_ns=0)
    push(q, "low", priority=2, now_ns=0)
    rejected = q.expire(now_ns=11 * US)
    assert [e.item for e in rejected] == ["low"]
    assert items(q) == ["high"]


def test_next_deadline_is_earliest_pending() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100, allow_timeout_override=True))
    push(q, "a", now_ns=0)
    push(q, "b", timeout_us=20, now_ns=10 * US)
    push(q, "c", now_ns=5 * US)
    assert q.next_deadline() == 30 * US


def test_next_deadline_forgets_popped_requests() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    push(q, "a", now_ns=0)
    push(q, "b", now_ns=50 * US)
    q.pop_front(1)
    assert q.next_deadline() == 150 * US
    q.pop_front(1)
    assert q.next_deadline() == 0
    assert q.expire(now_ns=10**12) == []


# -- configuration ---------------------------------------------------------------------
def test_queue_policy_from_proto() -> None:
    p = text_format.Parse(
        "max_queue_size: 7 default_timeout_microseconds: 250 allow_timeout_override: true timeout_action: DELAY",
        mc.ModelQueuePolicy(),
    )
    assert QueuePolicy.from_proto(p) == QueuePolicy(
        max_queue_size=7, default_timeout_us=250, allow_timeout_override=True, delay_on_timeout=True
    )


def test_queue_policy_from_empty_proto() -> None:
    assert QueuePolicy.from_proto(mc.ModelQueuePolicy()) == QueuePolicy()
    reject = text_format.Parse("timeout_action: REJECT", mc.ModelQueuePolicy())
    assert QueuePolicy.from_proto(reject).delay_on_timeout is False


def test_from_config_without_levels() -> None:
    q: PriorityQueue[str] = PriorityQueue.from_config(dynamic_batching("default_queue_policy { max_queue_size: 1 }"))
    assert push(q, "a", priority=4).level == 0
    with pytest.raises(Unavailable):
        push(q, "b")


def test_from_config_with_levels_and_policies() -> None:
    db = dynamic_batching(
        """
        priority_levels: 3
        default_priority_level: 3
        default_queue_policy { default_timeout_microseconds: 100 }
        priority_queue_policy {
          key: 1
          value { max_queue_size: 1 default_timeout_microseconds: 10 timeout_action: DELAY }
        }
        """
    )
    q: PriorityQueue[str] = PriorityQueue.from_config(db)
    assert q.level_of(0) == 3
    assert q.level_of(4) == 3
    high = push(q, "high", priority=1, now_ns=0)
    assert high.deadline_ns == 10 * US
    with pytest.raises(Unavailable):
        push(q, "high2", priority=1)
    mid = push(q, "mid", priority=2, now_ns=0)
    assert mid.deadline_ns == 100 * US  # level 2 has no policy of its own: the default one
    low = push(q, "low", priority=0, now_ns=0)
    assert low.level == 3
    assert items(q) == ["high", "mid", "low"]
    assert q.expire(now_ns=11 * US) == []  # level 1 delays
    assert [e.item for e in q.expire(now_ns=101 * US)] == ["mid", "low"]  # the default policy rejects
    assert items(q) == ["high"]


def test_max_total_bounds_a_queue_whose_levels_have_no_max_queue_size() -> None:
    from serve_app.errors import Unavailable
    from serve_app.scheduling.priority_queue import QUEUE_FULL_MESSAGE, PriorityQueue

    q: PriorityQueue[int] = PriorityQueue(max_total=2)
    for i in range(2):
        q.push(i, batch_size=1, shape_key=(), priority=0, timeout_us=0, now_ns=0)
    with pytest.raises(Unavailable, match=QUEUE_FULL_MESSAGE):
        q.push(3, batch_size=1, shape_key=(), priority=0, timeout_us=0, now_ns=0)
    assert len(q) == 2


# -- requests whose client went away ----------------------------------------------------------------
def test_remove_takes_a_request_out_wherever_it_waits() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=10, delay_on_timeout=True), levels=2)
    a = push(q, "a", priority=1)
    b = push(q, "b", priority=2, timeout_us=5)
    c = push(q, "c", priority=2, timeout_us=5)
    assert q.expire(now_ns=20 * US) == []  # every one delayed (DELAY), none rejected
    assert q.remove(b)
    assert items(q) == ["a", "c"]
    assert len(q) == 2
    assert q.remove(a)
    assert not q.remove(a)  # already gone
    assert items(q) == ["c"]
    assert q.pop_front(5) == [c]
    assert not q.remove(c)  # taken for execution: no longer the queue's
    assert len(q) == 0


def test_removed_request_no_longer_sets_a_deadline() -> None:
    q: PriorityQueue[str] = PriorityQueue(QueuePolicy(default_timeout_us=100))
    early = push(q, "early", now_ns=0)
    push(q, "late", now_ns=50 * US)
    assert q.next_deadline() == 100 * US
    assert q.remove(early)
    assert q.next_deadline() == 150 * US
    assert q.expire(now_ns=120 * US) == []  # the removed request is never handed back as timed out
    assert items(q) == ["late"]
