"""SequenceInstance with state backup: each answer carries its sequence's state after the step (numbered by the
step's place in the sequence, for the gateway to pass on to the router) and goes out at once; regular polls carry
no state, snapshots carry every state with its last step; restore() adopts a sequence moved here from a lost
instance and goes on numbering after it.  Driven by a fake model (an accumulator with implicit state)."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import numpy as np
from google.protobuf import text_format

from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.backups import RECENT
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import (
    InstanceEvents,
    PollEvents,
    RestoreSequence,
    SequenceStep,
    SlotEvent,
    StateBackup,
    StepResult,
)
from tests.support.clock import FakeClock

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""

INSTANCE = "i0"


def config(max_batch_size: int = 4, stateful: bool = True) -> mc.ModelConfig:
    state = (
        'state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]'
        if stateful
        else ""
    )
    text = f"""
        name: "acc"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
                 {{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        sequence_batching {{
          direct {{ }}
          {CONTROLS}
          {state}
        }}
    """
    return text_format.Parse(text, mc.ModelConfig())


def accumulate(ex: Execution) -> dict[str, np.ndarray]:
    """OUTPUT_STATE = INPUT_STATE + sum(INPUT) per row; OUTPUT = the new state."""
    x = ex.inputs["INPUT"]
    state = ex.inputs.get("INPUT_STATE", np.zeros((x.shape[0], 1), dtype=np.int32))
    new = state + x.sum(axis=-1, keepdims=True).astype(np.int32)
    return {"OUTPUT_STATE": new, "OUTPUT": new[..., :1]}


class FakeModel:
    """The instance's ``run``: records each Execution; ``hold()`` makes the next executions wait for ``go()``."""

    def __init__(self) -> None:
        self.executions: list[Execution] = []
        self._gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.error: Exception | None = None

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def go(self) -> None:
        assert self._gate is not None
        self._gate.set()
        self._gate = None

    async def __call__(self, ex: Execution) -> ExecutionResult:
        self.executions.append(ex)
        self.started.set()
        if self._gate is not None:
            await self._gate.wait()
        if self.error is not None:
            return ExecutionResult(error=self.error)  # type: ignore[arg-type]
        return ExecutionResult({n: a for n, a in accumulate(ex).items() if n in ex.outputs})


def make(
    cfg: mc.ModelConfig | None = None,
    *,
    backup: bool = True,
    on_release: Callable[[list[SlotEvent]], None] | None = None,
) -> tuple[SequenceInstance, FakeModel, FakeClock]:
    model, clock = FakeModel(), FakeClock(1_000_000)
    inst = SequenceInstance(
        cfg or config(),
        pathlib.Path("/nonexistent"),
        model,
        instance_id=INSTANCE,
        clock=clock,
        on_release=on_release,
        backup=backup,
    )
    return inst, model, clock


def step(
    corr: int | str,
    slot: int,
    value: int,
    *,
    gen: int = 1,
    start: bool = False,
    end: bool = False,
    step_id: int = 0,
) -> SequenceStep:
    data = np.array([[value]], dtype=np.int32)
    return SequenceStep(corr, slot, gen, start, end, {"INPUT": data}, ("OUTPUT",), 1, step_id)


def out(result: StepResult) -> list[int]:
    assert result.error is None, result.error
    return result.outputs["OUTPUT"].ravel().tolist()


def states(b: StateBackup) -> list[int]:
    return b.states["INPUT_STATE"].ravel().tolist()


def col(ex: Execution, name: str) -> list[int]:
    return ex.inputs[name].ravel().tolist()


def state(value: int) -> dict[str, np.ndarray]:
    return {"INPUT_STATE": np.array([value], dtype=np.int32)}


def summary(b: StateBackup | None) -> tuple | None:
    """A backup as plain values: (corr, slot, slot_token, states, instance, no, step_id, answer)."""
    if b is None:
        return None
    answer = None if b.outputs is None else b.outputs["OUTPUT"].ravel().tolist()
    return (b.corr_id, b.slot, b.slot_token, states(b), b.instance, b.no, b.step_id, answer)


async def run(inst: SequenceInstance, s: SequenceStep) -> StepResult:
    """One step, answered without anyone polling the instance."""
    return await asyncio.wait_for(inst.step(s), 1)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def poll(inst: SequenceInstance, wait_s: float = 0.001) -> InstanceEvents:
    return await asyncio.wait_for(inst.poll(PollEvents(wait_s=wait_s)), 1)


async def snapshot(inst: SequenceInstance) -> InstanceEvents:
    return await asyncio.wait_for(inst.poll(PollEvents(snapshot=True, wait_s=60)), 1)


# --------------------------------------------------------------------------- answers carry their backup


async def test_answer_carries_its_backup_and_goes_out_at_once() -> None:
    inst, model, _ = make()
    assert inst.backup
    result = await run(inst, step(7, 0, 5, gen=3, start=True, step_id=101))
    assert len(model.executions) == 1
    assert out(result) == [5]
    b = result.backup
    assert isinstance(b, StateBackup)
    # The state after the step, its place in the sequence and the instance that holds it; a step's own backup
    # names no step and carries no answer (the answer is the result itself).
    assert summary(b) == (7, 0, 3, [5], INSTANCE, 1, 0, None)
    assert b.states["INPUT_STATE"].shape == (1,)  # no batch dimension
    assert set(b.states) == {"INPUT_STATE"}


async def test_each_step_is_backed_up_under_its_number_in_the_sequence() -> None:
    inst, model, _ = make()
    results = [await run(inst, step(7, 0, v, start=i == 0, step_id=10 + i)) for i, v in enumerate((1, 2, 3))]
    assert [out(r) for r in results] == [[1], [3], [6]]
    assert [summary(r.backup) for r in results] == [
        (7, 0, 1, [1], INSTANCE, 1, 0, None),
        (7, 0, 1, [3], INSTANCE, 2, 0, None),
        (7, 0, 1, [6], INSTANCE, 3, 0, None),
    ]
    assert [col(ex, "INPUT_STATE") for ex in model.executions] == [[0], [1], [3]]


async def test_answers_never_wait_for_the_router() -> None:
    """More pipelined steps than the router keeps answers for, and nobody polls: every one is answered."""
    inst, model, _ = make()
    count = RECENT + 3
    tasks = [asyncio.create_task(inst.step(step(7, 0, 1, start=i == 0, step_id=i + 1))) for i in range(count)]
    results = await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert [out(r) for r in results] == [[i + 1] for i in range(count)]
    assert [r.backup.no for r in results if r.backup is not None] == list(range(1, count + 1))
    assert len(model.executions) == count


async def test_end_steps_carry_no_backup() -> None:
    inst, _, _ = make()
    first = await run(inst, step(7, 0, 1, start=True, step_id=1))
    assert first.backup is not None and first.backup.no == 1
    last = await run(inst, step(7, 0, 2, end=True, step_id=2))
    assert out(last) == [3] and last.backup is None  # the sequence leaves its slot: nothing to restore
    assert (await poll(inst)).released == (SlotEvent(0, 7, 1),)
    # A one-step sequence (START and END together): nothing to back up either.
    single = await run(inst, step(8, 1, 4, gen=2, start=True, end=True))
    assert out(single) == [4] and single.backup is None


async def test_numbering_restarts_at_start() -> None:
    inst, _, _ = make()
    await run(inst, step(7, 0, 1, gen=1, start=True))
    assert (await run(inst, step(7, 0, 1, gen=1))).backup.no == 2  # type: ignore[union-attr]
    # Restarted in its slot under a new slot_token: a new sequence, numbered from 1.
    again = await run(inst, step(7, 0, 5, gen=2, start=True))
    assert summary(again.backup) == (7, 0, 2, [5], INSTANCE, 1, 0, None)
    assert summary((await run(inst, step(7, 0, 1, gen=2))).backup) == (7, 0, 2, [6], INSTANCE, 2, 0, None)
    # After an END, the next sequence in that slot starts from 1 too.
    await run(inst, step(7, 0, 1, gen=2, end=True))
    other = await run(inst, step(9, 0, 3, gen=3, start=True))
    assert summary(other.backup) == (9, 0, 3, [3], INSTANCE, 1, 0, None)


async def test_numbering_is_per_sequence() -> None:
    inst, _, _ = make()
    a1 = await run(inst, step(7, 0, 1, gen=1, start=True))
    b1 = await run(inst, step(8, 1, 10, gen=2, start=True))
    a2 = await run(inst, step(7, 0, 1, gen=1))
    a3 = await run(inst, step(7, 0, 1, gen=1))
    b2 = await run(inst, step(8, 1, 10, gen=2))
    assert [summary(r.backup) for r in (a1, b1, a2, a3, b2)] == [
        (7, 0, 1, [1], INSTANCE, 1, 0, None),
        (8, 1, 2, [10], INSTANCE, 1, 0, None),
        (7, 0, 1, [2], INSTANCE, 2, 0, None),
        (7, 0, 1, [3], INSTANCE, 3, 0, None),
        (8, 1, 2, [20], INSTANCE, 2, 0, None),
    ]


async def test_one_execution_backs_up_each_of_its_rows() -> None:
    inst, model, _ = make(config(max_batch_size=4))
    model.hold()
    blocker = asyncio.create_task(inst.step(step(999, 3, 0, gen=9, start=True, end=True)))
    await asyncio.wait_for(model.started.wait(), 1)
    tasks = [
        asyncio.create_task(inst.step(step(10, 0, 4, gen=1, start=True, step_id=40))),
        asyncio.create_task(inst.step(step(12, 2, 6, gen=2, start=True, step_id=60))),
    ]
    await asyncio.sleep(0)
    model.go()
    assert (await asyncio.wait_for(blocker, 1)).backup is None
    results = await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert len(model.executions) == 2  # the two STARTs ran together
    assert [out(r) for r in results] == [[4], [6]]
    assert [summary(r.backup) for r in results] == [
        (10, 0, 1, [4], INSTANCE, 1, 0, None),
        (12, 2, 2, [6], INSTANCE, 1, 0, None),
    ]
    assert all(r.backup is not None and r.backup.states["INPUT_STATE"].shape == (1,) for r in results)


async def test_a_failed_step_carries_no_backup_and_is_not_counted() -> None:
    inst, model, _ = make()
    await run(inst, step(7, 0, 1, start=True))
    model.error = RuntimeError("boom")
    failed = await run(inst, step(7, 0, 5))
    assert failed.error is not None and failed.backup is None
    model.error = None
    after = await run(inst, step(7, 0, 2))
    # The failed step left the state as it was: the next one is the sequence's second, on state [1].
    assert summary(after.backup) == (7, 0, 1, [3], INSTANCE, 2, 0, None)


async def test_regular_polls_carry_no_backups_and_are_not_woken_by_steps() -> None:
    inst, _, _ = make()
    waiting = asyncio.create_task(inst.poll(PollEvents(wait_s=0.2)))
    await settle()
    result = await run(inst, step(7, 0, 1, start=True, step_id=1))
    assert result.backup is not None
    await settle()
    assert not waiting.done()  # a step only answers; the router hears of its state from the gateway
    events = await asyncio.wait_for(waiting, 1)
    assert events.backups == () and events.released == () and events.occupied == (SlotEvent(0, 7, 1),)
    await run(inst, step(7, 0, 1, step_id=2))
    assert (await poll(inst)).backups == ()


# --------------------------------------------------------------------------- snapshot


async def test_snapshot_carries_every_state_with_its_last_step_and_answer() -> None:
    inst, _, _ = make()
    await run(inst, step(7, 0, 5, gen=3, start=True, step_id=1))
    await run(inst, step(8, 1, 2, gen=4, start=True, step_id=2))
    await run(inst, step(7, 0, 1, gen=3, step_id=3))
    snap = await snapshot(inst)
    assert snap.instance == INSTANCE
    assert snap.occupied == (SlotEvent(0, 7, 3), SlotEvent(1, 8, 4))
    # Each with its sequence's last step and answer (the answer may not have reached its client: a router rebuilt
    # from this answers that step from here instead of running it twice) and its number.
    assert [summary(b) for b in snap.backups] == [
        (7, 0, 3, [6], INSTANCE, 2, 3, [6]),
        (8, 1, 4, [2], INSTANCE, 1, 2, [2]),
    ]
    # A snapshot changes nothing: the next step goes on from there.
    assert summary((await run(inst, step(7, 0, 1, gen=3, step_id=4))).backup) == (7, 0, 3, [7], INSTANCE, 3, 0, None)
    again = await snapshot(inst)
    assert [summary(b) for b in again.backups] == [
        (7, 0, 3, [7], INSTANCE, 3, 4, [7]),
        (8, 1, 4, [2], INSTANCE, 1, 2, [2]),
    ]


async def test_snapshot_skips_slots_without_state_yet() -> None:
    inst, model, _ = make()
    await run(inst, step(7, 0, 5, start=True, step_id=1))
    model.hold()
    pending = asyncio.create_task(inst.step(step(8, 1, 2, gen=4, start=True, step_id=2)))
    await asyncio.wait_for(model.started.wait(), 1)
    await settle()
    snap = await snapshot(inst)  # 8's START is executing: its slot is held, its state not there yet
    assert snap.occupied == (SlotEvent(0, 7, 1), SlotEvent(1, 8, 4))
    assert [b.corr_id for b in snap.backups] == [7]
    model.go()
    assert (await asyncio.wait_for(pending, 1)).backup is not None
    assert [b.corr_id for b in (await snapshot(inst)).backups] == [7, 8]


async def test_snapshot_after_end_leaves_the_sequence_out() -> None:
    inst, _, _ = make()
    await run(inst, step(7, 0, 5, start=True, step_id=1))
    await run(inst, step(8, 1, 2, gen=4, start=True, step_id=2))
    await run(inst, step(7, 0, 1, end=True, step_id=3))
    snap = await snapshot(inst)
    assert snap.occupied == (SlotEvent(1, 8, 4),)
    assert [summary(b) for b in snap.backups] == [(8, 1, 4, [2], INSTANCE, 1, 2, [2])]
    assert snap.released == ()  # a snapshot reports every occupied slot, not the releases since the last poll


async def test_snapshot_without_backup_has_no_states() -> None:
    inst, _, _ = make(backup=False)
    await inst.step(step(7, 0, 5, start=True))
    snap = await snapshot(inst)
    assert snap.occupied == (SlotEvent(0, 7, 1),) and snap.backups == ()


# --------------------------------------------------------------------------- restore


async def test_restore_adopts_a_free_slot_and_numbering_goes_on_after_it() -> None:
    inst, model, _ = make()
    assert inst.restore(RestoreSequence(1, 9, 55, state(10), no=4))
    assert inst.batcher.occupied() == [SlotEvent(1, 9, 55)]
    assert inst.live_sequences() == 1
    # Before any step here: the restored state, its number, no step of this instance's.
    snap = await snapshot(inst)
    assert [summary(b) for b in snap.backups] == [(9, 1, 55, [10], INSTANCE, 4, 0, None)]
    result = await run(inst, step(9, 1, 2, gen=55, step_id=7))
    assert out(result) == [12]
    assert col(model.executions[-1], "INPUT_STATE") == [0, 10]  # slot 1's row carries the restored state
    assert col(model.executions[-1], "START") == [0, 0]
    assert summary(result.backup) == (9, 1, 55, [12], INSTANCE, 5, 0, None)
    assert [summary(b) for b in (await snapshot(inst)).backups] == [(9, 1, 55, [12], INSTANCE, 5, 7, [12])]
    # The sequence goes on and ends there as usual.
    assert summary((await run(inst, step(9, 1, 1, gen=55))).backup) == (9, 1, 55, [13], INSTANCE, 6, 0, None)
    ended = await run(inst, step(9, 1, 1, gen=55, end=True))
    assert out(ended) == [14] and ended.backup is None
    assert (await poll(inst)).released == (SlotEvent(1, 9, 55),)


async def test_restore_without_a_number_counts_from_zero() -> None:
    inst, _, _ = make()
    assert inst.restore(RestoreSequence(0, 9, 55, state(10)))
    assert summary((await run(inst, step(9, 0, 1, gen=55))).backup) == (9, 0, 55, [11], INSTANCE, 1, 0, None)


async def test_restore_into_an_occupied_or_missing_slot_is_refused() -> None:
    inst, _, _ = make()
    await run(inst, step(7, 0, 5, gen=3, start=True, step_id=1))
    assert not inst.restore(RestoreSequence(0, 9, 55, state(10), no=8))
    assert not inst.restore(RestoreSequence(0, 7, 3, state(10), no=8))
    assert not inst.restore(RestoreSequence(99, 9, 55, state(10), no=8))
    assert not inst.restore(RestoreSequence(-1, 9, 55, state(10), no=8))
    assert inst.batcher.occupied() == [SlotEvent(0, 7, 3)]
    # The occupant's state, last step and numbering are untouched.
    assert [summary(b) for b in (await snapshot(inst)).backups] == [(7, 0, 3, [5], INSTANCE, 1, 1, [5])]
    result = await run(inst, step(7, 0, 1, gen=3, step_id=2))
    assert out(result) == [6]
    assert summary(result.backup) == (7, 0, 3, [6], INSTANCE, 2, 0, None)


async def test_restore_without_every_state_is_refused() -> None:
    inst, _, _ = make()
    assert not inst.restore(RestoreSequence(0, 9, 55, {}, no=3))
    assert not inst.restore(RestoreSequence(0, 9, 55, {"OTHER": np.array([1], dtype=np.int32)}, no=3))
    assert inst.batcher.occupied() == [] and inst.live_sequences() == 0
    assert inst.state.held(0) is None
    # The slot stays free for a sequence of its own.
    assert summary((await run(inst, step(7, 0, 2, start=True))).backup) == (7, 0, 1, [2], INSTANCE, 1, 0, None)


async def test_restored_sequence_steps_of_another_generation_are_not_here() -> None:
    inst, _, _ = make()
    assert inst.restore(RestoreSequence(0, 9, 55, state(10), no=2))
    stale = await inst.step(step(9, 0, 1, gen=54))
    assert stale.not_here and stale.backup is None
    assert (await inst.step(step(8, 0, 1, gen=55))).not_here


async def test_start_on_a_restored_sequence_resets_its_state_and_numbering() -> None:
    inst, model, _ = make()
    assert inst.restore(RestoreSequence(0, 9, 55, state(10), no=6))
    result = await run(inst, step(9, 0, 2, gen=55, start=True, step_id=1))
    assert out(result) == [2]
    assert col(model.executions[-1], "INPUT_STATE") == [0]
    assert summary(result.backup) == (9, 0, 55, [2], INSTANCE, 1, 0, None)


async def test_restored_sequence_expires_when_idle() -> None:
    cfg = config()
    cfg.sequence_batching.max_sequence_idle_microseconds = 1000
    inst, _, clock = make(cfg)
    assert inst.restore(RestoreSequence(0, 9, 55, state(10), no=2))
    clock.now += 1_000_000
    # Any later step checks the idle sequences.
    assert out(await run(inst, step(8, 1, 1, gen=2, start=True, end=True))) == [1]
    events = await poll(inst)
    assert SlotEvent(0, 9, 55) in events.released
    assert inst.state.held(0) is None
    assert (await snapshot(inst)).backups == ()


# --------------------------------------------------------------------------- without backup


async def test_without_backup_answers_carry_no_state() -> None:
    inst, _, _ = make(backup=False)
    assert not inst.backup
    results = [await run(inst, step(7, 0, v, start=i == 0, step_id=i + 1)) for i, v in enumerate((1, 2))]
    assert [out(r) for r in results] == [[1], [3]]
    assert [r.backup for r in results] == [None, None]
    assert (await poll(inst)).backups == ()


async def test_backup_needs_implicit_state() -> None:
    inst, _, _ = make(config(stateful=False))
    assert not inst.backup
    result = await run(inst, step(7, 0, 1, start=True))
    assert out(result) == [1] and result.backup is None
    assert (await snapshot(inst)).backups == ()


async def test_backup_off_with_on_release() -> None:
    released: list[list[SlotEvent]] = []
    inst, _, _ = make(on_release=released.append)
    assert not inst.backup
    first = await run(inst, step(7, 0, 1, start=True))
    assert out(first) == [1] and first.backup is None
    assert out(await run(inst, step(7, 0, 1, end=True))) == [2]
    assert released == [[SlotEvent(0, 7, 1)]]


async def test_restore_works_without_backup_too() -> None:
    inst, _, _ = make(backup=False)
    assert inst.restore(RestoreSequence(2, 9, 55, state(4), no=3))
    result = await run(inst, step(9, 2, 1, gen=55))
    assert out(result) == [5] and result.backup is None
