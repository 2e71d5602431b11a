"""Model warmup against the real server (stock tritonclient, HTTP and gRPC): a model whose warmup runs is
READY and serves, and its replica logged the samples it ran before it was ready; a model whose warmup
fails is UNAVAILABLE in the repository index with the reason naming the sample, and not ready.
Models: tests/e2e/warmup_models.py."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server

REASON = "failed to run warmup sample 'missing INPUT1'"


@pytest.fixture(scope="module")
def http(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="module")
def grpc(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def test_warmed_up_model_is_ready_and_serves(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    assert http.is_model_ready("warmup_ok")
    assert grpc.is_model_ready("warmup_ok")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["warmup_ok"]["state"] == "READY"
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = http.infer("warmup_ok", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_failed_warmup_makes_the_model_unavailable_with_its_reason(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["warmup_bad"]["state"] == "UNAVAILABLE"
    assert REASON in index["warmup_bad"]["reason"]
    assert "INPUT1" in index["warmup_bad"]["reason"]
    gindex = {m["name"]: m for m in grpc.get_model_repository_index(as_json=True)["models"]}
    assert gindex["warmup_bad"]["state"] == "UNAVAILABLE"
    assert REASON in gindex["warmup_bad"]["reason"]
    assert not http.is_model_ready("warmup_bad")
    assert not grpc.is_model_ready("warmup_bad")
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as err:
        http.infer("warmup_bad", inputs)
    # Triton's words for a request naming no version of a model none of whose versions loaded
    assert "Request for unknown model: 'warmup_bad' has no available versions" in str(err.value)


def test_replica_logged_its_warmup(server: Server) -> None:
    """Each replica logs what its warmup ran (from its constructor: the model cannot be ready before)."""
    pattern = re.compile(
        r"model 'warmup_ok' version 1: instance warmed up: 3 sample\(s\), 4 execution\(s\) in [0-9.]+ ms"
    )
    deadline = time.monotonic() + 10  # replica output reaches the driver's log asynchronously
    while not pattern.search(server.log.read_text(errors="replace")):
        assert time.monotonic() < deadline, "no warmup line for warmup_ok in the server log"
        time.sleep(0.5)
    assert "model 'warmup_bad' version 1: instance warmed up" not in server.log.read_text(errors="replace")


def test_warmup_is_counted_in_the_statistics(grpc: grpcclient.InferenceServerClient) -> None:
    """Triton counts warmup executions in the model's statistics: warmup_ok ran 4 executions of batch 4, 4, 1
    and 8 (17 inferences) before it was ready."""
    stats = grpc.get_inference_statistics("warmup_ok", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) >= 4
    assert int(stats["inference_count"]) >= 17
    sizes = {int(b["batch_size"]) for b in stats["batch_stats"]}
    assert {1, 4, 8} <= sizes
