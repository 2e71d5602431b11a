"""Ensembles (ONNX steps, and ONNX + TorchScript steps) and the classification extension, with stock tritonclient."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e import torchscript_models
from tests.e2e.conftest import Server


@pytest.fixture(scope="module", params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: Server) -> Any:
    if request.param == "http":
        return httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def module_of(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def operands(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    return rng.standard_normal((batch, 16)).astype(np.float32), rng.standard_normal((batch, 16)).astype(np.float32)


def ensemble_inputs(mod: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [mod.InferInput("IN_A", list(a.shape), "FP32"), mod.InferInput("IN_B", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def inference_count(client: Any, model: str) -> int:
    kwargs = {} if module_of(client) is httpclient else {"as_json": True}
    stats = client.get_inference_statistics(model, **kwargs)["model_stats"]
    return int(stats[0].get("inference_count", 0)) if stats else 0


def test_onnx_ensemble(client: Any) -> None:
    mod = module_of(client)
    a, b = operands(3)
    before = inference_count(client, "add_sub")
    result = client.infer("ens_onnx", ensemble_inputs(mod, a, b))
    np.testing.assert_allclose(result.as_numpy("OUT_2A"), 2 * a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("OUT_2B"), 2 * b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("OUT_SUM"), a + b, rtol=1e-5, atol=1e-5)
    assert inference_count(client, "add_sub") - before == 4 * 3  # four steps of batch 3
    assert client.is_model_ready("ens_onnx")
    kwargs = {} if module_of(client) is httpclient else {"as_json": True}
    assert client.get_model_metadata("ens_onnx", **kwargs)["platform"] == "ensemble"


@pytest.mark.skipif(not torchscript_models.torch_available(), reason="PyTorch is not installed")
def test_ensemble_of_onnx_and_torchscript_steps(client: Any) -> None:
    mod = module_of(client)
    a, b = operands(2)
    result = client.infer("ens_mixed", ensemble_inputs(mod, a, b))
    np.testing.assert_allclose(result.as_numpy("OUT_2A"), 2 * a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("OUT_2B"), 2 * b, rtol=1e-5, atol=1e-5)


def test_classification_top_k(client: Any) -> None:
    mod = module_of(client)
    x = mod.InferInput("INPUT0", [2, 4], "FP32")
    x.set_data_from_numpy(np.array([[0.5, 9.0, 0.25, 3.0], [1.0, 0.0, 2.0, -1.0]], dtype=np.float32))
    result = client.infer("scores", [x], outputs=[mod.InferRequestedOutput("OUTPUT0", class_count=2)])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (2, 2)
    assert [[v.decode() if isinstance(v, bytes) else v for v in row] for row in got] == [
        ["9.000000:1:one", "3.000000:3:three"],
        ["2.000000:2:two", "1.000000:0:zero"],
    ]
