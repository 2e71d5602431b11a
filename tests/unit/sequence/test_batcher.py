"""SequenceBatcher: batch formation for one instance of a sequence model (direct and oldest), slot ownership,
release on END and on idle timeout; and SequenceBatchingConfig from a model config."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.batcher import (
    DEFAULT_IDLE_US,
    BatchDecision,
    Row,
    SequenceBatcher,
    SequenceBatchingConfig,
    StaleStep,
)
from serve_app.sequence.messages import SlotEvent

US = 1_000  # nanoseconds per microsecond
MS = 1_000_000


def direct(slots: int = 4, **kw: object) -> SequenceBatcher[str]:
    return SequenceBatcher(SequenceBatchingConfig(direct=True, slots=slots, max_batch_size=slots, **kw))  # type: ignore[arg-type]


def oldest(slots: int = 4, max_batch_size: int = 2, **kw: object) -> SequenceBatcher[str]:
    return SequenceBatcher(
        SequenceBatchingConfig(direct=False, slots=slots, max_batch_size=max_batch_size, **kw)  # type: ignore[arg-type]
    )


def put(
    b: SequenceBatcher[str],
    slot: int,
    item: str,
    *,
    corr: int | str | None = None,
    gen: int = 1,
    start: bool = False,
    end: bool = False,
    now: int = 0,
    key: object = None,
) -> list[str]:
    corr = 100 + slot if corr is None else corr
    displaced = b.enqueue(slot, corr, gen, item, start=start, end=end, now_ns=now, shape_key=key)
    return [p.item for p in displaced]


def items(decision: BatchDecision[str]) -> list[str | None]:
    return [None if r.pending is None else r.pending.item for r in decision.rows]


def layout(decision: BatchDecision[str]) -> list[tuple[int, int | str | None, str | None]]:
    return [(r.slot, r.corr_id, None if r.pending is None else r.pending.item) for r in decision.rows]


# --------------------------------------------------------------------------- config


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_config_direct() -> None:
    cfg = SequenceBatchingConfig.from_model_config(
        parse(
            """name: "m" max_batch_size: 4 sequence_batching { max_sequence_idle_microseconds: 5000
               direct { max_queue_delay_microseconds: 300 minimum_slot_utilization: 0.5 } }"""
        )
    )
    assert cfg == SequenceBatchingConfig(
        direct=True,
        slots=4,
        max_batch_size=4,
        preferred=(),
        max_queue_delay_ns=300 * US,
        min_slot_utilization=0.5,
        idle_ns=5000 * US,
    )


def test_config_defaults_direct_and_one_second_idle() -> None:
    cfg = SequenceBatchingConfig.from_model_config(parse('name: "m" max_batch_size: 2 sequence_batching { }'))
    assert cfg.direct and cfg.slots == 2 and cfg.max_batch_size == 2
    assert cfg.idle_ns == DEFAULT_IDLE_US * US == 1_000_000_000
    assert cfg.max_queue_delay_ns == 0 and cfg.min_slot_utilization == 0.0


def test_config_unbatched_has_one_slot() -> None:
    cfg = SequenceBatchingConfig.from_model_config(parse('name: "m" max_batch_size: 0 sequence_batching { }'))
    assert (cfg.slots, cfg.max_batch_size) == (1, 1)


def test_config_oldest() -> None:
    cfg = SequenceBatchingConfig.from_model_config(
        parse(
            """name: "m" max_batch_size: 8 sequence_batching { oldest { max_candidate_sequences: 16
               preferred_batch_size: [ 4, 2, 4 ] max_queue_delay_microseconds: 250 } }"""
        )
    )
    assert cfg == SequenceBatchingConfig(
        direct=False, slots=16, max_batch_size=8, preferred=(2, 4), max_queue_delay_ns=250 * US, idle_ns=10**9
    )


def test_config_oldest_unbatched_and_without_candidates() -> None:
    cfg = SequenceBatchingConfig.from_model_config(
        parse('name: "m" max_batch_size: 0 sequence_batching { oldest { preferred_batch_size: [ 2 ] } }')
    )
    assert (cfg.direct, cfg.slots, cfg.max_batch_size, cfg.preferred) == (False, 1, 1, ())


def test_config_oldest_without_candidates_has_a_place_per_batch_row() -> None:
    """Triton: max_candidate_sequences unset (0) means max_batch_size candidate sequences per instance."""
    cfg = SequenceBatchingConfig.from_model_config(
        parse('name: "m" max_batch_size: 4 sequence_batching { oldest { } }')
    )
    assert (cfg.direct, cfg.slots, cfg.max_batch_size) == (False, 4, 4)


# --------------------------------------------------------------------------- direct


def test_direct_empty_batcher_has_nothing_to_run() -> None:
    b = direct()
    assert b.next_batch(0) == BatchDecision()
    assert b.queued == 0 and b.occupied() == []


def test_direct_rows_cover_slots_up_to_the_highest_occupied() -> None:
    b = direct(slots=4)
    put(b, 0, "a0", start=True)
    put(b, 2, "c0", start=True)
    d = b.next_batch(0)
    assert d.wait_ns == 0
    assert layout(d) == [(0, 100, "a0"), (1, None, None), (2, 102, "c0")]
    assert b.queued == 0


def test_direct_occupied_slot_without_a_request_is_an_empty_row() -> None:
    b = direct(slots=4)
    put(b, 0, "a0", start=True)
    put(b, 3, "d0", start=True)
    b.finish(b.next_batch(0).rows)
    put(b, 0, "a1")
    # Slot 3 is still held (no END) but has nothing queued: its row is there, not ready.
    assert layout(b.next_batch(0)) == [(0, 100, "a1"), (1, None, None), (2, None, None), (3, 103, None)]


def test_direct_one_request_per_slot_per_execution() -> None:
    b = direct(slots=2)
    put(b, 0, "a0", start=True)
    put(b, 0, "a1")
    put(b, 0, "a2", end=True)
    put(b, 1, "b0", start=True)
    runs = []
    while (d := b.next_batch(0)).rows:
        runs.append(items(d))
        b.finish(d.rows)
    assert runs == [["a0", "b0"], ["a1", None], ["a2", None]]
    assert b.owner(0) is None and b.owner(1) == (101, 1)


def test_direct_shape_mismatch_defers_to_a_later_execution() -> None:
    b = direct(slots=3)
    put(b, 0, "a0", start=True, key="small")
    put(b, 1, "b0", start=True, key="big")
    put(b, 2, "c0", start=True, key="small")
    first = b.next_batch(0)
    assert layout(first) == [(0, 100, "a0"), (1, 101, None), (2, 102, "c0")]
    b.finish(first.rows)
    assert layout(b.next_batch(0)) == [(0, 100, None), (1, 101, "b0"), (2, 102, None)]


def test_direct_minimum_slot_utilization_waits_up_to_the_delay() -> None:
    b = direct(slots=4, max_queue_delay_ns=100 * US, min_slot_utilization=0.5)
    put(b, 1, "b0", start=True, now=1_000)
    d = b.next_batch(1_000 + 30 * US)
    assert d.rows == [] and d.wait_ns == 70 * US
    # Half the slots have a request: run now.
    put(b, 3, "d0", start=True, now=1_000 + 40 * US)
    assert items(b.next_batch(1_000 + 40 * US)) == [None, "b0", None, "d0"]


def test_direct_minimum_slot_utilization_runs_when_the_delay_expires() -> None:
    b = direct(slots=4, max_queue_delay_ns=100 * US, min_slot_utilization=1.0)
    put(b, 0, "a0", start=True, now=0)
    put(b, 1, "b0", start=True, now=50 * US)
    d = b.next_batch(99 * US)
    assert d.rows == [] and d.wait_ns == 1 * US  # measured from the oldest request
    assert items(b.next_batch(100 * US)) == ["a0", "b0"]


def test_direct_utilization_without_delay_never_waits() -> None:
    b = direct(slots=4, max_queue_delay_ns=0, min_slot_utilization=1.0)
    put(b, 0, "a0", start=True)
    assert items(b.next_batch(0)) == ["a0"]


def test_direct_delay_without_utilization_never_waits() -> None:
    b = direct(slots=4, max_queue_delay_ns=100 * US, min_slot_utilization=0.0)
    put(b, 2, "c0", start=True)
    assert items(b.next_batch(0)) == [None, None, "c0"]


# --------------------------------------------------------------------------- oldest


def test_oldest_takes_heads_oldest_first_up_to_max_batch_size() -> None:
    b = oldest(slots=4, max_batch_size=2)
    put(b, 2, "c0", start=True, now=10)
    put(b, 0, "a0", start=True, now=20)
    put(b, 3, "d0", start=True, now=5)
    d = b.next_batch(30)
    assert layout(d) == [(3, 103, "d0"), (2, 102, "c0")]
    b.finish(d.rows)
    assert layout(b.next_batch(30)) == [(0, 100, "a0")]


def test_oldest_never_batches_two_requests_of_one_sequence() -> None:
    b = oldest(slots=4, max_batch_size=4)
    for i in range(3):
        put(b, 1, f"b{i}", start=i == 0, end=i == 2, now=i)
    put(b, 2, "c0", start=True, now=10)
    runs = []
    while (d := b.next_batch(100)).rows:
        runs.append(items(d))
        assert len({r.slot for r in d.rows}) == len(d.rows)
        b.finish(d.rows)
    assert runs == [["b0", "c0"], ["b1"], ["b2"]]


def test_oldest_rows_have_no_empty_slots() -> None:
    b = oldest(slots=4, max_batch_size=4)
    put(b, 3, "d0", start=True)
    assert layout(b.next_batch(0)) == [(3, 103, "d0")]


def test_oldest_no_delay_runs_whatever_is_there() -> None:
    b = oldest(slots=4, max_batch_size=4, preferred=(4,))
    put(b, 0, "a0", start=True)
    assert items(b.next_batch(0)) == ["a0"]


def test_oldest_waits_for_a_preferred_size_up_to_the_delay() -> None:
    b = oldest(slots=4, max_batch_size=4, preferred=(2, 4), max_queue_delay_ns=100 * US)
    put(b, 0, "a0", start=True, now=0)
    d = b.next_batch(40 * US)
    assert d.rows == [] and d.wait_ns == 60 * US
    put(b, 1, "b0", start=True, now=50 * US)
    put(b, 2, "c0", start=True, now=55 * US)
    # Three heads: the largest preferred size that can be formed (2) runs at once, oldest first.
    d = b.next_batch(60 * US)
    assert items(d) == ["a0", "b0"]
    b.finish(d.rows)
    d = b.next_batch(60 * US)
    assert d.rows == [] and d.wait_ns == 95 * US
    assert items(b.next_batch(155 * US)) == ["c0"]


def test_oldest_delay_exceeded_runs_up_to_max_batch_size() -> None:
    b = oldest(slots=8, max_batch_size=4, preferred=(2,), max_queue_delay_ns=100 * US)
    for i in range(5):
        put(b, i, f"r{i}", start=True, now=i)
    # Within the delay the preferred size wins; past it, as many as fit.
    assert items(b.next_batch(100 * US)) == ["r0", "r1", "r2", "r3"]


def test_oldest_runs_at_once_when_max_batch_size_is_reached() -> None:
    b = oldest(slots=4, max_batch_size=3, max_queue_delay_ns=10 * MS)
    put(b, 0, "a0", start=True)
    put(b, 1, "b0", start=True)
    d = b.next_batch(0)
    assert d.rows == [] and d.wait_ns == 10 * MS
    put(b, 2, "c0", start=True)
    assert items(b.next_batch(0)) == ["a0", "b0", "c0"]


def test_oldest_largest_preferred_size_runs_at_once() -> None:
    b = oldest(slots=4, max_batch_size=4, preferred=(3,), max_queue_delay_ns=10 * MS)
    for i in range(3):
        put(b, i, f"r{i}", start=True, now=i)
    assert items(b.next_batch(3)) == ["r0", "r1", "r2"]


def test_oldest_shape_mismatch_ends_the_batch() -> None:
    b = oldest(slots=4, max_batch_size=4, max_queue_delay_ns=10 * MS)
    put(b, 0, "a0", start=True, now=0, key="x")
    put(b, 1, "b0", start=True, now=1, key="y")
    put(b, 2, "c0", start=True, now=2, key="x")
    # A head of another shape: the batch so far runs now (no waiting for more).
    d = b.next_batch(3)
    assert items(d) == ["a0"]
    b.finish(d.rows)
    assert items(b.next_batch(3)) == ["b0"]


# --------------------------------------------------------------------------- ownership and stale steps


def test_stale_step_unknown_slot() -> None:
    b = direct(slots=2)
    for slot in (2, -1):
        with pytest.raises(StaleStep):
            put(b, slot, "x", start=True)


def test_stale_step_without_start_in_an_empty_slot() -> None:
    b = direct(slots=2)
    with pytest.raises(StaleStep):
        put(b, 0, "a1")


def test_stale_step_wrong_generation_or_id() -> None:
    b = direct(slots=2)
    put(b, 0, "a0", corr=7, gen=1, start=True)
    with pytest.raises(StaleStep):
        put(b, 0, "a1", corr=7, gen=2)
    with pytest.raises(StaleStep):
        put(b, 0, "a1", corr=8, gen=1)
    put(b, 0, "a1", corr=7, gen=1)
    assert b.queued == 2


def test_stale_step_after_end_is_queued() -> None:
    b = direct(slots=2)
    put(b, 0, "a0", corr=7, start=True, end=True)
    with pytest.raises(StaleStep):
        put(b, 0, "a1", corr=7)
    assert b.queued == 1


def test_start_after_queued_end_of_the_same_owner_reopens_the_sequence() -> None:
    b = direct(slots=1)
    put(b, 0, "a0", corr=7, start=True, end=True)
    assert put(b, 0, "b0", corr=7, start=True) == []  # same slot_token: queued behind the END, nothing displaced
    d = b.next_batch(0)
    assert items(d) == ["a0"]
    assert b.finish(d.rows) == []  # the END ran, but the slot was reopened by the START
    put(b, 0, "b1", corr=7, end=True)
    d = b.next_batch(0)
    assert items(d) == ["b0"]
    assert b.finish(d.rows) == []
    d = b.next_batch(0)
    assert items(d) == ["b1"]
    assert b.finish(d.rows) == [SlotEvent(0, 7, 1)]


def test_start_with_a_new_owner_takes_the_slot_over() -> None:
    b = direct(slots=1)
    put(b, 0, "a0", corr=7, gen=1, start=True)
    put(b, 0, "a1", corr=7, gen=1)
    put(b, 0, "a2", corr=7, gen=1)
    assert put(b, 0, "b0", corr=8, gen=2, start=True) == ["a0", "a1", "a2"]
    assert b.owner(0) == (8, 2)
    assert items(b.next_batch(0)) == ["b0"]
    with pytest.raises(StaleStep):
        put(b, 0, "a3", corr=7, gen=1)


def test_start_with_a_new_generation_of_the_same_id_restarts_after_its_queued_requests() -> None:
    b = direct(slots=1)
    put(b, 0, "a0", corr=7, gen=1, start=True)
    put(b, 0, "a1", corr=7, gen=1)
    assert put(b, 0, "b0", corr=7, gen=2, start=True) == []  # nothing displaced
    assert b.owner(0) == (7, 2)
    with pytest.raises(StaleStep):
        put(b, 0, "a2", corr=7, gen=1)  # the old slot_token's later steps are stale
    put(b, 0, "b1", corr=7, gen=2, end=True)
    runs = []
    while (d := b.next_batch(0)).rows:
        runs.append((items(d), b.finish(d.rows)))
    assert runs == [(["a0"], []), (["a1"], []), (["b0"], []), (["b1"], [SlotEvent(0, 7, 2)])]


def test_late_start_of_a_released_generation_is_stale() -> None:
    b = direct(slots=1, idle_ns=10)
    put(b, 0, "a0", corr=7, gen=5, start=True, end=True)
    assert b.finish(b.next_batch(0).rows) == [SlotEvent(0, 7, 5)]
    # A START carrying the slot_token the slot just released must not take the slot back.
    with pytest.raises(StaleStep):
        put(b, 0, "late", corr=7, gen=5, start=True)
    put(b, 0, "b0", corr=7, gen=6, start=True)
    b.finish(b.next_batch(0).rows)
    assert b.expire_idle(100) == [SlotEvent(0, 7, 6)]
    with pytest.raises(StaleStep):
        put(b, 0, "late", corr=7, gen=6, start=True, now=100)
    put(b, 0, "c0", corr=8, gen=7, start=True, now=100)
    assert b.owner(0) == (8, 7)


def test_takeover_while_the_old_owner_executes() -> None:
    b = direct(slots=1)
    put(b, 0, "a0", corr=7, gen=1, start=True)
    running = b.next_batch(0)
    put(b, 0, "b0", corr=8, gen=2, start=True, end=True)
    assert b.finish(running.rows) == []  # the old owner's execution ends: the new owner keeps the slot
    d = b.next_batch(0)
    assert items(d) == ["b0"]
    assert b.finish(d.rows) == [SlotEvent(0, 8, 2)]


def test_restart_by_a_new_generation_of_the_same_id_while_executing() -> None:
    b = direct(slots=1)
    put(b, 0, "a0", corr=7, gen=1, start=True)
    running = b.next_batch(0)
    put(b, 0, "b0", corr=7, gen=2, start=True, end=True)
    assert b.finish(running.rows) == []
    d = b.next_batch(0)
    assert items(d) == ["b0"]
    assert b.finish(d.rows) == [SlotEvent(0, 7, 2)]


# --------------------------------------------------------------------------- release


def test_finish_releases_the_slot_of_an_executed_end() -> None:
    b = direct(slots=2)
    put(b, 0, "a0", corr=7, gen=3, start=True, end=True)
    put(b, 1, "b0", corr=8, gen=4, start=True)
    d = b.next_batch(0)
    assert b.finish(d.rows) == [SlotEvent(0, 7, 3)]
    assert b.occupied() == [SlotEvent(1, 8, 4)]
    assert b.owner(0) is None


def test_finish_keeps_the_slot_while_requests_of_the_sequence_remain() -> None:
    b = oldest(slots=2, max_batch_size=2)
    put(b, 0, "a0", corr=7, start=True)
    d1 = b.next_batch(0)
    put(b, 0, "a1", corr=7, end=True)
    assert b.owner(0) == (7, 1)
    assert b.finish(d1.rows) == []
    d2 = b.next_batch(0)
    assert b.finish(d2.rows) == [SlotEvent(0, 7, 1)]


def test_finish_ignores_empty_rows() -> None:
    b = direct(slots=3)
    put(b, 2, "c0", start=True)
    d = b.next_batch(0)
    assert [r.pending is None for r in d.rows] == [True, True, False]
    assert b.finish(d.rows) == []
    assert b.finish([Row(0, None, None)]) == []


def test_expire_idle_and_idle_wait() -> None:
    b = direct(slots=3, idle_ns=1_000 * US)
    assert b.idle_wait_ns(0) == 0  # nothing idle
    put(b, 0, "a0", corr=7, gen=1, start=True, now=0)
    put(b, 1, "b0", corr=8, gen=2, start=True, now=200 * US)
    assert b.idle_wait_ns(300 * US) == 0  # both have a request queued: not idle
    d = b.next_batch(300 * US)
    assert b.idle_wait_ns(300 * US) == 0  # executing: not idle
    assert b.expire_idle(10**12) == []
    b.finish(d.rows)
    assert b.idle_wait_ns(300 * US) == 700 * US  # measured from each sequence's last request
    assert b.expire_idle(999 * US) == []
    assert b.expire_idle(1_000 * US) == [SlotEvent(0, 7, 1)]
    assert b.idle_wait_ns(1_000 * US) == 200 * US
    assert b.idle_wait_ns(5_000 * US) == 1_000  # overdue: ask again at once (1 us floor)
    assert b.expire_idle(1_200 * US) == [SlotEvent(1, 8, 2)]
    assert b.occupied() == [] and b.idle_wait_ns(10**12) == 0


def test_a_new_request_resets_the_idle_clock() -> None:
    b = direct(slots=1, idle_ns=1_000 * US)
    put(b, 0, "a0", corr=7, start=True, now=0)
    b.finish(b.next_batch(0).rows)
    put(b, 0, "a1", corr=7, now=900 * US)
    b.finish(b.next_batch(900 * US).rows)
    assert b.expire_idle(1_500 * US) == []
    assert b.expire_idle(1_900 * US) == [SlotEvent(0, 7, 1)]


def test_expired_sequence_gets_stale_steps() -> None:
    b = direct(slots=1, idle_ns=10)
    put(b, 0, "a0", corr=7, start=True, now=0)
    b.finish(b.next_batch(0).rows)
    assert b.expire_idle(10) == [SlotEvent(0, 7, 1)]
    with pytest.raises(StaleStep):
        put(b, 0, "a1", corr=7, now=11)


def test_occupied_and_owner() -> None:
    b = oldest(slots=3)
    put(b, 2, "c0", corr="s", gen=9, start=True)
    put(b, 0, "a0", corr=1, gen=8, start=True)
    assert b.occupied() == [SlotEvent(0, 1, 8), SlotEvent(2, "s", 9)]
    assert b.owner(1) is None and b.owner(2) == ("s", 9) and b.owner(7) is None and b.owner(-1) is None
    assert b.queued == 2
