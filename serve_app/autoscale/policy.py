"""How many instances a model needs, from the load its instances report.

``desired_replicas`` is the decision as a pure function; ``InstanceLoadPolicy``
adapts it to Ray Serve's custom-policy interface.  Serve instantiates the class
once per deployment with ``policy_kwargs`` and wraps it (``_apply_autoscaling_config``
in ray/serve/autoscaling_policy.py) in the upscale/downscale delays and scaling
factors, then clips the result to min/max replicas; the float it returns is
rounded up.  So this module only answers "how many would fit the load".

Serve cloudpickles this module by value into its controller, so it imports
nothing from serve_app at call time but the metric names (plain strings, which
the pickle carries).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from serve_app.autoscale.load_meter import BACKLOG, BUSY, LIVE_SEQUENCES, QUEUE_DELAY_US, SLOTS

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

DEFAULT_TARGET_UTILIZATION = 0.7
DEFAULT_TARGET_SLOT_UTILIZATION = 0.8

# Serve rounds the answer up, so 2 * (0.7 / 0.7) = 2.0000000000000004 would become 3 replicas.
_DIGITS = 6


def desired_replicas(
    current: int,
    metrics: Mapping[str, Mapping[Any, float]],
    *,
    target_utilization: float,
    target_queue_delay_us: float | None,
    target_slot_utilization: float,
    sequence: bool,
) -> float:
    """Replicas that would bring the reported load to its targets (Serve rounds up and clips).

    ``metrics`` maps a metric name to each replica's value, averaged over the
    look-back window.  Replicas missing from a metric (just started, or not
    reported yet) are left out of that metric's mean.  With nothing reported
    yet, the answer is ``current``.

    - Other models: ``current * max(mean busy / target_utilization,
      mean queue delay / target_queue_delay_us)`` (the second only when set).
    - Sequence models: occupied slots plus the backlog over
      ``slots per replica * target_slot_utilization``; at least one more
      replica while sequences wait for a slot; and never fewer than the
      replicas holding a live sequence, whose state would be lost.
    """
    if current <= 0:
        return float(current)
    if sequence:
        return _sequence_replicas(current, metrics, target_slot_utilization)
    busy = _values(metrics, BUSY)
    delays = _values(metrics, QUEUE_DELAY_US)
    ratios = []
    if busy:
        ratios.append(_mean(busy) / target_utilization)
    if target_queue_delay_us and delays:
        ratios.append(_mean(delays) / target_queue_delay_us)
    if not ratios:
        return float(current)
    return round(current * max(ratios), _DIGITS)


def _sequence_replicas(current: int, metrics: Mapping[str, Mapping[Any, float]], target: float) -> float:
    live = _values(metrics, LIVE_SEQUENCES)
    if not live:
        return float(current)
    slots = [s for s in _values(metrics, SLOTS) if s > 0]
    # The backlog is model-wide (the sequence router's); every instance may carry the same figure, so count it once.
    backlog = max(_values(metrics, BACKLOG), default=0.0)
    desired = (sum(live) + backlog) / (_mean(slots) * target) if slots else float(current)
    if backlog > 0:
        desired = max(desired, current + 1.0)
    holding = sum(1 for v in live if v > 0)
    return round(max(desired, float(holding)), _DIGITS)


def _values(metrics: Mapping[str, Mapping[Any, float]], name: str) -> list[float]:
    per_replica = metrics.get(name) or {}
    return [float(v) for v in per_replica.values() if v is not None and math.isfinite(v)]


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)


class InstanceLoadPolicy:
    """Serve custom autoscaling policy: ``autoscaling_config={"policy": {"policy_function":
    "serve_app.autoscale.policy:InstanceLoadPolicy", "policy_kwargs": {...}}}``.

    Instances report their load through ``record_autoscaling_stats`` (see
    ``serve_app.autoscale.load_meter``); Serve gives it to us as
    ``ctx.aggregated_metrics``: metric name -> ReplicaID -> mean over the look-back window.
    """

    def __init__(
        self,
        *,
        target_utilization: float = DEFAULT_TARGET_UTILIZATION,
        target_queue_delay_us: float | None = None,
        target_slot_utilization: float = DEFAULT_TARGET_SLOT_UTILIZATION,
        sequence: bool = False,
    ) -> None:
        fractions = {"target_utilization": target_utilization, "target_slot_utilization": target_slot_utilization}
        for name, value in fractions.items():
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if target_queue_delay_us is not None and not target_queue_delay_us > 0:
            raise ValueError(f"target_queue_delay_us must be positive, got {target_queue_delay_us}")
        self.target_utilization = float(target_utilization)
        self.target_queue_delay_us = None if target_queue_delay_us is None else float(target_queue_delay_us)
        self.target_slot_utilization = float(target_slot_utilization)
        self.sequence = bool(sequence)

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        current = ctx.current_num_replicas
        if current == 0:  # nothing runs, nothing reports: hold the target (as Serve's default policy does)
            return float(ctx.target_num_replicas), {}
        desired = desired_replicas(
            current,
            ctx.aggregated_metrics or {},
            target_utilization=self.target_utilization,
            target_queue_delay_us=self.target_queue_delay_us,
            target_slot_utilization=self.target_slot_utilization,
            sequence=self.sequence,
        )
        # Replicas still starting carry no load yet; while the running ones want at least what runs,
        # don't let their load undo the scale-up in progress.
        if ctx.target_num_replicas > current and desired >= current:
            desired = max(desired, float(ctx.target_num_replicas))
        return desired, {}
