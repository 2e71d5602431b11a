"""KServe v2 HTTP JSON + binary tensor extension (serve_app.protocol.http_codec).

Interop is proven against the real tritonclient: request bodies come from
``InferenceServerClient.generate_request_body`` and our responses are read back
with ``InferResult.from_response_body``.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from serve_app.errors import InternalError, InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor, RequestedOutput
from serve_app.limits import RequestLimits
from serve_app.protocol import http_codec
from serve_app.protocol.http_codec import decode_infer_request, encode_infer_response, error_body
from serve_app.protos import model_config_pb2 as mc

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
        words = [b"", "héllo".encode(), b"abc", "✓ü".encode(), b"", b"z" * 40]
        return np.array([words[i % len(words)] for i in range(n)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(n) % 3 == 0).reshape(shape)
    dtype = np.dtype(NP[datatype])
    if dtype.kind == "f":
        return (np.arange(n) * 0.25 - 1).astype(dtype).reshape(shape)
    hi = np.iinfo(dtype).max
    vals = [hi, 0, 1, 7, hi - 1, 3] if dtype.kind == "u" else [np.iinfo(dtype).min, -1, 0, 1, hi, 5]
    return np.array([vals[i % 6] for i in range(n)], dtype=dtype).reshape(shape)


def sig_for(inputs: dict[str, tuple[str, list[int]]], max_batch_size: int = 0, name: str = "m") -> ModelSignature:
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    for n, (dt, dims) in inputs.items():
        cfg.input.add(name=n, data_type=mc.DataType.Value("TYPE_STRING" if dt == "BYTES" else f"TYPE_{dt}"), dims=dims)
    cfg.output.add(name="OUT0", data_type=mc.TYPE_FP32, dims=[-1])
    cfg.output.add(name="OUT1", data_type=mc.TYPE_FP32, dims=[-1])
    return ModelSignature.from_config(cfg, "1")


SIG = sig_for({"INPUT0": ("FP32", [16])})


def decode(body: bytes, header_length: str | None = None, sig: ModelSignature = SIG) -> InferRequest:
    return decode_infer_request(body, header_length, model_name="m", model_version="", sig=sig)


def decode_error(body: bytes, header_length: str | None = None, sig: ModelSignature = SIG) -> str:
    with pytest.raises(InvalidArgument) as e:
        decode(body, header_length, sig)
    return str(e.value)


def client_body(*args, **kwargs) -> tuple[bytes, str | None]:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(*args, **kwargs)
    return body, (None if json_size is None else str(json_size))


def j(obj: object) -> bytes:
    return json.dumps(obj).encode()


def infer_result(body: bytes | list, header_length: int | None) -> httpclient.InferResult:
    raw = body if isinstance(body, bytes) else b"".join(bytes(c) for c in body)
    return httpclient.InferResult.from_response_body(raw, header_length=header_length)


# --------------------------------------------------------------------------- requests from tritonclient


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_tritonclient_request_every_datatype(datatype: str, binary: bool) -> None:
    arr = sample(datatype)
    inp = httpclient.InferInput("X", list(arr.shape), datatype)
    inp.set_data_from_numpy(arr, binary_data=binary)
    body, hlen = client_body([inp])
    assert (hlen is not None) == binary
    req = decode(body, hlen)
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("X", datatype, (2, 3))
    assert t.parameters == {}  # binary_data_size is not a tensor parameter
    if datatype == "BYTES":
        assert t.data.tolist() == arr.tolist()
    else:
        assert t.data.dtype == arr.dtype
        np.testing.assert_array_equal(t.data, arr)
    # no outputs requested: tritonclient asks for everything in binary
    assert req.outputs == [] and req.parameters == {"binary_data_output": True}


def test_tritonclient_bf16_binary_request() -> None:
    arr = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    inp = httpclient.InferInput("X", [1, 2], "BF16")
    inp.set_data_from_numpy(arr)
    req = decode(*client_body([inp]))
    assert req.inputs[0].data.dtype == np.uint16
    np.testing.assert_array_equal(req.inputs[0].data.view(ml_dtypes.bfloat16), arr)


def test_tritonclient_request_metadata_and_outputs() -> None:
    a = httpclient.InferInput("A", [1, 2], "INT32")
    a.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
    b = httpclient.InferInput("B", [2], "BYTES")
    b.set_data_from_numpy(np.array([b"x", b"yz"], dtype=object), binary_data=False)
    c = httpclient.InferInput("C", [1], "FP64")
    c.set_data_from_numpy(np.array([0.5]))
    outputs = [
        httpclient.InferRequestedOutput("OUT0", binary_data=False),
        httpclient.InferRequestedOutput("OUT1", class_count=3),
    ]
    body, hlen = client_body(
        [a, b, c],
        outputs=outputs,
        request_id="req-7",
        sequence_id=42,
        sequence_start=True,
        priority=2,
        timeout=100,
        parameters={"custom": "v", "n": 3, "f": 0.5, "flag": False},
    )
    req = decode(body, hlen)
    assert req.id == "req-7" and req.model_name == "m"
    assert [t.name for t in req.inputs] == ["A", "B", "C"]
    np.testing.assert_array_equal(req.inputs[0].data, [[1, 2]])
    assert req.inputs[1].data.tolist() == [b"x", b"yz"]
    assert req.inputs[2].data.tolist() == [0.5]
    assert req.outputs == [
        RequestedOutput("OUT0", {"binary_data": False}),
        RequestedOutput("OUT1", {"classification": 3, "binary_data": True}),
    ]
    assert req.parameters == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 100,
        "custom": "v",
        "n": 3,
        "f": 0.5,
        "flag": False,
    }


def test_binary_inputs_are_zero_copy_views_of_body() -> None:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    body, hlen = client_body([inp])
    data = decode(body, hlen).inputs[0].data
    assert np.shares_memory(data, np.frombuffer(body, dtype=np.uint8))


def test_binary_and_json_inputs_mixed_in_order() -> None:
    header = {
        "inputs": [
            {"name": "A", "shape": [2], "datatype": "UINT32", "parameters": {"binary_data_size": 8}},
            {"name": "J", "shape": [1], "datatype": "INT8", "data": [5]},
            {"name": "B", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}},
            {"name": "E", "shape": [0], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
        ]
    }
    h = j(header)
    body = h + struct.pack("<II", 7, 9) + b"\x01\x00\x01"
    req = decode(body, str(len(h)))
    assert req.inputs[0].data.tolist() == [7, 9]
    assert req.inputs[1].data.tolist() == [5]
    assert req.inputs[2].data.tolist() == [True, False, True]
    assert req.inputs[3].data.shape == (0,)


def test_other_tensor_parameters_are_kept() -> None:
    h = j(
        {"inputs": [{"name": "A", "shape": [1], "datatype": "INT8", "parameters": {"binary_data_size": 1, "k": "v"}}]}
    )
    assert decode(h + b"\x01", str(len(h))).inputs[0].parameters == {"k": "v"}


def test_json_body_without_header_length() -> None:
    req = decode(j({"id": "1", "inputs": [{"name": "A", "shape": [2, 1], "datatype": "FP16", "data": [[1.5], [2]]}]}))
    assert req.inputs[0].data.dtype == np.float16
    assert req.inputs[0].data.tolist() == [[1.5], [2.0]]


def test_bytearray_and_memoryview_bodies() -> None:
    h = j({"inputs": [{"name": "A", "shape": [1], "datatype": "INT32", "parameters": {"binary_data_size": 4}}]})
    raw = h + struct.pack("<i", -3)
    for body in (bytearray(raw), memoryview(raw)):
        assert decode(body, str(len(h))).inputs[0].data.tolist() == [-3]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- malformed bodies


def test_invalid_json() -> None:
    assert decode_error(b'{"inputs": [').startswith("failed to parse the request JSON buffer:")


def test_invalid_utf8_json() -> None:
    assert decode_error(b'{"id": "\xff"}').startswith("failed to parse the request JSON buffer")


def test_deeply_nested_json() -> None:
    assert decode_error(b"[" * 100000 + b"]" * 100000).startswith("JSON nesting depth exceeds maximum allowed limit")


@pytest.mark.parametrize("body", [b"[]", b"1", b'"x"', b"null"])
def test_non_object_json(body: bytes) -> None:
    assert decode_error(body).startswith("Unable to parse the request: expected a JSON object")


def test_header_length_not_an_integer() -> None:
    assert decode_error(b"{}", "abc") == "Unable to parse Inference-Header-Content-Length, got: abc"
    assert decode_error(b"{}", "1.5").startswith("Unable to parse Inference-Header-Content-Length")


def test_header_length_negative() -> None:
    assert decode_error(b"{}", "-1") == "inference header size should be in range (0, 2), got: -1"


def test_header_length_larger_than_body() -> None:
    assert decode_error(b"{}", "3") == "inference header size should be in range (0, 2), got: 3"


def test_missing_inputs() -> None:
    assert decode_error(j({})).startswith("Unable to parse 'inputs'")
    assert decode_error(j({"inputs": {}})).startswith("Unable to parse 'inputs'")
    assert decode_error(j({"inputs": [1]})).startswith("Unable to parse 'inputs'")


def test_missing_name() -> None:
    assert decode_error(j({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]})).startswith(
        "Unable to parse 'name'"
    )


def test_missing_shape() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "datatype": "FP32", "data": [1]}]}))
    assert msg.startswith("Unable to parse 'shape'") and "'A'" in msg


def test_missing_datatype() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [1], "data": [1]}]}))
    assert msg.startswith("Unable to parse 'datatype'")


def test_unknown_datatype() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [1], "datatype": "FLOAT", "data": [1]}]}))
    assert msg == "invalid datatype 'FLOAT' for input 'A'"


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", 1), ("datatype", ["FP32"]), ("shape", "1"), ("shape", [1.0]), ("shape", [True]), ("shape", [None])],
)
def test_wrong_field_types(field: str, value: object) -> None:
    item = {"name": "A", "shape": [1], "datatype": "FP32", "data": [1.0], field: value}
    assert decode_error(j({"inputs": [item]})).startswith(f"Unable to parse '{field}'")


def test_wrong_types_elsewhere() -> None:
    base = {"name": "A", "shape": [1], "datatype": "FP32", "data": [1.0]}
    assert decode_error(j({"id": 5, "inputs": [base]})).startswith("Unable to parse 'id'")
    assert decode_error(j({"inputs": [base], "outputs": {}})).startswith("Unable to parse 'outputs'")
    assert decode_error(j({"inputs": [base], "outputs": ["OUT0"]})).startswith("Unable to parse 'outputs'")
    assert decode_error(j({"inputs": [base], "outputs": [{"name": 1}]})).startswith("Unable to parse 'name'")
    assert decode_error(j({"inputs": [base], "parameters": []})).startswith("Unable to parse 'parameters'")
    assert decode_error(j({"inputs": [{**base, "parameters": 3}]})).startswith("Unable to parse 'parameters'")
    bad_bdo = j({"inputs": [base], "parameters": {"binary_data_output": 1}})
    assert decode_error(bad_bdo).startswith("Unable to parse 'binary_data_output'")
    bad_bd = j({"inputs": [base], "outputs": [{"name": "OUT0", "parameters": {"binary_data": "yes"}}]})
    assert decode_error(bad_bd).startswith("Unable to parse 'binary_data'")
    # 'classification' is checked once for both protocols (inference.classification), not by the codec.
    cls = j({"inputs": [base], "outputs": [{"name": "OUT0", "parameters": {"classification": -1}}]})
    assert decode(cls).outputs[0].parameters == {"classification": -1}


def test_data_with_wrong_value_types() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [2], "datatype": "INT32", "data": [1, "2"]}]}))
    assert msg.startswith("Unable to parse 'data'")


def test_data_with_wrong_element_count() -> None:
    """Triton's QA checks both messages verbatim."""
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [3], "datatype": "INT32", "data": [1, 2]}]}))
    assert msg == "Failed to parse 'data' field: shape does not match true shape"
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [1], "datatype": "INT32", "data": [1, 2]}]}))
    assert msg == "Unable to parse 'data': Shape does not match true shape of 'data' field"


@pytest.mark.parametrize("shape", [[-1], [2, -5]])
def test_a_negative_dimension_is_tritons_http_parser_error(shape: list[int]) -> None:
    """Triton's HTTP front end reads dimensions as unsigned integers, so its parser fails first, with a 500
    (gRPC carries int64 dimensions and gets the core's message)."""
    body = j({"inputs": [{"name": "A", "shape": shape, "datatype": "FP32", "data": [1.0]}]})
    with pytest.raises(InternalError) as info:
        decode(body, None, SIG)
    assert info.value.message == (
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"
    )


@pytest.mark.parametrize("dim", [2**63, -(2**63) - 1, 1.0, True, "1", None])
def test_shape_dims_must_be_int64(dim: object) -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [dim], "datatype": "FP32", "data": [1.0]}]}))
    assert msg == "Unable to parse 'shape': input 'A' needs a 'shape' array of 64-bit integers"


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_request_parameter_values_must_be_scalars(value: object) -> None:
    body = j({"inputs": [], "parameters": {"p": value}})
    assert (
        decode_error(body) == "parameter 'p' has invalid type. It should be either 'int', 'bool', 'float' or 'string'."
    )


def test_tensor_parameter_values_must_be_scalars() -> None:
    body = j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "data": [1.0], "parameters": {"p": [1]}}]})
    assert "parameter 'p' has invalid type" in decode_error(body)


def test_reserved_request_parameter() -> None:
    assert decode_error(j({"inputs": [], "parameters": {"triton_x": 1}})).startswith(
        "parameter keys starting with 'triton_' are reserved"
    )


def test_binary_size_overruns_body() -> None:
    h = j({"inputs": [{"name": "A", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]})
    msg = decode_error(h + b"\x00" * 10, str(len(h)))
    assert msg == "unexpected size for input 'A', expecting 6 additional bytes for model 'm'"


def test_binary_size_without_header_length() -> None:
    h = j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]})
    assert decode_error(h).startswith("unexpected size for input 'A', expecting 4 additional bytes")


def test_binary_data_left_over() -> None:
    h = j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]})
    assert decode_error(h + b"\x00" * 6, str(len(h))) == "unexpected additional input data for model 'm'"


def test_binary_data_without_binary_inputs() -> None:
    h = j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
    assert decode_error(h + b"\x00" * 4, str(len(h))) == "unexpected additional input data for model 'm'"


def test_binary_size_disagrees_with_shape() -> None:
    h = j({"inputs": [{"name": "A", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]})
    assert decode_error(h + b"\x00" * 4, str(len(h))) == "unexpected total byte size 4 for input 'A', expecting 8"


@pytest.mark.parametrize("size", [-1, 1.5, "4", True, None])
def test_binary_size_not_a_count(size: object) -> None:
    h = j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": size}}]})
    msg = decode_error(h + b"\x00" * 4, str(len(h)))
    assert "binary_data_size" in msg


def test_both_data_and_binary_data_size() -> None:
    item = {"name": "A", "shape": [1], "datatype": "FP32", "data": [1.0], "parameters": {"binary_data_size": 4}}
    h = j({"inputs": [item]})
    assert decode_error(h + b"\x00" * 4, str(len(h))) == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size' for input 'A'"
    )


def test_neither_data_nor_binary_data_size() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [1], "datatype": "FP32"}]}))
    assert msg.endswith("But no field is set for input 'A'")


def test_shared_memory_is_refused() -> None:
    item = {"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}
    assert "system shared memory is not enabled on this server" in decode_error(j({"inputs": [item]}))


def test_bf16_json_input_rejected() -> None:
    msg = decode_error(j({"inputs": [{"name": "A", "shape": [1], "datatype": "BF16", "data": [1.0]}]}))
    assert msg.startswith("receiving BF16 data via JSON is not supported")


def test_malformed_binary_bytes_input() -> None:
    h = j({"inputs": [{"name": "A", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 5}}]})
    msg = decode_error(h + struct.pack("<I", 1) + b"a", str(len(h)))
    assert msg == "expected 2 string elements for inference input 'A', got 1"


# --------------------------------------------------------------------------- raw binary request


def test_raw_binary_request_fixed_shape() -> None:
    data = np.arange(16, dtype=np.float32)
    req = decode(data.tobytes(), "0", sig_for({"X": ("FP32", [16])}, max_batch_size=4))
    (t,) = req.inputs
    assert (t.name, t.datatype, t.shape) == ("X", "FP32", (1, 16))
    np.testing.assert_array_equal(t.data, data.reshape(1, 16))
    assert req.outputs == [] and req.parameters == {"binary_data_output": True}


def test_raw_binary_request_variable_dim() -> None:
    data = np.arange(12, dtype=np.int16)
    req = decode(data.tobytes(), "0", sig_for({"X": ("INT16", [-1, 3])}))
    assert req.inputs[0].shape == (4, 3)
    np.testing.assert_array_equal(req.inputs[0].data.reshape(-1), data)


def test_raw_binary_request_size_not_a_multiple() -> None:
    msg = decode_error(b"\x00" * 10, "0", sig_for({"X": ("INT16", [-1, 3])}))
    assert msg == "unexpected total byte size 10 for input 'X', expecting 6"


def test_raw_binary_request_wrong_fixed_size() -> None:
    msg = decode_error(b"\x00" * 12, "0", sig_for({"X": ("FP32", [16])}, max_batch_size=1))
    assert msg == "unexpected total byte size 12 for input 'X', expecting 64"


def test_raw_binary_request_bytes() -> None:
    req = decode("héllo".encode(), "0", sig_for({"S": ("BYTES", [1])}, max_batch_size=2))
    assert req.inputs[0].shape == (1, 1)
    assert req.inputs[0].data.tolist() == [["héllo".encode()]]


def test_raw_binary_request_bytes_needs_shape_one() -> None:
    msg = decode_error(b"abc", "0", sig_for({"S": ("BYTES", [-1])}))
    assert msg == "For BYTE datatype raw input 'S', the model must have input shape [1]"


def test_raw_binary_request_needs_one_input() -> None:
    sig = sig_for({"A": ("FP32", [1]), "B": ("FP32", [1])}, name="add_sub")
    assert decode_error(b"\x00" * 8, "0", sig) == (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model configuration"
    )


def test_raw_binary_request_two_variable_dims() -> None:
    msg = decode_error(b"\x00" * 8, "0", sig_for({"X": ("FP32", [-1, -1])}))
    assert msg.startswith("The shape of the raw input 'X' can not be deduced")


def test_raw_binary_request_response_is_all_binary() -> None:
    req = decode(np.zeros(4, np.float32).tobytes(), "0", sig_for({"X": ("FP32", [4])}))
    resp = InferResponse("m", "1", outputs=[InferTensor("OUT0", "FP32", (3, 1), np.ones((3, 1), np.float32))])
    body, hlen = encode_infer_response(resp, req)
    assert isinstance(body, list) and hlen == len(body[0])
    doc = json.loads(body[0])
    assert doc["outputs"] == [
        {"name": "OUT0", "datatype": "FP32", "shape": [3, 1], "parameters": {"binary_data_size": 12}}
    ]


# --------------------------------------------------------------------------- responses


def response_for(datatype: str, arr: np.ndarray, name: str = "OUT0") -> InferResponse:
    return InferResponse("m", "1", outputs=[InferTensor(name, datatype, tuple(arr.shape), arr)])


def request_with(binary: bool | None = None, default: bool | None = None, rid: str = "") -> InferRequest:
    params = {} if default is None else {"binary_data_output": default}
    outs = [] if binary is None else [RequestedOutput("OUT0", {"binary_data": binary})]
    return InferRequest("m", id=rid, outputs=outs, parameters=params)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL_TYPES)
def test_response_every_datatype_read_by_tritonclient(datatype: str, binary: bool) -> None:
    arr = sample(datatype)
    body, hlen = encode_infer_response(response_for(datatype, arr), request_with(binary=binary))
    assert (hlen is not None) == binary
    result = infer_result(body, hlen)
    out = result.as_numpy("OUT0")
    assert out.shape == arr.shape
    if datatype == "BYTES":
        expected = arr.tolist() if binary else [[v.decode() for v in row] for row in arr.tolist()]
        assert out.tolist() == expected
    else:
        np.testing.assert_array_equal(out, arr)
        assert out.dtype == arr.dtype
    entry = result.get_output("OUT0")
    if binary:
        assert "data" not in entry and set(entry["parameters"]) == {"binary_data_size"}
    else:
        assert "parameters" not in entry  # perf_analyzer rejects parameters without binary_data_size


def test_response_bf16_binary() -> None:
    bits = np.array([1.0, -0.5], dtype=ml_dtypes.bfloat16).view(np.uint16)
    body, hlen = encode_infer_response(response_for("BF16", bits), request_with(binary=True))
    out = infer_result(body, hlen).as_numpy("OUT0")
    np.testing.assert_array_equal(out.astype(np.float32), [1.0, -0.5])


def test_response_bf16_json_rejected() -> None:
    bits = np.zeros(2, dtype=np.uint16)
    with pytest.raises(InvalidArgument, match="sending BF16 data via JSON is not supported"):
        encode_infer_response(response_for("BF16", bits), request_with(binary=False))


def test_response_invalid_utf8_bytes_as_json() -> None:
    arr = np.array([b"\xff\xfe"], dtype=object)
    with pytest.raises(InvalidArgument, match="not valid UTF-8"):
        encode_infer_response(response_for("BYTES", arr), request_with(binary=False))
    body, hlen = encode_infer_response(response_for("BYTES", arr), request_with(binary=True))
    assert infer_result(body, hlen).as_numpy("OUT0").tolist() == [b"\xff\xfe"]


def test_response_str_elements() -> None:
    arr = np.array(["ü", "x"], dtype=object)
    body, hlen = encode_infer_response(response_for("BYTES", arr), request_with(binary=False))
    assert infer_result(body, hlen).as_numpy("OUT0").tolist() == ["ü", "x"]


def test_response_fp16_json_numbers() -> None:
    arr = np.array([0.1, 2.5], dtype=np.float16)
    body, _ = encode_infer_response(response_for("FP16", arr), request_with(binary=False))
    assert json.loads(body)["outputs"][0]["data"] == [float(np.float16(0.1)), 2.5]


def test_response_nan_and_inf_as_json() -> None:
    arr = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    body, hlen = encode_infer_response(response_for("FP32", arr), request_with(binary=False))
    out = infer_result(body, hlen).as_numpy("OUT0")
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf


@pytest.mark.parametrize(
    ("binary", "default", "expect_binary"),
    [
        (None, None, False),
        (None, True, True),
        (None, False, False),
        (True, None, True),
        (False, True, False),  # the per-output setting wins
        (True, False, True),
    ],
)
def test_binary_selection(binary: bool | None, default: bool | None, expect_binary: bool) -> None:
    arr = np.arange(3, dtype=np.int32)
    body, hlen = encode_infer_response(response_for("INT32", arr), request_with(binary, default))
    assert (hlen is not None) == expect_binary
    np.testing.assert_array_equal(infer_result(body, hlen).as_numpy("OUT0"), arr)


def test_response_mixed_outputs_and_metadata() -> None:
    req = InferRequest(
        "m",
        id="abc",
        outputs=[RequestedOutput("A", {"binary_data": True}), RequestedOutput("B", {"binary_data": False})],
    )
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.array([True, False])
    c = np.array([b"x", b""], dtype=object)
    resp = InferResponse(
        "m",
        "3",
        id="abc",
        outputs=[
            InferTensor("A", "FP32", (2, 2), a),
            InferTensor("B", "BOOL", (2,), b),
            InferTensor("C", "BYTES", (2,), c),
        ],
        parameters={"sequence_id": np.int64(4), "done": True},
    )
    body, hlen = encode_infer_response(resp, req)
    assert isinstance(body, list) and len(body) == 2  # JSON + A (C defaults to JSON)
    result = infer_result(body, hlen)
    doc = result.get_response()
    assert doc["model_name"] == "m" and doc["model_version"] == "3" and doc["id"] == "abc"
    assert doc["parameters"] == {"sequence_id": 4, "done": True}
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    assert result.as_numpy("B").tolist() == [True, False]
    assert result.as_numpy("C").tolist() == ["x", ""]
    assert list(doc) == ["model_name", "model_version", "id", "parameters", "outputs"]


def test_response_omits_id_and_parameters_when_absent() -> None:
    body, hlen = encode_infer_response(response_for("INT8", np.zeros(1, np.int8)), request_with(binary=False))
    assert hlen is None and isinstance(body, bytes)
    assert b" " not in body  # compact separators
    assert json.loads(body) == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "OUT0", "datatype": "INT8", "shape": [1], "data": [0]}],
    }


def test_response_shape_mismatch_is_internal() -> None:
    resp = InferResponse("m", "1", outputs=[InferTensor("OUT0", "FP32", (3,), np.zeros(2, np.float32))])
    with pytest.raises(InternalError):
        encode_infer_response(resp, request_with())


def test_response_empty_binary_output() -> None:
    arr = np.zeros((0, 4), np.float32)
    body, hlen = encode_infer_response(response_for("FP32", arr), request_with(binary=True))
    assert infer_result(body, hlen).as_numpy("OUT0").shape == (0, 4)


def test_full_round_trip_with_tritonclient() -> None:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    req = decode(*client_body([inp], outputs=[httpclient.InferRequestedOutput("OUT0")], request_id="r1"))
    doubled = req.inputs[0].data * 2
    resp = InferResponse("m", "1", id=req.id, outputs=[InferTensor("OUT0", "FP32", (1, 16), doubled)])
    result = infer_result(*encode_infer_response(resp, req))
    np.testing.assert_array_equal(result.as_numpy("OUT0"), doubled)
    assert result.get_response()["id"] == "r1"


def test_error_body() -> None:
    assert json.loads(error_body("bad 'x' ✓")) == {"error": "bad 'x' ✓"}


# --------------------------------------------------------------------------- request limits


def test_limits_are_checked_on_the_declaration_before_any_data() -> None:
    limits = RequestLimits(max_tensor_elements=10, max_inputs=2, max_outputs=1, max_json_depth=6)
    small = {"name": "A", "shape": [2, 3], "datatype": "FP32", "data": [1.0] * 6}
    big = {"name": "B", "shape": [5], "datatype": "FLOAT", "data": "not even a list"}  # the limit comes first
    body = j({"inputs": [small, big]})
    with pytest.raises(InvalidArgument) as exc:
        decode_infer_request(body, None, model_name="m", model_version="", sig=SIG, limits=limits)
    assert str(exc.value).startswith("input 'B' brings the request for model 'm' to 11 tensor elements")
    with pytest.raises(InvalidArgument, match="has 3 inputs, more than the maximum allowed value of 2"):
        decode_infer_request(j({"inputs": [small] * 3}), None, model_name="m", model_version="", sig=SIG, limits=limits)
    many_outputs = j({"inputs": [small], "outputs": [{"name": "X"}, {"name": "Y"}]})
    with pytest.raises(InvalidArgument, match="requests 2 outputs, more than the maximum allowed value of 1"):
        decode_infer_request(many_outputs, None, model_name="m", model_version="", sig=SIG, limits=limits)
    nested = j({"inputs": [{**small, "data": [[[[[[[[1.0] * 6]]]]]]]}]})  # {, [, {, then 8 levels of data
    with pytest.raises(InvalidArgument, match=r"JSON nesting depth exceeds maximum allowed limit \(6\)"):
        decode_infer_request(nested, None, model_name="m", model_version="", sig=SIG, limits=limits)
    assert decode_infer_request(j({"inputs": [small]}), None, model_name="m", model_version="", sig=SIG).inputs


def test_shape_overflow_gets_tritons_messages() -> None:
    """Triton's QA (test_buffer_size_overflow): element count, then byte size, overflowing int64."""
    for first, message in (
        (2**4, "causes total element count to exceed maximum size of"),
        (2**2, "byte size overflow for input"),
    ):
        body = j({"inputs": [{"name": "INPUT0", "shape": [first, 2**60 + 2], "datatype": "FP32", "data": [1.0]}]})
        assert message in decode_error(body)


def test_raw_binary_request_counts_its_elements() -> None:
    limits = RequestLimits(max_tensor_elements=16)
    assert decode(bytes(64), "0").inputs[0].shape == (16,)
    with pytest.raises(InvalidArgument, match="to 32 tensor elements"):
        decode_infer_request(
            bytes(128), "0", model_name="m", model_version="", sig=sig_for({"X": ("FP32", [-1])}), limits=limits
        )


def test_deep_json_is_refused_before_the_parser_recurses() -> None:
    assert decode_error(b"[" * 100_000).startswith("JSON nesting depth exceeds maximum allowed limit (100)")


def test_binary_data_output_is_the_default_of_unlisted_outputs_only() -> None:
    """Triton: a listed output follows its own binary_data (JSON when absent), whatever binary_data_output says."""
    out = InferResponse("m", "1", outputs=[InferTensor("A", "FP32", (1,), np.ones(1, np.float32))])
    out.outputs.append(InferTensor("B", "FP32", (1,), np.ones(1, np.float32)))
    listed = InferRequest("m", parameters={"binary_data_output": True})
    listed.outputs = [RequestedOutput("A", {"binary_data": False}), RequestedOutput("B")]
    _, json_length = encode_infer_response(out, listed)
    assert json_length is None  # both as JSON
    unlisted = InferRequest("m", parameters={"binary_data_output": True})
    _, json_length = encode_infer_response(out, unlisted)
    assert json_length is not None  # both binary


@pytest.mark.parametrize(
    "doc",
    [
        {"outputs": [{"name": "O", "datatype": "FP32", "shape": [2], "data": [0.1, 1e-05]}]},
        {"error": "model 'ü' not found"},
        {"a": [1, 2**63 - 1], "b": [True, False], "c": ["x"], "d": [], "e": {"f": [[1.5], [2.5]]}},
    ],
)
def test_dumps_is_json(doc: dict[str, object]) -> None:
    assert json.loads(http_codec.dumps(doc)) == doc


@pytest.mark.parametrize(
    "doc", [{"data": [1.0, float("nan")]}, {"data": [[float("inf")]]}, {"p": float("-inf")}, {"big": 2**70}]
)
def test_dumps_falls_back_where_orjson_differs(doc: dict[str, object]) -> None:
    """NaN and infinities stay literals (as Python's JSON writes them and tritonclient reads them); big ints stay."""
    assert http_codec.dumps(doc) == json.dumps(doc, separators=(",", ":")).encode()


@pytest.mark.parametrize("doc", [{"model_name": "null"}, {"data": [None, 1.5]}, {"nullable": [2.5]}])
def test_dumps_of_a_finite_document_with_null_in_its_text(doc: dict[str, object]) -> None:
    assert http_codec.dumps(doc) == json.dumps(doc, separators=(",", ":")).encode()


def test_parse_accepts_what_pythons_json_accepts() -> None:
    assert http_codec.parse_json(b'{"data": [NaN, 1]}')["data"][1] == 1  # type: ignore[index]
    with pytest.raises(InvalidArgument, match="failed to parse the request JSON buffer"):
        http_codec.parse_json(b'{"data": [1,')
