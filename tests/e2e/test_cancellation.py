"""Requests whose client gives up while they wait in the queue: a stock gRPC client cancelling its call, and
an HTTP client closing its connection.  Each leaves the queue at once, never executes, and counts as failed
with reason CANCELED (statistics and metrics), as Triton counts a request cancelled in its batcher's queue.

``gate`` executes one request at a time and only once the test opens its gate, so a second request observably
waits in the queue (the pending-request gauge says so) for as long as the test needs.
"""

from __future__ import annotations

import json
import pathlib
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from queue import Queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Server

WAIT_S = 120.0
LABELS = {"model": "gate", "version": "1"}


def gauges(server: Server) -> dict[str, float]:
    """gate's pending-request gauge and CANCELED failure counter."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            if labels.get("model") != "gate":
                continue
            if family.name == "nv_inference_pending_request_count":
                out["pending"] = s.value
            elif family.name == "nv_inference_request_failure" and labels.get("reason") == "CANCELED":
                out["canceled"] = s.value
    return out


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.05)


def inputs(value: float) -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return [inp]


@pytest.fixture
def gate(server: Server) -> Iterator[pathlib.Path]:
    d = server.repo / "gate"
    (d / "open").unlink(missing_ok=True)
    try:
        yield d
    finally:
        (d / "open").touch()  # never leave an execution waiting


def http_infer_bytes(host_port: str, value: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}).encode()
    head = (
        f"POST /v2/models/gate/infer HTTP/1.1\r\nHost: {host_port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_queued_requests_cancelled_by_their_clients_never_execute(server: Server, gate: pathlib.Path) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = client.get_inference_statistics("gate", "1").model_stats[0]
    canceled_before = gauges(server).get("canceled", 0.0)
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        running = pool.submit(client.infer, "gate", inputs(1.0))
        wait_until(lambda: (gate / "running").exists(), "the first request executes")

        # A stock gRPC client cancels its queued call.
        answers: Queue[Any] = Queue()
        call = client.async_infer("gate", inputs(2.0), callback=lambda result, error: answers.put(error))
        wait_until(lambda: gauges(server).get("pending") == 1, "the gRPC request waits in the queue")
        call.cancel()
        error = answers.get(timeout=WAIT_S)
        assert error is not None and "CANCELLED" in str(error.status())
        wait_until(
            lambda: gauges(server) == {"pending": 0, "canceled": canceled_before + 1},
            "the cancelled gRPC request left the queue, counted CANCELED",
        )

        # An HTTP client closes its connection while its request waits.
        host, port = server.http_url.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(http_infer_bytes(server.http_url, 3.0))
            wait_until(lambda: gauges(server).get("pending") == 1, "the HTTP request waits in the queue")
        wait_until(
            lambda: gauges(server) == {"pending": 0, "canceled": canceled_before + 2},
            "the HTTP request whose connection closed left the queue, counted CANCELED",
        )

        (gate / "open").touch()
        np.testing.assert_array_equal(running.result(timeout=WAIT_S).as_numpy("OUT"), [[1.0]])
    finally:
        (gate / "open").touch()
        pool.shutdown(wait=True)

    after = client.get_inference_statistics("gate", "1").model_stats[0]
    assert after.execution_count - before.execution_count == 1  # only the first request ever ran
    assert after.inference_count - before.inference_count == 1
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 2
    assert after.inference_stats.success.count - before.inference_stats.success.count == 1
    client.close()
