"""Latency histograms and summaries (--metrics-config): the options, the figures, how they merge, and the
exposition text a Prometheus client reads back."""

from __future__ import annotations

import math

import pytest
from google.protobuf import text_format
from prometheus_client.parser import text_string_to_metric_families

from serve_app.errors import InvalidArgument
from serve_app.metrics_options import DEFAULT_QUANTILES, MetricsOptions
from serve_app.protos import model_config_pb2 as mc
from serve_app.stats import ModelStats
from serve_app.stats.latency import (
    DEFAULT_BUCKETS,
    SUMMARY_MAX_AGE_MS,
    WINDOW_SAMPLES,
    Histogram,
    Latencies,
    Summary,
    histogram_buckets,
)
from serve_app.stats.prometheus import ModelMetrics, render

MS = 1_000_000  # nanoseconds per millisecond
BOTH = MetricsOptions(histogram_latencies=True, summary_latencies=True)


def config(text: str = "") -> mc.ModelConfig:
    return text_format.Parse(f'name: "m" {text}', mc.ModelConfig())


CUSTOM = """model_metrics { metric_control [ {
  metric_identifier { family: "nv_inference_first_response_histogram_ms" }
  histogram_options { buckets: [ 10, 1, 50 ] }
} ] }"""


# -- options -------------------------------------------------------------------------------------------------
def test_options_default_to_tritons() -> None:
    options = MetricsOptions.parse([])
    assert options == MetricsOptions()
    assert (options.counter_latencies, options.histogram_latencies, options.summary_latencies) == (True, False, False)
    assert options.quantiles == DEFAULT_QUANTILES
    assert not options.observes


def test_options_parse_tritons_settings() -> None:
    options = MetricsOptions.parse(
        [
            "histogram_latencies=true",
            "summary_latencies=TRUE",
            "counter_latencies=false",
            "summary_quantiles=0.5:0.1,0.99:0.001",
        ]
    )
    assert (options.counter_latencies, options.histogram_latencies, options.summary_latencies) == (False, True, True)
    assert options.quantiles == ((0.5, 0.1), (0.99, 0.001))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("histogram_latencies", "expected <setting>=<value>"),
        ("histogram_latencies=yes", "expected true or false"),
        ("histogram_latency=true", "unknown setting 'histogram_latency'"),
        ("summary_quantiles=0.5", "is not <quantile>:<error>"),
        ("summary_quantiles=1.5:0.1", "is not <quantile>:<error>"),
    ],
)
def test_options_refuse_what_they_do_not_understand(entry: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        MetricsOptions.parse([entry])
    assert message in info.value.message


def test_histogram_buckets_default_or_from_the_model_config() -> None:
    assert histogram_buckets(config()) == DEFAULT_BUCKETS == (100.0, 500.0, 2000.0, 5000.0)
    assert histogram_buckets(config(CUSTOM)) == (1.0, 10.0, 50.0)


def test_latencies_exist_only_when_enabled() -> None:
    assert Latencies.for_model(MetricsOptions(), config()) is None
    only_histogram = Latencies.for_model(MetricsOptions(histogram_latencies=True), config())
    assert only_histogram is not None and only_histogram.first_response is not None
    assert only_histogram.summaries == {}
    both = Latencies.for_model(BOTH, config())
    assert both is not None and sorted(both.summaries) == [
        "compute_infer", "compute_input", "compute_output", "queue", "request"
    ]  # fmt: skip


# -- figures -----------------------------------------------------------------------------------------------
def test_histogram_counts_each_value_in_the_first_bucket_that_holds_it() -> None:
    h = Histogram((100.0, 500.0))
    for value in (0, 100, 101, 500, 501, 10_000):
        h.observe(value)
    assert h.counts == [2, 2, 2]  # a value equal to a bound is in that bound's bucket (le)
    assert h.cumulative() == [("100", 2), ("500", 4), ("+Inf", 6)]
    assert (h.count, h.total) == (6, 11_202)


def test_summary_quantiles_come_from_the_last_minute() -> None:
    s = Summary()
    for v in range(1, 101):
        s.observe(float(v), now_ms=1_000)
    assert s.quantiles([0.5, 0.9, 0.99, 1.0], now_ms=1_000) == [(0.5, 50.0), (0.9, 90.0), (0.99, 99.0), (1.0, 100.0)]
    s.observe(1_000.0, now_ms=1_000 + SUMMARY_MAX_AGE_MS)
    assert s.quantiles([0.5], now_ms=1_000 + SUMMARY_MAX_AGE_MS) == [(0.5, 1_000.0)]  # the old window aged out
    assert (s.count, s.total) == (101, 5_050.0 + 1_000.0)  # count and sum stay cumulative
    (only,) = s.quantiles([0.5], now_ms=1_000 + 3 * SUMMARY_MAX_AGE_MS)
    assert math.isnan(only[1])


def test_a_busy_window_keeps_a_bounded_sample() -> None:
    s = Summary()
    for v in range(3 * WINDOW_SAMPLES):
        s.observe(float(v), now_ms=0)
    (window,) = s.windows.values()
    assert len(window) == WINDOW_SAMPLES
    assert s.count == 3 * WINDOW_SAMPLES


def test_model_stats_observe_successful_requests() -> None:
    stats = ModelStats("m", "1", latencies=Latencies.for_model(BOTH, config()))
    stats.record_success(1, 150 * MS, 20 * MS, 1 * MS, 100 * MS, 2 * MS, now_ms=5)
    stats.record_success(1, 40 * MS, 1 * MS, 0, 30 * MS, 0, now_ms=5)
    stats.record_failure("BACKEND", 10 * MS, now_ms=5)  # failures are not observed
    stats.record_first_response(700 * MS)  # a decoupled model's first response...
    stats.record_success(1, 900 * MS, 0, 0, 0, 0, now_ms=5, first_response=False)  # ...and its request
    assert stats.latencies is not None and stats.latencies.first_response is not None
    assert stats.latencies.first_response.counts == [1, 1, 1, 0, 0]  # 40 ms, 150 ms, 700 ms
    assert stats.latencies.summaries["request"].count == 3
    assert stats.latencies.summaries["queue"].quantiles([1.0], now_ms=5) == [(1.0, 20_000.0)]  # microseconds


def test_merged_stats_add_bucket_counts_and_pool_summary_observations() -> None:
    def gateway(values_ms: list[int]) -> ModelStats:
        stats = ModelStats("m", "1", latencies=Latencies.for_model(BOTH, config()))
        for v in values_ms:
            stats.record_success(1, v * MS, 0, 0, 0, 0, now_ms=7)
        return stats

    total = ModelStats("m", "1")
    total.merge(gateway([50, 600]))
    total.merge(gateway([50, 3_000, 9_000]))
    assert total.latencies is not None and total.latencies.first_response is not None
    assert total.latencies.first_response.counts == [2, 0, 1, 1, 1]
    assert total.latencies.summaries["request"].quantiles([0.5], now_ms=7) == [(0.5, 600_000.0)]


# -- exposition ----------------------------------------------------------------------------------------------
def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        f.name: (f.type, [(s.name, dict(s.labels), s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def test_histogram_and_summaries_in_the_exposition() -> None:
    stats = ModelStats("m", "1", latencies=Latencies.for_model(BOTH, config(CUSTOM)))
    for ms in (1, 5, 20, 200):
        stats.record_success(1, ms * MS, 0, 0, ms * MS, 0, now_ms=10)
    text = render([ModelMetrics(stats, {"team": "a"})], BOTH, now_ms=10).decode()
    parsed = families(text)
    kind, samples = parsed["nv_inference_first_response_histogram_ms"]
    assert kind == "histogram"
    labels = {"model": "m", "version": "1", "team": "a"}
    assert samples == [
        ("nv_inference_first_response_histogram_ms_bucket", {**labels, "le": "1"}, 1.0),
        ("nv_inference_first_response_histogram_ms_bucket", {**labels, "le": "10"}, 2.0),
        ("nv_inference_first_response_histogram_ms_bucket", {**labels, "le": "50"}, 3.0),
        ("nv_inference_first_response_histogram_ms_bucket", {**labels, "le": "+Inf"}, 4.0),
        ("nv_inference_first_response_histogram_ms_sum", labels, 226.0),
        ("nv_inference_first_response_histogram_ms_count", labels, 4.0),
    ]
    assert 'le="10"' in text  # bounds written as Triton writes them
    for name in (
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    ):
        kind, samples = parsed[name]
        assert kind == "summary"
        quantiles = [s for s in samples if "quantile" in s[1]]
        assert [s[1]["quantile"] for s in quantiles] == ["0.5", "0.9", "0.95", "0.99", "0.999"]
        assert samples[-1] == (f"{name}_count", labels, 4.0)
    _, request = parsed["nv_inference_request_summary_us"]
    assert request[0] == ("nv_inference_request_summary_us", {**labels, "quantile": "0.5"}, 5_000.0)
    assert request[4][2] == 200_000.0


def test_default_options_show_counters_only_and_counter_latencies_false_drops_them() -> None:
    stats = ModelStats("m", "1")
    stats.record_success(1, MS, 0, 0, 0, 0, now_ms=1)
    default = families(render([ModelMetrics(stats, {})]).decode())
    assert "nv_inference_request_duration_us" in default
    assert not any("histogram" in n or "summary" in n for n in default)
    without = families(render([ModelMetrics(stats, {})], MetricsOptions(counter_latencies=False)).decode())
    assert not any(n.endswith("_duration_us") for n in without)
    assert "nv_inference_request_success" in without and "nv_inference_count" in without
