"""ModelScheduler driven by a fake instance: merging, capacity, failures, ordering, queue policies, priorities,
statistics; and the scheduling request parameters (priority, timeout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InternalError, InvalidArgument, ServeError, Unavailable
from serve_app.inference.execution import Execution, ExecutionResult
from serve_app.inference.options import RequestOptions, request_priority, request_timeout_us
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue, RequestedOutput
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.model_scheduler import ModelScheduler
from serve_app.stats import ModelStats
from tests.support.clock import FakeClock

WIDTH = 2


async def send(scheduler: Any, req: InferRequest, batch_size: int, arrival_ns: int) -> InferResponse:
    """``req`` through the service's option parsing, then the scheduler (as the service does)."""
    options = RequestOptions.parse(req, scheduler.signature, batch_size=batch_size, sequence_model=False)
    return await scheduler.submit(req, options, arrival_ns)


def model_config(max_batch_size: int = 8, dynamic_batching: str | None = "preferred_batch_size: [8]") -> mc.ModelConfig:
    """INPUT0 -> OUTPUT0 (= INPUT0 + 1), OUTPUT1 (= INPUT0 * 2); ``dynamic_batching=None``: default scheduler."""
    text = f"""
        name: "m"
        max_batch_size: {max_batch_size}
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
        output [
          {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [{WIDTH}] }},
          {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [{WIDTH}] }}
        ]
    """
    if dynamic_batching is not None:
        text += f"dynamic_batching {{ {dynamic_batching} }}"
    return text_format.Parse(text, mc.ModelConfig())


class FakeInstance:
    """The ``dispatch`` coroutine: records each call, waits until the test releases it (unless not ``blocked``),
    then computes the outputs from the merged inputs.  A negative input fails its execution."""

    def __init__(self, *, blocked: bool = False, timings: ExecutionResult | None = None) -> None:
        self.blocked = blocked
        self.calls: list[list[Execution]] = []
        self.gates: list[asyncio.Event] = []
        self.raises: dict[int, Exception] = {}  # call index -> what the call raises
        self.timings = timings or ExecutionResult()
        self.active = 0
        self.max_active = 0

    async def __call__(self, executions: list[Execution]) -> list[ExecutionResult]:
        index = len(self.calls)
        gate = asyncio.Event()
        if not self.blocked:
            gate.set()
        self.calls.append(executions)
        self.gates.append(gate)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await gate.wait()
        finally:
            self.active -= 1
        if index in self.raises:
            raise self.raises[index]
        return [self.run(e) for e in executions]

    def run(self, execution: Execution) -> ExecutionResult:
        x = execution.inputs["INPUT0"]
        if (x < 0).any():
            return ExecutionResult(error=InternalError("negative input"))
        produced = {"OUTPUT0": x + 1, "OUTPUT1": x * 2}
        t = self.timings
        return ExecutionResult(
            outputs={name: produced[name] for name in execution.outputs},
            wait_ns=t.wait_ns,
            compute_input_ns=t.compute_input_ns,
            compute_infer_ns=t.compute_infer_ns,
            compute_output_ns=t.compute_output_ns,
        )

    def release(self, index: int) -> None:
        self.gates[index].set()

    def release_all(self) -> None:
        for gate in self.gates:
            gate.set()

    def values(self, index: int) -> list[float]:
        """The first column of INPUT0 of every execution of call ``index``, in order."""
        return [float(v) for e in self.calls[index] for v in np.atleast_1d(e.inputs["INPUT0"])[..., 0].ravel()]


def scheduler(
    config: mc.ModelConfig,
    instance: FakeInstance,
    *,
    capacity: int = 1,
    clock: Callable[[], int] = time.monotonic_ns,
) -> ModelScheduler:
    signature = ModelSignature.from_config(config, "1")
    return ModelScheduler(config, signature, instance, capacity=capacity, clock=clock)


def request(
    value: float,
    rows: int | None = 1,
    *,
    outputs: tuple[str, ...] = (),
    parameters: dict[str, ParamValue] | None = None,
    id: str = "",
) -> InferRequest:
    """``rows=None``: no batch dimension (a model that does not batch)."""
    shape = (WIDTH,) if rows is None else (rows, WIDTH)
    data = np.full(shape, value, dtype=np.float32)
    return InferRequest(
        "m",
        id=id,
        inputs=[InferTensor("INPUT0", "FP32", shape, data)],
        outputs=[RequestedOutput(n) for n in outputs],
        parameters=parameters or {},
    )


def start(sched: ModelScheduler, req: InferRequest, arrival_ns: int | None = None) -> asyncio.Task[InferResponse]:
    batch_size = req.inputs[0].shape[0] if sched.signature.batching else 0
    arrival = time.monotonic_ns() if arrival_ns is None else arrival_ns
    return asyncio.create_task(send(sched, req, batch_size, arrival))


async def settle() -> None:
    """Let every ready callback and task run."""
    for _ in range(20):
        await asyncio.sleep(0)


def output(response: InferResponse, name: str) -> np.ndarray:
    matches = [t for t in response.outputs if t.name == name]
    assert len(matches) == 1
    return matches[0].data


def durations(stats: ModelStats) -> dict[str, tuple[int, int]]:
    return {k: (v.count, v.ns) for k, v in stats.inference.items()}


# -- a single request -------------------------------------------------------------------
async def test_single_request_round_trip() -> None:
    instance = FakeInstance()
    sched = scheduler(model_config(), instance)
    req = request(3.0, id="req-1")
    response = await start(sched, req)
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "req-1")
    assert [t.name for t in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    for t in response.outputs:
        assert t.datatype == "FP32"
        assert t.shape == (1, WIDTH)
    np.testing.assert_array_equal(output(response, "OUTPUT0"), np.full((1, WIDTH), 4.0, dtype=np.float32))
    np.testing.assert_array_equal(output(response, "OUTPUT1"), np.full((1, WIDTH), 6.0, dtype=np.float32))
    assert len(instance.calls) == 1
    (execution,) = instance.calls[0]
    assert execution.inputs["INPUT0"] is req.inputs[0].data  # one request: no copy
    assert execution.outputs == ("OUTPUT0", "OUTPUT1")
    assert execution.batch_size == 1
    assert sched.inflight == 0
    assert sched.queued == 0


async def test_only_requested_outputs_are_computed_and_returned() -> None:
    instance = FakeInstance()
    sched = scheduler(model_config(), instance)
    response = await start(sched, request(3.0, outputs=("OUTPUT1",)))
    assert [t.name for t in response.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(output(response, "OUTPUT1"), np.full((1, WIDTH), 6.0, dtype=np.float32))
    assert instance.calls[0][0].outputs == ("OUTPUT1",)


# -- batching ------------------------------------------------------------------------------
async def test_requests_queued_while_busy_are_merged_into_one_execution() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance, capacity=1)
    first = start(sched, request(0.0))
    await settle()
    assert len(instance.calls) == 1  # the first request went alone

    b = start(sched, request(10.0, rows=1))
    c = start(sched, request(20.0, rows=2))
    d = start(sched, request(30.0, rows=1, outputs=("OUTPUT1",)))
    await settle()
    assert len(instance.calls) == 1
    assert sched.queued == 3
    assert sched.stats.pending == 3

    instance.release(0)
    await settle()
    assert first.done()
    assert len(instance.calls) == 2
    (execution,) = instance.calls[1]
    assert execution.batch_size == 4
    assert execution.inputs["INPUT0"].shape == (4, WIDTH)
    np.testing.assert_array_equal(execution.inputs["INPUT0"][:, 0], [10.0, 20.0, 20.0, 30.0])
    assert execution.outputs == ("OUTPUT0", "OUTPUT1")  # b and c want every output
    assert sched.queued == 0
    assert sched.stats.pending == 0

    instance.release(1)
    rb, rc, rd = await asyncio.gather(b, c, d)
    np.testing.assert_array_equal(output(rb, "OUTPUT0"), np.full((1, WIDTH), 11.0, dtype=np.float32))
    np.testing.assert_array_equal(output(rb, "OUTPUT1"), np.full((1, WIDTH), 20.0, dtype=np.float32))
    np.testing.assert_array_equal(output(rc, "OUTPUT0"), np.full((2, WIDTH), 21.0, dtype=np.float32))
    assert [t.shape for t in rc.outputs] == [(2, WIDTH), (2, WIDTH)]
    assert [t.name for t in rd.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(output(rd, "OUTPUT1"), np.full((1, WIDTH), 60.0, dtype=np.float32))

    stats = sched.stats
    assert stats.execution_count == 2
    assert stats.inference_count == 5  # batch sizes 1 + 1 + 2 + 1
    assert stats.inference["success"].count == 4
    assert sorted(stats.batches) == [1, 4]
    assert stats.batches[1]["compute_infer"].count == 1
    assert stats.batches[4]["compute_infer"].count == 1


async def test_next_batch_leaves_before_the_answered_callers_resume() -> None:
    """The instance computes the next batch while the last one's answers are written, as in Triton."""
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance, capacity=1)
    calls_seen: list[int] = []

    async def caller(value: float) -> InferResponse:
        response = await send(sched, request(value), 1, time.monotonic_ns())
        calls_seen.append(len(instance.calls))  # what the instance had been given when this caller resumed
        return response

    first = asyncio.create_task(caller(1.0))
    await settle()
    queued = asyncio.create_task(caller(2.0))
    await settle()
    assert len(instance.calls) == 1

    instance.release(0)
    await settle()
    assert first.done()
    assert calls_seen == [2]  # the queued request had gone to the instance before the first caller resumed

    instance.release(1)
    await queued
    assert calls_seen == [2, 2]


async def test_requests_of_different_shapes_are_not_merged() -> None:
    config = text_format.Parse(
        """
        name: "m"
        max_batch_size: 8
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]
        output [
          { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] },
          { name: "OUTPUT1" data_type: TYPE_FP32 dims: [-1] }
        ]
        dynamic_batching { preferred_batch_size: [8] }
        """,
        mc.ModelConfig(),
    )
    instance = FakeInstance(blocked=True)
    sched = scheduler(config, instance)

    def wide(value: float, width: int) -> InferRequest:
        data = np.full((1, width), value, dtype=np.float32)
        return InferRequest("m", inputs=[InferTensor("INPUT0", "FP32", (1, width), data)])

    tasks = [start(sched, wide(1.0, 2)), start(sched, wide(2.0, 2)), start(sched, wide(3.0, 3))]
    await settle()
    instance.release(0)
    await settle()
    assert [e.inputs["INPUT0"].shape for e in instance.calls[1]] == [(1, 2)]
    instance.release_all()
    await settle()
    instance.release_all()
    responses = await asyncio.gather(*tasks)
    assert [e.inputs["INPUT0"].shape for c in instance.calls for e in c] == [(1, 2), (1, 2), (1, 3)]
    assert output(responses[2], "OUTPUT0").shape == (1, 3)


async def test_preferred_batch_size_is_sent_without_waiting_for_the_delay() -> None:
    instance = FakeInstance()
    config = model_config(dynamic_batching="preferred_batch_size: [4] max_queue_delay_microseconds: 10000000")
    sched = scheduler(config, instance, capacity=1)
    tasks = [start(sched, request(float(i))) for i in range(4)]
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=1.0)
    assert len(instance.calls) == 1
    assert instance.calls[0][0].batch_size == 4
    assert instance.values(0) == [0.0, 1.0, 2.0, 3.0]


async def test_queue_delay_gathers_a_batch_then_sends_it() -> None:
    clock = FakeClock(0)
    instance = FakeInstance()
    config = model_config(dynamic_batching="preferred_batch_size: [4] max_queue_delay_microseconds: 20000")
    sched = scheduler(config, instance, capacity=1, clock=clock)
    tasks = [start(sched, request(1.0), arrival_ns=0), start(sched, request(2.0), arrival_ns=0)]
    await settle()
    assert instance.calls == []  # held for the delay
    assert sched.queued == 2
    clock.now = 20_000_000  # the delay has passed when the scheduler's timer fires
    responses = await asyncio.wait_for(asyncio.gather(*tasks), timeout=1.0)
    assert len(instance.calls) == 1
    assert instance.calls[0][0].batch_size == 2
    np.testing.assert_array_equal(output(responses[1], "OUTPUT0"), np.full((1, WIDTH), 3.0, dtype=np.float32))


async def test_default_scheduler_sends_one_execution_per_request() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=None), instance, capacity=1)
    first = start(sched, request(0.0))
    await settle()
    others = [start(sched, request(1.0, rows=2)), start(sched, request(2.0, rows=1))]
    await settle()
    assert sched.queued == 2
    instance.release(0)
    await settle()
    assert len(instance.calls) == 2
    # several executions share one call, each request its own execution, in arrival order
    assert [e.batch_size for e in instance.calls[1]] == [2, 1]
    assert [e.inputs["INPUT0"].shape for e in instance.calls[1]] == [(2, WIDTH), (1, WIDTH)]
    assert instance.values(1) == [1.0, 1.0, 2.0]
    instance.release(1)
    await first
    r1, r2 = await asyncio.gather(*others)
    np.testing.assert_array_equal(output(r1, "OUTPUT0"), np.full((2, WIDTH), 2.0, dtype=np.float32))
    np.testing.assert_array_equal(output(r2, "OUTPUT0"), np.full((1, WIDTH), 3.0, dtype=np.float32))
    assert sched.stats.execution_count == 3
    assert sorted(sched.stats.batches) == [1, 2]
    assert sched.stats.batches[1]["compute_infer"].count == 2


# -- capacity ---------------------------------------------------------------------------------
async def test_capacity_limits_concurrent_dispatches() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance, capacity=2)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    await settle()
    c = start(sched, request(3.0))
    await settle()
    assert len(instance.calls) == 2
    assert sched.inflight == 2
    assert sched.queued == 1
    assert instance.values(0) == [1.0]
    assert instance.values(1) == [2.0]

    instance.release(1)
    await settle()
    assert b.done()
    assert not a.done()
    assert len(instance.calls) == 3  # a slot freed: the queued request goes
    assert instance.values(2) == [3.0]
    assert sched.inflight == 2

    instance.release_all()
    await asyncio.gather(a, b, c)
    assert instance.max_active == 2
    assert sched.inflight == 0


async def test_capacity_one_dispatches_one_call_at_a_time() -> None:
    instance = FakeInstance()
    sched = scheduler(model_config(dynamic_batching=None, max_batch_size=0), instance, capacity=1)
    await asyncio.gather(*(start(sched, request(float(i), rows=None)) for i in range(5)))
    assert instance.max_active == 1


# -- failures -------------------------------------------------------------------------------------
async def test_dispatch_error_fails_every_request_of_the_call() -> None:
    instance = FakeInstance(blocked=True)
    instance.raises[1] = RuntimeError("boom")
    sched = scheduler(model_config(), instance)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    c = start(sched, request(3.0, rows=2))
    await settle()
    instance.release(0)
    await settle()
    assert instance.values(1) == [2.0, 3.0, 3.0]  # b and c in one call
    instance.release(1)
    await a
    for task in (b, c):
        with pytest.raises(ServeError) as info:
            await task
        assert isinstance(info.value, InternalError)
        assert str(info.value) == "RuntimeError: boom"
    assert sched.inflight == 0

    # the scheduler keeps serving
    instance.blocked = False
    response = await start(sched, request(4.0))
    np.testing.assert_array_equal(output(response, "OUTPUT0"), np.full((1, WIDTH), 5.0, dtype=np.float32))

    stats = sched.stats
    assert stats.inference["fail"].count == 2
    assert stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 2}
    assert stats.inference["success"].count == 2
    assert stats.inference_count == 2
    assert stats.execution_count == 2  # the failed call is no execution
    assert stats.pending == 0


async def test_dispatch_serve_error_reaches_the_caller_unchanged() -> None:
    instance = FakeInstance()
    gone = Unavailable("instance gone")
    instance.raises[0] = gone
    sched = scheduler(model_config(), instance)
    with pytest.raises(Unavailable) as info:
        await start(sched, request(1.0))
    assert info.value is gone
    assert sched.stats.failure_count == 1


async def test_wrong_number_of_results_fails_the_call() -> None:
    async def short(executions: list[Execution]) -> list[ExecutionResult]:
        return []

    config = model_config()
    sched = ModelScheduler(config, ModelSignature.from_config(config, "1"), short, capacity=1)
    with pytest.raises(InternalError, match="0 results for 1 executions"):
        await send(sched, request(1.0), 1, time.monotonic_ns())
    assert sched.stats.failure_count == 1
    assert sched.inflight == 0


async def test_execution_error_fails_only_that_executions_requests() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=None), instance, capacity=1)
    first = start(sched, request(0.0))
    await settle()
    bad = start(sched, request(-1.0))
    good = start(sched, request(5.0))
    await settle()
    instance.release(0)
    await settle()
    assert len(instance.calls[1]) == 2  # one call, two executions
    instance.release(1)
    await first
    with pytest.raises(InternalError, match="negative input"):
        await bad
    response = await good
    np.testing.assert_array_equal(output(response, "OUTPUT0"), np.full((1, WIDTH), 6.0, dtype=np.float32))
    stats = sched.stats
    assert stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert stats.inference["fail"].count == 1
    assert stats.inference["success"].count == 2
    assert stats.execution_count == 2  # the failed execution is not counted
    assert stats.responses["0"]["fail"].count == 1


# -- response order ----------------------------------------------------------------------------------
async def _completion_order(preserve_ordering: bool) -> list[str]:
    db = "preferred_batch_size: [8]" + (" preserve_ordering: true" if preserve_ordering else "")
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance, capacity=2)
    order: list[str] = []
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    await settle()
    a.add_done_callback(lambda _: order.append("a"))
    b.add_done_callback(lambda _: order.append("b"))
    assert len(instance.calls) == 2
    instance.release(1)  # the later batch completes first
    await settle()
    assert b.done() is not preserve_ordering
    instance.release(0)
    ra, rb = await asyncio.gather(a, b)
    np.testing.assert_array_equal(output(ra, "OUTPUT0"), np.full((1, WIDTH), 2.0, dtype=np.float32))
    np.testing.assert_array_equal(output(rb, "OUTPUT0"), np.full((1, WIDTH), 3.0, dtype=np.float32))
    return order


async def test_preserve_ordering_delivers_in_submission_order() -> None:
    assert await _completion_order(preserve_ordering=True) == ["a", "b"]


async def test_without_preserve_ordering_responses_go_when_ready() -> None:
    assert await _completion_order(preserve_ordering=False) == ["b", "a"]


async def test_preserve_ordering_holds_back_behind_a_failure() -> None:
    instance = FakeInstance(blocked=True)
    instance.raises[0] = RuntimeError("boom")
    db = "preferred_batch_size: [8] preserve_ordering: true"
    sched = scheduler(model_config(dynamic_batching=db), instance, capacity=2)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    await settle()
    instance.release(1)
    await settle()
    assert not b.done()
    instance.release(0)
    with pytest.raises(InternalError):
        await a
    assert (await b).outputs


# -- queue policies ----------------------------------------------------------------------------------
async def test_max_queue_size_rejects_and_counts() -> None:
    db = "preferred_batch_size: [8] default_queue_policy { max_queue_size: 1 }"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    await settle()
    assert sched.queued == 1
    with pytest.raises(Unavailable) as info:
        await start(sched, request(3.0))
    assert str(info.value) == "Exceeds maximum queue size"
    stats = sched.stats
    assert stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert stats.inference["fail"].count == 1
    assert stats.pending == 1
    instance.release_all()
    await settle()
    instance.release_all()
    await asyncio.gather(a, b)
    assert stats.inference["success"].count == 2
    assert stats.inference["fail"].count == 1


async def test_queue_timeout_rejects_the_waiting_request() -> None:
    db = "preferred_batch_size: [8] default_queue_policy { default_timeout_microseconds: 50000 timeout_action: REJECT }"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(b, timeout=2.0)
    assert str(info.value) == "Request timeout expired"
    assert not a.done()
    stats = sched.stats
    assert stats.failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert stats.inference["fail"].count == 1
    assert stats.pending == 0
    assert sched.queued == 0
    instance.release(0)
    await a
    await settle()
    assert len(instance.calls) == 1  # the rejected request never ran


async def test_request_timeout_parameter_shortens_the_default() -> None:
    db = (
        "preferred_batch_size: [8] "
        "default_queue_policy { default_timeout_microseconds: 100000000 allow_timeout_override: true }"
    )
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance)
    a = start(sched, request(1.0))
    await settle()
    patient = start(sched, request(2.0))
    hasty = start(sched, request(3.0, parameters={"timeout": 50_000}))
    with pytest.raises(Unavailable, match="Request timeout expired"):
        await asyncio.wait_for(hasty, timeout=2.0)
    assert not patient.done()
    assert sched.queued == 1
    instance.release_all()
    await settle()
    instance.release_all()
    await asyncio.gather(a, patient)
    assert instance.values(1) == [2.0]


async def test_queue_timeout_under_delay_still_runs_the_request() -> None:
    db = "preferred_batch_size: [8] default_queue_policy { default_timeout_microseconds: 20000 timeout_action: DELAY }"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance)
    a = start(sched, request(1.0))
    await settle()
    b = start(sched, request(2.0))
    await asyncio.sleep(0.05)
    assert not b.done()
    assert sched.queued == 1
    instance.release_all()
    await settle()
    instance.release_all()
    rb = await asyncio.wait_for(b, timeout=1.0)
    await a
    np.testing.assert_array_equal(output(rb, "OUTPUT0"), np.full((1, WIDTH), 3.0, dtype=np.float32))
    assert sched.stats.failure_count == 0


# -- priorities ----------------------------------------------------------------------------------------
async def test_higher_priority_request_is_dispatched_first() -> None:
    db = "priority_levels: 2 default_priority_level: 2"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(max_batch_size=0, dynamic_batching=db), instance)
    tasks = [start(sched, request(0.0, rows=None, parameters={"priority": 2}))]
    await settle()
    tasks.append(start(sched, request(1.0, rows=None, parameters={"priority": 2})))
    tasks.append(start(sched, request(2.0, rows=None)))  # the default level, 2
    tasks.append(start(sched, request(3.0, rows=None, parameters={"priority": 7})))  # no such level: 2
    tasks.append(start(sched, request(4.0, rows=None, parameters={"priority": 1})))
    await settle()
    assert sched.queued == 4
    for index in range(5):
        instance.release(index)
        await settle()
    await asyncio.gather(*tasks)
    assert [instance.values(i) for i in range(5)] == [[0.0], [4.0], [1.0], [2.0], [3.0]]
    assert all(e.batch_size == 0 for c in instance.calls for e in c)  # the model does not batch
    assert sched.stats.execution_count == 5
    assert sched.stats.inference_count == 5
    assert sorted(sched.stats.batches) == [1]


async def test_higher_priority_requests_lead_a_merged_batch() -> None:
    db = "preferred_batch_size: [8] priority_levels: 2 default_priority_level: 2"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(dynamic_batching=db), instance)
    first = start(sched, request(0.0))
    await settle()
    rest = [
        start(sched, request(1.0, parameters={"priority": 2})),
        start(sched, request(2.0)),
        start(sched, request(3.0, parameters={"priority": 1})),
    ]
    await settle()
    instance.release(0)
    await settle()
    assert instance.values(1) == [3.0, 1.0, 2.0]
    instance.release(1)
    await first
    responses = await asyncio.gather(*rest)
    got = [float(output(r, "OUTPUT0")[0, 0]) for r in responses]
    assert got == [2.0, 3.0, 4.0]  # each caller still gets its own rows


# -- statistics ------------------------------------------------------------------------------------------
async def test_statistics_after_single_requests() -> None:
    clock = FakeClock()
    timings = ExecutionResult(wait_ns=500, compute_input_ns=10, compute_infer_ns=100, compute_output_ns=20)
    instance = FakeInstance(blocked=True, timings=timings)
    sched = scheduler(model_config(), instance, clock=clock)
    n = 3
    for i in range(n):
        clock.now = 2_000  # queued and dispatched at 2 us
        task = start(sched, request(float(i)), arrival_ns=1_000)
        await settle()
        clock.now = 9_000  # completed at 9 us
        instance.release(i)
        await task
    stats = sched.stats
    assert stats.inference_count == n
    assert stats.execution_count == n
    assert durations(stats) == {
        "success": (n, n * 8_000),
        "fail": (0, 0),
        "queue": (n, n * (1_000 + 500)),  # waited in the scheduler, then in the instance
        "compute_input": (n, n * 10),
        "compute_infer": (n, n * 100),
        "compute_output": (n, n * 20),
        "cache_hit": (0, 0),
        "cache_miss": (0, 0),
    }
    assert list(stats.batches) == [1]
    assert {k: (v.count, v.ns) for k, v in stats.batches[1].items()} == {
        "compute_input": (n, n * 10),
        "compute_infer": (n, n * 100),
        "compute_output": (n, n * 20),
    }
    assert stats.responses["0"]["success"].count == n
    assert stats.failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert stats.pending == 0
    assert stats.last_inference_ms > 0
    assert (stats.name, stats.version) == ("m", "1")


async def test_statistics_count_batch_sizes() -> None:
    instance = FakeInstance()
    sched = scheduler(model_config(), instance)
    await start(sched, request(1.0, rows=3))
    await start(sched, request(1.0, rows=2))
    await start(sched, request(1.0, rows=3))
    stats = sched.stats
    assert stats.inference_count == 8
    assert stats.execution_count == 3
    assert stats.inference["success"].count == 3
    assert {size: t["compute_infer"].count for size, t in stats.batches.items()} == {3: 2, 2: 1}


# -- invalid scheduling parameters --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "parameters",
    [
        {"priority": -1},
        {"priority": "high"},
        {"priority": True},
        {"priority": 1.5},
        {"priority": 2**64},
        {"timeout": -5},
        {"timeout": "soon"},
        {"timeout": False},
    ],
)
async def test_invalid_scheduling_parameter_is_rejected_and_counts_nowhere(parameters: dict[str, ParamValue]) -> None:
    instance = FakeInstance()
    config = model_config(dynamic_batching="preferred_batch_size: [8] priority_levels: 2 default_priority_level: 1")
    sched = scheduler(config, instance)
    with pytest.raises(InvalidArgument):
        await send(sched, request(1.0, parameters=parameters), 1, time.monotonic_ns())
    assert sched.stats == ModelStats("m", "1")
    assert sched.queued == 0
    assert instance.calls == []
    await start(sched, request(1.0))  # still serving
    assert sched.stats.failure_count == 0


def test_scheduling_parameters_default_to_zero() -> None:
    req = request(1.0)
    assert request_priority(req) == 0
    assert request_timeout_us(req) == 0


@pytest.mark.parametrize("value", [0, 1, 5, 2**64 - 1])
def test_scheduling_parameters_accept_unsigned_integers(value: int) -> None:
    req = request(1.0, parameters={"priority": value, "timeout": value})
    assert request_priority(req) == value
    assert request_timeout_us(req) == value


@pytest.mark.parametrize(
    ("value", "shown"), [(-1, "-1"), ("1", "'1'"), (True, "True"), (2.0, "2.0"), (2**64, str(2**64))]
)
def test_invalid_priority_message(value: ParamValue, shown: str) -> None:
    req = request(1.0, parameters={"priority": value})
    with pytest.raises(InvalidArgument) as info:
        request_priority(req)
    assert str(info.value) == (
        f"parameter 'priority' of the request for model 'm' must be an unsigned integer, got {shown}"
    )


def test_invalid_timeout_message() -> None:
    req = request(1.0, parameters={"timeout": -3})
    with pytest.raises(InvalidArgument) as info:
        request_timeout_us(req)
    assert str(info.value) == "parameter 'timeout' of the request for model 'm' must be an unsigned integer, got -3"


# -- clients that go away -------------------------------------------------------------------------------------
async def test_cancelled_caller_does_not_disturb_the_others() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance)
    a = start(sched, request(1.0))
    await settle()
    gone = start(sched, request(2.0))
    stay = start(sched, request(3.0))
    await settle()
    gone.cancel()
    await settle()
    instance.release_all()
    await settle()
    instance.release_all()
    await a
    response = await stay
    np.testing.assert_array_equal(output(response, "OUTPUT0"), np.full((1, WIDTH), 4.0, dtype=np.float32))
    assert gone.cancelled()
    assert sched.inflight == 0
    assert [instance.values(i) for i in range(len(instance.calls))] == [[1.0], [3.0]]  # the cancelled one never ran


async def test_cancelled_queued_request_is_dropped_and_counted_canceled() -> None:
    clock = FakeClock(1_000)
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance, clock=clock)
    running = start(sched, request(1.0), arrival_ns=1_000)
    await settle()
    gone = start(sched, request(2.0), arrival_ns=1_000)
    await settle()
    assert (sched.queued, sched.stats.pending) == (1, 1)
    clock.now = 4_000
    gone.cancel()
    await settle()
    stats = sched.stats
    assert (sched.queued, stats.pending) == (0, 0)  # left the queue at once, not when an instance frees
    assert stats.failures == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert durations(stats)["fail"] == (1, 3_000)  # from its arrival to its cancellation
    instance.release_all()
    await running
    await settle()
    assert len(instance.calls) == 1
    assert (stats.execution_count, stats.inference_count) == (1, 1)


async def test_cancelled_request_already_executing_runs_to_its_end() -> None:
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(), instance)
    gone = start(sched, request(1.0))
    await settle()
    assert len(instance.calls) == 1
    gone.cancel()
    await settle()
    instance.release_all()
    await settle()
    assert sched.inflight == 0
    assert sched.stats.failures["CANCELED"] == 0
    assert sched.stats.execution_count == 1  # it ran; its response went nowhere


async def test_a_cancelled_executing_request_fires_its_parts_signal_for_a_per_request_backend() -> None:
    """The Python backend answers request by request: its model sees the caller gone (``is_cancelled()``)."""
    instance = FakeInstance(blocked=True)
    signature = ModelSignature.from_config(model_config(), "1")
    sched = ModelScheduler(model_config(), signature, instance, capacity=1, per_request=True)
    gone = start(sched, request(1.0))
    await settle()
    (part,) = instance.calls[0][0].parts
    assert part.cancel is not None and not part.cancel.fired
    gone.cancel()
    await settle()
    assert part.cancel.fired
    instance.release_all()
    await settle()
    assert sched.inflight == 0


async def test_cancelled_request_under_preserve_ordering_does_not_hold_back_the_next() -> None:
    db = "preferred_batch_size: [8] preserve_ordering: true"
    instance = FakeInstance(blocked=True)
    sched = scheduler(model_config(max_batch_size=1, dynamic_batching=db), instance, capacity=1)
    first = start(sched, request(1.0))
    await settle()
    gone = start(sched, request(2.0))
    after = start(sched, request(3.0))
    await settle()
    gone.cancel()
    await settle()
    instance.release_all()
    await first
    await settle()
    instance.release_all()
    response = await asyncio.wait_for(after, timeout=5.0)
    np.testing.assert_array_equal(output(response, "OUTPUT0"), np.full((1, WIDTH), 4.0, dtype=np.float32))
    assert sched.stats.failures["CANCELED"] == 1
    assert sched.drained()


async def test_cancelled_rows_never_join_a_batch() -> None:
    """A request of 4 rows waits for a preferred batch of 8 and is cancelled: the next two make the batch."""
    db = "preferred_batch_size: [8] max_queue_delay_microseconds: 60000000"
    instance = FakeInstance()
    sched = scheduler(model_config(dynamic_batching=db), instance, clock=FakeClock())
    gone = start(sched, request(1.0, rows=4), arrival_ns=0)
    await settle()
    assert instance.calls == []  # waiting for 8 rows
    gone.cancel()
    await settle()
    a = start(sched, request(2.0, rows=4), arrival_ns=0)
    b = start(sched, request(3.0, rows=4), arrival_ns=0)
    await asyncio.gather(a, b)
    assert instance.values(0) == [2.0] * 4 + [3.0] * 4
