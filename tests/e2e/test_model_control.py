"""Model control on the real server with stock tritonclient: the repository API in explicit mode
(index, load, unload, config override, files, a reload under load), poll mode, and autoscaling."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e import control_models as cm
from tests.e2e.conftest import Server

WAIT_S = 120.0


def add_sub_inputs(module: object, dims: int = 16) -> tuple[list[object], np.ndarray, np.ndarray]:
    a = np.arange(dims, dtype=np.float32).reshape(1, dims)
    b = np.ones((1, dims), dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [1, dims], "FP32"), module.InferInput("INPUT1", [1, dims], "FP32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def infer_add_sub(client: httpclient.InferenceServerClient, model: str, version: str = "") -> None:
    inputs, a, b = add_sub_inputs(httpclient)
    result = client.infer(model, inputs, model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def index_of(client: httpclient.InferenceServerClient) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for entry in client.get_model_repository_index():
        out.setdefault(entry["name"], []).append(entry)
    return out


def wait_until(predicate: object, what: str, timeout_s: float = WAIT_S) -> float:
    t0 = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic() - t0


# -- explicit mode: the repository API ---------------------------------------------------------------


def test_index_lists_loaded_models_and_failures(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    index = index_of(client)
    assert index["add_sub"] == [{"name": "add_sub", "version": "1", "state": "READY"}]
    (broken,) = index["broken"]
    assert broken["state"] == "UNAVAILABLE" and "max_batch_size" in broken["reason"]
    ready = {e["name"] for e in client.get_model_repository_index() if e.get("state") == "READY"}
    assert "add_sub" in ready and "broken" not in ready
    meta = client.get_server_metadata()
    assert "model_repository" in meta["extensions"]


def test_unload_and_load_change_what_serves_over_http(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    infer_add_sub(client, cm.TOGGLE)
    client.unload_model(cm.TOGGLE)
    assert not client.is_model_ready(cm.TOGGLE)
    (entry,) = index_of(client)[cm.TOGGLE]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
    with pytest.raises(InferenceServerException):
        infer_add_sub(client, cm.TOGGLE)
    infer_add_sub(client, "add_sub")  # the others are untouched
    client.load_model(cm.TOGGLE)
    assert client.is_model_ready(cm.TOGGLE)
    infer_add_sub(client, cm.TOGGLE)


def test_unload_and_load_over_grpc(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.unload_model(cm.GRPC)
    assert not client.is_model_ready(cm.GRPC)
    states = {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}
    assert states[cm.GRPC] == ("UNAVAILABLE", "unloaded")
    client.load_model(cm.GRPC)
    assert client.is_model_ready(cm.GRPC)
    inputs, a, b = add_sub_inputs(grpcclient)
    np.testing.assert_array_equal(client.infer(cm.GRPC, inputs).as_numpy("OUTPUT1"), a - b)


def test_unknown_models(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("no_such_model")  # succeeds, as in Triton
    with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
        client.load_model("no_such_model")
    assert client.is_server_ready()


def test_config_override_is_honoured_and_kept_by_a_plain_load(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_metadata(cm.OVERRIDE)["versions"] == ["2"]  # default policy: the latest
    override = {
        "name": cm.OVERRIDE,
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "version_policy": {"specific": {"versions": [1]}},
    }
    client.load_model(cm.OVERRIDE, config=json.dumps(override))
    assert client.get_model_metadata(cm.OVERRIDE)["versions"] == ["1"]
    infer_add_sub(client, cm.OVERRIDE, "1")
    client.load_model(cm.OVERRIDE)  # no config: the override stays
    assert client.get_model_metadata(cm.OVERRIDE)["versions"] == ["1"]


def test_load_from_files_sent_with_the_request(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    model_bytes = (server.repo / "add_sub" / "1" / "model.onnx").read_bytes()
    config = {"name": cm.UPLOADED, "backend": "onnxruntime", "max_batch_size": 8}
    client.load_model(cm.UPLOADED, config=json.dumps(config), files={"file:1/model.onnx": model_bytes})
    assert client.is_model_ready(cm.UPLOADED)
    infer_add_sub(client, cm.UPLOADED)
    client.unload_model(cm.UPLOADED)
    assert not client.is_model_ready(cm.UPLOADED)


def test_reload_under_steady_load_loses_no_request(server: Server) -> None:
    stop = threading.Event()
    done: list[int] = []
    errors: list[str] = []

    def clients(n: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        count = 0
        while not stop.is_set():
            try:
                infer_add_sub(client, cm.RELOAD)
                count += 1
            except Exception as exc:
                errors.append(str(exc))
        done.append(count)

    threads = [threading.Thread(target=clients, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S)
        config = {
            "name": cm.RELOAD,
            "backend": "onnxruntime",
            "max_batch_size": 8,
            "dynamic_batching": {"max_queue_delay_microseconds": 700},
        }
        t0 = time.monotonic()
        client.load_model(cm.RELOAD, config=json.dumps(config))
        reload_s = time.monotonic() - t0
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert errors == [], errors[:5]
    assert sum(done) > 50, done
    cfg = httpclient.InferenceServerClient(server.http_url).get_model_config(cm.RELOAD)
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 700
    print(f"reload under load: {sum(done)} requests, 0 failed, load call took {reload_s:.1f}s")


# -- poll mode ------------------------------------------------------------------------------------------


def test_poll_serves_a_new_version(poll_server: Server) -> None:
    client = httpclient.InferenceServerClient(poll_server.http_url)
    assert client.get_model_metadata(cm.POLLED)["versions"] == ["1"]
    shutil.copytree(poll_server.repo / cm.POLLED / "1", poll_server.repo / cm.POLLED / "2")
    took = wait_until(lambda: client.get_model_metadata(cm.POLLED)["versions"] == ["2"], "version 2")
    infer_add_sub(client, cm.POLLED, "2")
    print(f"poll: version 2 served {took:.1f}s after it appeared")


def test_poll_stops_a_removed_model(poll_server: Server) -> None:
    client = httpclient.InferenceServerClient(poll_server.http_url)
    infer_add_sub(client, cm.REMOVED)
    shutil.rmtree(poll_server.repo / cm.REMOVED)
    wait_until(lambda: not client.is_model_ready(cm.REMOVED), "the removed model to stop")
    with pytest.raises(InferenceServerException):
        infer_add_sub(client, cm.REMOVED)
    with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
        client.load_model(cm.POLLED)


# -- autoscaling -----------------------------------------------------------------------------------------


def instances(server: Server, model: str) -> int:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    match = re.search(rf'serve_app_model_instances{{model="{model}",version="1"}} (\d+)', text)
    return int(match.group(1)) if match else 0


def test_autoscaling_follows_the_load(poll_server: Server) -> None:
    assert instances(poll_server, cm.SCALED) == 1
    stop = threading.Event()
    errors: list[str] = []

    def load() -> None:
        client = httpclient.InferenceServerClient(poll_server.http_url)
        x = np.ones((1, 1), np.float32)
        while not stop.is_set():
            inp = httpclient.InferInput("IN", [1, 1], "FP32")
            inp.set_data_from_numpy(x)
            try:
                client.infer(cm.SCALED, [inp])
            except Exception as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        up = wait_until(lambda: instances(poll_server, cm.SCALED) == 2, "a second instance under load")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    down = wait_until(lambda: instances(poll_server, cm.SCALED) == 1, "scaling back down after the load")
    assert errors == [], errors[:5]
    print(f"autoscaling: 1 -> 2 instances {up:.1f}s into the load, back to 1 {down:.1f}s after it stopped")


def seq_step(client: httpclient.InferenceServerClient, sid: int, *, start: bool = False, end: bool = False) -> int:
    """Adds 1 to the sequence's running sum and returns the sum."""
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.ones((1, 1), np.int32))
    out = [httpclient.InferRequestedOutput("OUTPUT")]
    result = client.infer(cm.SCALED_SEQ, [inp], outputs=out, sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def test_sequence_autoscaling_keeps_replicas_with_live_sequences(poll_server: Server) -> None:
    """Full slots scale a sequence model up; when it scales down, the replica Serve stops keeps serving its
    live sequence until that sequence ends (it takes no new one meanwhile)."""
    client = httpclient.InferenceServerClient(poll_server.http_url, network_timeout=WAIT_S)
    assert instances(poll_server, cm.SCALED_SEQ) == 1
    sums = {sid: seq_step(client, sid, start=True) for sid in (101, 102)}  # both slots of the one instance
    # Two more sequences wait in the backlog until the autoscaler adds an instance.
    results: dict[int, int] = {}

    def start(sid: int) -> None:
        results[sid] = seq_step(
            httpclient.InferenceServerClient(poll_server.http_url, network_timeout=WAIT_S), sid, start=True
        )

    threads = [threading.Thread(target=start, args=(sid,)) for sid in (103, 104)]
    for t in threads:
        t.start()
    up = wait_until(lambda: len(results) == 2, "backlogged sequences to get the new instance's slots")
    for t in threads:
        t.join()
    assert results == {103: 1, 104: 1}
    # The gauge counts the instances this gateway reaches, refreshed apart from the router's discovery.
    wait_until(lambda: instances(poll_server, cm.SCALED_SEQ) == 2, "the gateway to count the new instance")
    sums.update(results)
    for sid in (101, 102, 103):
        assert seq_step(client, sid, end=True) == sums.pop(sid) + 1
    # One live sequence left: the policy asks for one instance, and Serve stops the newer one, which holds it.
    t0 = time.monotonic()
    scaled_down_at = None
    while time.monotonic() - t0 < 20:
        sums[104] += 1
        assert seq_step(client, 104) == sums[104]  # never lost, whichever instance is stopping
        if scaled_down_at is None and instances(poll_server, cm.SCALED_SEQ) == 1:
            scaled_down_at = time.monotonic() - t0
            # A new sequence meanwhile goes to the instance that stays.
            assert seq_step(client, 105, start=True) == 1
            assert seq_step(client, 105, end=True) == 2
        if scaled_down_at is not None and time.monotonic() - t0 > scaled_down_at + 3:
            break
        time.sleep(0.25)
    assert scaled_down_at is not None, "the model did not scale down with one live sequence"
    assert seq_step(client, 104, end=True) == sums[104] + 1
    print(
        f"sequence autoscaling: up in {up:.1f}s; down {scaled_down_at:.1f}s after 3 of 4 sequences ended, "
        f"the last one kept its instance to its end"
    )
