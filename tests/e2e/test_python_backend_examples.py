"""Triton's python_backend examples, replayed: each test makes the calls of one example's client and runs
its checks, against models of the same names and configs (``tests/e2e/python_example_models.py``).

One server for the module, started as a user starts it on such a repository (every model loaded at
start, each Python instance in a process of its own). The clients that use HTTP run over gRPC too.
"""

from __future__ import annotations

import queue
import urllib.request
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.e2e import python_example_models as models
from tests.e2e.conftest import Server, start_server, stop_server

CLIENTS = [pytest.param(httpclient, id="http"), pytest.param(grpcclient, id="grpc")]
needs_torch = pytest.mark.skipif(not models.HAS_TORCH, reason="PyTorch is not installed")


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = models.build(tmp_path_factory.mktemp("python_examples_repository"))
    started, _ = start_server(tmp_path_factory, repo, [], "python_examples")
    yield started
    stop_server(started)


def client_for(module: ModuleType, server: Server) -> Any:
    url = server.http_url if module is httpclient else server.grpc_url
    return module.InferenceServerClient(url)


def add_sub_inputs(module: ModuleType, seed: int, batch: bool = False) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """The examples' two random FP32 [4] inputs (seeded here), or [1, 4] for a model that batches."""
    rng = np.random.default_rng(seed)
    shape = (1, 4) if batch else (4,)
    a, b = rng.random(shape, dtype=np.float32), rng.random(shape, dtype=np.float32)
    inputs = [
        module.InferInput(n, list(x.shape), np_to_triton_dtype(x.dtype)) for n, x in (("INPUT0", a), ("INPUT1", b))
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def add_sub_outputs(module: ModuleType) -> list[Any]:
    return [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]


def check_sum_and_difference(response: Any, a: np.ndarray, b: np.ndarray) -> None:
    assert response.get_response() is not None
    np.testing.assert_allclose(response.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(response.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("module", CLIENTS)
@pytest.mark.parametrize("model", ["add_sub", pytest.param("pytorch", marks=needs_torch), "custom_metrics"])
def test_add_sub_pytorch_and_custom_metrics_clients(examples: Server, module: ModuleType, model: str) -> None:
    """add_sub/client.py, pytorch/client.py and custom_metrics/client.py's inference."""
    with client_for(module, examples) as client:
        inputs, a, b = add_sub_inputs(module, seed=1)
        response = client.infer(model, inputs, request_id="1", outputs=add_sub_outputs(module))
        check_sum_and_difference(response, a, b)


def test_custom_metrics_client_finds_the_models_counter(examples: Server) -> None:
    """custom_metrics/client.py's check of the metrics endpoint, after an inference."""
    with httpclient.InferenceServerClient(examples.http_url) as client:
        inputs, a, b = add_sub_inputs(httpclient, seed=2)
        check_sum_and_difference(client.infer("custom_metrics", inputs, request_id="1"), a, b)
    with urllib.request.urlopen(examples.metrics_url, timeout=30) as r:
        assert r.status == 200
        metrics = r.read().decode()
    for pattern in (
        "# HELP requests_process_latency_ns Cumulative time spent processing requests",
        "# TYPE requests_process_latency_ns counter",
        'requests_process_latency_ns{model="custom_metrics",version="1"}',
    ):
        assert pattern in metrics
    line = next(x for x in metrics.splitlines() if x.startswith("requests_process_latency_ns{"))
    assert float(line.split()[-1]) > 0


@pytest.mark.parametrize("module", CLIENTS)
def test_bls_sync_client(examples: Server, module: ModuleType) -> None:
    """bls/sync_client.py: add_sub, then pytorch, through bls_sync; an unknown model fails the request."""
    with client_for(module, examples) as client:
        inputs, a, b = add_sub_inputs(module, seed=3)
        inputs.append(module.InferInput("MODEL_NAME", [1], np_to_triton_dtype(np.object_)))
        outputs = add_sub_outputs(module)
        for target in ["add_sub", "pytorch"] if models.HAS_TORCH else ["add_sub"]:
            inputs[2].set_data_from_numpy(np.array([target], dtype=np.object_))
            check_sum_and_difference(client.infer("bls_sync", inputs, request_id="1", outputs=outputs), a, b)
        inputs[2].set_data_from_numpy(np.array(["undefined_model"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as err:
            client.infer("bls_sync", inputs, request_id="1", outputs=outputs)
        # the client prints it; the text is Triton's BLS error, raised on by the model
        assert "Failed for execute the inference request. Model 'undefined_model' is not ready." in str(err.value)


@needs_torch
@pytest.mark.parametrize("module", CLIENTS)
def test_bls_async_client(examples: Server, module: ModuleType) -> None:
    """bls/async_client.py: OUTPUT0 from pytorch and OUTPUT1 from add_sub, called together."""
    with client_for(module, examples) as client:
        inputs, a, b = add_sub_inputs(module, seed=4)
        check_sum_and_difference(
            client.infer("bls_async", inputs, request_id="1", outputs=add_sub_outputs(module)), a, b
        )


class Stream:
    """The decoupled clients' UserData and callback: every answer of the stream, in arrival order."""

    def __init__(self, client: grpcclient.InferenceServerClient) -> None:
        self.answers: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: self.answers.put(error if error else result))

    def take(self, count: int) -> dict[str, list[Any]]:
        """``count`` answers grouped by request ID, each group in arrival order."""
        by_id: dict[str, list[Any]] = {}
        for _ in range(count):
            item = self.answers.get(timeout=60)
            if isinstance(item, InferenceServerException):
                raise item
            by_id.setdefault(item.get_response().id, []).append(item)
        return by_id


def test_decoupled_repeat_client(examples: Server) -> None:
    """decoupled/repeat_client.py: one request, one answer per IN element, in order, from the model's thread."""
    in_value, delay_value, wait_value = [4, 2, 0, 1], [1, 2, 3, 4], 5
    inputs = [
        grpcclient.InferInput("IN", [len(in_value)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delay_value)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(in_value, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delay_value, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait_value], dtype=np.uint32))
    outputs = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")]
    with grpcclient.InferenceServerClient(examples.grpc_url) as client:
        stream = Stream(client)
        client.async_stream_infer(model_name="repeat_int32", inputs=inputs, request_id="0", outputs=outputs)
        answers = stream.take(len(in_value))
        client.stop_stream()
    assert list(answers) == ["0"]
    assert [a.as_numpy("OUT").tolist() for a in answers["0"]] == [[v] for v in in_value]
    assert [a.as_numpy("IDX").tolist() for a in answers["0"]] == [[i] for i in range(len(in_value))]
    assert stream.answers.empty()  # the final flag came alone, and is not an answer without enable_empty_final


def test_decoupled_square_client(examples: Server) -> None:
    """decoupled/square_client.py: four requests on one stream; request i gets in_values[i] answers of
    [in_values[i]], and the one asking for 0 gets none."""
    in_values = [4, 2, 0, 1]
    inputs = [grpcclient.InferInput("IN", [1], np_to_triton_dtype(np.int32))]
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    with grpcclient.InferenceServerClient(examples.grpc_url) as client:
        stream = Stream(client)
        for i, value in enumerate(in_values):
            inputs[0].set_data_from_numpy(np.array([value], dtype=np.int32))
            client.async_stream_infer(model_name="square_int32", inputs=inputs, request_id=str(i), outputs=outputs)
        answers = stream.take(sum(in_values))
        client.stop_stream()
    assert sorted(answers) == [str(i) for i, v in enumerate(in_values) if v]
    for request_id, got in answers.items():
        value = in_values[int(request_id)]
        assert [a.as_numpy("OUT").tolist() for a in got] == [[value]] * value
    assert stream.answers.empty()


@pytest.mark.parametrize("module", CLIENTS)
@pytest.mark.parametrize(("model", "factor"), [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)])
def test_bls_decoupled_clients(examples: Server, module: ModuleType, model: str, factor: int) -> None:
    """bls_decoupled/sync_client.py (SUM = IN * IN) and async_client.py (2 * IN * IN)."""
    with client_for(module, examples) as client:
        for in_value in [4, 2, 0, 1]:
            data = np.array([in_value], dtype=np.int32)
            inputs = [module.InferInput("IN", list(data.shape), np_to_triton_dtype(data.dtype))]
            inputs[0].set_data_from_numpy(data)
            outputs = [module.InferRequestedOutput("SUM")]
            response = client.infer(model, inputs, request_id="1", outputs=outputs)
            np.testing.assert_allclose(response.as_numpy("SUM"), factor * data * data)


EXPECTED_INPUTS = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0", "INPUT1")]
EXPECTED_OUTPUTS = [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("OUTPUT0", "OUTPUT1")]


def test_auto_complete_client(examples: Server) -> None:
    """auto_complete/client.py: the configs that ``auto_complete_config`` completed, as the server reports
    them; then one inference on each (not in the client: it shows the completed config is the one served)."""
    with httpclient.InferenceServerClient(examples.http_url) as client:
        for name, max_batch_size in {"nobatch_auto_complete": 0, "batch_auto_complete": 4}.items():
            config = client.get_model_config(name)
            assert config["max_batch_size"] == max_batch_size
            assert config["backend"] == "python"
            for got, expected in ((config["input"], EXPECTED_INPUTS), (config["output"], EXPECTED_OUTPUTS)):
                assert [{k: t[k] for k in ("name", "data_type", "dims")} for t in got] == expected
            assert ("dynamic_batching" in config) == bool(max_batch_size)
            inputs, a, b = add_sub_inputs(httpclient, seed=5, batch=bool(max_batch_size))
            check_sum_and_difference(client.infer(name, inputs), a, b)
