"""``python -m serve_app`` on Ray with a GPU, as users run it: KIND_GPU groups placed through Ray's resources.

Each model answers the CUDA ordinal it ran on (and ``py_torch`` the process that ran it), so an instance
that silently ran on the CPU, or two instances that are one, fail here. In the dry run (no GPU) Ray has
one pretend GPU, the same groups place, and every model reports the CPU (-1).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

import numpy as np
import pytest

from tests.gpu.conftest import DRY_RUN, Server
from tests.support import faults, gpu_models
from tests.support.kserve_client import GrpcClient, HttpClient, batch_counts

PY_OUT = ["OUTPUT__0", "DEVICE__1", "PID__2"]
ACCUM_OUT = ["OUTPUT__0", "DEVICE__2"]
PY_DEPLOYMENT = f"{gpu_models.PY_TORCH}.v1.g0.gpu0"
ACCUM_DEPLOYMENT = f"{gpu_models.ACCUMULATOR}.v1.g0.gpu0"
RECOVER_S = 120.0


def mlp_input(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, gpu_models.MLP_IN)).astype(np.float32)


def concurrently(n: int, work: Callable[[int], None]) -> list[str]:
    errors: list[str] = []

    def run(k: int) -> None:
        try:
            work(k)
        except Exception as exc:
            errors.append(f"client {k}: {exc!r}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return errors


def test_every_gpu_model_runs_on_the_gpu_over_http_and_grpc(ray_server: Server, device: int) -> None:
    http, grpc = HttpClient(ray_server.http), GrpcClient(ray_server.grpc)
    try:
        for client in (http, grpc):
            x = mlp_input(1, 2)
            assert (
                client.infer(gpu_models.BATCHED_MLP, {"INPUT__0": x}, ["DEVICE__1"])["DEVICE__1"].ravel().tolist()
                == [device] * 2
            )
            got = client.infer(gpu_models.PY_TORCH, {"INPUT__0": x}, PY_OUT)
            assert got["DEVICE__1"].ravel().tolist() == [device] * 2
            a = np.ones((1, 16), np.float32)
            got = client.infer("ts_add_sub", {"INPUT__0": a, "INPUT__1": a}, ["OUTPUT__0", "DEVICE__2"])
            assert got["DEVICE__2"].ravel().tolist() == [device]
    finally:
        http.close()
        grpc.close()


def test_python_model_and_torchscript_agree(ray_server: Server) -> None:
    """The same MLP weights (seed 0) run by TorchScript and by torch inside a Python model."""
    x = mlp_input(2, 3)
    http = HttpClient(ray_server.http)
    try:
        ts = http.infer(gpu_models.BATCHED_MLP, {"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
        py = http.infer(gpu_models.PY_TORCH, {"INPUT__0": x}, ["OUTPUT__0"])["OUTPUT__0"]
    finally:
        http.close()
    np.testing.assert_allclose(py, ts, rtol=1e-3, atol=1e-3)


def test_two_instances_share_gpu_0_each_in_its_own_process(ray_server: Server, device: int) -> None:
    """``count: 2`` on GPU 0: two Serve replicas, each its own process; concurrent requests reach both, and
    the statistics and metrics count every request once."""
    pids = faults.replica_pids(ray_server.pid, PY_DEPLOYMENT)
    assert len(pids) == 2, f"{PY_DEPLOYMENT}: {pids}"
    stats = HttpClient(ray_server.http)
    model = gpu_models.PY_TORCH
    before = stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    counted = metric(ray_server, "nv_inference_count", model)
    seen: set[int] = set()
    lock = threading.Lock()
    per_client = 8

    def client(k: int) -> None:
        c = HttpClient(ray_server.http)
        try:
            for i in range(per_client):
                got = c.infer(model, {"INPUT__0": mlp_input(100 * k + i)}, PY_OUT)
                assert got["DEVICE__1"].ravel().tolist() == [device]
                with lock:
                    seen.add(int(got["PID__2"].ravel()[0]))
        finally:
            c.close()

    errors = concurrently(16, client)
    assert not errors, errors
    after = stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    stats.close()
    sent = 16 * per_client
    assert int(after["inference_count"]) - int(before["inference_count"]) == sent
    assert metric(ray_server, "nv_inference_count", model) - counted == sent
    assert seen <= set(pids), (seen, pids)
    print(f"{model}: replicas {pids}, answered by {sorted(seen)}; on the GPU: {gpu_processes()}")
    if not DRY_RUN:  # which instance a batch goes to depends on timing: asserted where the check runs
        assert seen == set(pids), f"16 clients reached only {seen} of {pids}"
        on_gpu = gpu_processes()
        if on_gpu and set(pids) & set(on_gpu):  # PIDs of this namespace: both hold a context on the GPU
            assert set(pids) <= set(on_gpu), (pids, on_gpu)


def test_the_batcher_forms_batches_on_the_gpu(ray_server: Server, device: int) -> None:
    model = gpu_models.BATCHED_MLP
    stats = HttpClient(ray_server.http)
    before = batch_counts(stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0])

    def client(k: int) -> None:
        c = GrpcClient(ray_server.grpc)
        try:
            for i in range(8):
                got = c.infer(model, {"INPUT__0": mlp_input(1000 * k + i)}, ["DEVICE__1"])
                assert got["DEVICE__1"].ravel().tolist() == [device]
        finally:
            c.close()

    errors = concurrently(16, client)
    assert not errors, errors
    after = batch_counts(stats.get_json(f"/v2/models/{model}/stats")["model_stats"][0])
    stats.close()
    sizes = {b: n - before.get(b, 0) for b, n in after.items() if n > before.get(b, 0)}
    assert sum(b * n for b, n in sizes.items()) == 16 * 8, sizes
    print(f"{model}: batches formed {sorted(sizes.items())}")
    if not DRY_RUN:
        assert max(sizes) > 1, sizes


def test_gateways_see_no_gpu(ray_server: Server) -> None:
    """The gateway holds the KIND_CPU instances (onnx_cpu): they report the gateway's CUDA_VISIBLE_DEVICES."""
    held = driver_call(ray_server, "serve.get_deployment_handle('gateway', 'serve_app').broadcast('placement')"
                       ".results(timeout_s=60)")  # fmt: skip
    entries = [i for part in held for i in part]
    assert entries, "the gateway holds no instance"
    assert {i["model"] for i in entries} == {gpu_models.ONNX_CPU}, entries
    assert {i["cuda_visible_devices"] for i in entries} == {""}, entries


def test_a_killed_gpu_instance_comes_back_on_the_gpu_and_its_sequences_go_on(ray_server: Server, device: int) -> None:
    """Two sequences on ts_accum (two instances, a process each, state backed up); SIGKILL one instance's
    process: both sequences go on with their running sums, and Serve's replacement runs on the GPU."""
    model = gpu_models.ACCUMULATOR
    pids = faults.replica_pids(ray_server.pid, ACCUM_DEPLOYMENT)
    assert len(pids) == 2, f"{ACCUM_DEPLOYMENT}: {pids}"
    http = HttpClient(ray_server.http)
    sums = {7001: 0, 7002: 0}

    def step(seq: int, value: int, start: bool = False) -> None:
        params: dict[str, object] = {"sequence_id": seq, "sequence_start": start}
        deadline = time.monotonic() + RECOVER_S
        while True:
            try:
                got = http.infer(model, {"INPUT__0": np.array([[value]], np.int32)}, ACCUM_OUT, parameters=params)
                break
            except (RuntimeError, OSError) as exc:  # the killed instance's steps fail until restored
                if time.monotonic() > deadline:
                    raise AssertionError(f"sequence {seq} did not go on within {RECOVER_S:g}s: {exc}") from exc
                http.close()
                http.__init__(ray_server.http)  # type: ignore[misc]
                time.sleep(0.5)
        sums[seq] = sums.get(seq, 0) + value
        assert got["OUTPUT__0"].ravel().tolist() == [sums[seq]], (seq, got, sums)
        assert got["DEVICE__2"].ravel().tolist() == [device]

    try:
        for seq in sums:
            step(seq, 1, start=True)
            for v in (2, 3):
                step(seq, v)
        victim = pids[0]
        faults.kill(victim, signal.SIGKILL)
        for v in (10, 20):
            for seq in sums:
                step(seq, v)
        deadline = time.monotonic() + RECOVER_S
        while time.monotonic() < deadline:
            now = faults.replica_pids(ray_server.pid, ACCUM_DEPLOYMENT)
            if len(now) == 2 and victim not in now:
                break
            time.sleep(1)
        else:
            raise AssertionError(
                f"Serve did not replace {victim}: {faults.replica_pids(ray_server.pid, ACCUM_DEPLOYMENT)}"
            )
        for seq in list(sums):  # new sequences fill both instances, the replacement among them
            step(seq + 100, 5, start=True)
            step(seq, 100)
    finally:
        http.close()


def test_onnx_on_the_cuda_provider_or_its_reason(ray_server: Server) -> None:
    import onnxruntime as ort

    http = HttpClient(ray_server.http)
    try:
        http.conn.request("POST", "/v2/repository/index", body=b"{}")
        index = json.loads(http.conn.getresponse().read())
    finally:
        http.close()
    entry = next(e for e in index if e["name"] == "onnx_add_sub")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert entry["state"] == "UNAVAILABLE" and "CUDA" in entry["reason"], entry
        pytest.skip("onnxruntime has no CUDA provider here (onnxruntime-gpu does not travel): UNAVAILABLE, "
                    f"reason: {entry['reason'][:160]}")  # fmt: skip
    assert entry["state"] == "READY", entry


# -- helpers -----------------------------------------------------------------------------------------


def metric(server: Server, name: str, model: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=60) as r:
        text = r.read().decode()
    found = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    assert found, f"no {name} for {model} in /metrics"
    return float(found.group(1))


def gpu_processes() -> list[int]:
    """PIDs ``nvidia-smi`` lists with a context on a GPU (none without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return [int(x) for x in out.stdout.split() if x.strip().isdigit()]


def gcs_address(session: int) -> str:
    """The GCS of the Ray the server started: Ray's processes in the server's session name it."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            sid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3])
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue
        found = [a.split("=", 1)[1] for a in args if a.startswith("--gcs-address=")]
        if sid == session and found:
            return found[0]
    raise AssertionError(f"no Ray process naming its GCS in session {session}")


def driver_call(server: Server, expression: str) -> list[list[dict[str, object]]]:
    """``expression``'s value, evaluated by a Ray driver of its own attached to the server's Ray."""
    code = (
        "import json, ray\nfrom ray import serve\n"
        f"ray.init(address={gcs_address(server.pid)!r}, namespace='serve', logging_level='ERROR')\n"
        f"print('RESULT ' + json.dumps({expression}, default=str))\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the server's Ray uses token authentication (~/.ray)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-3000:]
    return list(json.loads(line[len("RESULT ") :]))
