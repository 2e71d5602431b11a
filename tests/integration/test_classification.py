"""The classification extension through both front ends, with a label file next to the config."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from scripts import example_models
from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.service import InferenceService
from tests.integration.conftest import local_service
from tests.support.net import free_port

LABELS = ["zero", "one", "two", "three"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> InferenceService:
    repo = tmp_path_factory.mktemp("classification_repo")
    d = example_models.identity(repo, "FP32", name="scores")
    (d / "labels.txt").write_text("\n".join(LABELS) + "\n")
    config = d / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "labels.txt"'))
    example_models.identity(repo, "INT32", name="int_scores")
    return local_service(repo).service


SCORES = [0.5, 9.0, 0.25, 3.0]


async def test_http_top_k_with_labels(service: InferenceService) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": SCORES + SCORES[::-1]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    transport = httpx.ASGITransport(app=build_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post("/v2/models/scores/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == ["9.000000:1:one", "3.000000:3:three", "9.000000:2:two", "3.000000:0:zero"]


async def test_http_integers_and_bad_count(service: InferenceService) -> None:
    transport = httpx.ASGITransport(app=build_http_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body = {
            "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "INT32", "data": [4, 9, 1]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 5}}],
        }
        r = await client.post("/v2/models/int_scores/infer", json=body)
        assert r.json()["outputs"][0]["data"] == ["9:1", "4:0", "1:2"]
        body["outputs"][0]["parameters"]["classification"] = 0  # type: ignore[index]
        r = await client.post("/v2/models/int_scores/infer", json=body)
        assert r.status_code == 400 and "must be a positive integer" in r.json()["error"]


@pytest.fixture
async def stub(service: InferenceService) -> AsyncIterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        await server.stop(grace=None)


async def test_grpc_top_k(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    req = service_pb2.ModelInferRequest(model_name="scores")
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.array([SCORES], dtype=np.float32).tobytes())
    out = req.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 3
    resp = await stub.ModelInfer(req)
    result = grpcclient.InferResult(resp).as_numpy("OUTPUT0")
    assert result.shape == (1, 3)
    assert [x.decode() for x in result[0]] == ["9.000000:1:one", "3.000000:3:three", "0.500000:0:zero"]
