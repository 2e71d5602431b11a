"""Triton's per-model Prometheus metrics: valid exposition text, Triton's names and labels, values from the stats."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_app.stats import ModelStats
from serve_app.stats.prometheus import CONTENT_TYPE, ModelMetrics, render

COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
GAUGES = ("nv_inference_pending_request_count",)
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

Samples = dict[str, list[tuple[dict[str, str], float]]]


def sample_stats() -> ModelStats:
    s = ModelStats("simple", "3")
    s.record_execution(2, 4_000, 40_000, 6_000)
    s.record_success(1, 1_234_567, 300_999, 4_000, 40_000, 6_000, now_ms=1)
    s.record_success(1, 2_000_000, 400_000, 4_000, 40_000, 6_000, now_ms=2)
    s.record_execution(4, 5_500, 50_500, 7_500)
    s.record_success(4, 3_000_500, 100_000, 5_500, 50_500, 7_500, now_ms=3)
    s.record_failure("REJECTED", 10_000, now_ms=4)
    s.record_failure("REJECTED", 20_000, now_ms=4)
    s.record_failure("BACKEND", 30_000, now_ms=5, executed_ns=1)
    s.record_failure("OTHER", 40_000, now_ms=6)
    s.pending = 5
    return s


def text_of(models: list[ModelMetrics]) -> str:
    body = render(models)
    assert isinstance(body, bytes)
    return body.decode()


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Family name -> type, and family name -> (labels, value) of its samples."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        samples[family.name] = [(dict(s.labels), s.value) for s in family.samples]
    return types, samples


def value(samples: Samples, family: str, labels: Mapping[str, str]) -> float:
    matches = [v for lb, v in samples[family] if lb == dict(labels)]
    assert len(matches) == 1, (family, labels, samples[family])
    return matches[0]


def test_content_type() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_output_parses_with_triton_families_and_types() -> None:
    text = text_of([ModelMetrics(sample_stats(), {})])
    assert text.endswith("\n")
    types, _ = parse(text)
    assert types == {**dict.fromkeys(COUNTERS, "counter"), **dict.fromkeys(GAUGES, "gauge")}


def test_names_have_no_total_suffix() -> None:
    text = text_of([ModelMetrics(sample_stats(), {})])
    assert "_total" not in text
    names = set()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", line)
        assert match, line
        names.add(match.group(1))
    assert names == set(COUNTERS) | set(GAUGES)


def test_each_family_has_help_and_type_once() -> None:
    text = text_of([ModelMetrics(sample_stats(), {}), ModelMetrics(ModelStats("other", "1"), {})])
    for name in (*COUNTERS, *GAUGES):
        assert len(re.findall(rf"^# HELP {name} ", text, flags=re.M)) == 1
        kind = "gauge" if name in GAUGES else "counter"
        assert len(re.findall(rf"^# TYPE {name} {kind}$", text, flags=re.M)) == 1


def test_values_equal_the_statistics() -> None:
    stats = sample_stats()
    _, samples = parse(text_of([ModelMetrics(stats, {})]))
    lb = {"model": "simple", "version": "3"}
    assert value(samples, "nv_inference_request_success", lb) == 3
    assert value(samples, "nv_inference_count", lb) == 6  # sum of batch sizes
    assert value(samples, "nv_inference_exec_count", lb) == 2
    assert value(samples, "nv_inference_pending_request_count", lb) == 5


def test_durations_are_cumulative_microseconds() -> None:
    stats = sample_stats()
    _, samples = parse(text_of([ModelMetrics(stats, {})]))
    lb = {"model": "simple", "version": "3"}
    # success: 1_234_567 + 2_000_000 + 3_000_500 = 6_235_067 ns
    assert value(samples, "nv_inference_request_duration_us", lb) == 6_235
    # queue: 300_999 + 400_000 + 100_000 = 800_999 ns
    assert value(samples, "nv_inference_queue_duration_us", lb) == 800
    assert value(samples, "nv_inference_compute_input_duration_us", lb) == 13  # 13_500 ns
    assert value(samples, "nv_inference_compute_infer_duration_us", lb) == 130  # 130_500 ns
    assert value(samples, "nv_inference_compute_output_duration_us", lb) == 19  # 19_500 ns
    for name, field in [
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ]:
        assert value(samples, name, lb) == stats.inference[field].ns // 1000


def test_failures_by_reason() -> None:
    stats = sample_stats()
    text = text_of([ModelMetrics(stats, {})])
    _, samples = parse(text)
    failures = samples["nv_inference_request_failure"]
    assert [lb["reason"] for lb, _ in failures] == list(REASONS)
    for lb, _ in failures:
        assert lb == {"model": "simple", "version": "3", "reason": lb["reason"]}
    got = {lb["reason"]: v for lb, v in failures}
    assert got == {"REJECTED": 2, "CANCELED": 0, "BACKEND": 1, "OTHER": 1}
    assert got == {r: stats.failures[r] for r in REASONS}
    assert 'nv_inference_request_failure{model="simple",reason="REJECTED",version="3"} 2' in text.splitlines()


def test_exact_sample_lines() -> None:
    lines = text_of([ModelMetrics(sample_stats(), {})]).splitlines()
    assert 'nv_inference_request_success{model="simple",version="3"} 3' in lines
    assert 'nv_inference_count{model="simple",version="3"} 6' in lines
    assert 'nv_inference_exec_count{model="simple",version="3"} 2' in lines
    assert 'nv_inference_request_duration_us{model="simple",version="3"} 6235' in lines
    assert 'nv_inference_pending_request_count{model="simple",version="3"} 5' in lines


def test_metric_tags_become_labels() -> None:
    text = text_of([ModelMetrics(sample_stats(), {"team": "vision", "tier": "gold"})])
    types, samples = parse(text)
    lb = {"model": "simple", "version": "3", "team": "vision", "tier": "gold"}
    for name in types:
        if name == "nv_inference_request_failure":
            for labels, _ in samples[name]:
                assert labels == {**lb, "reason": labels["reason"]}
        else:
            assert [labels for labels, _ in samples[name]] == [lb]
    assert value(samples, "nv_inference_exec_count", lb) == 2


def test_tag_names_are_sanitized_and_values_escaped() -> None:
    tags = {"my-tag.x": 'say "hi"\\ \nbye', "9lives": "dropped", "model": "spoofed", "version": "spoofed"}
    text = text_of([ModelMetrics(sample_stats(), tags)])
    _, samples = parse(text)
    labels = samples["nv_inference_count"][0][0]
    assert labels == {"model": "simple", "version": "3", "my_tag_x": 'say "hi"\\ \nbye'}
    assert "spoofed" not in text
    assert "dropped" not in text


def test_several_models() -> None:
    a = sample_stats()
    b = ModelStats("other", "12")
    b.record_execution(1, 0, 0, 0)
    b.record_success(1, 9_000, 0, 0, 0, 0, now_ms=1)
    text = text_of([ModelMetrics(a, {}), ModelMetrics(b, {"team": "t"})])
    _, samples = parse(text)
    la = {"model": "simple", "version": "3"}
    lb = {"model": "other", "version": "12", "team": "t"}
    assert value(samples, "nv_inference_count", la) == 6
    assert value(samples, "nv_inference_count", lb) == 1
    assert value(samples, "nv_inference_request_duration_us", lb) == 9
    assert value(samples, "nv_inference_request_failure", {**lb, "reason": "REJECTED"}) == 0
    assert len(samples["nv_inference_request_failure"]) == 8


def test_unused_model_reports_zeros() -> None:
    _, samples = parse(text_of([ModelMetrics(ModelStats("m", "1"), {})]))
    for name, entries in samples.items():
        assert entries, name
        assert all(v == 0 for _, v in entries), name


def test_negative_pending_is_reported_as_zero() -> None:
    stats = ModelStats("m", "1", pending=-2)
    _, samples = parse(text_of([ModelMetrics(stats, {})]))
    assert value(samples, "nv_inference_pending_request_count", {"model": "m", "version": "1"}) == 0


@pytest.mark.parametrize("models", [[], [ModelMetrics(ModelStats("m", "1"), {})]])
def test_always_parses(models: list[ModelMetrics]) -> None:
    types, _ = parse(text_of(models))
    assert set(types) == set(COUNTERS) | set(GAUGES)
