"""DecoupledScheduler driven by a fake instance stream: each request's responses in order, the last one final.

The fake ``stream`` is what the instance channel gives the scheduler: an async generator of
``(part index, PartResult)``.  The scheduler must end every request with exactly one final item, even
when the model errs, stops without its final flag or stalls, count the request once in the
statistics, and close the instance's stream when the client stops reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

import numpy as np
import pytest

from serve_app.config import parse_config
from serve_app.errors import InternalError, InvalidArgument, Unavailable, Unsupported
from serve_app.inference.execution import Execution, PartResult
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferTensor, RequestedOutput, StreamItem
from serve_app.metrics_options import MetricsOptions
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.decoupled_scheduler import DECOUPLED_UNARY, DecoupledScheduler
from serve_app.stats.latency import Latencies
from tests.support.clock import FakeClock

SIG = ModelSignature.from_config(
    parse_config(
        """
        name: "repeat"
        backend: "python"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [
          { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
          { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
        ]
        model_transaction_policy { decoupled: true }
        """,
        model="repeat",
        path="config.pbtxt",
    ),
    "1",
)


def answer(value: int, *, final: bool = False, **parameters: bool | int | str) -> PartResult:
    outputs = {"OUT": np.array([value], dtype=np.int32), "IDX": np.array([value], dtype=np.uint32)}
    return PartResult(outputs=outputs, parameters=dict(parameters), final=final, compute_ns=1000)


class FakeStream:
    """The instance's side: yields the scripted parts (a float pauses that long), records what it ran."""

    def __init__(self, script: Sequence[PartResult | float | Exception]) -> None:
        self.script = list(script)
        self.executions: list[Execution] = []
        self.closed = False

    async def __call__(self, execution: Execution) -> AsyncGenerator[tuple[int, PartResult], None]:
        self.executions.append(execution)
        try:
            for step in self.script:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, Exception):
                    raise step
                else:
                    yield 0, step
        finally:
            self.closed = True


def request(outputs: Sequence[str] = (), **parameters: bool | int | str) -> InferRequest:
    return InferRequest(
        model_name="repeat",
        id="req-1",
        inputs=[InferTensor("IN", "INT32", (3,), np.array([4, 5, 6], dtype=np.int32))],
        outputs=[RequestedOutput(n) for n in outputs],
        parameters=dict(parameters),
    )


def scheduler(stream: FakeStream, timeout_s: float = 5.0) -> DecoupledScheduler:
    return DecoupledScheduler(SIG, stream, response_timeout_s=timeout_s, clock=FakeClock(1_000))


async def collect(s: DecoupledScheduler, req: InferRequest | None = None) -> list[StreamItem]:
    req = req or request()
    options = RequestOptions.parse(req, SIG, batch_size=0)
    return [item async for item in s.submit_stream(req, options, arrival_ns=0)]


async def test_responses_stream_in_order_and_the_last_is_final() -> None:
    stream = FakeStream([answer(1), answer(2, tag="x"), answer(3, final=True)])
    s = scheduler(stream)
    items = await collect(s)
    assert [i.final for i in items] == [False, False, True]
    assert all(i.error is None and i.response is not None for i in items)
    responses = [i.response for i in items if i.response is not None]
    assert [(r.model_name, r.model_version, r.id) for r in responses] == [("repeat", "1", "req-1")] * 3
    assert [r.outputs[0].data.tolist() for r in responses] == [[1], [2], [3]]
    assert [[o.name for o in r.outputs] for r in responses] == [["OUT", "IDX"]] * 3
    assert responses[1].parameters == {"tag": "x"}
    assert stream.closed
    assert s.drained()


async def test_the_request_reaches_the_instance_as_one_part() -> None:
    stream = FakeStream([answer(1, final=True)])
    s = scheduler(stream)
    await collect(s, request(outputs=["IDX"], user="ann"))
    (execution,) = stream.executions
    (part,) = execution.parts
    assert part.id == "req-1"
    assert part.outputs == ("IDX",)
    assert part.parameters == {"user": "ann"}
    assert part.inputs is not None and part.inputs["IN"].tolist() == [4, 5, 6]
    assert execution.outputs == ("IDX",)


async def test_only_requested_outputs_are_returned() -> None:
    s = scheduler(FakeStream([answer(7, final=True)]))
    (item,) = await collect(s, request(outputs=["IDX"]))
    assert item.response is not None
    assert [(o.name, o.datatype) for o in item.response.outputs] == [("IDX", "UINT32")]


async def test_flag_only_final() -> None:
    s = scheduler(FakeStream([answer(1), PartResult(final=True, empty=True)]))
    items = await collect(s)
    assert items[-1] == StreamItem(response=None, error=None, final=True)
    assert items[0].response is not None and not items[0].final
    assert s.stats.inference_count == 1
    assert s.stats.failure_count == 0


async def test_error_parts() -> None:
    """An error the model sends is one response of the stream; only a final one ends the request."""
    warn, fatal = InvalidArgument("bad token"), InternalError("model broke")
    s = scheduler(FakeStream([answer(1), PartResult(error=warn, final=False), PartResult(error=fatal, final=True)]))
    items = await collect(s)
    assert [(i.error, i.final) for i in items[1:]] == [(warn, False), (fatal, True)]
    assert s.stats.failures["BACKEND"] == 1
    assert s.stats.failure_count == 1
    assert s.stats.inference_count == 0


async def test_stream_that_ends_without_final() -> None:
    s = scheduler(FakeStream([answer(1)]))
    items = await collect(s)
    assert len(items) == 2
    last = items[-1]
    assert last.final and isinstance(last.error, Unavailable)
    assert last.error.message == "model 'repeat' ended a request without its final response"
    assert s.stats.failures["OTHER"] == 1
    assert s.drained()


async def test_stream_that_stalls_is_ended_with_an_error() -> None:
    stream = FakeStream([answer(1), 5.0, answer(2, final=True)])
    s = scheduler(stream, timeout_s=0.05)
    items = await asyncio.wait_for(collect(s), 2.0)
    assert [i.final for i in items] == [False, True]
    error = items[-1].error
    assert isinstance(error, Unavailable)
    assert "sent no response for 0.05s" in error.message
    assert stream.closed
    assert s.stats.failure_count == 1
    assert s.drained()


async def test_an_error_raised_by_the_stream_ends_the_request() -> None:
    s = scheduler(FakeStream([answer(1), InternalError("instance lost")]))
    items = await collect(s)
    assert items[-1].final
    assert isinstance(items[-1].error, InternalError)
    assert items[-1].error.message == "instance lost"
    assert s.stats.failures["OTHER"] == 1


async def test_statistics_count_a_request_once() -> None:
    s = scheduler(FakeStream([answer(1), answer(2), answer(3, final=True)]))
    await collect(s)
    await collect(s)
    assert s.stats.inference_count == 2
    assert s.stats.execution_count == 2
    assert s.stats.inference["success"].count == 2
    assert s.stats.failure_count == 0
    assert s.stats.pending == 0


async def test_unary_submit_is_refused() -> None:
    s = scheduler(FakeStream([]))
    with pytest.raises(Unsupported) as err:
        await s.submit(request(), RequestOptions(), 0)
    assert (
        err.value.message
        == DECOUPLED_UNARY
        == ("ModelInfer RPC doesn't support models with decoupled transaction policy")
    )


async def test_a_client_that_stops_reading_closes_the_instance_stream() -> None:
    stream = FakeStream([answer(1), answer(2), answer(3, final=True)])
    s = scheduler(stream)
    items = s.submit_stream(request(), RequestOptions(), 0)
    first = await anext(items)
    assert first.response is not None
    assert s.inflight == 1
    await items.aclose()
    assert stream.closed
    assert s.drained()
    assert s.stats.pending == 0
    assert s.stats.inference_count == 0
    assert s.stats.failures["CANCELED"] == 1  # it left before the final response
    assert s.stats.inference["fail"].count == 1


async def test_the_first_response_histogram_counts_each_request_once_at_its_first_response() -> None:
    s = scheduler(FakeStream([answer(1), answer(2), answer(3, final=True)]))
    s.stats.latencies = Latencies.for_model(MetricsOptions(histogram_latencies=True), mc.ModelConfig())
    await collect(s)
    await collect(s)
    assert s.stats.latencies is not None and s.stats.latencies.first_response is not None
    assert s.stats.latencies.first_response.count == 2  # not once per response, nor again at the final one
