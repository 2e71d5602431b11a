"""EnsembleScheduler with a decoupled step (fake models): the later step runs once per response of the
decoupled one, the ensemble answers once per response on its stream, the last answer or the flag alone is
final, an error ends the stream with Triton's prefix, and a client that leaves cancels the running steps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidArgument, ServeError
from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, StreamItem
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.ensemble_flow import EnsembleFlow
from serve_app.scheduling.ensemble_scheduler import EnsembleScheduler
from tests.support.clock import FakeClock

# "repeat" (decoupled) answers IN = n with n responses Y = n; "plus" answers Y = X + 1.
CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "repeat" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "plus" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
] }
"""


def tensor(value: int) -> InferTensor:
    return InferTensor("Y", "INT32", (1,), np.array([value], np.int32))


def response(request: InferRequest, value: int) -> InferResponse:
    return InferResponse(request.model_name, "1", request.id, [tensor(value)])


class Models:
    """``repeat`` sends its responses, then waits for ``release`` before its final flag when
    ``hold_final`` (so the test orders the last events); ``error_after``: an error after that many."""

    def __init__(self, *, hold_final: bool = False, final_with_last: bool = False, error_after: int = -1) -> None:
        self.hold_final = hold_final
        self.final_with_last = final_with_last
        self.error_after = error_after
        self.release = asyncio.Event()
        self.plus_runs = 0
        self.cancelled: list[str] = []

    async def __call__(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        x = int(request.inputs[0].data[0])
        if request.model_name == "plus":
            self.plus_runs += 1
            yield StreamItem(response(request, x + 1), final=True)
            return
        try:
            for i in range(x):
                if i == self.error_after:
                    yield StreamItem(error=InvalidArgument("repeat failed"), final=False)
                last = i == x - 1
                yield StreamItem(response(request, x), final=last and self.final_with_last)
            if self.final_with_last and x:
                return
            if self.hold_final:
                await self.release.wait()
            yield StreamItem(final=True)
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled.append(request.model_name)
            raise


def scheduler(models: Models) -> EnsembleScheduler:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    return EnsembleScheduler(config, ModelSignature.from_config(config, "1"), models, clock=FakeClock(1_000))


def request(n: int) -> InferRequest:
    return InferRequest("ens", id="r", inputs=[InferTensor("IN", "INT32", (1,), np.array([n], np.int32))])


async def stream(sched: EnsembleScheduler, n: int) -> list[StreamItem]:
    req = request(n)
    options = RequestOptions.parse(req, sched.signature, batch_size=0)
    return [item async for item in sched.submit_stream(req, options, 0)]


def value(item: StreamItem) -> int:
    assert item.response is not None
    return int(item.response.outputs[0].data[0])


async def test_each_response_of_the_decoupled_step_flows_on_and_answers_the_client() -> None:
    models = Models(hold_final=True)
    sched = scheduler(models)
    req = request(3)
    items: list[StreamItem] = []
    async for item in sched.submit_stream(req, RequestOptions.parse(req, sched.signature, batch_size=0), 0):
        items.append(item)
        if len(items) == 3:
            models.release.set()  # the decoupled step's final flag comes after the last answer
    assert models.plus_runs == 3
    assert [value(i) for i in items[:3]] == [4, 4, 4]
    assert [i.final for i in items] == [False, False, False, True]
    assert items[3].response is None and items[3].error is None  # the final flag alone, as Triton sends it
    assert all(i.response is not None and i.response.id == "r" and i.response.model_name == "ens" for i in items[:3])
    assert sched.stats.execution_count == 1 and not sched.stats.failures.get("OTHER")
    assert sched.stats.pending == 0


async def test_the_last_answer_is_final_when_the_later_step_ends_last() -> None:
    items = await stream(scheduler(Models(final_with_last=True)), 2)
    assert [value(i) for i in items] == [3, 3]
    assert [i.final for i in items] == [False, True]


async def test_no_response_of_the_decoupled_step_ends_the_stream_with_the_flag_alone() -> None:
    models = Models()
    items = await stream(scheduler(models), 0)
    assert len(items) == 1 and items[0].final and items[0].response is None and items[0].error is None
    assert models.plus_runs == 0


async def test_an_ensemble_without_an_answer_fails_where_one_response_is_expected() -> None:
    sched = scheduler(Models())
    req = request(0)
    with pytest.raises(ServeError) as info:
        await sched.submit(req, RequestOptions.parse(req, sched.signature, batch_size=0), 0)
    assert info.value.message == (
        "in ensemble 'ens', unexpected deadlock, at least one output is not set while no more ensemble steps can "
        "be made"
    )


async def test_an_error_of_the_decoupled_step_ends_the_stream_as_its_final_item() -> None:
    sched = scheduler(Models(error_after=1))
    items = await stream(sched, 3)
    assert [i.final for i in items][-1] is True and all(not i.final for i in items[:-1])
    last = items[-1]
    assert last.error is not None and last.error.message == "in ensemble 'ens', repeat failed"
    assert len(items) <= 2  # nothing after the error: at most the answer to the first response before it
    assert sched.stats.failures["OTHER"] == 1 and sched.stats.pending == 0


async def test_a_client_that_stops_reading_cancels_the_running_steps() -> None:
    models = Models(hold_final=True)
    sched = scheduler(models)
    req = request(1)
    items = sched.submit_stream(req, RequestOptions.parse(req, sched.signature, batch_size=0), 0)
    first = await anext(items)
    assert value(first) == 2 and not first.final
    await items.aclose()
    for _ in range(1000):  # the cancelled step's task runs its handler within a few loop turns
        if models.cancelled:
            break
        await asyncio.sleep(0)
    assert models.cancelled == ["repeat"]
    assert sched.stats.failures["CANCELED"] == 1 and sched.stats.pending == 0


async def test_values_are_dropped_once_read() -> None:
    models = Models(final_with_last=True)
    sched = scheduler(models)
    req = request(4)
    flow = EnsembleFlow(sched._steps, sched.needed_steps(["OUT"]), models, req, ["OUT"])
    seen = []
    async with contextlib.aclosing(flow.answers()) as answers:
        async for answer in answers:
            assert answer.outputs is not None
            seen.append(answer)
    assert len(seen) == 4 and seen[-1].final
    assert all(not values for values in flow._values.values())


class Gated:
    """``repeat`` counts the responses it has been asked for; each ``plus`` run waits for its gate."""

    def __init__(self) -> None:
        self.yielded = 0
        self.running = 0
        self.most = 0
        self.gates: list[asyncio.Event] = []

    async def __call__(self, request: InferRequest) -> AsyncGenerator[StreamItem, None]:
        x = int(request.inputs[0].data[0])
        if request.model_name == "repeat":
            for _ in range(x):
                self.yielded += 1
                yield StreamItem(response(request, x))
            yield StreamItem(final=True)
            return
        gate = asyncio.Event()
        self.gates.append(gate)
        self.running += 1
        self.most = max(self.most, self.running)
        await gate.wait()
        self.running -= 1
        yield StreamItem(response(request, x + 1), final=True)


async def settle() -> None:
    for _ in range(100):
        await asyncio.sleep(0)


@pytest.mark.parametrize("limit", [0, 1, 2])
async def test_max_inflight_requests_holds_the_decoupled_step_back(limit: int) -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.ensemble_scheduling.max_inflight_requests = limit
    models = Gated()
    sched = EnsembleScheduler(config, ModelSignature.from_config(config, "1"), models, clock=FakeClock(1_000))
    req = request(6)
    task = asyncio.ensure_future(stream_of(sched, req))
    await settle()
    if limit:
        assert models.running == limit
        assert models.yielded == limit + 1  # one more response read, waiting for a slot; the rest not read yet
    else:
        assert models.running == 6 and models.yielded == 6
    while not task.done():
        for gate in models.gates:
            gate.set()
        await settle()
    items = task.result()
    assert [value(i) for i in items if i.response is not None] == [7] * 6 and items[-1].final
    assert models.most == (limit or 6)
    assert sched.limiters is None or all(limiter.inflight == 0 for limiter in sched.limiters)


async def test_a_cancelled_ensemble_request_gives_its_slots_back() -> None:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    config.ensemble_scheduling.max_inflight_requests = 1
    models = Gated()
    sched = EnsembleScheduler(config, ModelSignature.from_config(config, "1"), models, clock=FakeClock(1_000))
    task = asyncio.ensure_future(stream_of(sched, request(3)))
    await settle()
    assert sched.limiters is not None and sched.limiters[1].inflight == 1 and sched.limiters[1].waiting == 1
    task.cancel()
    await settle()
    assert task.cancelled()
    assert all(limiter.inflight == 0 and limiter.waiting == 0 for limiter in sched.limiters)
    assert sched.stats.failures["CANCELED"] == 1


async def stream_of(sched: EnsembleScheduler, req: InferRequest) -> list[StreamItem]:
    options = RequestOptions.parse(req, sched.signature, batch_size=0)
    return [item async for item in sched.submit_stream(req, options, 0)]
