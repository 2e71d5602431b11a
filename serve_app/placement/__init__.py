"""Where instances go: instance groups to Ray resources (``groups``), and the pools of shared hosts
(``pools``).  Pure: no Ray import, so planning and its tests run without a cluster."""

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
from serve_app.placement.pools import HostPool, gateways_per_node, host_pool, hosted_instances

__all__ = [
    "DEFAULT_GPU_RESOURCE_PREFIX",
    "KIND_CPU",
    "KIND_GPU",
    "KIND_MODEL",
    "ClusterGpus",
    "HostPool",
    "InstanceSpec",
    "ReplicaGroup",
    "gateways_per_node",
    "host_pool",
    "hosted_instances",
    "instance_spec",
    "plan_replicas",
    "share_gpus",
]
