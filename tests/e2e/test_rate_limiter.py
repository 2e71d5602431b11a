"""The rate limiter with stock clients, on the e2e server (``--rate-limit execution_count``): ``rl_first``,
``rl_high`` (priority 1) and ``rl_low`` (priority 2) each need the one unit of resource R.  While
``rl_first`` holds R (until the test opens its gate), a request to ``rl_low`` and then one to ``rl_high``
wait; once R is free, ``rl_high`` goes first, and no two executions ever overlap (each model logs its
executions' starts and ends in one file)."""

from __future__ import annotations

import pathlib
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Server

WAIT_S = 120.0


def pending(server: Server) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    return {
        dict(s.labels)["model"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "nv_inference_pending_request_count"
        for s in f.samples
        if dict(s.labels)["model"].startswith("rl_")
    }


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.05)


def inputs() -> list[grpcclient.InferInput]:
    inp = grpcclient.InferInput("IN", [1, 1], "FP32")
    inp.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [inp]


def test_models_sharing_one_unit_never_execute_at_once_and_the_higher_priority_goes_first(server: Server) -> None:
    root = pathlib.Path(server.repo)
    log, gate = root / "rl_log.txt", root / "rl_open"
    gate.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    pool = ThreadPoolExecutor(max_workers=8)
    try:
        first = pool.submit(client.infer, "rl_first", inputs())
        wait_until(lambda: log.exists() and "rl_first start" in log.read_text(), "rl_first holds R")
        low = pool.submit(client.infer, "rl_low", inputs())
        wait_until(lambda: pending(server).get("rl_low") == 1, "rl_low waits")
        high = pool.submit(client.infer, "rl_high", inputs())
        wait_until(lambda: pending(server).get("rl_high") == 1, "rl_high waits")
        more = [pool.submit(client.infer, name, inputs()) for name in ("rl_low", "rl_high") * 3]
        gate.touch()
        for f in (first, low, high, *more):
            f.result(timeout=WAIT_S)
    finally:
        gate.touch()
        pool.shutdown(wait=True)
        client.close()
    events = log.read_text().split("\n")[:-1]
    running = 0
    for event in events:  # starts and ends alternate: one execution at a time
        running += 1 if event.endswith("start") else -1
        assert running in (0, 1), events
    starts = [e.split()[0] for e in events if e.endswith("start")]
    assert starts[:3] == ["rl_first", "rl_high", "rl_low"], starts
    assert len(starts) == 9
