"""Triton's published Python example clients, replayed: the calls each one makes and the checks it runs.

One server (``--server-name triton``, explicit model control with every model loaded, as the model
control examples need, and ``--allow-client-shm`` for the shared memory examples) on a repository of the
models the examples call (``tests/support/triton_simple_models.py``). Each test names the example client it
stands for; the values checked are the clients' own. Model control runs last: it reloads ``simple`` with
another config.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server, start_server, stop_server
from tests.support import triton_simple_models as models

UNKNOWN_MODEL = "Request for unknown model"


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = models.build(tmp_path_factory.mktemp("triton_examples_repository"))
    flags = ["--model-control-mode", "explicit", "--load-model", "*", "--server-name", "triton", "--allow-client-shm"]
    started, _ = start_server(tmp_path_factory, repo, flags, "triton_examples")
    yield started
    stop_server(started)


# --- simple: add/sub on INT32 [1, 16] ------------------------------------------------------------

IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
ONES = np.ones((1, 16), dtype=np.int32)
MINUS_ONES = np.full((1, 16), -1, dtype=np.int32)


def check_add_sub(result: Any, in0: np.ndarray, in1: np.ndarray) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)


def http_simple_inputs(module: Any, in1: np.ndarray) -> list[Any]:
    """INPUT0 as JSON, INPUT1 binary, as simple_http_infer_client.py sends them."""
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(IN0, binary_data=False)
    inputs[1].set_data_from_numpy(in1, binary_data=True)
    return inputs


def http_simple_outputs(module: Any) -> list[Any]:
    return [
        module.InferRequestedOutput("OUTPUT0", binary_data=True),
        module.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]


def grpc_simple_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(IN0)
    inputs[1].set_data_from_numpy(ONES)
    return inputs


def grpc_simple_outputs(module: Any) -> list[Any]:
    return [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]


def test_simple_http_infer_client(triton: Server) -> None:
    """simple_http_infer_client.py, and simple_http_async_infer_client.py's two concurrent requests."""
    client = httpclient.InferenceServerClient(triton.http_url, concurrency=2)
    query = {"test_1": 1, "test_2": 2}
    result = client.infer(
        "simple",
        http_simple_inputs(httpclient, MINUS_ONES),
        outputs=http_simple_outputs(httpclient),
        query_params=query,
    )
    assert len(client.get_inference_statistics(model_name="simple")["model_stats"]) == 1
    check_add_sub(result, IN0, MINUS_ONES)
    check_add_sub(
        client.infer("simple", http_simple_inputs(httpclient, MINUS_ONES), query_params=query), IN0, MINUS_ONES
    )
    with pytest.raises(InferenceServerException) as err:
        client.infer("wrong_model_name", http_simple_inputs(httpclient, MINUS_ONES))
    assert err.value.message().startswith(UNKNOWN_MODEL)

    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(IN0, binary_data=True)
    inputs[1].set_data_from_numpy(ONES, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    pending = [client.async_infer("simple", inputs, outputs=outputs) for _ in range(2)]
    for request in pending:
        check_add_sub(request.get_result(), IN0, ONES)


async def test_simple_http_aio_infer_client(triton: Server) -> None:
    client = httpaio.InferenceServerClient(triton.http_url)
    try:
        result = await client.infer(
            "simple", http_simple_inputs(httpaio, MINUS_ONES), outputs=http_simple_outputs(httpaio)
        )
        assert len((await client.get_inference_statistics(model_name="simple"))["model_stats"]) == 1
        check_add_sub(result, IN0, MINUS_ONES)
        with pytest.raises(InferenceServerException) as err:
            await client.infer("wrong_model_name", http_simple_inputs(httpaio, MINUS_ONES))
        assert err.value.message().startswith(UNKNOWN_MODEL)
        both = await asyncio.gather(
            client.infer("simple", http_simple_inputs(httpaio, MINUS_ONES), outputs=http_simple_outputs(httpaio)),
            client.infer("simple", http_simple_inputs(httpaio, MINUS_ONES)),
        )
        for result in both:
            check_add_sub(result, IN0, MINUS_ONES)
    finally:
        await client.close()


CHANNEL_ARGS = [  # simple_grpc_custom_args_client.py's
    ("grpc.max_send_message_length", 1024 * 1024),
    ("grpc.max_receive_message_length", 1024 * 1024),
    ("grpc.keepalive_time_ms", 2**31 - 1),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", False),
    ("grpc.http2.max_pings_without_data", 2),
    ("grpc.dns_enable_srv_queries", 1),
]
KEEPALIVE = {
    "keepalive_time_ms": 2**31 - 1,
    "keepalive_timeout_ms": 20000,
    "keepalive_permit_without_calls": False,
    "http2_max_pings_without_data": 2,
}


def test_simple_grpc_infer_client(triton: Server) -> None:
    """simple_grpc_infer_client.py, simple_grpc_async_infer_client.py, and the custom_args and keepalive
    clients (the same call on channels with their options)."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    inputs, outputs = grpc_simple_inputs(grpcclient), grpc_simple_outputs(grpcclient)
    result = client.infer("simple", inputs, outputs=outputs, client_timeout=None, headers={"test": "1"})
    assert len(client.get_inference_statistics(model_name="simple").model_stats) == 1
    check_add_sub(result, IN0, ONES)
    check_add_sub(client.infer("simple", inputs, outputs=None), IN0, ONES)

    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("simple", inputs, callback=lambda result, error: done.put(error or result), outputs=outputs)
    check_add_sub(done.get(timeout=10), IN0, ONES)

    for other in (
        grpcclient.InferenceServerClient(triton.grpc_url, channel_args=CHANNEL_ARGS),
        grpcclient.InferenceServerClient(triton.grpc_url, keepalive_options=grpcclient.KeepAliveOptions(**KEEPALIVE)),
    ):
        check_add_sub(other.infer("simple", inputs, outputs=outputs, headers={"test": "1"}), IN0, ONES)


async def test_simple_grpc_aio_infer_client(triton: Server) -> None:
    """simple_grpc_aio_infer_client.py and the aio custom_args and keepalive clients."""
    client = grpcaio.InferenceServerClient(triton.grpc_url)
    inputs, outputs = grpc_simple_inputs(grpcaio), grpc_simple_outputs(grpcaio)
    check_add_sub(await client.infer("simple", inputs, outputs=outputs, headers={"test": "1"}), IN0, ONES)
    assert len((await client.get_inference_statistics(model_name="simple")).model_stats) == 1
    for result in await asyncio.gather(client.infer("simple", inputs), client.infer("simple", inputs)):
        check_add_sub(result, IN0, ONES)
    for other in (
        grpcaio.InferenceServerClient(triton.grpc_url, channel_args=CHANNEL_ARGS),
        grpcaio.InferenceServerClient(triton.grpc_url, keepalive_options=grpcaio.KeepAliveOptions(**KEEPALIVE)),
    ):
        check_add_sub(await other.infer("simple", inputs, outputs=outputs, headers={"test": "1"}), IN0, ONES)
        await other.close()
    await client.close()


# --- strings: simple_string and simple_identity --------------------------------------------------

STRING_IN0 = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
STRING_IN1 = np.array([[b"1"] * 16], dtype=np.object_)
NULL_CHARS = np.array([[b"he\x00llo"] * 16], dtype=np.object_)
BLOBS = np.array([[b"\x00\x01\x02\x03"] * 16], dtype=np.bytes_)


def check_string_add_sub(result: Any) -> None:
    sums = [int(v) for v in result.as_numpy("OUTPUT0")[0]]
    diffs = [int(v) for v in result.as_numpy("OUTPUT1")[0]]
    assert sums == [i + 1 for i in range(16)]
    assert diffs == [i - 1 for i in range(16)]


def check_identity(sent: np.ndarray, got: np.ndarray, json_output: bool = False) -> None:
    """The string clients' identity checks, per input kind and output encoding."""
    if sent.dtype == np.object_ and json_output:
        got = np.array([bytes(str(x), encoding="utf-8") for x in got.flatten()], dtype=np.object_).reshape(1, 16)
    elif sent.dtype != np.object_:
        got = np.char.encode(got.astype(str))
    np.testing.assert_array_equal(sent, got)


def test_simple_http_string_infer_client(triton: Server) -> None:
    client = httpclient.InferenceServerClient(triton.http_url)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(STRING_IN0, binary_data=True)
    inputs[1].set_data_from_numpy(STRING_IN1, binary_data=False)
    check_string_add_sub(client.infer("simple_string", inputs, outputs=http_simple_outputs(httpclient)))
    for sent in (NULL_CHARS, BLOBS):
        for binary in (True, False):
            ident = httpclient.InferInput("INPUT0", list(sent.shape), "BYTES")
            ident.set_data_from_numpy(sent, binary_data=binary)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            result = client.infer("simple_identity", [ident], outputs=[output])
            check_identity(sent, result.as_numpy("OUTPUT0"), json_output=not binary)


def test_simple_grpc_string_infer_client(triton: Server) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "BYTES"), grpcclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(STRING_IN0)
    inputs[1].set_data_from_numpy(STRING_IN1)
    check_string_add_sub(client.infer("simple_string", inputs, outputs=grpc_simple_outputs(grpcclient)))
    for sent in (NULL_CHARS, BLOBS):
        ident = grpcclient.InferInput("INPUT0", list(sent.shape), "BYTES")
        ident.set_data_from_numpy(sent)
        result = client.infer("simple_identity", [ident], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        check_identity(sent, result.as_numpy("OUTPUT0"))


def test_grpc_explicit_byte_content_client(triton: Server) -> None:
    """Typed bytes_contents in, raw BYTES out, through the bare gRPC stub."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(triton.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="simple_string", model_version="")
    for name, values in (("INPUT0", [str(i) for i in range(16)]), ("INPUT1", ["1"] * 16)):
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype="BYTES", shape=[1, 16])
        tensor.contents.bytes_contents.extend(v.encode() for v in values)
        request.inputs.append(tensor)
    request.outputs.extend(
        service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in ("OUTPUT0", "OUTPUT1")
    )
    response = stub.ModelInfer(request)
    results = [
        np.resize(utils.deserialize_bytes_tensor(raw), list(out.shape))
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    ]
    assert len(results) == 2
    assert [int(v) for v in results[0][0]] == [i + 1 for i in range(16)]
    assert [int(v) for v in results[1][0]] == [i - 1 for i in range(16)]


# --- typed int contents and errors through the bare stub -------------------------------------------


def int_contents_request(model: str, datatype: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name, values in (("INPUT0", list(range(16))), ("INPUT1", [1] * 16)):
        tensor = service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[1, 16])
        tensor.contents.int_contents[:] = values
        request.inputs.append(tensor)
    request.outputs.extend(
        service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in ("OUTPUT0", "OUTPUT1")
    )
    return request


def check_raw_add_sub(response: service_pb2.ModelInferResponse, dtype: type) -> None:
    results = [
        np.resize(np.frombuffer(raw, dtype=dtype), list(out.shape))
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    ]
    assert len(results) == 2
    np.testing.assert_array_equal(results[0][0], np.arange(16) + 1)
    np.testing.assert_array_equal(results[1][0], np.arange(16) - 1)


def test_grpc_explicit_int_content_client(triton: Server) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(triton.grpc_url))
    request = int_contents_request("simple", "INT32")
    check_raw_add_sub(stub.ModelInfer(request), np.int32)
    # raw contents next to typed contents: refused, naming the input and the model
    request.raw_input_contents.extend([np.array(list(range(8))).tobytes()])
    request.inputs[0].contents.int_contents[:] = list(range(8, 16))
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request)
    expected = "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    assert expected in str(err.value)


def test_grpc_explicit_int8_content_client(triton: Server) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(triton.grpc_url))
    request = int_contents_request("simple_int8", "INT8")
    check_raw_add_sub(stub.ModelInfer(request), np.int8)
    request.model_version = "wrong_specification"
    with pytest.raises(grpc.RpcError) as err:
        stub.ModelInfer(request)
    assert "failed to get model version from specified version string 'wrong_specification'" in str(err.value)


def test_grpc_client(triton: Server) -> None:
    """grpc_client.py: health, metadata, config and one raw-bytes inference on inception_graphdef."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(triton.grpc_url))
    name = models.INCEPTION
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
    assert stub.ServerReady(service_pb2.ServerReadyRequest()).ready
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name=name, version="")).ready
    assert stub.ServerMetadata(service_pb2.ServerMetadataRequest()).name == "triton"
    assert stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name, version="")).name == name
    assert stub.ModelConfig(service_pb2.ModelConfigRequest(name=name, version="")).config.name == name
    request = service_pb2.ModelInferRequest(model_name=name, model_version="", id="my request id")
    request.inputs.append(
        service_pb2.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 299, 299, 3])
    )
    request.outputs.append(
        service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="InceptionV3/Predictions/Softmax")
    )
    request.raw_input_contents.append(bytes(1072812 * "a", "utf-8"))
    response = stub.ModelInfer(request)
    assert response.id == "my request id"
    assert list(response.outputs[0].shape) == [1, 1001]


# --- health and metadata ---------------------------------------------------------------------------


def test_simple_http_health_metadata(triton: Server) -> None:
    client = httpclient.InferenceServerClient(triton.http_url)
    assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata()["name"] == "triton"
    assert client.get_model_metadata("simple", query_params={"test_1": 1, "test_2": 2})["name"] == "simple"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("wrong_model_name")
    assert UNKNOWN_MODEL in err.value.message()


def test_simple_grpc_health_metadata(triton: Server) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    assert client.is_server_live(headers={"test": "1", "dummy": "2"})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_server_metadata().name == "triton"
    assert client.get_model_metadata("simple", headers={"test": "1", "dummy": "2"}).name == "simple"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("wrong_model_name")
    assert UNKNOWN_MODEL in err.value.message()
    assert client.get_model_config("simple").config.name == "simple"


async def test_aio_health_metadata(triton: Server) -> None:
    """simple_http_aio_health_metadata.py and simple_grpc_aio_health_metadata.py."""
    http = httpaio.InferenceServerClient(triton.http_url)
    grpc_client = grpcaio.InferenceServerClient(triton.grpc_url)
    try:
        assert await http.is_server_live(query_params={"test_1": 1, "test_2": 2})
        assert await grpc_client.is_server_live(headers={"test": "1", "dummy": "2"})
        assert await http.is_server_ready() and await grpc_client.is_server_ready()
        assert await http.is_model_ready("simple") and await grpc_client.is_model_ready("simple")
        assert (await http.get_server_metadata())["name"] == "triton"
        assert (await grpc_client.get_server_metadata()).name == "triton"
        assert (await http.get_model_metadata("simple"))["name"] == "simple"
        assert (await grpc_client.get_model_metadata("simple")).name == "simple"
        for call in (http.get_model_metadata, grpc_client.get_model_metadata):
            with pytest.raises(InferenceServerException) as err:
                await call("wrong_model_name")
            assert UNKNOWN_MODEL in err.value.message()
        assert (await grpc_client.get_model_config("simple")).config.name == "simple"
    finally:
        await http.close()
        await grpc_client.close()


# --- sequences ---------------------------------------------------------------------------------------

VALUES = [11, 7, 5, 3, 2, 0, 1]
INT_IDS = (1000, 1001)
DYNA_STRING_ID = "1002"


def sequence_plan(dyna: bool) -> list[tuple[str, int | str, list[int]]]:
    """The three sequences the sequence clients send: (model, correlation id, values)."""
    string_model = models.SIMPLE_STRING_DYNA_SEQUENCE if dyna else models.SIMPLE_SEQUENCE
    int_model = models.SIMPLE_DYNA_SEQUENCE if dyna else models.SIMPLE_SEQUENCE
    string_id = DYNA_STRING_ID if dyna else str(uuid.uuid4())
    return [
        (int_model, INT_IDS[0], [0, *VALUES]),
        (int_model, INT_IDS[1], [100, *(-v for v in VALUES)]),
        (string_model, string_id, [20, *(-v for v in VALUES)]),
    ]


def check_sequences(dyna: bool, results: list[list[int]]) -> None:
    """The clients' expected values: INPUT (+1 at START) for the int models; for the dyna models the
    correlation ID is added at END, and the string dyna model keeps a running sum."""
    int0, int1, string0 = results
    for i in range(len(VALUES) + 1):
        expected0 = 1 if i == 0 else VALUES[i - 1]
        expected1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            expected_s = 20 if dyna else 21
        elif dyna:
            expected_s = -VALUES[i - 1] + string0[i - 1]
        else:
            expected_s = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:
            expected0 += INT_IDS[0]
            expected1 += INT_IDS[1]
            expected_s += int(DYNA_STRING_ID)
        assert (int0[i], int1[i], string0[i]) == (expected0, expected1, expected_s), f"step {i}"


def sequence_input(module: Any, value: int) -> list[Any]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
    return [tensor]


def run_sync_sequences(infer: Callable[..., Any], module: Any, dyna: bool) -> list[list[int]]:
    results = []
    for model, seq_id, values in sequence_plan(dyna):
        outputs = []
        for n, value in enumerate(values):
            result = infer(
                model_name=model,
                inputs=sequence_input(module, value),
                outputs=[module.InferRequestedOutput("OUTPUT")],
                sequence_id=seq_id,
                sequence_start=n == 0,
                sequence_end=n == len(values) - 1,
            )
            outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
        results.append(outputs)
    return results


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequence_sync_infer_client(triton: Server, protocol: str, dyna: bool) -> None:
    """simple_{http,grpc}_sequence_sync_infer_client.py, with and without -d (dynamic sequence models)."""
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(triton.http_url if protocol == "http" else triton.grpc_url)
    check_sequences(dyna, run_sync_sequences(client.infer, module, dyna))


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_simple_grpc_sequence_stream_infer_client(triton: Server, dyna: bool) -> None:
    """All three sequences on one stream; responses matched to sequences by request id."""
    plan = sequence_plan(dyna)
    done: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        client.start_stream(callback=lambda result, error: done.put(error or result))
        for model, seq_id, values in plan:
            for n, value in enumerate(values, start=1):
                client.async_stream_infer(
                    model_name=model,
                    inputs=sequence_input(grpcclient, value),
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{seq_id}_{n}",
                    sequence_id=seq_id,
                    sequence_start=n == 1,
                    sequence_end=n == len(values),
                )
        by_id: dict[str, list[int]] = {str(seq_id): [] for _, seq_id, _ in plan}
        for _ in range(sum(len(values) for _, _, values in plan)):
            item = done.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            by_id[item.get_response().id.split("_")[0]].append(int(item.as_numpy("OUTPUT")[0][0]))
    check_sequences(dyna, [by_id[str(seq_id)] for _, seq_id, _ in plan])


async def test_aio_sequence_clients(triton: Server) -> None:
    """simple_{http,grpc}_aio_sequence_sync_infer_client.py and simple_grpc_aio_sequence_stream_infer_client.py
    (with -d: the dynamic sequence models)."""
    for module, url in ((httpaio, triton.http_url), (grpcaio, triton.grpc_url)):
        client = module.InferenceServerClient(url)
        results = []
        for model, seq_id, values in sequence_plan(dyna=True):
            outputs = []
            for n, value in enumerate(values):
                result = await client.infer(
                    model_name=model,
                    inputs=sequence_input(module, value),
                    outputs=[module.InferRequestedOutput("OUTPUT")],
                    sequence_id=seq_id,
                    sequence_start=n == 0,
                    sequence_end=n == len(values) - 1,
                )
                outputs.append(int(result.as_numpy("OUTPUT")[0][0]))
            results.append(outputs)
        check_sequences(True, results)
        await client.close()

    plan = sequence_plan(dyna=True)

    async def requests() -> Any:
        for model, seq_id, values in plan:
            for n, value in enumerate(values, start=1):
                yield {
                    "model_name": model,
                    "inputs": sequence_input(grpcaio, value),
                    "outputs": [grpcaio.InferRequestedOutput("OUTPUT")],
                    "request_id": f"{seq_id}_{n}",
                    "sequence_id": seq_id,
                    "sequence_start": n == 1,
                    "sequence_end": n == len(values),
                }

    by_id: dict[str, list[int]] = {str(seq_id): [] for _, seq_id, _ in plan}
    async with grpcaio.InferenceServerClient(triton.grpc_url) as client:
        async for result, error in client.stream_infer(inputs_iterator=requests()):
            assert error is None, error
            by_id[result.get_response().id.split("_")[0]].append(int(result.as_numpy("OUTPUT")[0][0]))
            if sum(map(len, by_id.values())) == sum(len(values) for _, _, values in plan):
                break
    check_sequences(True, [by_id[str(seq_id)] for _, seq_id, _ in plan])


# --- decoupled: repeat_int32 -------------------------------------------------------------------------


def test_simple_grpc_custom_repeat(triton: Server) -> None:
    """One request, ten responses OUT = 100..109 in order (the client's delays shortened to 10 ms)."""
    count, offset = 10, 100
    arrays = (
        ("IN", np.arange(offset, offset + count, dtype=np.int32), "INT32"),
        ("DELAY", np.full([count], 10, dtype=np.uint32), "UINT32"),
        ("WAIT", np.array([10], dtype=np.uint32), "UINT32"),
    )
    inputs = []
    for name, array, datatype in arrays:
        inputs.append(grpcclient.InferInput(name, list(array.shape), datatype))
        inputs[-1].set_data_from_numpy(array)
    done: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), done))
        client.async_stream_infer(models.REPEAT_INT32, inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        received = [done.get(timeout=30) for _ in range(count)]
    for i, item in enumerate(received):
        assert not isinstance(item, InferenceServerException), item
        out = item.as_numpy("OUT")
        assert len(out) == 1 and out[0] == offset + i


# --- shared memory: simple and simple_string through system shared memory regions --------------------
# The clients' region names and keys, the keys with a suffix so that runs on one host do not meet.

SHM_CLIENTS = {"http": (httpclient, "http_url"), "grpc": (grpcclient, "grpc_url")}
SHM_CLIENTS |= {"http_aio": (httpaio, "http_url"), "grpc_aio": (grpcaio, "grpc_url")}
INT32_SIZE = IN0.nbytes


async def done(value: Any) -> Any:
    """A call's result on a sync or an aio client."""
    return await value if inspect.isawaitable(value) else value


def requested(module: Any, name: str) -> Any:
    """The HTTP clients ask for binary outputs; shared memory outputs carry no data either way."""
    if module in (httpclient, httpaio):
        return module.InferRequestedOutput(name, binary_data=True)
    return module.InferRequestedOutput(name)


def shm_status(status: Any) -> dict[str, tuple[str, int, int]]:
    """Region name -> (key, offset, byte_size), from either protocol's status."""
    if isinstance(status, list):
        return {r["name"]: (r["key"], r["offset"], r["byte_size"]) for r in status}
    return {name: (r.key, r.offset, r.byte_size) for name, r in status.regions.items()}


def shm_output(handle: Any, output: Any, offset: int = 0) -> np.ndarray:
    """An output read back from its region with the datatype and shape the response gives."""
    datatype, shape = (
        (output["datatype"], output["shape"]) if isinstance(output, dict) else (output.datatype, output.shape)
    )
    return shm.get_contents_as_numpy(handle, utils.triton_to_np_dtype(datatype), list(shape), offset=offset)


class ShmRegions:
    """Regions created, filled and registered as the clients do it; destroyed by ``close``."""

    def __init__(self, client: Any) -> None:
        self.client, self.tag, self.handles = client, uuid.uuid4().hex[:8], dict[str, Any]()

    def key(self, key: str) -> str:
        return f"{key}_{self.tag}"

    async def add(self, name: str, key: str, size: int, contents: list[Any] | None = None) -> Any:
        handle = self.handles[name] = shm.create_shared_memory_region(name, self.key(key), size)
        for offset, data in contents or []:
            shm.set_shared_memory_region(handle, [data], offset=offset)
        await done(self.client.register_system_shared_memory(name, self.key(key), size))
        return handle

    async def close(self) -> None:
        await done(self.client.unregister_system_shared_memory())
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)
        await done(self.client.close())


@pytest.mark.parametrize("kind", list(SHM_CLIENTS))
async def test_simple_shm_client(triton: Server, kind: str) -> None:
    """simple_{http,grpc}_shm_client.py and their aio versions: both inputs in one region, both outputs in another."""
    module, url = SHM_CLIENTS[kind]
    client = module.InferenceServerClient(getattr(triton, url))
    regions = ShmRegions(client)
    try:
        await done(client.unregister_system_shared_memory())
        await done(client.unregister_cuda_shared_memory())
        out = await regions.add("output_data", "/output_simple", 2 * INT32_SIZE)
        await regions.add("input_data", "/input_simple", 2 * INT32_SIZE, [(0, IN0[0]), (INT32_SIZE, ONES[0])])
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", INT32_SIZE)
        inputs[1].set_shared_memory("input_data", INT32_SIZE, offset=INT32_SIZE)
        outputs = [requested(module, "OUTPUT0"), requested(module, "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", INT32_SIZE)
        outputs[1].set_shared_memory("output_data", INT32_SIZE, offset=INT32_SIZE)
        result = await done(client.infer(model_name="simple", inputs=inputs, outputs=outputs))
        np.testing.assert_array_equal(shm_output(out, result.get_output("OUTPUT0")), IN0 + ONES)
        np.testing.assert_array_equal(shm_output(out, result.get_output("OUTPUT1"), INT32_SIZE), IN0 - ONES)
        assert shm_status(await done(client.get_system_shared_memory_status())) == {
            "input_data": (regions.key("/input_simple"), 0, 2 * INT32_SIZE),
            "output_data": (regions.key("/output_simple"), 0, 2 * INT32_SIZE),
        }
    finally:
        await regions.close()


@pytest.mark.parametrize("kind", list(SHM_CLIENTS))
async def test_simple_shm_string_client(triton: Server, kind: str) -> None:
    """simple_{http,grpc}_shm_string_client.py and their aio versions: serialised BYTES tensors, one region
    each, the output regions exactly the size of the expected results."""
    module, url = SHM_CLIENTS[kind]
    client = module.InferenceServerClient(getattr(triton, url))
    regions = ShmRegions(client)
    expected = [np.array([[str(i + d).encode() for i in range(16)]], dtype=np.object_) for d in (1, -1)]
    sizes = [utils.serialized_byte_size(utils.serialize_byte_tensor(e)) for e in expected]
    try:
        await done(client.unregister_system_shared_memory())
        await done(client.unregister_cuda_shared_memory())
        outs = [await regions.add(f"output{i}_data", f"/output{i}_simple", sizes[i]) for i in (0, 1)]
        inputs = []
        for i, data in enumerate((STRING_IN0, STRING_IN1)):
            serialized = utils.serialize_byte_tensor(data[0])
            size = utils.serialized_byte_size(serialized)
            await regions.add(f"input{i}_data", f"/input{i}_simple", size, [(0, serialized)])
            inputs.append(module.InferInput(f"INPUT{i}", [1, 16], "BYTES"))
            inputs[-1].set_shared_memory(f"input{i}_data", size)
        outputs = [requested(module, "OUTPUT0"), requested(module, "OUTPUT1")]
        for i in (0, 1):
            outputs[i].set_shared_memory(f"output{i}_data", sizes[i])
        result = await done(client.infer(model_name="simple_string", inputs=inputs, outputs=outputs))
        for i in (0, 1):
            assert shm_output(outs[i], result.get_output(f"OUTPUT{i}")).tolist() == expected[i].tolist()
        assert sorted(shm_status(await done(client.get_system_shared_memory_status()))) == [
            "input0_data", "input1_data", "output0_data", "output1_data",
        ]  # fmt: skip
    finally:
        await regions.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_reuse_infer_objects_client(triton: Server, protocol: str) -> None:
    """reuse_infer_objects_client.py: the same input and output objects sent through shared memory, then
    with the data in the request (shared memory unset)."""
    module, url = SHM_CLIENTS[protocol]
    client = module.InferenceServerClient(getattr(triton, url))
    regions = ShmRegions(client)
    try:
        client.unregister_system_shared_memory()
        client.unregister_cuda_shared_memory()
        outs = [await regions.add(f"output{i}_data", f"/output{i}_simple", INT32_SIZE) for i in (0, 1)]
        for i, data in enumerate((IN0[0], ONES[0])):
            await regions.add(f"input{i}_data", f"/input{i}_simple", INT32_SIZE, [(0, data)])
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        for i in (0, 1):
            inputs[i].set_shared_memory(f"input{i}_data", INT32_SIZE)
            outputs[i].set_shared_memory(f"output{i}_data", INT32_SIZE)
        result = client.infer(model_name="simple", inputs=inputs, outputs=outputs)
        np.testing.assert_array_equal(shm_output(outs[0], result.get_output("OUTPUT0")), IN0 + ONES)
        np.testing.assert_array_equal(shm_output(outs[1], result.get_output("OUTPUT1")), IN0 - ONES)
        inputs[0].set_data_from_numpy(IN0)
        inputs[1].set_data_from_numpy(2 * ONES)
        for output in outputs:
            output.unset_shared_memory()
        check_add_sub(client.infer(model_name="simple", inputs=inputs, outputs=outputs), IN0, 2 * ONES)
    finally:
        await regions.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_cudashm_clients_without_gpu(triton: Server, protocol: str) -> None:
    """simple_{http,grpc}_cudashm_client.py need a GPU on the client's side; here their calls are answered
    as a Triton built without GPU support answers them (with one namespace for both kinds of region)."""
    module, url = SHM_CLIENTS[protocol]
    client = module.InferenceServerClient(getattr(triton, url))
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    with pytest.raises(
        InferenceServerException,
        match="failed to register CUDA shared memory region: 'output0_data', GPUs not supported",
    ):
        client.register_cuda_shared_memory("output0_data", b"\0" * 64, 0, INT32_SIZE)
    status = client.get_cuda_shared_memory_status()
    assert status == [] if protocol == "http" else len(status.regions) == 0
    regions = ShmRegions(client)
    try:
        await regions.add("input0_data", "/input0_simple", INT32_SIZE)
        with pytest.raises(
            InferenceServerException, match="'input0_data' is registered as system shared memory, not CUDA"
        ):
            client.get_cuda_shared_memory_status("input0_data")
        client.unregister_cuda_shared_memory("input0_data")  # not a CUDA region: nothing to do
        assert list(shm_status(client.get_system_shared_memory_status())) == ["input0_data"]
    finally:
        await regions.close()


# --- model control (last: it reloads and unloads simple, then loads it back) ------------------------

BAD_OVERRIDE = '"parameters": {"config": {{"max_batch_size": "16"}}}'


def test_simple_http_model_control(triton: Server) -> None:
    """simple_http_model_control.py (and the aio one) with the index size of this repository."""
    client = httpclient.InferenceServerClient(triton.http_url)
    assert len(client.get_model_repository_index()) == len(models.ALL_MODELS)
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple", config=BAD_OVERRIDE)
    assert "failed to load" in err.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple")["max_batch_size"] == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("wrong_model_name")
    assert "failed to load" in err.value.message()
    client.load_model("simple")  # back from config.pbtxt
    assert client.get_model_config("simple")["max_batch_size"] == 8


def test_simple_grpc_model_control(triton: Server) -> None:
    """simple_grpc_model_control.py (and the aio one) with the index size of this repository."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    assert len(client.get_model_repository_index().models) == len(models.ALL_MODELS)
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple", config=BAD_OVERRIDE)
    assert "failed to load" in err.value.message()
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple").config.max_batch_size == 16
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("wrong_model_name")
    assert "failed to load" in err.value.message()
    client.load_model("simple")
    assert client.is_model_ready("simple")
