"""Decoupled Python models as Triton runs them, through stock tritonclient clients (models: stream_models.py).

- A BLS ``ResponseIterator.cancel()`` reaches the called model, in a process of its own, and the caller's
  iteration goes on to that model's final response, a CANCELLED error (Triton's ``test_decoupled_bls_cancel``
  and ``test_decoupled_bls_ignore_cancel``); a model that ignores the cancel sends all it has.
- A decoupled model with a dynamic batcher gets the requests sent together in one ``execute``, and each
  request's responses come back on its own, under its own id.
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import Server

MAX_RESPONSE_COUNT = 8  # what py_bls_cancel asks py_until_cancelled for


def http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    t = httpclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def bls_cancel(server: Server, model: str, max_sum: int, ignore_cancel: bool) -> tuple[int, bool]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = [
        http_input("INPUT", np.array([1], np.int32), "INT32"),
        http_input("MAX_SUM", np.array([max_sum], np.int32), "INT32"),
        http_input("IGNORE_CANCEL", np.array([ignore_cancel]), "BOOL"),
    ]
    result = client.infer(model, inputs)
    return int(result.as_numpy("SUM")[0]), bool(result.as_numpy("IS_CANCELLED")[0])


@pytest.mark.parametrize("model", ["py_bls_cancel", "py_bls_async_cancel"])
def test_a_bls_cancel_reaches_the_called_model_and_its_cancelled_error_comes_back(server: Server, model: str) -> None:
    total, cancelled = bls_cancel(server, model, max_sum=3, ignore_cancel=False)
    assert cancelled, "the stream did not end with the called model's CANCELLED error"
    # Triton's test expects exactly 3; the cancel crosses processes while the model waits 100 ms between
    # responses, so one more may come on a loaded machine, never all of them.
    assert 3 <= total < MAX_RESPONSE_COUNT


@pytest.mark.parametrize("model", ["py_bls_cancel", "py_bls_async_cancel"])
def test_a_bls_cancel_the_called_model_ignores_leaves_its_responses_flowing(server: Server, model: str) -> None:
    total, cancelled = bls_cancel(server, model, max_sum=3, ignore_cancel=True)
    assert not cancelled and total == MAX_RESPONSE_COUNT


def test_a_decoupled_model_with_a_dynamic_batcher_gets_batches_and_answers_each_request_apart(
    server: Server,
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for value in (10, 20, 30):  # the batcher waits for three requests: these share one execute
            t = grpcclient.InferInput("IN", [1, 1], "INT32")
            t.set_data_from_numpy(np.array([[value]], np.int32))
            client.async_stream_infer("py_stream_batched", [t], request_id=f"r{value}")
        got: dict[str, list[tuple[int, int, bool]]] = {}
        for _ in range(6):  # two responses each
            result, error = answers.get(timeout=90)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            got.setdefault(response.id, []).append(
                (int(result.as_numpy("OUT")[0, 0]), int(result.as_numpy("BATCH")[0, 0]), final)
            )
    finally:
        client.stop_stream()
    assert got == {f"r{v}": [(v + 1, 3, False), (v + 2, 3, True)] for v in (10, 20, 30)}
