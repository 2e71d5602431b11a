"""Load-on-demand figures (loads, evictions, load time, requests that waited) in Prometheus text.

The model manager counts loads and evictions; each gateway counts the requests
that waited for a load; the metrics port shows both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Seconds: a shared-host load takes a fraction of a second, a dedicated replica several, a big model minutes.
LOAD_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(slots=True)
class OnDemandStats:
    loads: int = 0  # models loaded on demand (steps of an ensemble included)
    load_failures: int = 0
    evictions: int = 0
    waited: int = 0  # requests that waited for their model's load
    load_s_sum: float = 0.0
    load_buckets: list[int] = field(default_factory=lambda: [0] * len(LOAD_BUCKETS))

    def record_load(self, seconds: float, models: int = 1) -> None:
        """``models`` loaded together in ``seconds`` (each observes that time)."""
        self.loads += models
        self.load_s_sum += seconds * models
        for i, bound in enumerate(LOAD_BUCKETS):
            if seconds <= bound:
                self.load_buckets[i] += models

    def merge(self, other: OnDemandStats) -> None:
        self.loads += other.loads
        self.load_failures += other.load_failures
        self.evictions += other.evictions
        self.waited += other.waited
        self.load_s_sum += other.load_s_sum
        self.load_buckets = [a + b for a, b in zip(self.load_buckets, other.load_buckets, strict=True)]

    def render(self) -> str:
        """The families, Prometheus text format (each with HELP and TYPE)."""
        out: list[str] = []

        def counter(name: str, help_text: str, value: int) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"])

        counter("nv_model_on_demand_loads_total", "Models loaded because a request asked for them", self.loads)
        counter("nv_model_on_demand_load_failures_total", "Loads on demand that failed", self.load_failures)
        counter(
            "nv_model_on_demand_evictions_total", "Models unloaded to make room for a load on demand", self.evictions
        )
        counter("nv_model_on_demand_waited_requests_total", "Requests that waited for their model to load", self.waited)
        name = "nv_model_on_demand_load_duration_seconds"
        out += [f"# HELP {name} Time a load on demand took", f"# TYPE {name} histogram"]
        for bound, count in zip(LOAD_BUCKETS, self.load_buckets, strict=True):
            out.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.loads}')
        out.append(f"{name}_sum {self.load_s_sum:.6f}")
        out.append(f"{name}_count {self.loads}")
        return "\n".join(out) + "\n"
