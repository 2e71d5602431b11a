"""Bad repository requests on the real server, over HTTP and gRPC with stock tritonclient (and raw bodies with
httpx and a raw gRPC stub): each gets an error a client can read, none shows the server's internals (Ray's
names, a traceback, a process id), and the server stays up and serves."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server

# Ray's name (in any word: RayActorError) and its task names, a Python traceback or its frames, a process id,
# Ray's actors.
INTERNALS = re.compile(r"Ray|\bray\b|ray::|Traceback|pid=|File \"/|\b[Aa]ctor\b")
ONNX = {"backend": "onnxruntime", "max_batch_size": 8}
FAILING_PY = """class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model cannot start")

    def execute(self, requests):
        return []
"""
FAILING_PY_CONFIG = {
    "backend": "python",
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
}


def _config(name: str, **over: object) -> str:
    return json.dumps({"name": name, **ONNX, **over})


# Each case: (id, call) where call(server) returns the error text the client got (it must fail).
def _http(call: Callable[[httpclient.InferenceServerClient], object]) -> Callable[[Server], str]:
    def run(server: Server) -> str:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        with pytest.raises(InferenceServerException) as err:
            call(client)
        return f"{err.value.status()} {err.value.message()}"

    return run


def _grpc(call: Callable[[grpcclient.InferenceServerClient], object]) -> Callable[[Server], str]:
    def run(server: Server) -> str:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as err:
            call(client)
        return f"{err.value.status()} {err.value.message()}"

    return run


def _raw_http(path: str, body: bytes) -> Callable[[Server], str]:
    def run(server: Server) -> str:
        r = httpx.post(f"http://{server.http_url}{path}", content=body, timeout=300)
        assert 400 <= r.status_code < 600, r.text
        assert set(r.json()) == {"error"}, r.text
        return f"{r.status_code} {r.json()['error']}"

    return run


def _raw_grpc(request: service_pb2.RepositoryModelLoadRequest) -> Callable[[Server], str]:
    def run(server: Server) -> str:
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.RepositoryModelLoad(request, timeout=300)
        return f"{err.value.code()} {err.value.details()}"

    return run


def _load_params(**params: service_pb2.ModelRepositoryParameter) -> service_pb2.RepositoryModelLoadRequest:
    request = service_pb2.RepositoryModelLoadRequest(model_name="bad_grpc_params")
    for key, value in params.items():
        request.parameters[key].CopyFrom(value)
    return request


def _load(
    protocol: str, name: str, config: str | None = None, files: dict[str, bytes] | None = None
) -> Callable[[Server], str]:
    """A load with stock tritonclient over ``protocol`` ("http" or "grpc")."""
    if protocol == "http":
        return _http(lambda c: c.load_model(name, config=config, files=files))
    return _grpc(lambda c: c.load_model(name, config=config, files=files))


def _failing_python(protocol: str) -> Callable[[Server], str]:
    name = f"bad_init_{protocol}"
    config = json.dumps({"name": name, **FAILING_PY_CONFIG})
    return _load(protocol, name, config, {"file:1/model.py": FAILING_PY.encode()})


LONG_PATH = "file:1/" + "d/" * 3000 + "model.onnx"
DEEP_PATH = "file:1/" + "d/" * 100 + "model.onnx"
GARBAGE = b"this is not an onnx model"
LOAD = "/v2/repository/models/bad_body/load"
UNLOAD = "/v2/repository/models/bad_body/unload"
INDEX = "/v2/repository/index"
NOT_BASE64 = json.dumps({"parameters": {"config": _config("bad_body"), "file:1/model.onnx": "!!! not base64 !!!"}})
STRING_FILE = _load_params(
    config=service_pb2.ModelRepositoryParameter(string_param=_config("bad_grpc_params")),
    **{"file:1/model.onnx": service_pb2.ModelRepositoryParameter(string_param="abc")},
)

POLL = "failed to poll from model repository"
BOTH = ("http", "grpc")
# (id, what the error says, the request): each must fail.
CASES: list[tuple[str, str, Callable[[Server], str]]] = [
    # load of a model the repository doesn't have
    *((f"{p}-load-unknown", POLL, _load(p, "no_such_model_here")) for p in BOTH),
    # a config that is not JSON, not an object, or not a valid model config (Triton: only "failed to poll")
    *((f"{p}-load-config-not-json", POLL, _load(p, f"bad_cfg_{p}", "{not json")) for p in BOTH),
    ("http-load-config-list", POLL, _load("http", "bad_cfg_http", "[1, 2]")),
    ("http-load-config-invalid", POLL, _load("http", "bad_cfg_http", _config("bad_cfg_http", max_batch_size=-4))),
    ("grpc-load-config-unknown-field", POLL, _load("grpc", "bad_cfg_grpc", _config("bad_cfg_grpc", no_such_field=1))),
    # files sent with the load: a path too long or too deep, a path leaving the model, content no backend reads
    *((f"{p}-load-file-path-too-long", "longer than 4096 bytes",
       _load(p, f"bad_file_{p}", _config(f"bad_file_{p}"), {LONG_PATH: GARBAGE})) for p in BOTH),
    *((f"{p}-load-file-path-too-deep", "more than 64 directories deep",
       _load(p, f"bad_file_{p}", _config(f"bad_file_{p}"), {DEEP_PATH: GARBAGE})) for p in BOTH),
    *((f"{p}-load-file-escapes", "must stay within model directory",
       _load(p, f"bad_file_{p}", _config(f"bad_file_{p}"), {f"file:{path}": GARBAGE}))
      for p, path in (("http", "../../escape.onnx"), ("grpc", "1/../../../escape"))),
    *((f"{p}-load-file-garbage", "unable to read the ONNX model",
       _load(p, f"bad_onnx_{p}", _config(f"bad_onnx_{p}"), {"file:1/model.onnx": GARBAGE})) for p in BOTH),
    ("http-load-files-without-config", "Load parameter 'config' must be specified",
     _load("http", "bad_nocfg", None, {"file:1/model.onnx": GARBAGE})),
    # a Python model's code: refused without --allow-model-code-upload (test_security.py loads one with it)
    *((f"{p}-load-python-code-refused", "start the server with --allow-model-code-upload", _failing_python(p))
      for p in BOTH),
    # raw bodies: not JSON, the wrong shapes, a file that is not base64
    ("http-load-body-not-json", "failed to parse the request JSON buffer", _raw_http(LOAD, b"{not json")),
    ("http-load-body-list", "expected a JSON object", _raw_http(LOAD, b"[]")),
    ("http-load-parameters-list", "Unable to parse 'parameters'", _raw_http(LOAD, b'{"parameters": []}')),
    ("http-load-config-number", "Unable to parse 'config'", _raw_http(LOAD, b'{"parameters": {"config": 5}}')),
    ("http-load-file-not-base64", "base64", _raw_http(LOAD, NOT_BASE64.encode())),
    ("http-unload-body-not-json", "failed to parse the request JSON buffer", _raw_http(UNLOAD, b"{not json")),
    ("http-unload-dependents-string", "Unable to parse 'unload_dependents'",
     _raw_http(UNLOAD, b'{"parameters": {"unload_dependents": "yes"}}')),
    ("http-index-body-not-json", "failed to parse the request JSON buffer", _raw_http(INDEX, b"{not json")),
    ("http-index-body-list", "must be a JSON object", _raw_http(INDEX, b"[1]")),
    ("http-index-ready-string", "'ready'", _raw_http(INDEX, b'{"ready": "yes"}')),
    ("http-load-other-repository", "'repository_name' specification is not supported",
     _raw_http("/v2/repository/elsewhere/models/bad_body/load", b"{}")),
    # raw gRPC: parameters of the wrong kind
    ("grpc-load-config-bool", "expected string_param",
     _raw_grpc(_load_params(config=service_pb2.ModelRepositoryParameter(bool_param=True)))),
    ("grpc-load-file-string", "expected bytes_param", _raw_grpc(STRING_FILE)),
]  # fmt: skip


@pytest.mark.parametrize(("says", "case"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_repository_request_gets_an_error_without_the_servers_internals(
    server: Server, says: str, case: Callable[[Server], str]
) -> None:
    text = case(server)
    assert says in text, text
    assert not INTERNALS.search(text), text
    assert len(text) < 2000, text


def test_unload_of_an_unknown_model_succeeds_as_in_triton(server: Server) -> None:
    httpclient.InferenceServerClient(server.http_url).unload_model("no_such_model_here")
    grpcclient.InferenceServerClient(server.grpc_url).unload_model("no_such_model_here")


def test_load_and_unload_are_refused_where_not_allowed(poll_server: Server) -> None:
    """Poll mode: the repository decides; Triton refuses explicit loads and unloads."""
    texts = [
        _http(lambda c: c.load_model("poll_grows"))(poll_server),
        _http(lambda c: c.unload_model("poll_grows"))(poll_server),
        _grpc(lambda c: c.load_model("poll_grows"))(poll_server),
        _grpc(lambda c: c.unload_model("poll_grows"))(poll_server),
    ]
    for text in texts:
        assert "not allowed" in text and not INTERNALS.search(text), text


def test_the_failed_loads_are_listed_without_internals_and_the_server_still_serves(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    reasons = [e.get("reason", "") for e in client.get_model_repository_index() if e["name"].startswith("bad_")]
    grpc_index = grpcclient.InferenceServerClient(server.grpc_url).get_model_repository_index(as_json=True)
    reasons += [e.get("reason", "") for e in grpc_index.get("models", []) if e["name"].startswith("bad_")]
    for reason in reasons:
        assert not INTERNALS.search(reason), reason
    assert client.is_server_live() and client.is_server_ready()
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
