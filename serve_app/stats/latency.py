"""Latency histograms and summaries, Triton's ``--metrics-config`` metrics, as figures that add up.

With ``histogram_latencies=true`` each model version counts its requests' time to the first response in
the buckets of ``nv_inference_first_response_histogram_ms`` (Triton's default bounds, or the model
config's ``model_metrics.metric_control`` ones); with ``summary_latencies=true`` it keeps the request,
queue and compute durations of the last minute for the ``nv_inference_*_summary_us`` quantiles.

Both live in :class:`~serve_app.stats.model_stats.ModelStats`, so they merge like every other figure:
bucket counts by addition, summaries by pooling the observations of each age window (quantiles of several
gateways can't be added, their observations can).  A window keeps at most :data:`WINDOW_SAMPLES`
observations per process (a uniform sample of them beyond that); counts and sums stay exact.  Times are
wall-clock milliseconds, which every process of a cluster shares.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from serve_app.metrics_options import MetricsOptions
from serve_app.protos import model_config_pb2 as mc

FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
DEFAULT_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # milliseconds, Triton's
SUMMARY_MAX_AGE_MS = 60_000  # prometheus-cpp's summary window: the last minute, in 5 age buckets
SUMMARY_AGE_BUCKETS = 5
WINDOW_SAMPLES = 2048
# summary name -> the duration it observes
SUMMARIES = (
    ("nv_inference_request_summary_us", "request"),
    ("nv_inference_queue_summary_us", "queue"),
    ("nv_inference_compute_input_summary_us", "compute_input"),
    ("nv_inference_compute_infer_summary_us", "compute_infer"),
    ("nv_inference_compute_output_summary_us", "compute_output"),
)


def histogram_buckets(config: mc.ModelConfig) -> tuple[float, ...]:
    """The first-response histogram's bounds: the model's ``metric_control`` ones, or Triton's defaults."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_HISTOGRAM:
            return tuple(sorted(set(control.histogram_options.buckets)))
    return DEFAULT_BUCKETS


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last one +Inf (not cumulative)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        i = 0
        while i < len(self.bounds) and value > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.total += value
        self.count += 1

    def merge(self, other: Histogram) -> None:
        if other.bounds != self.bounds:  # a reloaded config changed them: keep the newer figures' shape
            return
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.total += other.total
        self.count += other.count

    def cumulative(self) -> list[tuple[str, int]]:
        """(``le`` label, observations at or below it), +Inf last, as Prometheus exposes buckets."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append((_number(bound), running))
        return out


@dataclass(slots=True)
class Summary:
    """Observations of the last ``SUMMARY_MAX_AGE_MS``, in age windows; exact count and sum since start."""

    windows: dict[int, list[float]] = field(default_factory=dict)  # window index (ms // width) -> observations
    seen: dict[int, int] = field(default_factory=dict)  # observations offered to each window (for sampling)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float, now_ms: int) -> None:
        self.total += value
        self.count += 1
        index = now_ms // _WIDTH_MS
        window = self.windows.get(index)
        if window is None:
            window = self.windows[index] = []
            for old in [i for i in self.windows if i <= index - SUMMARY_AGE_BUCKETS]:
                del self.windows[old]
                self.seen.pop(old, None)
        seen = self.seen[index] = self.seen.get(index, 0) + 1
        if len(window) < WINDOW_SAMPLES:
            window.append(value)
        else:  # reservoir sampling: every observation of the window kept with the same chance
            slot = random.randrange(seen)
            if slot < WINDOW_SAMPLES:
                window[slot] = value

    def merge(self, other: Summary) -> None:
        self.total += other.total
        self.count += other.count
        for index, values in other.windows.items():
            self.windows.setdefault(index, []).extend(values)
            self.seen[index] = self.seen.get(index, 0) + other.seen.get(index, len(values))

    def quantiles(self, wanted: Iterable[float], now_ms: int) -> list[tuple[float, float]]:
        """Each wanted quantile of the window's observations (NaN with none, as Prometheus shows it)."""
        oldest = now_ms // _WIDTH_MS - SUMMARY_AGE_BUCKETS + 1
        values = sorted(v for i, w in self.windows.items() if i >= oldest for v in w)
        out = []
        for q in wanted:
            if not values:
                out.append((q, math.nan))
                continue
            rank = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
            out.append((q, values[rank]))
        return out


_WIDTH_MS = SUMMARY_MAX_AGE_MS // SUMMARY_AGE_BUCKETS


@dataclass(slots=True)
class Latencies:
    """A model version's histogram and summaries (those the options enable)."""

    first_response: Histogram | None = None
    summaries: dict[str, Summary] = field(default_factory=dict)  # by what they observe: request, queue, ...

    @classmethod
    def for_model(cls, options: MetricsOptions, config: mc.ModelConfig) -> Latencies | None:
        if not options.observes:
            return None
        return cls(
            first_response=Histogram(histogram_buckets(config)) if options.histogram_latencies else None,
            summaries={kind: Summary() for _, kind in SUMMARIES} if options.summary_latencies else {},
        )

    def observe_first_response(self, ns: int) -> None:
        if self.first_response is not None:
            self.first_response.observe(ns // 1_000_000)  # whole milliseconds, as Triton observes them

    def observe_request(self, durations_ns: dict[str, int], now_ms: int) -> None:
        """A successful request's durations (``request``, ``queue``, ``compute_*``), in microseconds."""
        for kind, summary in self.summaries.items():
            summary.observe(durations_ns[kind] // 1000, now_ms)

    def merge(self, other: Latencies) -> None:
        if other.first_response is not None:
            if self.first_response is None:
                self.first_response = Histogram(other.first_response.bounds)
            self.first_response.merge(other.first_response)
        for kind, summary in other.summaries.items():
            mine = self.summaries.get(kind)
            if mine is None:
                mine = self.summaries[kind] = Summary()
            mine.merge(summary)


def _number(value: float) -> str:
    """A bound as Prometheus writes it: ``100.0`` -> ``100``, infinity -> ``+Inf``."""
    if math.isinf(value):
        return "+Inf"
    return str(int(value)) if value == int(value) else repr(value)
