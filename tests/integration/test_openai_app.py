"""The OpenAI port's Starlette app in process (no Ray): its routes' edges, errors in OpenAI's shape, and an
error after a stream has started, which travels in-band before ``data: [DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from scripts import llm_models, python_models
from serve_app.limits import RequestLimits
from serve_app.local.service import LocalService
from serve_app.openai_api.app import build_openai_app
from serve_app.service import InferenceService

# A vLLM-convention model whose stream fails after its first token.
FAILING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            out = pb_utils.Tensor("text_output", np.array([b" first"], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("the model broke")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InferenceService]:
    repo = tmp_path_factory.mktemp("openai_repo")
    llm_models.text_llm(repo)
    failing = llm_models.text_llm(repo, name="py_llm_failing")
    (failing / "1" / "model.py").write_text(FAILING_PY.lstrip())
    python_models.echo_text(repo)
    host = LocalService.from_repository(repo)
    yield host.service
    host.close()


@pytest.fixture
async def client(service: InferenceService) -> AsyncIterator[httpx.AsyncClient]:
    app = build_openai_app(service, limits=RequestLimits(max_body_bytes=4096))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        yield http


def events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]


async def test_models_list_only_the_conventions(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models")
    assert r.status_code == 200
    assert sorted(m["id"] for m in r.json()["data"]) == ["py_llm", "py_llm_failing"]


async def test_error_shapes(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = await client.post("/v1/completions", content=b'{"model": "py_llm", "prompt": "' + b"x" * 5000 + b'"}')
    assert r.status_code == 413 and "error" in r.json()
    r = await client.get("/v1/completions")
    assert r.status_code == 405 and "message" in r.json()["error"]
    r = await client.get("/v1/nothing")
    assert r.status_code == 404 and "message" in r.json()["error"]
    r = await client.post("/v1/chat/completions", json={"model": "py_echo_text", "messages": [{"role": "user"}]})
    assert r.status_code == 400 and "LLM conventions" in r.json()["error"]["message"]


async def test_error_after_the_first_chunk_is_in_band(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"model": "py_llm_failing", "prompt": "x", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    got = events(r.text)
    assert json.loads(got[0])["choices"][0]["text"] == " first"
    assert json.loads(got[1])["error"]["message"] == "the model broke"
    assert got[2:] == ["[DONE]"]


async def test_unary_error_has_its_status(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/completions", json={"model": "py_llm_failing", "prompt": "x"})
    assert r.status_code == 500 and r.json()["error"] == {
        "message": "the model broke", "type": "server_error", "param": None, "code": None
    }  # fmt: skip
