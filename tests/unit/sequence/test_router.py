"""SequenceRouter: assignment and lookup for every sequence model, waiting while backlogged, slot events."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.errors import InvalidArgument, NotFound, Unavailable
from serve_app.sequence.batcher import SequenceBatcher, SequenceBatchingConfig
from serve_app.sequence.messages import (
    BACKLOG_TIMEOUT,
    Assignment,
    AssignRequest,
    BacklogDeadline,
    InstanceEvents,
    LookupRequest,
    PollEvents,
    SlotEvent,
)
from serve_app.sequence.router import SequenceRouter
from tests.support.clock import FakeClock

KEY = "m:1"


def router(slots: int = 1, instances: tuple[str, ...] = ("A",), clock: FakeClock | None = None) -> SequenceRouter:
    r = SequenceRouter(clock) if clock is not None else SequenceRouter()
    r.add_model(KEY, "m", slots)
    for name in instances:
        r.instance_up(KEY, name, (name.lower(), 1))
    return r


def release_event(a: Assignment, corr: int | str) -> InstanceEvents:
    return InstanceEvents(a.instance, (SlotEvent(a.slot, corr, a.slot_token),))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_assign_places_at_once() -> None:
    r = router(slots=2)
    a1 = await r.assign(KEY, 1)
    a2 = await r.assign(KEY, "two")
    assert (a1.instance, a1.slot, a1.address) == ("A", 0, ("a", 1))
    assert (a2.instance, a2.slot) == ("A", 1)
    assert await r.lookup(KEY, 1) == a1
    again = await r.assign(KEY, 1)  # START of an active sequence: the same slot, a new slot_token
    assert (again.instance, again.slot) == (a1.instance, a1.slot) and again.slot_token != a1.slot_token
    assert await r.lookup(KEY, 1) == again


async def test_handle_dispatches_messages() -> None:
    r = router(slots=1)
    placed = await r.handle(AssignRequest(KEY, 5))
    assert await r.handle(LookupRequest(KEY, 5)) == placed
    with pytest.raises(TypeError):
        await r.handle(PollEvents())


async def test_unknown_model() -> None:
    r = router()
    with pytest.raises(NotFound, match="no sequence model 'other:1'"):
        await r.assign("other:1", 1)
    with pytest.raises(NotFound):
        r.released("other:1", InstanceEvents("A"))


async def test_add_model_twice_keeps_the_table() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    r.add_model(KEY, "m", 8)
    assert r.assigner(KEY).slots == 1 and 1 in r.assigner(KEY).active


async def test_backlogged_start_waits_until_a_slot_is_released() -> None:
    r = router(slots=1)
    first = await r.assign(KEY, 1)
    waiting = asyncio.create_task(r.assign(KEY, 2))
    later = asyncio.create_task(r.assign(KEY, 3))
    await settle()
    assert not waiting.done() and not later.done()
    assert r.assigner(KEY).backlog == [2, 3]
    r.released(KEY, release_event(first, 1))
    second = await asyncio.wait_for(waiting, 1)
    assert (second.instance, second.slot) == ("A", 0) and second.slot_token != first.slot_token
    await settle()
    assert not later.done()
    r.released(KEY, release_event(second, 2))
    assert (await asyncio.wait_for(later, 1)).slot == 0


async def test_lookup_of_a_backlogged_sequence_waits_for_its_admission() -> None:
    r = router(slots=1)
    first = await r.assign(KEY, 1)
    start = asyncio.create_task(r.assign(KEY, 2))
    await settle()
    step = asyncio.create_task(r.lookup(KEY, 2))  # a later step of the backlogged sequence
    again = asyncio.create_task(r.handle(LookupRequest(KEY, 2)))
    await settle()
    assert not step.done()
    r.released(KEY, release_event(first, 1))
    placed = await asyncio.wait_for(start, 1)
    assert await asyncio.wait_for(step, 1) == placed
    assert await asyncio.wait_for(again, 1) == placed


async def test_lookup_errors_are_raised_at_once() -> None:
    r = router(slots=1)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await r.lookup(KEY, 9)


async def test_backlog_admitted_when_an_instance_comes_up() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    waiting = asyncio.create_task(r.assign(KEY, 2))
    await settle()
    r.instance_up(KEY, "B", ("b", 1))
    placed = await asyncio.wait_for(waiting, 1)
    assert (placed.instance, placed.slot, placed.address) == ("B", 0, ("b", 1))


async def test_instance_up_with_occupied_slots() -> None:
    r = SequenceRouter()
    r.add_model(KEY, "m", 2)
    r.instance_up(KEY, "A", ("a", 1), (SlotEvent(1, 7, 1234),))
    assert await r.lookup(KEY, 7) == Assignment("A", ("a", 1), 1, 1234)
    assert (await r.assign(KEY, 8)).slot == 0


async def test_instance_down_loses_its_sequences(caplog: pytest.LogCaptureFixture) -> None:
    r = router(slots=1, instances=("A", "B"))
    a1 = await r.assign(KEY, 1)
    await r.assign(KEY, 2)
    r.instance_down(KEY, a1.instance, "actor died")
    assert "lost with instance" in caplog.text
    with pytest.raises(Unavailable) as exc:
        await r.lookup(KEY, 1)
    assert "sequence 1 of model 'm' was lost: actor died" in exc.value.message
    r.instance_down(KEY, "nope", "unknown instance: nothing happens")
    # Restarting the lost sequence waits for a slot (the remaining instance is full).
    restart = asyncio.create_task(r.assign(KEY, 1))
    await settle()
    assert not restart.done()
    r.instance_up(KEY, "C", ("c", 1))
    assert (await asyncio.wait_for(restart, 1)).instance == "C"


async def test_release_with_a_stale_generation_wakes_nobody() -> None:
    r = router(slots=1)
    first = await r.assign(KEY, 1)
    waiting = asyncio.create_task(r.assign(KEY, 2))
    await settle()
    r.released(KEY, InstanceEvents("A", (SlotEvent(first.slot, 1, first.slot_token + 1),)))
    r.released(KEY, InstanceEvents("A", (SlotEvent(first.slot, 99, first.slot_token),)))
    await settle()
    assert not waiting.done()
    r.released(KEY, release_event(first, 1))
    assert (await asyncio.wait_for(waiting, 1)).slot == first.slot


async def test_several_releases_in_one_event() -> None:
    r = router(slots=2)
    a1, a2 = await r.assign(KEY, 1), await r.assign(KEY, 2)
    waiters = [asyncio.create_task(r.assign(KEY, c)) for c in (3, 4, 5)]
    await settle()
    r.released(KEY, InstanceEvents("A", (SlotEvent(a1.slot, 1, a1.slot_token), SlotEvent(a2.slot, 2, a2.slot_token))))
    await settle()
    assert [t.done() for t in waiters] == [True, True, False]
    assert {waiters[0].result().slot, waiters[1].result().slot} == {0, 1}
    assert r.assigner(KEY).backlog == [5]
    waiters[2].cancel()


async def test_cancelled_backlogged_start_does_not_take_a_slot() -> None:
    r = router(slots=1)
    first = await r.assign(KEY, 1)
    gave_up = asyncio.create_task(r.assign(KEY, 2))
    await settle()
    gave_up.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gave_up
    r.released(KEY, release_event(first, 1))
    assert r.assigner(KEY).active == {} and r.assigner(KEY).backlog == []
    assert r.assigner(KEY).free_slots() == 1


async def test_a_backlogged_sequence_stays_while_someone_waits_for_it() -> None:
    r = router(slots=1)
    first = await r.assign(KEY, 1)
    start = asyncio.create_task(r.assign(KEY, 2))
    step = asyncio.create_task(r.lookup(KEY, 2))
    await settle()
    start.cancel()  # the START gave up, a later step of the same sequence still waits
    await settle()
    assert r.assigner(KEY).backlog == [2]
    r.released(KEY, release_event(first, 1))
    assert (await asyncio.wait_for(step, 1)).slot == 0
    assert start.cancelled()


async def test_released_with_a_time_reclaims_slots_never_taken_up() -> None:
    r = SequenceRouter()
    r.add_model(KEY, "m", 1, grace_ns=1_000)
    r.instance_up(KEY, "A", ("a", 1))
    await r.assign(KEY, 1)  # its START never reaches the instance
    waiting = asyncio.create_task(r.assign(KEY, 2))
    await settle()
    r.released(KEY, InstanceEvents("A"))  # without a time: no reconciliation
    r.released(KEY, InstanceEvents("A"), now_ns=5_000)
    r.released(KEY, InstanceEvents("A"), now_ns=5_999)
    await settle()
    assert not waiting.done()
    r.released(KEY, InstanceEvents("A"), now_ns=6_000)
    assert (await asyncio.wait_for(waiting, 1)).slot == 0
    # Held by the instance (reported occupied): kept however long it lasts.
    held = r.assigner(KEY).active[2]
    for t in (10_000, 20_000, 30_000):
        r.released(KEY, InstanceEvents("A", (), (SlotEvent(0, 2, held.slot_token),)), now_ns=t)
    assert r.assigner(KEY).active[2] == held


async def test_restart_of_an_id_racing_its_release() -> None:
    r = router(slots=1)
    instance = SequenceBatcher[str](SequenceBatchingConfig(direct=True, slots=1, max_batch_size=1))
    place = await r.assign(KEY, 7)
    instance.enqueue(place.slot, 7, place.slot_token, "only", start=True, end=True, now_ns=0)
    released = instance.finish(instance.next_batch(0).rows)  # END ran: the instance frees the slot ...
    assert released == [SlotEvent(0, 7, place.slot_token)]
    again = await r.assign(KEY, 7)  # ... and the client restarts 7 before the router heard of it
    instance.enqueue(again.slot, 7, again.slot_token, "restart", start=True, end=False, now_ns=1)
    assert instance.owner(0) is not None  # the instance holds the new sequence 7
    r.released(KEY, InstanceEvents("A", tuple(released)))  # the release arrives late
    # The router must still see the slot as taken by 7: a new sequence waits instead of taking it over.
    assert 7 in r.assigner(KEY).active
    other = asyncio.create_task(r.assign(KEY, 8))
    await settle()
    try:
        assert not other.done()
    finally:
        other.cancel()


async def test_remove_model_fails_its_backlog_and_forgets_it() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    waiting = asyncio.ensure_future(r.assign(KEY, 2))
    await settle()
    r.remove_model(KEY)
    with pytest.raises(Unavailable, match="was unloaded"):
        await waiting
    with pytest.raises(NotFound):
        await r.assign(KEY, 3)
    r.remove_model(KEY)  # twice is fine


async def test_instance_poll_reports_draining() -> None:
    events = InstanceEvents("A", (), (), True)
    assert events.draining
    assert not InstanceEvents("A").draining


# --------------------------------------------------------------------------- backlog timeouts


async def test_a_backlogged_start_fails_when_its_timeout_passes() -> None:
    """The request's timeout (100 s here) bounds its wait in the backlog: then it and every request of the
    sequence waiting at the router fail with Triton's message, the ID is forgotten, and the next backlogged
    sequence gets the slot when it frees."""
    clock = FakeClock(1_000)
    r = router(slots=1, clock=clock)
    first = await r.assign(KEY, 1)
    waiting = asyncio.ensure_future(r.handle(AssignRequest(KEY, 2, timeout_us=100_000_000)))
    other_gateway = asyncio.ensure_future(r.handle(LookupRequest(KEY, 2)))
    third = asyncio.ensure_future(r.assign(KEY, 3))
    await settle()
    clock.advance(99_999_999_999)
    r.expire_backlogs()
    await settle()
    assert not waiting.done()
    clock.advance(1)
    r.expire_backlogs()
    for task in (waiting, other_gateway):
        with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
            await asyncio.wait_for(task, 1)
    assert r.assigner(KEY).backlog == [3]
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        await r.lookup(KEY, 2)
    r.released(KEY, release_event(first, 1))
    assert (await asyncio.wait_for(third, 1)).slot == 0


async def test_the_backlog_timer_fires_on_its_own() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
        await asyncio.wait_for(r.assign(KEY, 2, timeout_us=1_000), 5)
    assert r.assigner(KEY).backlog == []


async def test_a_lookup_timeout_shortens_the_wait_of_a_backlogged_start() -> None:
    clock = FakeClock(0)
    r = router(slots=1, clock=clock)
    await r.assign(KEY, 1)
    start = asyncio.ensure_future(r.assign(KEY, 2))  # no timeout of its own
    await settle()
    step = asyncio.ensure_future(r.lookup(KEY, 2, timeout_us=50_000_000))
    await settle()
    clock.advance(50_000_000_000)
    r.expire_backlogs()
    for task in (start, step):
        with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
            await asyncio.wait_for(task, 1)


async def test_a_backlog_deadline_message_shortens_the_wait() -> None:
    """A gateway holding a step behind the backlogged START posts its timeout (one way)."""
    clock = FakeClock(0)
    r = router(slots=1, clock=clock)
    await r.assign(KEY, 1)
    start = asyncio.ensure_future(r.assign(KEY, 2))
    await settle()
    r.one_way(BacklogDeadline(KEY, 2, 30_000_000))
    r.one_way(BacklogDeadline(KEY, 1, 1))  # not backlogged (it has its slot): nothing to shorten
    r.one_way(BacklogDeadline("other:1", 2, 1))  # no such model: ignored
    assert r.assigner(KEY).next_deadline() == 30_000_000_000
    clock.advance(30_000_000_000)
    r.expire_backlogs()
    with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
        await asyncio.wait_for(start, 1)
    assert 1 in r.assigner(KEY).active
