"""Python models in the server's own paths, in process: as ensemble steps, with warmup samples, through the
HTTP front end (the decoupled refusal, generate)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator

import httpx
import numpy as np
import pytest

from scripts import python_models
from serve_app.http_server import build_http_app
from serve_app.inference.types import InferRequest, InferTensor
from serve_app.local.service import LocalService
from serve_app.service import InferenceService

WARMUP = """model_warmup [ { name: "zeros" batch_size: 1 count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } } ]"""

ENSEMBLE = """name: "py_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "py_add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "diff" } },
  { model_name: "py_add_sub" model_version: -1
    input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "diff" }
    output_map { key: "OUTPUT0" value: "TWICE_A" } }
] }
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("python_repo")
    python_models.add_sub(repo, extra=WARMUP)
    python_models.square(repo)
    python_models.echo_text(repo)
    (repo / "py_ensemble" / "1").mkdir(parents=True)
    (repo / "py_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    host = LocalService.from_repository(repo)
    yield host.service
    host.close()


@pytest.fixture
async def http(service: InferenceService) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


def tensor(name: str, array: np.ndarray) -> InferTensor:
    return InferTensor(name, "FP32", tuple(array.shape), array)


async def test_a_python_model_is_an_ensemble_step(service: InferenceService) -> None:
    a, b = np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)
    request = InferRequest("py_ensemble", inputs=[tensor("A", a), tensor("B", b)])
    response = await service.infer(service.model("py_ensemble"), request)
    np.testing.assert_array_equal(response.outputs[0].data, 2 * a)


async def test_warmup_runs_before_ready_and_counts(service: InferenceService) -> None:
    stats = (await service.model_statistics("py_add_sub"))[0]
    assert stats.execution_count >= 2  # the two warmup samples, as Triton counts them


async def test_http_refuses_a_decoupled_model_and_generate_answers(
    http: httpx.AsyncClient, tmp_path: pathlib.Path
) -> None:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]}
    r = await http.post("/v2/models/py_square/infer", json=body)
    assert r.status_code == 501
    assert r.json() == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    r = await http.post("/v2/models/py_square/generate", json={"IN": 1})
    assert r.status_code == 200 and r.json()["OUT"] == 1
    r = await http.post("/v2/models/py_square/generate_stream", json={"IN": 3})
    assert r.text.count("data: ") == 3
    r = await http.post("/v2/models/py_echo_text/generate", json={"text_input": "abc", "parameters": {"k": 1}})
    assert r.json() == {"model_name": "py_echo_text", "model_version": "1", "text_output": "ABC"}
