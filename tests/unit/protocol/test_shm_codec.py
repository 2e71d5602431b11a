"""Tensors in system shared memory through both codecs (serve_app.protocol.shm_codec and the HTTP / gRPC
parameter parsing), with requests built by the stock tritonclient."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as tpb

from serve_app.errors import InternalError, InvalidArgument, NotFound
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.protocol import grpc_codec, http_codec, shm_codec
from serve_app.protos import grpc_service_pb2 as pb
from serve_app.shared_memory import MemoryStore, SharedMemory, ShmRef
from tests.support.shm import key, shm_object
from tests.unit.protocol.test_http_codec import SIG

__all__ = ["shm_object"]


@pytest.fixture
def shm(shm_object: shared_memory.SharedMemory) -> Iterator[SharedMemory]:
    registry = SharedMemory(MemoryStore())
    registry.register("in", key(shm_object), 0, 1024)
    registry.register("out", key(shm_object), 1024, 1024)
    yield registry
    registry.close()


def put(obj: shared_memory.SharedMemory, at: int, data: bytes) -> None:
    obj.buf[at : at + len(data)] = data


def http_body(inputs: list[httpclient.InferInput], outputs: list[httpclient.InferRequestedOutput]) -> bytes:
    body, _ = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body


def test_input_is_a_read_only_view_of_the_region(shm: SharedMemory, shm_object: shared_memory.SharedMemory) -> None:
    x = np.arange(16, dtype=np.float32)
    put(shm_object, 64, x.tobytes())
    arr = shm_codec.input_array(shm, "m", "INPUT0", "FP32", (16,), ShmRef("in", 64, 64))
    np.testing.assert_array_equal(arr, x)
    assert not arr.flags.writeable
    put(shm_object, 64, np.float32(7).tobytes())  # no copy: the client's memory is what the model reads
    assert arr[0] == 7


def test_byte_size_must_match_the_shape(shm: SharedMemory) -> None:
    with pytest.raises(InvalidArgument) as err:
        shm_codec.input_array(shm, "m", "INPUT0", "FP32", (16,), ShmRef("in", 0, 128))
    assert err.value.message == "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 64, got 128"


def test_bytes_input_and_output(shm: SharedMemory, shm_object: shared_memory.SharedMemory) -> None:
    raw = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    put(shm_object, 0, raw)
    arr = shm_codec.input_array(shm, "m", "S", "BYTES", (2,), ShmRef("in", 0, len(raw)))
    assert arr.tolist() == [b"hi", b""]
    req = InferRequest("m", outputs=[RequestedOutput("S", {"shared_memory_region": "out"})])
    req.outputs[0].parameters["shared_memory_byte_size"] = 64
    assert shm_codec.write_outputs(shm, req, InferResponse("m", "1", outputs=[InferTensor("S", "BYTES", (2,), arr)]))
    assert bytes(shm_object.buf[1024 : 1024 + len(raw)]) == raw


def test_output_too_small_is_triton_error(shm: SharedMemory) -> None:
    req = InferRequest("m", outputs=[RequestedOutput("OUT0", {"shared_memory_region": "out"})])
    req.outputs[0].parameters["shared_memory_byte_size"] = 8
    resp = InferResponse("m", "1", outputs=[InferTensor("OUT0", "FP32", (4,), np.zeros(4, np.float32))])
    with pytest.raises(InternalError) as err:
        shm_codec.write_outputs(shm, req, resp)
    assert err.value.message == (
        "shared memory size specified with the request for output 'OUT0' (8 bytes) should be at least 16 bytes "
        "to hold the results"
    )


def test_http_round_trip(shm: SharedMemory, shm_object: shared_memory.SharedMemory) -> None:
    x = np.arange(16, dtype=np.float32)
    put(shm_object, 0, x.tobytes())
    inp = httpclient.InferInput("INPUT0", [16], "FP32")
    inp.set_shared_memory("in", 64)
    out = httpclient.InferRequestedOutput("OUT0")
    out.set_shared_memory("out", 64, offset=32)
    req = http_codec.decode_infer_request(
        http_body([inp], [out]), None, model_name="m", model_version="", sig=SIG, shm=shm
    )
    assert req.inputs[0].parameters == {}
    np.testing.assert_array_equal(req.inputs[0].data, x)
    resp = InferResponse("m", "1", outputs=[InferTensor("OUT0", "FP32", (16,), x * 2)])
    body, header_length = http_codec.encode_infer_response(resp, req, shm)
    assert header_length is None
    assert json.loads(body)["outputs"] == [{"name": "OUT0", "datatype": "FP32", "shape": [16]}]
    np.testing.assert_array_equal(np.frombuffer(shm_object.buf[1056 : 1056 + 64], np.float32), x * 2)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"shared_memory_region": 3}, "Unable to parse 'shared_memory_region'"),
        ({"shared_memory_region": "in", "shared_memory_offset": -1}, "Unable to parse 'shared_memory_offset'"),
        ({"shared_memory_region": "in", "shared_memory_byte_size": "x"}, "Unable to parse 'shared_memory_byte_size'"),
        (
            {"shared_memory_region": "nope", "shared_memory_byte_size": 64},
            "Unable to find shared memory region: 'nope'",
        ),
        (
            {"shared_memory_region": "in", "shared_memory_offset": 1000, "shared_memory_byte_size": 64},
            "Invalid offset + byte size for shared memory region: 'in'",
        ),
    ],
)
def test_http_input_errors(shm: SharedMemory, params: dict[str, object], message: str) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "parameters": params}]})
    with pytest.raises((InvalidArgument, NotFound)) as err:
        http_codec.decode_infer_request(body.encode(), None, model_name="m", model_version="", sig=SIG, shm=shm)
    assert err.value.message == message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"classification": 2}, "Output can't set both 'shared_memory_region' and 'classification'"),
        ({"binary_data": True}, "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ],
)
def test_http_output_conflicts(shm: SharedMemory, extra: dict[str, object], message: str) -> None:
    params = {"shared_memory_region": "out", "shared_memory_byte_size": 64, **extra}
    body = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16], "data": [0.0] * 16}],
            "outputs": [{"name": "OUT0", "parameters": params}],
        }
    )
    with pytest.raises(InvalidArgument) as err:
        http_codec.decode_infer_request(body.encode(), None, model_name="m", model_version="", sig=SIG, shm=shm)
    assert err.value.message == message


def grpc_request(
    inputs: list[grpcclient.InferInput], outputs: list[grpcclient.InferRequestedOutput]
) -> pb.ModelInferRequest:
    msg = tpb.ModelInferRequest(model_name="m")
    msg.inputs.extend([i._get_tensor() for i in inputs])
    msg.outputs.extend([o._get_tensor() for o in outputs])
    for i in inputs:
        if i._get_content() is not None:
            msg.raw_input_contents.append(i._get_content())
    return pb.ModelInferRequest.FromString(msg.SerializeToString())


def test_grpc_round_trip(shm: SharedMemory, shm_object: shared_memory.SharedMemory) -> None:
    x = np.arange(16, dtype=np.float32)
    put(shm_object, 0, x.tobytes())
    in_shm = grpcclient.InferInput("INPUT0", [16], "FP32")
    in_shm.set_shared_memory("in", 64)
    in_raw = grpcclient.InferInput("INPUT1", [2], "INT32")
    in_raw.set_data_from_numpy(np.array([1, 2], np.int32))
    out = grpcclient.InferRequestedOutput("OUT0")
    out.set_shared_memory("out", 64)
    req = grpc_codec.decode_model_infer_request(grpc_request([in_shm, in_raw], [out]), shm=shm)
    np.testing.assert_array_equal(req.inputs[0].data, x)
    assert req.inputs[0].parameters == {}
    assert req.inputs[1].data.tolist() == [1, 2]  # the raw entry goes to the input without shared memory
    resp = InferResponse(
        "m",
        "1",
        outputs=[
            InferTensor("OUT0", "FP32", (16,), x + 1),
            InferTensor("OUT1", "FP32", (1,), np.ones(1, np.float32)),
        ],
    )
    msg = grpc_codec.encode_model_infer_response(resp, req, shm)
    assert list(msg.raw_output_contents) == [b"", np.ones(1, np.float32).tobytes()]
    result = grpcclient.InferResult(tpb.ModelInferResponse.FromString(msg.SerializeToString()))
    assert result.get_output("OUT0").shape == [16]
    np.testing.assert_array_equal(np.frombuffer(shm_object.buf[1024 : 1024 + 64], np.float32), x + 1)


def _grpc_input(**params: tuple[str, object]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="INPUT0", datatype="FP32", shape=[16])
    for k, (field, value) in params.items():
        setattr(tensor.parameters[k], field, value)
    return msg


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (
            _grpc_input(shared_memory_region=("int64_param", 1), shared_memory_byte_size=("int64_param", 64)),
            "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param.",
        ),
        (
            _grpc_input(shared_memory_region=("string_param", "in")),
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            "'INPUT0'",
        ),
        (
            _grpc_input(shared_memory_offset=("int64_param", 0)),
            "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'",
        ),
        (
            _grpc_input(shared_memory_region=("string_param", "in"), shared_memory_byte_size=("uint64_param", 64)),
            "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', expected int64_param.",
        ),
    ],
)
def test_grpc_parameter_errors(shm: SharedMemory, msg: pb.ModelInferRequest, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        grpc_codec.decode_model_infer_request(msg, shm=shm)
    assert err.value.message == message


def test_grpc_contents_and_shared_memory_refused(shm: SharedMemory) -> None:
    msg = _grpc_input(shared_memory_region=("string_param", "in"), shared_memory_byte_size=("int64_param", 64))
    msg.inputs[0].contents.fp32_contents.extend([0.0] * 16)
    with pytest.raises(InvalidArgument) as err:
        grpc_codec.decode_model_infer_request(msg, shm=shm)
    assert err.value.message == (
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for model 'm'"
    )
