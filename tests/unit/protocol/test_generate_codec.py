"""Triton's generate extension (serve_app.protocol.generate_codec): a flat JSON object in and out.

The mapping rules and messages are Triton's (``http_server.cc``, ``GenerateRequestClass``): a key
naming a model input becomes that tensor, shaped from the metadata shape; any other key (and each key
of the nested ``"parameters"`` object) becomes a request parameter.  Responses put reserved keys, the
response's parameters and its outputs side by side, one element rendering as a scalar.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from serve_app.config import parse_config
from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor
from serve_app.protocol.generate_codec import decode_generate_request, encode_generate_response, generate_json

CONFIG = """
name: "llm"
backend: "python"
max_batch_size: 8
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "tokens" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "pair" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "grid" data_type: TYPE_INT64 dims: [ -1, 2 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "logits" data_type: TYPE_FP32 dims: [ -1 ] }
]
"""


def signature(text: str = CONFIG, model: str = "llm") -> ModelSignature:
    return ModelSignature.from_config(parse_config(text, model=model, path="config.pbtxt"), "1")


SIG = signature()
UNBATCHED = signature(
    """
    name: "flat"
    backend: "python"
    input [
      { name: "x" data_type: TYPE_FP32 dims: [ -1 ] },
      { name: "one" data_type: TYPE_INT32 dims: [ 1 ] },
      { name: "id" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """,
    model="flat",
)


def decode(obj: Any, sig: ModelSignature = SIG) -> InferRequest:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return decode_generate_request(body, model_name=sig.name, model_version="", sig=sig)


def decode_error(obj: Any, sig: ModelSignature = SIG) -> str:
    with pytest.raises(InvalidArgument) as err:
        decode(obj, sig)
    return err.value.message


def tensors(request: InferRequest) -> dict[str, InferTensor]:
    return {t.name: t for t in request.inputs}


# -- requests ----------------------------------------------------------------------------------------
def test_inputs_and_parameters() -> None:
    request = decode({"text_input": "hello", "max_tokens": 16, "temperature": 0.5, "ignore_eos": True, "mode": "x"})
    assert (request.model_name, request.model_version, request.id) == ("llm", "", "")
    (text,) = request.inputs
    assert (text.name, text.datatype, text.shape) == ("text_input", "BYTES", (1, 1))
    assert text.data.tolist() == [[b"hello"]]
    assert request.parameters == {"max_tokens": 16, "temperature": 0.5, "ignore_eos": True, "mode": "x"}


@pytest.mark.parametrize(
    ("name", "value", "shape"),
    [
        ("text_input", "hi", (1, 1)),  # a scalar fills [-1, 1]
        ("text_input", ["a", "b", "c"], (3, 1)),  # the only wildcard takes what the fixed dims leave
        ("tokens", [1, 2, 3], (1, 3)),  # [-1, -1]: the innermost wildcard takes the count, the others are 1
        ("tokens", 7, (1, 1)),
        ("pair", [1.5, 2.5], (1, 2)),
        ("grid", [1, 2, 3, 4, 5, 6], (1, 3, 2)),  # [-1, -1, 2]
    ],
)
def test_shapes_come_from_the_metadata_shape(name: str, value: Any, shape: tuple[int, ...]) -> None:
    (tensor,) = decode({name: value}).inputs
    assert tensor.shape == shape
    assert tensor.data.shape == shape


def test_datatypes_come_from_the_metadata() -> None:
    got = tensors(decode({"tokens": [1, 2], "pair": [1, 2], "stream": False, "text_input": "é"}))
    assert got["tokens"].data.dtype == np.int32
    assert got["pair"].data.dtype == np.float32
    assert got["stream"].datatype == "BOOL" and got["stream"].data.tolist() == [[False]]
    assert got["text_input"].data.tolist() == [["é".encode()]]


def test_unbatched_model_shapes() -> None:
    got = tensors(decode({"x": [1.0, 2.0, 3.0], "one": 4}, UNBATCHED))
    assert got["x"].shape == (3,)
    assert got["one"].shape == (1,)


@pytest.mark.parametrize(
    ("name", "value"),
    [("pair", [1.0, 2.0, 3.0]), ("pair", 1.0), ("grid", [1, 2, 3]), ("tokens", [[1, 2]]), ("tokens", [{"a": 1}])],
)
def test_values_that_do_not_fit_the_shape(name: str, value: Any) -> None:
    assert decode_error({name: value}) == f"The schema can not convert input '{name}' to tensor with proper shape"


def test_fixed_dims_of_an_unbatched_model() -> None:
    assert decode_error({"one": [1, 2]}, UNBATCHED) == (
        "The schema can not convert input 'one' to tensor with proper shape"
    )


def test_values_of_the_wrong_type_for_an_input() -> None:
    assert "'stream'" in decode_error({"stream": 1})
    assert "'tokens'" in decode_error({"tokens": ["a"]})


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}, None])
def test_parameters_must_be_scalars(value: Any) -> None:
    assert decode_error({"k": value}) == (
        "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def test_nested_parameters_follow_the_same_rule() -> None:
    """Inside ``"parameters"`` a key naming an input still becomes that input (vLLM's ``stream``)."""
    request = decode({"text_input": "hi", "parameters": {"stream": True, "top_k": 3, "top_p": 0.9, "tag": "t"}})
    got = tensors(request)
    assert set(got) == {"text_input", "stream"}
    assert got["stream"].data.tolist() == [[True]]
    assert request.parameters == {"top_k": 3, "top_p": 0.9, "tag": "t"}


def test_nested_parameters_must_be_an_object() -> None:
    assert decode_error({"parameters": [1, 2]}).startswith("Expected JSON object for keyword: 'parameters': ")
    assert decode_error({"parameters": "x"}).startswith("Expected JSON object for keyword: 'parameters': ")


def test_nested_errors_are_prefixed() -> None:
    assert decode_error({"parameters": {"k": [1]}}) == (
        "Converting keyword: 'parameters': parameter 'k' has invalid type. It should be either 'int', 'bool', or "
        "'string'."
    )
    assert decode_error({"parameters": {"pair": [1.0]}}) == (
        "Converting keyword: 'parameters': The schema can not convert input 'pair' to tensor with proper shape"
    )


def test_an_input_named_parameters_clashes_with_the_nested_object() -> None:
    sig = signature(
        """
        name: "p"
        backend: "python"
        input [ { name: "parameters" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """,
        model="p",
    )
    assert decode_error({"parameters": {"a": 1}}, sig) == (
        "Keyword 'parameters' for nested schema also given as input tensor name"
    )


def test_id_is_the_request_id_and_a_parameter() -> None:
    request = decode({"id": "42", "text_input": "x"})
    assert request.id == "42"
    assert request.parameters == {"id": "42"}


def test_id_must_be_a_string() -> None:
    assert decode_error({"id": 42}) == "Unable to parse 'id'"
    assert decode_error({"id": None}) == "Unable to parse 'id'"


def test_id_naming_an_input_becomes_that_input() -> None:
    request = decode({"id": "r1", "x": [1.0]}, UNBATCHED)
    assert request.id == "r1"
    assert tensors(request)["id"].data.tolist() == [b"r1"]
    assert "id" not in request.parameters


def test_body_must_be_an_object() -> None:
    assert decode(b"").inputs == []
    assert decode_error([1, 2]).startswith("Unable to parse the request")
    with pytest.raises(InvalidArgument):
        decode(b"{not json")


# -- responses ---------------------------------------------------------------------------------------
def response(**kwargs: Any) -> InferResponse:
    return InferResponse(model_name="llm", model_version="1", **kwargs)


def test_response_reserved_keys() -> None:
    assert encode_generate_response(response()) == {"model_name": "llm", "model_version": "1"}
    assert encode_generate_response(response(id="42")) == {"id": "42", "model_name": "llm", "model_version": "1"}


def test_response_outputs_and_parameters() -> None:
    text = InferTensor("text_output", "BYTES", (1, 1), np.array([["héllo".encode()]], dtype=object))
    logits = InferTensor("logits", "FP32", (2, 2), np.array([[0.5, 1.0], [1.5, 2.0]], dtype=np.float32))
    done = InferTensor("done", "BOOL", (1,), np.array([True]))
    out = encode_generate_response(
        response(outputs=[text, logits, done], parameters={"count": 3, "finish": "stop", "p": 0.25})
    )
    assert out == {
        "model_name": "llm",
        "model_version": "1",
        "count": 3,
        "finish": "stop",
        "p": 0.25,
        "text_output": "héllo",  # one element: a scalar, BYTES as a string
        "logits": [0.5, 1.0, 1.5, 2.0],  # more: a flat list
        "done": True,
    }


def test_reserved_keys_win_over_clashing_names() -> None:
    clash = InferTensor("model_name", "INT32", (1,), np.array([7], dtype=np.int32))
    out = encode_generate_response(response(id="r", outputs=[clash], parameters={"model_version": "9", "id": "other"}))
    assert out == {"id": "r", "model_name": "llm", "model_version": "1"}


def test_generate_json_is_compact() -> None:
    assert generate_json(response(id="a")) == b'{"id":"a","model_name":"llm","model_version":"1"}'
