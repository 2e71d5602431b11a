"""Triton's ``--metrics-config`` settings: which latency metrics the metrics port shows.

Parsed with the other server settings, so a wrong entry stops the server at start; the figures themselves
are ``serve_app.stats.latency``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from serve_app.errors import InvalidArgument

Quantiles = tuple[tuple[float, float], ...]  # (quantile, error) pairs
DEFAULT_QUANTILES: Quantiles = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))  # Triton's
_SETTINGS = ("counter_latencies", "histogram_latencies", "summary_latencies", "summary_quantiles")


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """Triton's ``--metrics-config`` settings."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    @classmethod
    def parse(cls, entries: Iterable[str]) -> MetricsOptions:
        """From ``<setting>=<value>`` entries, as Triton's --metrics-config takes them."""
        values: dict[str, str] = {}
        for entry in entries:
            name, sep, value = entry.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not value:
                raise InvalidArgument(f"--metrics-config '{entry}': expected <setting>=<value>")
            if name not in _SETTINGS:
                raise InvalidArgument(f"--metrics-config: unknown setting '{name}' (known: {', '.join(_SETTINGS)})")
            values[name] = value
        quantiles = DEFAULT_QUANTILES
        if "summary_quantiles" in values:
            quantiles = _quantiles(values["summary_quantiles"])
        return cls(
            counter_latencies=_flag(values, "counter_latencies", True),
            histogram_latencies=_flag(values, "histogram_latencies", False),
            summary_latencies=_flag(values, "summary_latencies", False),
            quantiles=quantiles,
        )

    @property
    def observes(self) -> bool:
        return self.histogram_latencies or self.summary_latencies


def _flag(values: dict[str, str], name: str, default: bool) -> bool:
    text = values.get(name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise InvalidArgument(f"--metrics-config {name}={text}: expected true or false")
    return text.lower() == "true"


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """``0.5:0.05,0.9:0.01``: quantile:error pairs (the error is kept for the record: quantiles here are
    computed from the window's observations, exactly up to its sampling)."""
    pairs = []
    for item in text.split(","):
        q, sep, err = item.strip().partition(":")
        try:
            pair = (float(q), float(err))
        except ValueError:
            pair = (math.nan, math.nan)
        if not sep or not 0.0 <= pair[0] <= 1.0 or not 0.0 <= pair[1] <= 1.0:
            raise InvalidArgument(f"--metrics-config summary_quantiles: '{item}' is not <quantile>:<error> in [0, 1]")
        pairs.append(pair)
    return tuple(pairs)
