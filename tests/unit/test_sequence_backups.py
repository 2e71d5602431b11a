"""SequenceBackups: the router's latest state of each sequence and the answers of its last RECENT steps."""

from __future__ import annotations

import numpy as np

from serve_app.inference.sequence import StateBackup
from serve_app.scheduling.sequence_backups import RECENT, SequenceBackups


def backup(
    corr: int | str = 7, value: int = 1, *, gen: int = 1, step_id: int = 0, answer: int | None = None
) -> StateBackup:
    outputs = None if answer is None else {"OUTPUT": np.array([[answer]], dtype=np.int32)}
    return StateBackup(corr, 0, gen, {"STATE": np.array([value], dtype=np.int32)}, step_id, outputs)


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


def test_store_keeps_the_latest_state() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, step_id=11, answer=1))
    assert 7 in store and len(store) == 1
    assert state_of(store, 7) == [1]
    store.store(backup(7, 3, step_id=12, answer=3))
    assert state_of(store, 7) == [3]
    assert len(store) == 1
    record = store.get(7)
    assert record is not None and record.generation == 1


def test_sequences_kept_apart() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, step_id=11, answer=1))
    store.store(backup("x", 5, gen=2, step_id=21, answer=5))
    assert len(store) == 2 and 7 in store and "x" in store
    assert state_of(store, 7) == [1] and state_of(store, "x") == [5]
    assert answered(store, 7, 21) is None  # x's step is not 7's
    assert answered(store, "x", 21) == [5]


def test_answer_of_a_backed_up_step() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, step_id=11, answer=1))
    store.store(backup(7, 3, step_id=12, answer=3))
    assert answered(store, 7, 11) == [1]
    assert answered(store, 7, 12) == [3]
    assert answered(store, 7, 13) is None  # not in the backed-up state: it must run
    assert store.answer(7, 0) is None  # no step id: never answered from here
    assert store.answer(8, 11) is None


def test_snapshot_backup_has_no_answer() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, step_id=11, answer=1))
    store.store(backup(7, 2))  # a snapshot: step_id 0, outputs None
    assert state_of(store, 7) == [2]
    assert answered(store, 7, 11) == [1]  # the answers kept so far stay
    store.store(backup(7, 4, step_id=12))  # a step id without outputs: nothing to answer with
    assert answered(store, 7, 12) is None
    assert state_of(store, 7) == [4]


def test_only_the_last_recent_answers_are_kept() -> None:
    store = SequenceBackups()
    total = RECENT + 3
    for i in range(1, total + 1):
        store.store(backup(7, i, step_id=100 + i, answer=i))
    for i in range(1, total - RECENT + 1):
        assert store.answer(7, 100 + i) is None, i
    for i in range(total - RECENT + 1, total + 1):
        assert answered(store, 7, 100 + i) == [i]
    record = store.get(7)
    assert record is not None and len(record.recent) == RECENT
    assert state_of(store, 7) == [total]


def test_a_new_generation_replaces_the_record() -> None:
    store = SequenceBackups()
    store.store(backup(7, 5, gen=1, step_id=11, answer=5))
    store.store(backup(7, 1, gen=2, step_id=21, answer=1))  # the sequence was restarted
    record = store.get(7)
    assert record is not None and record.generation == 2
    assert state_of(store, 7) == [1]
    assert store.answer(7, 11) is None  # the old generation's answers are gone
    assert answered(store, 7, 21) == [1]
    assert len(store) == 1


def test_moved_keeps_state_and_answers_under_the_new_generation() -> None:
    store = SequenceBackups()
    store.store(backup(7, 5, gen=1, step_id=11, answer=5))
    store.moved(7, 9)
    record = store.get(7)
    assert record is not None and record.generation == 9
    assert state_of(store, 7) == [5]
    assert answered(store, 7, 11) == [5]
    store.store(backup(7, 6, gen=9, step_id=12, answer=6))  # the restored sequence goes on: same record
    assert state_of(store, 7) == [6]
    assert answered(store, 7, 11) == [5] and answered(store, 7, 12) == [6]


def test_drop() -> None:
    store = SequenceBackups()
    store.store(backup(7, 1, step_id=11, answer=1))
    store.store(backup(8, 2, step_id=12, answer=2))
    store.drop(7)
    assert 7 not in store and store.get(7) is None and store.answer(7, 11) is None
    assert 8 in store and len(store) == 1
    store.drop(7)  # twice is fine
    store.store(backup(7, 9, step_id=13, answer=9))  # stored again: a fresh record
    assert state_of(store, 7) == [9] and store.answer(7, 11) is None
