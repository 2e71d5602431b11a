"""A decoupled model with a dynamic batcher, driven by a fake instance stream and a clock that stands still.

The batcher waits for its preferred batch size (its queue delay never passes on the fake clock), so which
requests share an ``execute`` is decided by the test alone.  Each request must get its own responses, in
order, the last one final; a client that leaves cancels its own request only; and the instance takes its
next batch once ``execute`` has returned, while the streams of the batch before it go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np

from serve_app.config import parse_config
from serve_app.errors import Cancelled, Unavailable
from serve_app.inference.execution import EXECUTED, Execution, PartResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferTensor, StreamItem
from serve_app.scheduling.decoupled_batcher import BatchedDecoupledScheduler, batches_decoupled
from tests.support.clock import FakeClock

CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 60000000 }
"""


CFG = parse_config(CONFIG, model="counter", path="config.pbtxt")
SIG = ModelSignature.from_config(CFG, "1")


class BatchModel:
    """The instance's side: one response per request of the batch (its IN + 100), then ``execute`` returns,
    then, once released, each request's final response (a CANCELLED error for a cancelled one)."""

    def __init__(self) -> None:
        self.executions: list[Execution] = []
        self.release = asyncio.Event()

    async def __call__(self, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        self.executions.append(execution)
        values = [int(p.inputs["IN"][0, 0]) if p.inputs is not None else -1 for p in execution.parts]
        for i, value in enumerate(values):
            yield i, PartResult(outputs={"OUT": np.array([[value + 100]], np.int32)}, final=False)
        yield EXECUTED, PartResult(final=False, empty=True)
        await self.release.wait()
        for i, (part, value) in enumerate(zip(execution.parts, values, strict=True)):
            if part.cancel is not None and part.cancel.fired:
                yield i, PartResult(error=Cancelled("request has been cancelled"), final=True)
            else:
                yield i, PartResult(outputs={"OUT": np.array([[value + 200]], np.int32)}, final=True)


def request(value: int) -> InferRequest:
    return InferRequest(
        model_name="counter", id=f"r{value}", inputs=[InferTensor("IN", "INT32", (1, 1), np.array([[value]], np.int32))]
    )


def scheduler(model: BatchModel) -> BatchedDecoupledScheduler:
    return BatchedDecoupledScheduler(CFG, SIG, model, capacity=1, response_timeout_s=60, clock=FakeClock(1_000))


def stream(s: BatchedDecoupledScheduler, value: int) -> AsyncGenerator[StreamItem, None]:
    req = request(value)
    return s.submit_stream(req, RequestOptions.parse(req, SIG, batch_size=1), arrival_ns=0)


async def collect(items: AsyncGenerator[StreamItem, None]) -> list[tuple[int | str, bool]]:
    out: list[tuple[int | str, bool]] = []
    async for item in items:
        if item.error is not None:
            out.append((item.error.message, item.final))
        else:
            assert item.response is not None
            out.append((int(item.response.outputs[0].data.flat[0]), item.final))
    return out


def test_the_rule_decoupled_models_with_a_dynamic_batcher_are_batched() -> None:
    assert batches_decoupled(CFG)
    without_batcher = CONFIG.replace(
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 60000000 }", ""
    )
    assert not batches_decoupled(parse_config(without_batcher, model="counter", path="config.pbtxt"))
    not_decoupled = CONFIG.replace("model_transaction_policy { decoupled: true }", "")
    assert not batches_decoupled(parse_config(not_decoupled, model="counter", path="config.pbtxt"))


async def test_requests_share_one_execute_and_each_gets_its_own_stream() -> None:
    model = BatchModel()
    s = scheduler(model)
    model.release.set()
    results = await asyncio.wait_for(asyncio.gather(*(collect(stream(s, v)) for v in (1, 2, 3))), 30)
    assert results == [[(101, False), (201, True)], [(102, False), (202, True)], [(103, False), (203, True)]]
    (execution,) = model.executions
    assert [p.id for p in execution.parts] == ["r1", "r2", "r3"] and execution.batch_size == 3
    assert s.stats.execution_count == 1 and s.stats.inference_count == 3
    assert s.drained()


async def test_a_client_that_leaves_cancels_only_its_own_request() -> None:
    model = BatchModel()
    s = scheduler(model)
    first, third = (asyncio.ensure_future(collect(stream(s, v))) for v in (1, 3))
    second = stream(s, 2)
    item = await asyncio.wait_for(anext(second), 30)  # the batch runs: each request had its first response
    assert item.response is not None and int(item.response.outputs[0].data.flat[0]) == 102
    await second.aclose()  # its client goes away
    (execution,) = model.executions
    assert {p.id: p.cancel is not None and p.cancel.fired for p in execution.parts} == {
        "r1": False,
        "r2": True,
        "r3": False,
    }
    model.release.set()
    assert await asyncio.wait_for(first, 30) == [(101, False), (201, True)]
    assert await asyncio.wait_for(third, 30) == [(103, False), (203, True)]
    await asyncio.wait_for(_drained(s), 30)


async def test_the_instance_takes_the_next_batch_once_execute_returned() -> None:
    model = BatchModel()
    s = scheduler(model)  # one instance
    batch1 = [asyncio.ensure_future(collect(stream(s, v))) for v in (1, 2, 3)]
    batch2 = [asyncio.ensure_future(collect(stream(s, v))) for v in (4, 5, 6)]
    while len(model.executions) < 2:  # the first batch's streams are still open (not released)
        await asyncio.sleep(0)
    assert not any(t.done() for t in batch1)
    assert [p.id for p in model.executions[1].parts] == ["r4", "r5", "r6"]
    model.release.set()
    assert [await asyncio.wait_for(t, 30) for t in batch2] == [[(v + 100, False), (v + 200, True)] for v in (4, 5, 6)]
    assert [await asyncio.wait_for(t, 30) for t in batch1] == [[(v + 100, False), (v + 200, True)] for v in (1, 2, 3)]


async def _drained(s: BatchedDecoupledScheduler) -> None:
    while not s.drained():
        await asyncio.sleep(0)


async def test_a_batch_whose_stream_fails_ends_each_open_request_with_the_error() -> None:
    async def failing(execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        yield 0, PartResult(outputs={"OUT": np.array([[7]], np.int32)}, final=True)
        raise Unavailable("the instance went away")

    s = BatchedDecoupledScheduler(CFG, SIG, failing, capacity=1, response_timeout_s=60, clock=FakeClock(1_000))
    results = await asyncio.wait_for(asyncio.gather(*(collect(stream(s, v)) for v in (1, 2, 3))), 30)
    assert results == [[(7, True)], [("the instance went away", True)], [("the instance went away", True)]]
    assert s.stats.execution_count == 1
    await asyncio.wait_for(_drained(s), 30)
