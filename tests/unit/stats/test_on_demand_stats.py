"""The load-on-demand figures on the metrics page: counters and a load-time histogram per model."""

from __future__ import annotations

from serve_app.stats.on_demand import OnDemandStats


def test_counters_and_a_cumulative_histogram_per_model() -> None:
    stats = OnDemandStats()
    stats.record_load("a", 0.3)
    stats.record_load("a", 7.0)
    stats.of("b").load_failures += 1
    stats.of("a").evictions += 1
    stats.of('q"x').waited += 2
    page = stats.render()
    assert 'nv_model_on_demand_loads_total{model="a"} 2' in page
    assert 'nv_model_on_demand_load_failures_total{model="b"} 1' in page
    assert 'nv_model_on_demand_evictions_total{model="a"} 1' in page
    assert 'nv_model_on_demand_waited_requests_total{model="q\\"x"} 2' in page
    assert 'nv_model_on_demand_load_duration_seconds_bucket{model="a",le="0.25"} 0' in page
    assert 'nv_model_on_demand_load_duration_seconds_bucket{model="a",le="0.5"} 1' in page
    assert 'nv_model_on_demand_load_duration_seconds_bucket{model="a",le="10"} 2' in page
    assert 'nv_model_on_demand_load_duration_seconds_bucket{model="a",le="+Inf"} 2' in page
    assert 'nv_model_on_demand_load_duration_seconds_count{model="a"} 2' in page
    assert "# TYPE nv_model_on_demand_load_duration_seconds histogram" in page
    assert stats.total("loads") == 2 and stats.total("waited") == 2


def test_no_model_no_samples() -> None:
    page = OnDemandStats().render()
    assert "{" not in page and "# TYPE nv_model_on_demand_loads_total counter" in page
