"""ONNX Runtime's CUDA execution provider behind a KIND_GPU instance, served by the local server.

Where onnxruntime has no CUDA provider (its CPU build: onnxruntime-gpu is too large for what the GPU
check carries), the model must be UNAVAILABLE with that reason while the others serve.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.gpu.conftest import Server
from tests.support.kserve_client import GrpcClient, HttpClient

MODEL = "onnx_add_sub"
CUDA_EP = "CUDAExecutionProvider"


def providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def index_entry(server: Server) -> dict[str, str]:
    client = HttpClient(server.http)
    try:
        client.conn.request("POST", "/v2/repository/index", body=b"{}")
        response = client.conn.getresponse()
        entries = json.loads(response.read())
    finally:
        client.close()
    return next(e for e in entries if e["name"] == MODEL)


def test_onnx_on_the_cuda_provider(server: Server, device: int) -> None:
    if CUDA_EP not in providers():
        import onnxruntime as ort

        pytest.skip(f"onnxruntime {ort.__version__} has no {CUDA_EP} ({providers()}); install onnxruntime-gpu")
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = {"INPUT0": x, "INPUT1": np.ones_like(x)}
    for client in (HttpClient(server.http), GrpcClient(server.grpc)):
        try:
            got = client.infer(MODEL, inputs, ["OUTPUT0", "OUTPUT1"])
        finally:
            client.close()
        np.testing.assert_array_equal(got["OUTPUT0"], x + 1)
        np.testing.assert_array_equal(got["OUTPUT1"], x - 1)
    log = server.log.read_text(errors="replace")
    assert "Falling back to ['CPUExecutionProvider']" not in log, "onnxruntime fell back to the CPU"


def test_without_the_cuda_provider_the_model_is_unavailable_with_the_reason(server: Server, device: int) -> None:
    if CUDA_EP in providers():
        pytest.skip(f"onnxruntime has {CUDA_EP}: test_onnx_on_the_cuda_provider covers this model")
    entry = index_entry(server)
    assert entry["state"] == "UNAVAILABLE", entry
    assert CUDA_EP in entry["reason"], entry
