"""Triton's per-model Prometheus metrics, computed from the same figures as the
statistics extension at scrape time (so the two always agree and requests pay
nothing for metrics).

Names and types are Triton's: counters without a ``_total`` suffix
(``nv_inference_count``, ``nv_inference_request_duration_us``, ...), labels
``model`` and ``version`` plus the model config's ``metric_tags``.  The text is
written here rather than by prometheus_client, whose exposition renames every
counter family ``<name>_total`` and so cannot reproduce Triton's names.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from serve_app.metrics_options import MetricsOptions
from serve_app.stats.latency import FIRST_RESPONSE_HISTOGRAM, SUMMARIES
from serve_app.stats.model_stats import FAILURE_REASONS, ModelStats

DEFAULT_OPTIONS = MetricsOptions()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LABEL_OK = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    stats: ModelStats
    tags: Mapping[str, str]  # the config's metric_tags
    instances: int | None = None  # instances serving it now (ours: autoscaling moves it); None: not known
    cached: bool = False  # its answers go through the response cache: the nv_cache_* metrics show


def _labels(m: ModelMetrics) -> dict[str, str]:
    labels = {"model": m.stats.name, "version": m.stats.version}
    for key, value in m.tags.items():
        name = _LABEL_OK.sub("_", key)
        if name and not name[0].isdigit() and name not in labels:
            labels[name] = value
    return labels


# (name, help, value of a model's stats); durations are cumulative microseconds.
_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.inference["success"].count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: s.inference["success"].ns // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.inference["queue"].ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.inference["compute_input"].ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.inference["compute_infer"].ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     lambda s: s.inference["compute_output"].ns // 1000),
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: Mapping[str, str], value: int | str) -> str:
    """One sample, its labels in name order as Triton's exporter writes them (scrapers' regexes rely on it)."""
    inner = ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels))
    return f"{name}{{{inner}}} {value}"


def render(
    models: Sequence[ModelMetrics],
    options: MetricsOptions = DEFAULT_OPTIONS,
    now_ms: int = 0,
    custom: Sequence[str] = (),
) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of ``models``' metrics, then ``custom`` lines (the
    models' own metric families); ``options``: which latency metrics (--metrics-config); ``now_ms``: the
    wall-clock time summaries are computed at (default: now)."""
    labelled = [(m.stats, _labels(m)) for m in models]
    lines: list[str] = []

    def family(name: str, help_text: str, kind: str, samples: Iterable[str]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)

    name, help_text, value = _COUNTERS[0]
    family(name, help_text, "counter", (_sample(name, lb, value(s)) for s, lb in labelled))
    family(
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        "counter",
        (
            _sample("nv_inference_request_failure", {**lb, "reason": r}, s.failures.get(r, 0))
            for s, lb in labelled
            for r in FAILURE_REASONS
        ),
    )
    for name, help_text, value in _COUNTERS[1:]:
        if name.endswith("_duration_us") and not options.counter_latencies:
            continue
        family(name, help_text, "counter", (_sample(name, lb, value(s)) for s, lb in labelled))
    family(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        (_sample("nv_inference_pending_request_count", lb, max(0, s.pending)) for s, lb in labelled),
    )
    cached = [(s, lb) for m, (s, lb) in zip(models, labelled, strict=True) if m.cached]
    for name, help_text, value in _CACHE_COUNTERS:
        if cached:
            family(name, help_text, "counter", (_sample(name, lb, value(s)) for s, lb in cached))
    if options.histogram_latencies:
        family(
            FIRST_RESPONSE_HISTOGRAM,
            "Duration from request to first response in milliseconds",
            "histogram",
            _histogram_samples(labelled),
        )
    if options.summary_latencies:
        at = now_ms or time.time_ns() // 1_000_000
        for (name, kind), help_text in zip(SUMMARIES, _SUMMARY_HELP, strict=True):
            family(name, help_text, "summary", _summary_samples(name, kind, labelled, options, at))
    counted = [(m.instances, lb) for m, (_, lb) in zip(models, labelled, strict=True) if m.instances is not None]
    if counted:
        family(
            "serve_app_model_instances",
            "Model instances (Ray Serve replicas) serving the model version now; autoscaling changes it.",
            "gauge",
            (_sample("serve_app_model_instances", {"model": lb["model"], "version": lb["version"]}, n)
             for n, lb in counted),
        )  # fmt: skip
    lines.extend(custom)
    return ("\n".join(lines) + "\n").encode()


# Triton's per-model cache metrics, shown for the models whose answers are cached.
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s.inference["cache_hit"].count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.inference["cache_hit"].ns // 1000),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s.inference["cache_miss"].count),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.inference["cache_miss"].ns // 1000),
)  # fmt: skip

_SUMMARY_HELP = (
    "Summary of inference request duration in microseconds (includes cached requests)",
    "Summary of inference queuing duration in microseconds (includes cached requests)",
    "Cumulative compute input duration in microseconds (does not include cached requests)",
    "Cumulative compute inference duration in microseconds (does not include cached requests)",
    "Cumulative inference compute output duration in microseconds (does not include cached requests)",
)  # Triton's help texts


def _histogram_samples(labelled: list[tuple[ModelStats, dict[str, str]]]) -> Iterator[str]:
    name = FIRST_RESPONSE_HISTOGRAM
    for s, lb in labelled:
        h = s.latencies.first_response if s.latencies is not None else None
        if h is None:
            continue
        for le, n in h.cumulative():
            yield _sample(f"{name}_bucket", {**lb, "le": le}, n)
        yield _sample(f"{name}_sum", lb, _float(h.total))
        yield _sample(f"{name}_count", lb, h.count)


def _summary_samples(
    name: str, kind: str, labelled: list[tuple[ModelStats, dict[str, str]]], options: MetricsOptions, now_ms: int
) -> Iterator[str]:
    for s, lb in labelled:
        summary = s.latencies.summaries.get(kind) if s.latencies is not None else None
        if summary is None:
            continue
        for q, v in summary.quantiles([q for q, _ in options.quantiles], now_ms):
            yield _sample(name, {**lb, "quantile": _float(q)}, _float(v))
        yield _sample(f"{name}_sum", lb, _float(summary.total))
        yield _sample(f"{name}_count", lb, summary.count)


def _float(value: float) -> str:
    """A value as Prometheus text writes it (whole numbers without a fraction, NaN as ``NaN``)."""
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) else repr(value)
