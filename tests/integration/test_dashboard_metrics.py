"""Every metric and label the Grafana dashboards in deploy/grafana query is one the server's /metrics page has:
the page of a service that served requests (one failed), read through the metrics app."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from serve_app.http_server import build_http_app
from serve_app.http_server.metrics import build_metrics_app
from serve_app.service import InferenceService
from serve_app.stats.on_demand import OnDemandStats
from tests.support.dashboards import DASHBOARDS, aggregation_labels, promql_selectors, queries
from tests.support.repos import ADD_SUB

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} \S+$")


async def metric_labels(service: InferenceService) -> dict[str, set[str]]:
    """Each metric on /metrics, with the labels of its samples."""
    inputs = [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for n in ("INPUT0", "INPUT1")]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_http_app(service)), base_url="http://s") as c:
        assert (await c.post(f"/v2/models/{ADD_SUB}/infer", json={"inputs": inputs})).status_code == 200
        assert (await c.post(f"/v2/models/{ADD_SUB}/infer", json={"inputs": inputs[:1]})).status_code == 400
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_metrics_app(service)), base_url="http://m"
    ) as c:
        page = (await c.get("/metrics")).text
    found: dict[str, set[str]] = {}
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            found.setdefault(line.split()[2], set())
        elif match := SAMPLE.match(line):
            found.setdefault(match[1], set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match[2]))
    return found


async def _on_demand_figures() -> OnDemandStats:
    stats = OnDemandStats()
    stats.record_load(ADD_SUB, 0.5)
    return stats


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
async def test_every_metric_and_label_a_dashboard_queries_exists(
    service: InferenceService, path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "on_demand_stats", _on_demand_figures)  # a server with --load-on-demand
    exported = await metric_labels(service)
    assert exported["nv_inference_request_failure"] >= {"model", "version", "reason"}
    dashboard = json.loads(path.read_text())  # type: ignore[attr-defined]
    for expr in queries(dashboard):
        selectors = promql_selectors(expr)
        assert selectors, expr
        for name, matchers in selectors:
            assert name in exported, f"{name} is not on /metrics: {expr}"
            assert {label for label, _, _ in matchers} <= exported[name], expr
        grouped = aggregation_labels(expr)
        assert grouped <= set().union(*(exported[name] for name, _ in selectors)), expr
