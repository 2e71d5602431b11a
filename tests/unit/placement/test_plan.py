"""plan_placement: a repository's model versions placed in host pools or deployments of their own, with the
cluster's GPUs (what Ray reported) as an input; no Ray."""

from __future__ import annotations

import pathlib
from typing import Any

from scripts import example_models
from serve_app.autoscale import AutoscalingSpec
from serve_app.keys import ModelKey
from serve_app.placement import ClusterGpus, HostPool, PlacementPlan, plan_placement
from serve_app.repository import ModelRepository
from serve_app.settings import ServerSettings

DIMS = 4
TWO_GROUPS = "instance_group [ { kind: KIND_CPU count: 2 }, { kind: KIND_CPU count: 1 } ]\n"
SEQUENCE = "sequence_batching { max_sequence_idle_microseconds: 5000000 }\n"


def plan(
    repo: pathlib.Path,
    names: list[str],
    *,
    gpus: ClusterGpus | None = None,
    scaling: dict[str, Any] | None = None,
    **settings: Any,
) -> PlacementPlan:
    sources = {n: ModelRepository(repo).load(n) for n in names}
    generations = {n: 10 + i for i, n in enumerate(names)}
    return plan_placement(
        sources,
        generations,
        ServerSettings(str(repo), **settings),
        gpus or ClusterGpus(total=0),
        scaling or {},
        lambda pool: f"pool-app-{pool.name}",
    )


def test_without_shared_hosts_each_group_of_each_version_is_a_deployment_of_its_own(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS, versions=(1, 2), extra_config=TWO_GROUPS + "version_policy { all { } }")
    out = plan(tmp_path, ["add_sub"], shared_hosts=False)
    assert [v.key for v in out.versions] == [ModelKey("add_sub", 1, 10), ModelKey("add_sub", 2, 10)]
    assert [(g.app, g.deployment, g.instances, g.pool) for g in out.versions[0].groups] == [
        ("serve_app--add_sub.v1.g0--10", "add_sub.v1.g0", 2, None),
        ("serve_app--add_sub.v1.g1--10", "add_sub.v1.g1", 1, None),
    ]
    assert out.messages[0] == "model 'add_sub' version 1: deploying (2x KIND_CPU, 1x KIND_CPU)"
    assert out.failed == {}


def test_shared_cpu_groups_go_to_the_gateways_and_one_pool_is_asked_once(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, name="seq", dims=DIMS, extra_config=TWO_GROUPS + SEQUENCE)
    out = plan(tmp_path, ["seq"], gateway_replicas=3)
    (version,) = out.versions
    pools = {g.pool for g in version.groups}
    assert pools == {HostPool("cpu", "KIND_CPU", 3, 0.0, in_deployment=("gateway", "serve_app"))}
    assert [(g.per_host, g.instances) for g in version.groups] == [(2, 6), (1, 3)]
    assert version.sequence and version.deployments() == (("pool-app-cpu", "gateway", 9),)
    assert out.messages == ["model 'seq' version 1: deploying (2x KIND_CPU in each of 3 gateway(s), 1x KIND_CPU "
                            "in each of 3 gateway(s))"]  # fmt: skip


def test_cpu_hosts_of_their_own_when_the_gateways_hold_no_instances(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS)
    out = plan(tmp_path, ["add_sub"], cpu_instances_in_gateway=False, gpus=ClusterGpus(total=0, cpu_nodes=2))
    (placed,) = out.versions[0].groups
    assert placed.pool is not None and (placed.pool.name, placed.pool.replicas) == ("cpu", 2)
    assert (placed.app, placed.deployment, placed.instances) == ("pool-app-cpu", "host-cpu", 2)


def test_gpu_groups_go_to_a_host_per_gpu_that_ray_reported(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS, extra_config="instance_group [ { kind: KIND_GPU count: 2 } ]")
    out = plan(tmp_path, ["add_sub"], gpus=ClusterGpus(total=2))
    (placed,) = out.versions[0].groups
    assert placed.pool is not None and (placed.pool.name, placed.pool.replicas, placed.pool.num_gpus) == ("gpu", 2, 1)
    assert placed.instances == 4
    assert plan(tmp_path, ["add_sub"]).failed.keys() == {"add_sub"}  # no GPU in the cluster: it can't be placed


def test_an_autoscaled_model_gets_its_own_deployment_starting_at_its_initial_replicas(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS)
    scaling = {"add_sub": AutoscalingSpec(min_replicas=1, max_replicas=4, initial_replicas=2)}
    out = plan(tmp_path, ["add_sub"], scaling=scaling)
    (placed,) = out.versions[0].groups
    assert (placed.pool, placed.instances, placed.autoscaled) == (None, 2, True)
    assert out.messages == ["model 'add_sub' version 1: deploying (1x KIND_CPU, autoscaling 1..4)"]


def test_a_model_that_asks_for_a_process_of_its_own_gets_one(tmp_path: pathlib.Path) -> None:
    own = 'parameters { key: "dedicated_process" value: { string_value: "true" } }'
    example_models.add_sub(tmp_path, dims=DIMS, extra_config=own)
    (placed,) = plan(tmp_path, ["add_sub"]).versions[0].groups
    assert (placed.pool, placed.deployment) == (None, "add_sub.v1.g0")


def test_an_ensemble_has_no_instances_and_a_model_that_cannot_be_placed_fails_alone(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, dims=DIMS)
    example_models.add_sub(tmp_path, name="gpu", dims=DIMS, extra_config="instance_group [ { kind: KIND_GPU } ]")
    example_models.add_sub_ensemble(tmp_path, name="ens", dims=DIMS)
    out = plan(tmp_path, ["gpu", "ens", "add_sub"])
    assert list(out.failed) == ["gpu"]
    assert [(v.key.name, v.groups) for v in out.versions if v.key.name == "ens"] == [("ens", ())]
    assert [v.key.name for v in out.versions] == ["ens", "add_sub"]
    assert out.messages[0] == "model 'ens' version 1: ensemble of add_sub"


GPU0 = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]\n"
DEDICATED = 'parameters { key: "dedicated_process" value: { string_value: "true" } }\n'


def test_a_gpu_host_leaves_room_for_dedicated_instances_on_its_gpu(tmp_path: pathlib.Path) -> None:
    """Three instances on GPU 0, one of them in a process of its own: the shared host asks for the two
    thirds its own instances add up to, so that the dedicated replica's third fits beside it."""
    example_models.add_sub(tmp_path, name="hosted_a", dims=DIMS, extra_config=GPU0)
    example_models.add_sub(tmp_path, name="hosted_b", dims=DIMS, extra_config=GPU0)
    example_models.add_sub(tmp_path, name="own", dims=DIMS, extra_config=GPU0 + DEDICATED)
    out = plan(tmp_path, ["hosted_a", "hosted_b", "own"], gpus=ClusterGpus(total=1, indexed={0: 1}))
    by_name = {v.key.name: v.groups[0] for v in out.versions}
    pools = {by_name["hosted_a"].pool, by_name["hosted_b"].pool}
    (pool,) = pools
    assert pool is not None and pool.name == "gpu0" and pool.resources == (("gpu_idx_0", 0.6666),)
    assert by_name["own"].pool is None and by_name["own"].group.resources == (("gpu_idx_0", 0.3333),)
    assert pool.resources[0][1] + by_name["own"].group.resources[0][1] <= 1.0


def test_a_gpu_only_hosted_instances_use_is_the_host_s_whole(tmp_path: pathlib.Path) -> None:
    example_models.add_sub(tmp_path, name="hosted_a", dims=DIMS, extra_config=GPU0)
    example_models.add_sub(tmp_path, name="hosted_b", dims=DIMS, extra_config=GPU0)
    out = plan(tmp_path, ["hosted_a", "hosted_b"], gpus=ClusterGpus(total=1, indexed={0: 1}))
    assert {v.groups[0].pool.resources for v in out.versions if v.groups[0].pool} == {(("gpu_idx_0", 1.0),)}
