"""Which shared host holds an instance group, and what each pool of hosts asks of Ray.

Triton runs a server's instances as threads of one process; serve_app does
the same per node and device with *host pools*, one Serve deployment each:

* ``cpu``: one host on every node with CPUs; a ``KIND_CPU`` group puts
  ``count`` instances in each (as ``count`` instances on every Triton server).
  By default the gateways are these hosts: a gateway runs its instances
  itself, as a Triton server serves and runs models in one process;
* ``gpu<i>``: with per-GPU resources declared, one host per node that has
  GPU ``i``, holding every group's instances on that GPU (``count`` per GPU,
  as in Triton), all in one process: one CUDA context per GPU;
* ``gpu``: without them, one host per GPU of the cluster (Ray picks the
  GPUs), holding ``count`` instances of each ``KIND_GPU`` group;
* ``model``: one host per node for ``KIND_MODEL`` groups (the backend picks
  devices; the host hides none).

A host reserves a token amount of CPU (``instance_cpus``), so hosts land only
on nodes with CPUs and share them, as Triton's instances share a server's
cores; a GPU host reserves its whole GPU, or, where dedicated instances (a
model's own processes) share it, the share its own instances add up to.
Pure: no Ray import.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from serve_app.placement.groups import KIND_CPU, KIND_GPU, KIND_MODEL, ClusterGpus, ReplicaGroup


@dataclass(frozen=True)
class HostPool:
    """One Serve deployment of shared hosts: how many, and what each asks of Ray."""

    name: str  # "cpu", "gpu<i>", "gpu" or "model"
    kind: str  # the kind of instances it holds (the host sets CUDA_VISIBLE_DEVICES for it)
    replicas: int
    num_cpus: float
    num_gpus: float = 0.0
    device: int | None = None  # the GPU index every host of the pool uses, when pinned
    resources: tuple[tuple[str, float], ...] = ()
    max_per_node: int = 0  # Serve's max_replicas_per_node (0 = no limit)
    # Hosts that are another deployment's replicas (the gateways holding CPU instances): its name and app.
    in_deployment: tuple[str, str] | None = None

    @property
    def deployment(self) -> str:
        return self.in_deployment[0] if self.in_deployment else f"host-{self.name}"


def host_pool(
    group: ReplicaGroup,
    cluster: ClusterGpus,
    cpus: float,
    gateways: tuple[str, str, int] | None = None,
    gpu_share: float = 1.0,
) -> HostPool:
    """The pool whose hosts hold ``group``'s instances, ``group.count`` in each host.  ``gateways``: (deployment,
    application, replicas) of the gateways when they hold the CPU instances themselves.  ``gpu_share``: of
    its GPU, what a GPU host asks (less than the whole where dedicated instances share the GPU)."""
    if group.kind == KIND_CPU and gateways is not None:
        deployment, app, replicas = gateways
        return HostPool("cpu", KIND_CPU, replicas, 0.0, in_deployment=(deployment, app))
    if group.kind == KIND_CPU:
        return HostPool("cpu", KIND_CPU, cluster.cpu_nodes, cpus, max_per_node=1)
    if group.kind == KIND_MODEL:
        return HostPool("model", KIND_MODEL, cluster.cpu_nodes, cpus, max_per_node=1)
    if group.kind != KIND_GPU:
        raise ValueError(f"unknown instance kind {group.kind}")
    if group.device is None:  # Ray picks the GPU: one host per GPU of the cluster
        return HostPool("gpu", KIND_GPU, max(1, cluster.total), cpus, num_gpus=gpu_share)
    nodes = cluster.indexed.get(group.device, 1)
    resource = ((cluster.resource(group.device), gpu_share),)
    return HostPool(
        f"gpu{group.device}", KIND_GPU, nodes, cpus, device=group.device, resources=resource, max_per_node=1
    )


def hosted_instances(group: ReplicaGroup, pool: HostPool) -> int:
    """Instances of ``group`` in the whole pool: ``count`` in each host."""
    return max(1, group.count) * pool.replicas


def gateways_per_node(replicas: int, nodes: int) -> int:
    """Serve's ``max_replicas_per_node`` for the gateways (0: no limit): spread evenly over the live nodes.

    Each gateway serves the Triton ports on its node's address, so a node without one does not answer;
    Serve's default placement only prefers spreading, and put two gateways on one node and none on
    another.  More gateways than nodes share their nodes' ports (SO_REUSEPORT), as on one machine."""
    if nodes <= 1 or replicas <= 1:
        return 0
    return -(-replicas // nodes)


@dataclass(frozen=True)
class PoolRollout:
    """What a deploy does with the host pools its plan needs and nothing deploys yet."""

    start: tuple[HostPool, ...]  # one Serve application each, started with the deploy's models
    adopt: tuple[HostPool, ...]  # hosts that are another deployment's replicas (the gateways): nothing to start


def pool_rollout(planned: Mapping[str, HostPool], deployed: Mapping[str, HostPool]) -> PoolRollout:
    """The pools of a plan (by name) that no deployment holds yet, as started or adopted."""
    new = [pool for name, pool in planned.items() if name not in deployed]
    return PoolRollout(
        tuple(p for p in new if p.in_deployment is None), tuple(p for p in new if p.in_deployment is not None)
    )


def started_pools(
    start: Iterable[HostPool], failed_apps: Collection[str], app_name: Callable[[HostPool], str]
) -> tuple[list[HostPool], list[str]]:
    """Of the pools a deploy started, those now deployed, and the applications of those that failed (their
    groups' models fail with them; the applications are removed as stale)."""
    up, failed = [], []
    for pool in start:
        if app_name(pool) in failed_apps:
            failed.append(app_name(pool))
        else:
            up.append(pool)
    return up, failed
