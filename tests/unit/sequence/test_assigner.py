"""SequenceAssigner: which instance and slot holds each sequence, the ordered backlog, lost sequences."""

from __future__ import annotations

import pytest

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.sequence.assigner import SequenceAssigner
from serve_app.sequence.messages import Assignment, SlotEvent

START_FLAG = (
    "inference request for sequence {} to model 'm' must specify the START flag on the first request of the sequence"
)


def assigner(slots: int = 2, instances: tuple[str, ...] = ("A",)) -> SequenceAssigner:
    a = SequenceAssigner("m", slots)
    for name in instances:
        assert a.add_instance(name, (name.lower(), 9000)) == []
    return a


def where(a: Assignment | None) -> tuple[str, int]:
    assert a is not None
    return a.instance, a.slot


def release(a: SequenceAssigner, corr: int | str) -> list[tuple[int | str, Assignment]]:
    place = a.active[corr]
    return a.release(place.instance, place.slot, corr, place.slot_token)


def test_slots_per_instance_at_least_one() -> None:
    assert SequenceAssigner("m", 0).slots == 1
    assert SequenceAssigner("m", -3).slots == 1
    assert SequenceAssigner("m", 4).slots == 4


def test_start_takes_the_lowest_free_slot() -> None:
    a = assigner(slots=3)
    placed = [a.start(c) for c in (1, 2, 3)]
    assert [where(p) for p in placed] == [("A", 0), ("A", 1), ("A", 2)]
    assert all(p is not None and p.address == ("a", 9000) for p in placed)
    assert a.free_slots() == 0
    assert a.instances() == ["A"] and a.has_instance("A") and not a.has_instance("B")


def test_starts_spread_across_instances_most_free_first() -> None:
    a = assigner(slots=2, instances=("A", "B", "C"))
    # Equal free counts: the first instance wins; then the others (more free slots) until all are even.
    assert [where(a.start(c)) for c in range(1, 7)] == [
        ("A", 0),
        ("B", 0),
        ("C", 0),
        ("A", 1),
        ("B", 1),
        ("C", 1),
    ]


def test_freed_slot_is_reused_lowest_first() -> None:
    a = assigner(slots=3)
    for c in (1, 2, 3):
        a.start(c)
    release(a, 2)
    release(a, 1)
    assert where(a.start(4)) == ("A", 0)
    assert where(a.start(5)) == ("A", 1)


def test_new_instance_with_more_free_slots_is_preferred() -> None:
    a = assigner(slots=2)
    a.start(1)
    assert a.add_instance("B", ("b", 1)) == []
    assert where(a.start(2)) == ("B", 0)  # B has 2 free, A has 1
    assert where(a.start(3)) == ("A", 1)  # now A: 1, B: 1 -> the first instance


def test_generations_differ_per_placement() -> None:
    a = assigner(slots=1)
    first = a.start(1)
    release(a, 1)
    second = a.start(1)
    assert first is not None and second is not None
    assert where(first) == where(second) and first.slot_token != second.slot_token


def test_start_for_an_active_id_keeps_its_slot_under_a_new_generation() -> None:
    a = assigner(slots=2)
    first = a.start(1)
    again = a.start(1)  # the instance restarts the sequence in the same slot
    assert first is not None and again is not None
    assert where(again) == where(first) and again.slot_token != first.slot_token
    assert a.active[1] == again and a.lookup(1) == again
    assert a.free_slots() == 1
    # The release of the old slot_token (its END ran before the restart) does not free the slot.
    assert a.release("A", first.slot, 1, first.slot_token) == []
    assert a.active[1] == again and a.free_slots() == 1
    a.release("A", again.slot, 1, again.slot_token)
    assert a.active == {} and a.free_slots() == 2


def test_backlog_in_order_and_admission_on_release() -> None:
    a = assigner(slots=1)
    a.start(1)
    assert a.start(2) is None
    assert a.start(3) is None
    assert a.start(2) is None  # a repeated START of a backlogged sequence keeps its place in line
    assert a.backlog == [2, 3]
    assert a.lookup(2) is None and a.lookup(3) is None  # backlogged: the caller waits
    admitted = release(a, 1)
    assert [(c, where(p)) for c, p in admitted] == [(2, ("A", 0))]
    assert a.active[2] == admitted[0][1]
    assert a.backlog == [3]
    assert [c for c, _ in release(a, 2)] == [3]
    assert a.backlog == []
    assert release(a, 3) == []
    assert a.free_slots() == 1


def test_backlog_admitted_to_a_new_instance() -> None:
    a = assigner(slots=1)
    a.start(1)
    for c in (2, 3, 4):
        assert a.start(c) is None
    admitted = a.add_instance("B", ("b", 1))
    assert [(c, where(p)) for c, p in admitted] == [(2, ("B", 0))]
    assert a.backlog == [3, 4]


def test_release_admits_as_many_as_slots_free() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    a.start(3)
    a.start(4)
    assert [c for c, _ in release(a, 1)] == [3]
    assert [c for c, _ in release(a, 2)] == [4]


def test_cancel_drops_a_backlogged_sequence() -> None:
    a = assigner(slots=1)
    a.start(1)
    a.start(2)
    a.start(3)
    a.cancel(2)
    a.cancel(99)  # unknown: nothing happens
    assert a.backlog == [3]
    assert [c for c, _ in release(a, 1)] == [3]


def test_lookup_of_an_active_sequence() -> None:
    a = assigner()
    placed = a.start("s")
    assert a.lookup("s") == placed


@pytest.mark.parametrize("corr", [7, "abc"])
def test_lookup_of_an_unknown_sequence_asks_for_start(corr: int | str) -> None:
    a = assigner()
    with pytest.raises(InvalidArgument) as exc:
        a.lookup(corr)
    assert exc.value.message == START_FLAG.format(corr)


def test_lookup_after_release_asks_for_start() -> None:
    a = assigner()
    a.start(5)
    release(a, 5)
    with pytest.raises(InvalidArgument, match="must specify the START flag"):
        a.lookup(5)


def test_remove_instance_loses_its_sequences() -> None:
    a = assigner(slots=2, instances=("A", "B"))
    a.start(1)  # A0
    a.start(2)  # B0
    a.start(3)  # A1
    assert sorted(a.remove_instance("A", "replica died")) == [1, 3]
    assert a.remove_instance("A", "again") == []  # unknown instance: nothing
    assert a.instances() == ["B"]
    assert set(a.active) == {2}
    for corr in (1, 3):
        with pytest.raises(Unavailable) as exc:
            a.lookup(corr)
        msg = exc.value.message
        assert f"sequence {corr} of model 'm' was lost: replica died" in msg
        assert "START flag" in msg
    assert where(a.lookup(2)) == ("B", 0)


def test_release_from_a_removed_instance_is_ignored() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    p = a.start(1)
    assert p is not None
    a.remove_instance(p.instance, "gone")
    assert a.release(p.instance, p.slot, 1, p.slot_token) == []
    with pytest.raises(Unavailable, match="was lost"):
        a.lookup(1)


def test_start_clears_lost() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.remove_instance("A", "node failure")
    placed = a.start(1)
    assert where(placed) == ("B", 0)
    assert a.lookup(1) == placed
    release(a, 1)
    with pytest.raises(InvalidArgument, match="START flag"):  # ended normally: no longer "lost"
        a.lookup(1)


def test_start_of_a_lost_sequence_waits_in_the_backlog_when_full() -> None:
    a = assigner(slots=1, instances=("A", "B"))
    a.start(1)
    a.start(2)
    a.remove_instance("A", "gone")
    assert a.start(3) is None  # B is full
    assert a.start(1) is None  # restarted: no longer lost, backlogged behind 3
    assert a.backlog == [3, 1]
    assert a.lookup(1) is None


def test_release_with_a_stale_generation_is_ignored() -> None:
    a = assigner(slots=1)
    p = a.start(1)
    a.start(2)  # backlogged
    assert p is not None
    assert a.release("A", p.slot, 1, p.slot_token + 1) == []
    assert a.active[1] == p and a.backlog == [2]
    assert [c for c, _ in a.release("A", p.slot, 1, p.slot_token)] == [2]


def test_release_of_a_slot_owned_by_another_id_is_ignored() -> None:
    a = assigner(slots=2)
    p1, p2 = a.start(1), a.start(2)
    assert p1 is not None and p2 is not None
    assert a.release("A", p1.slot, 2, p2.slot_token) == []  # wrong slot for 2
    assert a.release("A", 5, 1, p1.slot_token) == []  # no such slot
    assert a.release("X", p1.slot, 1, p1.slot_token) == []  # no such instance
    assert set(a.active) == {1, 2} and a.free_slots() == 0


def test_add_instance_with_occupied_slots_rebuilds_the_table() -> None:
    a = SequenceAssigner("m", 3)
    occupied = (SlotEvent(2, 7, 111), SlotEvent(0, "s", 222))
    assert a.add_instance("A", ("a", 1), occupied) == []
    assert a.active[7] == Assignment("A", ("a", 1), 2, 111)
    assert a.active["s"] == Assignment("A", ("a", 1), 0, 222)
    assert a.free_slots() == 1
    assert where(a.start(9)) == ("A", 1)
    assert a.start(10) is None
    # The rebuilt owner releases with its slot_token: the slot goes to the backlog.
    assert [(c, where(p)) for c, p in a.release("A", 2, 7, 111)] == [(10, ("A", 2))]


def test_add_instance_ignores_slots_out_of_range() -> None:
    a = SequenceAssigner("m", 2)
    a.add_instance("A", ("a", 1), (SlotEvent(5, 7, 1), SlotEvent(-1, 8, 1)))
    assert a.active == {} and a.free_slots() == 2


def test_add_instance_with_occupied_slots_admits_the_backlog_to_the_rest() -> None:
    a = SequenceAssigner("m", 2)
    assert a.start(1) is None  # no instance yet: backlogged
    assert a.start(2) is None
    admitted = a.add_instance("A", ("a", 1), (SlotEvent(0, 9, 5),))
    assert [(c, where(p)) for c, p in admitted] == [(1, ("A", 1))]
    assert a.backlog == [2]


def test_snapshot_slot_of_an_id_active_elsewhere_is_not_leaked() -> None:
    a = assigner(slots=2)
    held = a.start(7)
    assert where(held) == ("A", 0)
    # B reports 7 in its slot 0 too (a duplicate): the table keeps A's, B's slot must still come back when B frees it.
    a.add_instance("B", ("b", 1), (SlotEvent(0, 7, 99),))
    a.release("B", 0, 7, 99)
    assert a.free_slots() == 1 + 2  # A: 1 free, B: both free


# --------------------------------------------------------------------------- reconcile


def test_reconcile_frees_a_slot_its_instance_never_took_up() -> None:
    a = SequenceAssigner("m", 1, grace_ns=100)
    a.add_instance("A", ("a", 1))
    gone = a.start(1)  # its START never reaches the instance (the client went away)
    assert gone is not None
    assert a.start(2) is None
    assert a.reconcile("A", (), 1_000) == []  # first seen missing: the grace period starts
    assert a.reconcile("A", (), 1_099) == []
    admitted = a.reconcile("A", (), 1_100)
    assert [(c, where(p)) for c, p in admitted] == [(2, ("A", 0))]
    assert 1 not in a.active
    with pytest.raises(InvalidArgument, match="START flag"):
        a.lookup(1)


def test_reconcile_keeps_slots_the_instance_holds() -> None:
    a = SequenceAssigner("m", 2, grace_ns=100)
    a.add_instance("A", ("a", 1))
    p = a.start(1)
    assert p is not None
    held = (SlotEvent(p.slot, 1, p.slot_token),)
    assert a.reconcile("A", (), 0) == []
    assert a.reconcile("A", held, 50) == []  # taken up: the clock stops
    assert a.reconcile("A", (), 60) == []  # missing again: a new grace period from now
    assert a.reconcile("A", (), 159) == [] and a.active[1] == p
    for t in range(200, 10_000, 1_000):
        assert a.reconcile("A", held, t) == []
    assert a.active[1] == p


def test_reconcile_of_an_unknown_instance() -> None:
    a = SequenceAssigner("m", 1, grace_ns=0)
    assert a.reconcile("nope", (), 10) == []


def test_reconcile_frees_a_duplicate_snapshot_slot() -> None:
    a = SequenceAssigner("m", 1, grace_ns=10)
    a.add_instance("A", ("a", 1))
    held = a.start(7)
    assert held is not None
    a.add_instance("B", ("b", 1), (SlotEvent(0, 7, 99),))  # B reports 7 too; the table keeps A's
    assert a.start(8) is None
    a.reconcile("B", (), 0)
    assert [(c, where(p)) for c, p in a.reconcile("B", (), 10)] == [(8, ("B", 0))]
    assert a.active[7] == held


def test_default_grace_period() -> None:
    assert SequenceAssigner("m", 1).grace_ns == 10_000_000_000


def test_a_draining_instance_keeps_its_sequences_but_takes_no_new_one() -> None:
    a = assigner(slots=2, instances=("A", "B"))
    assert where(a.start(1))[0] == "A"
    a.set_draining("A", True)
    assert [where(a.start(c))[0] for c in (2, 3)] == ["B", "B"]
    assert a.start(4) is None  # A's free slot is not offered: the START waits in the backlog
    assert where(a.lookup(1)) == ("A", 0)  # its live sequence continues there
    a.set_draining("A", False)
    assert [c for c, _ in release(a, 2)] == [4]  # a freed slot admits the backlog again
    a.set_draining("missing", True)  # an unknown instance is ignored


# --------------------------------------------------------------------------- backlog timeouts


def test_a_backlogged_sequence_expires_at_its_earliest_deadline() -> None:
    a = assigner(slots=1)
    assert a.start(1) is not None
    assert a.start(2, deadline_ns=500) is None
    assert a.start(3) is None  # no timeout: waits as long as it takes
    assert a.lookup(2, deadline_ns=300) is None  # a later request of 2 with a shorter timeout
    assert a.next_deadline() == 300
    assert a.expire_backlog(299) == []
    assert a.expire_backlog(300) == [2]
    assert a.backlog == [3] and a.next_deadline() == 0
    # Forgotten: its next request without START is refused as Triton does.
    with pytest.raises(InvalidArgument, match=START_FLAG.format(2)):
        a.lookup(2)
    assert where(release(a, 1)[0][1]) == ("A", 0)  # 3 is next, as before


def test_a_later_longer_timeout_does_not_extend_the_wait() -> None:
    a = assigner(slots=1)
    a.start(1)
    a.start(2, deadline_ns=100)
    a.lookup(2, deadline_ns=900)
    assert a.next_deadline() == 100


def test_admitted_or_cancelled_sequences_have_no_deadline() -> None:
    a = assigner(slots=1)
    a.start(1)
    a.start(2, deadline_ns=100)
    a.start(3, deadline_ns=200)
    assert [c for c, _ in release(a, 1)] == [2]
    a.cancel(3)
    assert a.next_deadline() == 0 and a.expire_backlog(10**12) == []


def test_a_placed_start_ignores_its_timeout() -> None:
    a = assigner(slots=1)
    assert a.start(1, deadline_ns=5) is not None
    assert a.expire_backlog(10**12) == [] and 1 in a.active
