"""Real monitoring of the cluster: a Prometheus server scrapes every node's gateway, and every query of the
Grafana dashboard in deploy/grafana, evaluated by that Prometheus, returns series for the model under load."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.multinode import clients
from tests.multinode.conftest import METRICS_PORT, MultiNode, wait_until
from tests.multinode.prometheus import Prometheus, binary
from tests.support.dashboards import DASHBOARDS, queries
from tests.support.net import free_port

MODEL = "add_sub"
PER_GATEWAY = 10
TIMEOUT_S = 120.0
# Grafana's variables as Grafana substitutes them: the model picked, and a rate window that holds the load.
GRAFANA = {"$__rate_interval": "2m", "$__interval": "15s", "$__range": "1h", "$model": MODEL}


@pytest.fixture
def prometheus(multinode: MultiNode) -> Iterator[Prometheus]:
    path, why = binary()
    if path is None:
        pytest.skip(f"no Prometheus server: {why}")
    targets = [f"{node.address}:{METRICS_PORT}" for node in multinode.nodes]
    server = Prometheus(path, multinode.tmp / "prometheus", targets, free_port())
    try:
        yield server
    finally:
        server.close()


def failing_request(address: str) -> None:
    """An add_sub request missing an input: counted as a failure of the model."""
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException):
        clients.http(address).infer(MODEL, [inp])


def successes(address: str) -> int:
    stats = clients.http(address).get_inference_statistics(MODEL)
    (model,) = [m for m in stats["model_stats"] if m["name"] == MODEL]
    return int(model["inference_stats"]["success"]["count"])


def grafana_expr(expr: str) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    return expr


ON_DEMAND_ONLY = "nv_model_on_demand_"  # the families a server loading on demand exports


def test_prometheus_scrapes_every_node_and_every_dashboard_query_has_series(
    multinode: MultiNode, prometheus: Prometheus
) -> None:
    nodes = multinode.nodes

    def all_up() -> bool:
        up = prometheus.query('up{job="serve_app"}')
        return len(up) == len(nodes) and all(s["value"][1] == "1" for s in up)

    wait_until(all_up, TIMEOUT_S, f"Prometheus scraping {len(nodes)} gateways (log {prometheus.log})")
    for k, node in enumerate(nodes):
        client = clients.http(node.address) if k % 2 else clients.grpc(node.address)
        for _ in range(PER_GATEWAY):
            clients.add_sub(client)
        failing_request(node.address)
    expected = successes(nodes[0].address)

    def scraped(series: list[dict[str, Any]]) -> list[float]:
        return sorted(float(s["value"][1]) for s in series)

    # Each gateway reports every gateway's figures: every target, scraped, shows the whole cluster's count.
    counter = f'nv_inference_request_success{{model="{MODEL}"}}'
    wait_until(
        lambda: scraped(prometheus.query(counter)) == [expected] * len(nodes),
        TIMEOUT_S,
        f"{expected} successes of {MODEL} scraped from each of the {len(nodes)} gateways",
    )
    empty = []
    for path in DASHBOARDS:
        for expr in queries(json.loads(pathlib.Path(path).read_text())):
            if ON_DEMAND_ONLY in expr:  # series only with --load-on-demand (tests/integration/test_dashboard_metrics)
                continue
            result = prometheus.query(grafana_expr(expr))
            if not result or any(s["metric"].get("model") != MODEL for s in result):
                empty.append(f"{expr} -> {result}")
    assert not empty, "dashboard queries without series for the model under load:\n" + "\n".join(empty)
    (rate,) = prometheus.query(grafana_expr(queries(json.loads(pathlib.Path(DASHBOARDS[0]).read_text()))[0]))
    assert float(rate["value"][1]) > 0, rate
