"""Triton's ``L0_dyna_sequence_batcher`` backlog case, replayed on the whole in-process sequence path.

Gateway scheduler, sequence router and instance wired as the in-process executor wires them, with an
accumulator (implicit state) that adds ``END * CORRID`` to its last answer, under the oldest strategy
with Triton's QA settings: 4 candidate places, preferred batch 4, 5 s queue delay, 5 s idle limit.
Four sequences start; a fifth START waits in the backlog; one of the four goes quiet past the idle
limit while the others keep sending. The quiet one's place and state must go to the backlogged one
with a fresh state, the quiet one's late step must need a START, and every other sequence must keep
its own sum. The fake clock stands in for time; the instance's idle timer is fired by hand.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidArgument, Unavailable
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferTensor, ParamValue
from serve_app.protos import model_config_pb2 as mc
from serve_app.sequence.instance import SequenceInstance
from serve_app.sequence.messages import BACKLOG_TIMEOUT, InstanceEvents
from serve_app.sequence.port import InProcessSequencePort
from serve_app.sequence.router import SequenceRouter
from serve_app.sequence.scheduler import SequenceScheduler
from tests.support.clock import FakeClock

S = 1_000_000_000  # one second of the fake clock
TIMEOUT_S = 30.0  # real time: a broken hand-over fails the test instead of hanging it
A, B, C, D, E, F = 1001, 1002, 1003, 1004, 1005, 1006

CONFIG = """
    name: "dyna"
    max_batch_size: 8
    input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    sequence_batching {
      max_sequence_idle_microseconds: 5000000
      oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
      control_input [
        { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
        { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
        { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
        { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
      ]
      state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    }
"""


class Accumulator:
    """OUTPUT_STATE = INPUT_STATE + INPUT; OUTPUT = OUTPUT_STATE + END * CORRID. Records each batch's CORRIDs."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    async def __call__(self, ex: Execution) -> ExecutionResult:
        ready = ex.inputs["READY"].astype(np.int32)
        state = ex.inputs["INPUT_STATE"] + ex.inputs["INPUT"] * ready
        corrid = ex.inputs["CORRID"].astype(np.int64)
        self.batches.append([int(c) for c, r in zip(corrid.ravel(), ready.ravel(), strict=True) if r])
        output = (state + ex.inputs["END"] * corrid).astype(np.int32)
        return ExecutionResult({"OUTPUT_STATE": state, "OUTPUT": output})


class Stack:
    """Scheduler -> router -> instance, all in this event loop, the instance on a fake clock."""

    def __init__(self) -> None:
        config = text_format.Parse(CONFIG, mc.ModelConfig())
        self.clock = FakeClock(S)
        self.model = Accumulator()
        self.router = SequenceRouter(clock=self.clock)
        self.router.add_model("dyna:1", "dyna", 4)
        self.instance = SequenceInstance(
            config, pathlib.Path("/nonexistent"), self.model, instance_id="i0", clock=self.clock,
            on_release=lambda events: self.router.released("dyna:1", InstanceEvents("i0", tuple(events))),
        )  # fmt: skip
        self.router.instance_up("dyna:1", "i0", ("local", 0))
        self.signature = ModelSignature.from_config(config, "1")
        port = InProcessSequencePort("dyna:1", self.router, self.instance.step)
        self.scheduler = SequenceScheduler(config, self.signature, port, clock=self.clock)

    def send(
        self, corr: int, value: int, *, start: bool = False, end: bool = False, timeout_us: int = 0
    ) -> asyncio.Task[int]:
        params: dict[str, ParamValue] = {"sequence_id": corr}
        if timeout_us:
            params["timeout"] = timeout_us
        if start:
            params["sequence_start"] = True
        if end:
            params["sequence_end"] = True
        data = np.array([[value]], dtype=np.int32)
        request = InferRequest("dyna", "1", inputs=[InferTensor("INPUT", "INT32", (1, 1), data)], parameters=params)
        options = RequestOptions.parse(request, self.signature, batch_size=1, sequence_model=True)

        async def run() -> int:
            submitted = self.scheduler.submit(request, options, self.clock())
            response = await asyncio.wait_for(submitted, TIMEOUT_S)
            return int(response.outputs[0].data.ravel()[0])

        return asyncio.create_task(run())

    def fire_timer(self, to_ns: int) -> None:
        """Time passes to ``to_ns``; the instance's timer (idle release, queue delay) fires."""
        self.clock.now = to_ns
        self.instance._pump()


async def until(condition: Callable[[], bool]) -> None:
    """Let the event loop run until ``condition`` holds (everything here is in-loop: no real waiting)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_an_idle_sequence_hands_its_place_to_the_backlog_without_its_state() -> None:
    st = Stack()
    t0 = S
    starts = [st.send(corr, value, start=True) for corr, value in ((A, 1), (B, 11), (C, 111), (D, 1111))]
    assert await asyncio.gather(*starts) == [1, 11, 111, 1111]
    assert st.model.batches == [[A, B, C, D]]

    st.clock.now = t0 + 2 * S  # E arrives: every place is taken, it waits in the backlog
    e_start = st.send(E, 11111, start=True)
    await until(lambda: st.router.assigner("dyna:1").backlog == [E])

    st.clock.now = t0 + 2 * S + S // 2  # B, C and D go on; A is quiet
    second = [st.send(B, 12), st.send(C, 112), st.send(D, 1112)]
    await until(lambda: st.instance.batcher.queued == 3)
    assert not e_start.done() and len(st.model.batches) == 1  # three of four preferred: they wait

    st.fire_timer(t0 + 5 * S)  # A has been idle for 5 s: its place goes to E, with a fresh state
    assert await e_start == 11111
    assert await asyncio.gather(*second) == [23, 223, 2223]
    assert sorted(st.model.batches[1]) == [B, C, D, E]
    e_end = st.send(E, 11113, end=True)
    third = [st.send(B, 12), st.send(C, 112), st.send(D, 1112)]
    assert await e_end == 11111 + 11113 + E
    assert await asyncio.gather(*third) == [35, 335, 3335]

    st.clock.now = t0 + 6 * S  # A's late step: A was released, so it is not A's continuation, nor E's
    with pytest.raises(InvalidArgument, match=f"sequence {A} to model 'dyna' must specify the START flag"):
        await st.send(A, 3)

    st.clock.now = t0 + 7 * S + S // 2
    ends = [st.send(B, 13, end=True), st.send(C, 113, end=True), st.send(D, 1113, end=True)]
    await until(lambda: st.instance.batcher.queued == 3)
    st.fire_timer(t0 + 12 * S + S // 2)  # three of four preferred: they run when the queue delay ends
    assert await asyncio.gather(*ends) == [48 + B, 448 + C, 4448 + D]
    assert st.instance.batcher.occupied() == []
    assert st.router.assigner("dyna:1").active == {}


async def test_a_late_step_before_the_idle_timer_fires_still_hands_the_place_over() -> None:
    """The same, but A's late step is what notices A's idle time (the timer has not fired yet): E is admitted
    from that release, with a fresh state, and A's step needs a START."""
    st = Stack()
    t0 = S
    starts = [st.send(corr, value, start=True) for corr, value in ((A, 1), (B, 11), (C, 111), (D, 1111))]
    assert await asyncio.gather(*starts) == [1, 11, 111, 1111]
    e_start = st.send(E, 11111, start=True)
    await until(lambda: st.router.assigner("dyna:1").backlog == [E])
    st.clock.now = t0 + 2 * S + S // 2
    second = [st.send(B, 12), st.send(C, 112), st.send(D, 1112)]
    await until(lambda: st.instance.batcher.queued == 3)

    st.clock.now = t0 + 6 * S
    with pytest.raises(InvalidArgument, match=f"sequence {A} to model 'dyna' must specify the START flag"):
        await st.send(A, 3)
    assert await e_start == 11111
    assert await asyncio.gather(*second) == [23, 223, 2223]
    assert sorted(st.model.batches[1]) == [B, C, D, E]


async def test_a_start_held_in_the_backlog_past_its_timeout_leaves_the_others_alone() -> None:
    """E's START carries a 1 s timeout and waits in the backlog while B, C and D go on: it fails with Triton's
    backlog-timeout error and E is forgotten. When A idles out, its place goes to F, with a fresh state, and
    every running sequence keeps its own sum."""
    st = Stack()
    t0 = S
    starts = [st.send(corr, value, start=True) for corr, value in ((A, 1), (B, 11), (C, 111), (D, 1111))]
    assert await asyncio.gather(*starts) == [1, 11, 111, 1111]
    e_start = st.send(E, 11111, start=True, timeout_us=1_000_000)
    await until(lambda: st.router.assigner("dyna:1").backlog == [E])
    st.clock.now = t0 + S // 2
    second = [st.send(B, 12), st.send(C, 112), st.send(D, 1112)]
    await until(lambda: st.instance.batcher.queued == 3)

    st.clock.now = t0 + 2 * S  # the router's backlog timer fires: E's second has passed
    st.router.expire_backlogs()
    with pytest.raises(Unavailable, match=BACKLOG_TIMEOUT):
        await e_start
    with pytest.raises(InvalidArgument, match=f"sequence {E} to model 'dyna' must specify the START flag"):
        await st.send(E, 11113, end=True)
    f_start = st.send(F, 100, start=True)  # backlogged behind the four running sequences
    await until(lambda: st.router.assigner("dyna:1").backlog == [F])

    st.fire_timer(t0 + 5 * S)  # A idles out; F takes its place and its batch fills up
    assert await f_start == 100
    assert await asyncio.gather(*second) == [23, 223, 2223]
    assert sorted(st.model.batches[1]) == [B, C, D, F]
    ends = [st.send(F, 200, end=True), st.send(B, 13, end=True), st.send(C, 113, end=True), st.send(D, 1113, end=True)]
    assert await asyncio.gather(*ends) == [300 + F, 36 + B, 336 + C, 3336 + D]
    assert st.router.assigner("dyna:1").active == {}
