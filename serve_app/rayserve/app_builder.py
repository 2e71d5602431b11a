"""The server's Serve application: gateway, model manager and sequence router.

The models themselves are not part of it: the model manager deploys each
model's instance groups as Serve applications of their own (``model_apps.py``),
so models load and unload without restarting this application or each other.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from serve_app.placement import ClusterGpus, deployment_name, gateways_per_node
from serve_app.rayserve.cluster import live_nodes
from serve_app.rayserve.console import serve_logging
from serve_app.rayserve.model_apps import REPLICA_ENV, replica_options
from serve_app.settings import ServerSettings

__all__ = ["build_application", "deployment_name", "replica_options"]

logger = logging.getLogger("serve_app")


def build_application(settings: ServerSettings, *, gpus: ClusterGpus | None = None) -> Any:
    """The bound application; ``gpus`` fixes the cluster's GPUs instead of asking Ray (tests)."""
    from ray import serve

    from serve_app.rayserve.gateway import Gateway
    from serve_app.rayserve.model_manager import ModelManager
    from serve_app.rayserve.sequence_router_deployment import SequenceRouterDeployment

    # Channels carry every sequence step; batches of other models too unless direct_channel is off.
    token = secrets.token_bytes(16)
    light = {"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}}
    router = (
        serve.deployment(SequenceRouterDeployment)
        .options(
            name="sequence_router",
            num_replicas=1,
            max_ongoing_requests=1000,
            logging_config=serve_logging(settings),
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
            logging_config=serve_logging(settings),
            ray_actor_options=light,
            graceful_shutdown_timeout_s=60,
        )
        .bind(settings, token, router, gpus)
    )
    per_node = gateways_per_node(settings.gateway_replicas, live_nodes())
    gateway = serve.deployment(Gateway).options(
        name="gateway",
        num_replicas=settings.gateway_replicas,
        max_ongoing_requests=1000,
        logging_config=serve_logging(settings),
        ray_actor_options=light,
        **({"max_replicas_per_node": per_node} if per_node else {}),
    )
    return gateway.bind(settings, token, manager, router)
