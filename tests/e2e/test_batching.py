"""The dynamic batcher, the statistics extension and the metrics port, against the real server.

``batch8`` waits up to 5 s for a preferred batch of 8; ``prio_gate`` executes one request at a time, and only
once the test opens its gate, so requests sent meanwhile wait in the queue for as long as the test needs; its
priority levels carry different queue policies (see ``SLOW_BATCHING`` in conftest).  Each test owns its model's
counters or only looks at differences, so the order of tests does not matter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import Server
from tests.e2e.queue_state import metric, metrics, wait_queued

GATE = "prio_gate"


@pytest.fixture(scope="module")
def http(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, concurrency=16)


@pytest.fixture(scope="module")
def grpc(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def add_sub_request(value: float) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.full((1, 16), value, np.float32))
    inputs[1].set_data_from_numpy(np.ones((1, 16), np.float32))
    return inputs


def slow_inputs(value: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [inp]


class Gate:
    """``prio_gate`` closed for one scene: its instance holds the first request while the test queues others,
    and the model's log says in which order they then executed."""

    def __init__(self, server: Server, client: grpcclient.InferenceServerClient) -> None:
        self.dir = server.repo / GATE
        self.client = client
        self.pool = ThreadPoolExecutor(max_workers=8)

    def send(self, value: float, **kwargs: Any) -> Future[Any]:
        return self.pool.submit(lambda: self.client.infer(GATE, slow_inputs(value), **kwargs).as_numpy("OUT"))

    def close_with_one_running(self) -> Future[Any]:
        """Close the gate and send a request of the default level (value 1): it executes and waits there."""
        (self.dir / "open").unlink(missing_ok=True)
        (self.dir / "order.txt").unlink(missing_ok=True)
        first = self.send(1.0)
        deadline = time.monotonic() + 60
        while not (self.dir / "running").exists():
            assert time.monotonic() < deadline and not first.done(), "the first request never executed"
            time.sleep(0.01)
        return first

    def open(self) -> None:
        (self.dir / "open").touch()

    def order(self) -> list[float]:
        """The values of the requests executed since the gate closed, in order."""
        return [float(v) for v in (self.dir / "order.txt").read_text().split()]


@pytest.fixture
def gate(server: Server, grpc: grpcclient.InferenceServerClient) -> Iterator[Gate]:
    g = Gate(server, grpc)
    yield g
    g.open()  # also after a failure: the other tests find it open
    g.pool.shutdown(wait=True)


def stats_of(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    return client.get_inference_statistics(model)["model_stats"][0]


# ------------------------------------------------------------------------ dynamic batching


def test_preferred_batch_of_eight_is_one_execution(
    server: Server, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    futures = [http.async_infer("batch8", add_sub_request(float(i))) for i in range(8)]
    results = [f.get_result() for f in futures]
    for i, r in enumerate(results):  # each request gets its own rows back
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full((1, 16), i + 1, np.float32))
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.full((1, 16), i - 1, np.float32))

    st = stats_of(http, "batch8")
    assert st["version"] == "1"
    assert st["inference_count"] == 8
    assert st["execution_count"] == 1
    infer = st["inference_stats"]
    assert infer["success"]["count"] == 8
    assert infer["fail"]["count"] == 0
    # counted per request: the one execution's compute time is added for each of the 8
    assert infer["compute_infer"]["count"] == 8
    assert infer["queue"]["count"] == 8 and infer["queue"]["ns"] > 0
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in st["batch_stats"]] == [(8, 1)]
    assert st["last_inference"] > 1.6e12  # milliseconds since the epoch

    # gRPC reports the same figures
    g = grpc.get_inference_statistics("batch8", as_json=True)["model_stats"][0]
    assert (int(g["inference_count"]), int(g["execution_count"])) == (8, 1)
    assert [(int(b["batch_size"]), int(b["compute_infer"]["count"])) for b in g["batch_stats"]] == [(8, 1)]

    # and so do the metrics, with the config's metric_tags as labels
    m = metrics(server)
    labels = {"model": "batch8", "version": "1", "team": "vision"}
    assert metric(m, "nv_inference_count", **labels) == 8
    assert metric(m, "nv_inference_exec_count", **labels) == 1
    assert metric(m, "nv_inference_request_success", **labels) == 8
    assert metric(m, "nv_inference_request_failure", reason="REJECTED", **labels) == 0
    assert metric(m, "nv_inference_pending_request_count", **labels) == 0
    assert metric(m, "nv_inference_compute_infer_duration_us", **labels) == infer["compute_infer"]["ns"] // 1000
    assert metric(m, "nv_inference_queue_duration_us", **labels) == infer["queue"]["ns"] // 1000


def test_priority_one_overtakes_queued_priority_two(server: Server, gate: Gate) -> None:
    first = gate.close_with_one_running()
    queued = []
    for n, value in enumerate((2.0, 3.0), start=1):  # default level 2, one after the other
        queued.append(gate.send(value))
        wait_queued(server, n, GATE)
    urgent = gate.send(9.0, priority=1)
    wait_queued(server, 3, GATE)
    gate.open()
    for f in (first, urgent, *queued):
        f.result(timeout=60)
    assert gate.order() == [1.0, 9.0, 2.0, 3.0]
    assert urgent.result()[0, 0] == 9.0


def test_full_queue_rejects_at_once(
    server: Server, http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, gate: Gate
) -> None:
    before = stats_of(http, GATE)["inference_stats"]["fail"]["count"]
    first = gate.close_with_one_running()
    held = gate.send(2.0, priority=3)  # level 3 holds one request
    wait_queued(server, 1, GATE)
    # rejected while the gate is still closed: without waiting for the instance
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(GATE, slow_inputs(3.0), priority=3)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "Exceeds maximum queue size" in info.value.message()
    gate.open()
    first.result(timeout=60)
    assert held.result(timeout=60)[0, 0] == 2.0  # the queued one is still served
    assert stats_of(http, GATE)["inference_stats"]["fail"]["count"] == before + 1


def test_full_queue_over_http_is_503(server: Server, gate: Gate) -> None:
    import httpx

    body = {
        "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}],
        "parameters": {"priority": 3},
    }
    first = gate.close_with_one_running()
    held = gate.send(2.0, priority=3)
    wait_queued(server, 1, GATE)
    r = httpx.post(f"http://{server.http_url}/v2/models/{GATE}/infer", json=body, timeout=30)
    gate.open()
    first.result(timeout=60)
    held.result(timeout=60)
    assert r.status_code == 503
    assert "Exceeds maximum queue size" in r.json()["error"]


def test_timed_out_request_is_rejected(server: Server, grpc: grpcclient.InferenceServerClient, gate: Gate) -> None:
    rejected_before = metric(
        metrics(server), "nv_inference_request_failure", model=GATE, version="1", reason="REJECTED"
    )
    first = gate.close_with_one_running()
    # level 4 rejects on timeout; the request shortens the 10 s default to 100 ms, and fails while the gate is closed
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(GATE, slow_inputs(2.0), priority=4, timeout=100_000)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "Request timeout expired" in info.value.message()
    gate.open()
    first.result(timeout=60)
    after = metric(metrics(server), "nv_inference_request_failure", model=GATE, version="1", reason="REJECTED")
    assert after == rejected_before + 1


def test_timed_out_request_is_delayed_not_dropped(server: Server, gate: Gate) -> None:
    first = gate.close_with_one_running()
    late = gate.send(2.0, priority=5, timeout=20_000)  # DELAY level: expires while queued
    wait_queued(server, 1, GATE)
    time.sleep(0.05)  # not an ordering: at least the 20 ms of its timeout pass while it waits
    fresh = gate.send(3.0, priority=5)  # same level, not expired: goes first
    wait_queued(server, 2, GATE)
    gate.open()
    first.result(timeout=60)
    assert fresh.result(timeout=60)[0, 0] == 3.0
    assert late.result(timeout=60)[0, 0] == 2.0  # served late, not rejected
    assert gate.order() == [1.0, 3.0, 2.0]


def test_bad_priority_is_invalid_and_counts_nowhere(server: Server, http: httpclient.InferenceServerClient) -> None:
    import httpx

    before = stats_of(http, "slow")
    body = {
        "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}],
        "parameters": {"priority": "high"},
    }
    r = httpx.post(f"http://{server.http_url}/v2/models/slow/infer", json=body, timeout=30)
    assert r.status_code == 400
    assert "priority" in r.json()["error"]
    after = stats_of(http, "slow")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["inference_count"] == before["inference_count"]


# ------------------------------------------------------------------------ statistics endpoints


def test_statistics_of_every_model_and_errors(server: Server, http: httpclient.InferenceServerClient) -> None:
    import httpx

    everything = httpx.get(f"http://{server.http_url}/v2/models/stats", timeout=10).json()["model_stats"]
    names = {(s["name"], s["version"]) for s in everything}
    assert {("add_sub", "1"), ("batch8", "1"), ("slow", "1"), ("versioned", "2"), ("versioned", "3")} <= names
    assert all(s["memory_usage"] == [] for s in everything)
    one = httpx.get(f"http://{server.http_url}/v2/models/versioned/versions/3/stats", timeout=10).json()
    assert [(s["name"], s["version"]) for s in one["model_stats"]] == [("versioned", "3")]
    fields = set(one["model_stats"][0]["inference_stats"])
    assert fields == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }

    r = httpx.get(f"http://{server.http_url}/v2/models/nope/stats", timeout=10)
    assert r.status_code == 400
    assert r.json() == {"error": "requested model 'nope' is not available"}
    r = httpx.get(f"http://{server.http_url}/v2/models/versioned/versions/1/stats", timeout=10)
    assert r.status_code == 400
    assert "not available" in r.json()["error"]
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "statistics" in http.get_server_metadata()["extensions"]


def test_metrics_endpoint_serves_every_model(server: Server) -> None:
    m = metrics(server)
    names = {name for name, _ in m}
    assert {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
    } <= names
    models = {dict(labels)["model"] for _, labels in m}
    assert {"add_sub", "batch8", "slow", "identity_all"} <= models
    assert "broken" not in models


def test_stats_follow_traffic(http: httpclient.InferenceServerClient, server: Server) -> None:
    before = stats_of(http, "add_sub")
    http.infer("add_sub", add_sub_request(1.0))
    http.infer("add_sub", add_sub_request(1.0))
    after = stats_of(http, "add_sub")
    assert after["inference_count"] == before["inference_count"] + 2
    assert after["execution_count"] == before["execution_count"] + 2  # no dynamic batching: one each
    check: Callable[[dict[str, Any]], int] = lambda s: s["inference_stats"]["success"]["count"]  # noqa: E731
    assert check(after) == check(before) + 2
