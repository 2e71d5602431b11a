"""plan_replicas / share_gpus: Triton instance_group semantics mapped onto Ray Serve replicas."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from serve_app.errors import InvalidConfig
from serve_app.placement import ClusterGpus, InstanceSpec, ReplicaGroup, instance_spec, plan_replicas, share_gpus
from serve_app.protos import model_config_pb2 as mc

CPU_ONLY = ClusterGpus(total=0)
# GPUs Ray knows of, but no per-GPU resources declared: Ray picks every GPU.
UNPINNED_TWO = ClusterGpus(total=2)
# One node with GPUs 0 and 1, each declared as gpu_idx_<i>.
TWO_GPUS = ClusterGpus(total=2, indexed={0: 1, 1: 1})
# Two nodes with GPUs 0-3 each, all declared.
TWO_NODES = ClusterGpus(total=8, indexed={0: 2, 1: 2, 2: 2, 3: 2})


def cfg(text: str = "", name: str = "m") -> mc.ModelConfig:
    config = text_format.Parse(text, mc.ModelConfig())
    config.name = name
    return config


def plan(text: str, cluster: ClusterGpus = CPU_ONLY, **kw: float) -> list[ReplicaGroup]:
    return plan_replicas(cfg(text), cluster, **kw)


def pinned(
    name: str, device: int, replicas: int, share: float, *, count: int, gpus: tuple[int, ...] = (), index: int = 0
) -> ReplicaGroup:
    """A KIND_GPU deployment pinned to GPU ``device`` through its gpu_idx_<device> resource."""
    return ReplicaGroup(
        name,
        "KIND_GPU",
        replicas,
        1.0,
        0.0,
        gpus,
        index,
        device=device,
        resources=((f"gpu_idx_{device}", share),),
        max_per_node=count,
        count=count,
    )


# --- cluster description ----------------------------------------------------------------------


def test_cluster_from_node_resources() -> None:
    nodes = [
        {"CPU": 4.0, "node:10.0.0.1": 1.0},  # head, no GPU
        {"CPU": 8.0, "GPU": 4.0, "gpu_idx_0": 1.0, "gpu_idx_1": 1.0, "gpu_idx_2": 1.0, "gpu_idx_3": 1.0},
        {"CPU": 8.0, "GPU": 2.0, "gpu_idx_0": 1.0, "gpu_idx_1": 1.0, "gpu_idx_x": 1.0, "my_gpu_idx_2": 1.0},
    ]
    c = ClusterGpus.from_nodes(nodes)
    assert (c.total, dict(c.indexed), c.has_gpus) == (6, {0: 2, 1: 2, 2: 1, 3: 1}, True)
    assert ClusterGpus.from_nodes(nodes, prefix="my_gpu_idx_").indexed == {2: 1}
    assert not ClusterGpus.from_nodes(nodes[:1]).has_gpus


# --- no instance_group: Triton's default group ------------------------------------------------


def test_default_cpu_only_cluster_is_one_cpu_instance() -> None:
    assert plan("", CPU_ONLY) == [ReplicaGroup("m", "KIND_CPU", 1, 1.0, 0.0, ())]


def test_default_with_unpinned_gpus_is_one_instance_per_gpu_placed_by_ray() -> None:
    assert plan("", UNPINNED_TWO) == [ReplicaGroup("m", "KIND_GPU", 2, 1.0, 1.0, ())]


def test_default_with_declared_gpus_is_one_instance_on_every_gpu_of_every_node() -> None:
    assert plan("", TWO_NODES) == [pinned("m", d, 2, 1.0, count=1) for d in range(4)]


# --- KIND_CPU ---------------------------------------------------------------------------------


def test_cpu_count_is_replicas() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU count: 3 }", TWO_NODES)
    assert g == ReplicaGroup("m_0", "KIND_CPU", 3, 1.0, 0.0, (), count=3)


def test_cpus_per_instance_is_per_replica() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU count: 2 }", cpus_per_instance=0.5)
    assert (g.num_replicas, g.num_cpus) == (2, 0.5)


def test_cpu_with_gpus_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"model 'm'.*instance_group\[0\]\.gpus.*KIND_CPU"):
        plan("instance_group { kind: KIND_CPU gpus: [0] }", TWO_GPUS)


# --- count ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_GPU", "KIND_MODEL", "KIND_AUTO"])
@pytest.mark.parametrize("cluster", [ClusterGpus(1), ClusterGpus(1, {0: 1})], ids=["unpinned", "pinned"])
def test_count_zero_means_one(kind: str, cluster: ClusterGpus) -> None:
    groups = plan(f"instance_group {{ kind: {kind} count: 0 gpus: [] }}", cluster)
    assert [g.num_replicas for g in groups] == [1]


def test_unset_count_means_one() -> None:
    (g,) = plan("instance_group { kind: KIND_CPU }")
    assert g.num_replicas == 1


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_GPU"])
def test_negative_count_is_an_error(kind: str) -> None:
    with pytest.raises(InvalidConfig, match=r"model 'm'.*instance_group\[0\]\.count.*-1"):
        plan(f"instance_group {{ kind: {kind} count: -1 }}", TWO_GPUS)


# --- KIND_GPU, GPUs pinned by per-GPU resources -----------------------------------------------


def test_gpu_count_one_per_listed_gpu_takes_a_whole_gpu() -> None:
    assert plan("instance_group { kind: KIND_GPU count: 1 gpus: [1] }", TWO_GPUS) == [
        pinned("m_0", 1, 1, 1.0, count=1, gpus=(1,))
    ]


def test_gpu_count_n_shares_each_listed_gpu() -> None:
    assert plan("instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }", TWO_GPUS) == [
        pinned("m_0", 0, 2, 0.5, count=2, gpus=(0, 1)),
        pinned("m_0", 1, 2, 0.5, count=2, gpus=(0, 1)),
    ]


def test_listed_gpu_is_used_on_every_node_that_has_it() -> None:
    # Like Triton run on each node: count instances on GPU 1 and on GPU 2 of both nodes.
    groups = plan("instance_group { kind: KIND_GPU count: 2 gpus: [1, 2] }", TWO_NODES)
    assert groups == [pinned("m_0", d, 4, 0.5, count=2, gpus=(1, 2)) for d in (1, 2)]
    assert all(g.num_gpus == 0 for g in groups)  # Ray's GPU resource is not what places them


def test_gpu_without_gpus_uses_every_declared_gpu() -> None:
    groups = plan("instance_group { kind: KIND_GPU count: 2 }", TWO_NODES)
    assert [(g.device, g.num_replicas, g.max_per_node) for g in groups] == [(d, 4, 2) for d in range(4)]


def test_gpu_only_on_some_nodes_gets_replicas_for_those_nodes() -> None:
    cluster = ClusterGpus(total=6, indexed={0: 2, 1: 2, 2: 1, 3: 1})
    groups = plan("instance_group { kind: KIND_GPU count: 3 }", cluster)
    assert [(g.device, g.num_replicas) for g in groups] == [(0, 6), (1, 6), (2, 3), (3, 3)]


def test_gpu_listed_twice_gets_count_instances_per_entry() -> None:
    # Triton creates `count` instances for each entry of `gpus`.
    assert plan("instance_group { kind: KIND_GPU count: 1 gpus: [1, 1] }", TWO_GPUS) == [
        pinned("m_0", 1, 2, 0.5, count=2, gpus=(1, 1))
    ]


def test_gpu_share_never_oversubscribes_a_gpu() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 3 gpus: [0] }", TWO_GPUS)
    ((_, share),) = g.resources
    assert g.num_replicas == 3
    assert share == pytest.approx(1 / 3, abs=1e-4)
    assert share * 3 <= 1.0


def test_more_than_serves_per_node_limit_is_not_capped() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 101 gpus: [0] }", TWO_GPUS)
    assert (g.num_replicas, g.max_per_node) == (101, 0)


@pytest.mark.parametrize("gid", [2, 7, -1])
def test_gpu_index_the_cluster_lacks_is_an_error(gid: int) -> None:
    with pytest.raises(InvalidConfig, match=rf"model 'm'.*instance_group\[0\]\.gpus.*gpu id {gid}.*ids 0, 1"):
        plan(f"instance_group {{ kind: KIND_GPU gpus: [0, {gid}] }}", TWO_GPUS)


def test_gpu_count_beyond_ray_granularity_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.count"):
        plan("instance_group { kind: KIND_GPU count: 20000 }", TWO_GPUS)


# --- KIND_GPU, GPUs placed by Ray (no per-GPU resources) --------------------------------------


def test_unpinned_gpu_count_n_per_gpu_of_the_cluster() -> None:
    (g,) = plan("instance_group { kind: KIND_GPU count: 2 }", ClusterGpus(4))
    assert g == ReplicaGroup("m_0", "KIND_GPU", 8, 1.0, 0.5, (), count=2)


def test_listing_gpus_without_per_gpu_resources_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*declare no per-GPU resources.*gpu_idx_0"):
        plan("instance_group { kind: KIND_GPU gpus: [1] }", UNPINNED_TWO)


def test_the_error_names_the_configured_prefix() -> None:
    with pytest.raises(InvalidConfig, match=r"'dev_<index>'.*dev_0"):
        plan("instance_group { kind: KIND_GPU gpus: [0] }", ClusterGpus(2, prefix="dev_"))


def test_gpu_on_cpu_only_cluster_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.kind.*no GPUs are available"):
        plan("instance_group { kind: KIND_GPU }", CPU_ONLY)


# --- KIND_AUTO --------------------------------------------------------------------------------


def test_auto_is_gpu_when_the_cluster_has_gpus() -> None:
    (g,) = plan("instance_group { kind: KIND_AUTO count: 2 }", UNPINNED_TWO)
    assert (g.kind, g.num_replicas, g.num_gpus) == ("KIND_GPU", 4, 0.5)
    groups = plan("instance_group { kind: KIND_AUTO count: 2 }", TWO_GPUS)
    assert [(g.kind, g.device, g.num_replicas) for g in groups] == [("KIND_GPU", 0, 2), ("KIND_GPU", 1, 2)]


def test_auto_with_listed_gpus_is_gpu() -> None:
    (g,) = plan("instance_group { count: 1 gpus: [1] }", TWO_GPUS)  # kind defaults to KIND_AUTO
    assert (g.kind, g.num_replicas, g.device) == ("KIND_GPU", 1, 1)


def test_auto_is_cpu_on_cpu_only_cluster() -> None:
    # The replica then gets kind KIND_CPU and hides every GPU (CUDA_VISIBLE_DEVICES="").
    (g,) = plan("instance_group { kind: KIND_AUTO count: 2 }", CPU_ONLY)
    assert g == ReplicaGroup("m_0", "KIND_CPU", 2, 1.0, 0.0, (), count=2)


def test_auto_listing_missing_gpus_is_an_error() -> None:
    # Triton resolves this to KIND_CPU, which then rejects the GPU list.
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*KIND_AUTO.*lacks GPU\(s\) \[5\]"):
        plan("instance_group { kind: KIND_AUTO gpus: [5] }", TWO_GPUS)
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*KIND_AUTO.*has no GPUs"):
        plan("instance_group { kind: KIND_AUTO gpus: [0] }", CPU_ONLY)


def test_auto_listing_gpus_without_per_gpu_resources_says_to_declare_them() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*declare no per-GPU resources"):
        plan("instance_group { kind: KIND_AUTO gpus: [0] }", UNPINNED_TWO)


# --- KIND_MODEL -------------------------------------------------------------------------------


def test_model_kind_is_count_replicas_without_gpu_request() -> None:
    (g,) = plan("instance_group { kind: KIND_MODEL count: 3 }", TWO_NODES)
    assert g == ReplicaGroup("m_0", "KIND_MODEL", 3, 1.0, 0.0, (), count=3)


def test_model_kind_with_gpus_is_an_error() -> None:
    with pytest.raises(InvalidConfig, match=r"instance_group\[0\]\.gpus.*KIND_MODEL"):
        plan("instance_group { kind: KIND_MODEL gpus: [0] }", TWO_GPUS)


# --- several groups, names --------------------------------------------------------------------


def test_several_groups_keep_order_and_names() -> None:
    groups = plan(
        """
        instance_group { kind: KIND_CPU count: 2 }
        instance_group { name: "fast" kind: KIND_GPU count: 1 gpus: [0] }
        instance_group { kind: KIND_GPU count: 4 gpus: [1] }
        """,
        TWO_GPUS,
    )
    assert groups == [
        ReplicaGroup("m_0", "KIND_CPU", 2, 1.0, 0.0, (), count=2),
        pinned("fast", 0, 1, 1.0, count=1, gpus=(0,), index=1),
        pinned("m_2", 1, 4, 0.25, count=4, gpus=(1,), index=2),
    ]


def test_groups_of_one_model_on_one_gpu_share_it() -> None:
    groups = plan(
        """
        instance_group { kind: KIND_GPU count: 1 gpus: [0] }
        instance_group { kind: KIND_GPU count: 3 gpus: [0] }
        instance_group { kind: KIND_GPU count: 1 gpus: [1] }
        """,
        TWO_GPUS,
    )
    assert [(g.device, g.num_replicas, g.resources) for g in groups] == [
        (0, 1, (("gpu_idx_0", 0.25),)),
        (0, 3, (("gpu_idx_0", 0.25),)),
        (1, 1, (("gpu_idx_1", 1.0),)),
    ]


def test_error_names_the_failing_group_index() -> None:
    text = "instance_group { kind: KIND_CPU } instance_group { kind: KIND_CPU count: -2 }"
    with pytest.raises(InvalidConfig, match=r"instance_group\[1\]\.count.*m_1"):
        plan(text)


def test_bad_arguments_are_programming_errors() -> None:
    with pytest.raises(ValueError):
        plan_replicas(cfg(), ClusterGpus(-1))
    with pytest.raises(ValueError):
        plan_replicas(cfg(), CPU_ONLY, cpus_per_instance=-1)


# --- share_gpus: one GPU split among every instance of the repository -------------------------


def test_models_and_versions_on_one_gpu_share_it_evenly() -> None:
    a = plan_replicas(cfg("instance_group { kind: KIND_GPU count: 2 gpus: [1] }", "a"), TWO_GPUS)
    b = plan_replicas(cfg("instance_group { kind: KIND_GPU count: 1 gpus: [0, 1] }", "b"), TWO_GPUS)
    c = plan_replicas(cfg("instance_group { kind: KIND_CPU count: 1 }", "c"), TWO_GPUS)
    shared = share_gpus({"a": a, "b": b, "c": c}, {"b": 2})
    # GPU 1 holds a's 2 instances and one of each of b's 2 versions: 4 instances, a quarter each.
    assert [g.resources for g in shared["a"]] == [(("gpu_idx_1", 0.25),)]
    assert [g.resources for g in shared["b"]] == [(("gpu_idx_0", 0.5),), (("gpu_idx_1", 0.25),)]
    assert shared["c"] == c
    # Replica counts and per-node limits are untouched.
    assert [(g.num_replicas, g.max_per_node) for g in shared["a"] + shared["b"]] == [(2, 2), (1, 1), (1, 1)]


def test_groups_placed_by_ray_share_every_gpu() -> None:
    a = plan_replicas(cfg("", "a"), UNPINNED_TWO)  # default: one instance per GPU
    b = plan_replicas(cfg("instance_group { kind: KIND_GPU count: 2 }", "b"), UNPINNED_TWO)
    shared = share_gpus({"a": a, "b": b})
    # Each GPU holds 1 + 2 instances: a third each, and the 2 + 4 replicas fill the 2 GPUs exactly.
    assert [(g.num_replicas, g.num_gpus) for g in shared["a"] + shared["b"]] == [(2, 0.3333), (4, 0.3333)]


def test_share_is_rounded_down_to_rays_granularity() -> None:
    g = plan_replicas(cfg("instance_group { kind: KIND_GPU count: 7 gpus: [0] }"), TWO_GPUS)
    ((_, share),) = share_gpus({"m": g})["m"][0].resources
    assert share == 0.1428 and 7 * share <= 1.0


# --- instance names ---------------------------------------------------------------------------


def test_instance_names_follow_triton() -> None:
    # TritonModel::PrepareInstances: "<group name>_<n>" for n in 0..count-1; the device is reported beside it.
    assert InstanceSpec("m_0").instance_name(1) == "m_0_1"
    (g,) = plan("instance_group { name: 'fast' kind: KIND_GPU count: 2 gpus: [1] }", TWO_GPUS)
    assert instance_spec(g) == InstanceSpec("fast", 1, 0)
    (d,) = plan("", CPU_ONLY)
    assert instance_spec(d).instance_name(0) == "m_0"  # the default group is named after the model


def test_no_ray_import() -> None:
    import subprocess
    import sys

    code = "import sys, serve_app.placement; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
