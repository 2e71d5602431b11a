"""The model repository extension's front ends over a recording RepositoryControl.

Both protocols are driven with raw requests and with stock tritonclient: the gRPC client over a
real grpc server, the HTTP client with its transport routed into the app in process.  What the
control receives (config text, file bytes, unload_dependents) and what its errors become on the
wire are checked; without a control, load and unload answer as Triton does outside explicit mode.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
import grpc
import httpx
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from serve_app.errors import InternalError, InvalidArgument, NotFound, ServeError, Unavailable
from serve_app.grpc_server import start_grpc_server
from serve_app.http_server import build_http_app
from serve_app.repository.api import IndexEntry, LoadParameters
from serve_app.service import InferenceService
from tests.support.net import free_port
from tests.support.repos import ADD_SUB

Stub = service_pb2_grpc.GRPCInferenceServiceStub

MODEL = "dynamic"
CONFIG = json.dumps({"name": MODEL, "backend": "onnxruntime", "max_batch_size": 8, "input": [], "output": []})
ONNX = bytes(range(256)) * 4 + b"\x00tail"  # every byte value, NULs included
NO_CONTROL = "explicit model load / unload is not allowed if polling is enabled"
NO_REPOSITORY_NAME = "'repository_name' specification is not supported"
FILES_NEED_CONFIG = "Load parameter 'config' must be specified for model file override"
INDEX = [IndexEntry(MODEL, "1", "READY", ""), IndexEntry("idle", "", "UNAVAILABLE", "unloaded")]


@dataclass
class FakeControl:
    """Records every call; raises ``error`` when set."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    error: ServeError | None = None

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if self.error is not None:
            raise self.error

    async def index(self, ready_only: bool) -> list[IndexEntry]:
        self._record("index", ready_only)
        return [e for e in INDEX if e.state == "READY" or not ready_only]

    async def load(self, name: str, params: LoadParameters) -> None:
        self._record("load", name, params)

    async def unload(self, name: str, unload_dependents: bool) -> None:
        self._record("unload", name, unload_dependents)


@pytest.fixture
def control(service: InferenceService, monkeypatch: pytest.MonkeyPatch) -> FakeControl:
    fake = FakeControl()
    monkeypatch.setattr(service, "repository", fake)
    return fake


@pytest.fixture
async def triton_grpc(service: InferenceService) -> AsyncIterator[grpcaio.InferenceServerClient]:
    """Stock tritonclient.grpc (asyncio flavour) connected to our server on a free port."""
    port = free_port()
    server = await start_grpc_server(service, "127.0.0.1", port)
    client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield client
    finally:
        await client.close()
        await server.stop(grace=None)


@pytest.fixture
def triton_http(service: InferenceService) -> Iterator[httpclient.InferenceServerClient]:
    """Stock tritonclient.http whose POSTs (body, headers, error parsing: all its own) reach the app in process."""
    client = httpclient.InferenceServerClient("127.0.0.1:1")  # never dialled: _post is rerouted below
    with anyio.from_thread.start_blocking_portal() as portal:
        app = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_http_app(service)), base_url="http://test")

        def post(request_uri: str, request_body: Any, headers: Any, query_params: Any) -> httpx.Response:
            send = functools.partial(
                app.post, "/" + request_uri, content=request_body, headers=headers or {}, params=query_params
            )
            return portal.call(send)

        client._post = post  # type: ignore[method-assign]
        try:
            yield client
        finally:
            portal.call(app.aclose)
    client.close()


def assert_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": message}


def assert_empty_ok(r: httpx.Response) -> None:
    """Triton answers a load / unload with 200, a JSON content type and no body."""
    assert r.status_code == 200, r.text
    assert r.content == b""
    assert r.headers["content-length"] == "0"
    assert r.headers["content-type"] == "application/json"


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    return exc.value


CONTROL_ERRORS = [
    (NotFound("failed to load 'dynamic', no version is available"), 404, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument("Invalid config override: bad"), 400, grpc.StatusCode.INVALID_ARGUMENT),
    (Unavailable("model 'dynamic' is being loaded"), 503, grpc.StatusCode.UNAVAILABLE),
    (InternalError("controller crashed"), 500, grpc.StatusCode.INTERNAL),
]


# --------------------------------------------------------------------------- HTTP


async def test_http_load_delivers_config_and_files(http: httpx.AsyncClient, control: FakeControl) -> None:
    files = {"file:1/model.onnx": base64.b64encode(ONNX).decode(), "file:labels.txt": base64.b64encode(b"a\n").decode()}
    r = await http.post(f"/v2/repository/models/{MODEL}/load", json={"parameters": {"config": CONFIG, **files}})
    assert_empty_ok(r)
    assert control.calls == [
        ("load", MODEL, LoadParameters(config_json=CONFIG, files={"1/model.onnx": ONNX, "labels.txt": b"a\n"}))
    ]


@pytest.mark.parametrize("content", [b"", b"{}", b'{"parameters": {}}'])
async def test_http_load_without_parameters(http: httpx.AsyncClient, control: FakeControl, content: bytes) -> None:
    assert_empty_ok(await http.post(f"/v2/repository/models/{MODEL}/load", content=content))
    assert control.calls == [("load", MODEL, LoadParameters())]


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"", False), (b'{"parameters": {"unload_dependents": true}}', True), (b'{"parameters": {}}', False)],
)
async def test_http_unload(http: httpx.AsyncClient, control: FakeControl, content: bytes, expected: bool) -> None:
    assert_empty_ok(await http.post(f"/v2/repository/models/{MODEL}/unload", content=content))
    assert control.calls == [("unload", MODEL, expected)]


async def test_http_index_comes_from_the_control(http: httpx.AsyncClient, control: FakeControl) -> None:
    everything = (await http.post("/v2/repository/index")).json()
    assert everything == [
        {"name": MODEL, "version": "1", "state": "READY"},
        {"name": "idle", "state": "UNAVAILABLE", "reason": "unloaded"},
    ]
    assert (await http.post("/v2/repository/index", json={"ready": True})).json() == everything[:1]
    assert control.calls == [("index", False), ("index", True)]


@pytest.mark.parametrize(("error", "status", "_code"), CONTROL_ERRORS)
async def test_http_control_errors(
    http: httpx.AsyncClient, control: FakeControl, error: ServeError, status: int, _code: grpc.StatusCode
) -> None:
    control.error = error
    assert_error(await http.post(f"/v2/repository/models/{MODEL}/load"), status, error.message)
    assert_error(await http.post(f"/v2/repository/models/{MODEL}/unload"), status, error.message)
    assert_error(await http.post("/v2/repository/index"), status, error.message)


@pytest.mark.parametrize(
    ("path", "parameters", "message"),
    [
        ("load", {"file:1/model.onnx": base64.b64encode(ONNX).decode()}, FILES_NEED_CONFIG),
        ("load", {"config": CONFIG, "file:1/model.onnx": "%%%"}, "Unable to parse 'file:1/model.onnx'"),
        ("load", {"config": {"name": MODEL}}, "Unable to parse 'config': attempt to access JSON non-string as string"),
        ("load", {"config": CONFIG, "version": "1"}, "unrecognized load parameter 'version'."),
        ("unload", {"unload_dependents": "yes"}, "Unable to parse 'unload_dependents'"),
    ],
)
async def test_http_parameter_errors(
    http: httpx.AsyncClient, control: FakeControl, path: str, parameters: dict[str, Any], message: str
) -> None:
    r = await http.post(f"/v2/repository/models/{MODEL}/{path}", json={"parameters": parameters})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert control.calls == []


async def test_http_bad_json(http: httpx.AsyncClient, control: FakeControl) -> None:
    for path in ("load", "unload"):
        r = await http.post(f"/v2/repository/models/{MODEL}/{path}", content=b"{nope")
        assert r.status_code == 400
        assert r.json()["error"].startswith("failed to parse the request JSON buffer")
    assert control.calls == []


async def test_http_repository_name(http: httpx.AsyncClient, control: FakeControl) -> None:
    """A named repository: refused by load / unload (501) before the body is read, ignored by the index."""
    for path in ("load", "unload"):
        r = await http.post(f"/v2/repository/elsewhere/models/{MODEL}/{path}", content=b"{nope")
        assert_error(r, 501, NO_REPOSITORY_NAME)
    assert len((await http.post("/v2/repository/elsewhere/index")).json()) == len(INDEX)
    assert control.calls == [("index", False)]


async def test_http_without_control(http: httpx.AsyncClient, service: InferenceService) -> None:
    assert service.repository is None
    assert_error(await http.post(f"/v2/repository/models/{MODEL}/load"), 503, NO_CONTROL)
    assert_error(await http.post(f"/v2/repository/models/{ADD_SUB}/unload"), 503, NO_CONTROL)
    # the parameters are still checked first, as Triton's front end does before its core
    r = await http.post(f"/v2/repository/models/{MODEL}/load", json={"parameters": {"file:x": "QUJD"}})
    assert_error(r, 400, FILES_NEED_CONFIG)
    index = (await http.post("/v2/repository/index")).json()
    assert {"name": ADD_SUB, "version": "1", "state": "READY"} in index  # the registry's index


async def test_server_metadata_lists_the_extension(http: httpx.AsyncClient) -> None:
    extensions = (await http.get("/v2")).json()["extensions"]
    assert "model_repository" in extensions
    assert "model_repository(unload_dependents)" in extensions


def test_tritonclient_http(triton_http: httpclient.InferenceServerClient, control: FakeControl) -> None:
    triton_http.load_model(MODEL, config=CONFIG, files={"file:1/model.onnx": ONNX, "file:1/empty": b""})
    triton_http.load_model(MODEL)
    triton_http.unload_model(MODEL, unload_dependents=True)
    triton_http.unload_model(MODEL)
    assert triton_http.get_model_repository_index()[0] == {"name": MODEL, "version": "1", "state": "READY"}
    assert control.calls == [
        ("load", MODEL, LoadParameters(config_json=CONFIG, files={"1/model.onnx": ONNX, "1/empty": b""})),
        ("load", MODEL, LoadParameters()),
        ("unload", MODEL, True),
        ("unload", MODEL, False),
        ("index", False),
    ]


def test_tritonclient_http_errors(triton_http: httpclient.InferenceServerClient, control: FakeControl) -> None:
    with pytest.raises(InferenceServerException) as exc:
        triton_http.load_model(MODEL, files={"file:1/model.onnx": ONNX})
    assert (exc.value.status(), exc.value.message()) == ("400", FILES_NEED_CONFIG)
    control.error = NotFound("no model 'dynamic'")
    with pytest.raises(InferenceServerException) as exc:
        triton_http.unload_model(MODEL)
    assert (exc.value.status(), exc.value.message()) == ("404", "no model 'dynamic'")


def test_tritonclient_http_without_control(triton_http: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as exc:
        triton_http.load_model(MODEL, config=CONFIG)
    assert (exc.value.status(), exc.value.message()) == ("503", NO_CONTROL)


# --------------------------------------------------------------------------- gRPC


async def test_grpc_load_and_unload(grpc_stub: Stub, control: FakeControl) -> None:
    load = pb.RepositoryModelLoadRequest(model_name=MODEL)
    load.parameters["config"].string_param = CONFIG
    load.parameters["file:1/model.onnx"].bytes_param = ONNX
    await grpc_stub.RepositoryModelLoad(load)
    await grpc_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL))
    unload = pb.RepositoryModelUnloadRequest(model_name=MODEL)
    unload.parameters["unload_dependents"].bool_param = True
    await grpc_stub.RepositoryModelUnload(unload)
    await grpc_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=MODEL))
    assert control.calls == [
        ("load", MODEL, LoadParameters(config_json=CONFIG, files={"1/model.onnx": ONNX})),
        ("load", MODEL, LoadParameters()),
        ("unload", MODEL, True),
        ("unload", MODEL, False),
    ]


async def test_grpc_index_comes_from_the_control(grpc_stub: Stub, control: FakeControl) -> None:
    everything = (await grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest())).models
    assert [(m.name, m.version, m.state, m.reason) for m in everything] == [
        (MODEL, "1", "READY", ""),
        ("idle", "", "UNAVAILABLE", "unloaded"),
    ]
    ready = (await grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))).models
    assert [m.name for m in ready] == [MODEL]
    assert control.calls == [("index", False), ("index", True)]


@pytest.mark.parametrize(("error", "_status", "code"), CONTROL_ERRORS)
async def test_grpc_control_errors(
    grpc_stub: Stub, control: FakeControl, error: ServeError, _status: int, code: grpc.StatusCode
) -> None:
    control.error = error
    for call in (
        grpc_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL)),
        grpc_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=MODEL)),
        grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest()),
    ):
        err = await rpc_error(call)
        assert (err.code(), err.details()) == (code, error.message)


async def test_grpc_parameter_errors(grpc_stub: Stub, control: FakeControl) -> None:
    wrong_config = pb.RepositoryModelLoadRequest(model_name=MODEL)
    wrong_config.parameters["config"].bytes_param = CONFIG.encode()
    files_only = pb.RepositoryModelLoadRequest(model_name=MODEL)
    files_only.parameters["file:1/model.onnx"].bytes_param = ONNX
    unknown = pb.RepositoryModelLoadRequest(model_name=MODEL)
    unknown.parameters["unload_dependents"].bool_param = True
    wrong_flag = pb.RepositoryModelUnloadRequest(model_name=MODEL)
    wrong_flag.parameters["unload_dependents"].string_param = "true"
    not_string = "invalid value type for load parameter 'config', expected string_param."
    not_bool = "invalid value type for 'unload_dependents' parameter, expected bool_param."
    for call, message in (
        (grpc_stub.RepositoryModelLoad(wrong_config), not_string),
        (grpc_stub.RepositoryModelLoad(files_only), FILES_NEED_CONFIG),
        (grpc_stub.RepositoryModelLoad(unknown), "unrecognized load parameter 'unload_dependents'."),
        (grpc_stub.RepositoryModelUnload(wrong_flag), not_bool),
    ):
        err = await rpc_error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert control.calls == []


async def test_grpc_repository_name(grpc_stub: Stub, control: FakeControl) -> None:
    """Triton's gRPC refuses a named repository on all three calls (UNSUPPORTED: UNIMPLEMENTED)."""
    for call in (
        grpc_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(repository_name="r", model_name=MODEL)),
        grpc_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(repository_name="r", model_name=MODEL)),
        grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="r")),
    ):
        err = await rpc_error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.UNIMPLEMENTED, NO_REPOSITORY_NAME)
    assert control.calls == []


async def test_grpc_without_control(grpc_stub: Stub, service: InferenceService) -> None:
    assert service.repository is None
    for call in (
        grpc_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=MODEL)),
        grpc_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=ADD_SUB)),
    ):
        err = await rpc_error(call)
        assert (err.code(), err.details()) == (grpc.StatusCode.UNAVAILABLE, NO_CONTROL)
    index = (await grpc_stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))).models
    assert ADD_SUB in {m.name for m in index}


async def test_tritonclient_grpc(triton_grpc: grpcaio.InferenceServerClient, control: FakeControl) -> None:
    await triton_grpc.load_model(MODEL, config=CONFIG, files={"file:1/model.onnx": ONNX, "file:1/empty": b""})
    await triton_grpc.load_model(MODEL)
    await triton_grpc.unload_model(MODEL, unload_dependents=True)
    await triton_grpc.unload_model(MODEL)
    index = await triton_grpc.get_model_repository_index(as_json=True)
    assert index["models"][0] == {"name": MODEL, "version": "1", "state": "READY"}
    assert control.calls == [
        ("load", MODEL, LoadParameters(config_json=CONFIG, files={"1/model.onnx": ONNX, "1/empty": b""})),
        ("load", MODEL, LoadParameters()),
        ("unload", MODEL, True),
        ("unload", MODEL, False),
        ("index", False),
    ]


async def test_tritonclient_grpc_errors(triton_grpc: grpcaio.InferenceServerClient, control: FakeControl) -> None:
    with pytest.raises(InferenceServerException) as exc:
        await triton_grpc.load_model(MODEL, files={"file:1/model.onnx": ONNX})
    assert (exc.value.status(), exc.value.message()) == ("StatusCode.INVALID_ARGUMENT", FILES_NEED_CONFIG)
    control.error = Unavailable("model 'dynamic' is being loaded")
    with pytest.raises(InferenceServerException) as exc:
        await triton_grpc.unload_model(MODEL, unload_dependents=True)
    assert (exc.value.status(), exc.value.message()) == ("StatusCode.UNAVAILABLE", "model 'dynamic' is being loaded")
    assert control.calls == [("unload", MODEL, True)]


async def test_tritonclient_grpc_without_control(triton_grpc: grpcaio.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as exc:
        await triton_grpc.load_model(MODEL, config=CONFIG)
    assert (exc.value.status(), exc.value.message()) == ("StatusCode.UNAVAILABLE", NO_CONTROL)


async def test_http_index_refuses_a_ready_that_is_not_a_boolean(http: httpx.AsyncClient, control: FakeControl) -> None:
    r = await http.post("/v2/repository/index", json={"ready": "yes"})
    assert r.status_code == 400
    assert r.json() == {"error": "Invalid value for 'ready': expected a boolean"}
