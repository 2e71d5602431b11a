"""An ensemble whose first step is a decoupled Python model, in process: it is decoupled itself, and each
response of its decoupled step goes through the ONNX step after it to the ensemble's stream. An ensemble
may also declare ``decoupled: true`` itself; as in Triton, what its steps are decides."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

from scripts import example_models, python_models
from serve_app.inference.types import InferRequest, InferTensor, StreamItem
from serve_app.local.service import LocalService
from serve_app.service import InferenceService
from tests.e2e import ensemble_models


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("decoupled_ensemble_repo")
    python_models.square(repo)
    ensemble_models.decoupled_ensemble(repo)
    ensemble_models.decoupled_ensemble(repo, name="ens_square_declared", declared=True)
    example_models.add_sub_ensemble(repo, name="ens_plain_declared", step_model="add_sub")
    example_models.add_sub(repo)
    config = repo / "ens_plain_declared" / "config.pbtxt"
    config.write_text(config.read_text() + "model_transaction_policy { decoupled: true }\n")
    host = LocalService.from_repository(repo)
    yield host.service
    host.close()


async def stream(service: InferenceService, n: int, name: str = "ens_square") -> list[StreamItem]:
    request = InferRequest(name, id="sq", inputs=[InferTensor("IN", "INT32", (1,), np.array([n], np.int32))])
    model = service.model(name)
    async with contextlib.aclosing(service.infer_stream(model, request)) as items:
        return [item async for item in items]


async def test_the_ensemble_is_decoupled_as_triton_marks_it(service: InferenceService) -> None:
    assert service.model("ens_square").is_decoupled
    assert service.model_config("ens_square").model_transaction_policy.decoupled


async def test_each_response_of_the_decoupled_step_reaches_the_stream(service: InferenceService) -> None:
    items = await stream(service, 3)
    assert all(item.error is None for item in items)
    answers = [item.response for item in items if item.response is not None]
    assert [a.outputs[0].data.tolist() for a in answers] == [[3], [3], [3]]
    assert all(a.model_name == "ens_square" and a.id == "sq" and a.outputs[0].name == "OUT" for a in answers)
    assert [item.final for item in items][-1] and not any(item.final for item in items[:-1])
    stats = {s.name: s for s in await service.model_statistics()}
    assert stats["square_ident"].inference_count >= 3  # the step after the decoupled one ran once per response
    assert stats["ens_square"].execution_count >= 1


async def test_no_response_of_the_decoupled_step_is_the_final_flag_alone(service: InferenceService) -> None:
    items = await stream(service, 0)
    assert len(items) == 1 and items[0].final and items[0].response is None and items[0].error is None


async def test_an_ensemble_that_declares_itself_decoupled_loads_and_streams(service: InferenceService) -> None:
    assert service.model("ens_square_declared").is_decoupled
    items = await stream(service, 2, "ens_square_declared")
    answers = [item.response for item in items if item.response is not None]
    assert [a.outputs[0].data.tolist() for a in answers] == [[2], [2]]
    assert all(a.model_name == "ens_square_declared" for a in answers)
    assert items[-1].final and all(item.error is None for item in items)


async def test_a_declared_flag_without_a_decoupled_step_is_dropped_as_triton_drops_it(
    service: InferenceService,
) -> None:
    assert not service.model("ens_plain_declared").is_decoupled
    assert not service.model_config("ens_plain_declared").model_transaction_policy.decoupled
