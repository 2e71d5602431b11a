"""Restoring backed-up sequences of a lost instance: SequenceAssigner bookkeeping (backups passed on by gateways or
carried by snapshots, each from the sequence's owner, the highest number kept) and SequenceRouter waits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.sequence.assigner import Restore, SequenceAssigner
from serve_app.sequence.backups import RECENT
from serve_app.sequence.messages import (
    Assignment,
    InstanceEvents,
    RecoverRequest,
    Recovery,
    SlotEvent,
    StateBackup,
    StateBackups,
)
from serve_app.sequence.router import SequenceRouter

KEY = "m:1"


# --------------------------------------------------------------------------- helpers


def assigner(slots: int = 2, instances: tuple[str, ...] = ("A", "B")) -> SequenceAssigner:
    a = SequenceAssigner("m", slots)
    for name in instances:
        assert a.add_instance(name, (name.lower(), 9000)) == []
    return a


def state(value: int) -> dict[str, np.ndarray]:
    return {"STATE": np.array([value], dtype=np.int32)}


def backup_for(
    place: Assignment,
    corr: int | str,
    value: int,
    *,
    no: int = 0,
    step_id: int = 0,
    answer: int | None = None,
    instance: str = "",
) -> StateBackup:
    """A backup of ``corr`` in ``place``; ``instance``: the instance it names (a gateway passes on the one the
    step ran on; the router fills in the polled instance for a snapshot's that names none)."""
    outputs = None if answer is None else {"OUTPUT": np.array([[answer]], dtype=np.int32)}
    return StateBackup(
        corr, place.slot, place.slot_token, state(value), instance=instance, no=no, step_id=step_id, outputs=outputs
    )


def next_no(a: SequenceAssigner, corr: int | str) -> int:
    """The number the sequence's owner gives its next step (as an instance counts them)."""
    record = a.backups.get(corr)
    return record.no + 1 if record is not None and record.slot_token == a.active[corr].slot_token else 1


def back_up(a: SequenceAssigner, corr: int | str, value: int, *, no: int | None = None) -> None:
    """A gateway passes on the state its sequence's current owner answered with (naming that instance)."""
    place = a.active[corr]
    number = next_no(a, corr) if no is None else no
    a.backed_up("", (backup_for(place, corr, value, no=number, instance=place.instance),))


def snapshot_up(a: SequenceAssigner, corr: int | str, value: int, *, step_id: int, answer: int) -> None:
    """The sequence's current owner reports its state in a snapshot, with its last step and answer."""
    place = a.active[corr]
    backup = backup_for(place, corr, value, no=next_no(a, corr), step_id=step_id, answer=answer)
    a.backed_up(place.instance, (backup,))


def stored(a: SequenceAssigner, corr: int | str) -> list[int] | None:
    record = a.backups.get(corr)
    return None if record is None else record.states["STATE"].tolist()


def where(place: Assignment | None) -> tuple[str, int]:
    assert place is not None
    return place.instance, place.slot


def only_restore(a: SequenceAssigner) -> Restore:
    restores = a.take_restores()
    assert len(restores) == 1, restores
    return restores[0]


# --------------------------------------------------------------------------- assigner: backups


def test_backed_up_only_from_the_current_owner() -> None:
    a = assigner()
    place = a.start(1)
    assert place is not None and place.instance == "A"
    other = "B"
    a.backed_up(other, (backup_for(place, 1, 5),))  # another instance
    a.backed_up(place.instance, (StateBackup(1, place.slot + 1, place.slot_token, state(5)),))  # another slot
    a.backed_up(place.instance, (StateBackup(1, place.slot, place.slot_token + 1, state(5)),))  # another slot_token
    a.backed_up(place.instance, (StateBackup(2, place.slot, place.slot_token, state(5)),))  # a sequence not active
    assert 1 not in a.backups and 2 not in a.backups and len(a.backups) == 0
    a.backed_up(place.instance, (backup_for(place, 1, 5),))
    assert stored(a, 1) == [5]


def test_backed_up_several_in_one_event() -> None:
    a = assigner(slots=2, instances=("A",))
    p1, p2 = a.start(1), a.start(2)
    assert p1 is not None and p2 is not None
    a.backed_up("A", (backup_for(p1, 1, 1, no=1), backup_for(p2, 2, 2, no=1), backup_for(p1, 1, 3, no=2)))
    assert stored(a, 1) == [3] and stored(a, 2) == [2]  # the latest of each
    # The same through a gateway (one StateBackups message), each naming its instance.
    a.backed_up("", (backup_for(p2, 2, 5, no=2, instance="A"), backup_for(p1, 1, 4, no=3, instance="A")))
    assert stored(a, 1) == [4] and stored(a, 2) == [5]


def test_gateway_backups_name_their_instance() -> None:
    a = assigner()
    place = a.start(1)
    assert place is not None and place.instance == "A"
    a.backed_up("", (backup_for(place, 1, 5, no=1, instance="B"),))  # names another instance
    a.backed_up("", (backup_for(place, 1, 5, no=1),))  # names none, and no polled instance fills in
    a.backed_up("A", (backup_for(place, 1, 5, no=1, instance="B"),))  # the instance it names counts
    assert 1 not in a.backups
    a.backed_up("", (backup_for(place, 1, 5, no=1, instance="A"),))
    assert stored(a, 1) == [5]
    a.backed_up("B", (backup_for(place, 1, 6, no=2, instance="A"),))  # named: the other argument does not matter
    assert stored(a, 1) == [6]
    record = a.backups.get(1)
    assert record is not None and record.no == 2


def test_a_lower_number_from_the_owner_is_ignored() -> None:
    """Steps of one sequence answered through several gateways: their backups may arrive out of order."""
    a = assigner()
    place = a.start(1)
    assert place is not None
    back_up(a, 1, 1, no=1)
    back_up(a, 1, 6, no=3)
    back_up(a, 1, 3, no=2)  # late
    assert stored(a, 1) == [6]
    record = a.backups.get(1)
    assert record is not None and record.no == 3
    back_up(a, 1, 10, no=4)
    assert stored(a, 1) == [10]


def test_backup_of_a_restarted_sequence_under_its_old_generation_is_ignored() -> None:
    a = assigner(instances=("A",))
    old = a.start(1)
    assert old is not None
    back_up(a, 1, 4)
    new = a.start(1)  # restarted: same slot, new slot_token
    assert new is not None and new.slot_token != old.slot_token
    a.backed_up("A", (backup_for(old, 1, 9),))  # a late backup of the old slot_token
    assert stored(a, 1) == [4]
    back_up(a, 1, 1)  # the new slot_token's: replaces the record
    assert stored(a, 1) == [1]
    record = a.backups.get(1)
    assert record is not None and record.slot_token == new.slot_token


def test_release_drops_the_backup() -> None:
    a = assigner()
    place = a.start(1)
    assert place is not None
    back_up(a, 1, 3)
    assert a.release(place.instance, place.slot, 1, place.slot_token) == []
    assert 1 not in a.backups
    with pytest.raises(InvalidArgument, match="START flag"):
        a.lookup(1)


def test_stale_release_keeps_the_backup() -> None:
    a = assigner(instances=("A",))
    old = a.start(1)
    assert old is not None
    a.start(1)
    back_up(a, 1, 3)
    a.release(old.instance, old.slot, 1, old.slot_token)  # the old slot_token's END, late
    assert stored(a, 1) == [3]


# --------------------------------------------------------------------------- assigner: restores


def test_remove_instance_queues_backed_up_sequences_for_restore() -> None:
    a = assigner(slots=2, instances=("A", "B"))
    p1, p2, p3 = a.start(1), a.start(2), a.start(3)
    assert [where(p) for p in (p1, p2, p3)] == [("A", 0), ("B", 0), ("A", 1)]
    back_up(a, 1, 7)
    back_up(a, 2, 8)
    # 3 (on A) has no backup yet: lost.  1 (on A) waits for its restore; 2 (on B) is untouched.
    assert a.remove_instance("A", "replica died", now_ns=100) == [3]
    assert a.restoring() == 1
    assert a.lookup(1) is None  # waits for the restore
    assert a.lookup(2) == p2
    with pytest.raises(Unavailable, match="sequence 3 of model 'm' was lost: replica died"):
        a.lookup(3)
    restore = only_restore(a)
    assert restore.corr_id == 1
    assert where(restore.assignment) == ("B", 1)
    assert restore.assignment.address == ("b", 9000)
    assert restore.assignment.slot_token != p1.slot_token  # type: ignore[union-attr]
    assert restore.states["STATE"].tolist() == [7] and restore.no == 1
    assert a.take_restores() == []  # each is handed out once
    assert a.lookup(1) is None  # still restoring until restored()
    assert 1 not in a.active
    assert a.free_slots() == 0  # the target slot is taken meanwhile


def test_restored_ok_makes_it_active() -> None:
    a = assigner()
    a.start(1)
    snapshot_up(a, 1, 7, step_id=11, answer=7)
    a.remove_instance("A", "gone")
    restore = only_restore(a)
    admitted, lost = a.restored(1, restore.assignment, True, "")
    assert admitted == [(1, restore.assignment)] and not lost
    assert a.lookup(1) == restore.assignment
    assert a.restoring() == 0
    record = a.backups.get(1)
    assert record is not None and record.slot_token == restore.assignment.slot_token
    assert a.backups.answer(1, 11) is not None  # the answers survive the move
    back_up(a, 1, 9)  # the new owner's backups are accepted
    assert stored(a, 1) == [9]
    # A second outcome for the same restore changes nothing.
    assert a.restored(1, restore.assignment, False, "late") == ([], False)
    assert a.lookup(1) == restore.assignment


def test_restore_carries_the_number_of_the_backed_up_state() -> None:
    a = assigner()
    a.start(1)
    old = a.active[1]
    for value in (1, 3, 6):
        back_up(a, 1, value)  # numbers 1, 2, 3
    back_up(a, 1, 3, no=2)  # a late one: ignored
    a.remove_instance("A", "gone")
    restore = only_restore(a)
    assert (restore.no, restore.states["STATE"].tolist()) == (3, [6])
    a.restored(1, restore.assignment, True, "")
    # A late backup of the lost instance is not the new owner's, even with a higher number.
    a.backed_up("", (backup_for(old, 1, 99, no=4, instance="A"),))
    assert stored(a, 1) == [6]
    # The new owner numbers its steps after the restored state (RestoreSequence.no).
    back_up(a, 1, 7)
    record = a.backups.get(1)
    assert record is not None and record.no == 4 and stored(a, 1) == [7]


def test_restore_from_a_snapshot_carries_its_number() -> None:
    a = SequenceAssigner("m", 2)
    a.add_instance("A", ("a", 1), (SlotEvent(0, 9, 1234),))  # a restarted router learns of 9 from a snapshot
    a.add_instance("B", ("b", 1))
    snap = StateBackup(9, 0, 1234, state(4), instance="A", no=12, step_id=77, outputs=None)
    a.backed_up("A", (snap,))
    a.backed_up("", (StateBackup(9, 0, 1234, state(3), instance="A", no=11),))  # a gateway's, older than it
    assert stored(a, 9) == [4]
    a.remove_instance("A", "gone")
    restore = only_restore(a)
    assert restore.corr_id == 9 and restore.no == 12 and restore.states["STATE"].tolist() == [4]


def test_restored_failed_makes_it_lost_and_frees_the_slot() -> None:
    a = assigner()
    a.start(1)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone")
    restore = only_restore(a)
    free = a.free_slots()
    admitted, lost = a.restored(1, restore.assignment, False, "restore refused")
    assert lost and admitted == []
    assert a.free_slots() == free + 1
    assert 1 not in a.backups and a.restoring() == 0
    with pytest.raises(Unavailable) as info:
        a.lookup(1)
    assert "sequence 1 of model 'm' was lost: restore refused" in info.value.message
    assert "START flag" in info.value.message


def test_restored_failed_admits_the_backlog() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    # 2 lives on B; A dies, 1 is placed on a new instance C; 3 waits in the backlog behind it.
    a.remove_instance("A", "gone")
    assert a.restoring() == 1 and a.take_restores() == []
    assert a.add_instance("C", ("c", 1)) == []  # its slot goes to the restore
    restore = only_restore(a)
    assert where(restore.assignment) == ("C", 0)
    assert a.start(3) is None and a.backlog == [3]
    admitted, lost = a.restored(1, restore.assignment, False, "broken")
    assert lost
    assert [(c, where(p)) for c, p in admitted] == [(3, ("C", 0))]


def test_no_free_slot_waits_until_an_instance_comes_up() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    assert a.remove_instance("A", "gone", now_ns=1_000) == []
    assert a.take_restores() == [] and a.restoring() == 1
    assert a.lookup(1) is None
    assert a.expire_restores(1_000 + 499, 500) == []  # not yet
    assert a.add_instance("C", ("c", 1)) == []  # the restore is not a backlog admission
    restore = only_restore(a)
    assert restore.corr_id == 1 and where(restore.assignment) == ("C", 0)
    assert a.expire_restores(10**12, 500) == []  # placed: no longer expires
    a.restored(1, restore.assignment, True, "")
    assert where(a.lookup(1)) == ("C", 0)


def test_no_free_slot_expires_to_lost() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    a.remove_instance("A", "replica died", now_ns=1_000)
    assert a.expire_restores(1_499, 500) == []
    assert a.expire_restores(1_500, 500) == [1]
    assert a.restoring() == 0 and 1 not in a.backups
    with pytest.raises(Unavailable) as info:
        a.lookup(1)
    assert "was lost: replica died, and no instance had a free slot to restore it" in info.value.message
    assert a.add_instance("C", ("c", 1)) == []
    assert a.take_restores() == []  # nothing is placed any more


def test_restore_goes_before_the_backlog() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    p2 = a.start(2)
    assert p2 is not None
    back_up(a, 1, 7)
    assert a.start(3) is None and a.backlog == [3]
    a.remove_instance("A", "gone")
    assert a.take_restores() == []
    admitted = a.release(p2.instance, p2.slot, 2, p2.slot_token)  # B's slot frees: the restore takes it
    assert admitted == []
    assert a.backlog == [3]
    restore = only_restore(a)
    assert restore.corr_id == 1 and where(restore.assignment) == ("B", 0)
    with pytest.raises(InvalidArgument):
        a.lookup(2)


def test_start_while_queued_for_restore_drops_the_backup_and_starts_anew() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone", now_ns=0)
    assert a.restoring() == 1
    assert a.start(1) is None  # no free slot: it waits in the backlog as a new sequence
    assert a.backlog == [1] and a.restoring() == 0 and 1 not in a.backups
    assert a.add_instance("C", ("c", 1)) == [(1, a.active[1])]  # admitted as a START, not restored
    assert a.take_restores() == []
    assert where(a.active[1]) == ("C", 0)
    assert a.expire_restores(10**12, 1) == []


def test_start_while_queued_for_restore_takes_a_free_slot() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone")
    a.add_instance("C", ("c", 1))
    restore = only_restore(a)  # placed on C, state on its way
    assert a.start(1) is None  # the START runs in the restored slot once it is there
    a.restored(1, restore.assignment, True, "")
    assert a.lookup(1) == restore.assignment


def test_restore_target_dying_before_restored_requeues_it() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone", now_ns=0)
    a.add_instance("C", ("c", 1))
    first = only_restore(a)
    assert first.assignment.instance == "C"
    assert a.remove_instance("C", "also gone", now_ns=10) == []  # requeued, not lost
    assert a.restoring() == 1 and a.lookup(1) is None
    assert 1 in a.backups
    assert a.take_restores() == []  # B is full
    assert a.restored(1, first.assignment, True, "") == ([], False)  # the outcome for C is stale
    assert a.lookup(1) is None
    a.add_instance("D", ("d", 1))
    second = only_restore(a)
    assert second.assignment.instance == "D"
    assert second.states["STATE"].tolist() == [7]
    a.restored(1, second.assignment, True, "")
    assert a.lookup(1) == second.assignment


def test_restore_target_dying_requeues_with_its_own_time() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone", now_ns=0)
    a.add_instance("C", ("c", 1))
    only_restore(a)
    a.remove_instance("C", "also gone", now_ns=1_000)
    assert a.expire_restores(1_499, 500) == []
    assert a.expire_restores(1_500, 500) == [1]
    with pytest.raises(Unavailable, match="was lost: also gone"):
        a.lookup(1)


def test_restore_spreads_over_instances_with_the_most_free_slots() -> None:
    a = assigner(slots=2, instances=("A", "B", "C"))
    for corr in (1, 2, 3, 4):
        a.start(corr)  # A0, B0, C0, A1
    back_up(a, 1, 10)
    back_up(a, 4, 40)
    assert a.remove_instance("A", "gone") == []
    restores = a.take_restores()
    assert [(r.corr_id, r.assignment.instance, r.states["STATE"].tolist()) for r in restores] == [
        (1, "B", [10]),
        (4, "C", [40]),
    ]


def test_restored_sequence_can_end_normally() -> None:
    a = assigner()
    a.start(1)
    back_up(a, 1, 7)
    a.remove_instance("A", "gone")
    restore = only_restore(a)
    a.restored(1, restore.assignment, True, "")
    target = restore.assignment
    a.release(target.instance, target.slot, 1, target.slot_token)
    assert 1 not in a.active and 1 not in a.backups
    assert a.free_slots() == 2  # B's both slots (A is gone)


# --------------------------------------------------------------------------- router


def router(slots: int = 1, instances: tuple[str, ...] = ("A", "B")) -> SequenceRouter:
    r = SequenceRouter()
    r.add_model(KEY, "m", slots)
    for name in instances:
        r.instance_up(KEY, name, (name.lower(), 1))
    return r


def send_backup(r: SequenceRouter, corr: int | str, value: int, *, step_id: int = 0, answer: int | None = None) -> None:
    """The state of ``corr`` in its owner's snapshot (numbered after the state kept), as the router takes it."""
    table = r.assigner(KEY)
    place = table.active[corr]
    backup = backup_for(place, corr, value, no=next_no(table, corr), step_id=step_id, answer=answer)
    r.backed_up(KEY, InstanceEvents(place.instance, backups=(backup,)))


async def post_backups(r: SequenceRouter, *backups: StateBackup) -> None:
    """Backups a gateway passes on: one StateBackups message to the router."""
    r.one_way(StateBackups(KEY, backups))  # a one-way message: no answer


def gateway_backup(r: SequenceRouter, corr: int | str, value: int, no: int) -> StateBackup:
    """The backup an answer of ``corr``'s current owner carries."""
    place = r.assigner(KEY).active[corr]
    return backup_for(place, corr, value, no=no, instance=place.instance)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def answer_of(recovery: Recovery) -> list[int] | None:
    return None if recovery.outputs is None else recovery.outputs["OUTPUT"].ravel().tolist()


async def test_router_backed_up_ignores_events_without_backups() -> None:
    r = router()
    await r.assign(KEY, 1)
    r.backed_up(KEY, InstanceEvents("A"))
    assert len(r.assigner(KEY).backups) == 0
    send_backup(r, 1, 5)
    assert len(r.assigner(KEY).backups) == 1


async def test_router_lookup_waits_for_the_restore() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    waiting = asyncio.create_task(r.lookup(KEY, 1))
    await settle()
    assert not waiting.done()
    restore = r.take_restores(KEY)[0]
    assert r.take_restores(KEY) == []
    assert restore.assignment.instance == "B"
    r.restored(KEY, restore, True)
    assert await asyncio.wait_for(waiting, 1) == restore.assignment
    assert await r.lookup(KEY, 1) == restore.assignment


async def test_router_take_restores_of_an_unknown_model() -> None:
    r = router()
    assert r.take_restores("other:1") == []
    r.restored("other:1", Restore(1, Assignment("A", ("a", 1), 0, 1), state(1)), True)  # ignored


async def test_router_restored_failed_wakes_waiters_with_the_lost_error(caplog: pytest.LogCaptureFixture) -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "replica died")
    waiting = asyncio.create_task(r.lookup(KEY, 1))
    await settle()
    restore = r.take_restores(KEY)[0]
    r.restored(KEY, restore, False, "connection refused")
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(waiting, 1)
    message = info.value.message
    assert "sequence 1 of model 'm' was lost" in message
    assert "restoring its state failed (connection refused)" in message
    assert "START flag" in message
    assert "could not be restored" in caplog.text
    assert r.assigner(KEY).free_slots() == 2  # B's slots: the failed target's was freed
    with pytest.raises(Unavailable, match="was lost"):
        await r.lookup(KEY, 1)


async def test_router_restore_placed_when_an_instance_comes_up_and_expires_otherwise() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    await r.assign(KEY, 2)
    send_backup(r, 1, 7)
    send_backup(r, 2, 8)
    r.restore_wait_ns = 1_000
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    r.instance_down(KEY, "B", "replica died", now_ns=0)
    w1 = asyncio.create_task(r.lookup(KEY, 1))
    w2 = asyncio.create_task(r.lookup(KEY, 2))
    await settle()
    assert r.take_restores(KEY) == []
    r.expire_restores(999)
    await settle()
    assert not w1.done() and not w2.done()
    r.instance_up(KEY, "C", ("c", 1))  # one slot: the first sequence queued gets it
    restore = r.take_restores(KEY)[0]
    assert restore.corr_id == 1
    r.restored(KEY, restore, True)
    assert await asyncio.wait_for(w1, 1) == restore.assignment
    r.released(KEY, InstanceEvents("C"), now_ns=1_000)  # a poll with a time also expires restores
    with pytest.raises(Unavailable, match="no instance had a free slot to restore it"):
        await asyncio.wait_for(w2, 1)


async def test_router_recover_waits_for_the_instance_to_be_declared_down() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 3, step_id=11, answer=3)
    send_backup(r, 1, 7, step_id=12, answer=7)
    recovering = asyncio.create_task(r.recover(KEY, 1, "A", 12))
    other_step = asyncio.create_task(r.recover(KEY, 1, "A", 13))
    await settle()
    assert not recovering.done() and not other_step.done()
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    await settle()
    assert not recovering.done()  # now waiting for the restore
    restore = r.take_restores(KEY)[0]
    assert restore.states["STATE"].tolist() == [7]
    r.restored(KEY, restore, True)
    got = await asyncio.wait_for(recovering, 1)
    assert got.assignment == restore.assignment
    assert answer_of(got) == [7]  # the step was in the backed-up state: its answer
    again = await asyncio.wait_for(other_step, 1)
    assert again.assignment == restore.assignment and again.outputs is None  # not backed up: to be sent again
    # Asked later, once restored: no wait.
    older = await asyncio.wait_for(r.recover(KEY, 1, "A", 11), 1)
    assert answer_of(older) == [3]


async def test_router_recover_through_handle() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 5, step_id=21, answer=5)
    r.instance_down(KEY, "A", "replica died")
    restore = r.take_restores(KEY)[0]
    r.restored(KEY, restore, True)
    got = await asyncio.wait_for(r.handle(RecoverRequest(KEY, 1, "A", 21)), 1)
    assert isinstance(got, Recovery) and got.assignment == restore.assignment and answer_of(got) == [5]


async def test_router_recover_of_a_sequence_without_backup_is_lost() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    recovering = asyncio.create_task(r.recover(KEY, 1, "A", 5))
    await settle()
    r.instance_down(KEY, "A", "replica died")
    with pytest.raises(Unavailable, match="sequence 1 of model 'm' was lost: replica died"):
        await asyncio.wait_for(recovering, 1)


async def test_router_recover_times_out_when_the_instance_is_never_declared_down() -> None:
    r = router(slots=2)
    r.recover_wait_s = 0.01
    place = await r.assign(KEY, 1)
    send_backup(r, 1, 5, step_id=21, answer=5)
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(r.recover(KEY, 1, "A", 21), 5)
    assert "sequence 1 of model 'm' was lost: its instance failed to answer" in info.value.message
    assert "START flag" in info.value.message
    assert r.assigner(KEY).active[1] == place  # nothing was moved
    # A later declaration wakes nobody and still restores the sequence.
    r.instance_down(KEY, "A", "replica died")
    assert len(r.take_restores(KEY)) == 1


async def test_router_recover_when_the_sequence_already_lives_elsewhere() -> None:
    r = router(slots=2)
    place = await r.assign(KEY, 1)
    # The gateway reports a failure of another instance than the sequence's: no wait, the current place.
    got = await asyncio.wait_for(r.recover(KEY, 1, "B", 3), 1)
    assert got == Recovery(place, None)


async def test_router_start_while_queued_for_restore_starts_anew() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    await r.assign(KEY, 2)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    start = asyncio.create_task(r.assign(KEY, 1))
    await settle()
    assert not start.done() and r.assigner(KEY).backlog == [1]
    r.instance_up(KEY, "C", ("c", 1))
    placed = await asyncio.wait_for(start, 1)
    assert placed.instance == "C"
    assert r.take_restores(KEY) == []
    assert 1 not in r.assigner(KEY).backups


async def test_router_start_waiting_on_a_failed_restore_starts_anew() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "replica died")
    restore = r.take_restores(KEY)[0]
    start = asyncio.create_task(r.assign(KEY, 1))  # the client restarts the sequence meanwhile
    await settle()
    assert not start.done()
    r.restored(KEY, restore, False, "connection refused")
    placed = await asyncio.wait_for(start, 1)
    assert placed.instance == "B"


async def test_router_start_waiting_on_an_expired_restore_starts_anew() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    await r.assign(KEY, 2)
    send_backup(r, 1, 7)
    r.restore_wait_ns = 1_000
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    r.instance_up(KEY, "C", ("c", 1))
    r.take_restores(KEY)
    start = asyncio.create_task(r.assign(KEY, 1))  # waits for the restore in flight to C
    await settle()
    r.instance_down(KEY, "C", "also died", now_ns=0)  # requeued; B is full
    r.expire_restores(1_000)
    await settle()
    assert not start.done() or start.exception() is None  # still waiting for a slot as a new sequence
    r.instance_up(KEY, "D", ("d", 1))
    placed = await asyncio.wait_for(start, 1)
    assert placed.instance == "D"


async def test_router_down_of_the_restore_target_requeues() -> None:
    r = router(slots=1)
    await r.assign(KEY, 1)
    await r.assign(KEY, 2)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    r.instance_up(KEY, "C", ("c", 1))
    first = r.take_restores(KEY)[0]
    waiting = asyncio.create_task(r.lookup(KEY, 1))
    r.instance_down(KEY, "C", "also died", now_ns=0)
    await settle()
    assert not waiting.done()
    r.restored(KEY, first, False, "unreachable")  # the stale outcome wakes nobody
    await settle()
    assert not waiting.done()
    r.instance_up(KEY, "D", ("d", 1))
    second = r.take_restores(KEY)[0]
    r.restored(KEY, second, True)
    assert (await asyncio.wait_for(waiting, 1)).instance == "D"


async def test_router_restored_instance_up_with_occupied_keeps_the_backup_flow() -> None:
    # A restarted router learns of a sequence from a snapshot and takes the snapshot's backup.
    r = SequenceRouter()
    r.add_model(KEY, "m", 2)
    r.instance_up(KEY, "A", ("a", 1), (SlotEvent(0, 9, 1234),))
    r.backed_up(KEY, InstanceEvents("A", (), (SlotEvent(0, 9, 1234),), backups=(StateBackup(9, 0, 1234, state(4)),)))
    assert r.assigner(KEY).backups.get(9) is not None
    r.instance_up(KEY, "B", ("b", 1))
    r.instance_down(KEY, "A", "replica died")
    restore = r.take_restores(KEY)[0]
    assert restore.corr_id == 9 and restore.assignment.instance == "B"
    assert restore.states["STATE"].tolist() == [4]


async def test_router_recover_answers_each_of_recent_snapshot_steps() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    for i in range(1, RECENT + 1):
        send_backup(r, 1, i, step_id=100 + i, answer=i)
    r.instance_down(KEY, "A", "replica died")
    r.restored(KEY, r.take_restores(KEY)[0], True)
    for i in range(1, RECENT + 1):
        assert answer_of(await asyncio.wait_for(r.recover(KEY, 1, "A", 100 + i), 1)) == [i]


async def test_router_recover_of_a_step_older_than_recent_runs_again() -> None:
    """The router keeps the answers of the last RECENT steps that snapshots reported (one per snapshot: the
    router restarted that often); an older one is not among them."""
    r = router(slots=2)
    await r.assign(KEY, 1)
    for i in range(1, RECENT + 2):
        send_backup(r, 1, i, step_id=100 + i, answer=i)
    r.instance_down(KEY, "A", "replica died")
    r.restored(KEY, r.take_restores(KEY)[0], True)
    assert (await asyncio.wait_for(r.recover(KEY, 1, "A", 101), 1)).outputs is None
    assert answer_of(await asyncio.wait_for(r.recover(KEY, 1, "A", 102), 1)) == [2]


# --------------------------------------------------------------------------- router: backups passed on by gateways


async def test_router_handle_state_backups_keeps_those_of_each_owner() -> None:
    r = router(slots=2)
    p1, p2 = await r.assign(KEY, 1), await r.assign(KEY, 2)
    assert (p1.instance, p2.instance) == ("A", "B")
    wrong = backup_for(p1, 1, 99, no=2, instance="B")  # names another instance than the sequence's
    stranger = StateBackup(3, 0, 1, state(3), instance="A", no=1)  # a sequence the router does not know
    await post_backups(r, gateway_backup(r, 1, 5, 1), gateway_backup(r, 2, 8, 1), wrong, stranger)
    table = r.assigner(KEY)
    assert stored(table, 1) == [5] and stored(table, 2) == [8]
    assert 3 not in table.backups and len(table.backups) == 2


async def test_router_handle_state_backups_of_an_unknown_model_is_ignored() -> None:
    r = router()
    place = await r.assign(KEY, 1)
    backup = backup_for(place, 1, 5, no=1, instance=place.instance)
    r.one_way(StateBackups("other:1", (backup,)))
    r.one_way(StateBackups(KEY, ()))
    assert len(r.assigner(KEY).backups) == 0


async def test_router_restores_the_highest_number_passed_on() -> None:
    r = router(slots=2)
    await r.assign(KEY, 1)
    # Three answered steps, passed on through different gateways: the third's arrives before the second's.
    await post_backups(r, gateway_backup(r, 1, 1, 1))
    await post_backups(r, gateway_backup(r, 1, 6, 3))
    await post_backups(r, gateway_backup(r, 1, 3, 2))
    recovering = asyncio.create_task(r.recover(KEY, 1, "A", 4444))  # the fourth step failed with A
    await settle()
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    restore = r.take_restores(KEY)[0]
    assert (restore.corr_id, restore.no, restore.states["STATE"].tolist()) == (1, 3, [6])
    assert restore.assignment.instance == "B"
    r.restored(KEY, restore, True)
    got = await asyncio.wait_for(recovering, 1)
    # Its backup never reached the router (its answer never reached the gateway): it runs again on the state.
    assert got == Recovery(restore.assignment, None, 3)
    # The restored sequence's own backups go on after it.
    await post_backups(r, gateway_backup(r, 1, 7, 4))
    assert stored(r.assigner(KEY), 1) == [7]


async def test_router_backup_arriving_after_its_instance_is_down_still_counts_until_restored() -> None:
    """A step answered just before its instance died may be passed on after the router saw it die: while the
    sequence waits for (or is on its way to) its new slot, that backup still updates the record, which the
    restore reads when it is sent; once restored, the lost instance's backups are ignored."""
    r = router(slots=2)
    place = await r.assign(KEY, 1)
    await post_backups(r, gateway_backup(r, 1, 1, 1))
    late = backup_for(place, 1, 3, no=2, instance="A")
    r.instance_down(KEY, "A", "replica died", now_ns=0)
    restore = r.take_restores(KEY)[0]
    assert (restore.no, restore.states["STATE"].tolist()) == (1, [1])  # placed with what the router had
    await post_backups(r, late)
    assert stored(r.assigner(KEY), 1) == [3]  # what the restore will send
    assert r.assigner(KEY).backups.get(1).no == 2
    r.restored(KEY, restore, True)
    await post_backups(r, backup_for(place, 1, 9, no=3, instance="A"))
    assert stored(r.assigner(KEY), 1) == [3]


async def test_router_snapshot_then_gateway_backups() -> None:
    """A restarted router takes the states of a snapshot (with each last step's answer); gateways' backups of
    older steps, still on their way, don't replace them; newer ones do, and the snapshot's answer stays."""
    r = SequenceRouter()
    r.add_model(KEY, "m", 2)
    r.instance_up(KEY, "A", ("a", 1), (SlotEvent(0, 9, 1234),))
    outputs = {"OUTPUT": np.array([[40]], dtype=np.int32)}
    snap = StateBackup(9, 0, 1234, state(40), instance="A", no=5, step_id=55, outputs=outputs)
    r.backed_up(KEY, InstanceEvents("A", (), (SlotEvent(0, 9, 1234),), backups=(snap,)))
    await post_backups(r, gateway_backup(r, 9, 30, 4))
    assert stored(r.assigner(KEY), 9) == [40]
    await post_backups(r, gateway_backup(r, 9, 41, 6))
    assert stored(r.assigner(KEY), 9) == [41]
    r.instance_up(KEY, "B", ("b", 1))
    r.instance_down(KEY, "A", "replica died")
    restore = r.take_restores(KEY)[0]
    assert (restore.no, restore.states["STATE"].tolist()) == (6, [41])
    r.restored(KEY, restore, True)
    # The snapshot's step ran before the crash (its state is in the one restored): answered, not run again.
    assert answer_of(await asyncio.wait_for(r.recover(KEY, 9, "A", 55), 1)) == [40]
    assert (await asyncio.wait_for(r.recover(KEY, 9, "A", 56), 1)).outputs is None


async def test_router_instance_down_of_an_unloaded_model_restores_nothing() -> None:
    """A model unloaded or reloaded takes its instances away on purpose: their sequences end, backed up or not."""
    r = router(slots=2)
    await r.assign(KEY, 1)
    send_backup(r, 1, 7)
    r.instance_down(KEY, "A", "its model was unloaded", restore=False)
    assert r.take_restores(KEY) == []
    assert r.assigner(KEY).restoring() == 0
    with pytest.raises(Unavailable) as exc:
        await r.lookup(KEY, 1)
    assert "was lost: its model was unloaded" in exc.value.message
