"""SequenceBackups: the router's latest state of each sequence (the highest step number of its slot_token, whatever
order backups arrive in) and the answers of its last RECENT steps carried by instance snapshots."""

from __future__ import annotations

import numpy as np

from serve_app.sequence.backups import RECENT, SequenceBackups
from serve_app.sequence.messages import StateBackup


def backup(
    corr: int | str = 7,
    value: int = 1,
    *,
    gen: int = 1,
    no: int = 0,
    step_id: int = 0,
    answer: int | None = None,
    instance: str = "A",
) -> StateBackup:
    """A gateway's backup (no step id, no answer) unless ``step_id``/``answer`` make it a snapshot's."""
    outputs = None if answer is None else {"OUTPUT": np.array([[answer]], dtype=np.int32)}
    states = {"STATE": np.array([value], dtype=np.int32)}
    return StateBackup(corr, 0, gen, states, instance=instance, no=no, step_id=step_id, outputs=outputs)


def state_of(store: SequenceBackups, corr: int | str) -> list[int]:
    record = store.get(corr)
    assert record is not None
    return record.states["STATE"].tolist()


def answered(store: SequenceBackups, corr: int | str, step_id: int) -> list[int] | None:
    outputs = store.answer(corr, step_id)
    return None if outputs is None else outputs["OUTPUT"].ravel().tolist()


def test_empty() -> None:
    store = SequenceBackups()
    assert len(store) == 0 and 7 not in store
    assert store.get(7) is None
    assert store.answer(7, 5) is None
    store.drop(7)  # nothing to drop: fine
    store.moved(7, 3)  # nothing to move: fine
    assert len(store) == 0 and store.get(7) is None


def test_store_keeps_the_latest_state_and_its_number() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=1))
    assert 7 in store and len(store) == 1
    assert state_of(store, 7) == [1]
    store.store(backup(7, 3, no=2))
    assert state_of(store, 7) == [3]
    assert len(store) == 1
    record = store.get(7)
    assert record is not None and (record.slot_token, record.no) == (1, 2)


def test_a_lower_number_of_the_same_generation_is_ignored() -> None:
    """Backups of one sequence may arrive out of order (its steps answered through several gateways)."""
    store = SequenceBackups()
    store.store(backup(7, 1, no=1))
    store.store(backup(7, 6, no=3))  # the third step's, before the second's
    store.store(backup(7, 3, no=2))  # late: older than what is kept
    record = store.get(7)
    assert record is not None and record.no == 3
    assert state_of(store, 7) == [6]
    store.store(backup(7, 10, no=4))
    assert state_of(store, 7) == [10]
    store.store(backup(7, 1, no=1))  # very late
    assert state_of(store, 7) == [10]


def test_a_lower_number_brings_no_answer() -> None:
    store = SequenceBackups()
    store.store(backup(7, 6, no=3))
    store.store(backup(7, 3, no=2, step_id=12, answer=3))  # an older snapshot's: not in the state kept
    assert state_of(store, 7) == [6]
    assert store.answer(7, 12) is None
    record = store.get(7)
    assert record is not None and len(record.recent) == 0


def test_the_same_number_again_replaces_the_state() -> None:
    """A snapshot repeats the state of the last step a gateway passed on (or the other way round)."""
    store = SequenceBackups()
    store.store(backup(7, 4, no=2))
    store.store(backup(7, 4, no=2, step_id=22, answer=4))  # the snapshot of the same step, with its answer
    assert state_of(store, 7) == [4]
    assert answered(store, 7, 22) == [4]
    store.store(backup(7, 4, no=2))  # the gateway's, late: the answer stays
    assert answered(store, 7, 22) == [4]
    record = store.get(7)
    assert record is not None and record.no == 2 and len(record.recent) == 1


def test_a_new_generation_replaces_the_record_whatever_its_number() -> None:
    store = SequenceBackups()
    store.store(backup(7, 5, gen=1, no=9, step_id=11, answer=5))
    store.store(backup(7, 1, gen=2, no=1))  # the sequence was restarted: numbered from 1 again
    record = store.get(7)
    assert record is not None and (record.slot_token, record.no) == (2, 1)
    assert state_of(store, 7) == [1]
    assert store.answer(7, 11) is None  # the old slot_token's answers are gone
    assert len(store) == 1
    store.store(backup(7, 2, gen=2, no=2))
    assert state_of(store, 7) == [2]


def test_sequences_kept_apart() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=5, step_id=11, answer=1))
    store.store(backup("x", 5, gen=2, no=1, step_id=21, answer=5))
    assert len(store) == 2 and 7 in store and "x" in store
    assert state_of(store, 7) == [1] and state_of(store, "x") == [5]
    assert answered(store, 7, 21) is None  # x's step is not 7's
    assert answered(store, "x", 21) == [5]
    store.store(backup("x", 6, gen=2, no=2))  # x's numbers are its own
    assert state_of(store, "x") == [6] and state_of(store, 7) == [1]


def test_gateway_backups_carry_no_answers() -> None:
    store = SequenceBackups()
    for no in range(1, 4):
        store.store(backup(7, no, no=no))
    record = store.get(7)
    assert record is not None and len(record.recent) == 0
    assert store.answer(7, 0) is None


def test_answer_of_a_step_in_a_snapshot() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=1, step_id=11, answer=1))
    store.store(backup(7, 3, no=2, step_id=12, answer=3))
    assert answered(store, 7, 11) == [1]
    assert answered(store, 7, 12) == [3]
    assert answered(store, 7, 13) is None  # not in the backed-up state: it must run
    assert store.answer(7, 0) is None  # no step id: never answered from here
    assert store.answer(8, 11) is None


def test_gateway_backups_keep_the_answers_of_snapshots() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=1, step_id=11, answer=1))
    store.store(backup(7, 2, no=2))  # a gateway's: step_id 0, outputs None
    assert state_of(store, 7) == [2]
    assert answered(store, 7, 11) == [1]  # the answers kept so far stay
    store.store(backup(7, 4, no=3, step_id=12))  # a step id without outputs: nothing to answer with
    assert answered(store, 7, 12) is None
    assert state_of(store, 7) == [4]


def test_a_repeated_last_step_is_kept_once() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=1, step_id=11, answer=1))
    store.store(backup(7, 1, no=1, step_id=11, answer=1))  # a second snapshot (the router restarted again)
    record = store.get(7)
    assert record is not None and [sid for sid, _ in record.recent] == [11]
    store.store(backup(7, 2, no=2, step_id=12, answer=2))
    store.store(backup(7, 2, no=2, step_id=12, answer=2))
    assert [sid for sid, _ in record.recent] == [11, 12]
    assert answered(store, 7, 11) == [1] and answered(store, 7, 12) == [2]


def test_only_the_last_recent_answers_are_kept() -> None:
    store = SequenceBackups()
    total = RECENT + 3
    for i in range(1, total + 1):
        store.store(backup(7, i, no=i, step_id=100 + i, answer=i))
    for i in range(1, total - RECENT + 1):
        assert store.answer(7, 100 + i) is None, i
    for i in range(total - RECENT + 1, total + 1):
        assert answered(store, 7, 100 + i) == [i]
    record = store.get(7)
    assert record is not None and len(record.recent) == RECENT
    assert state_of(store, 7) == [total]


def test_moved_keeps_state_answers_and_number_under_the_new_generation() -> None:
    store = SequenceBackups()
    store.store(backup(7, 5, gen=1, no=3, step_id=11, answer=5))
    store.moved(7, 9)
    record = store.get(7)
    assert record is not None and (record.slot_token, record.no) == (9, 3)
    assert state_of(store, 7) == [5]
    assert answered(store, 7, 11) == [5]
    # The restored sequence goes on numbering after its restore (RestoreSequence.no): same record.
    store.store(backup(7, 6, gen=9, no=4, instance="B"))
    assert state_of(store, 7) == [6]
    assert answered(store, 7, 11) == [5]
    store.store(backup(7, 1, gen=9, no=2, instance="B"))  # lower than what it was restored with: ignored
    assert state_of(store, 7) == [6]
    assert record.no == 4


def test_drop() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, no=5, step_id=11, answer=1))
    store.store(backup(8, 2, no=1, step_id=12, answer=2))
    store.drop(7)
    assert 7 not in store and store.get(7) is None and store.answer(7, 11) is None
    assert 8 in store and len(store) == 1
    store.drop(7)  # twice is fine
    store.store(backup(7, 9, no=1))  # stored again: a fresh record, whatever number the old one had
    assert state_of(store, 7) == [9] and store.answer(7, 11) is None
    record = store.get(7)
    assert record is not None and record.no == 1
