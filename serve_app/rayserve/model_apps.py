"""Model versions → where their instances run: shared hosts, or Serve applications of their own.

Most instance groups go to the pools of shared hosts (``placement/pools.py``):
the plan says which groups each pool's hosts take.  A model Serve autoscales,
or one that asks for ``dedicated_process``, gets a deployment per instance
group, one replica per instance.  A Serve application can't gain or lose
deployments without restarting all of them, so each such deployment (and
each host pool) gets an application of its own (no route prefix; nothing
routes to it but our gateways).  Loading, reloading and
unloading a model then start and delete only its own applications.  A reload
deploys a new *generation* beside the old one, so traffic moves only once the
new instances are up.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.autoscale import AutoscalingSpec, serve_autoscaling_config
from serve_app.backends.python.environment import pip_requirements
from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.config.ensemble_deps import composing_models
from serve_app.config.hosting import dedicated_process
from serve_app.hosting import InstanceHost, InstanceLoad
from serve_app.keys import ModelKey
from serve_app.observability import python_logging
from serve_app.placement import (
    ClusterGpus,
    HostPool,
    ReplicaGroup,
    host_pool,
    hosted_instances,
    instance_spec,
    plan_replicas,
    share_gpus,
)
from serve_app.rayserve.console import serve_logging
from serve_app.rayserve.sequence_router_deployment import SequenceModelSpec
from serve_app.repository import ModelSource
from serve_app.sequence.batcher import SequenceBatchingConfig
from serve_app.service.serving_state import DeploymentRef, ServedVersion
from serve_app.settings import ServerSettings

# Our replicas never block their event loop (models run in an executor thread),
# so Serve can run user code and the handle router on the replica's main loop
# and skip two cross-thread hand-offs per call.
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}

# One access-log line per Ray call costs CPU on the hot path; errors are still logged.
# How long a stopping instance may finish its work (in-flight batches; live sequences when scaled down).
GRACEFUL_SHUTDOWN_S = 30.0


def replica_env(settings: ServerSettings) -> dict[str, str]:
    """A model process's environment: Serve's options above, and the server's start-up log settings (what a
    model's ``pb_utils.Logger`` lets through)."""
    return {**REPLICA_ENV, **python_logging.to_env(settings.log_settings())}


def deployment_name(model: str, version: int, group: int, device: int | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    suffix = "" if device is None else f".gpu{device}"
    return f"{safe}.v{version}.g{group}{suffix}"


def app_name(server_app: str, deployment: str, generation: int) -> str:
    return f"{server_app}--{deployment}--{generation}"


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

    def hosted_groups(self, model: str) -> set[str]:
        """The group ids of ``model``'s instance groups placed in shared hosts."""
        return {
            InstanceHost.group_id(load) for loads in self.hosted.values() for load in loads if load.key.name == model
        }


def plan_model_apps(
    sources: Mapping[str, ModelSource],
    generations: Mapping[str, int],
    settings: ServerSettings,
    gpus: ClusterGpus,
    token: bytes,
    autoscaling: Mapping[str, AutoscalingSpec | None],
    pool_app: Callable[[HostPool], str] = lambda pool: pool.deployment,
) -> ModelApps:
    """Applications and host content for ``sources`` (each at its generation).  GPU shares are split evenly
    among the dedicated instances planned here that Triton would put on a GPU.  ``pool_app``: the Serve
    application of a host pool."""
    from ray import serve

    from serve_app.rayserve.model_replica import ModelReplica

    out = ModelApps()
    plans: dict[str, list[ReplicaGroup]] = {}
    for name, source in sources.items():
        if source.config.platform == ENSEMBLE_PLATFORM:
            continue
        try:
            plans[name] = plan_replicas(source.config, gpus, cpus_per_instance=settings.instance_cpus)
        except Exception as exc:
            out.failed[name] = getattr(exc, "message", str(exc))
    plans = share_gpus(plans, {n: len(sources[n].versions) for n in plans})
    for name, source in sources.items():
        if name in out.failed:
            continue
        gen = generations[name]
        config_bytes = source.config.SerializeToString()
        labels = tuple(source.labels.items())
        if name not in plans:  # an ensemble: its steps run from the gateway, it has no instances
            for version in source.versions:
                out.served.append(ServedVersion(name, version, config_bytes, (), labels, gen, "LOADING"))
                out.messages.append(
                    f"model '{name}' version {version}: ensemble of {', '.join(composing_models(source.config))}"
                )
            continue
        scaling = autoscaling.get(name)
        sequence = source.config.HasField("sequence_batching")
        shared = settings.shared_hosts and settings.direct_channel and scaling is None
        shared = shared and not dedicated_process(source.config)
        for version, model_file in source.versions.items():
            refs: list[DeploymentRef] = []
            where = []
            for group in plans[name]:
                if shared:
                    pool = host_pool(group, gpus, settings.instance_cpus, gateway_pool(settings))
                    load = InstanceLoad(
                        ModelKey(name, version, gen),
                        config_bytes,
                        str(model_file),
                        group.kind,
                        instance_spec(group),
                        max(1, group.count),
                    )
                    out.hosted.setdefault(pool.name, []).append(load)
                    out.pools[pool.name] = pool
                    refs.append(
                        DeploymentRef(pool_app(pool), pool.deployment, hosted_instances(group, pool), hosted=True)
                    )
                    where.append(f"{max(1, group.count)}x {group.kind} in each of {pool.replicas} {pool.deployment}(s)")
                    continue
                dname = deployment_name(name, version, group.group_index, group.device)
                aname = app_name(settings.app_name, dname, gen)
                options = replica_options(
                    group, settings, scaling, sequence, pip_requirements(model_file.parent.parent)
                )
                out.apps[aname] = (
                    serve.deployment(ModelReplica)
                    .options(name=dname, **options)
                    .bind(
                        name,
                        version,
                        config_bytes,
                        str(model_file),
                        group.kind,
                        token,
                        instance_spec(group),
                        gen,
                        settings.app_name,
                    )
                )
                start = scaling.initial_replicas or scaling.min_replicas if scaling else group.num_replicas
                refs.append(DeploymentRef(aname, dname, max(1, start or 1), scaling is not None))
                where.append(f"{group.num_replicas}x {group.kind}{_where(group)}")
            out.served.append(ServedVersion(name, version, config_bytes, tuple(refs), labels, gen, "LOADING"))
            if sequence:
                slots = SequenceBatchingConfig.from_model_config(source.config).slots
                instances: dict[tuple[str, str], int] = {}
                for r in refs:  # several groups in one pool: one deployment to ask, their instances added up
                    instances[(r.app, r.name)] = instances.get((r.app, r.name), 0) + r.replicas
                out.sequence_models.append(
                    SequenceModelSpec(
                        ModelKey(name, version).label,
                        name,
                        slots,
                        tuple((app, dep, n) for (app, dep), n in instances.items()),
                        gen,
                    )
                )
            scaled = f", autoscaling {scaling.min_replicas}..{scaling.max_replicas}" if scaling else ""
            out.messages.append(f"model '{name}' version {version}: deploying ({', '.join(where)}{scaled})")
    return out


def gateway_pool(settings: ServerSettings) -> tuple[str, str, int] | None:
    """The gateways, when they hold the shared CPU instances themselves: (deployment, application, replicas)."""
    return ("gateway", settings.app_name, settings.gateway_replicas) if settings.cpu_instances_in_gateway else None


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


def _where(group: ReplicaGroup) -> str:
    if group.device is not None:
        return f" on GPU {group.device} ({group.count} per node)"
    if group.num_gpus:
        return f" ({group.num_gpus:g} GPU each)"
    return ""
