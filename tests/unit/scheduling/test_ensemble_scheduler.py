"""EnsembleScheduler over fake composing models: sequence parameters reach every step, a step's response may
replace them for the steps it feeds, and the ensemble's response carries the sequence parameters of its
outputs as Triton's ensemble responses do."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from google.protobuf import text_format

from serve_app.inference.options import RequestOptions
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, ParamValue
from serve_app.protos import model_config_pb2 as mc
from serve_app.scheduling.ensemble_scheduler import EnsembleScheduler, one_response
from tests.support.clock import FakeClock

CONFIG = """
name: "ens"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "second" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
] }
"""


class Models:
    """The composing models: Y = X + 1; ``parameters[model]`` are put on that model's responses."""

    def __init__(self) -> None:
        self.requests: list[InferRequest] = []
        self.parameters: dict[str, dict[str, ParamValue]] = {}

    async def __call__(self, request: InferRequest) -> InferResponse:
        self.requests.append(request)
        x = request.inputs[0]
        y = InferTensor("Y", "INT32", x.shape, x.data + 1)
        return InferResponse(
            request.model_name, "1", request.id, [y], dict(self.parameters.get(request.model_name, {}))
        )

    def seen(self, model: str) -> dict[str, ParamValue]:
        (request,) = [r for r in self.requests if r.model_name == model]
        return {k: v for k, v in request.parameters.items() if k.startswith("sequence_")}


def ensemble(models: Models) -> EnsembleScheduler:
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    return EnsembleScheduler(
        config, ModelSignature.from_config(config, "1"), one_response(models), clock=FakeClock(1_000)
    )


async def run(scheduler: EnsembleScheduler, parameters: dict[str, ParamValue]) -> InferResponse:
    data = np.array([[1]], dtype=np.int32)
    request = InferRequest("ens", inputs=[InferTensor("IN", "INT32", (1, 1), data)], parameters=parameters)
    options = RequestOptions.parse(request, scheduler.signature, batch_size=1)
    return await scheduler.submit(request, options, 0)


@pytest.mark.parametrize("corr", [7, "session-a"])
async def test_sequence_parameters_reach_every_step_and_come_back(corr: int | str) -> None:
    models = Models()
    params: dict[str, ParamValue] = {"sequence_id": corr, "sequence_start": True, "priority": 1}
    response = await run(ensemble(models), params)
    assert response.outputs[0].data.ravel().tolist() == [3]
    expected = {"sequence_id": corr, "sequence_start": True}
    assert models.seen("first") == expected and models.seen("second") == expected
    assert all(r.parameters["priority"] == 1 for r in models.requests)
    assert response.parameters == {"sequence_id": corr, "sequence_start": True, "sequence_end": False}


async def test_a_request_without_a_sequence_gets_id_zero_and_no_flags() -> None:
    response = await run(ensemble(Models()), {})
    assert response.parameters == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}


async def test_an_id_above_int64_comes_back_as_triton_sends_it() -> None:
    response = await run(ensemble(Models()), {"sequence_id": 2**64 - 5, "sequence_end": True})
    assert response.parameters == {"sequence_id": -5, "sequence_start": False, "sequence_end": True}


async def test_a_step_response_replaces_the_sequence_parameters_downstream() -> None:
    """Triton: a composing response's sequence_* parameters go with its outputs; flags it leaves out are false."""
    models = Models()
    models.parameters["first"] = {"sequence_id": 42, "sequence_end": True}
    response = await run(ensemble(models), {"sequence_id": 7, "sequence_start": True})
    assert models.seen("first") == {"sequence_id": 7, "sequence_start": True}
    assert models.seen("second") == {"sequence_id": 42, "sequence_start": False, "sequence_end": True}
    assert response.parameters == {"sequence_id": 42, "sequence_start": False, "sequence_end": True}


async def test_a_cancelled_ensemble_request_cancels_its_steps_and_counts_canceled() -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    async def stalled(request: InferRequest) -> InferResponse:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(request.model_name)
            raise
        raise AssertionError("never released")

    config = text_format.Parse(CONFIG, mc.ModelConfig())
    scheduler = EnsembleScheduler(
        config, ModelSignature.from_config(config, "1"), one_response(stalled), clock=FakeClock(1_000)
    )
    task = asyncio.ensure_future(run(scheduler, {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == ["first"]  # the running step was cancelled too (its model drops it if still queued)
    assert scheduler.stats.failures["CANCELED"] == 1
    assert scheduler.stats.pending == 0
