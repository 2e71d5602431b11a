"""Metrics a model defines itself (Triton's custom metrics: ``pb_utils.MetricFamily``), from its process
to the metrics port.

A model process keeps its families in :data:`REGISTRY`.  Each batch result an instance returns, and
each final response of a decoupled request, carries a :class:`Snapshot` of that registry (when it has
any family), so the values reach the gateways wherever the instance runs; a gateway keeps the latest
snapshot of each process (:class:`Collected`), and its own process's registry as it is at the scrape,
and the metrics port renders them after Triton's own metrics.  As in Triton, a family is one per name across
the server: a counter's value is the sum over the processes that report it, a gauge's the one set last.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

Labels = tuple[tuple[str, str], ...]


class MetricError(Exception):
    """A metric used against its kind (Triton's core refuses the same operations)."""


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, _Histogram] = field(default_factory=dict)


@dataclass(frozen=True)
class FamilySnapshot:
    name: str
    description: str
    kind: str
    values: tuple[tuple[Labels, float], ...] = ()
    # (labels, bucket bounds, cumulative counts per bound, sum, count)
    histograms: tuple[tuple[Labels, tuple[float, ...], tuple[int, ...], float, int], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """One process's families at one moment: ``source`` names the process, ``taken`` orders its snapshots."""

    source: str
    taken: float
    families: tuple[FamilySnapshot, ...]


def labels_of(labels: Mapping[str, str] | None) -> Labels:
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


class Registry:
    """The families of one process (thread-safe: models update them from any thread)."""

    def __init__(self) -> None:
        self.source = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def family(self, name: str, description: str, kind: str) -> None:
        """Declare a family; declaring it again with the same kind is the same family, another kind an error."""
        if kind not in KINDS:
            raise MetricError(f"unknown metric kind '{kind}'")
        if not name:
            raise MetricError("a metric family needs a name")
        with self._lock:
            known = self._families.get(name)
            if known is None:
                self._families[name] = _Family(name, description, kind)
            elif known.kind != kind:
                raise MetricError(
                    f"metric family '{name}' already exists as a {known.kind}; it cannot be declared as a {kind}"
                )

    def add_metric(self, name: str, labels: Labels, buckets: Sequence[float] | None) -> None:
        with self._lock:
            family = self._families[name]
            if family.kind == HISTOGRAM:
                bounds = tuple(sorted(float(b) for b in buckets or ()))
                family.histograms.setdefault(labels, _Histogram(bounds, [0] * len(bounds)))
            else:
                family.values.setdefault(labels, 0.0)

    def increment(self, name: str, labels: Labels, value: float) -> None:
        with self._lock:
            family = self._families[name]
            if family.kind == HISTOGRAM:
                raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
            if family.kind == COUNTER and value < 0:
                raise MetricError("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                                  "non-negative values")  # fmt: skip
            family.values[labels] = family.values.get(labels, 0.0) + value

    def set(self, name: str, labels: Labels, value: float) -> None:
        with self._lock:
            family = self._families[name]
            if family.kind != GAUGE:
                raise MetricError(f"TRITONSERVER_METRIC_KIND_{family.kind.upper()} does not support Set")
            family.values[labels] = value

    def observe(self, name: str, labels: Labels, value: float) -> None:
        with self._lock:
            family = self._families[name]
            if family.kind != HISTOGRAM:
                raise MetricError(f"TRITONSERVER_METRIC_KIND_{family.kind.upper()} does not support Observe")
            h = family.histograms[labels]
            for i, bound in enumerate(h.buckets):
                if value <= bound:
                    h.counts[i] += 1
            h.total += value
            h.count += 1

    def value(self, name: str, labels: Labels) -> float:
        with self._lock:
            family = self._families[name]
            if family.kind == HISTOGRAM:
                raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
            return family.values.get(labels, 0.0)

    def snapshot(self) -> Snapshot | None:
        """The families now (None without any: nothing to carry)."""
        with self._lock:
            if not self._families:
                return None
            families = tuple(
                FamilySnapshot(
                    f.name,
                    f.description,
                    f.kind,
                    tuple(f.values.items()),
                    tuple((lb, h.buckets, tuple(h.counts), h.total, h.count) for lb, h in f.histograms.items()),
                )
                for f in self._families.values()
            )
        return Snapshot(self.source, time.time(), families)


REGISTRY = Registry()


class Collected:
    """A gateway's view: the latest snapshot of each model process, merged for the metrics port."""

    def __init__(self) -> None:
        self._latest: dict[str, Snapshot] = {}

    def record(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            return
        known = self._latest.get(snapshot.source)
        if known is None or known.taken <= snapshot.taken:
            self._latest[snapshot.source] = snapshot

    def render(self) -> list[str]:
        """The families in Prometheus text format, Triton's way (labels in name order).  Those of the
        models in this very process are read now, so a model sees its own families while it executes."""
        self.record(REGISTRY.snapshot())
        merged: dict[str, tuple[FamilySnapshot, dict[Labels, float], dict[Labels, _Histogram]]] = {}
        for snap in sorted(self._latest.values(), key=lambda s: s.taken):  # oldest first: a gauge set last wins
            for fam in snap.families:
                first, values, hists = merged.setdefault(fam.name, (fam, {}, {}))
                if first.kind != fam.kind:
                    continue  # another process declared it with another kind: the first one stands
                for labels, value in fam.values:
                    values[labels] = values.get(labels, 0.0) + value if fam.kind == COUNTER else value
                for labels, bounds, counts, total, count in fam.histograms:
                    known = hists.get(labels)
                    if known is None or known.buckets != bounds:
                        hists[labels] = _Histogram(bounds, list(counts), total, count)
                    else:
                        known.counts = [a + b for a, b in zip(known.counts, counts, strict=True)]
                        known.total += total
                        known.count += count
        lines: list[str] = []
        for name in sorted(merged):
            fam, values, hists = merged[name]
            lines.append(f"# HELP {name} {fam.description}")
            lines.append(f"# TYPE {name} {fam.kind}")
            for labels, value in values.items():
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
            for labels, h in hists.items():
                for bound, n in zip([*h.buckets, math.inf], [*h.counts, h.count], strict=True):
                    lines.append(f"{name}_bucket{_labels(labels, ('le', _number(bound)))} {n}")
                lines.append(f"{name}_sum{_labels(labels)} {_number(h.total)}")
                lines.append(f"{name}_count{_labels(labels)} {h.count}")
        return lines


def _labels(labels: Iterable[tuple[str, str]], last: tuple[str, str] | None = None) -> str:
    pairs = [*labels, *([last] if last else [])]
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**63 else repr(float(value))
