"""The Grafana dashboards in deploy/grafana, offline: Grafana's own dashboard schema (tests/data/grafana), the
layout (unique panel ids, panels inside the 24-column grid and not overlapping), a data source and a model
variable every query uses, and PromQL that parses.  That every metric and label they query is one the server
exports is checked against a real /metrics page in tests/integration/test_dashboard_metrics.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.support.dashboards import DASHBOARDS, panels, promql_selectors, queries
from tests.support.paths import ROOT

SCHEMA = json.loads((ROOT / "tests" / "data" / "grafana" / "dashboard.schema.json").read_text())
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    path: Path = request.param
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS


def test_it_is_a_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    errors = [
        f"{list(e.absolute_path)}: {e.message[:300]}" for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(dashboard)
    ]
    assert errors == []
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 39


def test_a_data_source_variable_and_a_model_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["datasource"] == DATASOURCE
    assert model["multi"] and model["includeAll"] and model["allValue"] == ".*"
    assert model["query"] == "label_values(nv_inference_request_success, model)"


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in every:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells


def test_every_query_panel_uses_the_data_source_variable_and_the_model_variable(dashboard: dict[str, Any]) -> None:
    graphs = [p for p in panels(dashboard) if p["type"] != "row"]
    assert graphs
    for p in graphs:
        assert p["datasource"] == DATASOURCE and p["title"] and p.get("description"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE, p["title"]
            for name, matchers in promql_selectors(t["expr"]):
                assert ("model", "=~", "$model") in matchers, f"{p['title']}: {name} ignores the model variable"


def test_the_panels_cover_throughput_latency_failures_load_and_instances(dashboard: dict[str, Any]) -> None:
    metrics = {name for expr in queries(dashboard) for name, _ in promql_selectors(expr)}
    assert {
        "nv_inference_request_success",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_request_failure",
        "nv_inference_pending_request_count",
        "serve_app_model_instances",
    } <= metrics
    failures = [e for e in queries(dashboard) if "by (model, reason)" in e]
    assert failures, "no panel splits the failures by their reason"
