"""Host pools: which shared host holds an instance group, and what a pool asks of Ray."""

from __future__ import annotations

from serve_app.placement import ClusterGpus, gateways_per_node, host_pool, hosted_instances
from serve_app.placement.groups import KIND_CPU, KIND_GPU, KIND_MODEL, ReplicaGroup
from serve_app.placement.pools import HostPool, PoolRollout, pool_rollout, started_pools

THREE_NODES = ClusterGpus(total=4, indexed={0: 2, 1: 2}, cpu_nodes=3)


def group(kind: str, count: int = 2, device: int | None = None) -> ReplicaGroup:
    return ReplicaGroup("g", kind, count, 0.01, 0.0, (), 0, device=device, count=count)


def test_cpu_groups_go_to_one_host_per_node_with_count_in_each() -> None:
    pool = host_pool(group(KIND_CPU, 3), THREE_NODES, 0.01)
    assert (pool.name, pool.deployment, pool.replicas, pool.max_per_node, pool.num_cpus) == (
        "cpu",
        "host-cpu",
        3,
        1,
        0.01,
    )
    assert hosted_instances(group(KIND_CPU, 3), pool) == 9


def test_gpu_groups_pinned_to_an_index_share_one_host_per_node_with_that_gpu() -> None:
    pool = host_pool(group(KIND_GPU, 2, device=1), THREE_NODES, 0.01)
    assert (pool.name, pool.kind, pool.device, pool.replicas, pool.max_per_node) == ("gpu1", KIND_GPU, 1, 2, 1)
    assert pool.resources == (("gpu_idx_1", 1.0),) and pool.num_gpus == 0
    assert hosted_instances(group(KIND_GPU, 2, device=1), pool) == 4


def test_gpu_groups_without_indices_get_a_host_per_gpu_ray_picks() -> None:
    pool = host_pool(group(KIND_GPU, 1), ClusterGpus(total=4), 0.01)
    assert (pool.name, pool.replicas, pool.num_gpus, pool.max_per_node) == ("gpu", 4, 1.0, 0)


def test_kind_model_groups_get_a_host_per_node_that_hides_no_device() -> None:
    pool = host_pool(group(KIND_MODEL), THREE_NODES, 0.01)
    assert (pool.name, pool.kind, pool.replicas, pool.num_gpus) == ("model", KIND_MODEL, 3, 0.0)


def test_nodes_count_from_their_cpus() -> None:
    nodes = [{"CPU": 8.0, "GPU": 2.0, "gpu_idx_0": 1.0, "gpu_idx_1": 1.0}, {"CPU": 0.0}, {"CPU": 4.0}]
    cluster = ClusterGpus.from_nodes(nodes)
    assert (cluster.cpu_nodes, cluster.total, dict(cluster.indexed)) == (2, 2, {0: 1, 1: 1})


def test_gateways_spread_evenly_over_the_nodes() -> None:
    # one per node: every node's address answers; more than nodes: they share evenly; one node: no limit
    assert gateways_per_node(3, 3) == 1
    assert gateways_per_node(2, 3) == 1
    assert gateways_per_node(4, 3) == 2
    assert gateways_per_node(2, 1) == 0 and gateways_per_node(1, 3) == 0 and gateways_per_node(3, 0) == 0


def _pool(name: str, in_deployment: tuple[str, str] | None = None) -> HostPool:
    return HostPool(name, KIND_CPU, 1, 0.01, in_deployment=in_deployment)


def test_rollout_starts_new_pools_and_adopts_the_gateways() -> None:
    cpu_in_gateways = _pool("cpu", ("gateway", "serve_app"))
    gpu0, model = _pool("gpu0"), _pool("model")
    rollout = pool_rollout({"cpu": cpu_in_gateways, "gpu0": gpu0, "model": model}, {"model": model})
    assert rollout.start == (gpu0,)  # "model" is deployed already
    assert rollout.adopt == (cpu_in_gateways,)  # the gateways are its hosts: nothing to start


def test_rollout_of_a_plan_already_deployed_is_empty() -> None:
    gpu0 = _pool("gpu0")
    assert pool_rollout({"gpu0": gpu0}, {"gpu0": gpu0}) == PoolRollout((), ())


def test_started_pools_splits_by_their_applications_outcome() -> None:
    gpu0, gpu1 = _pool("gpu0"), _pool("gpu1")
    up, failed = started_pools([gpu0, gpu1], {"app--host-gpu1"}, lambda p: f"app--{p.deployment}")
    assert up == [gpu0]
    assert failed == ["app--host-gpu1"]
