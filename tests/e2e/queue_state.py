"""The server's queue as its metrics port shows it, for tests that need requests queued before going on."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics(server: Server) -> Samples:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(family.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(values: Samples, name: str, **labels: str) -> float:
    return values[(name, frozenset(labels.items()))]


def wait_queued(server: Server, count: int, model: str, timeout_s: float = 60.0) -> None:
    """Wait until ``count`` requests wait in the model's queue (the pending count: queued, not yet sent to an
    instance; a request that finds an idle instance is never counted)."""
    deadline = time.monotonic() + timeout_s
    seen = -1.0
    while time.monotonic() < deadline:
        seen = metric(metrics(server), "nv_inference_pending_request_count", model=model, version="1")
        if seen == count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} requests never queued for {model} (last seen: {seen:g})")
