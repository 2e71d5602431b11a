"""Model repository → one Serve application: a gateway plus a deployment per
(model version, instance group)."""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any

from serve_app.config import ENSEMBLE_PLATFORM
from serve_app.config.ensemble_deps import composing_models, ensemble_problems
from serve_app.errors import ServeError
from serve_app.inference.sequence import model_key
from serve_app.placement import (
    DEFAULT_GPU_RESOURCE_PREFIX,
    ClusterGpus,
    ReplicaGroup,
    instance_spec,
    plan_replicas,
    share_gpus,
)
from serve_app.rayserve.gateway import GatewaySpec, ServedVersion
from serve_app.rayserve.sequence_router import SequenceModelSpec, SequenceRouterDeployment
from serve_app.repository import ModelRepository, ModelSource
from serve_app.scheduling.sequence_batcher import SequenceBatchingConfig
from serve_app.settings import ServerSettings

logger = logging.getLogger("serve_app")

# Our replicas never block their event loop (models run in an executor thread),
# so Serve can run user code and the handle router on the replica's main loop
# and skip two cross-thread hand-offs per call.
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}

# One access-log line per Ray call costs CPU on the hot path; errors are still logged.
QUIET_LOGS = {"enable_access_log": False}


def deployment_name(model: str, version: int, group: int, device: int | None = None) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    suffix = "" if device is None else f".gpu{device}"
    return f"{safe}.v{version}.g{group}{suffix}"


def cluster_gpus(prefix: str = DEFAULT_GPU_RESOURCE_PREFIX) -> ClusterGpus:
    """The live nodes' GPUs and the per-GPU resources (``<prefix><index>``) they declare."""
    import ray

    return ClusterGpus.from_nodes((n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")), prefix)


def wait_for_gpus(settings: ServerSettings, report: Any = print, poll_s: float = 2.0) -> ClusterGpus:
    """The cluster's GPUs once at least ``settings.wait_for_gpus`` have joined (or the wait ran out)."""
    import time

    gpus = cluster_gpus(settings.gpu_resource_prefix)
    if gpus.total >= settings.wait_for_gpus:
        return gpus
    report(f"waiting up to {settings.wait_for_gpus_s:.0f}s for {settings.wait_for_gpus} GPU(s); {gpus.total} joined")
    deadline = time.monotonic() + settings.wait_for_gpus_s
    while gpus.total < settings.wait_for_gpus and time.monotonic() < deadline:
        time.sleep(poll_s)
        gpus = cluster_gpus(settings.gpu_resource_prefix)
    if gpus.total < settings.wait_for_gpus:
        report(f"only {gpus.total} of {settings.wait_for_gpus} GPU(s) joined; planning instances with those")
    return gpus


def build_application(settings: ServerSettings, *, gpus: ClusterGpus | None = None, report: Any = print) -> Any:
    from ray import serve

    from serve_app.rayserve.gateway import Gateway
    from serve_app.rayserve.model_deployment import ModelReplica

    if gpus is None:
        gpus = wait_for_gpus(settings, report)
    repo = ModelRepository(settings.model_repository)
    # Channels carry every sequence step; batches of other models too unless direct_channel is off.
    token = secrets.token_bytes(16)
    served: list[ServedVersion] = []
    failed: list[tuple[str, str]] = []
    bound: dict[str, Any] = {}
    sequence_models: list[SequenceModelSpec] = []
    loaded: dict[str, ModelSource] = {}
    plans: dict[str, list[ReplicaGroup]] = {}
    for name, source in repo.load_all().items():
        try:
            if isinstance(source, ServeError):
                raise source
            if source.config.platform != ENSEMBLE_PLATFORM:
                plans[name] = plan_replicas(source.config, gpus, cpus_per_instance=settings.instance_cpus)
            loaded[name] = source
        except ServeError as exc:
            report(f"model '{name}': failed to load: {exc.message}")
            failed.append((name, exc.message))
    configs = {n: s.config for n, s in loaded.items()}
    problems = ensemble_problems(configs, {n: set(s.versions) for n, s in loaded.items()})
    # Every instance Triton would put on a GPU gets an equal share of it, across models and versions.
    deployed = {n: p for n, p in plans.items() if n not in problems}
    plans = share_gpus(deployed, {n: len(loaded[n].versions) for n in deployed})
    for name, source in loaded.items():
        config_bytes = source.config.SerializeToString()
        if name in problems:
            report(f"model '{name}': failed to load: {problems[name]}")
            failed.append((name, problems[name]))
            continue
        if name not in plans:  # an ensemble: its steps run from the gateway, it has no instances
            for version in source.versions:
                served.append(ServedVersion(name, version, config_bytes, (), (), tuple(source.labels.items())))
                report(f"model '{name}' version {version}: ensemble of {', '.join(composing_models(source.config))}")
            continue
        groups = plans[name]
        for version, model_file in source.versions.items():
            names = []
            for group in groups:
                dname = deployment_name(name, version, group.group_index, group.device)
                names.append(dname)
                bound[dname] = (
                    serve.deployment(ModelReplica)
                    .options(name=dname, **replica_options(group, settings))
                    .bind(name, version, config_bytes, str(model_file), group.kind, token, instance_spec(group))
                )
            replicas = tuple(g.num_replicas for g in groups)
            served.append(
                ServedVersion(name, version, config_bytes, tuple(names), replicas, tuple(source.labels.items()))
            )
            if source.config.HasField("sequence_batching"):
                slots = SequenceBatchingConfig.from_model_config(source.config).slots
                sequence_models.append(
                    SequenceModelSpec(model_key(name, version), name, slots, tuple(zip(names, replicas, strict=True)))
                )
            kinds = ", ".join(f"{g.num_replicas}x {g.kind}{_where(g)}" for g in groups)
            report(f"model '{name}' version {version}: deploying ({kinds})")
    spec = GatewaySpec(settings=settings, served=tuple(served), failed=tuple(failed), channel_token=token)
    gateway = serve.deployment(Gateway).options(
        name="gateway",
        num_replicas=settings.gateway_replicas,
        max_ongoing_requests=1000,
        logging_config=QUIET_LOGS,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}},
    )
    router = None
    if sequence_models:
        handles = {d: bound[d] for m in sequence_models for d, _ in m.deployments}
        router = (
            serve.deployment(SequenceRouterDeployment)
            .options(
                name="sequence_router",
                num_replicas=1,
                max_ongoing_requests=1000,
                logging_config=QUIET_LOGS,
                ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}},
            )
            .bind(tuple(sequence_models), handles, token)
        )
    return gateway.bind(spec, bound, router)


def replica_options(group: ReplicaGroup, settings: ServerSettings) -> dict[str, Any]:
    """Serve deployment options for one replica group (one replica = one Triton instance)."""
    actor: dict[str, Any] = {
        "num_cpus": group.num_cpus,
        "num_gpus": group.num_gpus,
        "runtime_env": {"env_vars": REPLICA_ENV},
    }
    if group.resources:
        actor["resources"] = dict(group.resources)
    options: dict[str, Any] = {
        "num_replicas": group.num_replicas,
        "max_ongoing_requests": max(8, settings.max_inflight_per_instance * settings.gateway_replicas * 2),
        "logging_config": QUIET_LOGS,
        "ray_actor_options": actor,
    }
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
