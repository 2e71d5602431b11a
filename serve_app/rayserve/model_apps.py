"""Placement plans (``placement/plan.py``) → Serve: the applications of dedicated deployments bound, the
groups each host pool takes, and what the gateways and the sequence router will serve.

The plan decides; this module only builds what Serve runs from it (deployment
options, the bound replicas) and the records the manager publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.autoscale import AutoscalingSpec, serve_autoscaling_config
from serve_app.backends.python.environment import pip_requirements
from serve_app.hosting import InstanceHost, InstanceLoad
from serve_app.observability import python_logging
from serve_app.placement import (
    KIND_CPU,
    ClusterGpus,
    HostPool,
    PlacedGroup,
    PlacementPlan,
    ReplicaGroup,
    VersionPlan,
    instance_spec,
    plan_placement,
)
from serve_app.rayserve.console import serve_logging
from serve_app.rayserve.sequence_router_deployment import SequenceModelSpec
from serve_app.repository import ModelSource
from serve_app.sequence.batcher import SequenceBatchingConfig
from serve_app.service.model_books import Generation
from serve_app.service.serving_state import DeploymentRef, ServedVersion
from serve_app.settings import ServerSettings

# Our replicas never block their event loop (models run in an executor thread),
# so Serve can run user code and the handle router on the replica's main loop
# and skip two cross-thread hand-offs per call.  Serve's own metrics (its
# request counters; ours are on the metrics port) are exported once a second
# instead of ten times: every replica and every handle a gateway holds runs that
# loop on its event loop (about 2% of a busy gateway's loop in py-spy).
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
}

# How long a stopping instance may finish its work (in-flight batches; live sequences when scaled down).
GRACEFUL_SHUTDOWN_S = 30.0


def replica_env(settings: ServerSettings) -> dict[str, str]:
    """A model process's environment: Serve's options above, and the server's start-up log settings (what a
    model's ``pb_utils.Logger`` lets through)."""
    return {**REPLICA_ENV, **python_logging.to_env(settings.log_settings())}


@dataclass(slots=True)
class ModelApps:
    """What deploying some models takes: Serve applications to run, instance groups for shared hosts, and
    what they will serve."""

    apps: dict[str, Any] = field(default_factory=dict)  # application name -> bound deployment (dedicated)
    hosted: dict[str, list[InstanceLoad]] = field(default_factory=dict)  # pool -> groups its hosts take
    pools: dict[str, HostPool] = field(default_factory=dict)  # the pools those groups need
    served: list[ServedVersion] = field(default_factory=list)
    sequence_models: list[SequenceModelSpec] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # model -> why it can't be deployed
    messages: list[str] = field(default_factory=list)
    on_node: dict[str, str] = field(default_factory=dict)  # model -> the one node (address) its instances run on

    def group_models(self) -> list[tuple[str, str]]:
        """(group id, model) of each instance group placed in shared hosts."""
        return [(InstanceHost.group_id(load), load.key.name) for loads in self.hosted.values() for load in loads]

    def generations(self) -> dict[str, Generation]:
        """What each model planned here will run on (for the manager's books)."""
        out: dict[str, Generation] = {}
        for sv in self.served:
            new = out.setdefault(sv.name, Generation())
            new.served.append(sv)
            new.apps += [r.app for r in sv.deployments if r.app in self.apps]  # its own, not host pools
        for group, model in self.group_models():
            out.setdefault(model, Generation()).groups.add(group)
        for spec in self.sequence_models:
            out.setdefault(spec.name, Generation()).sequences.append(spec)
        return out


def plan_model_apps(
    sources: Mapping[str, ModelSource],
    generations: Mapping[str, int],
    settings: ServerSettings,
    gpus: ClusterGpus,
    token: bytes,
    autoscaling: Mapping[str, AutoscalingSpec | None],
    pool_app: Callable[[HostPool], str] = lambda pool: pool.deployment,
    nodes: Mapping[str, str] | None = None,
) -> ModelApps:
    """Applications and host content for ``sources`` (each at its generation) on a cluster with ``gpus``:
    :func:`~serve_app.placement.plan_placement`'s plan, bound.  ``pool_app``: the Serve application of a
    host pool; ``nodes``: models to run on one node (its address) where they can (see :func:`one_node`)."""
    plan = plan_placement(sources, generations, settings, gpus, autoscaling, pool_app)
    return model_apps(plan, sources, settings, token, autoscaling, nodes or {})


def one_node(version: VersionPlan, scaling: AutoscalingSpec | None) -> bool:
    """Whether a model version's instances can all run on one node of the planner's choosing: CPU instances
    in shared hosts (each node has one) or in processes of their own (Ray's ``node:<address>`` resource
    puts them there), not autoscaled (Serve places those); an ensemble has none."""
    for placed in version.groups:
        if placed.group.kind != KIND_CPU or placed.autoscaled or scaling is not None:
            return False
    return True


def model_apps(
    plan: PlacementPlan,
    sources: Mapping[str, ModelSource],
    settings: ServerSettings,
    token: bytes,
    autoscaling: Mapping[str, AutoscalingSpec | None],
    nodes: Mapping[str, str] | None = None,
) -> ModelApps:
    """What Serve runs for ``plan``: each dedicated group's application, each hosted group's load (``nodes``:
    the models to run on one node, where :func:`one_node` allows)."""
    out = ModelApps(failed=dict(plan.failed), messages=list(plan.messages))
    nodes = nodes or {}
    for version in plan.versions:
        key, source = version.key, sources[version.key.name]
        config_bytes = source.config.SerializeToString()
        refs: list[DeploymentRef] = []
        node = nodes.get(key.name) if one_node(version, autoscaling.get(key.name)) else None
        if node is not None:
            out.on_node[key.name] = node
        for placed in version.groups:
            group = placed.group
            if placed.pool is not None:
                load = InstanceLoad(
                    key,
                    config_bytes,
                    str(version.model_file),
                    group.kind,
                    instance_spec(group),
                    placed.per_host,
                    (node,) if node else (),
                )
                out.hosted.setdefault(placed.pool.name, []).append(load)
                out.pools[placed.pool.name] = placed.pool
                refs.append(DeploymentRef(placed.app, placed.deployment, placed.instances, hosted=True))
                continue
            scaling = autoscaling.get(key.name)
            out.apps[placed.app] = _replica(version, placed, config_bytes, settings, token, scaling, node)
            refs.append(DeploymentRef(placed.app, placed.deployment, placed.instances, placed.autoscaled))
        labels = tuple(source.labels.items())
        out.served.append(
            ServedVersion(key.name, key.version, config_bytes, tuple(refs), labels, key.generation, "LOADING")
        )
        if version.sequence:
            slots = SequenceBatchingConfig.from_model_config(source.config).slots
            spec = SequenceModelSpec(key.label, key.name, slots, version.deployments(), key.generation)
            out.sequence_models.append(spec)
    return out


def _replica(
    version: VersionPlan,
    placed: PlacedGroup,
    config_bytes: bytes,
    settings: ServerSettings,
    token: bytes,
    scaling: AutoscalingSpec | None,
    node: str | None = None,
) -> Any:
    """A dedicated group's deployment, bound (one replica per instance; on ``node``'s address if given)."""
    from ray import serve

    from serve_app.rayserve.model_replica import ModelReplica

    key, group = version.key, placed.group
    pip = pip_requirements(version.model_file.parent.parent)
    options = replica_options(group, settings, scaling, version.sequence, pip)
    if node:  # Ray's own resource of each node, 1.0 of it: a token share of it holds the replica there
        resources = options["ray_actor_options"].setdefault("resources", {})
        resources[f"node:{node}"] = NODE_SHARE
    return (
        serve.deployment(ModelReplica)
        .options(name=placed.deployment, **options)
        .bind(
            key.name,
            key.version,
            config_bytes,
            str(version.model_file),
            group.kind,
            token,
            instance_spec(group),
            key.generation,
            settings.app_name,
        )
    )


NODE_SHARE = 0.001  # of a node's ``node:<address>`` resource, per replica placed on it


def pool_options(pool: HostPool, settings: ServerSettings) -> dict[str, Any]:
    """Serve deployment options of a pool of shared hosts."""
    actor: dict[str, Any] = {
        "num_cpus": pool.num_cpus,
        "num_gpus": pool.num_gpus,
        "runtime_env": {"env_vars": replica_env(settings)},
    }
    if pool.resources:
        actor["resources"] = dict(pool.resources)
    options: dict[str, Any] = {
        "num_replicas": pool.replicas,
        "max_ongoing_requests": 1000,  # gateways reach instances over channels: Serve calls are control only
        "logging_config": serve_logging(settings),
        "ray_actor_options": actor,
        "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_S,
        "graceful_shutdown_wait_loop_s": 0.2,
    }
    if pool.max_per_node:
        options["max_replicas_per_node"] = pool.max_per_node
    return options


def replica_options(
    group: ReplicaGroup,
    settings: ServerSettings,
    scaling: AutoscalingSpec | None = None,
    sequence: bool = False,
    pip: list[str] | None = None,
) -> dict[str, Any]:
    """Serve deployment options for one replica group (one replica = one Triton instance).  ``pip``: packages
    Ray installs into the replicas' runtime environment (a Python model's ``requirements.txt``)."""
    runtime_env: dict[str, Any] = {"env_vars": replica_env(settings)}
    if pip:
        runtime_env["pip"] = list(pip)
    actor: dict[str, Any] = {
        "num_cpus": group.num_cpus,
        "num_gpus": group.num_gpus,
        "runtime_env": runtime_env,
    }
    if group.resources:
        actor["resources"] = dict(group.resources)
    options: dict[str, Any] = {
        "max_ongoing_requests": max(8, settings.max_inflight_per_instance * settings.gateway_replicas * 2),
        "logging_config": serve_logging(settings),
        "ray_actor_options": actor,
        "graceful_shutdown_timeout_s": GRACEFUL_SHUTDOWN_S,
        "graceful_shutdown_wait_loop_s": 0.2,
    }
    if scaling is not None:
        options["autoscaling_config"] = serve_autoscaling_config(scaling, sequence=sequence)
    else:
        options["num_replicas"] = group.num_replicas
    if group.max_per_node:
        # count instances on this GPU index of each node that has it, as Triton on every node would.
        options["max_replicas_per_node"] = group.max_per_node
    return options
