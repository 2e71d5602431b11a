"""The infer route taken before Starlette's routing: the same answers as the framework's route."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from serve_app.http_server import build_http_app
from serve_app.limits import RequestLimits
from serve_app.service import InferenceService

A = list(range(16))


def _body(a: list[int] = A) -> bytes:
    tensors = [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": a} for n in ("INPUT0", "INPUT1")]
    return json.dumps({"inputs": tensors}).encode()


@pytest.fixture
async def client(service: InferenceService) -> httpx.AsyncClient:
    app = build_http_app(service, limits=RequestLimits(max_body_bytes=4096))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v2/models/add_sub/versions/1/infer"])
async def test_json_and_binary_answers(client: httpx.AsyncClient, path: str) -> None:
    r = await client.post(path, content=_body())
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert out["OUTPUT0"] == [2 * x for x in A] and out["OUTPUT1"] == [0] * 16
    request = json.loads(_body())
    request["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    r = await client.post(path, content=json.dumps(request).encode())
    length = int(r.headers["inference-header-content-length"])
    assert r.headers["content-type"] == "application/octet-stream"
    assert np.frombuffer(r.content[length:], np.float32).tolist() == [2.0 * x for x in A]


async def test_errors_are_json_with_the_mapped_status(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/models/nothing/infer", content=_body())
    assert r.status_code == 404 and "error" in r.json()
    r = await client.post("/v2/models/add_sub/infer", content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    r = await client.post("/v2/models/add_sub/infer", content=b"x" * 5000)
    assert r.status_code == 413 and "exceeds the maximum" in r.json()["error"]
    r = await client.post("/v2/models/add_sub/infer", content=_body(), headers={"content-length": "1x"})
    assert r.status_code == 400


async def test_other_paths_and_methods_reach_the_framework(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/models/add_sub/infer")).status_code == 405
    assert (await client.post("/v2/models/add_sub/infer/more", content=b"{}")).status_code == 404
    assert (await client.get("/v2/models/add_sub")).json()["name"] == "add_sub"
