"""SequenceInstance with state backup: each step's state goes to the router on its poll, the step is answered when
the router acknowledges it (or unprotected after BACKUP_WAIT_S), snapshots carry every state, restore() adopts a
sequence moved here from a lost instance.  Driven by a fake model (an accumulator with implicit state)."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.sequence import (
    InstanceEvents,
    PollEvents,
    RestoreSequence,
    SequenceStep,
    SlotEvent,
    StateBackup,
    StepResult,
)
from serve_app.protos import model_config_pb2 as mc
from serve_app.runtime import sequence_instance
from serve_app.runtime.sequence_instance import SequenceInstance
from serve_app.scheduling.sequence_backups import RECENT

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


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


class FakeClock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


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
    model, clock = FakeModel(), FakeClock()
    inst = SequenceInstance(
        cfg or config(),
        pathlib.Path("/nonexistent"),
        model,
        instance_id="i0",
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


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def poll(inst: SequenceInstance, acked: int = 0, wait_s: float = 0.001) -> InstanceEvents:
    return await asyncio.wait_for(inst.poll(PollEvents(wait_s=wait_s, acked=acked)), 1)


async def executed(inst: SequenceInstance) -> InstanceEvents:
    """The poll that carries the backups of the next execution (it answers as soon as they exist)."""
    return await asyncio.wait_for(inst.poll(PollEvents(wait_s=60)), 1)


async def protected(inst: SequenceInstance, s: SequenceStep) -> tuple[StepResult, InstanceEvents]:
    """Run one step the way the router sees it: its backup on a poll, then its answer after the ack."""
    task = asyncio.create_task(inst.step(s))
    events = await executed(inst)
    await settle()
    assert not task.done()
    await poll(inst, acked=events.backup_seq)
    return await asyncio.wait_for(task, 1), events


# --------------------------------------------------------------------------- the ack


async def test_answer_waits_for_the_ack_of_its_backup() -> None:
    inst, model, _ = make()
    assert inst.backup
    task = asyncio.create_task(inst.step(step(7, 0, 5, gen=3, start=True, step_id=101)))
    events = await executed(inst)
    assert len(model.executions) == 1
    assert events.backup_seq == 1
    (b,) = events.backups
    assert (b.corr_id, b.slot, b.generation, b.step_id) == (7, 0, 3, 101)
    assert states(b) == [5]
    assert b.outputs is not None and b.outputs["OUTPUT"].ravel().tolist() == [5]
    await settle()
    assert not task.done()  # executed, but not answered before the router holds its state
    nothing = await poll(inst, acked=0)  # an ack of an older number changes nothing
    assert nothing.backups == () and nothing.backup_seq == 1
    await settle()
    assert not task.done()
    again = await poll(inst, acked=1)
    assert again.backups == ()  # each backup is sent once
    assert out(await asyncio.wait_for(task, 1)) == [5]
    assert inst.unprotected == 0


async def test_state_carried_and_backed_up_after_each_step() -> None:
    inst, model, _ = make()
    seen: list[tuple[int, list[int], list[int]]] = []
    for i, value in enumerate((1, 2, 3)):
        result, events = await protected(inst, step(7, 0, value, start=i == 0, step_id=10 + i))
        (b,) = events.backups
        assert b.outputs is not None
        seen.append((b.step_id, states(b), b.outputs["OUTPUT"].ravel().tolist()))
        assert out(result) == states(b)
    assert seen == [(10, [1], [1]), (11, [3], [3]), (12, [6], [6])]
    assert [col(ex, "INPUT_STATE") for ex in model.executions] == [[0], [1], [3]]
    assert [e.backup_seq for e in [await poll(inst)]] == [3]


async def test_end_steps_are_not_backed_up() -> None:
    inst, _, _ = make()
    await protected(inst, step(7, 0, 1, start=True, step_id=1))
    # The END runs with nothing held: answered at once, no backup.
    r = await asyncio.wait_for(inst.step(step(7, 0, 2, end=True, step_id=2)), 1)
    assert out(r) == [3]
    events = await poll(inst)
    assert events.backups == () and events.backup_seq == 1
    assert events.released == (SlotEvent(0, 7, 1),)
    # A one-step sequence (START and END together): nothing to back up either.
    r = await asyncio.wait_for(inst.step(step(8, 1, 4, gen=2, start=True, end=True)), 1)
    assert out(r) == [4]
    assert (await poll(inst)).backups == ()


async def test_answers_stay_in_order_behind_held_ones() -> None:
    inst, _, _ = make()
    first = asyncio.create_task(inst.step(step(7, 0, 1, start=True, step_id=1)))
    events = await executed(inst)
    assert events.backup_seq == 1
    # An END of another sequence runs while 7's answer is held: it is not backed up, but waits behind it.
    ending = asyncio.create_task(inst.step(step(8, 1, 5, gen=2, start=True, end=True)))
    released = await executed(inst)  # its slot is released at once (the router may give it out again)
    assert released.released == (SlotEvent(1, 8, 2),) and released.backups == () and released.backup_seq == 1
    await settle()
    assert not first.done() and not ending.done()
    # A third step, backed up under the next number.
    third = asyncio.create_task(inst.step(step(7, 0, 2, step_id=2)))
    later = await executed(inst)
    assert later.backup_seq == 2 and [b.step_id for b in later.backups] == [2]
    await settle()
    assert not first.done() and not ending.done() and not third.done()
    await poll(inst, acked=1)  # the first number: 7's first step and the END queued behind it
    await settle()
    assert first.done() and ending.done() and not third.done()
    assert out(first.result()) == [1] and out(ending.result()) == [5]
    await poll(inst, acked=2)
    assert out(await asyncio.wait_for(third, 1)) == [3]


async def test_failed_execution_waits_behind_held_answers() -> None:
    inst, model, _ = make()
    first = asyncio.create_task(inst.step(step(7, 0, 1, start=True, step_id=1)))
    events = await executed(inst)
    model.error = RuntimeError("boom")
    failing = asyncio.create_task(inst.step(step(8, 1, 1, gen=2, start=True)))
    await settle()
    await settle()
    assert len(model.executions) == 2 and not failing.done()
    await poll(inst, acked=events.backup_seq)
    assert out(await asyncio.wait_for(first, 1)) == [1]
    assert (await asyncio.wait_for(failing, 1)).error is not None


async def test_one_execution_backs_up_every_row_under_one_number() -> None:
    inst, model, _ = make(config(max_batch_size=4))
    model.hold()
    blocker = asyncio.create_task(inst.step(step(999, 3, 0, gen=9, start=True, end=True)))  # not backed up
    await asyncio.wait_for(model.started.wait(), 1)
    tasks = [
        asyncio.create_task(inst.step(step(10, 0, 4, gen=1, start=True, step_id=40))),
        asyncio.create_task(inst.step(step(12, 2, 6, gen=2, start=True, step_id=60))),
    ]
    await asyncio.sleep(0)
    model.go()
    assert out(await asyncio.wait_for(blocker, 1)) == [0]
    events = await executed(inst)
    assert events.backup_seq == 1
    assert [(b.corr_id, b.slot, b.generation, b.step_id, states(b)) for b in events.backups] == [
        (10, 0, 1, 40, [4]),
        (12, 2, 2, 60, [6]),
    ]
    assert all(b.states["INPUT_STATE"].shape == (1,) for b in events.backups)  # no batch dimension
    await settle()
    assert not any(t.done() for t in tasks)
    await poll(inst, acked=1)
    assert [out(r) for r in await asyncio.wait_for(asyncio.gather(*tasks), 1)] == [[4], [6]]


async def test_poll_returns_at_once_when_backups_are_pending() -> None:
    inst, _, _ = make()
    task = asyncio.create_task(inst.step(step(7, 0, 1, start=True, step_id=1)))
    for _ in range(20):
        await asyncio.sleep(0)
        if inst._backups:
            break
    assert inst._backups, "the step did not execute"
    # The backup is already there: a long poll answers without waiting.
    events = await asyncio.wait_for(inst.poll(PollEvents(wait_s=60)), 1)
    assert [b.step_id for b in events.backups] == [1]
    await poll(inst, acked=events.backup_seq)
    assert out(await asyncio.wait_for(task, 1)) == [1]


async def test_a_waiting_poll_is_woken_by_a_backup() -> None:
    inst, _, _ = make()
    waiting = asyncio.create_task(inst.poll(PollEvents(wait_s=60)))
    await settle()
    assert not waiting.done()
    task = asyncio.create_task(inst.step(step(7, 0, 1, start=True, step_id=1)))
    events = await asyncio.wait_for(waiting, 1)
    assert [b.step_id for b in events.backups] == [1]
    await poll(inst, acked=events.backup_seq)
    assert out(await asyncio.wait_for(task, 1)) == [1]


async def test_unacknowledged_answers_go_out_unprotected(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sequence_instance, "BACKUP_WAIT_S", 0.01)
    inst, _, _ = make()
    tasks = [asyncio.create_task(inst.step(step(7, 0, 1, start=True, step_id=1)))]
    await executed(inst)  # the backup went out, the router never acknowledges it
    tasks.append(asyncio.create_task(inst.step(step(7, 0, 2, step_id=2))))
    results = await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert [out(r) for r in results] == [[1], [3]]
    assert inst.unprotected == 2
    assert "did not acknowledge state backups" in caplog.text
    # A later ack of those numbers is harmless.
    await poll(inst, acked=2)
    assert inst.unprotected == 2


# --------------------------------------------------------------------------- snapshot


async def test_snapshot_includes_every_held_state() -> None:
    inst, _, _ = make()
    await protected(inst, step(7, 0, 5, gen=3, start=True, step_id=1))
    await protected(inst, step(8, 1, 2, gen=4, start=True, step_id=2))
    await protected(inst, step(7, 0, 1, gen=3, step_id=3))
    snap = await asyncio.wait_for(inst.poll(PollEvents(snapshot=True, wait_s=60)), 1)
    assert snap.occupied == (SlotEvent(0, 7, 3), SlotEvent(1, 8, 4))
    # each with its sequence's last step and answer, so that step is never run twice after a crash
    assert [
        (b.corr_id, b.slot, b.generation, b.step_id, b.outputs and b.outputs["OUTPUT"].ravel().tolist(), states(b))
        for b in snap.backups
    ] == [(7, 0, 3, 3, [6], [6]), (8, 1, 4, 2, [2], [2])]
    assert snap.backup_seq == 3


async def test_snapshot_sends_pending_step_backups_first() -> None:
    inst, _, _ = make()
    await protected(inst, step(8, 1, 2, gen=4, start=True, step_id=2))
    task = asyncio.create_task(inst.step(step(7, 0, 5, gen=3, start=True, step_id=1)))
    for _ in range(20):
        await asyncio.sleep(0)
        if inst._backups:
            break
    snap = await asyncio.wait_for(inst.poll(PollEvents(snapshot=True)), 1)  # a new router, before the step's poll
    assert [(b.corr_id, b.step_id) for b in snap.backups] == [(7, 1), (7, 1), (8, 2)]
    await poll(inst, acked=snap.backup_seq)
    assert out(await asyncio.wait_for(task, 1)) == [5]


async def test_snapshot_without_backup_has_no_states() -> None:
    inst, _, _ = make(backup=False)
    await inst.step(step(7, 0, 5, start=True))
    snap = await asyncio.wait_for(inst.poll(PollEvents(snapshot=True)), 1)
    assert snap.occupied == (SlotEvent(0, 7, 1),) and snap.backups == ()


# --------------------------------------------------------------------------- restore


async def test_restore_adopts_a_free_slot_and_the_next_step_uses_its_state() -> None:
    inst, model, _ = make()
    message = RestoreSequence(1, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)})
    assert inst.restore(message)
    assert inst.batcher.occupied() == [SlotEvent(1, 9, 55)]
    assert inst.live_sequences() == 1
    result, events = await protected(inst, step(9, 1, 2, gen=55, step_id=7))
    assert out(result) == [12]
    assert col(model.executions[-1], "INPUT_STATE") == [0, 10]  # slot 1's row carries the restored state
    assert col(model.executions[-1], "START") == [0, 0]
    (b,) = events.backups
    assert (b.corr_id, b.slot, b.generation, b.step_id, states(b)) == (9, 1, 55, 7, [12])
    # The sequence goes on and ends there as usual.
    assert out(await asyncio.wait_for(inst.step(step(9, 1, 1, gen=55, end=True)), 1)) == [13]
    assert (await poll(inst)).released == (SlotEvent(1, 9, 55),)


async def test_restore_into_an_occupied_slot_is_refused() -> None:
    inst, _, _ = make()
    await protected(inst, step(7, 0, 5, gen=3, start=True, step_id=1))
    assert not inst.restore(RestoreSequence(0, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    assert not inst.restore(RestoreSequence(0, 7, 3, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    assert not inst.restore(RestoreSequence(99, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    assert inst.batcher.occupied() == [SlotEvent(0, 7, 3)]
    # The occupant's state is untouched.
    result, _ = await protected(inst, step(7, 0, 1, gen=3, step_id=2))
    assert out(result) == [6]


async def test_restored_sequence_steps_of_another_generation_are_not_here() -> None:
    inst, _, _ = make()
    assert inst.restore(RestoreSequence(0, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    assert (await inst.step(step(9, 0, 1, gen=54))).not_here
    assert (await inst.step(step(8, 0, 1, gen=55))).not_here


async def test_start_on_a_restored_sequence_resets_its_state() -> None:
    inst, model, _ = make()
    assert inst.restore(RestoreSequence(0, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    result, _ = await protected(inst, step(9, 0, 2, gen=55, start=True, step_id=1))
    assert out(result) == [2]
    assert col(model.executions[-1], "INPUT_STATE") == [0]


async def test_restored_sequence_expires_when_idle() -> None:
    cfg = config()
    cfg.sequence_batching.max_sequence_idle_microseconds = 1000
    inst, _, clock = make(cfg)
    assert inst.restore(RestoreSequence(0, 9, 55, {"INPUT_STATE": np.array([10], dtype=np.int32)}))
    clock.now += 1_000_000
    # Any later step checks the idle sequences.
    assert out(await asyncio.wait_for(inst.step(step(8, 1, 1, gen=2, start=True, end=True)), 1)) == [1]
    events = await poll(inst)
    assert SlotEvent(0, 9, 55) in events.released
    assert inst.state.held(0) is None


# --------------------------------------------------------------------------- without backup


async def test_without_backup_answers_at_once() -> None:
    inst, _, _ = make(backup=False)
    assert not inst.backup
    results = [
        await asyncio.wait_for(inst.step(step(7, 0, v, start=i == 0, step_id=i + 1)), 1) for i, v in enumerate((1, 2))
    ]
    assert [out(r) for r in results] == [[1], [3]]
    events = await poll(inst)
    assert events.backups == () and events.backup_seq == 0
    assert inst.unprotected == 0


async def test_backup_needs_implicit_state() -> None:
    inst, _, _ = make(config(stateful=False))
    assert not inst.backup
    assert out(await asyncio.wait_for(inst.step(step(7, 0, 1, start=True)), 1)) == [1]
    assert (await poll(inst)).backups == ()


async def test_backup_off_with_on_release() -> None:
    released: list[list[SlotEvent]] = []
    inst, _, _ = make(on_release=released.append)
    assert not inst.backup
    assert out(await asyncio.wait_for(inst.step(step(7, 0, 1, start=True)), 1)) == [1]
    assert out(await asyncio.wait_for(inst.step(step(7, 0, 1, end=True)), 1)) == [2]
    assert released == [[SlotEvent(0, 7, 1)]]


async def test_restore_works_without_backup_too() -> None:
    inst, _, _ = make(backup=False)
    assert inst.restore(RestoreSequence(2, 9, 55, {"INPUT_STATE": np.array([4], dtype=np.int32)}))
    assert out(await asyncio.wait_for(inst.step(step(9, 2, 1, gen=55)), 1)) == [5]


async def test_at_most_recent_executions_await_their_ack() -> None:
    """Pipelined steps of one sequence: after RECENT unacknowledged executions the instance waits for the router,
    so every step that ran but may not have been answered is among the answers the router keeps."""
    inst, model, _ = make()
    tasks = [asyncio.create_task(inst.step(step(7, 0, 1, start=i == 0, step_id=i + 1))) for i in range(RECENT + 2)]
    for _ in range(RECENT + 4):  # let every execution that may run, run (its backups taken, none acknowledged)
        await settle()
        await poll(inst)
    assert len(model.executions) == RECENT
    assert not any(t.done() for t in tasks)
    await poll(inst, acked=2)  # two acknowledged: two more may run
    for _ in range(4):
        await settle()
        await poll(inst)
    assert len(model.executions) == RECENT + 2
    await poll(inst, acked=RECENT + 2)
    results = [out(await asyncio.wait_for(t, 1)) for t in tasks]
    assert results == [[i + 1] for i in range(RECENT + 2)]


async def test_after_an_overdue_ack_steps_are_answered_at_once_until_the_router_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A router given up on is not waited for again: steps go out unprotected (and unthrottled) until it polls,
    and that poll gets every sequence's full state, so its backups are current again."""
    monkeypatch.setattr(sequence_instance, "BACKUP_WAIT_S", 0.01)
    inst, _, _ = make()
    first = await asyncio.wait_for(inst.step(step(7, 0, 1, start=True, step_id=1)), 1)  # given up on after 10 ms
    assert out(first) == [1] and inst.unprotected == 1
    for i in range(2, RECENT + 4):  # answered at once, not throttled
        assert out(await asyncio.wait_for(inst.step(step(7, 0, 1, step_id=i)), 1)) == [i]
    assert inst.unprotected == RECENT + 3
    back = await poll(inst)
    assert [(b.step_id, states(b)) for b in back.backups] == [(1, [1]), (RECENT + 3, [RECENT + 3])]
    task = asyncio.create_task(inst.step(step(7, 0, 1, step_id=99)))  # the router is back: held again
    events = await executed(inst)
    await settle()
    assert not task.done()
    await poll(inst, acked=events.backup_seq)
    assert out(await asyncio.wait_for(task, 1)) == [RECENT + 4]
