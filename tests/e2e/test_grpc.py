"""KServe v2 over gRPC against the real server, with the stock tritonclient.grpc."""

from __future__ import annotations

import queue
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.e2e.models import IDENTITY_TYPES, as_bytes


@pytest.fixture(scope="module")
def client(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def add_sub_inputs(batch: int = 1) -> tuple[list[grpcclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    b = np.full((batch, 16), 2, dtype=np.float32)
    inputs = [
        grpcclient.InferInput("INPUT0", [batch, 16], "FP32"),
        grpcclient.InferInput("INPUT1", [batch, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def test_health_metadata_config(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("add_sub")
    assert "binary_tensor_data" in client.get_server_metadata(as_json=True)["extensions"]
    md = client.get_model_metadata("add_sub", as_json=True)
    assert md["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}
    cfg = client.get_model_config("add_sub", as_json=True)["config"]
    assert cfg["name"] == "add_sub"
    assert cfg["max_batch_size"] == 8


def test_add_sub(client: grpcclient.InferenceServerClient) -> None:
    inputs, a, b = add_sub_inputs(batch=4)
    result = client.infer("add_sub", inputs, request_id="g1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "g1"


def test_every_datatype(client: grpcclient.InferenceServerClient) -> None:
    rng = np.random.default_rng(1)
    arrays, inputs = {}, []
    for wire in IDENTITY_TYPES:
        if wire == "BYTES":
            arr = np.array([[b"a", b"", "\u00fc".encode()]], dtype=np.object_)
        elif wire == "BOOL":
            arr = np.array([[True, False, True]])
        elif wire.startswith("FP"):
            arr = rng.standard_normal((1, 3)).astype({"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[wire])
        else:
            info = np.iinfo(np.dtype(wire.lower()))
            arr = np.array([[info.min, 7, info.max]], dtype=np.dtype(wire.lower()))
        arrays[wire] = arr
        inp = grpcclient.InferInput(f"IN_{wire}", list(arr.shape), wire)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("identity_all", inputs)
    for wire, arr in arrays.items():
        got = result.as_numpy(f"OUT_{wire}")
        if wire == "BYTES":
            assert [as_bytes(x) for x in got.ravel()] == list(arr.ravel())
        else:
            np.testing.assert_array_equal(got, arr, err_msg=wire)


def test_typed_contents(server: Server) -> None:
    """Triton accepts `contents` (typed fields) as well as raw_input_contents."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        req = service_pb2.ModelInferRequest(model_name="add_sub")
        for name, value in (("INPUT0", 1.5), ("INPUT1", 0.5)):
            t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            t.contents.fp32_contents.extend([value] * 16)
        resp = stub.ModelInfer(req)
    out = {o.name: i for i, o in enumerate(resp.outputs)}
    got = np.frombuffer(resp.raw_output_contents[out["OUTPUT0"]], dtype=np.float32)
    np.testing.assert_array_equal(got, np.full(16, 2.0, dtype=np.float32))


@pytest.mark.parametrize(
    ("model", "version", "code", "fragment"),
    [
        ("nope", "", "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found"),
        ("add_sub", "7", "StatusCode.NOT_FOUND", "version 7 is not found"),
    ],
)
def test_unknown_model(
    client: grpcclient.InferenceServerClient, model: str, version: str, code: str, fragment: str
) -> None:
    inputs, _, _ = add_sub_inputs()
    with pytest.raises(InferenceServerException) as exc:
        client.infer(model, inputs, model_version=version)
    assert exc.value.status() == code
    assert fragment in exc.value.message()


def test_bad_shape_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    a = np.zeros((1, 8), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 8], "FP32"), grpcclient.InferInput("INPUT1", [1, 8], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("add_sub", inputs)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Expected [-1,16], got [1,8]" in exc.value.message()
    assert client.is_server_ready()


def test_raw_contents_size_mismatch(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        req = service_pb2.ModelInferRequest(model_name="add_sub")
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        req.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
        req.raw_input_contents.extend([b"\x00" * 64, b"\x00" * 12])
        with pytest.raises(grpc.RpcError) as exc:
            stub.ModelInfer(req)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT1" in exc.value.details()


def test_statistics_and_index(client: grpcclient.InferenceServerClient) -> None:
    stats = client.get_inference_statistics("add_sub", as_json=True)
    assert stats["model_stats"][0]["name"] == "add_sub"
    index = client.get_model_repository_index(as_json=True)["models"]
    names = {m["name"]: m for m in index}
    assert names["add_sub"]["state"] == "READY"
    assert names["broken"]["state"] == "UNAVAILABLE"


def test_stream_infer_with_inband_errors(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        expected = []
        for i in range(5):
            inputs, a, b = add_sub_inputs()
            inputs[0].set_data_from_numpy(a + i)
            client.async_stream_infer("add_sub", inputs, request_id=str(i))
            expected.append(a + i + b)
        bad = [grpcclient.InferInput("INPUT0", [1, 16], "FP32")]
        bad[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        client.async_stream_infer("add_sub", bad, request_id="bad")
        inputs, a, b = add_sub_inputs()
        client.async_stream_infer("add_sub", inputs, request_id="after")
        got = [results.get(timeout=30) for _ in range(7)]
    finally:
        client.stop_stream()
    # Responses come as requests complete (as in Triton); the in-band error carries no id.
    errors = [error for result, error in got if error is not None]
    assert len(errors) == 1 and "missing required input(s) ['INPUT1']" in str(errors[0])
    by_id = {result.get_response().id: result for result, error in got if error is None}
    assert set(by_id) == {"0", "1", "2", "3", "4", "after"}
    for i in range(5):
        np.testing.assert_array_equal(by_id[str(i)].as_numpy("OUTPUT0"), expected[i])
