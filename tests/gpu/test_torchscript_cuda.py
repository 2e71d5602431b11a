"""TorchScript on CUDA (KIND_GPU, ``gpus: [0]``) served by the local server over HTTP and gRPC.

Each model answers the CUDA ordinal it ran on, so a GPU instance that silently ran on the CPU fails
here; results are compared with the same module run on the CPU in this process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest

from tests.gpu.conftest import DRY_RUN, Server
from tests.support import gpu_models
from tests.support.kserve_client import GrpcClient, HttpClient, batch_counts

ADD_SUB_OUT = ["OUTPUT__0", "OUTPUT__1", "DEVICE__2"]
MLP_OUT = ["OUTPUT__0", "DEVICE__1"]
CONCURRENCY, PER_CLIENT = 16, 8


def add_sub_inputs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {f"INPUT__{i}": rng.standard_normal((n, 16)).astype(np.float32) for i in (0, 1)}


def mlp_reference(server: Server) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    module = gpu_models.load_cpu(server.repo / gpu_models.SERVED_MLP)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(module(torch.from_numpy(x))[0].numpy())

    return run


def check_add_sub(got: dict[str, np.ndarray], inputs: dict[str, np.ndarray], device: int) -> None:
    a, b = inputs["INPUT__0"], inputs["INPUT__1"]
    np.testing.assert_array_equal(got["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT__1"], a - b)
    assert got["DEVICE__2"].ravel().tolist() == [device] * len(a), "the instance ran on another device"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_add_sub_runs_on_the_gpu(server: Server, device: int, binary: bool) -> None:
    client = HttpClient(server.http)
    try:
        for n in (1, 5):
            inputs = add_sub_inputs(n)
            check_add_sub(client.infer("ts_add_sub", inputs, ADD_SUB_OUT, binary=binary), inputs, device)
    finally:
        client.close()


def test_grpc_add_sub_runs_on_the_gpu(server: Server, device: int) -> None:
    client = GrpcClient(server.grpc)
    try:
        for n in (1, 8):
            inputs = add_sub_inputs(n)
            check_add_sub(client.infer("ts_add_sub", inputs, ADD_SUB_OUT), inputs, device)
    finally:
        client.close()


def test_mlp_matches_the_module_on_the_cpu(server: Server, device: int) -> None:
    reference = mlp_reference(server)
    x = np.random.default_rng(7).standard_normal((3, gpu_models.MLP_IN)).astype(np.float32)
    http, grpc = HttpClient(server.http), GrpcClient(server.grpc)
    try:
        for got in (http.infer(gpu_models.SERVED_MLP, {"INPUT__0": x}, MLP_OUT),
                    grpc.infer(gpu_models.SERVED_MLP, {"INPUT__0": x}, MLP_OUT)):  # fmt: skip
            np.testing.assert_allclose(got["OUTPUT__0"], reference(x), rtol=1e-3, atol=1e-3)
            assert got["DEVICE__1"].ravel().tolist() == [device] * 3
    finally:
        http.close()
        grpc.close()


def metric(server: Server, name: str, model: str) -> float:
    """One model's sample of a Prometheus counter on the metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=60) as r:
        text = r.read().decode()
    found = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    assert found, f"no {name} for {model} in /metrics"
    return float(found.group(1))


def test_dynamic_batcher_batches_concurrent_requests_and_the_statistics_count_them(server: Server, device: int) -> None:
    """16 clients at once on the batched MLP: every answer right, and the model's statistics and metrics
    account for each request once, in the batches the batcher formed (on the GPU: some larger than 1)."""
    model = gpu_models.BATCHED_MLP
    reference = mlp_reference(server)
    stats = HttpClient(server.http)
    before = stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    counted = {name: metric(server, name, model) for name in ("nv_inference_count", "nv_inference_exec_count")}
    errors: list[str] = []

    def client(k: int) -> None:
        c = HttpClient(server.http)
        try:
            for i in range(PER_CLIENT):
                x = np.random.default_rng(1000 * k + i).standard_normal((1, gpu_models.MLP_IN)).astype(np.float32)
                got = c.infer(model, {"INPUT__0": x}, MLP_OUT)
                np.testing.assert_allclose(got["OUTPUT__0"], reference(x), rtol=1e-3, atol=1e-3)
                assert got["DEVICE__1"].ravel().tolist() == [device]
        except Exception as exc:
            errors.append(f"client {k}: {exc!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    after = stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    stats.close()
    sent = CONCURRENCY * PER_CLIENT
    assert int(after["inference_count"]) - int(before["inference_count"]) == sent
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    sizes = {b: n - batch_counts(before).get(b, 0) for b, n in batch_counts(after).items()}
    assert sum(b * n for b, n in sizes.items()) == sent
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions == sum(sizes.values())
    assert metric(server, "nv_inference_count", model) - counted["nv_inference_count"] == sent
    assert metric(server, "nv_inference_exec_count", model) - counted["nv_inference_exec_count"] == executions
    if not DRY_RUN:  # how requests batch depends on timing: asserted where the check runs, not in CI
        assert executions < sent and max(b for b, n in sizes.items() if n) > 1, sizes


def test_models_on_one_gpu_share_the_process_s_one_cuda_context(server: Server, device: int) -> None:
    """Every model of the server runs in its one process, so the GPU lists that process once."""
    if device < 0:
        pytest.skip("dry run: no GPU to list processes on")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed: the CUDA contexts can't be listed")
    out = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    pids = [int(line.split(",")[0]) for line in out.stdout.splitlines() if line.strip()]
    print(f"nvidia-smi compute apps: {out.stdout.strip()!r}; server pid {server.pid}")
    if not pids:
        pytest.skip("nvidia-smi lists no compute process here: contexts not counted")
    if server.pid in pids:
        assert pids.count(server.pid) == 1, (pids, server.pid)
    else:  # PIDs from another namespace: the server is then the one process on the GPU (this one holds none)
        assert len(pids) == 1, f"server pid {server.pid} is not listed and {len(pids)} processes use the GPU: {pids}"
