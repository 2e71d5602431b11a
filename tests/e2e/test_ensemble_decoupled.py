"""An ensemble with a decoupled step through stock tritonclient clients: it streams one response per
response of its decoupled step (py_square, then an ONNX identity), and refuses the unary calls as Triton
refuses them for a decoupled model."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.e2e.test_python_backend import Stream, grpc_input, http_input

IN = np.array([3], np.int32)


def test_an_ensemble_with_a_decoupled_step_streams_its_responses(server: Server) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(
            "ens_square", [grpc_input("IN", IN, "INT32")], request_id="ens", enable_empty_final_response=True
        )
        answers = stream.until_final()
    finally:
        stream.close()
    assert all(error is None for _, _, error in answers)
    outs = [r.as_numpy("OUT") for _, r, _ in answers]
    assert [o.tolist() for o in outs if o is not None] == [[3], [3], [3]]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for _, r, _ in answers]
    assert finals[-1] and not any(finals[:-1])
    assert all(r.get_response().model_name == "ens_square" and r.get_response().id == "ens" for _, r, _ in answers)


def test_an_ensemble_with_a_decoupled_step_is_refused_where_one_response_is_expected(server: Server) -> None:
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer("ens_square", [grpc_input("IN", IN, "INT32")])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        httpclient.InferenceServerClient(server.http_url).infer("ens_square", [http_input("IN", IN, "INT32")])
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(info.value)
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("ens_square")
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_an_ensemble_that_declares_itself_decoupled_streams_one_response_per_step_response(server: Server) -> None:
    """Triton 2.51 loads an ensemble whose config says ``decoupled: true`` and streams as above."""
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer(
            "ens_square_declared", [grpc_input("IN", IN, "INT32")], request_id="d", enable_empty_final_response=True
        )
        answers = [a for a in stream.until_final() if a[1].as_numpy("OUT") is not None]
    finally:
        stream.close()
    assert all(error is None for _, _, error in answers)
    assert [r.as_numpy("OUT").tolist() for _, r, _ in answers] == [[3], [3], [3]]
    assert all(r.get_response().model_name == "ens_square_declared" for _, r, _ in answers)
