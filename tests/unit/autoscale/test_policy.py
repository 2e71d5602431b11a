"""The autoscaling decision (pure) and its adapter to Ray Serve's custom-policy interface."""

from __future__ import annotations

import base64
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from serve_app.autoscale import (
    BACKLOG,
    BUSY,
    LIVE_SEQUENCES,
    QUEUE_DELAY_US,
    SLOTS,
    AutoscalingSpec,
    InstanceLoadPolicy,
    desired_replicas,
    serve_autoscaling_config,
)

# metrics_interval_s is still the knob Serve 2.60 reads (the env vars it names are not used yet).
pytestmark = pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")

TARGETS: dict[str, Any] = {"target_utilization": 0.5, "target_queue_delay_us": None, "target_slot_utilization": 0.5}


def plain(current: int, metrics: Mapping[str, Mapping[Any, float]], **kw: Any) -> float:
    return desired_replicas(current, metrics, **{**TARGETS, "sequence": False, **kw})


def seq(current: int, metrics: Mapping[str, Mapping[Any, float]], **kw: Any) -> float:
    return desired_replicas(current, metrics, **{**TARGETS, "sequence": True, **kw})


# --- models without sequences -------------------------------------------------------------------


def test_busy_at_target_keeps_the_count() -> None:
    assert plain(2, {BUSY: {"a": 0.5, "b": 0.5}}) == 2.0


def test_busy_above_target_scales_up_in_proportion() -> None:
    assert plain(2, {BUSY: {"a": 1.0, "b": 0.8}}) == pytest.approx(2 * 0.9 / 0.5)


def test_busy_below_target_scales_down_in_proportion() -> None:
    assert plain(4, {BUSY: {"a": 0.1, "b": 0.1, "c": 0.2, "d": 0.0}}) == pytest.approx(4 * 0.1 / 0.5)


def test_rounding_noise_does_not_add_a_replica() -> None:
    # 2 * (0.7 / 0.7) is 2.0000000000000004 in floats; Serve rounds up, so it must come back as 2.0.
    assert desired_replicas(
        2,
        {BUSY: {"a": 0.7, "b": 0.7}},
        target_utilization=0.7,
        target_queue_delay_us=None,
        target_slot_utilization=0.8,
        sequence=False,
    ) == pytest.approx(2.0, abs=0)


def test_queue_delay_scales_up_when_it_exceeds_its_target() -> None:
    metrics = {BUSY: {"a": 0.5, "b": 0.5}, QUEUE_DELAY_US: {"a": 3000.0, "b": 1000.0}}
    assert plain(2, metrics, target_queue_delay_us=1000.0) == pytest.approx(2 * 2000 / 1000)


def test_the_larger_of_busy_and_queue_delay_decides() -> None:
    metrics = {BUSY: {"a": 1.0}, QUEUE_DELAY_US: {"a": 100.0}}
    assert plain(1, metrics, target_queue_delay_us=1000.0) == pytest.approx(2.0)


def test_queue_delay_is_ignored_without_a_target() -> None:
    assert plain(2, {BUSY: {"a": 0.5, "b": 0.5}, QUEUE_DELAY_US: {"a": 1e9, "b": 1e9}}) == 2.0


def test_queue_delay_alone_decides_when_busy_is_not_reported() -> None:
    assert plain(2, {QUEUE_DELAY_US: {"a": 500.0}}, target_queue_delay_us=1000.0) == pytest.approx(1.0)


@pytest.mark.parametrize("metrics", [{}, {BUSY: {}}, {"running_requests": {"a": 5.0}}])
def test_no_load_reported_yet_keeps_the_count(metrics: Mapping[str, Mapping[Any, float]]) -> None:
    assert plain(3, metrics) == 3.0
    assert plain(3, metrics, target_queue_delay_us=1000.0) == 3.0


def test_replicas_missing_from_a_metric_are_left_out_of_its_mean() -> None:
    # c has not reported yet: the mean of a and b stands for it.
    assert plain(3, {BUSY: {"a": 1.0, "b": 0.5}}) == pytest.approx(3 * 0.75 / 0.5)


def test_non_finite_values_are_ignored() -> None:
    assert plain(2, {BUSY: {"a": float("nan"), "b": 0.5}}) == pytest.approx(2.0)


def test_zero_current_replicas_is_returned_as_is() -> None:
    assert plain(0, {BUSY: {"a": 1.0}}) == 0.0


# --- sequence models ---------------------------------------------------------------------------


def test_sequences_size_by_occupied_slots() -> None:
    metrics = {LIVE_SEQUENCES: {"a": 4.0, "b": 2.0}, SLOTS: {"a": 4.0, "b": 4.0}}
    assert seq(2, metrics) == pytest.approx(6 / (4 * 0.5))


def test_sequences_scale_down_but_never_below_replicas_holding_a_sequence() -> None:
    metrics = {LIVE_SEQUENCES: {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}, SLOTS: dict.fromkeys("abcd", 8.0)}
    assert seq(4, metrics) == 3.0  # 3 / (8 * 0.5) = 0.75 would drop two live sequences


def test_a_partly_live_replica_counts_as_holding() -> None:
    # aggregated over the look-back, a sequence that lived part of the window shows as a fraction
    assert seq(2, {LIVE_SEQUENCES: {"a": 0.1, "b": 0.0}, SLOTS: {"a": 8.0, "b": 8.0}}) == 1.0


def test_a_backlog_adds_at_least_one_replica() -> None:
    metrics = {LIVE_SEQUENCES: {"a": 1.0, "b": 1.0}, SLOTS: {"a": 1.0, "b": 1.0}, BACKLOG: {"a": 1.0, "b": 1.0}}
    # the model-wide backlog reported by both instances counts once: (2 + 1) / (1 * 0.5) = 6
    assert seq(2, metrics) == pytest.approx(6.0)
    metrics = {LIVE_SEQUENCES: {"a": 2.0, "b": 2.0}, SLOTS: {"a": 16.0, "b": 16.0}, BACKLOG: {"a": 1.0}}
    assert seq(2, metrics) == 3.0  # slots alone would say 5 / 8: the backlog still waits for a slot


def test_sequences_without_slot_figures_keep_the_count_but_hold_live_replicas() -> None:
    assert seq(3, {LIVE_SEQUENCES: {"a": 1.0, "b": 1.0}}) == 3.0
    assert seq(1, {LIVE_SEQUENCES: {"a": 1.0, "b": 1.0}}) == 2.0


def test_sequences_with_nothing_reported_keep_the_count() -> None:
    assert seq(2, {}) == 2.0
    assert seq(2, {BUSY: {"a": 1.0}}) == 2.0  # busy does not size a sequence model


def test_idle_sequence_model_goes_to_zero_before_serve_clips_it() -> None:
    assert seq(3, {LIVE_SEQUENCES: {"a": 0.0, "b": 0.0, "c": 0.0}, SLOTS: dict.fromkeys("abc", 4.0)}) == 0.0


# --- the Serve adapter -------------------------------------------------------------------------

DEPLOYMENT = DeploymentID(name="m.v1.g0", app_name="serve_app--m.v1.g0--0")


def context(
    current: int,
    metrics: Mapping[str, Mapping[int, float]] | None,
    *,
    target: int | None = None,
    config: AutoscalingConfig | None = None,
    total_requests: float = 0.0,
) -> AutoscalingContext:
    """A real AutoscalingContext; ``metrics`` are keyed by replica index and become ReplicaIDs."""
    replicas = [ReplicaID(f"r{i}", DEPLOYMENT) for i in range(max(current, 8))]
    keyed = None
    if metrics is not None:
        keyed = {name: {replicas[i]: v for i, v in values.items()} for name, values in metrics.items()}
    config = config or AutoscalingConfig(min_replicas=1, max_replicas=10)
    return AutoscalingContext(
        deployment_id=DEPLOYMENT,
        deployment_name=DEPLOYMENT.name,
        app_name=DEPLOYMENT.app_name,
        current_num_replicas=current,
        target_num_replicas=current if target is None else target,
        running_replicas=replicas[:current],
        total_num_requests=total_requests,
        total_queued_requests=0.0,
        aggregated_metrics=lambda: keyed,  # Serve passes a callable, evaluated on first access
        raw_metrics=None,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=0.0,
        config=config,
    )


def test_adapter_decides_from_the_aggregated_metrics() -> None:
    policy = InstanceLoadPolicy(target_utilization=0.5)
    assert policy(context(2, {BUSY: {0: 1.0, 1: 1.0}})) == (4.0, {})


def test_adapter_passes_every_target_on() -> None:
    policy = InstanceLoadPolicy(target_utilization=0.9, target_queue_delay_us=100.0)
    assert policy(context(2, {BUSY: {0: 0.1}, QUEUE_DELAY_US: {0: 200.0}}))[0] == pytest.approx(4.0)
    policy = InstanceLoadPolicy(target_slot_utilization=0.25, sequence=True)
    assert policy(context(1, {LIVE_SEQUENCES: {0: 2.0}, SLOTS: {0: 4.0}}))[0] == pytest.approx(2.0)


def test_adapter_without_metrics_keeps_the_count() -> None:
    assert InstanceLoadPolicy()(context(3, None)) == (3.0, {})


def test_adapter_with_nothing_running_holds_the_target() -> None:
    assert InstanceLoadPolicy()(context(0, None, target=2)) == (2.0, {})


def test_adapter_does_not_undo_a_scale_up_in_progress() -> None:
    # 4 wanted, 2 running and still loaded: the 2 starting ones have no load to show yet.
    assert InstanceLoadPolicy(target_utilization=0.5)(context(2, {BUSY: {0: 0.6, 1: 0.6}}, target=4))[0] == 4.0
    # ... but once the running ones are idle, the scale-down may go ahead (after Serve's delay).
    assert InstanceLoadPolicy(target_utilization=0.5)(context(2, {BUSY: {0: 0.1, 1: 0.1}}, target=4))[0] < 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_utilization": 0.0},
        {"target_utilization": 1.5},
        {"target_slot_utilization": 0.0},
        {"target_queue_delay_us": 0.0},
    ],
)
def test_adapter_rejects_impossible_targets(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        InstanceLoadPolicy(**kwargs)


def serve_wrapped(spec: AutoscalingSpec, *, sequence: bool = False) -> tuple[AutoscalingConfig, Any]:
    """Our policy as Serve's controller builds it: from the deployment's config, instantiated with
    policy_kwargs (autoscaling_state._resolve_policy_callable), wrapped in the delays and factors."""
    config = AutoscalingConfig(**serve_autoscaling_config(spec, sequence=sequence))
    return config, _apply_autoscaling_config(_resolve_policy_callable(config.policy))


def test_serve_instantiates_the_class_with_the_spec_targets() -> None:
    spec = AutoscalingSpec(max_replicas=4, target_utilization=0.6, target_queue_delay_us=2000.0)
    config = AutoscalingConfig(**serve_autoscaling_config(spec, sequence=True))
    policy = _resolve_policy_callable(config.policy)
    assert isinstance(policy, InstanceLoadPolicy)
    assert (policy.target_utilization, policy.target_queue_delay_us, policy.sequence) == (0.6, 2000.0, True)


def test_serve_applies_our_answer_at_once_without_an_upscale_delay() -> None:
    config, wrapped = serve_wrapped(AutoscalingSpec(max_replicas=10, target_utilization=0.5, upscale_delay_s=0.0))
    decision, state = wrapped(context(2, {BUSY: {0: 0.8, 1: 0.7}}, config=config))
    assert decision == 3  # ceil(2 * 0.75 / 0.5)
    assert isinstance(state, dict)


def test_serve_holds_a_scale_up_for_the_upscale_delay() -> None:
    config, wrapped = serve_wrapped(AutoscalingSpec(max_replicas=10, target_utilization=0.5, upscale_delay_s=60.0))
    decision, _ = wrapped(context(2, {BUSY: {0: 1.0, 1: 1.0}}, config=config))
    assert decision == 2


def test_serve_holds_a_scale_down_for_the_downscale_delay() -> None:
    config, wrapped = serve_wrapped(AutoscalingSpec(max_replicas=10, downscale_delay_s=60.0))
    decision, _ = wrapped(context(4, {BUSY: {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}}, config=config))
    assert decision == 4


def test_the_policy_loads_in_a_process_without_serve_app() -> None:
    """Serve cloudpickles the policy's module by value for its controller: check it needs no serve_app there."""
    config = AutoscalingConfig(**serve_autoscaling_config(AutoscalingSpec(max_replicas=4), sequence=True))
    blob = base64.b64encode(config.policy.get_serialized_policy_def()).decode()
    code = textwrap.dedent(
        f"""
        import base64, importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "serve_app":
                    raise ImportError("blocked " + name)
        sys.meta_path.insert(0, Block())
        from ray import cloudpickle  # as the controller loads it
        cls = cloudpickle.loads(base64.b64decode("{blob}"))
        class Ctx:
            current_num_replicas = 2
            target_num_replicas = 2
            aggregated_metrics = {{"live_sequences": {{"a": 3.0, "b": 0.0}}, "slots": {{"a": 4.0, "b": 4.0}}}}
        print(cls(target_slot_utilization=0.5, sequence=True)(Ctx())[0])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(1.5)
