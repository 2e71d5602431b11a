"""KServe v2 gRPC messages (serve_app.protocol.grpc_codec).

Requests are built by tritonclient's own code and protos, serialised, and parsed
into ours; our responses are serialised and read back by tritonclient's
``InferResult``: the wire, not the Python classes, is what must agree.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.types import InferResponse, InferTensor, RequestedOutput
from serve_app.limits import RequestLimits
from serve_app.protocol.grpc_codec import (
    decode_model_infer_request,
    encode_model_infer_response,
    params_from_pb,
    params_to_pb,
)
from serve_app.protos import grpc_service_pb2 as pb

NP = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}
ALL_TYPES = [*NP, "BYTES"]


def sample(datatype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    n = int(np.prod(shape))
    if datatype == "BYTES":
        words = [b"", "héllo".encode(), b"\xff\x00", b"abc", b"", b"z" * 40]
        return np.array([words[i % 6] for i in range(n)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(n) % 2 == 0).reshape(shape)
    dtype = np.dtype(NP[datatype])
    if dtype.kind == "f":
        return (np.arange(n) * 0.5 - 1).astype(dtype).reshape(shape)
    info = np.iinfo(dtype)
    vals = [info.min, info.max, 0, 1, 2, 3]
    return np.array([vals[i % 6] for i in range(n)], dtype=dtype).reshape(shape)


def theirs(inputs, outputs=None, request_id="", sequence_id=0, priority=0, timeout=None, parameters=None):
    msg = _get_inference_request(
        model_name="m",
        inputs=inputs,
        model_version="2",
        request_id=request_id,
        outputs=outputs,
        sequence_id=sequence_id,
        sequence_start=sequence_id != 0,
        sequence_end=False,
        priority=priority,
        timeout=timeout,
        parameters=parameters,
    )
    return pb.ModelInferRequest.FromString(msg.SerializeToString())


def read_back(resp: InferResponse) -> grpcclient.InferResult:
    ours = encode_model_infer_response(resp)
    return grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(ours.SerializeToString()))


def typed_request(datatype: str, shape: list[int], field: str, values: list) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    io = msg.inputs.add(name="X", datatype=datatype, shape=shape)
    getattr(io.contents, field).extend(values)
    return msg


def decode_error(msg: pb.ModelInferRequest) -> str:
    with pytest.raises(InvalidArgument) as e:
        decode_model_infer_request(msg)
    return str(e.value)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_tritonclient_request_every_datatype(datatype: str) -> None:
    arr = sample(datatype)
    inp = grpcclient.InferInput("X", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr)
    req = decode_model_infer_request(theirs([inp]))
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("X", datatype, (2, 3))
    if datatype == "BYTES":
        assert t.data.tolist() == arr.tolist()
    else:
        assert t.data.dtype == arr.dtype
        np.testing.assert_array_equal(t.data, arr)


def test_tritonclient_bf16_request() -> None:
    arr = np.array([1.0, -3.0], dtype=ml_dtypes.bfloat16)
    inp = grpcclient.InferInput("X", [2], "BF16")
    inp.set_data_from_numpy(arr)
    data = decode_model_infer_request(theirs([inp])).inputs[0].data
    np.testing.assert_array_equal(data.view(ml_dtypes.bfloat16), arr)


def test_tritonclient_request_metadata() -> None:
    a = grpcclient.InferInput("A", [1, 2], "FP32")
    a.set_data_from_numpy(np.array([[1, 2]], dtype=np.float32))
    b = grpcclient.InferInput("B", [0], "BYTES")
    b.set_data_from_numpy(np.array([], dtype=object))
    outputs = [grpcclient.InferRequestedOutput("OUT0"), grpcclient.InferRequestedOutput("OUT1", class_count=2)]
    msg = theirs(
        [a, b],
        outputs=outputs,
        request_id="id-9",
        sequence_id=5,
        priority=3,
        timeout=7,
        parameters={"s": "v", "i": -4, "f": 1.5, "b": True},
    )
    req = decode_model_infer_request(msg)
    assert (req.model_name, req.model_version, req.id) == ("m", "2", "id-9")
    assert req.inputs[1].data.shape == (0,)
    assert req.outputs == [RequestedOutput("OUT0", {}), RequestedOutput("OUT1", {"classification": 2})]
    assert req.parameters == {
        "sequence_id": 5,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 3,  # tritonclient sends uint64_param
        "timeout": 7,
        "s": "v",
        "i": -4,
        "f": 1.5,
        "b": True,
    }


def test_raw_contents_are_taken_in_order_and_missing_ones_named() -> None:
    """As Triton: each input without typed contents takes the next raw entry; one left without data is named."""
    msg = pb.ModelInferRequest(model_name="add_sub")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    msg.inputs.add(name="INPUT1", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(b"\x00" * 4)
    assert decode_error(msg) == "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."
    msg.raw_input_contents.extend([b"\x00" * 4, b"\x00" * 4])  # an extra entry is ignored, as Triton does
    assert [t.name for t in decode_model_infer_request(msg).inputs] == ["INPUT0", "INPUT1"]


def test_typed_contents_with_any_raw_entry_name_the_first_input() -> None:
    """Triton's grpc_explicit_int_content_client: typed contents on both inputs plus one raw entry."""
    msg = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        msg.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    msg.raw_input_contents.append(b"\x00" * 64)
    assert decode_error(msg) == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
    )


def test_raw_contents_and_typed_contents_together() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    io = msg.inputs.add(name="X", datatype="INT32", shape=[1])
    io.contents.int_contents.append(1)
    msg.raw_input_contents.append(b"\x00" * 4)
    assert (
        decode_error(msg) == "contents field must not be specified when using raw_input_contents for 'X' for model 'm'"
    )


def test_no_data_for_input() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="INT32", shape=[1])
    assert decode_error(msg) == "unable to find data for input tensor 'X' for model 'm' in request."


def test_raw_size_mismatch() -> None:
    msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 12])
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    assert decode_error(msg) == "unexpected total byte size 12 for input 'INPUT0', expecting 64"


def test_raw_negative_shape() -> None:
    msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 4])
    msg.inputs.add(name="X", datatype="FP32", shape=[-1])
    assert decode_error(msg) == "All input dimensions should be specified for input 'X' for model 'm', got [-1]"


def test_unknown_datatype() -> None:
    msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00"])
    msg.inputs.add(name="X", datatype="FLOAT", shape=[1])
    assert decode_error(msg) == "invalid datatype 'FLOAT' for input 'X'"


def test_malformed_bytes_raw_contents() -> None:
    msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x05\x00\x00\x00ab"])
    msg.inputs.add(name="X", datatype="BYTES", shape=[1])
    assert "exceeds the end of the buffer" in decode_error(msg)


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("BOOL", "bool_contents", [True, False, True, True]),
        ("INT8", "int_contents", [-128, 127, 0, 1]),
        ("INT16", "int_contents", [-(2**15), 2**15 - 1, 0, 1]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1, 0, 1]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1, 0, 1]),
        ("UINT8", "uint_contents", [0, 255, 1, 2]),
        ("UINT16", "uint_contents", [0, 65535, 1, 2]),
        ("UINT32", "uint_contents", [0, 2**32 - 1, 1, 2]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1, 1, 2]),
        ("FP32", "fp32_contents", [0.5, -1.0, 2.0, 3.25]),
        ("FP64", "fp64_contents", [0.1, -1.0, 1e300, 3.25]),
        ("BYTES", "bytes_contents", [b"", "é".encode(), b"\xff", b"abc"]),
    ],
)
def test_typed_contents(datatype: str, field: str, values: list) -> None:
    (t,) = decode_model_infer_request(typed_request(datatype, [2, 2], field, values)).inputs
    assert t.shape == (2, 2)
    if datatype == "BYTES":
        assert t.data.reshape(-1).tolist() == values
    else:
        assert t.data.dtype == NP[datatype]
        np.testing.assert_array_equal(t.data.reshape(-1), np.array(values, dtype=NP[datatype]))


def test_typed_contents_wrong_field() -> None:
    msg = typed_request("INT64", [1], "int_contents", [1])
    assert decode_error(msg) == (
        "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'INT32', expected datatype 'INT64'"
    )


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_typed_contents_have_no_half_precision_form(datatype: str) -> None:
    assert "unexpected explicit tensor data" in decode_error(typed_request(datatype, [1], "fp32_contents", [1.0]))
    assert "no typed contents field" in decode_error(typed_request(datatype, [1], "fp32_contents", []))


def test_typed_contents_two_fields() -> None:
    msg = typed_request("INT32", [1], "int_contents", [1])
    msg.inputs[0].contents.fp32_contents.append(1.0)
    assert "binary data was already supplied" in decode_error(msg)


def test_typed_contents_wrong_count() -> None:
    assert decode_error(typed_request("INT32", [3], "int_contents", [1, 2])).startswith(
        "unexpected number of elements 2 in 'data' for input 'X', expecting 3"
    )


def test_typed_contents_out_of_range_for_narrow_type() -> None:
    assert "out of range" in decode_error(typed_request("INT8", [1], "int_contents", [300]))


def test_empty_contents_for_empty_tensor() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[0]).contents.SetInParent()
    assert decode_model_infer_request(msg).inputs[0].data.shape == (0,)


def test_reserved_and_shm_parameters_refused() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["triton_x"].bool_param = True
    assert decode_error(msg).startswith("parameter keys starting with 'triton_' are reserved")
    msg = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 4])
    shm = msg.inputs.add(name="X", datatype="FP32", shape=[1]).parameters
    shm["shared_memory_region"].string_param = "r"
    shm["shared_memory_byte_size"].int64_param = 4
    assert "system shared memory is not enabled on this server" in decode_error(msg)


def test_parameter_without_value_refused() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["p"].SetInParent()
    assert decode_error(msg) == "parameter 'p' has no value"


def test_params_round_trip() -> None:
    values = {"b": False, "i": -(2**63), "u": 2**64 - 1, "f": 0.25, "s": "é", "n": np.int32(3)}
    msg = pb.ModelInferResponse()
    params_to_pb(values, msg.parameters)
    assert msg.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
    assert msg.parameters["i"].WhichOneof("parameter_choice") == "int64_param"
    assert params_from_pb(msg.parameters) == {**values, "n": 3}
    with pytest.raises(InternalError):
        params_to_pb({"x": [1]}, msg.parameters)
    with pytest.raises(InternalError):
        params_to_pb({"x": 2**64}, msg.parameters)


# --------------------------------------------------------------------------- responses


@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_response_every_datatype_read_by_tritonclient(datatype: str) -> None:
    arr = sample(datatype)
    result = read_back(InferResponse("m", "1", outputs=[InferTensor("OUT0", datatype, (2, 3), arr)]))
    out = result.as_numpy("OUT0")
    assert out.shape == (2, 3)
    if datatype == "BYTES":
        assert out.tolist() == arr.tolist()
    else:
        assert out.dtype == arr.dtype
        np.testing.assert_array_equal(out, arr)


def test_response_bf16() -> None:
    bits = np.array([2.0, -0.25], dtype=ml_dtypes.bfloat16).view(np.uint16)
    out = read_back(InferResponse("m", "1", outputs=[InferTensor("OUT0", "BF16", (2,), bits)])).as_numpy("OUT0")
    np.testing.assert_array_equal(out.astype(np.float32), [2.0, -0.25])


def test_response_metadata_and_raw_contents() -> None:
    resp = InferResponse(
        "m",
        "4",
        id="r",
        outputs=[
            InferTensor("A", "INT32", (2,), np.array([1, 2], np.int32), parameters={"k": "v"}),
            InferTensor("B", "BYTES", (1,), np.array(["ü"], dtype=object)),
        ],
        parameters={"sequence_id": 9, "x": 0.5},
    )
    msg = encode_model_infer_response(resp)
    assert len(msg.raw_output_contents) == 2  # every output, as Triton sends them
    result = read_back(resp)
    their = result.get_response()
    assert (their.model_name, their.model_version, their.id) == ("m", "4", "r")
    assert their.parameters["sequence_id"].int64_param == 9
    assert their.parameters["x"].double_param == 0.5
    assert their.outputs[0].parameters["k"].string_param == "v"
    assert list(their.outputs[0].shape) == [2]
    np.testing.assert_array_equal(result.as_numpy("A"), [1, 2])
    assert result.as_numpy("B").tolist() == ["ü".encode()]


def test_response_shape_mismatch_is_internal() -> None:
    with pytest.raises(InternalError):
        encode_model_infer_response(
            InferResponse("m", "1", outputs=[InferTensor("O", "FP32", (4,), np.zeros(3, np.float32))])
        )


# --------------------------------------------------------------------------- request limits


def test_shape_overflow_gets_tritons_messages() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="INPUT0", datatype="FP32", shape=[2**2, 2**60 + 2])
    with pytest.raises(InvalidArgument, match=r"^byte size overflow for input 'INPUT0'"):
        decode_model_infer_request(msg)
    msg.inputs[0].shape[0] = 2**4
    with pytest.raises(InvalidArgument, match="causes total element count to exceed maximum size of"):
        decode_model_infer_request(msg)


def test_limits_are_checked_on_the_declaration_before_any_data() -> None:
    limits = RequestLimits(max_tensor_elements=10, max_inputs=2, max_outputs=1)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP32", shape=[2, 3])
    msg.inputs.add(name="B", datatype="FLOAT", shape=[5])  # never looked at: the limit comes first
    with pytest.raises(InvalidArgument) as exc:
        decode_model_infer_request(msg, limits)
    assert str(exc.value).startswith("input 'B' brings the request for model 'm' to 11 tensor elements")
    msg.inputs.add(name="C", datatype="FP32", shape=[0])
    with pytest.raises(InvalidArgument, match="has 3 inputs, more than the maximum allowed value of 2"):
        decode_model_infer_request(msg, limits)
    del msg.inputs[1:]
    msg.outputs.add(name="X")
    msg.outputs.add(name="Y")
    with pytest.raises(InvalidArgument, match="requests 2 outputs, more than the maximum allowed value of 1"):
        decode_model_infer_request(msg, limits)
    del msg.outputs[1:]
    msg.raw_input_contents.append(bytes(24))
    assert decode_model_infer_request(msg, limits).inputs[0].shape == (2, 3)
