"""SequenceInstance driven by a fake model (an accumulator with implicit state) and a fake clock: the control
tensors and states each execution receives, state carried across steps, empty direct rows, stale steps,
statistics fields, slot releases through poll() and on_release."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InternalError, Unavailable
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import InstanceEvents, PollEvents, SequenceStep, SlotEvent, StepResult
from tests.support.clock import FakeClock

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def config(
    strategy: str = "direct { }",
    max_batch_size: int = 4,
    state_dims: str = "[ 1 ]",
    input_dims: str = "[ -1 ]",
    extra: str = "",
) -> mc.ModelConfig:
    text = f"""
        name: "acc"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: {input_dims} }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
                 {{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: {state_dims} }} ]
        sequence_batching {{
          {strategy}
          {extra}
          {CONTROLS}
          state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32
                     dims: {state_dims} }} ]
        }}
    """
    return text_format.Parse(text, mc.ModelConfig())


def accumulate(ex: Execution) -> dict[str, np.ndarray]:
    """OUTPUT_STATE = INPUT_STATE + sum(INPUT) per row; OUTPUT = the new state (its first element)."""
    x, state = ex.inputs["INPUT"], ex.inputs["INPUT_STATE"]
    new = state + x.sum(axis=-1, keepdims=True).astype(np.int32)
    return {"OUTPUT_STATE": new, "OUTPUT": new[..., :1]}


def grow(ex: Execution) -> dict[str, np.ndarray]:
    """OUTPUT_STATE = INPUT_STATE with the row's input appended (its shape grows each step)."""
    new = np.concatenate([ex.inputs["INPUT_STATE"], ex.inputs["INPUT"]], axis=-1)
    return {"OUTPUT_STATE": new, "OUTPUT": new.sum(axis=-1, keepdims=True).astype(np.int32)}


class FakeModel:
    """The instance's ``run``: records each Execution; ``hold()`` makes the next executions wait for ``go()``."""

    def __init__(self, compute: Callable[[Execution], dict[str, np.ndarray]] = accumulate) -> None:
        self.compute = compute
        self.executions: list[Execution] = []
        self._gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.raises: Exception | None = None
        self.error: Exception | None = None
        self.timings = ExecutionResult(wait_ns=5, compute_input_ns=10, compute_infer_ns=20, compute_output_ns=30)

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
        if self.raises is not None:
            raise self.raises
        t = self.timings
        if self.error is not None:
            return ExecutionResult(error=self.error)  # type: ignore[arg-type]
        outputs = {name: arr for name, arr in self.compute(ex).items() if name in ex.outputs}
        return ExecutionResult(outputs, None, t.wait_ns, t.compute_input_ns, t.compute_infer_ns, t.compute_output_ns)


def make(
    cfg: mc.ModelConfig | None = None,
    model: FakeModel | None = None,
    clock: FakeClock | None = None,
    on_release: Callable[[list[SlotEvent]], None] | None = None,
) -> tuple[SequenceInstance, FakeModel, FakeClock]:
    model = model or FakeModel()
    clock = clock or FakeClock(1_000_000)
    inst = SequenceInstance(
        cfg or config(), pathlib.Path("/nonexistent"), model, instance_id="i0", clock=clock, on_release=on_release
    )
    return inst, model, clock


def step(
    corr: int | str,
    slot: int,
    value: int | list[int],
    *,
    gen: int = 1,
    start: bool = False,
    end: bool = False,
    batched: bool = True,
    outputs: tuple[str, ...] = ("OUTPUT",),
) -> SequenceStep:
    row = np.array(value if isinstance(value, list) else [value], dtype=np.int32)
    data = row[None, :] if batched else row
    return SequenceStep(corr, slot, gen, start, end, {"INPUT": data}, outputs, 1 if batched else 0)


def out(result: StepResult, name: str = "OUTPUT") -> list[int]:
    assert result.error is None, result.error
    return result.outputs[name].ravel().tolist()


def col(ex: Execution, name: str) -> list[int]:
    return ex.inputs[name].ravel().tolist()


async def wait_started(model: FakeModel) -> None:
    await asyncio.wait_for(model.started.wait(), 1)
    model.started.clear()


async def run_steps(
    inst: SequenceInstance, model: FakeModel, rows: list[SequenceStep], blocker: SequenceStep | None = None
) -> list[StepResult]:
    """Queue ``rows`` while the model is held by an execution of ``blocker`` (by default, a sequence in slot 3),
    so that they form the next batch."""
    model.hold()
    model.started.clear()
    blocker_task = asyncio.create_task(inst.step(blocker or step(999, 3, 0, gen=9, start=True)))
    await wait_started(model)
    tasks = [asyncio.create_task(inst.step(s)) for s in rows]
    await asyncio.sleep(0)
    model.go()
    assert (await blocker_task).error is None
    return list(await asyncio.gather(*tasks))


# --------------------------------------------------------------------------- one sequence


async def test_controls_and_state_carried_across_steps() -> None:
    inst, model, _ = make()
    results = []
    for i, value in enumerate((1, 2, 3, 4)):
        results.append(await inst.step(step(7, 0, value, start=i == 0, end=i == 3)))
    assert [out(r) for r in results] == [[1], [3], [6], [10]]
    assert [out(r, "OUTPUT") for r in results] == [[1], [3], [6], [10]]
    assert all(set(r.outputs) == {"OUTPUT"} for r in results)  # only what the step asked for
    assert all(r.outputs["OUTPUT"].shape == (1, 1) for r in results)
    assert len(model.executions) == 4
    first = model.executions[0]
    assert set(first.inputs) == {"INPUT", "INPUT_STATE", "START", "END", "READY", "CORRID"}
    assert first.outputs == ("OUTPUT", "OUTPUT_STATE") and first.batch_size == 1
    assert all(ex.inputs[n].shape == (1, 1) for ex in model.executions for n in ("START", "END", "READY", "CORRID"))
    assert [col(ex, "START") for ex in model.executions] == [[1], [0], [0], [0]]
    assert [col(ex, "END") for ex in model.executions] == [[0], [0], [0], [1]]
    assert [col(ex, "READY") for ex in model.executions] == [[1]] * 4
    assert [col(ex, "CORRID") for ex in model.executions] == [[7]] * 4
    assert model.executions[0].inputs["CORRID"].dtype == np.uint64
    assert [col(ex, "INPUT_STATE") for ex in model.executions] == [[0], [1], [3], [6]]
    assert model.executions[0].inputs["INPUT_STATE"].shape == (1, 1)


async def test_start_restarts_the_state() -> None:
    inst, model, _ = make()
    await inst.step(step(7, 0, 5, start=True))
    await inst.step(step(7, 0, 5))
    r = await inst.step(step(7, 0, 2, start=True))  # START again on the same slot and owner: from scratch
    assert out(r) == [2]
    assert col(model.executions[-1], "INPUT_STATE") == [0]
    assert col(model.executions[-1], "START") == [1]
    assert out(await inst.step(step(7, 0, 1, end=True))) == [3]


async def test_client_may_ask_for_the_state_output() -> None:
    inst, model, _ = make()
    r = await inst.step(step(7, 0, 4, start=True, outputs=("OUTPUT_STATE", "OUTPUT")))
    assert out(r, "OUTPUT_STATE") == [4] and out(r) == [4]
    assert model.executions[0].outputs == ("OUTPUT_STATE", "OUTPUT")


async def test_state_dropped_when_the_slot_is_released() -> None:
    inst, model, _ = make()
    await inst.step(step(7, 0, 5, start=True, end=True))
    # A new owner of the slot starts from the initial state (not from 7's last output).
    assert out(await inst.step(step(8, 0, 1, gen=2, start=True, end=True))) == [1]
    assert col(model.executions[-1], "INPUT_STATE") == [0]


# --------------------------------------------------------------------------- direct batches


async def test_direct_batch_with_empty_rows() -> None:
    inst, model, _ = make(config(max_batch_size=4))
    # Sequence 10 in slot 0, 12 in slot 2 (slot 1 unoccupied); the held execution occupies slot 3.
    r10, r12 = await run_steps(inst, model, [step(10, 0, 4, gen=1, start=True), step(12, 2, 6, gen=2, start=True)])
    assert out(r10) == [4] and out(r12) == [6]
    ex = model.executions[-1]
    assert ex.batch_size == 4  # slots 0 .. 3 (slot 3 is held by the blocker, nothing queued)
    assert col(ex, "INPUT") == [4, 0, 6, 0]
    assert col(ex, "READY") == [1, 0, 1, 0]
    assert col(ex, "START") == [1, 0, 1, 0]
    assert col(ex, "END") == [0, 0, 0, 0]
    assert col(ex, "CORRID") == [10, 0, 12, 0]
    assert col(ex, "INPUT_STATE") == [0, 0, 0, 0]
    assert ex.inputs["INPUT_STATE"].shape == (4, 1)
    # Each step gets its own row back; only the first real row carries the execution's size.
    assert [r10.execution_batch, r12.execution_batch] == [4, 0]
    # State went to the right slots: continuing 12 alone gives rows 0..3 with only row 2 ready.
    assert out(await inst.step(step(12, 2, 1, gen=2))) == [7]
    ex = model.executions[-1]
    assert col(ex, "READY") == [0, 0, 1, 0] and col(ex, "INPUT_STATE") == [0, 0, 6, 0]
    assert out(await inst.step(step(10, 0, 1, gen=1, end=True))) == [5]


async def test_direct_rows_of_another_shape_wait() -> None:
    inst, model, _ = make(config(max_batch_size=2))
    model.hold()
    a = asyncio.create_task(inst.step(step(1, 0, [1, 1], start=True)))
    await wait_started(model)
    b = asyncio.create_task(inst.step(step(2, 1, [1, 1, 1], start=True)))
    c = asyncio.create_task(inst.step(step(1, 0, [5, 5])))
    await asyncio.sleep(0)
    model.go()
    assert [out(r) for r in await asyncio.gather(a, c, b)] == [[2], [12], [3]]
    shapes = [ex.inputs["INPUT"].shape for ex in model.executions]
    assert shapes == [(1, 2), (2, 2), (2, 3)]  # the [1,3] row waited for its own execution
    assert col(model.executions[1], "READY") == [1, 0]
    assert col(model.executions[2], "READY") == [0, 1]


async def test_direct_min_slot_utilization_waits_on_the_clock() -> None:
    extra_cfg = config(strategy="direct { max_queue_delay_microseconds: 1000 minimum_slot_utilization: 1.0 }")
    inst, model, clock = make(extra_cfg)
    first = asyncio.create_task(inst.step(step(1, 0, 1, start=True)))
    await asyncio.sleep(0)
    assert model.executions == [] and not first.done()
    # Past the delay on the instance's clock, the next check runs what is there.
    clock.now += 1_000_000
    r = await asyncio.wait_for(first, 1)
    assert out(r) == [1] and col(model.executions[0], "READY") == [1]


async def test_state_groups_of_different_shapes_run_apart() -> None:
    inst, model, _ = make(config(max_batch_size=2, state_dims="[ -1 ]"), FakeModel(grow))
    # The blocking step leaves sequence 1 with the state [0, 1].
    r1, r2 = await run_steps(inst, model, [step(1, 0, 2), step(2, 1, 3, start=True)], blocker=step(1, 0, 1, start=True))
    assert out(r1) == [3] and out(r2) == [3]
    *_, ex1, ex2 = model.executions
    # One decision, two executions: the states [0, 1] and [0] can't share a tensor.
    assert ex1.inputs["INPUT_STATE"].tolist() == [[0, 1]] and col(ex1, "CORRID") == [1]
    assert ex2.inputs["INPUT_STATE"].tolist() == [[0]] and col(ex2, "CORRID") == [2]
    assert (r1.execution_batch, r2.execution_batch) == (1, 1)


# --------------------------------------------------------------------------- oldest batches


async def test_oldest_batch_rows_in_age_order_with_their_states() -> None:
    cfg = config(strategy="oldest { max_candidate_sequences: 4 }", max_batch_size=2)
    inst, model, clock = make(cfg)
    assert out(await inst.step(step(5, 2, 10, start=True))) == [10]
    assert out(await inst.step(step(6, 0, 20, start=True))) == [20]
    model.hold()
    blocker = asyncio.create_task(inst.step(step(9, 3, 0, start=True)))
    await wait_started(model)
    clock.now += 1
    a = asyncio.create_task(inst.step(step(5, 2, 1)))
    await asyncio.sleep(0)
    clock.now += 1
    b = asyncio.create_task(inst.step(step(6, 0, 2, end=True)))
    c = asyncio.create_task(inst.step(step(5, 2, 3, end=True)))
    await asyncio.sleep(0)
    model.go()
    await blocker
    ra, rb, rc = await asyncio.gather(a, b, c)
    assert (out(ra), out(rb), out(rc)) == ([11], [22], [14])
    ex = model.executions[-2]
    assert ex.batch_size == 2
    assert col(ex, "CORRID") == [5, 6]  # the older request first; never two of one sequence
    assert col(ex, "INPUT_STATE") == [10, 20] and col(ex, "END") == [0, 1] and col(ex, "READY") == [1, 1]
    assert col(model.executions[-1], "CORRID") == [5]
    assert (ra.execution_batch, rb.execution_batch, rc.execution_batch) == (2, 0, 1)


# --------------------------------------------------------------------------- unbatched


async def test_unbatched_model() -> None:
    inst, model, _ = make(config(max_batch_size=0, input_dims="[ 1 ]"))
    results = [await inst.step(step(5, 0, v, start=i == 0, end=i == 2, batched=False)) for i, v in enumerate((2, 3, 4))]
    assert [r.outputs["OUTPUT"].tolist() for r in results] == [[2], [5], [9]]
    ex = model.executions[1]
    assert ex.batch_size == 0
    assert {n: ex.inputs[n].shape for n in ex.inputs} == {
        "INPUT": (1,),
        "INPUT_STATE": (1,),
        "START": (1,),
        "END": (1,),
        "READY": (1,),
        "CORRID": (1,),
    }
    assert [col(e, "INPUT_STATE") for e in model.executions] == [[0], [2], [5]]
    assert all(r.execution_batch == 1 for r in results)


# --------------------------------------------------------------------------- stale steps and takeover


async def test_stale_steps_are_not_here() -> None:
    inst, model, _ = make()
    assert (await inst.step(step(7, 0, 1))).not_here  # nothing in the slot
    await inst.step(step(7, 0, 1, gen=5, start=True))
    assert (await inst.step(step(7, 0, 1, gen=6))).not_here  # another slot_token
    assert (await inst.step(step(8, 0, 1, gen=5))).not_here  # another ID
    assert (await inst.step(step(7, 9, 1, gen=5, start=True))).not_here  # no such slot
    await inst.step(step(7, 0, 1, gen=5, end=True))
    assert (await inst.step(step(7, 0, 1, gen=5))).not_here  # ended
    assert len(model.executions) == 2


async def test_start_of_another_sequence_displaces_queued_steps() -> None:
    inst, model, _ = make(config(max_batch_size=1))
    model.hold()
    running = asyncio.create_task(inst.step(step(7, 0, 1, gen=1, start=True)))
    await wait_started(model)
    queued = asyncio.create_task(inst.step(step(7, 0, 2, gen=1)))
    await asyncio.sleep(0)
    newer = asyncio.create_task(inst.step(step(8, 0, 3, gen=2, start=True)))
    lost = await asyncio.wait_for(queued, 1)
    assert isinstance(lost.error, Unavailable) and "sequence 7 lost its slot" in lost.error.message
    model.go()
    assert out(await running) == [1]
    assert out(await newer) == [3]  # from the initial state
    assert col(model.executions[-1], "INPUT_STATE") == [0]


async def test_restart_under_a_new_generation_runs_the_queued_steps_first() -> None:
    inst, model, _ = make(config(max_batch_size=1))
    model.hold()
    first = asyncio.create_task(inst.step(step(7, 0, 5, gen=1, start=True)))
    await wait_started(model)
    second = asyncio.create_task(inst.step(step(7, 0, 1, gen=1)))
    restart = asyncio.create_task(inst.step(step(7, 0, 2, gen=2, start=True)))
    await asyncio.sleep(0)
    model.go()
    assert [out(await t) for t in (first, second, restart)] == [[5], [6], [2]]
    assert [col(ex, "START") for ex in model.executions] == [[1], [0], [1]]
    assert (await inst.step(step(7, 0, 1, gen=1))).not_here  # the old slot_token is gone
    assert out(await inst.step(step(7, 0, 3, gen=2, end=True))) == [5]


async def test_late_start_of_a_released_generation_is_not_here() -> None:
    inst, model, _ = make()
    await inst.step(step(7, 0, 5, gen=4, start=True, end=True))
    assert (await inst.step(step(7, 0, 1, gen=4, start=True))).not_here
    assert len(model.executions) == 1


# --------------------------------------------------------------------------- errors and statistics fields


async def test_failed_execution_answers_every_step_and_keeps_the_state() -> None:
    inst, model, _ = make()
    await inst.step(step(7, 0, 5, start=True))
    model.raises = RuntimeError("kaboom")
    r = await inst.step(step(7, 0, 1))
    assert isinstance(r.error, InternalError) and "kaboom" in r.error.message
    assert r.execution_batch == 1
    model.raises = None
    model.error = Unavailable("backend gone")
    r = await inst.step(step(7, 0, 1))
    assert isinstance(r.error, Unavailable) and r.outputs == {}
    model.error = None
    assert out(await inst.step(step(7, 0, 1, end=True))) == [6]  # the failed steps did not touch the state


async def test_timings_and_queue_time() -> None:
    inst, model, clock = make()
    model.hold()
    first = asyncio.create_task(inst.step(step(7, 0, 1, start=True)))
    await wait_started(model)
    second = asyncio.create_task(inst.step(step(7, 0, 1)))
    await asyncio.sleep(0)
    clock.now += 700  # the second step waits 700 ns for the instance
    model.go()
    r1, r2 = await first, await second
    assert (r1.compute_input_ns, r1.compute_infer_ns, r1.compute_output_ns) == (10, 20, 30)
    assert r1.queue_ns == 5  # dispatched at once; plus the executor's own wait
    assert r2.queue_ns == 700 + 5


# --------------------------------------------------------------------------- releases


async def test_poll_reports_released_and_occupied_slots() -> None:
    inst, _, _ = make()
    assert await inst.poll(PollEvents(wait_s=0.001)) == InstanceEvents("i0")  # nothing: times out
    await inst.step(step(7, 0, 1, gen=11, start=True))
    await inst.step(step(8, 1, 1, gen=12, start=True))
    held = (SlotEvent(0, 7, 11), SlotEvent(1, 8, 12))
    assert await inst.poll(PollEvents(wait_s=0.001)) == InstanceEvents("i0", (), held)
    waiting = asyncio.create_task(inst.poll(PollEvents(wait_s=5)))
    await asyncio.sleep(0)
    assert not waiting.done()
    await inst.step(step(7, 0, 1, gen=11, end=True))
    got = await asyncio.wait_for(waiting, 1)  # answered as soon as a slot is freed
    assert got == InstanceEvents("i0", (SlotEvent(0, 7, 11),), (SlotEvent(1, 8, 12),))
    again = await inst.poll(PollEvents(wait_s=0.001))
    assert again == InstanceEvents("i0", (), (SlotEvent(1, 8, 12),))  # each release is reported once


async def test_snapshot_answers_at_once_and_clears_pending_releases() -> None:
    inst, _, _ = make()
    await inst.step(step(7, 0, 1, gen=11, start=True, end=True))
    await inst.step(step(8, 1, 1, gen=12, start=True))
    snap = await asyncio.wait_for(inst.poll(PollEvents(snapshot=True, wait_s=60)), 1)
    assert snap == InstanceEvents("i0", (), (SlotEvent(1, 8, 12),))
    assert (await inst.poll(PollEvents(wait_s=0.001))).released == ()


async def test_on_release_receives_the_events_instead_of_poll() -> None:
    seen: list[list[SlotEvent]] = []
    inst, _, _ = make(on_release=seen.append)
    await inst.step(step(7, 0, 1, gen=3, start=True, end=True))
    assert seen == [[SlotEvent(0, 7, 3)]]
    assert (await inst.poll(PollEvents(wait_s=0.001))).released == ()


async def test_idle_sequences_expire_on_the_instance_clock() -> None:
    cfg = config(extra="max_sequence_idle_microseconds: 1000")
    seen: list[list[SlotEvent]] = []
    inst, _, clock = make(cfg, on_release=seen.append)
    await inst.step(step(7, 0, 5, gen=1, start=True))
    clock.now += 999_000
    assert out(await inst.step(step(8, 1, 1, gen=2, start=True))) == [1]
    assert seen == []
    clock.now += 1_000
    # The next step of any sequence checks the idle ones: 7 has been idle for 1 ms.
    assert out(await inst.step(step(8, 1, 1, gen=2))) == [2]
    assert seen == [[SlotEvent(0, 7, 1)]]
    assert (await inst.step(step(7, 0, 1, gen=1))).not_here
    assert inst.batcher.occupied() == [SlotEvent(1, 8, 2)]


@pytest.mark.parametrize("corr", [3, "x"])
async def test_execution_batch_is_set_once_per_execution(corr: int | str) -> None:
    cfg = config(max_batch_size=4)
    if isinstance(corr, str):
        cfg.sequence_batching.ClearField("control_input")
    inst, model, _ = make(cfg)
    results = await run_steps(inst, model, [step(corr, s, 1, start=True, gen=s + 1) for s in range(3)])
    assert [r.execution_batch for r in results] == [4, 0, 0]
    assert sum(1 for r in results if r.execution_batch) == 1


async def test_empty_row_next_to_a_grown_state() -> None:
    inst, _, _ = make(config(max_batch_size=2, state_dims="[ -1 ]"), FakeModel(grow))
    # Sequence 2 in slot 1: every execution has rows 0..1, row 0 empty.
    assert out(await inst.step(step(2, 1, 5, start=True))) == [5]  # its state is now [0, 5]
    assert out(await asyncio.wait_for(inst.step(step(2, 1, 6)), 0.2)) == [11]


async def test_a_malformed_result_still_answers_the_step() -> None:
    model = FakeModel(lambda ex: {"OUTPUT_STATE": accumulate(ex)["OUTPUT_STATE"]})  # OUTPUT is missing
    inst, _, _ = make(model=model)
    result = await asyncio.wait_for(inst.step(step(7, 0, 1, start=True)), 0.2)
    assert result.error is not None


@pytest.mark.parametrize(
    "strategy", ["direct { }", "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] }"]
)
async def test_a_late_step_of_an_idle_sequence_is_not_its_continuation(strategy: str) -> None:
    """5 s idle limit; the step 6 s after START arrives before the idle timer has fired (the fake clock moved,
    the event loop did not wait): the sequence leaves its slot first, so the step is "not here" (it needs a
    START) and the freed slot is reported, for both strategies."""
    cfg = config(strategy, extra="max_sequence_idle_microseconds: 5000000")
    seen: list[list[SlotEvent]] = []
    inst, model, clock = make(cfg, on_release=seen.append)
    assert out(await inst.step(step(7, 0, 5, gen=1, start=True))) == [5]
    clock.now += 6_000_000_000
    assert (await inst.step(step(7, 0, 1, gen=1))).not_here
    assert seen == [[SlotEvent(0, 7, 1)]]
    assert inst.batcher.occupied() == []
    assert len(model.executions) == 1
    # A START takes the slot again, from the initial state.
    assert out(await inst.step(step(7, 0, 2, gen=2, start=True))) == [2]
