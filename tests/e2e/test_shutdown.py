"""SIGTERM: the server stops accepting (503), finishes the requests in progress, exits 0, prints its own
lines and not Ray's, and leaves no process of the Ray it started behind.  Its own small server: stopping
it is the test."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from scripts import example_models
from tests.e2e import cancel_models
from tests.e2e.conftest import start_server
from tests.e2e.queue_state import wait_queued


def session_processes(leader: int) -> set[int]:
    """Live processes in the session ``leader`` started (the server runs with start_new_session)."""
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, session = fields[0], int(fields[3])
        if session == leader and state != "Z":
            found.add(int(entry.name))
    return found


def test_sigterm_drains_requests_in_progress_and_exits_clean(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("drain_repo")
    example_models.add_sub(repo)
    gate = cancel_models.build(repo)  # executes once the test opens it: the requests are in progress till then
    server, _ = start_server(tmp_path_factory, repo, ["--exit-timeout-secs", "60"], "drain")
    pid = server.proc.pid
    assert len(session_processes(pid)) > 3  # the CLI, Ray's GCS, raylet, workers...
    results: list[object] = []

    def slow_request(i: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
        inp = httpclient.InferInput("IN", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), float(i), np.float32))
        try:
            results.append(float(client.infer("gate", [inp]).as_numpy("OUT")[0, 0]))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=slow_request, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    wait_queued(server, 3, "gate")  # one executes behind the closed gate, three wait
    server.proc.send_signal(signal.SIGTERM)
    refused = ready_refused = False
    deadline = time.monotonic() + 30
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}  # fmt: skip
    while not (refused and ready_refused) and time.monotonic() < deadline:
        try:
            r = httpx.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body, timeout=10)
            if r.status_code == 503:
                assert "shutting down" in r.json()["error"]
                refused = True
            ready = httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=10)
            ready_refused |= ready.status_code != 200  # Triton answers 400 while not ready
        except httpx.TransportError:
            break  # already gone: the asserts below say whether that was too early
        time.sleep(0.1)
    (gate / "open").touch()
    for t in threads:
        t.join(timeout=120)
    assert sorted(r for r in results if isinstance(r, float)) == [0.0, 1.0, 2.0, 3.0], results
    assert refused and ready_refused, "new requests were not refused with 503 (and ready with 400) while draining"
    assert server.proc.wait(timeout=120) == 0
    log = server.log.read_text()
    assert "shutting down: no new requests" in log
    # serve_app's lines only: not Ray's retries of the calls in flight to the Serve controller it kills
    assert "retries remaining" not in log and "(raylet)" not in log, log
    left: set[int] = set()
    for _ in range(100):
        left = session_processes(pid)
        if not left:
            break
        time.sleep(0.2)
    assert not left, [
        pathlib.Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in left if os.path.exists(f"/proc/{p}")
    ]
