"""Custom metrics (Triton's MetricFamily): a process's registry, its snapshots, and a gateway's merged text."""

from __future__ import annotations

import pytest

from serve_app.inference import custom_metrics
from serve_app.inference.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    Collected,
    MetricError,
    Registry,
    Snapshot,
    labels_of,
)

LATENCY = labels_of({"version": "1", "model": "m"})


def test_a_process_registry_and_its_snapshot() -> None:
    registry = Registry()
    assert registry.snapshot() is None  # nothing to carry
    registry.family("latency_ns", "Cumulative time", COUNTER)
    registry.family("latency_ns", "another description", COUNTER)  # the same family
    registry.add_metric("latency_ns", LATENCY, None)
    registry.increment("latency_ns", LATENCY, 5)
    registry.increment("latency_ns", LATENCY, 2.5)
    assert registry.value("latency_ns", LATENCY) == 7.5
    snapshot = registry.snapshot()
    assert snapshot is not None and snapshot.source == registry.source
    (family,) = snapshot.families
    assert (family.name, family.description, family.kind, family.values) == (
        "latency_ns",
        "Cumulative time",
        COUNTER,
        ((LATENCY, 7.5),),
    )


def test_operations_a_kind_does_not_have_are_refused() -> None:
    registry = Registry()
    registry.family("c", "", COUNTER)
    registry.family("g", "", GAUGE)
    registry.family("h", "", HISTOGRAM)
    with pytest.raises(MetricError, match="cannot be declared as a gauge"):
        registry.family("c", "", GAUGE)
    registry.add_metric("c", (), None)
    with pytest.raises(MetricError, match="incremented monotonically by non-negative values"):
        registry.increment("c", (), -1)
    with pytest.raises(MetricError, match="COUNTER does not support Set"):
        registry.set("c", (), 1)
    with pytest.raises(MetricError, match="GAUGE does not support Observe"):
        registry.observe("g", (), 1)
    registry.add_metric("h", (), [1.0])
    with pytest.raises(MetricError, match="HISTOGRAM does not support Value"):
        registry.value("h", ())


def snapshot_of(registry: Registry, taken: float) -> Snapshot:
    snap = registry.snapshot()
    assert snap is not None
    return Snapshot(snap.source, taken, snap.families)


def test_a_gateway_merges_the_processes_as_one_family_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counters add up over the processes, a gauge shows the value set last, histograms add up bucket by bucket;
    labels in name order, as Triton's exporter writes them."""
    # render() also reads this process's own registry: an empty one, whatever earlier tests' models declared
    monkeypatch.setattr(custom_metrics, "REGISTRY", Registry())
    first, second = Registry(), Registry()
    for registry, (count, gauge) in ((first, (3, 10)), (second, (4, 20))):
        registry.family("requests_total", "Requests seen", COUNTER)
        registry.family("queue_depth", "Queue depth", GAUGE)
        registry.family("sizes", "Sizes", HISTOGRAM)
        registry.add_metric("requests_total", LATENCY, None)
        registry.add_metric("queue_depth", (), None)
        registry.add_metric("sizes", (), [1.0, 10.0])
        registry.increment("requests_total", LATENCY, count)
        registry.set("queue_depth", (), gauge)
        registry.observe("sizes", (), count)
    collected = Collected()
    collected.record(snapshot_of(second, 2.0))
    collected.record(snapshot_of(first, 1.0))
    collected.record(snapshot_of(second, 0.5))  # older than what it has: ignored
    assert collected.render() == [
        "# HELP queue_depth Queue depth",
        "# TYPE queue_depth gauge",
        "queue_depth 20",
        "# HELP requests_total Requests seen",
        "# TYPE requests_total counter",
        'requests_total{model="m",version="1"} 7',
        "# HELP sizes Sizes",
        "# TYPE sizes histogram",
        'sizes_bucket{le="1"} 0',
        'sizes_bucket{le="10"} 2',
        'sizes_bucket{le="+Inf"} 2',
        "sizes_sum 7",
        "sizes_count 2",
    ]
