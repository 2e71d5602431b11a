"""Python-backend models on the real server, through stock clients: tritonclient HTTP, gRPC and its
streaming API, and plain HTTP for the generate extension.

The models (``scripts/python_models.py``) are written as Triton users write them.  ``py_add_sub``,
``py_bls``, ``py_repeat`` and ``py_tokens`` run in processes of their own (the default for Python models);
the others run in the gateway (``dedicated_process: false``).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.support import faults as fi

A = np.arange(16, dtype=np.float32)
B = np.full(16, 2.0, dtype=np.float32)


def http_input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    t = httpclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def grpc_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


class Stream:
    """A tritonclient gRPC stream whose responses land in a queue, with their arrival times."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.answers: queue.Queue[tuple[float, Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((time.monotonic(), result, error)))

    def next(self, timeout: float = 30.0) -> tuple[float, Any, Any]:
        return self.answers.get(timeout=timeout)

    def until_final(self, timeout: float = 30.0) -> list[tuple[float, Any, Any]]:
        out = []
        while True:
            item = self.next(timeout)
            out.append(item)
            _, result, error = item
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                return out

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)


def test_add_sub_over_http_and_grpc(server: Server) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    result = http.infer("py_add_sub", [http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = grpc.infer(
        "py_add_sub", [grpc_input("INPUT0", A, "FP32"), grpc_input("INPUT1", B, "FP32")], outputs=outputs
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert result.as_numpy("OUTPUT0") is None  # not asked for: pruned, as Triton does
    assert grpc.get_model_metadata("py_add_sub").platform == "python"  # the backend, as Triton says
    config = http.get_model_config("py_add_sub")
    assert config["backend"] == "python" and config["default_model_filename"] == "model.py"


def test_initialize_gets_tritons_args_and_requests_their_parameters(server: Server) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    result = grpc.infer(
        "py_args",
        [grpc_input("IN", np.ones(1, np.float32), "FP32")],
        request_id="req-7",
        parameters={"temperature": "high", "top_k": 5, "stream": False},
    )
    report = json.loads(result.as_numpy("REPORT")[0])
    assert json.loads(report["model_config"])["name"] == "py_args"
    assert report["model_instance_kind"] == "CPU"
    assert report["model_instance_name"] == "py_args_0"
    assert report["model_instance_device_id"] == "0"
    assert report["model_repository"] == str(server.repo / "py_args")
    assert report["model_dir"] == str(server.repo / "py_args" / "1")
    assert (report["model_version"], report["model_name"]) == ("1", "py_args")
    assert json.loads(report["parameters"]) == {"temperature": "high", "top_k": 5, "stream": False}
    assert report["request_id"] == "req-7" and report["requested"] == ["REPORT"]


def test_auto_complete_config_fills_the_config(server: Server) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    config = http.get_model_config("py_auto_complete")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    result = http.infer(
        "py_auto_complete", [http_input("INPUT0", A[None], "FP32"), http_input("INPUT1", B[None], "FP32")]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (A * B)[None])


def test_preprocessing_batches_requests_of_any_shape(server: Server) -> None:
    """Concurrent requests of different lengths share executions; each gets its own answer."""
    http = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    texts = [[b"a", b"bb", b"ccc"][: n + 1] for n in range(3)] * 4
    pending = [
        http.async_infer("py_preprocess", [http_input("TEXT", np.array([t], dtype=np.object_), "BYTES")]) for t in texts
    ]
    for text, call in zip(texts, pending, strict=True):
        result = call.get_result()
        assert [x.decode() for x in result.as_numpy("UPPER")[0]] == [t.decode().upper() for t in text]
        np.testing.assert_array_equal(result.as_numpy("LENGTH")[0], [len(t) for t in text])


def test_bls_calls_other_models_wherever_they_run(server: Server) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    name = http_input("MODEL_NAME", np.array([b"py_add_sub"], dtype=np.object_), "BYTES")
    result = http.infer("py_bls", [name, http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    # async_exec to an ONNX model and a Python model at once, from a model in the gateway
    result = http.infer("py_bls_async", [http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * (A + B))
    # exec(decoupled=True): py_square streams 5 responses, then its final flag alone
    result = http.infer("py_bls_decoupled", [http_input("IN", np.array([5], np.int32), "INT32")])
    assert (int(result.as_numpy("SUM")[0]), int(result.as_numpy("COUNT")[0])) == (25, 5)
    # BLS errors come back as error responses; this model raises them
    missing = http_input("MODEL_NAME", np.array([b"no_such_model"], dtype=np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as info:
        http.infer("py_bls", [missing, http_input("INPUT0", A, "FP32"), http_input("INPUT1", B, "FP32")])
    assert "Model no_such_model - Error when running inference" in str(info.value)
    assert "Failed to process the request(s) for model 'py_bls_0'" in str(info.value)


def test_decoupled_models_are_refused_where_one_response_is_expected(server: Server) -> None:
    inputs = [np.array([1], np.int32), np.array([1], np.uint32)]
    with pytest.raises(InferenceServerException) as info:
        httpclient.InferenceServerClient(server.http_url).infer(
            "py_repeat", [http_input("IN", inputs[0], "INT32"), http_input("DELAY", inputs[1], "UINT32")]
        )
    assert info.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "py_repeat", [grpc_input("IN", inputs[0], "INT32"), grpc_input("DELAY", inputs[1], "UINT32")]
        )
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(info.value)


def test_decoupled_responses_reach_the_client_as_they_are_sent(server: Server) -> None:
    """py_repeat sends one response per value, 400 ms apart: the first arrives long before the last is sent."""
    stream = Stream(server.grpc_url)
    try:
        values = np.array([10, 20, 30, 40], np.int32)
        stream.client.async_stream_infer(
            "py_repeat",
            [grpc_input("IN", values, "INT32"), grpc_input("DELAY", np.array([400], np.uint32), "UINT32")],
            request_id="rep",
            enable_empty_final_response=True,
        )
        answers = stream.until_final()
    finally:
        stream.close()
    assert all(error is None for _, _, error in answers)
    outs = [r.as_numpy("OUT") for _, r, _ in answers]
    assert [int(o[0]) for o in outs[:-1]] == [10, 20, 30, 40]
    assert outs[-1] is None  # the final flag alone, sent because the request asked for it
    finals = [r.get_response().parameters["triton_final_response"].bool_param for _, r, _ in answers]
    assert finals == [False, False, False, False, True]
    assert all(r.get_response().id == "rep" for _, r, _ in answers)
    first, last = answers[0][0], answers[3][0]
    assert last - first >= 0.8, "responses were collected, not streamed"


def test_flag_only_final_is_silent_unless_asked_for(server: Server) -> None:
    stream = Stream(server.grpc_url)
    try:
        stream.client.async_stream_infer("py_square", [grpc_input("IN", np.array([2], np.int32), "INT32")])
        answers = [stream.next() for _ in range(2)]
        with pytest.raises(queue.Empty):
            stream.next(timeout=1.0)
    finally:
        stream.close()
    assert [int(r.as_numpy("OUT")[0]) for _, r, _ in answers] == [2, 2]
    finals = [r.get_response().parameters["triton_final_response"].bool_param for _, r, _ in answers]
    assert finals == [False, False]


def test_a_client_closing_its_stream_cancels_the_request(server: Server) -> None:
    def cancelled() -> int:
        probe = Stream(server.grpc_url)
        try:
            empty = [
                grpc_input("IN", np.zeros(0, np.int32), "INT32"),
                grpc_input("DELAY", np.ones(1, np.uint32), "UINT32"),
            ]
            probe.client.async_stream_infer("py_repeat", empty)
            _, result, error = probe.next()
            assert error is None, error
            return int(result.as_numpy("OUT")[0])
        finally:
            probe.close()

    before = cancelled()
    stream = Stream(server.grpc_url)
    values = [
        grpc_input("IN", np.arange(50, dtype=np.int32), "INT32"),
        grpc_input("DELAY", np.array([100], np.uint32), "UINT32"),
    ]
    stream.client.async_stream_infer("py_repeat", values)
    stream.next()
    stream.close(cancel=True)
    deadline = time.monotonic() + 10
    while cancelled() == before:
        assert time.monotonic() < deadline, "the model never saw is_cancelled()"
        time.sleep(0.3)


def test_generate_and_generate_stream(server: Server) -> None:
    base = f"http://{server.http_url}/v2/models"
    r = httpx.post(f"{base}/py_echo_text/generate", json={"text_input": "hello world", "id": "42"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "42", "model_name": "py_echo_text", "model_version": "1", "text_output": "HELLO WORLD"}
    r = httpx.post(f"{base}/py_tokens/generate", json={"text_input": "two words"})
    assert r.json()["error"].startswith("generate expects model to produce exactly 1 response")
    r = httpx.post(f"{base}/py_tokens/generate", json={"text_input": "one"})
    assert r.status_code == 200 and r.json()["text_output"] == "one"
    r = httpx.post(f"{base}/py_echo_text/generate", json={"text_input": "x", "bad": [1, 2]})
    assert r.status_code == 400
    assert r.json()["error"] == "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."
    events: list[tuple[float, dict[str, Any]]] = []
    body = {"text_input": "one two three four", "parameters": {"max_tokens": 3, "delay_s": 0.3}}
    with httpx.stream("POST", f"{base}/py_tokens/generate_stream", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line:
                assert line.startswith("data: ")
                events.append((time.monotonic(), json.loads(line[len("data: ") :])))
    assert [e["text_output"] for _, e in events] == ["one", "two", "three"]
    assert events[0][1]["word"] is True and events[0][1]["model_name"] == "py_tokens"
    assert events[-1][0] - events[0][0] >= 0.4, "events were collected, not streamed"


def test_model_errors_fail_only_their_requests(server: Server) -> None:
    http = httpclient.InferenceServerClient(server.http_url)

    def call(mode: int) -> np.ndarray:
        return http.infer("py_errors", [http_input("MODE", np.array([[mode]], np.int32), "INT32")]).as_numpy("OUT")

    with pytest.raises(InferenceServerException) as info:
        call(1)
    assert (info.value.status(), info.value.message()) == ("400", "this request is bad")
    with pytest.raises(InferenceServerException) as info:
        call(2)
    assert info.value.status() == "500"
    assert info.value.message().startswith(
        "Failed to process the request(s) for model 'py_errors_0', message: TritonModelException: model was asked "
        "to fail"
    )
    with pytest.raises(InferenceServerException) as info:
        call(3)
    assert "Expected a list in the execute return, found type '<class 'tuple'>'." in info.value.message()
    np.testing.assert_array_equal(call(0), [[0]])
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["py_init_fail"]["state"] == "UNAVAILABLE"
    assert index["py_init_fail"]["reason"].startswith("ValueError: this model refuses to start")
    assert http.is_server_ready()


def test_a_request_without_its_final_flag_ends_with_an_error(server: Server) -> None:
    stream = Stream(server.grpc_url)
    try:
        for model in ("py_no_final", "py_drop_final"):
            stream.client.async_stream_infer(model, [grpc_input("IN", np.array([1], np.int32), "INT32")])
            _, first, error = stream.next()
            assert error is None and int(first.as_numpy("OUT")[0]) == 1
            _, _, error = stream.next(timeout=15)
            assert error is not None
            expected = "sent no response for 2s" if model == "py_no_final" else "without sending its final response"
            assert expected in str(error)
    finally:
        stream.close()


def test_stateful_python_model_keeps_state_per_sequence(server: Server) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def step(corr: int, value: int, start: bool = False, end: bool = False) -> int:
        result = grpc.infer(
            "py_stateful",
            [grpc_input("INPUT", np.array([[value]], np.int32), "INT32")],
            sequence_id=corr,
            sequence_start=start,
            sequence_end=end,
        )
        return int(result.as_numpy("OUTPUT")[0][0])

    assert step(101, 1, start=True) == 1
    assert step(202, 10, start=True) == 10
    assert step(101, 2) == 3
    assert step(202, 20) == 30
    assert step(101, 3, end=True) == 6
    assert step(202, 30, end=True) == 60


def test_statistics_count_python_requests(server: Server) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = grpc.get_inference_statistics("py_add_sub").model_stats[0].inference_stats.success.count
    for _ in range(3):
        grpc.infer("py_add_sub", [grpc_input("INPUT0", A, "FP32"), grpc_input("INPUT1", B, "FP32")])
    after = grpc.get_inference_statistics("py_add_sub").model_stats[0].inference_stats.success.count
    assert after - before == 3


def test_killed_python_replica_fails_its_stream_at_once_and_is_replaced(server: Server) -> None:
    session = server.proc.pid
    (victim,) = fi.replica_pids(session, "py_repeat.v1.g0")
    stream = Stream(server.grpc_url)
    try:
        values = [
            grpc_input("IN", np.arange(100, dtype=np.int32), "INT32"),
            grpc_input("DELAY", np.array([100], np.uint32), "UINT32"),
        ]
        stream.client.async_stream_infer("py_repeat", values)
        stream.next()
        killed = time.monotonic()
        threading.Thread(target=fi.kill, args=(victim,), daemon=True).start()
        while True:
            arrived, _, error = stream.next(timeout=15)
            if error is not None:
                break
        assert arrived - killed < 5.0
        assert "UNAVAILABLE" in str(error) or "unavailable" in str(error).lower() or "closed" in str(error)
    finally:
        stream.close()
    deadline = time.monotonic() + 90
    while True:  # Serve replaces the replica; the model answers again
        probe = Stream(server.grpc_url)
        try:
            probe.client.async_stream_infer(
                "py_repeat",
                [
                    grpc_input("IN", np.array([7], np.int32), "INT32"),
                    grpc_input("DELAY", np.ones(1, np.uint32), "UINT32"),
                ],
            )
            _, result, error = probe.next(timeout=10)
            if error is None and int(result.as_numpy("OUT")[0]) == 7:
                break
        except queue.Empty:
            pass
        finally:
            probe.close()
        assert time.monotonic() < deadline, "the killed Python replica was not replaced"
        time.sleep(1)
