"""Load-on-demand figures by model (loads, failures, evictions, load time, requests that waited), in
Prometheus text.

The model manager counts loads and evictions; each gateway counts the requests
that waited for a load; the metrics port shows both.  Only models that loaded,
failed or waited at least once have samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Seconds: a shared-host load takes a fraction of a second, a dedicated replica several, a big model minutes.
LOAD_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
PREFIX = "nv_model_on_demand_"


@dataclass(slots=True)
class ModelFigures:
    loads: int = 0  # loads on demand (as an ensemble's step included)
    load_failures: int = 0
    evictions: int = 0  # unloaded to make room (or with an evicted step)
    waited: int = 0  # requests that waited for the model's load
    load_s_sum: float = 0.0
    load_buckets: list[int] = field(default_factory=lambda: [0] * len(LOAD_BUCKETS))  # cumulative


@dataclass(slots=True)
class OnDemandStats:
    models: dict[str, ModelFigures] = field(default_factory=dict)

    def of(self, model: str) -> ModelFigures:
        figures = self.models.get(model)
        if figures is None:
            figures = self.models[model] = ModelFigures()
        return figures

    def record_load(self, model: str, seconds: float) -> None:
        figures = self.of(model)
        figures.loads += 1
        figures.load_s_sum += seconds
        for i, bound in enumerate(LOAD_BUCKETS):
            if seconds <= bound:
                figures.load_buckets[i] += 1

    def total(self, name: str) -> int:
        """One counter (``loads``, ``evictions``...) over every model."""
        return sum(int(getattr(f, name)) for f in self.models.values())

    def render(self) -> str:
        """The families, Prometheus text format (each with HELP and TYPE), one sample per model."""
        out: list[str] = []
        rows = sorted(self.models.items())

        def counter(suffix: str, help_text: str, attr: str) -> None:
            name = PREFIX + suffix
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} counter"])
            out.extend(f'{name}{{model="{_escape(m)}"}} {getattr(f, attr)}' for m, f in rows)

        counter("loads_total", "Loads because a request asked for the model", "loads")
        counter("load_failures_total", "Loads on demand that failed", "load_failures")
        counter("evictions_total", "Unloads to make room for a load on demand", "evictions")
        counter("waited_requests_total", "Requests that waited for their model to load", "waited")
        name = PREFIX + "load_duration_seconds"
        out += [f"# HELP {name} Time a load on demand took", f"# TYPE {name} histogram"]
        for model, f in rows:
            label = f'model="{_escape(model)}"'
            for bound, count in zip(LOAD_BUCKETS, f.load_buckets, strict=True):
                out.append(f'{name}_bucket{{{label},le="{bound:g}"}} {count}')
            out.append(f'{name}_bucket{{{label},le="+Inf"}} {f.loads}')
            out.append(f"{name}_sum{{{label}}} {f.load_s_sum:.6f}")
            out.append(f"{name}_count{{{label}}} {f.loads}")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
