"""An OpenAI request as an inference request to a vLLM- or TensorRT-LLM-convention model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serve_app.config import parse_config
from serve_app.errors import InvalidArgument
from serve_app.inference.signature import ModelSignature
from serve_app.inference.types import InferRequest, InferResponse, InferTensor
from serve_app.openai_api.conventions import TRTLLM, VLLM, convention, infer_request, read_response
from serve_app.openai_api.params import completion_params

VLLM_CONFIG = """
name: "v" backend: "vllm" max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
TRTLLM_CONFIG = """
name: "t" backend: "python" max_batch_size: 4
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
"""
PLAIN_CONFIG = """
name: "p" backend: "python" max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def sig(text: str) -> ModelSignature:
    config = parse_config(text, model=text.split('"')[1], path="config.pbtxt")
    return ModelSignature.from_config(config, "1")


def tensor(request: InferRequest, name: str) -> np.ndarray:
    found = request.input(name)
    assert found is not None, name
    return found.data


def test_convention() -> None:
    assert convention(sig(VLLM_CONFIG)) == VLLM
    assert convention(sig(TRTLLM_CONFIG)) == TRTLLM
    assert convention(sig(PLAIN_CONFIG)) is None


def test_vllm_request() -> None:
    params = completion_params(
        {"model": "v", "prompt": "hi there", "max_tokens": 4, "stop": ["x"], "temperature": 0.0, "seed": 1,
         "stream": True, "user": "u"}
    )  # fmt: skip
    request = infer_request(sig(VLLM_CONFIG), params, "hi there", request_id="cmpl-1")
    assert request.id == "cmpl-1"
    assert tensor(request, "text_input").tolist() == [b"hi there"]
    assert tensor(request, "stream").tolist() == [True]
    assert tensor(request, "exclude_input_in_output").tolist() == [True]
    assert tensor(request, "return_num_input_tokens").tolist() == [True]
    sampling = json.loads(tensor(request, "sampling_parameters")[0])
    assert sampling == {"max_tokens": 4, "stop": ["x"], "temperature": 0.0, "seed": 1}
    assert not request.parameters  # user is not passed on


def test_trtllm_request() -> None:
    params = completion_params({"model": "t", "prompt": "p", "max_tokens": 3, "stop": ["a", "b"], "seed": 9})
    request = infer_request(sig(TRTLLM_CONFIG), params, "p", request_id="r")
    assert tensor(request, "text_input").shape == (1, 1)
    assert tensor(request, "max_tokens").tolist() == [[3]]
    assert tensor(request, "stop_words").tolist() == [[b"a", b"b"]]
    assert tensor(request, "random_seed").dtype == np.uint64


@pytest.mark.parametrize("field", [{"top_p": 0.5}, {"echo": True}, {"presence_penalty": 1.0}])
def test_trtllm_refuses_what_it_has_no_input_for(field: dict[str, object]) -> None:
    params = completion_params({"model": "t", "prompt": "p", **field})
    with pytest.raises(InvalidArgument, match="not supported by model 't'"):
        infer_request(sig(TRTLLM_CONFIG), params, "p", request_id="r")


def test_plain_model_refused() -> None:
    with pytest.raises(InvalidArgument, match="LLM conventions"):
        infer_request(sig(PLAIN_CONFIG), completion_params({"model": "p", "prompt": "x"}), "x", request_id="r")


def test_read_response() -> None:
    out = [
        InferTensor("text_output", "BYTES", (1,), np.array([b"caf\xc3\xa9"], dtype=object)),
        InferTensor("num_input_tokens", "UINT32", (1,), np.array([3], dtype=np.uint32)),
        InferTensor("num_output_tokens", "UINT32", (1,), np.array([1], dtype=np.uint32)),
    ]
    piece = read_response(InferResponse("v", "1", outputs=out))
    assert (piece.text, piece.prompt_tokens, piece.completion_tokens) == ("café", 3, 1)
    assert read_response(InferResponse("v", "1")).text == ""
