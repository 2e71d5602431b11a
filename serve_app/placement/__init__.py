"""Where instances go: instance groups to Ray resources (``groups``), the pools of shared hosts
(``pools``), and a repository's models placed on both (``plan``).  Pure: no Ray import, so planning and its
tests run without a cluster."""

from serve_app.placement.groups import (
    DEFAULT_GPU_RESOURCE_PREFIX,
    KIND_CPU,
    KIND_GPU,
    KIND_MODEL,
    ClusterGpus,
    InstanceSpec,
    ReplicaGroup,
    instance_spec,
    plan_replicas,
    share_gpus,
)
from serve_app.placement.plan import (
    PlacedGroup,
    PlacementPlan,
    VersionPlan,
    app_name,
    deployment_name,
    gateway_pool,
    plan_placement,
)
from serve_app.placement.pools import HostPool, gateways_per_node, host_pool, hosted_instances

__all__ = [
    "DEFAULT_GPU_RESOURCE_PREFIX",
    "KIND_CPU",
    "KIND_GPU",
    "KIND_MODEL",
    "ClusterGpus",
    "HostPool",
    "InstanceSpec",
    "PlacedGroup",
    "PlacementPlan",
    "ReplicaGroup",
    "VersionPlan",
    "app_name",
    "deployment_name",
    "gateway_pool",
    "gateways_per_node",
    "host_pool",
    "hosted_instances",
    "instance_spec",
    "plan_placement",
    "plan_replicas",
    "share_gpus",
]
