"""The server's Serve application: gateway, model manager and sequence router.

The models themselves are not part of it: the model manager deploys each
model's instance groups as Serve applications of their own (``model_apps.py``),
so models load and unload without restarting this application or each other.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from serve_app.placement import DEFAULT_GPU_RESOURCE_PREFIX, ClusterGpus
from serve_app.rayserve.model_apps import QUIET_LOGS, REPLICA_ENV, deployment_name, replica_options
from serve_app.settings import ServerSettings

__all__ = ["build_application", "cluster_gpus", "deployment_name", "replica_options", "wait_for_gpus"]

logger = logging.getLogger("serve_app")


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
    """The bound application; ``gpus`` fixes the cluster's GPUs instead of asking Ray (tests)."""
    from ray import serve

    from serve_app.rayserve.gateway import Gateway
    from serve_app.rayserve.model_manager import ModelManager
    from serve_app.rayserve.sequence_router import SequenceRouterDeployment

    # Channels carry every sequence step; batches of other models too unless direct_channel is off.
    token = secrets.token_bytes(16)
    light = {"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}}
    router = (
        serve.deployment(SequenceRouterDeployment)
        .options(
            name="sequence_router",
            num_replicas=1,
            max_ongoing_requests=1000,
            logging_config=QUIET_LOGS,
            ray_actor_options=light,
        )
        .bind(token, settings.app_name)
    )
    manager = (
        serve.deployment(ModelManager)
        .options(
            name="model_manager",
            num_replicas=1,
            max_ongoing_requests=1000,
            logging_config=QUIET_LOGS,
            ray_actor_options=light,
            graceful_shutdown_timeout_s=60,
        )
        .bind(settings, token, router, gpus)
    )
    gateway = serve.deployment(Gateway).options(
        name="gateway",
        num_replicas=settings.gateway_replicas,
        max_ongoing_requests=1000,
        logging_config=QUIET_LOGS,
        ray_actor_options=light,
    )
    report(f"serve_app: model repository {settings.model_repository}, model control mode {settings.model_control_mode}")
    return gateway.bind(settings, token, manager, router)
